"""``GuardedWorker``: gunicorn's threaded worker (``gunicorn.workers.gthread.ThreadWorker``) with the slow-client
guard, named by ``worker_class`` in service/gunicorn_conf.py. It overrides the worker's methods (and its connection
class's) rather than replacing gunicorn's: a thread's turn with a connection (``handle``), what the main thread
does once it ends (``finish_request``), each turn of the loop (``murder_pending``) and the connection's socket,
setup and close (``GuardedConn``). Its bounds are the app's settings (service/config.py), read once the worker
has loaded the app.
"""
from __future__ import annotations

import errno
import json
import selectors
import socket
from concurrent import futures
from functools import partial

from gunicorn import util
from gunicorn.workers import gthread

from ..config import Config
from ..shares.admission import serving
from .arrival import Door, buffer_request, hand_over
from .parking import Park, Parking, admit
from .responses import Bounds, DeadlineSocket, Flush, reset

UNSENT_BYTES = 128 * 1024        # of a response, held unsent by the kernel per connection (TCP_NOTSENT_LOWAT)
DRAIN_BYTES = 64 * 1024          # what a closing connection still reads of a body nobody wanted (no waiting)
_CODES = {400: "bad_request", 403: "forbidden", 408: "request_timeout", 414: "uri_too_long",
          417: "expectation_failed", 431: "headers_too_large", 500: "internal_error", 501: "not_implemented"}

if not hasattr(gthread, "_DEFER"):
    raise RuntimeError("service/guard/ needs gunicorn >= 27 (gthread connection deferral)")


def json_error(status: int, reason: str, message: str) -> bytes:
    body = json.dumps({"error": message[:200] or reason, "code": _CODES.get(status, "bad_request")}).encode()
    head = (f"HTTP/1.1 {status} {reason}\r\nConnection: close\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode("latin-1")
    return head + body


def write_error(sock, status_int, reason, mesg):
    """gunicorn's own 400/414/431 answers, in the REST error shape."""
    util.write_nonblock(sock, json_error(status_int, reason, f"{reason}: {mesg}" if mesg else reason))


def close_quickly(raw: socket.socket) -> None:
    """Close after a final answer without lingering on the worker's main thread (gunicorn's graceful close
    waits up to 2 s for the peer there): FIN after what was sent, then read only what has already arrived."""
    try:
        raw.setblocking(False)
        raw.shutdown(socket.SHUT_WR)
        drained = 0
        while drained < DRAIN_BYTES:
            data = raw.recv(65536)
            if not data:
                break
            drained += len(data)
    except OSError:
        pass
    finally:
        raw.close()


class GuardedConn(gthread.TConn):
    """A connection whose socket is a ``DeadlineSocket``, with the request it is buffering (``arrival``) and its
    admission (service/guard/parking.py)."""

    def __init__(self, cfg, sock, client, server, bounds: Bounds):
        try:
            # The kernel keeps at most this much of a response unsent (plus what is in flight, which a slow
            # reader's window keeps small): the rest waits in the guard, under its pace and deadline.
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, "TCP_NOTSENT_LOWAT", 25), UNSENT_BYTES)
        except OSError:
            pass                                     # not TCP (a unix socket), or not Linux
        super().__init__(cfg, DeadlineSocket(sock, bounds), client, server)
        self.arrival = None
        self.waiting = self.admitted = self.refusal = None

    def close(self, graceful=False):
        if not isinstance(self.sock, DeadlineSocket):
            return super().close(graceful)
        if self.sock.spool is not None:
            self.sock.end(None)
        self.discard_arrival()
        if graceful:
            close_quickly(self.sock._sock)
        else:
            self.sock._sock.close()

    def discard_arrival(self) -> None:
        if self.arrival is not None and self.arrival.spool is not None:
            self.arrival.spool.close()
        self.arrival = None

    def refuse_expired(self) -> None:
        """Answer 408 to a request that did not arrive in time, and close the connection both ways."""
        raw = self.sock._sock
        try:
            raw.setblocking(False)
            raw.send(json_error(408, "Request Timeout", "The request did not arrive within the deadline."))
            # Shut both ways: gunicorn's lingering close would otherwise keep reading what this
            # client still trickles, on the worker's main thread.
            raw.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.discard_arrival()


