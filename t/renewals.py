"""Watch the watchdog renew many locks, from Redis's side.

Used by t/test_watchdog_scale.py and bench/run (section watchdog_scale).
Nothing here trusts the extension's own bookkeeping: each sample reads the
PTTL of every key "<prefix>1" .. "<prefix>N" in one short Lua script per
chunk, together with Redis's own clock, which gives each key's expiry time
to the millisecond.  A renewal moves the expiry; expiry - lease is when the
renewal ran in Redis.  So:

  - the gap between two renewals of a key is the difference between two
    expiry times seen, exact as long as no renewal fell between the two
    readings unseen (one we did not see makes the gap look LONGER: a false
    alarm, never a missed one).  The worker sends two renewals of one lock
    at least lease/6 apart (take_at in src/worker/watchdog.c), so a gap whose two
    readings are closer than that is marked exact; one read further apart
    (sampled seldom, or by a sampler a loaded machine slowed down) is only
    an upper bound;
  - a key not renewed for too long shows as a small PTTL (now - last renewal
    = lease - PTTL) at the next sample, even if it is renewed later;
  - a key that expired or was never set shows as PTTL -2.
"""
import array
import os
import struct
import sys
import time

# one chunk of keys: Redis's clock (ms) first, then each key's PTTL, packed
# as little-endian int32 (decoding 100 000 RESP integers in Python would cost
# more CPU than the worker being measured); the script runs atomically, so
# every PTTL is relative to that one clock
SAMPLE_LUA = """
local t = redis.call('TIME')
local out = {struct.pack('<d', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))}
for i = tonumber(ARGV[2]), tonumber(ARGV[3]) do
  out[#out + 1] = struct.pack('<i', redis.call('PTTL', ARGV[1] .. i))
end
return table.concat(out)
"""

# PTTL and TIME are whole milliseconds: allow that much error per reading
JITTER_MS = 3


class RenewalWatch:
    """Track renewals of keys prefix1..prefixN with lease lease_ms."""

    def __init__(self, client, prefix, n, lease_ms, chunk=5000):
        self.c = client
        self.prefix = prefix
        self.n = n
        self.lease_ms = lease_ms
        self.chunk = chunk
        self.sha = client.script_load(SAMPLE_LUA)
        self.expiry = [None] * n      # expiry time (Redis ms) last seen
        self.read_at = [None] * n     # Redis time of the key's last reading
        self.renewals = 0             # renewals seen (expiry moved)
        self.max_gap_ms = 0           # longest gap between two renewals seen
        self.max_open_ms = 0          # longest time since a renewal at a sample
        self.min_pttl_ms = None
        self.missing = 0              # readings of a key with no TTL or no key
        self.late = []                # (key, gap ms, from, to, exact) over the bound
        self.open_late = []           # (key, ms since renewal, from, to) over it
        self.max_exact_gap_ms = 0     # the longest gap read close enough to be exact
        self.inexact = 0              # gaps read too far apart to be exact
        self.renewed_at = []          # Redis time of every renewal seen
        self.samples = 0
        self.last_read_ms = None      # Redis time of the last chunk read
        self.sample_s = []            # how long each full sample took
        self.max_chunk_ms = 0.0       # the longest round trip of one chunk's
                                      # script: Redis runs nothing else
                                      # meanwhile, a renewal neither

    def reset_stats(self):
        """Forget what was seen so far, but keep each key's last expiry."""
        self.renewals = self.max_gap_ms = self.max_open_ms = self.missing = 0
        self.max_exact_gap_ms = self.inexact = 0
        self.min_pttl_ms = None
        self.late, self.open_late, self.renewed_at = [], [], []

    def bound_ms(self):
        return self.lease_ms / 3.0

    def sample(self):
        t0 = time.monotonic()
        for lo in range(1, self.n + 1, self.chunk):
            hi = min(self.n, lo + self.chunk - 1)
            c0 = time.monotonic()
            raw = self.c.evalsha(self.sha, 0, self.prefix, lo, hi)
            self.max_chunk_ms = max(self.max_chunk_ms, (time.monotonic() - c0) * 1000.0)
            now = int(struct.unpack_from("<d", raw)[0])
            pttls = array.array("i")
            pttls.frombytes(raw[8:])
            if sys.byteorder != "little":
                pttls.byteswap()
            for i, pttl in enumerate(pttls):
                k = lo - 1 + i
                if pttl < 0:
                    self.missing += 1
                    continue
                if self.min_pttl_ms is None or pttl < self.min_pttl_ms:
                    self.min_pttl_ms = pttl
                exp = now + pttl
                opened = self.lease_ms - pttl
                self.max_open_ms = max(self.max_open_ms, opened)
                if opened > self.bound_ms() + JITTER_MS:
                    self.open_late.append((k + 1, opened, exp - self.lease_ms, now))
                prev = self.expiry[k]
                if prev is not None and exp > prev + JITTER_MS:
                    gap = exp - prev
                    self.renewals += 1
                    self.renewed_at.append(exp - self.lease_ms)
                    exact = now - self.read_at[k] < self.lease_ms / 6.0
                    if exact:
                        self.max_exact_gap_ms = max(self.max_exact_gap_ms, gap)
                    else:
                        self.inexact += 1
                    self.max_gap_ms = max(self.max_gap_ms, gap)
                    if gap > self.bound_ms() + JITTER_MS:
                        self.late.append((k + 1, gap, prev - self.lease_ms,
                                          exp - self.lease_ms, exact))
                if prev is None or exp > prev:
                    self.expiry[k] = exp
                self.read_at[k] = now
            self.last_read_ms = now
        self.samples += 1
        self.sample_s.append(time.monotonic() - t0)

    def all_renewed_since(self, t_redis_ms):
        """Has every key been renewed at or after Redis time t?"""
        return all(e is not None and e - self.lease_ms >= t_redis_ms for e in self.expiry)

    def redis_now_ms(self):
        s, us = self.c.time()
        return s * 1000 + us // 1000

    def passes(self, split_ms):
        """Renewals grouped into passes: runs of renewal times with no hole
        longer than split_ms.  Returns [(first ms, last ms, count)]."""
        out = []
        for t in sorted(self.renewed_at):
            if out and t - out[-1][1] <= split_ms:
                out[-1][1] = t
                out[-1][2] += 1
            else:
                out.append([t, t, 1])
        return [tuple(p) for p in out]

    def ok(self):
        return (not self.late and self.missing == 0
                and self.max_open_ms <= self.bound_ms() + JITTER_MS)

    def summary(self):
        return ("%d samples, %d renewals seen; longest gap between renewals %d ms, "
                "longest since a renewal at a sample %d ms (bound: lease/3 = %.0f ms); "
                "smallest PTTL %s ms; %d late, %d missing; %d gaps read too far "
                "apart to be exact, the longest exact one %d ms; slowest sample %.0f ms"
                % (self.samples, self.renewals, self.max_gap_ms, self.max_open_ms,
                   self.bound_ms(), self.min_pttl_ms, len(self.late), self.missing,
                   self.inexact, self.max_exact_gap_ms,
                   1000 * max(self.sample_s or [0])))


