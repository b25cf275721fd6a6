"""Issue 43, item 2: an owner value (a token, a Redisson holder field, a
semaphore's permit ids) is minted in one place (rl_mint_owner), fresh for
every grant under every layout and mode; a reentrant hold keeps its
grant's.  So no command of an earlier grant can match a later one.

The reviewed scenario: a release whose reply misses command_timeout
becomes a doubt; the worker settles it; the session acquires the same
name again; then the original release, whose bytes a slow link had
already taken, reaches Redis.  It must not delete the new grant.  Under
the Redisson layouts the new grant used to take the backend's one field
again, and the late release deleted it while redis_lock_held() said held.
"""
import threading
import time

import pytest

import testbed
from test_interrupts import Env

# the release's command lands DELAY after it was sent; command_timeout is
# TIMEOUT, so the session gives up on it after TIMEOUT and has DELAY -
# TIMEOUT for the worker's settling and its own acquire before it lands
TIMEOUT = 1
DELAY = 4.0


class Layout:
    """One layout and mode: how a session takes and gives back a hold of
    name, and reads the owner value of its grant."""

    def __init__(self, ident, setup, acquire, release, reentrant=True, holds=()):
        self.ident = ident
        self.setup = setup
        self.holds = holds
        self.acquire_sql = acquire
        self.release_sql = release
        self.reentrant = reentrant
        self.semaphore = "semaphore" in acquire

    def prepare(self, s, k, holder=True):
        """Settings (and for the holder the holds kept throughout)."""
        for q in list(self.setup) + (list(self.holds) if holder else []):
            s.run(q.replace("NAME", k))

    def acquire(self, s, k):
        assert s.run(self.acquire_sql.replace("NAME", k)) not in (False, None)

    def release(self, k):
        return self.release_sql.replace("NAME", k)

    def owner(self, s, rc, k):
        """The owner value of s's grant, as Redis (or for a semaphore the
        session) holds it; None without one."""
        if self.semaphore:
            ids = s.run("SELECT permit_ids FROM redis_semaphores_held() "
                        "WHERE semaphore_name = %s", (k,))
            return ids[0] if ids else None
        if rc.type(k) == b"string":
            v = rc.get(k)
            return v.decode() if v else None
        fields = [f.decode() for f in rc.hkeys(k) if f != b"mode"]
        if self.ident in ("write",):
            fields = [f for f in fields if f.endswith(":write")]
        elif self.ident.startswith("read"):
            fields = [f for f in fields if not f.endswith(":write")]
        assert len(fields) <= 1, fields
        return fields[0] if fields else None

    def sent_text(self, owner):
        """What every command of the grant with this owner value carries:
        a semaphore's commands carry the value its permit ids are named
        from (28 hex digits of Redisson's 32; the UUID of "<uuid>_<n>")."""
        if self.ident == "semaphore-redisson":
            return owner[:28]
        return owner.split("_")[0]

    def present(self, rc, k, owner):
        """Does Redis still hold this owner value's grant?"""
        if self.semaphore:
            if self.ident == "semaphore-redisson":
                members = rc.zrange("{%s}:timeout" % k, 0, -1)
                return any(m.hex() == owner for m in members)
            return rc.zscore(k, owner) is not None
        if rc.type(k) == b"string":
            return rc.get(k) == owner.encode()
        return rc.hexists(k, owner)

    def competitor_sql(self):
        """What another session tries, to show the hold still excludes it."""
        if self.semaphore:
            return self.acquire_sql.replace("acquire(", "try_acquire(")
        if self.ident.startswith("read"):
            return "SELECT redis_lock_try_acquire_write('NAME')"
        if self.ident == "write":
            return "SELECT redis_lock_try_acquire_write('NAME')"
        return "SELECT redis_lock_try_acquire('NAME')"


