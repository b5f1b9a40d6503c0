"""Checks every front door makes before its view runs (docs/design.md §9).

One rule for REST, ``/mcp``, ``/retrieval`` and the adapters, in every mode (keys or not):
1. Host must name this service (DNS rebinding) and a browser's Origin must be this service
   or one the operator listed (cross-site requests): 403 otherwise.
2. A request body must be declared JSON (``application/json`` or ``*+json``): a web page can
   send ``text/plain`` or a form without a CORS preflight, never JSON. 415 otherwise.
3. The route's body limit is checked before anything reads the body: 413.
Errors travel in the door's own shape (see ``errors.respond``).

A browser page on an origin the operator listed (``CONTEXT_ALLOWED_ORIGINS``: a web app, or ``null`` for
a Figma plugin's sandboxed window) gets CORS answers: its preflight is answered here, before any key is
asked for (a preflight carries none), and every answer to it names its origin. Same-origin pages need
none; other origins were refused by rule 1 before CORS could matter.

``Origin: null`` names no site: every sandboxed iframe, ``file://`` page and ``data:`` URL sends it. So it is
never trusted without keys (a start listing it, or ``*``, with no keys is refused: ``refuse_shared_origins``)
and, with keys, it reaches the push route only (``NULL_ORIGIN_ROUTES``): never reads, admin, the console or
metrics (docs/design.md §9).
"""
from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from flask import Flask, current_app, make_response, request
from werkzeug.exceptions import ClientDisconnected, RequestEntityTooLarge

from .auth import presents_a_key
from .errors import ApiError
from .state import app_state

# Routes whose body may be a batch of units (up to config.max_body_bytes); all others get max_request_bytes.
BATCH_ROUTES = ("/mcp/push",)
# What a page whose Origin is "null" may reach (the Figma plugin pushes; nothing there reads or manages).
NULL_ORIGIN_ROUTES = ("/mcp/push",)
# Listed origins that any web page can send: "null" (sandboxed frames, file:// pages, data: URLs) and "*".
SHARED_ORIGINS = ("null", "*")


class DoorRefused(ApiError):
    status, code = 403, "forbidden"


def allowed_hosts(config) -> set[str]:
    hosts = {h.strip().lower() for h in (*config.allowed_hosts, *config.mcp_allowed_hosts) if h.strip()}
    public = urlsplit(config.public_url or "").hostname
    if public:
        hosts.add(public.lower())       # the operator's own service name (e.g. the docker-compose one)
    return hosts


def _host_name(host: str) -> str:
    """``name`` of ``name:port``, ``[v6]:port``, ``name``; '' when it does not parse."""
    if host.startswith("["):
        end = host.find("]")
        rest = host[end + 1:] if end > 0 else "?"
        return host[:end + 1] if rest == "" or (rest[:1] == ":" and rest[1:].isdigit()) else ""
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def host_ok(host: str | None, allowed: set[str]) -> bool:
    if "*" in allowed:
        return True
    if host in allowed:                  # (as sent: the common case, no copy made)
        return True
    host = (host or "").strip().lower()
    if not host:
        return False
    if host in allowed:                  # an exact "name:port" entry
        return True
    name = _host_name(host)
    return bool(name) and (name in allowed or name.strip("[]") in allowed)


def listed_origins(config) -> set[str]:
    """The origins the operator listed (``CONTEXT_ALLOWED_ORIGINS`` and its older name), normalized."""
    return {o.strip().lower().rstrip("/") for o in (*config.allowed_origins, *config.mcp_allowed_origins)
            if o.strip()}


class Allowed:
    """What the doors let in, made once from the configuration (which does not change while the app runs):
    hosts and listed origins as sets, not rebuilt for every request."""

    def __init__(self, config):
        self.hosts = allowed_hosts(config)
        self.origins = listed_origins(config)

    def listed(self, origin: str | None) -> str | None:
        """The request's Origin as sent when the operator listed it (or listed ``*``): the origins that get
        CORS answers. None for no Origin, this service's own, or any other."""
        if origin is None:
            return None
        return origin if "*" in self.origins or origin.strip().lower().rstrip("/") in self.origins else None


