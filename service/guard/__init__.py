"""Slow clients cannot hold gunicorn's worker threads (docs/design.md §9): arrival.py the requests, deadline.py
the responses, parking.py the requests that must wait for a thread (their key's share, a search slot, their
tenant's CPU share) without holding one.

gthread hands a connection to a worker thread as soon as it is readable, and the thread then reads
the request with blocking ``recv`` calls and writes the response with blocking ``sendall``. A client
that sends one header line every few seconds (slowloris), trickles a body, or reads its answer
4 KiB at a time therefore held a thread for as long as it liked; 20 of them starved /healthz.
Installed from service/gunicorn_conf.py (in the master, before fork):

- **A request arrives without a thread** (service/guard/arrival.py): its head and its body, whatever
  the framing (Content-Length, chunked, after "100 Continue"), are buffered as they come, and the
  thread gets the whole request at once.
- **Authentication before the body.** A request with a body whose Authorization header names no
  configured key is handed over without it (and without "100 Continue"): the app answers 401 in its
  door's shape before reading a byte of it, and the connection closes. So does a body over the
  route's limit (413).
- **Total deadline.** Headers and body arrive within ``request_deadline_s`` of the first byte, or the
  client gets a JSON 408 and the connection is closed.
- **Responses** (service/guard/deadline.py): a client slower than the server has the rest of its
  response written by the worker's poller, not a thread; a thread that does wait on a client (a
  response over 8 MiB, a body not buffered) waits under a ``Pace``: ``slow_client_grace_s`` in all
  beyond what the client's pace pays for at ``min_send_rate`` / ``min_receive_rate``. Every response
  is written within ``write_deadline_s`` of its first byte. A client past a bound is reset. A live
  stream (service/hub.py) sets its own socket timeout, which bounds it instead.
- Connections close without lingering on the worker's main thread; a dropped slow client is a
  debug line, not a traceback; gunicorn's own 400/414/431 answers are JSON in the REST error shape.
"""
from __future__ import annotations

import json
import selectors
import socket
from concurrent import futures
from functools import partial

from ..limits import serving
from .arrival import Door, buffer_request, hand_over
from .deadline import Bounds, DeadlineSocket, Flush, reset
from .parking import Park, Parking, admit

UNSENT_BYTES = 128 * 1024        # of a response, held unsent by the kernel per connection (TCP_NOTSENT_LOWAT)
DRAIN_BYTES = 64 * 1024          # what a closing connection still reads of a body nobody wanted (no waiting)
_CODES = {400: "bad_request", 403: "forbidden", 408: "request_timeout", 414: "uri_too_long",
          417: "expectation_failed", 431: "headers_too_large", 500: "internal_error", 501: "not_implemented"}
_ORIGINAL: dict = {}             # gunicorn's own methods, called from the hooks below


def json_error(status: int, reason: str, message: str) -> bytes:
    body = json.dumps({"error": message[:200] or reason, "code": _CODES.get(status, "bad_request")}).encode()
    head = (f"HTTP/1.1 {status} {reason}\r\nConnection: close\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode("latin-1")
    return head + body


def refuse_expired(conn) -> None:
    """Answer 408 to a request that did not arrive in time, and close the connection both ways."""
    raw = conn.sock._sock
    try:
        raw.setblocking(False)
        raw.send(json_error(408, "Request Timeout", "The request did not arrive within the deadline."))
        # Shut both ways: gunicorn's lingering close would otherwise keep reading what this
        # client still trickles, on the worker's main thread.
        raw.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    _discard_arrival(conn)


def _discard_arrival(conn) -> None:
    arrival = getattr(conn, "arrival", None)
    if arrival is not None and arrival.spool is not None:
        arrival.spool.close()
    conn.arrival = None


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


# --- gunicorn's gthread worker, hooked ------------------------------------------------------------------
def _conn_init(self, cfg, sock, client, server):
    try:
        # The kernel keeps at most this much of a response unsent (plus what is in flight, which a slow
        # reader's window keeps small): the rest waits in the guard, under its pace and deadline.
        sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, "TCP_NOTSENT_LOWAT", 25), UNSENT_BYTES)
    except OSError:
        pass                                     # not TCP (a unix socket), or not Linux
    _ORIGINAL["init"](self, cfg, DeadlineSocket(sock, _ORIGINAL["bounds"]), client, server)
    self.arrival = None
    self.waiting = self.admitted = self.refusal = None      # the request's admission (service/guard/parking.py)


def _conn_close(self, graceful=False):
    if not isinstance(self.sock, DeadlineSocket):
        return _ORIGINAL["close"](self, graceful)
    if self.sock.spool is not None:
        self.sock.end(None)
    _discard_arrival(self)
    if graceful:
        close_quickly(self.sock._sock)
    else:
        self.sock._sock.close()


def _door(worker) -> Door:
    door = getattr(worker, "_context_door", None)
    if door is None:
        door = worker._context_door = Door(getattr(worker, "wsgi", None), _ORIGINAL["bounds"])
    return door


def _parking(worker) -> Parking:
    parking = getattr(worker, "_context_parking", None)
    if parking is None:
        parking = worker._context_parking = Parking(worker, _door(worker))
    return parking


