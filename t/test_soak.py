"""100 000 acquire/release cycles in one backend: memory stays flat."""
import pytest

from conftest import Session


def backend_memory(s):
    ctx = s.run("SELECT sum(total_bytes) FROM pg_backend_memory_contexts")
    with open("/proc/%d/status" % s.pid) as f:
        rss = [int(line.split()[1]) for line in f if line.startswith("VmRSS:")][0]
    return int(ctx), rss * 1024


@pytest.mark.parametrize("cycles", [100000])
def test_soak_memory_is_flat(pg, cycles):
    s = Session(pg)
    chunk = cycles // 10
    step = ("SELECT count(*) FROM (SELECT redis_lock_acquire('soak', ttl => '30s'), "
            "redis_lock_release('soak') FROM generate_series(1, %d)) s" % chunk)
    s.run(step)                                  # warm: connections, scripts
    first = backend_memory(s)
    for _ in range(9):
        assert s.run(step) == chunk
    last = backend_memory(s)
    print("\nsoak: %d cycles, memory contexts %d -> %d bytes, RSS %d -> %d kB"
          % (cycles, first[0], last[0], first[1] // 1024, last[1] // 1024))
    assert last[0] - first[0] <= 64 * 1024          # contexts: flat
    assert last[1] - first[1] <= 1024 * 1024        # RSS, hiredis included: flat
    assert s.run("SELECT count(*) FROM redis_lock_held()") == 0
    s.close()
