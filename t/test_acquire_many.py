"""Several locks at once: redis_lock_acquire_many / redis_lock_release_many
(README, "Several locks at once")."""
import threading
import time

import psycopg2
import pytest

from conftest import wait_for_wait_event
import testbed
from testbed import TIME_SCALE as S


def keys(rc, pattern="*"):
    return sorted(k.decode() for k in rc.keys(pattern) if not k.startswith(b"redis_lock:fence"))


def held(s):
    with s.conn.cursor() as cur:
        cur.execute("SELECT lock_name, scope, hold_count FROM redis_lock_held() ORDER BY 1, 2")
        return cur.fetchall()


def evalsha_calls(rc):
    return rc.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)


def test_takes_every_lock_tokens_in_order_and_one_evalsha(sessions, rc):
    a = sessions()
    a.run("SELECT redis_lock_acquire('warm'), redis_lock_release('warm')")
    rc.config_resetstat()
    tokens = a.run("SELECT redis_lock_acquire_many(ARRAY['m3', 'm1', 'm2'])")
    assert evalsha_calls(rc) == 1
    assert len(tokens) == 3 and all(t is not None for t in tokens)
    assert tokens == sorted(tokens) and len(set(tokens)) == 3, tokens
    assert keys(rc) == ["m1", "m2", "m3"]
    for name, tok in zip(["m3", "m1", "m2"], tokens):
        assert a.run("SELECT redis_lock_fence(%s)", (name,)) == tok
        assert rc.pttl(name) > 25000
    assert held(a) == [("m1", "session", 1), ("m2", "session", 1), ("m3", "session", 1)]
    rc.config_resetstat()
    assert a.run("SELECT redis_lock_release_many(ARRAY['m1', 'm2', 'm3'])") == 3
    assert evalsha_calls(rc) == 3  # three release scripts, one pipelined round trip
    assert keys(rc) == [] and held(a) == []
