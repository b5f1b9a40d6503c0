"""Requests that wait for a worker thread without holding one (docs/design.md §9, "Fair shares"; issue 50, H1).

Once a request has arrived whole, the app's ``Admission`` (service/shares/admission.py) says whether it may take a thread
now. One that must wait (its key or tenant holds its share of the worker's threads, or it would search past its
share of the search slots or of the CPU) is parked here, on the worker's main thread: off the thread pool and off
the poller, since its bytes are all buffered already. Parked requests are asked about again, in arrival order,
each time a request of the worker ends, at each turn of the worker's loop, and at the time their verdict named
(one small timer thread per worker wakes the loop then). One admitted goes back to the thread pool with its
ticket; one refused goes too, and the app answers its refusal at once (429 or 503 with Retry-After, in the door's
shape). A stopping worker serves what is parked, as it serves its other open connections.
"""
from __future__ import annotations

import math
import threading
import time

from ..shares.admission import nothing


class Park:
    """A thread's turn ended with the request parked: ask again by ``at`` (monotonic) at the latest."""

    __slots__ = ("at",)

    def __init__(self, at: float):
        self.at = at


def admit(door, conn) -> Park | None:
    """Ask whether ``conn``'s request may take a thread now. None: it goes (``conn.admitted`` is what to call once
    its thread is done with it, ``conn.refusal`` the answer to give instead of serving it, if any); else a Park."""
    admission, arrival = door.admission, conn.arrival
    if admission is None or arrival is None or arrival.head is None:
        conn.admitted = nothing
        return None
    now = time.monotonic()
    if conn.waiting is None:
        head = arrival.head
        conn.waiting = (admission.caller(head.authorization), admission.searches(head.method, head.path), now)
    caller, searches, since = conn.waiting
    conn.sock.owner = None if caller is None or admission.keys.open else caller.key_id
    kind, value = admission.admit(caller, searches, since, now)
    if kind == "wait":
        return Park(value)
    conn.waiting = None
    if kind == "refuse":
        conn.admitted, conn.refusal = nothing, value
    else:
        conn.admitted = value
    return None


class Parking:
    """One worker's parked requests (touched on its main thread only) and the timer that wakes its loop."""

    def __init__(self, worker, door):
        self.worker, self.door = worker, door
        self.conns: list = []                  # in arrival order
        self._due = math.inf                   # the soonest time a parked request's verdict named
        self._cond = threading.Condition()
        self._wake = math.inf                  # when the timer next wakes the loop
        self._timer: threading.Thread | None = None

    def park(self, conn, at: float) -> None:
        self.conns.append(conn)
        self._due = min(self._due, at)
        self._wake_at(at)

    def recheck(self, due_only: bool = False) -> None:
        """Ask about the parked requests again (``due_only``: only once the soonest time a verdict named has come);
        those that may go, to the thread pool. Once one request of a caller and kind must wait, its later ones
        (which arrived after it) wait too without being asked: a flood parks many of one key's requests."""
        if not self.conns or (due_only and time.monotonic() < self._due):
            return
        waiting, blocked, soonest = [], set(), math.inf
        for conn in self.conns:
            kind = conn.waiting[:2] if conn.waiting is not None else None
            if kind in blocked:
                waiting.append(conn)
                continue
            if not self.worker.alive:          # stopping: served as gunicorn serves what it has accepted
                conn.admitted, conn.waiting = nothing, None
                park = None
            else:
                park = admit(self.door, conn)
            if park is None:
                self.worker.enqueue_req(conn)
            else:
                waiting.append(conn)
                blocked.add(kind)
                soonest = min(soonest, park.at)
        self.conns = waiting
        self._due = soonest
        if waiting:
            self._wake_at(soonest)

    def _wake_at(self, at: float) -> None:
        with self._cond:
            if at < self._wake:
                self._wake = at
                self._cond.notify()
            if self._timer is None:
                self._timer = threading.Thread(target=self._run, name="context-mode-parking", daemon=True)
                self._timer.start()

    def _run(self) -> None:
        while True:
            with self._cond:
                left = self._wake - time.monotonic()
                if left > 0:
                    self._cond.wait(None if left == math.inf else left)
                    continue
                self._wake = math.inf
            self.worker.method_queue.defer(self.recheck)
