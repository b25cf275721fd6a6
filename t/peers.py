"""Foreign lock clients for the interop tests.

* RedlockPeer: the real npm `redlock` 4.2.0 (with ioredis) in a node process.
* RedissonPeer: a Java service's Redisson RLock / RFencedLock as seen on the
  wire (../shared/spec/WIRE.md): HASH key, field "<client uuid>:<thread id>",
  reentrant count, PEXPIRE on every change, unlock publishes "0" on
  redisson_lock__channel:{key}, watchdog renewal only while the field is
  present, fencing counter redisson_lock_token:{key}.  Java and Maven Central
  are not reachable from the test machines, so the peer issues the RLock
  commands itself, from the protocol description, with the same return
  conventions (nil = acquired, else the holder's PTTL).
* RedsyncPeer: the real Go redsync v4 with go-redis v9
  (t/interop/go, versions pinned in go.mod), built once into
  t/interop/go/bin by scripts/install-deps (or here when missing).
* Subscriber: a raw (S)SUBSCRIBE connection.
"""
import json
import os
import select
import shutil
import subprocess
import uuid

import redis

INTEROP_DIR = os.path.join(os.path.dirname(__file__), "interop")


class RedlockPeer:
    def __init__(self, ports):
        self.proc = subprocess.Popen(
            ["node", "redlock_peer.js", ",".join(str(p) for p in ports)],
            cwd=INTEROP_DIR, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, bufsize=1)

    def call(self, timeout=15, **cmd):
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            raise TimeoutError("redlock peer did not answer %r" % (cmd,))
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("redlock peer died: " + self.proc.stderr.read())
        return json.loads(line)

    def close(self):
        try:
            self.call(op="quit", timeout=5)
        except Exception:  # noqa: BLE001
            pass
        self.proc.kill()
        self.proc.wait(5)


GO_DIR = os.path.join(INTEROP_DIR, "go")
REDSYNC_BIN = os.path.join(GO_DIR, "bin", "redsyncpeer")


def build_redsync_peer():
    if not os.path.exists(REDSYNC_BIN):
        go = shutil.which("go") or "/usr/local/go/bin/go"
        subprocess.run([go, "build", "-o", REDSYNC_BIN, "."], cwd=GO_DIR, check=True,
                       timeout=600)
    return REDSYNC_BIN


class RedsyncPeer(RedlockPeer):
    """Same line protocol as RedlockPeer: lock {key, ttl, tries,
    retryDelay}, unlock, extend, quit."""

    def __init__(self, ports):  # noqa: super().__init__ starts node
        self.proc = subprocess.Popen(
            [build_redsync_peer(), ",".join(str(p) for p in ports)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, bufsize=1)


def redisson_name(prefix, key):
    """Redisson's naming rule: braces unless the name already has a '{'."""
    return "%s:%s" % (prefix, key) if "{" in key else "%s:{%s}" % (prefix, key)


# RLock's commands, per WIRE.md
_ACQUIRE = """
if redis.call('exists', KEYS[1]) == 0 or redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
  redis.call('hincrby', KEYS[1], ARGV[2], 1)
  redis.call('pexpire', KEYS[1], ARGV[1])
  return nil
end
return redis.call('pttl', KEYS[1])
"""
_ACQUIRE_FENCED = """
if redis.call('exists', KEYS[1]) == 0 or redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
  local token = redis.call('incr', KEYS[2])
  redis.call('hincrby', KEYS[1], ARGV[2], 1)
  redis.call('pexpire', KEYS[1], ARGV[1])
  return {-1, token}
end
return {redis.call('pttl', KEYS[1]), -1}
"""
_UNLOCK = """
if redis.call('hexists', KEYS[1], ARGV[3]) == 0 then return nil end
local left = redis.call('hincrby', KEYS[1], ARGV[3], -1)
if left > 0 then
  redis.call('pexpire', KEYS[1], ARGV[2])
  return 0
end
redis.call('del', KEYS[1])
redis.call(ARGV[4], KEYS[2], ARGV[1])
return 1
"""
_RENEW = """
if redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
  redis.call('pexpire', KEYS[1], ARGV[1])
  return 1
end
return 0
"""
_FORCE = """
if redis.call('del', KEYS[1]) == 1 then
  redis.call(ARGV[2], KEYS[2], ARGV[1])
  return 1
end
return 0
"""


class RedissonPeer:
    def __init__(self, client, thread_id=1, sharded=False, lease_ms=30000):
        self.r = client
        self.field = "%s:%d" % (uuid.uuid4(), thread_id)
        self.publish = "SPUBLISH" if sharded else "PUBLISH"
        self.lease_ms = lease_ms

    def try_lock(self, key, lease_ms=None):
        """None when acquired (also reentrantly), else the holder's PTTL."""
        return self.r.eval(_ACQUIRE, 1, key, lease_ms or self.lease_ms, self.field)

    def try_lock_fenced(self, key, lease_ms=None):
        pttl, token = self.r.eval(_ACQUIRE_FENCED, 2, key, redisson_name("redisson_lock_token", key),
                                  lease_ms or self.lease_ms, self.field)
        return (token if pttl == -1 else None), pttl

    def unlock(self, key):
        """None: not the owner; 0: still held (reentrant); 1: released."""
        return self.r.eval(_UNLOCK, 2, key, redisson_name("redisson_lock__channel", key),
                           "0", self.lease_ms, self.field, self.publish)

    def renew(self, key):
        return self.r.eval(_RENEW, 1, key, self.lease_ms, self.field)

    def force_unlock(self, key):
        return self.r.eval(_FORCE, 2, key, redisson_name("redisson_lock__channel", key),
                           "0", self.publish)


class Subscriber:
    """A raw subscriber connection; get() returns (kind, channel, payload)."""

    def __init__(self, port, channel, sharded=False):
        self.conn = redis.Connection(host="127.0.0.1", port=port, socket_timeout=5)
        self.conn.connect()
        self.conn.send_command("SSUBSCRIBE" if sharded else "SUBSCRIBE", channel)
        kind = self.conn.read_response()[0]
        assert kind in (b"subscribe", b"ssubscribe"), kind

    def get(self, timeout):
        if not self.conn.can_read(timeout=timeout):
            return None
        msg = self.conn.read_response()
        return tuple(x.decode() if isinstance(x, bytes) else x for x in msg)

    def close(self):
        self.conn.disconnect()
