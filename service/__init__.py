"""Context Mode Service: a durable, searchable memory of LLM context (see docs/design.md)."""
from __future__ import annotations

import atexit
import logging
import os

from flask import Flask
from flask.json.provider import DefaultJSONProvider

from .boot import raise_open_files_limit
from .logs import setup_logging
from .config import Config

log = logging.getLogger("service")


def create_app(test_config: dict | Config | None = None) -> Flask:
    """Application factory: configuration, store, background maintenance, blueprints.

    Configuration: the ``CONTEXT_*`` environment when called without one (gunicorn's
    ``service:create_app()``); otherwise exactly the Config or mapping given (tests)."""
    # Imported here, not at the top: every ``service.*`` import runs this file first (gunicorn's
    # master reads service.config, the CLI's client commands service.cli), and only an app
    # needs the store, Flask blueprints and jieba. No cycle depends on it (tests/test_code_shape.py).
    from . import adapters, doors, errors, mcp, metrics, ratelimit
    from .api import health, search, units
    from .shares import admission, answers
    from .auth import KeyRing
    from .doors import refuse_open_bind, refuse_shared_origins
    from .state import AppState, set_app_state
    from .store import check_backend, open_backend

    setup_logging()
    if isinstance(test_config, Config):
        config = test_config
    elif test_config is None:
        config = Config.from_env()
    else:
        config = Config.from_mapping(test_config)
    # Tenant content is private to the service's user: files 0600, folders 0700 (SQLite's WAL and
    # SHM files take the database's mode). Descriptors: one per open day file and connection.
    os.umask(0o077)
    raise_open_files_limit()
    check_backend(config)

    app = App(__name__)
    app.json = StrictJSONProvider(app)
    app.config["CONTEXT"] = config
    app.config["MAX_CONTENT_LENGTH"] = config.max_body_bytes
    app.json.ensure_ascii = False
    app.json.sort_keys = False

    keys = KeyRing.from_config(config)
    refuse_open_bind(config, keys)
    refuse_shared_origins(config, keys)
    if keys.open:
        log.warning("=" * 72)
        log.warning("NO API KEYS CONFIGURED: every caller is the single 'default' tenant with all scopes.")
        log.warning("Set CONTEXT_API_KEYS_FILE (see `context-mode keys add`) before exposing this service.")
        log.warning("=" * 72)

    backend = open_backend(config)
    store, maintenance = backend.store, backend.maintenance
    if config.background:
        from .maintainer import Presence
        maintenance.presence = Presence(config.data_dir)   # idle while a maintainer process runs
        maintenance.start()

    errors.init_app(app)
    metrics.init_app(app)     # first: times and logs every request, also those the doors refuse
    allowed = doors.init_app(app)
    answer_slots = answers.init_app(app)   # after the doors: its 429 gets their CORS headers, and the access log sees it
    admitted = admission.init_app(app, keys, store)
    app.register_blueprint(units.bp)
    app.register_blueprint(search.bp)
    app.register_blueprint(health.bp)
    register_manage(app)
    hub, registry = register_live(app, backend)
    mcp.init_app(app)
    adapters.init_app(app)
    rate_limit = ratelimit.init_app(app, keys)

    def shutdown():
        hub.stop()
        maintenance.stop()
        registry.close()
        store.close()
    set_app_state(app, AppState(config=config, keys=keys, store=store, maintenance=maintenance, hub=hub,
                                registry=registry, doors=allowed, admission=admitted, answers=answer_slots,
                                rate_limit=rate_limit, shutdown=shutdown))
    atexit.register(shutdown)
    return app


def register_live(app: Flask, backend) -> tuple:
    """Live context and the tool registry: where changes are read (the backend's sources: a change log of
    what any worker or node changes), the hub that tells this worker's listeners, the registry; GET
    /mcp/stream and /mcp/tools. Returns the hub and the registry for shutdown (the hub closes its sources)."""
    from .api import stream, tools
    from .hub import Hub
    sources, registry = backend.live()
    hub = Hub(backend.store, sources)
    app.register_blueprint(stream.bp)
    app.register_blueprint(tools.bp)
    return hub, registry


def register_manage(app: Flask) -> None:
    """Seeing and managing the memory: list, stats, export, forget, and the web console."""
    from . import console
    from .api import manage
    app.register_blueprint(manage.bp)
    console.init_app(app)




class App(Flask):
    """Flask, with one per-request cost made once: before every hook and view, Flask asks whether the function
    is a coroutine (``inspect``, about a microsecond each, seven times a request here). A function's code
    decides it, so a code object found synchronous is not asked about again (closures made per request,
    such as ``after_this_request``'s, share their code: the set stays as small as the code base)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._sync_code: set = set()

    def ensure_sync(self, func):
        code = getattr(func, "__code__", None)
        if code is not None and code in self._sync_code:
            return func
        sync = super().ensure_sync(func)
        if sync is func and code is not None:
            self._sync_code.add(code)
        return sync


class StrictJSONProvider(DefaultJSONProvider):
    """Responses are JSON every reader accepts: never NaN or Infinity."""

    def dumps(self, obj, **kwargs):
        kwargs.setdefault("allow_nan", False)
        return super().dumps(obj, **kwargs)