def allowed(app=None) -> Allowed:
    """The app's Allowed (made by init_app; made here for an app without the doors)."""
    app = app or current_app
    state = app_state(app, optional=True)
    return state.doors if state is not None else Allowed(app.config["CONTEXT"])


def origin_ok(origin: str | None, host: str | None, listed: set[str]) -> bool:
    """No Origin: not a browser (or a same-origin GET). Else the exact origin of this service
    (scheme://Host as the request names it: any other port on localhost is another site) or one
    ``listed`` (``allowed_origins``)."""
    if origin is None:
        return True
    origin = origin.strip().lower().rstrip("/")
    if "*" in listed or origin in listed:
        return True
    try:
        parts = urlsplit(origin)
    except ValueError:
        return False
    if parts.scheme not in ("http", "https") or parts.path or not parts.netloc:
        return False
    host = (host or "").strip().lower()
    default_port = {"http": ":80", "https": ":443"}[parts.scheme]
    return parts.netloc in (host, host.removesuffix(default_port)) or parts.netloc + default_port == host


def null_origin(origin: str | None) -> bool:
    return origin is not None and origin.strip().lower() == "null"


# What a listed origin's page may send and read (the MCP transport's headers among them)
CORS_METHODS = "GET, POST, DELETE, OPTIONS"
CORS_HEADERS = "Authorization, Content-Type, Accept, Last-Event-ID, Mcp-Session-Id, MCP-Protocol-Version"
CORS_EXPOSE = "Retry-After, Mcp-Session-Id, MCP-Protocol-Version"
CORS_MAX_AGE_S = 600


def preflight():
    """A listed origin's CORS preflight: 204 with what it may send, before authentication."""
    if request.method != "OPTIONS" or "Access-Control-Request-Method" not in request.headers:
        return None
    origin = allowed().listed(request.headers.get("Origin"))
    if origin is None:
        return None
    response = make_response("", 204)
    response.headers.update({"Access-Control-Allow-Methods": CORS_METHODS,
                             "Access-Control-Allow-Headers": CORS_HEADERS,
                             "Access-Control-Max-Age": str(CORS_MAX_AGE_S)})
    return response


def allow_cross_origin(response):
    """Every answer to a listed origin names it (errors too: the page must be able to read why)."""
    origin = request.environ.get("HTTP_ORIGIN")
    if origin is not None:
        origin = allowed().listed(origin)
        if origin is not None:
            response.headers["Access-Control-Allow-Origin"] = origin
            response.headers["Access-Control-Expose-Headers"] = CORS_EXPOSE
    if "Vary" in response.headers:
        response.vary.add("Origin")
    else:
        response.headers["Vary"] = "Origin"     # (what vary.add writes, without parsing and rebuilding the header)
    return response


def is_json_type(mimetype: str) -> bool:
    return mimetype == "application/json" or (mimetype.startswith("application/") and mimetype.endswith("+json"))


def body_limit(config, path: str) -> int:
    if path in BATCH_ROUTES:
        return config.max_body_bytes
    if path == "/mcp":
        # A context_push call carries one whole unit: room for its largest content and metadata.
        return config.max_request_bytes + config.max_content_bytes + config.max_metadata_bytes
    return config.max_request_bytes


def has_body() -> bool:
    if request.content_length:
        return True
    return "chunked" in request.headers.get("Transfer-Encoding", "").lower()


