/*
 * The Java side of the interop tests: a real Redisson client (RLock,
 * RFencedLock) and a hand-written Jedis lock, driven line by line from
 * pytest (t/peers.py, JavaPeer), like redlock_peer.js and the Go redsync peer.
 *
 *   java -cp ... peer.Peer single PORT[,PORT...] WATCHDOG_MS
 *   java -cp ... peer.Peer cluster PORT[,PORT...] WATCHDOG_MS
 *   java -cp ... peer.Peer replicated MASTER_PORT,REPLICA_PORT... WATCHDOG_MS
 *
 * A fourth argument "rediss" makes Redisson speak TLS (trust store from the
 * JVM's javax.net.ssl.trustStore).  In single mode, each further PORT gets a
 * RedissonClient of its own, used only by the cycles op (one JVM instead of
 * one per server); every other op uses the first.
 *
 * Redisson's locks belong to a thread, so every command names a thread of
 * the peer ("a", "b", ...): it runs on that thread, in order, and a command
 * that blocks (lock) blocks only that thread.  Answers can therefore come
 * out of order; each carries the id of its request.
 *
 * stdin:  ID TAB THREAD TAB OP [TAB ARG]...
 * stdout: ID TAB ok|err TAB VALUE TAB EPOCH_MICROS   (time the op finished)
 * (an err's VALUE: the exception's class and message, then " <- " and each
 * cause's)
 *
 * Ops: hello; lock KEY [LEASE_MS]; trylock KEY WAIT_MS LEASE_MS (-1: the
 * watchdog); unlock KEY; forceunlock KEY; held KEY; count KEY; fenced KEY;
 * jlock KEY TTL_MS; jwait KEY TTL_MS RETRY_MS WAIT_MS; junlock KEY; quit.
 * Read-write locks (RReadWriteLock), MODE = read | write: rwlock MODE KEY
 * [LEASE_MS]; rwtrylock MODE KEY WAIT_MS LEASE_MS; rwunlock MODE KEY;
 * rwforceunlock MODE KEY; rwheld MODE KEY.
 * Fair locks (RFairLock): fairlock KEY [LEASE_MS]; fairtrylock KEY WAIT_MS
 * LEASE_MS; fairunlock KEY.
 * Non-reentrant locks (Redisson 4.4+: getNonReentrantLock,
 * getNonReentrantFairLock; on a Redisson without them the ops fail with
 * NoSuchMethodException), KIND = lock | fairlock: nrlock KIND KEY
 * [LEASE_MS]; nrtrylock KIND KEY WAIT_MS LEASE_MS; nrunlock KIND KEY;
 * nrheld KIND KEY.
 * Several RLocks as one (RedissonMultiLock), KEYS = KEY[,KEY...]:
 * multilock KEYS [LEASE_MS]; multitrylock KEYS WAIT_MS LEASE_MS;
 * multiunlock KEYS.
 * The README's quick start: export HOLD_MS runs exportOrders() (the lock
 * "orders:export") with an export that takes HOLD_MS.
 * Timing (bench/run's latency section): cycles KEY N LEASE_MS [CLIENT] runs
 * N acquire+release cycles of the RLock KEY on the calling thread, with the
 * RedissonClient of the CLIENT-th PORT (from 0; default 0), lock() and
 * unlock() when LEASE_MS is -1 (the watchdog's lease), else tryLock(0,
 * LEASE_MS ms) and unlock(); it answers "ACQUIRE_US RELEASE_US", the median
 * time of each call in microseconds (System.nanoTime around the call alone).
 * Semaphores with leased permits (RPermitExpirableSemaphore): semset KEY
 * PERMITS (trySetPermits); semacquire KEY PERMITS WAIT_MS LEASE_MS
 * (tryAcquire; LEASE_MS -1: no lease), answering the permit ids joined by
 * "," or null; semrelease KEY IDS (the ids joined by ",": release(String)
 * for one, release(List) for several); semavail KEY (availablePermits);
 * semlease KEY ID LEASE_MS (updateLeaseTime).  Semaphores of bare counts
 * (RSemaphore): rsemset KEY PERMITS (trySetPermits); rsemacquire KEY
 * PERMITS WAIT_MS (tryAcquire); rsemrelease KEY PERMITS (release);
 * rsemavail KEY (availablePermits).  Stress (t/test_semaphore_redisson.py):
 * semloop KEY MS HOLD_MS LEASE_MS loops tryAcquire(100 ms wait, LEASE_MS
 * lease), a hold of HOLD_MS and release(id) for MS on the calling thread
 * and answers the number of permits it took.
 */
package peer;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.time.Instant;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.UUID;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;

import org.redisson.Redisson;
import org.redisson.api.RLock;
import org.redisson.api.RPermitExpirableSemaphore;
import org.redisson.api.RReadWriteLock;
import org.redisson.api.RSemaphore;
import org.redisson.api.RedissonClient;
import org.redisson.config.Config;

