"""Security (issue 32, item 4): redis_lock_status() shows a lock's owner,
and nothing of a Redis key that is not a lock.

Every call is made by a role with LOGIN only (nothing granted) under the
default empty redis_lock.key_prefix, so that any lock name is any key of
the Redis the extension uses.  Another application's keys -- a JSON secret,
a long value, a value that is not UTF-8, a persistent string that looks
like an owner value, hashes with secret fields, a list, a set, a sorted set
-- come back as "not a lock": locked NULL, held_by_me false, no ttl, no
owner, only the key's type; and no more than a few kilobytes leave the
server for a value or hash of a megabyte.  The locks of every layout still
report their owner: redis-py's, hand-written Java's, redsync's, Redisson's
RLock hash and RReadWriteLock hash (written as Redisson writes them), and
the role's own locks of each layout (held_by_me).

Each test runs twice: with Lua scripts on Debian's Redis 7.0 (the inspect
script decides in the server), and with redis_lock.scripting = off on
Valkey 9.1 (scripts/get-server valkey-9.1; the script-free MULTI ... EXEC,
decided in the backend), where no script may be sent.  A last test does the
same over Redlock on three masters.
"""
import os
import subprocess
import uuid

import psycopg2
import pytest
from redis.lock import Lock

from conftest import Session
import testbed

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROLE = "status_probe"
SECRET = b'{"api_token": "sk_live_4eC39HqLyjWDarjtT1zdp7dc"}'
TTL_MS = 60000
# what one redis_lock_status() call may make a server send, however large
# the key (the largest lock reply is a few hundred bytes; INFO's own reply,
# counted too, is a few kilobytes)
WIRE_BOUND = 32 * 1024

STATUS = ("SELECT locked, held_by_me, ttl, textsend(owner), redis_key, redis_type "
          "FROM redis_lock_status(%s)")


def valkey_91():
    """Path of scripts/get-server valkey-9.1's build; fails, never skips."""
    out = subprocess.run([os.path.join(ROOT, "scripts", "get-server"), "valkey-9.1"],
                         check=True, timeout=1800, stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True).stdout
    path = out.strip().splitlines()[-1]
    assert os.access(path, os.X_OK), path
    return path


def add_role(pg):
    c = pg.connect()
    try:
        c.cursor().execute("CREATE ROLE %s LOGIN" % ROLE)
    finally:
        c.close()


class World:
    """A Redis (or several, Redlock), a PostgreSQL using it, sessions of the
    LOGIN-only role."""

    def __init__(self, servers, scripting=True):
        self.servers = servers
        self.scripting = scripting
        conf = {"redis_lock.scripting": "on" if scripting else "off"}
        if len(servers) == 1:
            conf["redis_lock.url"] = servers[0].url
        else:
            conf["redis_lock.nodes"] = ",".join(r.url for r in servers)
        self.pg = testbed.Postgres(conf=conf).init().start().with_extension()
        add_role(self.pg)
        self.made = []

    @property
    def rc(self):
        return self.servers[0].client()

    def probe(self):
        s = Session(self.pg, user=ROLE)
        self.made.append(s)
        assert s.run("SELECT rolsuper OR rolcreaterole FROM pg_roles "
                     "WHERE rolname = current_user") is False
        assert s.run("SHOW redis_lock.key_prefix") == ""
        return s

    def reset(self):
        for r in self.servers:
            c = r.client()
            c.flushall()
            c.config_resetstat()

    def end_test(self):
        for s in self.made:
            s.close()
        self.made = []
        if not self.scripting:
            # the script-free path really ran: not one script was sent
            for r in self.servers:
                stats = r.client().info("commandstats")
                assert not [k for k in stats if "eval" in k or "fcall" in k], stats

    def close(self):
        self.pg.cleanup()
        for r in self.servers:
            r.stop()