LAYOUTS = [
    Layout("simple", ["SET redis_lock.protocol = 'simple'"],
           "SELECT redis_lock_acquire('NAME')", "SELECT redis_lock_release('NAME')"),
    Layout("redisson", ["SET redis_lock.protocol = 'redisson'"],
           "SELECT redis_lock_acquire('NAME')", "SELECT redis_lock_release('NAME')"),
    Layout("redisson_fair", ["SET redis_lock.protocol = 'redisson_fair'"],
           "SELECT redis_lock_acquire('NAME')", "SELECT redis_lock_release('NAME')"),
    Layout("read", [], "SELECT redis_lock_acquire_read('NAME')",
           "SELECT redis_lock_release_read('NAME')"),
    Layout("write", [], "SELECT redis_lock_acquire_write('NAME')",
           "SELECT redis_lock_release_write('NAME')"),
    # a read hold of a lock whose write hold the session keeps throughout
    Layout("read-beside-write", [], "SELECT redis_lock_acquire_read('NAME')",
           "SELECT redis_lock_release_read('NAME')",
           holds=["SELECT redis_lock_acquire_write('NAME')"]),
    Layout("semaphore-redisson", ["SET redis_lock.semaphore_protocol = 'redisson'",
                                  "SELECT redis_semaphore_init('NAME', 1)"],
           "SELECT redis_semaphore_acquire('NAME')",
           "SELECT redis_semaphore_release('NAME')", reentrant=False),
    Layout("semaphore-redis_semaphore",
           ["SET redis_lock.semaphore_protocol = 'redis_semaphore'"],
           "SELECT redis_semaphore_acquire('NAME', max_permits => 1)",
           "SELECT redis_semaphore_release('NAME')", reentrant=False),
]
IDS = [lay.ident for lay in LAYOUTS]


@pytest.fixture(scope="module")
def env():
    """Redis behind a proxy that delivers what a client sent also after
    that client gave up; a preloaded PostgreSQL (the worker settles
    doubts) with a command_timeout of TIMEOUT."""
    e = Env(**{"redis_lock.command_timeout": "%ds" % TIMEOUT})
    e.proxy.deliver_after_reset = True
    yield e
    e.close()


def held_and_not_lost(s, lay, k):
    if lay.semaphore:
        return s.run("SELECT bool_and(permits > 0 AND NOT lost) FROM redis_semaphores_held() "
                     "WHERE semaphore_name = %s", (k,))
    mode = {"read": "read", "write": "write", "read-beside-write": "read"}.get(lay.ident,
                                                                             "exclusive")
    return s.run("SELECT bool_and(hold_count > 0 AND NOT lost) FROM redis_lock_held() "
                 "WHERE lock_name = %s AND mode = %s", (k, mode))


@pytest.mark.parametrize("lay", LAYOUTS, ids=IDS)
def test_successive_grants_carry_fresh_owner_values_and_reentrant_ones_keep_theirs(env, lay):
    """Two grants of one name in one session, one after the other, carry
    different owner values; a reentrant acquire keeps its grant's; Redis,
    redis_lock_status and the views take the value for the session's."""
    s = env.session()
    k = "fresh-" + lay.ident
    try:
        lay.prepare(s, k)
        seen = []
        for _ in range(3):
            lay.acquire(s, k)
            v = lay.owner(s, env.rc, k)
            assert v and lay.present(env.rc, k, v), (v, env.rc.type(k))
            if lay.reentrant:
                lay.acquire(s, k)
                assert lay.owner(s, env.rc, k) == v, "a reentrant hold changed the owner value"
                assert s.run(lay.release(k)) is True
                assert lay.present(env.rc, k, v)
            if not lay.semaphore:
                assert s.run("SELECT held_by_me AND owner IS NOT NULL FROM "
                             "redis_lock_status(%s)", (k,)) is True
            assert held_and_not_lost(s, lay, k) is True
            assert s.run(lay.release(k)) is True
            seen.append(v)
        assert len(set(seen)) == len(seen), "an owner value came back: %s" % seen
    finally:
        env.thaw()
        env.rc.flushall()


