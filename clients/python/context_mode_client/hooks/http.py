"""The agent hooks' HTTP client: the three calls a hook makes (push a batch, pack context, search), over a plain
socket from the standard library, every read and write bounded by the hook's deadline.

Why not ``requests`` (the package's client): importing it costs ~150 ms, ``http.client`` ~30 ms and even
``socket`` ~4 ms (its enum conversions), on every hook call an agent waits for; a hook sends one small JSON
request to a known server and reads one answer, so plain HTTP/1.1 over the C socket module is enough (``ssl``
and ``socket`` are imported only for an https URL).
"""
from __future__ import annotations

import _socket
import json

MAX_ANSWER_BYTES = 16 << 20          # no answer a hook asks for comes near this; a larger one is not read


class HookError(Exception):
    """An error answer (``code`` the service's machine code) or a transport failure (``connection_error``,
    ``timeout``, ``invalid_response``)."""

    def __init__(self, message: str, code: str, status: int | None = None):
        super().__init__(message)
        self.message, self.code, self.status = message, code, status

    def __str__(self) -> str:
        status = f"HTTP {self.status} " if self.status is not None else ""
        return f"{status}{self.code}: {self.message}"


def split_url(url: str) -> tuple[str, str, int, str]:
    """(scheme, host, port, base path) of ``http[s]://host[:port][/base]``; ValueError for anything else."""
    scheme, sep, rest = url.partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in ("http", "https"):
        raise ValueError(f"CONTEXT_URL={url!r} is not an http(s) URL")
    authority, slash, path = rest.partition("/")
    authority = authority.rpartition("@")[2]
    if authority.startswith("["):                       # [::1]:5000
        host, _, port = authority[1:].partition("]")
        port = port.lstrip(":")
    else:
        host, _, port = authority.partition(":")
    if not host or (port and not port.isdigit()):
        raise ValueError(f"CONTEXT_URL={url!r} has no usable host and port")
    return scheme, host, int(port) if port else (443 if scheme == "https" else 80), ("/" + path).rstrip("/")