@pytest.fixture(scope="module", params=["scripts", "no-scripts"])
def world(request):
    if request.param == "scripts":
        w = World([testbed.Redis().start()])
    else:
        w = World([testbed.Redis(server=valkey_91()).start()], scripting=False)
    yield w
    w.close()


@pytest.fixture
def env(world):
    world.reset()
    yield world, world.rc
    world.end_test()


def status(s, name):
    locked, mine, ttl, owner, key, typ = s.run(STATUS, (name,))
    return locked, mine, ttl, (bytes(owner) if owner is not None else None), key, typ


def not_a_lock(key, redis_type):
    return (None, False, None, None, key, redis_type)


def assert_not_a_lock(s, key, redis_type, wire=None):
    """status() of key says "not a lock" and shows nothing of it; with wire
    (a Redis client), fewer than WIRE_BOUND bytes left that server."""
    before = out_bytes(wire) if wire is not None else 0
    row = status(s, key)
    assert row[3] is None, "owner shows %r" % row[3][:80]
    if wire is not None:
        sent = out_bytes(wire) - before
        assert sent < WIRE_BOUND, "%d bytes sent for one status" % sent
    assert row == not_a_lock(key, redis_type)


def out_bytes(c):
    return int(c.info("stats")["total_net_output_bytes"])


def redisson_id():
    return str(uuid.uuid4())


# ---------------------------------------------------------------- strings

FOREIGN_STRINGS = {
    # name: (value, TTL in ms or None)
    "json-secret": (SECRET, None),
    "json-secret-with-ttl": (SECRET, TTL_MS),
    "long": (b"a" * 129, TTL_MS),
    "megabyte": (b"s" * (1 << 20), TTL_MS),
    "invalid-utf8": (b"\xff\xfe\xc3(owner", TTL_MS),
    "spaces": (b"session of alice", TTL_MS),
    "nul-byte": (b"pgrl:\x00" + b"0" * 32, TTL_MS),
    "empty": (b"", TTL_MS),
    "persistent-pgrl-lookalike": (b"pgrl:" + b"0123456789abcdef" * 2, None),
    "persistent-uuid": (str(uuid.uuid4()).encode(), None),
}


@pytest.mark.parametrize("case", sorted(FOREIGN_STRINGS))
def test_another_applications_string_reveals_nothing(env, case):
    w, rc = env
    value, ttl = FOREIGN_STRINGS[case]
    key = "app:" + case
    rc.set(key, value, px=ttl)
    s = w.probe()
    assert_not_a_lock(s, key, "string", wire=rc)
    assert rc.get(key) == value


def test_a_value_of_128_bytes_is_an_owner_and_129_is_not(env):
    w, rc = env
    s = w.probe()
    rc.set("v128", b"k" * 128, px=TTL_MS)
    rc.set("v129", b"k" * 129, px=TTL_MS)
    locked, mine, ttl, owner, _, typ = status(s, "v128")
    assert (locked, mine, owner, typ) == (True, False, b"k" * 128, "string")
    assert ttl.total_seconds() > 50
    assert_not_a_lock(s, "v129", "string")


# ---------------------------------------------------------------- hashes

def foreign_hashes():
    rid = redisson_id()
    holder = rid + ":1"
    many = {"%s:%d" % (rid, i): "1" for i in range(65)}
    return {
        # name: (mapping, TTL in ms or None)
        "secret-fields": ({"password": "hunter2", "email": "alice@example.com",
                           "api_token": SECRET}, TTL_MS),
        "secret-fields-persistent": ({"password": "hunter2"}, None),
        "holder-with-secret-value": ({holder: "hunter2"}, TTL_MS),
        "holder-beside-a-secret": ({holder: "1", "api_token": SECRET}, TTL_MS),
        "rlock-without-ttl": ({holder: "1"}, None),
        "bad-mode": ({"mode": "hunter2", holder: "1"}, TTL_MS),
        "mode-alone": ({"mode": "read"}, TTL_MS),
        "writer-in-read-mode": ({"mode": "read", holder + ":write": "1"}, TTL_MS),
        "write-mode-without-writer": ({"mode": "write", holder: "1"}, TTL_MS),
        "not-a-uuid": ({"user:42": "7"}, TTL_MS),
        "thread-id-too-long": ({rid + ":" + "9" * 20: "1"}, TTL_MS),
        "zero-count": ({holder: "0"}, TTL_MS),
        "other-writer": ({"mode": "write", "other:write": "1"}, TTL_MS),
        "too-many-fields": (many, TTL_MS),
    }


