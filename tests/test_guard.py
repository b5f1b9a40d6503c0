"""The slow-client guard inside gunicorn (service/guard/): what it reads of a head to buffer a body without a
thread, Expect: 100-continue, slow heads and bodies that cannot hold the worker threads, and gunicorn's own
errors as JSON. (Every attack in both directions, also behind nginx: tests/test_slow_clients.py.)"""
import json

import requests

from conftest import make_unit


# --- buffering a request before a thread takes it (guard/arrival.py) ----------------------------------------
def test_request_buffering_rules():
    """What the guard reads of a head to buffer its body without a thread (tests/test_slow_clients.py runs it)."""
    from service.guard.arrival import ChunkScanner, parse_head
    def head(text: bytes):
        return parse_head(text, text.index(b"\r\n\r\n") + 4)
    h = head(b"POST /mcp/search?x=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\nExpect: 100-continue\r\n"
             b"Authorization: Bearer k\r\n\r\n{")
    assert (h.path, h.length, h.chunked, h.expect, h.authorization, h.plain) == ("/mcp/search", 10, False, True,
                                                                                  "Bearer k", True)
    assert head(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n").chunked
    # Framing the guard does not follow goes to gunicorn's parser as it is (which answers 400, 417 or 501).
    for odd in (b"Content-Length: 1\r\nContent-Length: 2", b"Content-Length: 1\r\nTransfer-Encoding: chunked",
                b"Transfer-Encoding: gzip", b"Expect: tea", b"Content-Length: -1", b"Bad :x"):
        assert not head(b"POST / HTTP/1.1\r\n" + odd + b"\r\n\r\n").plain, odd
    scan = ChunkScanner()
    for piece in (b"5\r\nab", b"cde\r\n1;ext=1\r\nf\r\n", b"0\r\n", b"X-Trailer: 1\r\n"):
        scan.feed(piece)
        assert not scan.done
    scan.feed(b"\r\n")
    assert scan.done and scan.received == 6 and not scan.bad
    bad = ChunkScanner()
    bad.feed(b"zz\r\n")
    assert bad.bad


def test_a_response_is_sent_without_switching_the_sockets_mode():
    """The guard sends what the socket takes at once with MSG_DONTWAIT, leaving a blocking socket blocking (a
    mode switch is a system call that lets go of the interpreter); one with a timeout set for this request's
    reads is made non-blocking, as before; a client that reads nothing gets the rest kept for the poller."""
    import socket
    from service.guard.responses import Bounds, DeadlineSocket
    bounds = Bounds(read_timeout_s=5, request_deadline_s=5, grace_s=5, min_receive_rate=1, min_send_rate=1,
                    write_deadline_s=5, max_body_bytes=1 << 20)
    ours, theirs = socket.socketpair()
    try:
        sock = DeadlineSocket(ours, bounds)
        sock.begin(None, None)
        sock.sendall(b"HTTP/1.1 200 OK\r\n\r\n")
        sock.sendall(b"{}")
        assert ours.gettimeout() is None and sock.out is None            # blocking still, all sent
        assert theirs.recv(100) == b"HTTP/1.1 200 OK\r\n\r\n{}"
        sock.end(None)
        ours.settimeout(2.0)                                             # (as a read of the request sets it)
        sock.begin(None, None)
        sock.sendall(b"x" * (8 << 20))                                   # nobody reads: the rest is kept
        assert ours.gettimeout() == 0.0 and sock.out is not None and 0 < sock.out_size < 8 << 20
        sock.end(None)
    finally:
        ours.close()
        theirs.close()


def test_expect_100_continue_is_answered(live_server):
    import socket
    body = json.dumps(make_unit("expect continue")).encode()
    with socket.create_connection(("127.0.0.1", live_server.port), timeout=30) as s:
        s.sendall(f"POST /mcp/push HTTP/1.1\r\nHost: 127.0.0.1:{live_server.port}\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(body)}\r\nExpect: 100-continue\r\n\r\n".encode())
        assert s.recv(4096).startswith(b"HTTP/1.1 100 Continue")
        s.sendall(body)
        assert s.recv(65536).startswith(b"HTTP/1.1 200")


# --- slow clients cannot hold the worker threads ------------------------------------------------------------
def test_slowloris_headers_and_bodies_do_not_starve_healthz(live_server_factory):
    import socket
    import threading
    import time
    # One worker with 4 threads: 24 trickling sockets would hold every thread without the guard.
    server = live_server_factory(workers=1, env={"CONTEXT_THREADS": "4", "CONTEXT_REQUEST_DEADLINE_S": "8"})
    host = f"Host: 127.0.0.1:{server.port}\r\n".encode()
    heads, bodies = [], []
    for _ in range(24):
        s = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        s.sendall(b"GET /healthz HTTP/1.1\r\n" + host)
        heads.append(s)
    for _ in range(20):
        s = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        s.sendall(b"POST /mcp/search HTTP/1.1\r\n" + host + b"Content-Type: application/json\r\n"
                  b"Content-Length: 200\r\n\r\n{")
        bodies.append(s)
    stop = threading.Event()

    def trickle():
        while not stop.wait(1.0):
            for s in heads:
                try:
                    s.sendall(b"X-Slow: 1\r\n")
                except OSError:
                    pass
            for s in bodies:
                try:
                    s.sendall(b" ")
                except OSError:
                    pass
    t = threading.Thread(target=trickle, daemon=True)
    t.start()
    try:
        answered = 0
        for _ in range(6):
            rv = requests.get(server.url + "/healthz", timeout=5)
            answered += rv.status_code == 200
            time.sleep(1)
        assert answered == 6
        # Past the deadline every slow socket is answered 408 (or closed) rather than kept.
        for s in heads + bodies:
            s.settimeout(30)
            data = b""
            try:
                while True:
                    chunk = s.recv(4096)
                    if not chunk:
                        break
                    data += chunk
            except OSError:
                pass
            assert data == b"" or data.startswith(b"HTTP/1.1 408"), data[:100]
    finally:
        stop.set()
        t.join(timeout=5)
        for s in heads + bodies:
            s.close()
    assert "Traceback" not in server.log()


# --- gunicorn's own answers ---------------------------------------------------------------------------------
def test_gunicorn_errors_are_json_and_the_control_socket_is_off(live_server_factory, tmp_path):
    import socket
    runtime = tmp_path / "xdg"
    runtime.mkdir()
    live_server = live_server_factory(workers=1, env={"XDG_RUNTIME_DIR": str(runtime)})
    for request, status in [(b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414),
                            (b"NOT A REQUEST\r\n\r\n", 400),
                            (b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * 20000 + b"\r\n\r\n", 431)]:
        with socket.create_connection(("127.0.0.1", live_server.port), timeout=30) as s:
            s.sendall(request)
            data = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        assert head.startswith(f"HTTP/1.1 {status}".encode()), head
        assert b"application/json" in head
        doc = json.loads(body)
        assert set(doc) == {"error", "code"} and len(doc["error"]) <= 200
    # gunicorn >= 25 would bind $XDG_RUNTIME_DIR/gunicorn.ctl (else ~/.gunicorn/, shared by every instance).
    assert list(runtime.iterdir()) == []