import redis.clients.jedis.Jedis;
import redis.clients.jedis.JedisPool;
import redis.clients.jedis.params.SetParams;

public final class Peer {
    private final RedissonClient redisson;
    private final List<RedissonClient> clients;
    private final JedisPool jedis;
    private final PrintStream out;
    private final Map<String, ExecutorService> threads = new ConcurrentHashMap<>();

    private Peer(List<RedissonClient> clients, JedisPool jedis, PrintStream out) {
        this.redisson = clients.get(0);
        this.clients = clients;
        this.jedis = jedis;
        this.out = out;
    }

    public static void main(String[] args) throws Exception {
        String mode = args[0];
        String[] ports = args[1].split(",");
        long watchdogMs = Long.parseLong(args[2]);
        String scheme = (args.length > 3 ? args[3] : "redis") + "://127.0.0.1:";

        // README: redisson-config
        Config config = new Config();
        config.setLockWatchdogTimeout(watchdogMs);   // default 30 s
        if (mode.equals("cluster")) {
            var cluster = config.useClusterServers();
            for (String port : ports)
                cluster.addNodeAddress(scheme + port);
        } else if (mode.equals("replicated")) {
            /* a master and its replicas: Redisson follows lock scripts with WAIT */
            var ms = config.useMasterSlaveServers().setMasterAddress(scheme + ports[0]);
            for (int i = 1; i < ports.length; i++)
                ms.addSlaveAddress(scheme + ports[i]);
        } else {
            config.useSingleServer().setAddress(scheme + ports[0]);
        }
        RedissonClient redisson = Redisson.create(config);
        // README: end
        List<RedissonClient> clients = new ArrayList<>(List.of(redisson));
        for (int i = 1; mode.equals("single") && i < ports.length; i++) {
            Config more = new Config();
            more.setLockWatchdogTimeout(watchdogMs);
            more.useSingleServer().setAddress(scheme + ports[i]);
            clients.add(Redisson.create(more));
        }
        JedisPool jedis = new JedisPool("127.0.0.1", Integer.parseInt(ports[0]), scheme.startsWith("rediss"));
        PrintStream out = new PrintStream(System.out, true, StandardCharsets.UTF_8);
        new Peer(clients, jedis, out).serve();
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
        for (RedissonClient c : clients)
            c.shutdown(0, 2, TimeUnit.SECONDS);
        jedis.close();
        System.exit(0);
    }

    private void run(String id, String[] f) {
        try {
            answer(id, true, String.valueOf(execute(f)));
        } catch (Throwable e) {
            /* and the causes: Redisson wraps some (a semaphore's release) */
            StringBuilder text = new StringBuilder(e.getClass().getSimpleName() + ": " + e.getMessage());
            for (Throwable c = e.getCause(); c != null && c != c.getCause(); c = c.getCause())
                text.append(" <- ").append(c.getClass().getSimpleName()).append(": ").append(c.getMessage());
            answer(id, false, text.toString());
        }
    }

    private synchronized void answer(String id, boolean ok, String value) {
        Instant now = Instant.now();
        long micros = now.getEpochSecond() * 1_000_000L + now.getNano() / 1_000;
        out.println(id + "\t" + (ok ? "ok" : "err") + "\t" + value.replace('\n', ' ') + "\t" + micros);
    }

    /* Jedis tokens of this peer's threads: key -> token, per thread */
    private static final ThreadLocal<Map<String, String>> TOKENS = ThreadLocal.withInitial(HashMap::new);

