"""Slow or stalled clients do not hold gunicorn's worker threads indefinitely (issue 7)."""
import socket
import time

import requests


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    sock.settimeout(seconds)
    try:
        while sock.recv(4096):
            pass   # a 408/400 answer, then the close
        return True
    except socket.timeout:
        return False
    except OSError:
        return True


def test_stalled_headers_and_bodies_are_dropped(live_server_factory):
    server = live_server_factory(workers=1, env={"CONTEXT_READ_TIMEOUT_S": "2", "CONTEXT_THREADS": "2"})
    port = server.port
    stalled = []
    for _ in range(2):   # as many as the worker has threads: without a deadline it would be stuck
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"POST /mcp/push HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 1000\r\n\r\n{\"type\":")
        stalled.append(s)
    for _ in range(2):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"POST /mcp/push HTTP/1.1\r\nHost: x\r\n")
        stalled.append(s)
    start = time.monotonic()
    assert all(_closed_within(s, 20) for s in stalled)
    assert time.monotonic() - start < 20
    # The worker is free again: a normal request is answered.
    assert requests.get(server.url + "/healthz", timeout=20).status_code == 200
    for s in stalled:
        s.close()
