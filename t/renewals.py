"""Watch the watchdog renew many locks, from Redis's side.

Used by t/test_watchdog_scale.py and bench/run (section watchdog_scale).
Nothing here trusts the extension's own bookkeeping: each sample reads the
PTTL of every key "<prefix>1" .. "<prefix>N" in one short Lua script per
chunk, together with Redis's own clock, which gives each key's expiry time
to the millisecond.  A renewal moves the expiry; expiry - lease is when the
renewal ran in Redis.  So:

  - the gap between two renewals of a key is the difference between two
    expiry times seen, exact however seldom we sample, as long as we sample
    more often than the key is renewed (a renewal we did not see makes the
    gap look LONGER: a false alarm, never a missed one);
  - a key not renewed for too long shows as a small PTTL (now - last renewal
    = lease - PTTL) at the next sample, even if it is renewed later;
  - a key that expired or was never set shows as PTTL -2.
"""
import array
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
        self.renewals = 0             # renewals seen (expiry moved)
        self.max_gap_ms = 0           # longest gap between two renewals seen
        self.max_open_ms = 0          # longest time since a renewal at a sample
        self.min_pttl_ms = None
        self.missing = 0              # readings of a key with no TTL or no key
        self.late = []                # (key index, gap ms) over the bound
        self.renewed_at = []          # Redis time of every renewal seen
        self.samples = 0
        self.sample_s = []            # how long each full sample took

    def reset_stats(self):
        """Forget what was seen so far, but keep each key's last expiry."""
        self.renewals = self.max_gap_ms = self.max_open_ms = self.missing = 0
        self.min_pttl_ms = None
        self.late, self.renewed_at = [], []

    def bound_ms(self):
        return self.lease_ms / 3.0

    def sample(self):
        t0 = time.monotonic()
        for lo in range(1, self.n + 1, self.chunk):
            hi = min(self.n, lo + self.chunk - 1)
            raw = self.c.evalsha(self.sha, 0, self.prefix, lo, hi)
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
                self.max_open_ms = max(self.max_open_ms, self.lease_ms - pttl)
                prev = self.expiry[k]
                if prev is not None and exp > prev + JITTER_MS:
                    gap = exp - prev
                    self.renewals += 1
                    self.renewed_at.append(exp - self.lease_ms)
                    if gap > self.max_gap_ms:
                        self.max_gap_ms = gap
                    if gap > self.bound_ms() + JITTER_MS:
                        self.late.append((k + 1, gap))
                if prev is None or exp > prev:
                    self.expiry[k] = exp
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
                "smallest PTTL %s ms; %d late, %d missing"
                % (self.samples, self.renewals, self.max_gap_ms, self.max_open_ms,
                   self.bound_ms(), self.min_pttl_ms, len(self.late), self.missing))


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


def process_title(pid):
    """What the process shows in ps (PostgreSQL's process title)."""
    with open("/proc/%d/cmdline" % pid, "rb") as f:
        return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