def _handle(self, conn):
    """A worker thread's turn with a connection: buffer what arrived, park a request that may not take a thread
    yet, or serve the whole request."""
    from gunicorn.workers import gthread
    if not isinstance(conn.sock, DeadlineSocket):
        return _ORIGINAL["handle"](self, conn)
    bounds = _ORIGINAL["bounds"]
    if conn.admitted is None:                        # (a parked request comes back admitted)
        try:
            state = buffer_request(conn, bounds, _door(self))
        except Exception as e:  # noqa: BLE001 - whatever the socket did, the parser reports it
            self.log.debug("buffering a request failed: %s", e)
            hand_over(conn)
            state = "ready"
        if state == "wait":
            return gthread._DEFER
        if state == "expired":
            self.log.debug("closing %s: request headers and body not received within %ss",
                           conn.client, bounds.request_deadline_s)
            refuse_expired(conn)
            return False
        park = admit(_door(self), conn)
        if park is not None:
            return park                              # the main thread keeps it: this thread is free
    release, conn.admitted = conn.admitted, None
    serving(release)                                 # (a request that becomes a stream lets go early: limits.let_go)
    try:
        return _serve(self, conn)
    finally:
        serving(None)
        release()


def _serve(self, conn):
    """Serve the request that has arrived on ``conn`` (its refusal, when the admission refused it)."""
    bounds = _ORIGINAL["bounds"]
    arrival, conn.arrival = conn.arrival, None
    sock = conn.sock
    deadline = None
    if arrival is not None and bounds.request_deadline_s > 0:
        deadline = arrival.started + bounds.request_deadline_s
    sock.begin(deadline, arrival.spool if arrival is not None else None)
    sock.close_after = arrival is not None and arrival.close_after
    sock.refusal, conn.refusal = conn.refusal, None
    try:
        keepalive = _ORIGINAL["handle"](self, conn) and not sock.close_after
        if sock.out is not None and not sock.dropped and sock._sock.fileno() >= 0:
            return Flush(sock, bool(keepalive))      # the poller writes the rest: this thread is free
        return keepalive
    finally:
        if sock.dropped:
            self.log.debug("dropped %s: %s", conn.client, sock.dropped)
        sock.end(getattr(conn.parser, "unreader", None))


def _finish_request(self, conn, fs):
    """On the worker's main thread: a parked request is kept, a response for a slow client goes to the poller,
    anything else as before, and then the parked requests are asked about again (a thread has come free)."""
    flush = fs.result() if fs.done() and not fs.cancelled() and fs.exception() is None else None
    if isinstance(flush, Park):
        return _parking(self).park(conn, flush.at)
    try:
        _finish(self, conn, fs, flush)
    finally:
        _parking(self).recheck()


def _finish(self, conn, fs, flush):
    if not isinstance(flush, Flush):
        return _ORIGINAL["finish"](self, conn, fs)
    flushing = self.__dict__.setdefault("_context_flushing", {})
    try:
        conn.sock.setblocking(False)
        flushing[conn] = flush
        self.poller.register(conn.sock, selectors.EVENT_WRITE, partial(_on_writable, self, conn))
    except Exception:  # noqa: BLE001 - as gunicorn's own finish_request: the connection is closed
        flushing.pop(conn, None)
        flush.close()
        self.nr_conns -= 1
        conn.close()


def _on_writable(worker, conn, _fileobj):
    flush = worker._context_flushing[conn]
    try:
        done = flush.write(conn.sock._sock)
        why = None if done else flush.overdue()
    except OSError as e:
        done, why = False, f"writing failed ({e})"
    if done:
        worker.poller.unregister(conn.sock)
        del worker._context_flushing[conn]
        fut = futures.Future()
        fut.set_result(flush.keepalive)
        _ORIGINAL["finish"](worker, conn, fut)        # kept alive or closed, as gunicorn decided
    elif why:
        _drop_flushing(worker, conn, why)


def _drop_flushing(worker, conn, why: str) -> None:
    worker.poller.unregister(conn.sock)
    worker._context_flushing.pop(conn).close()
    worker.log.debug("dropped %s: %s", conn.client, why)
    reset(conn.sock._sock)
    worker.nr_conns -= 1
    conn.close()


def _murder_pending(self):
    """Each turn of the worker's loop (at least once a second): also drop clients that read too slowly, and ask
    about the parked requests again."""
    _ORIGINAL["murder"](self)
    _parking(self).recheck(due_only=True)
    for conn, flush in list(getattr(self, "_context_flushing", {}).items()):
        why = flush.overdue()
        if why:
            _drop_flushing(self, conn, why)


def _should_close(self):
    return _ORIGINAL["should_close"](self) or getattr(self.sock, "close_after", False)


def _write_error(sock, status_int, reason, mesg):
    from gunicorn import util
    util.write_nonblock(sock, json_error(status_int, reason, f"{reason}: {mesg}" if mesg else reason))


def install(bounds: Bounds) -> None:
    from gunicorn import util
    from gunicorn.http import wsgi
    from gunicorn.workers import gthread

    if _ORIGINAL:
        return
    if not hasattr(gthread, "_DEFER") or not hasattr(gthread.TConn, "init"):
        raise RuntimeError("service/guard/ needs gunicorn >= 27 (gthread connection deferral)")
    worker, conn = gthread.ThreadWorker, gthread.TConn
    _ORIGINAL.update(bounds=bounds, init=conn.__init__, close=conn.close, handle=worker.handle,
                     finish=worker.finish_request, murder=worker.murder_pending,
                     should_close=wsgi.Response.should_close)
    conn.__init__, conn.close = _conn_init, _conn_close
    worker.handle, worker.finish_request, worker.murder_pending = _handle, _finish_request, _murder_pending
    wsgi.Response.should_close = _should_close
    util.write_error = _write_error