class GuardedWorker(gthread.ThreadWorker):
    """gunicorn's gthread worker, guarded: requests arrive without a thread, may wait for one parked, and
    responses to slow clients are written by the poller (service/guard/)."""

    def init_process(self):
        # gunicorn writes its own error pages (400, 414, 431...) from base.Worker.handle_error through this one
        # function, after 80 lines that choose the status: it has no hook for the page, so it alone is replaced.
        util.write_error = write_error
        super().init_process()

    def run(self):
        # The app is loaded by now (init_process): its settings bound the guard (another app under these settings,
        # a benchmark's: the environment's), its keys and limits admit.
        config = (getattr(self.wsgi, "config", None) or {}).get("CONTEXT")
        self.bounds = Bounds.from_config(config if config is not None else Config.from_env())
        self.door = Door(self.wsgi, self.bounds)
        self.parking = Parking(self, self.door)
        self.flushing: dict = {}                     # connections whose response the poller writes: their Flush
        super().run()

    def accept(self, listener):
        """gunicorn's own, with the guard's connection class (gthread names TConn inside it)."""
        try:
            client_sock, client_addr = listener.accept()
            self.nr_conns += 1
            client_sock.setblocking(True)
            self.enqueue_req(GuardedConn(self.cfg, client_sock, client_addr, listener.getsockname(), self.bounds))
        except OSError as e:
            if e.errno not in (errno.EAGAIN, errno.ECONNABORTED, errno.EWOULDBLOCK):
                raise

    def handle(self, conn):
        """A worker thread's turn with a connection: buffer what arrived, park a request that may not take a thread
        yet, or serve the whole request."""
        if not isinstance(conn.sock, DeadlineSocket):
            return super().handle(conn)
        if conn.admitted is None:                        # (a parked request comes back admitted)
            try:
                state = buffer_request(conn, self.bounds, self.door)
            except Exception as e:  # noqa: BLE001 - whatever the socket did, the parser reports it
                self.log.debug("buffering a request failed: %s", e)
                hand_over(conn)
                state = "ready"
            if state == "wait":
                return gthread._DEFER
            if state == "expired":
                self.log.debug("closing %s: request headers and body not received within %ss",
                               conn.client, self.bounds.request_deadline_s)
                conn.refuse_expired()
                return False
            park = admit(self.door, conn)
            if park is not None:
                return park                              # the main thread keeps it: this thread is free
        release, conn.admitted = conn.admitted, None
        serving(release)                                 # (a request that becomes a stream lets go early: shares.admission.let_go)
        try:
            return self._serve(conn)
        finally:
            serving(None)
            release()

    def _serve(self, conn):
        """Serve the request that has arrived on ``conn`` (its refusal, when the admission refused it)."""
        arrival, conn.arrival = conn.arrival, None
        sock = conn.sock
        deadline = None
        if arrival is not None and self.bounds.request_deadline_s > 0:
            deadline = arrival.started + self.bounds.request_deadline_s
        sock.begin(deadline, arrival.spool if arrival is not None else None)
        sock.close_after = arrival is not None and arrival.close_after
        sock.refusal, conn.refusal = conn.refusal, None
        try:
            keepalive = super().handle(conn) and not sock.close_after
            if sock.out is not None and not sock.dropped and sock._sock.fileno() >= 0:
                return Flush(sock, bool(keepalive))      # the poller writes the rest: this thread is free
            return keepalive
        finally:
            if sock.dropped:
                self.log.debug("dropped %s: %s", conn.client, sock.dropped)
            sock.end(getattr(conn.parser, "unreader", None))

    def handle_request(self, req, conn):
        if getattr(conn.sock, "close_after", False):
            req.force_close()                            # the body was left unread: the answer says close
        return super().handle_request(req, conn)

    def finish_request(self, conn, fs):
        """On the worker's main thread: a parked request is kept, a response for a slow client goes to the poller,
        anything else as before, and then the parked requests are asked about again (a thread has come free)."""
        flush = fs.result() if fs.done() and not fs.cancelled() and fs.exception() is None else None
        if isinstance(flush, Park):
            return self.parking.park(conn, flush.at)
        try:
            if isinstance(flush, Flush):
                self._flush(conn, flush)
            else:
                super().finish_request(conn, fs)
        finally:
            self.parking.recheck()

    def _flush(self, conn, flush: Flush) -> None:
        try:
            conn.sock.setblocking(False)
            self.flushing[conn] = flush
            self.poller.register(conn.sock, selectors.EVENT_WRITE, partial(self._on_writable, conn))
        except Exception:  # noqa: BLE001 - as gunicorn's own finish_request: the connection is closed
            self.flushing.pop(conn, None)
            flush.close()
            self.nr_conns -= 1
            conn.close()

    def _on_writable(self, conn, _fileobj):
        flush = self.flushing[conn]
        try:
            done = flush.write(conn.sock._sock)
            why = None if done else flush.overdue()
        except OSError as e:
            done, why = False, f"writing failed ({e})"
        if done:
            self.poller.unregister(conn.sock)
            del self.flushing[conn]
            fut = futures.Future()
            fut.set_result(flush.keepalive)
            super().finish_request(conn, fut)            # kept alive or closed, as gunicorn decided
        elif why:
            self._drop_flushing(conn, why)

    def _drop_flushing(self, conn, why: str) -> None:
        self.poller.unregister(conn.sock)
        self.flushing.pop(conn).close()
        self.log.debug("dropped %s: %s", conn.client, why)
        reset(conn.sock._sock)
        self.nr_conns -= 1
        conn.close()

    def murder_pending(self):
        """Each turn of the worker's loop (at least once a second): also drop clients that read too slowly, and ask
        about the parked requests again."""
        super().murder_pending()
        self.parking.recheck(due_only=True)
        for conn, flush in list(self.flushing.items()):
            why = flush.overdue()
            if why:
                self._drop_flushing(conn, why)