    private Object execute(String[] f) throws Exception {
        String op = f[2];
        String key = f.length > 3 ? f[3] : null;
        switch (op) {
            case "hello":
                /* the hash field Redisson writes for this thread */
                return redisson.getId() + ":" + Thread.currentThread().getId();
            // README: redisson-lock
            case "lock":
                if (f.length > 4)
                    redisson.getLock(key).lock(Long.parseLong(f[4]), TimeUnit.MILLISECONDS);
                else
                    redisson.getLock(key).lock();
                return true;
            case "trylock":
                return redisson.getLock(key).tryLock(Long.parseLong(f[4]), Long.parseLong(f[5]),
                                                     TimeUnit.MILLISECONDS);
            case "unlock":
                redisson.getLock(key).unlock();
                return true;
            // README: end
            // README: redisson-lock-more
            case "forceunlock":
                return redisson.getLock(key).forceUnlock();
            case "held":
                return redisson.getLock(key).isHeldByCurrentThread();
            case "count":
                return redisson.getLock(key).getHoldCount();
            case "fenced":
                return redisson.getFencedLock(key).lockAndGetToken();
            // README: end
            // README: redisson-rwlock
            case "rwlock":
                if (f.length > 5)
                    rwLock(f[3], f[4]).lock(Long.parseLong(f[5]), TimeUnit.MILLISECONDS);
                else
                    rwLock(f[3], f[4]).lock();
                return true;
            case "rwtrylock":
                return rwLock(f[3], f[4]).tryLock(Long.parseLong(f[5]), Long.parseLong(f[6]),
                                                 TimeUnit.MILLISECONDS);
            case "rwunlock":
                rwLock(f[3], f[4]).unlock();
                return true;
            // README: end
            // README: redisson-fairlock
            case "fairlock":
                if (f.length > 4)
                    redisson.getFairLock(key).lock(Long.parseLong(f[4]), TimeUnit.MILLISECONDS);
                else
                    redisson.getFairLock(key).lock();
                return true;
            case "fairtrylock":
                return redisson.getFairLock(key).tryLock(Long.parseLong(f[4]), Long.parseLong(f[5]),
                                                         TimeUnit.MILLISECONDS);
            case "fairunlock":
                redisson.getFairLock(key).unlock();
                return true;
            // README: end
            // README: redisson-nonreentrant
            case "nrlock":
                if (f.length > 5)
                    nonReentrant(f[3], f[4]).lock(Long.parseLong(f[5]), TimeUnit.MILLISECONDS);
                else
                    nonReentrant(f[3], f[4]).lock();
                return true;
            case "nrtrylock":
                return nonReentrant(f[3], f[4]).tryLock(Long.parseLong(f[5]), Long.parseLong(f[6]),
                                                       TimeUnit.MILLISECONDS);
            case "nrunlock":
                nonReentrant(f[3], f[4]).unlock();
                return true;
            case "nrheld":
                return nonReentrant(f[3], f[4]).isHeldByCurrentThread();
            // README: end
            // README: redisson-multilock
            case "multilock":
                if (f.length > 4)
                    multiLock(key).lock(Long.parseLong(f[4]), TimeUnit.MILLISECONDS);
                else
                    multiLock(key).lock();
                return true;
            case "multitrylock":
                return multiLock(key).tryLock(Long.parseLong(f[4]), Long.parseLong(f[5]),
                                              TimeUnit.MILLISECONDS);
            case "multiunlock":
                multiLock(key).unlock();
                return true;
            // README: end
            case "export":
                /* the README's quick start: export() holds the lock HOLD_MS */
                exportOrders(redisson, () -> sleepMs(Long.parseLong(key)));
                return true;
            case "cycles":
                return cycles(clients.get(f.length > 6 ? Integer.parseInt(f[6]) : 0), key,
                              Integer.parseInt(f[4]), Long.parseLong(f[5]));
            case "semset":
                return redisson.getPermitExpirableSemaphore(key).trySetPermits(Integer.parseInt(f[4]));
            case "semacquire": {
                List<String> ids = redisson.getPermitExpirableSemaphore(key).tryAcquire(
                    Integer.parseInt(f[4]), Long.parseLong(f[5]), Long.parseLong(f[6]),
                    TimeUnit.MILLISECONDS);
                return ids == null || ids.isEmpty() ? null : String.join(",", ids);
            }
            case "semrelease": {
                /* one id: release(String), several: release(List) */
                List<String> ids = Arrays.asList(f[4].split(","));
                if (ids.size() == 1)
                    redisson.getPermitExpirableSemaphore(key).release(ids.get(0));
                else
                    redisson.getPermitExpirableSemaphore(key).release(ids);
                return true;
            }
            case "semavail":
                return redisson.getPermitExpirableSemaphore(key).availablePermits();
            case "semlease":
                return redisson.getPermitExpirableSemaphore(key).updateLeaseTime(
                    f[4], Long.parseLong(f[5]), TimeUnit.MILLISECONDS);
            case "rsemset":
                return redisson.getSemaphore(key).trySetPermits(Integer.parseInt(f[4]));
            case "rsemacquire":
                return redisson.getSemaphore(key).tryAcquire(Integer.parseInt(f[4]),
                    Long.parseLong(f[5]), TimeUnit.MILLISECONDS);
            case "rsemrelease":
                redisson.getSemaphore(key).release(Integer.parseInt(f[4]));
                return true;
            case "rsemavail":
                return redisson.getSemaphore(key).availablePermits();
            case "semloop":
                return semLoop(key, Long.parseLong(f[4]), Long.parseLong(f[5]), Long.parseLong(f[6]));
            case "rwforceunlock":
                return rwLock(f[3], f[4]).forceUnlock();
            case "rwheld":
                return rwLock(f[3], f[4]).isHeldByCurrentThread();
            case "jlock":
                return jedisLock(key, Long.parseLong(f[4]));
            case "jwait":
                return jedisWait(key, Long.parseLong(f[4]), Long.parseLong(f[5]), Long.parseLong(f[6]));
            case "junlock":
                return jedisUnlock(key);
            default:
                throw new IllegalArgumentException("unknown op " + op);
        }
    }

