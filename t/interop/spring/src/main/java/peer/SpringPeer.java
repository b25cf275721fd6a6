/*
 * The Spring side of the interop tests: the real Spring Integration
 * RedisLockRegistry over Spring Data Redis and Lettuce, driven line by line
 * from pytest (t/peers.py, SpringPeer) with the line protocol of the
 * Redisson peer (t/interop/java, Peer.java).
 *
 *   java -cp ... peer.SpringPeer PORT
 *
 * Like Redisson's, a registry's locks belong to threads (a local
 * ReentrantLock in front of the Redis key), so every command names a thread
 * of the peer: it runs on that thread, in order, and a command that blocks
 * blocks only that thread.  Answers can come out of order; each carries the
 * id of its request.
 *
 * stdin:  ID TAB THREAD TAB OP [TAB ARG]...
 * stdout: ID TAB ok|err TAB VALUE TAB EPOCH_MICROS   (time the op finished)
 *
 * Registries (any number, by name REG):
 *   registry REG REGISTRY_KEY spin|pubsub EXPIRE_MS RENEW
 *     a RedisLockRegistry(factory, REGISTRY_KEY, EXPIRE_MS) in SPIN_LOCK or
 *     PUB_SUB_LOCK mode; RENEW 1 gives it a renewal scheduler
 *     (setRenewalTaskScheduler: each lock renewed every EXPIRE_MS / 3),
 *     0 none (Spring's default).  Answers the registry's client id, the
 *     value it writes into its keys.
 *   destroy REG
 * Locks of a registry (PATH: the lock key passed to obtain()):
 *   lock REG PATH; trylock REG PATH WAIT_MS; unlock REG PATH;
 *   lockttl REG PATH TTL_MS (DistributedLock.lock(Duration): a TTL of
 *   its own instead of the registry's expireAfter);
 *   held REG PATH (isAcquiredInThisProcess); renew REG PATH (renewLock:
 *   restart the lease by hand);
 *   hold REG PATH HOLD_MS: lock(), sleep HOLD_MS, unlock() (the usual
 *   try/finally around a piece of work).
 * quit.
 */
package peer;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.time.Instant;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.Lock;

import org.springframework.data.redis.connection.RedisStandaloneConfiguration;
import org.springframework.data.redis.connection.lettuce.LettuceConnectionFactory;
import org.springframework.integration.redis.util.RedisLockRegistry;
import org.springframework.scheduling.concurrent.ThreadPoolTaskScheduler;

public final class SpringPeer {
    private final LettuceConnectionFactory factory;
    private final PrintStream out;
    private final Map<String, ExecutorService> threads = new ConcurrentHashMap<>();
    private final Map<String, RedisLockRegistry> registries = new ConcurrentHashMap<>();
    private final Map<String, ThreadPoolTaskScheduler> schedulers = new ConcurrentHashMap<>();

    private SpringPeer(LettuceConnectionFactory factory, PrintStream out) {
        this.factory = factory;
        this.out = out;
    }

    public static void main(String[] args) throws Exception {
        int port = Integer.parseInt(args[0]);
        LettuceConnectionFactory factory =
            new LettuceConnectionFactory(new RedisStandaloneConfiguration("127.0.0.1", port));
        factory.afterPropertiesSet();
        factory.start();
        PrintStream out = new PrintStream(System.out, true, StandardCharsets.UTF_8);
        new SpringPeer(factory, out).serve();
    }

    private void serve() throws Exception {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            String[] f = line.split("\t");
            String id = f[0];
            if (f[2].equals("quit")) {
                answer(id, true, "bye");
                break;
            }
            threads.computeIfAbsent(f[1], name -> Executors.newSingleThreadExecutor(r -> {
                Thread t = new Thread(r, "peer-" + name);
                t.setDaemon(true);
                return t;
            })).submit(() -> run(id, f));
        }
        for (String reg : registries.keySet())
            destroy(reg);
        factory.destroy();
        System.exit(0);
    }

    private void run(String id, String[] f) {
        try {
            answer(id, true, String.valueOf(execute(f)));
        } catch (Throwable e) {
            answer(id, false, e.getClass().getSimpleName() + ": " + e.getMessage());
        }
    }

    private synchronized void answer(String id, boolean ok, String value) {
        Instant now = Instant.now();
        long micros = now.getEpochSecond() * 1_000_000L + now.getNano() / 1_000;
        out.println(id + "\t" + (ok ? "ok" : "err") + "\t" + value.replace('\n', ' ') + "\t" + micros);
    }

    private Object execute(String[] f) throws Exception {
        String op = f[2];
        switch (op) {
            case "registry":
                return registry(f[3], f[4], f[5], Long.parseLong(f[6]), f[7].equals("1"));
            case "destroy":
                destroy(f[3]);
                return true;
            default:
                break;
        }
        RedisLockRegistry reg = registries.get(f[3]);
        if (reg == null)
            throw new IllegalArgumentException("no registry " + f[3]);
        String path = f[4];
        switch (op) {
            // README: spring-lock
            case "lock":
                reg.obtain(path).lock();
                return true;
            case "trylock":
                return reg.obtain(path).tryLock(Long.parseLong(f[5]), TimeUnit.MILLISECONDS);
            case "unlock":
                reg.obtain(path).unlock();
                return true;
            // README: end
            case "lockttl":
                reg.obtain(path).lock(Duration.ofMillis(Long.parseLong(f[5])));
                return true;
            case "held":
                return isLocked(reg.obtain(path));
            case "renew":
                reg.renewLock(path);
                return true;
            case "hold":
                {
                    Lock lock = reg.obtain(path);
                    lock.lock();
                    try {
                        Thread.sleep(Long.parseLong(f[5]));
                    } finally {
                        lock.unlock();
                    }
                    return true;
                }
            default:
                throw new IllegalArgumentException("unknown op " + op);
        }
    }

    /* whether some thread of this JVM holds the lock (its local ReentrantLock) */
    private static boolean isLocked(Lock lock) throws Exception {
        var m = lock.getClass().getMethod("isAcquiredInThisProcess");
        m.setAccessible(true);     /* public, on a private class */
        return (Boolean) m.invoke(lock);
    }

    private String registry(String name, String key, String mode, long expireMs, boolean renew)
            throws Exception {
        // README: spring-registry
        RedisLockRegistry reg = new RedisLockRegistry(factory, key, expireMs);
        if (mode.equals("pubsub"))
            reg.setRedisLockType(RedisLockRegistry.RedisLockType.PUB_SUB_LOCK);
        if (renew) {
            ThreadPoolTaskScheduler scheduler = new ThreadPoolTaskScheduler();
            scheduler.initialize();
            reg.setRenewalTaskScheduler(scheduler);
            schedulers.put(name, scheduler);
        }
        // README: end
        registries.put(name, reg);
        /* the value the registry writes: its private clientId */
        var field = RedisLockRegistry.class.getDeclaredField("clientId");
        field.setAccessible(true);
        String id = (String) field.get(reg);
        return id;
    }

    private void destroy(String name) {
        RedisLockRegistry reg = registries.remove(name);
        if (reg != null)
            reg.destroy();
        ThreadPoolTaskScheduler s = schedulers.remove(name);
        if (s != null)
            s.shutdown();
    }
}