def check_request() -> None:
    environ = request.environ        # the headers read once, as the WSGI server parsed them
    doors = allowed()
    host, origin = environ.get("HTTP_HOST"), environ.get("HTTP_ORIGIN")
    if not host_ok(host, doors.hosts):
        raise DoorRefused("Forbidden: Host header not allowed (DNS rebinding protection).", code="host_not_allowed")
    if origin is not None:
        if not origin_ok(origin, host, doors.origins):
            raise DoorRefused("Forbidden: Origin not allowed (cross-site request).", code="origin_not_allowed")
        if null_origin(origin) and request.path not in NULL_ORIGIN_ROUTES:
            raise DoorRefused("Forbidden: a page with Origin null (a sandboxed frame, a file:// page or a data: URL) "
                              "may only push (POST /mcp/push).", code="origin_not_allowed")
    if request.method in ("GET", "HEAD", "OPTIONS") or not has_body():
        return
    config = current_app.config["CONTEXT"]
    limit = body_limit(config, request.path)
    if request.content_length is not None and request.content_length > limit:
        raise ApiError(f"Request body too large: at most {limit} bytes on this route.", code="payload_too_large",
                       status=413)
    if not is_json_type(request.mimetype):
        raise ApiError("Send the body as JSON with 'Content-Type: application/json'.",
                       code="unsupported_media_type", status=415)
    if request.content_length is None:
        if not presents_a_key():
            return          # authentication before the body: the view answers 401 without reading it
        # Chunked: no length up front. werkzeug stops reading at max_content_length but hands back the
        # truncated body (a 400 "invalid JSON" instead of 413, finding 14), so read one byte more here.
        request.max_content_length = limit + 1
        try:
            size = len(request.get_data(cache=True))
        except (OSError, ClientDisconnected):
            raise ApiError("The request body did not arrive in time.", code="request_timeout", status=408) from None
        except RequestEntityTooLarge:
            size = limit + 1
        if size > limit:
            raise ApiError(f"Request body too large: at most {limit} bytes on this route.",
                           code="payload_too_large", status=413)


def refuse_open_bind(config, keys) -> None:
    """RuntimeError when no keys are configured and the bind is not loopback (unless CONTEXT_ALLOW_OPEN)."""
    if keys.open and not config.allow_open and not is_loopback_bind(config.bind):
        raise RuntimeError(
            f"No API keys are configured and CONTEXT_BIND={config.bind} is not loopback, "
            "so anyone who can reach it could read and write everything. Configure keys "
            "(CONTEXT_API_KEYS_FILE, see `context-mode keys add`), bind 127.0.0.1, or set "
            "CONTEXT_ALLOW_OPEN=1 if a proxy in front authenticates callers.")


def refuse_shared_origins(config, keys) -> None:
    """RuntimeError when no keys are configured and an origin any web page can send is listed: without a key
    to ask for, ``null`` or ``*`` would let every site a user visits push into, or read, the memory."""
    shared = sorted(listed_origins(config) & set(SHARED_ORIGINS))
    if keys.open and shared:
        raise RuntimeError(
            f"CONTEXT_ALLOWED_ORIGINS lists {' and '.join(repr(o) for o in shared)} and no API keys are configured: "
            "every sandboxed iframe, file:// page and data: URL sends Origin null, so any web page could reach "
            "the memory. Configure keys (CONTEXT_API_KEYS_FILE, see `context-mode keys add`; the Figma plugin "
            "needs one with the push scope) or list exact origins.")


def is_loopback_bind(bind: str) -> bool:
    """True when every address of a gunicorn-style bind ("host:port", "unix:path", comma list) is local."""
    for part in (b.strip() for b in bind.split(",")):
        if not part or part.startswith("unix:"):
            continue
        host = part.rsplit(":", 1)[0] if part.count(":") == 1 or part.startswith("[") else part
        host = host.strip("[]").lower()
        if host == "localhost":
            continue
        try:
            if not ipaddress.ip_address(host).is_loopback:
                return False
        except ValueError:
            return False                 # a name (or "") may resolve to any interface
    return True


def doors() -> object:
    """Before every view: the checks, then a listed origin's preflight (one hook: Flask's cost is per hook)."""
    check_request()
    return preflight()


def init_app(app: Flask) -> Allowed:
    """The doors' checks on every request; the hosts and origins they accept (for the app's state)."""
    app.before_request(doors)
    app.after_request(allow_cross_origin)
    return Allowed(app.config["CONTEXT"])