    // README: redisson-quickstart
    static void exportOrders(RedissonClient redisson, Runnable export) {
        RLock lock = redisson.getLock("orders:export");
        lock.lock();            // Redisson's watchdog renews it while export() runs
        try {
            export.run();
        } finally {
            lock.unlock();
        }
    }
    // README: end

    private static void sleepMs(long ms) {
        try {
            Thread.sleep(ms);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }

    /* N timed acquire+release cycles; the medians of each call, in us */
    private static String cycles(RedissonClient client, String key, int n, long leaseMs)
            throws InterruptedException {
        RLock lock = client.getLock(key);
        long[] acquire = new long[n];
        long[] release = new long[n];
        for (int i = 0; i < n; i++) {
            long t0 = System.nanoTime();
            if (leaseMs < 0)
                lock.lock();
            else if (!lock.tryLock(0, leaseMs, TimeUnit.MILLISECONDS))
                throw new IllegalStateException("lock " + key + " is not free");
            long t1 = System.nanoTime();
            lock.unlock();
            long t2 = System.nanoTime();
            acquire[i] = t1 - t0;
            release[i] = t2 - t1;
        }
        return median(acquire) + " " + median(release);
    }

    /*
     * For ms: take one permit (waiting up to 100 ms, with a lease of
     * leaseMs), hold it holdMs, give it back; the number of permits taken
     */
    private long semLoop(String key, long ms, long holdMs, long leaseMs) throws InterruptedException {
        RPermitExpirableSemaphore sem = redisson.getPermitExpirableSemaphore(key);
        long end = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(ms);
        long taken = 0;
        while (System.nanoTime() < end) {
            String id = sem.tryAcquire(100, leaseMs, TimeUnit.MILLISECONDS);
            if (id == null)
                continue;
            taken++;
            Thread.sleep(holdMs);
            sem.release(id);
        }
        return taken;
    }

    private static double median(long[] ns) {
        long[] s = ns.clone();
        Arrays.sort(s);
        int m = s.length / 2;
        return (s.length % 2 == 1 ? s[m] : (s[m - 1] + s[m]) / 2.0) / 1000.0;
    }

    /* one RedissonMultiLock of the RLocks named in keys (comma-separated) */
    private RLock multiLock(String keys) {
        String[] names = keys.split(",");
        RLock[] locks = new RLock[names.length];
        for (int i = 0; i < names.length; i++)
            locks[i] = redisson.getLock(names[i]);
        return redisson.getMultiLock(locks);
    }

    /*
     * The non-reentrant RLock (kind "lock") or RFairLock (kind "fairlock")
     * named key: RedissonClient.getNonReentrantLock / getNonReentrantFairLock,
     * called by name because the 3.x line the peer also builds against has
     * neither.
     */
    // README: redisson-nonreentrant-get
    private RLock nonReentrant(String kind, String key) throws Exception {
        String getter = kind.equals("fairlock") ? "getNonReentrantFairLock" : "getNonReentrantLock";
        return (RLock) RedissonClient.class.getMethod(getter, String.class).invoke(redisson, key);
    }
    // README: end

    /* the read or the write half of the RReadWriteLock named key */
    private RLock rwLock(String mode, String key) {
        RReadWriteLock rw = redisson.getReadWriteLock(key);
        return mode.equals("read") ? rw.readLock() : rw.writeLock();
    }

    // ------------------------------------------------------------ Jedis, by hand
    // What most Java shops write: SET NX PX with a random token, and a
    // compare-and-delete script to release.  (README "Sharing locks with
    // your services" quotes these lines.)

    // README: jedis
    private static final String RELEASE =
        "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end";

    private boolean jedisLock(String key, long ttlMs) {
        String token = UUID.randomUUID().toString();
        try (Jedis j = jedis.getResource()) {
            boolean got = "OK".equals(j.set(key, token, SetParams.setParams().nx().px(ttlMs)));
            if (got)
                TOKENS.get().put(key, token);
            return got;
        }
    }

    private boolean jedisWait(String key, long ttlMs, long retryMs, long waitMs) throws InterruptedException {
        long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(waitMs);
        while (!jedisLock(key, ttlMs)) {
            if (System.nanoTime() > deadline)
                return false;
            Thread.sleep(retryMs);
        }
        return true;
    }

    private boolean jedisUnlock(String key) {
        String token = TOKENS.get().getOrDefault(key, "not-mine");
        try (Jedis j = jedis.getResource()) {
            Object deleted = j.eval(RELEASE, List.of(key), List.of(token));
            return Long.valueOf(1).equals(deleted);
        }
    }
    // README: end
}
