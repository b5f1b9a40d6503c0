"""Group commit: the pushes of one tenant that arrive while a write is under way are
written together, in one catalog transaction and one transaction per day file, and each request is
answered only after the commit that holds its units.

No request waits for a timer: the first request to arrive writes at once (the *leader*); requests
that arrive meanwhile queue, and when the leader is done one of them leads the next group with
every request queued by then. Under one writer a group is one request, as before; under many, the
transactions per push fall with the queue's length.
"""
from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass


@dataclass(eq=False)
class Job:
    """One request's part of a group: its valid units (index in the request, unit), its result slots
    (filled by the group's write), and the error that failed the whole group, if any."""
    valid: list
    results: list
    now: float
    done: bool = False
    error: BaseException | None = None

    @property
    def units(self) -> int:
        return len(self.valid)


class Group:
    """The queue of one tenant's pushes in this process; ``write(jobs)`` stores a group of them."""

    def __init__(self, write, max_units: int):
        self._write = write
        self.max_units = max(1, max_units)
        self._queue: deque[Job] = deque()
        self._cond = threading.Condition()
        self._leading = False
        self.groups = 0          # groups written, and the requests they held (for the benchmarks)
        self.jobs = 0

    def idle(self) -> bool:
        """Nothing queued and nobody writing: the store may let go of this group (a new one serves alike)."""
        with self._cond:
            return not self._queue and not self._leading

    def submit(self, job: Job) -> None:
        """Store ``job``'s units with whatever else is queued; return once committed (or raise what
        failed the group)."""
        with self._cond:
            self._queue.append(job)
        while True:
            with self._cond:
                while not job.done and self._leading:
                    self._cond.wait()
                if job.done:
                    break
                self._leading = True
            self._lead()        # (a group full before this job came up leaves it for the next)
        if job.error is not None:
            raise job.error

    def _lead(self) -> None:
        jobs: list[Job] = []
        try:
            with self._cond:
                units = 0
                # at least one request; then whole requests while they fit
                while self._queue and (not jobs or units + self._queue[0].units <= self.max_units):
                    job = self._queue.popleft()
                    jobs.append(job)
                    units += job.units
            try:
                self._write(jobs)
            except BaseException as e:  # noqa: BLE001  (every request of the group gets the error: none is acked)
                for job in jobs:
                    job.error = e
            self.groups += 1
            self.jobs += len(jobs)
        finally:
            with self._cond:
                for job in jobs:
                    job.done = True
                self._leading = False
                self._cond.notify_all()