class CpuWait:
    """How long some processes waited for a CPU, as the kernel counts it:
    the time each spent runnable but not running (/proc/PID/schedstat,
    second field), plus the machine's steal time per CPU (/proc/stat: a
    virtual CPU the hypervisor did not run).  mark(t) records the running
    total at Redis time t; during(a, b) is how much of it fell between the
    last mark at or before a and the first at or after b (so at least what
    fell between a and b)."""

    def __init__(self, pids):
        self.pids = list(pids)
        self.ncpu = os.cpu_count() or 1
        self.hz = os.sysconf("SC_CLK_TCK")
        self.marks = []                  # (Redis ms, total waited ms)

    def _total_ms(self):
        total = 0.0
        for pid in self.pids:
            with open("/proc/%d/schedstat" % pid) as f:
                total += int(f.read().split()[1]) / 1e6
        with open("/proc/stat") as f:
            steal = int(f.readline().split()[8])
        return total + steal * 1000.0 / self.hz / self.ncpu

    def mark(self, t_ms):
        self.marks.append((t_ms, self._total_ms()))

    def during(self, a_ms, b_ms):
        before = [w for t, w in self.marks if t <= a_ms]
        after = [w for t, w in self.marks if t >= b_ms]
        start = before[-1] if before else self.marks[0][1]
        end = after[0] if after else self.marks[-1][1]
        return end - start


def _children_titles(postmaster_pid):
    """(pid, process title) of each child of the postmaster."""
    import os
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % d) as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid != postmaster_pid:
                continue
            with open("/proc/%s/cmdline" % d, "rb") as f:
                found.append((int(d), f.read()))
        except (OSError, ValueError, IndexError):
            continue
    return found


def watchdog_pid(postmaster_pid):
    """pid of the redis_lock watchdog worker of the prompt lane (the one
    serving targets that answer) under this postmaster."""
    for pid, title in _children_titles(postmaster_pid):
        if b"redis_lock watchdog" in title:
            return pid
    return None


def watchdog_pids(postmaster_pid):
    """pids of both watchdog workers (the prompt lane's and the slow
    lane's) under this postmaster."""
    return [pid for pid, title in _children_titles(postmaster_pid)
            if b"redis_lock watchdog" in title
            or b"redis_lock slow-target watchdog" in title]


def process_stopped(pid):
    """Is pid stopped (SIGSTOP)?  Its state in /proc, after the command."""
    with open("/proc/%d/stat" % pid) as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


def process_title(pid):
    """What the process shows in ps (PostgreSQL's process title)."""
    with open("/proc/%d/cmdline" % pid, "rb") as f:
        return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
