"""The web console at /console: static files served by this app, no build step, no CDN.

The page is plain HTML, CSS and one JavaScript file (``static/``); it talks to the REST API with
the key the user typed, kept in the tab's sessionStorage and sent as the Bearer header (never in a
URL or a cookie). Stored content is untrusted: the script builds the page with DOM calls and
``textContent`` only, and every console response carries a strict Content-Security-Policy: scripts
and styles from this origin only (no inline code, no ``eval``), Trusted Types required (any
``innerHTML`` of a string throws), no frames, forms or base URIs, requests only to this origin.
"""
from __future__ import annotations

from importlib import resources

from flask import Blueprint, Flask, Response, current_app, jsonify, redirect

from ..auth import current_principal
from ..errors import NotFound
from ..state import app_state

bp = Blueprint("console", __name__)

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "font-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'; "
       "require-trusted-types-for 'script'; trusted-types 'none'")
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Permissions-Policy": "camera=(), microphone=(), geolocation=(), payment=(), usb=()",
}
# The only files served, with their types: nothing from a request becomes a path.
FILES = {
    "console.js": "text/javascript; charset=utf-8",
    "console.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}


def _static(name: str) -> bytes:
    cache = current_app.extensions.setdefault("console_files", {})
    if name not in cache:
        cache[name] = resources.files(__package__).joinpath("static", name).read_bytes()
    return cache[name]


def _secured(rv: Response, cache: str = "no-cache") -> Response:
    rv.headers.update(SECURITY_HEADERS)
    rv.headers["Cache-Control"] = cache
    return rv


@bp.get("/")
def root():
    """The service's root shows the console."""
    return redirect("/console/", code=302)


@bp.get("/console")
@bp.get("/console/")
def index():
    """The console's single page."""
    return _secured(Response(_static("index.html"), content_type="text/html; charset=utf-8"))


@bp.get("/console/<name>")
def static_file(name):
    """The console's script, style sheet and icon."""
    mimetype = FILES.get(name)
    if mimetype is None:
        raise NotFound("No such console file.", code="not_found")
    return _secured(Response(_static(name), content_type=mimetype), cache="no-cache")


@bp.get("/console/session")
def session():
    """Who the presented key is (tenant, scopes) and the unit types; open (no-keys) mode needs no key."""
    principal = current_principal()
    config = current_app.config["CONTEXT"]
    return _secured(jsonify({"tenant": principal.tenant, "scopes": sorted(principal.scopes),
                             "open": app_state().keys.open,
                             "types": list(config.types)}), cache="no-store")


def init_app(app: Flask) -> None:
    app.register_blueprint(bp)