@pytest.mark.parametrize("case", sorted(foreign_hashes()))
def test_a_hash_that_is_not_a_lock_reveals_nothing(env, case):
    w, rc = env
    mapping, ttl = foreign_hashes()[case]
    key = "app:" + case
    rc.hset(key, mapping=mapping)
    if ttl is not None:
        rc.pexpire(key, ttl)
    s = w.probe()
    assert_not_a_lock(s, key, "hash")
    assert len(rc.hgetall(key)) == len(mapping)


def test_a_megabyte_hash_is_not_sent(env):
    w, rc = env
    rc.hset("app:big", mapping={"field-%05d" % i: "v" * 100 for i in range(10000)})
    rc.pexpire("app:big", TTL_MS)
    s = w.probe()
    assert_not_a_lock(s, "app:big", "hash", wire=rc)


# ---------------------------------------------------------------- other types

def test_lists_sets_and_sorted_sets_reveal_nothing(env):
    w, rc = env
    rc.rpush("app:list", SECRET)
    rc.sadd("app:set", SECRET)
    rc.zadd("app:zset", {SECRET: 1})
    for key in ("app:list", "app:set", "app:zset"):
        rc.pexpire(key, TTL_MS)
    s = w.probe()
    assert_not_a_lock(s, "app:list", "list")
    assert_not_a_lock(s, "app:set", "set")
    assert_not_a_lock(s, "app:zset", "zset")
    assert status(s, "app:nothing") == (False, False, None, None, "app:nothing", "none")


# ---------------------------------------------------------------- real locks

def lock_row(s, key):
    locked, mine, ttl, owner, k, typ = status(s, key)
    assert k == key
    assert ttl is not None and 0 < ttl.total_seconds() <= 60
    return locked, mine, owner, typ


def test_foreign_clients_string_locks_report_their_owner(env):
    w, rc = env
    s = w.probe()
    lk = Lock(rc, "py-lock", timeout=30)                          # redis-py
    assert lk.acquire(blocking=False)
    assert lock_row(s, "py-lock") == (True, False, lk.local.token, "string")
    jedis = str(uuid.uuid4()).encode()                            # hand-written Java
    rc.set("java-lock", jedis, nx=True, px=30000)
    assert lock_row(s, "java-lock") == (True, False, jedis, "string")
    redsync = b"q2Zl+N0/hZP8kxgWc1Zt6g=="                         # base64 of 16 bytes
    rc.set("go-lock", redsync, nx=True, px=30000)
    assert lock_row(s, "go-lock") == (True, False, redsync, "string")
    rc.delete("py-lock")        # (lk.release() would run redis-py's script)
    assert status(s, "py-lock") == (False, False, None, None, "py-lock", "none")