class HookHttp:
    """POSTs JSON to the service within ``deadline`` (an object with ``left()``, seconds)."""

    def __init__(self, url: str, api_key: str | None, deadline):
        self.scheme, self.host, self.port, self.base = split_url(url)
        self.api_key, self.deadline = api_key, deadline

    def push_batch(self, units: list) -> list:
        return self.post("/mcp/push", {"units": units})["results"]

    def push_later(self, units: list) -> "Pending":
        """Send a push and read its answer later (``result()``): a hook asks for context meanwhile."""
        return Pending(self, self.send("/mcp/push", {"units": units}), lambda body: body["results"])

    def context(self, query: str, **params) -> dict:
        return self.post("/mcp/context", {"query": query, **params})

    def search(self, query: str, **params) -> dict:
        return self.post("/mcp/search", {"query": query, **params})

    def post(self, path: str, body: dict) -> dict:
        return self.receive(self.send(path, body))

    def send(self, path: str, body: dict):
        """Connect and send one request; the socket, to ``receive`` its answer from."""
        data = json.dumps(body, ensure_ascii=False).encode("utf-8")
        host = f"[{self.host}]" if ":" in self.host else self.host
        head = [f"POST {self.base}{path} HTTP/1.1", f"Host: {host}:{self.port}", "User-Agent: context-mode-hook/0.1",
                "Content-Type: application/json", "Accept: application/json", f"Content-Length: {len(data)}",
                "Connection: close"]
        if self.api_key:
            head.append(f"Authorization: Bearer {self.api_key}")
        request = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + data
        try:
            sock = self._connect()
        except _socket.timeout:
            raise HookError("the service did not answer within the hook's deadline", "timeout") from None
        except OSError as e:
            raise HookError(f"{type(e).__name__}: {e}", "connection_error") from None
        try:
            sock.settimeout(self._left())
            sock.sendall(request)
        except _socket.timeout:
            sock.close()
            raise HookError("the service did not answer within the hook's deadline", "timeout") from None
        except OSError as e:
            sock.close()
            raise HookError(f"{type(e).__name__}: {e}", "connection_error") from None
        return sock

    def receive(self, sock) -> dict:
        """The answer to a request ``send`` sent on ``sock`` (which it closes)."""
        try:
            status, headers, raw = self._read(sock)
        except _socket.timeout:
            raise HookError("the service did not answer within the hook's deadline", "timeout") from None
        except OSError as e:
            raise HookError(f"{type(e).__name__}: {e}", "connection_error") from None
        finally:
            sock.close()
        return _decode(status, headers, raw)

    def _connect(self):
        if self.scheme == "https":
            import socket
            import ssl
            raw = socket.create_connection((self.host, self.port), timeout=self._left())
            return ssl.create_default_context().wrap_socket(raw, server_hostname=self.host)
        error: OSError = OSError(f"no address for {self.host}")
        for family, kind, proto, _, address in _socket.getaddrinfo(self.host, self.port, 0, _socket.SOCK_STREAM):
            sock = _socket.socket(family, kind, proto)
            try:
                sock.settimeout(self._left())
                sock.connect(address)
                return sock
            except OSError as e:
                error = e
                sock.close()
        raise error

    def _left(self) -> float:
        left = self.deadline.left()
        if left <= 0:
            raise _socket.timeout()
        return left

    def _read(self, sock) -> tuple[int, dict, bytes]:
        """Status, headers and body; every recv waits at most until the deadline (a server that drips a byte at
        a time cannot hold the hook past it)."""
        buf = b""
        while b"\r\n\r\n" not in buf:
            buf += self._recv(sock)
            if len(buf) > 65536:
                raise HookError("the answer's headers are too long", "invalid_response")
        head, _, rest = buf.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        try:
            status = int(lines[0].split()[1])
        except (IndexError, ValueError):
            raise HookError(f"not an HTTP answer: {lines[0][:80]!r}", "invalid_response") from None
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        if "chunked" in headers.get("transfer-encoding", "").lower():
            return status, headers, self._chunked(sock, rest)
        length = headers.get("content-length")
        want = int(length) if length and length.isdigit() else None
        if want is not None and want > MAX_ANSWER_BYTES:
            raise HookError(f"an answer of {want} bytes", "invalid_response")
        while want is None or len(rest) < want:
            chunk = self._recv(sock, allow_eof=want is None)
            if not chunk:
                break
            rest += chunk
            if len(rest) > MAX_ANSWER_BYTES:
                raise HookError("an answer past the size a hook reads", "invalid_response")
        return status, headers, rest if want is None else rest[:want]

    def _chunked(self, sock, rest: bytes) -> bytes:
        body = b""
        while True:
            while b"\r\n" not in rest:
                rest += self._recv(sock)
            size_line, _, rest = rest.partition(b"\r\n")
            try:
                size = int(size_line.split(b";")[0], 16)
            except ValueError:
                raise HookError("a malformed chunked answer", "invalid_response") from None
            if size == 0:
                return body
            while len(rest) < size + 2:
                rest += self._recv(sock)
            body += rest[:size]
            rest = rest[size + 2:]
            if len(body) > MAX_ANSWER_BYTES:
                raise HookError("an answer past the size a hook reads", "invalid_response")

    def _recv(self, sock, allow_eof: bool = False) -> bytes:
        sock.settimeout(self._left())
        chunk = sock.recv(65536)
        if not chunk and not allow_eof:
            raise HookError("the connection closed before the answer was complete", "connection_error")
        return chunk


class Pending:
    """A request sent whose answer is read when needed."""

    def __init__(self, http: HookHttp, sock, shape):
        self.http, self.sock, self.shape = http, sock, shape

    def result(self):
        return self.shape(self.http.receive(self.sock))


def _decode(status: int, headers: dict, raw: bytes) -> dict:
    try:
        body = json.loads(raw.decode("utf-8")) if raw else None
    except ValueError:
        body = None
    if status >= 400:
        if isinstance(body, dict) and "code" in body:
            raise HookError(str(body.get("error", "")), str(body["code"]), status)
        raise HookError(raw[:200].decode("utf-8", "replace") or "HTTP error", "http_error", status)
    if not isinstance(body, dict):
        raise HookError("the answer is not a JSON object", "invalid_response", status)
    return body