class Monitor:
    """Every command Redis runs, with the address of its client (MONITOR)."""

    def __init__(self, rc):
        self.seen = []
        self.mon = rc.monitor()
        self.mon.__enter__()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        try:
            while True:
                c = self.mon.next_command()
                self.seen.append(("%s:%s" % (c["client_address"], c["client_port"]),
                                  c["command"]))
        except Exception:  # noqa: BLE001 - ends when closed
            pass

    def ran(self, addr, text, since=0):
        """Has a command from addr containing text run (since the
        since-th command seen)?"""
        return any(a == addr and text in cmd for a, cmd in list(self.seen)[since:])

    def close(self):
        try:
            self.mon.connection.disconnect()
        except Exception:  # noqa: BLE001
            pass


def dump(rc, k):
    t = rc.type(k)
    if t == b"hash":
        return dict((f.decode(), v.decode()) for f, v in rc.hgetall(k).items())
    return t.decode()


def session_addr(rc, pid):
    """The address Redis sees for the session's connection (the proxy's
    side of it)."""
    for c in rc.client_list():
        if c.get("name") == "redis_lock:%d" % pid:
            return c["addr"]
    raise AssertionError("no connection of backend %d" % pid)


@pytest.mark.parametrize("lay", LAYOUTS, ids=IDS)
def test_a_late_release_of_a_settled_doubt_never_deletes_the_next_grant(env, lay):
    """The reviewed scenario on every layout and mode.  The release's
    command lands DELAY (4 s) after it was sent; the session gives up
    after command_timeout (1 s): a doubt, which the worker settles.  The
    session acquires again: a new owner value.  When the original release
    reaches Redis, the new grant stays: Redis holds it, another session is
    refused, and the session holds it, not lost."""
    s = env.session()
    other = env.session()
    k = "late-" + lay.ident
    rc = env.rc
    mon = Monitor(rc)
    try:
        lay.prepare(s, k)
        lay.prepare(other, k, holder=False)
        lay.acquire(s, k)
        first = lay.owner(s, rc, k)
        assert first
        text = lay.sent_text(first)
        addr = session_addr(rc, s.pid)
        testbed.wait_until(lambda: mon.ran(addr, text), 5, 0.01,
                           what="the acquire to show in MONITOR")
        mark = len(mon.seen)
        # the release goes on a slow link: it lands DELAY after it was sent
        env.proxy.delay = DELAY
        before = env.proxy.chunks_in
        s.start(lay.release(k))
        testbed.wait_until(lambda: env.proxy.chunks_in > before, 5, 0.001,
                           what="the release to be sent")
        sent = time.monotonic()
        env.proxy.delay = 0.0
        s.join(10)
        print("the release after command_timeout: %r %r" % (s.result, s.error))
        # a doubt, which the worker settles: the first grant is gone
        testbed.wait_until(lambda: not lay.present(rc, k, first), 5, 0.01,
                           what="the worker to settle the doubt")
        lay.acquire(s, k)
        granted = time.monotonic()
        second = lay.owner(s, rc, k)
        assert not mon.ran(addr, text, mark) and granted < sent + DELAY, \
            "too slow: acquired after the late release landed"
        print("owner %s -> %s, acquired %.2f s after the release was sent"
              % (first, second, granted - sent))
        # the original release reaches Redis
        testbed.wait_until(lambda: mon.ran(addr, text, mark), DELAY + 5, 0.01,
                           what="the late release to reach Redis")
        assert lay.present(rc, k, second), \
            "the late release deleted the new grant (%s now: %s)" % (k, dump(rc, k))
        assert other.run(lay.competitor_sql().replace("NAME", k)) is False
        assert held_and_not_lost(s, lay, k) is True
        assert second != first, "the new grant took the owner value %s again" % first
        assert s.run(lay.release(k)) is True
    finally:
        mon.close()
        env.thaw()
        rc.flushall()