def test_redisson_hashes_report_their_holder(env):
    w, rc = env
    s = w.probe()
    rid = redisson_id()
    # RLock (and RFairLock): "<client uuid>:<thread id>" -> hold count
    rc.hset("rlock", rid + ":57", 2)
    rc.pexpire("rlock", 30000)
    assert lock_row(s, "rlock") == (True, False, (rid + ":57").encode(), "hash")
    # a reactive client's random thread id may be negative
    rc.hset("rlock-rx", rid + ":-4611686018427387904", 1)
    rc.pexpire("rlock-rx", 30000)
    assert lock_row(s, "rlock-rx")[2] == (rid + ":-4611686018427387904").encode()
    # RReadWriteLock read holds: "mode" = "read", one field per reader,
    # and a timeout key per hold
    readers = [rid + ":61", redisson_id() + ":12"]
    rc.hset("rw", mapping={"mode": "read", readers[0]: 1, readers[1]: 2})
    for i, r in enumerate(readers):
        rc.set("{rw}:%s:rwlock_timeout:1" % r, 1, px=30000)
    rc.pexpire("rw", 30000)
    locked, mine, owner, typ = lock_row(s, "rw")
    assert (locked, mine, typ) == (True, False, "hash")
    assert owner.decode() in readers
    # the write hold: "<uuid>:<thread id>:write", the writer also reading
    rc.delete("rw")
    rc.hset("rw", mapping={"mode": "write", rid + ":61": 1, rid + ":61:write": 1})
    rc.pexpire("rw", 30000)
    assert lock_row(s, "rw") == (True, False, (rid + ":61:write").encode(), "hash")


def test_the_roles_own_locks_are_held_by_it(env):
    w, rc = env
    s = w.probe()
    assert s.run("SELECT redis_lock_try_acquire('own-simple', ttl => '30s')") is True
    locked, mine, owner, typ = lock_row(s, "own-simple")
    assert (locked, mine, typ) == (True, True, "string")
    assert owner == rc.get("own-simple") and owner.startswith(b"pgrl:")
    assert status(w.probe(), "own-simple")[:2] == (True, False)   # another session
    if not w.scripting:
        return                  # only the simple layout exists without scripts
    s.run("SET redis_lock.protocol = 'redisson'")
    assert s.run("SELECT redis_lock_try_acquire('own-redisson', ttl => '30s')") is True
    locked, mine, owner, typ = lock_row(s, "own-redisson")
    assert (locked, mine, typ) == (True, True, "hash")
    assert rc.hkeys("own-redisson") == [owner]
    assert s.run("SELECT redis_lock_try_acquire_read('own-rw', ttl => '30s')") is True
    locked, mine, owner, typ = lock_row(s, "own-rw")
    assert (locked, mine, typ) == (True, True, "hash")
    assert rc.hget("own-rw", owner) == b"1"
    assert s.run("SELECT redis_lock_release_read('own-rw')") is True
    assert s.run("SELECT redis_lock_try_acquire_write('own-rw', ttl => '30s')") is True
    locked, mine, owner, typ = lock_row(s, "own-rw")
    assert (locked, mine, typ) == (True, True, "hash")
    assert owner.endswith(b":write") and rc.hget("own-rw", "mode") == b"write"


# ---------------------------------------------------------------- Redlock

@pytest.fixture(scope="module")
def redlock():
    w = World([testbed.Redis().start() for _ in range(3)])
    yield w
    w.close()


def test_redlock_reveals_nothing_of_other_keys(redlock):
    w = redlock
    w.reset()
    try:
        s = w.probe()
        for r in w.servers:
            r.client().set("app:secret", SECRET, px=TTL_MS)
        assert_not_a_lock(s, "app:secret", "string")
        # one master with a foreign lock, two with the secret: no majority,
        # and only the lock's owner value can be shown
        w.servers[0].client().set("app:secret", b"their-token", px=TTL_MS)
        locked, mine, ttl, owner, _, typ = status(s, "app:secret")
        assert (locked, mine, typ) == (None, False, "string")
        assert owner in (None, b"their-token")
        assert s.run("SELECT redis_lock_try_acquire('rl-own', ttl => '30s')") is True
        locked, mine, ttl, owner, _, typ = status(s, "rl-own")
        assert (locked, mine, typ) == (True, True, "string")
        assert owner == w.rc.get("rl-own")
    finally:
        w.end_test()


def test_the_role_has_only_login(world):
    """The premise: the probe role is a plain LOGIN role."""
    s = Session(world.pg, user=ROLE)
    try:
        with pytest.raises(psycopg2.errors.InsufficientPrivilege):
            s.run("SELECT redis_lock_force_release('x')")
    finally:
        s.close()
