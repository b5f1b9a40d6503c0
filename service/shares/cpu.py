"""CPU shares (docs/design.md §9, "CPU shares"): what each tenant's searches cost a worker in CPU lately, and how
long one past its share waits while a lighter tenant searches."""
from __future__ import annotations

import math
import threading


class CpuShares:
    """What each tenant's searches cost this worker in CPU over about the last ``window_s`` (thread time, decayed
    exponentially), so a tenant searching without pause can be held to ``share`` of the worker's CPU while
    another tenant searches too. Slots alone could not do it: a tenant within its share of slots still keeps the
    interpreter busy, and another's search, however small, waits for the lock between every step (eight
    threads of one tenant searching 1 MB units made another's searches 6-10x slower, bench/large_units.py).

    A tenant past its share is held only while a lighter tenant (one within its share) has searched within
    ``3 * window_s``: a tenant alone gets the whole worker, and tenants all past their shares are not held
    (they share the worker as their slots let them, and no CPU is left idle for nobody)."""

    def __init__(self, share: float, window_s: float = 1.0):
        self.share, self.window = share, window_s
        self.spent: dict[str, tuple[float, float]] = {}     # tenant -> (CPU seconds decayed to `at`, at)
        self.seen: dict[str, float] = {}                    # tenant -> when it last searched
        self.lock = threading.Lock()

    def _spent(self, tenant: str, now: float) -> float:
        spent, at = self.spent.get(tenant, (0.0, now))
        return spent * math.exp((at - now) / self.window)

    def charge(self, tenant: str, cpu_s: float, now: float) -> None:
        with self.lock:
            self.spent[tenant] = (self._spent(tenant, now) + cpu_s, now)
            self.seen[tenant] = now
            if len(self.seen) > 64:                         # forget tenants idle for a while
                idle = now - 10 * self.window
                for name in [t for t, when in self.seen.items() if when < idle]:
                    del self.seen[name]
                    self.spent.pop(name, None)

    def wait_for(self, tenant: str, now: float) -> float:
        """Seconds until ``tenant`` is back within its share (0 when it is, or when no lighter tenant searches)."""
        with self.lock:
            self.seen[tenant] = now
            spent, limit = self._spent(tenant, now), self.share * self.window
            if spent <= limit:
                return 0.0
            recent = now - 3 * self.window
            if not any(when >= recent and self._spent(name, now) <= limit
                       for name, when in self.seen.items() if name != tenant):
                return 0.0
            return self.window * math.log(spent / limit)
