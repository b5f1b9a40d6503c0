"""Context Mode Service: a durable, searchable memory of LLM context (see DESIGN.md)."""
from __future__ import annotations

import atexit
import logging
import os

from flask import Flask
from flask.json.provider import DefaultJSONProvider

from .boot import check_store, open_store, raise_open_files_limit, setup_logging
from .config import Config

log = logging.getLogger("service")


def create_app(test_config: dict | Config | None = None) -> Flask:
    """Application factory: configuration, store, background maintenance, blueprints.

    Configuration: the ``CONTEXT_*`` environment when called without one (gunicorn's
    ``service:create_app()``); otherwise exactly the Config or mapping given (tests)."""
    # Imported here, not at the top: every ``service.*`` import runs this file first (gunicorn's
    # master reads service.config, the CLI's client commands service.client_env), and only an app
    # needs the store, Flask blueprints and jieba. No cycle depends on it (tests/test_code_shape.py).
    from . import adapters, doors, errors, limits, mcp, metrics
    from .api import health, search, units
    from .auth import KeyRing
    from .doors import is_loopback_bind

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
    check_store(config)

    app = Flask(__name__)
    app.json = StrictJSONProvider(app)
    app.config["CONTEXT"] = config
    app.config["MAX_CONTENT_LENGTH"] = config.max_body_bytes
    app.json.ensure_ascii = False
    app.json.sort_keys = False

    keys = KeyRing.from_config(config)
    if keys.open and not config.allow_open and not is_loopback_bind(config.bind):
        raise RuntimeError(
            f"Refusing to start: no API keys are configured and CONTEXT_BIND={config.bind} is not loopback, "
            "so anyone who can reach it could read and write everything. Configure keys "
            "(CONTEXT_API_KEYS_FILE, see `context-mode keys add`), bind 127.0.0.1, or set "
            "CONTEXT_ALLOW_OPEN=1 if a proxy in front authenticates callers.")
    if keys.open:
        log.warning("=" * 72)
        log.warning("NO API KEYS CONFIGURED: every caller is the single 'default' tenant with all scopes.")
        log.warning("Set CONTEXT_API_KEYS_FILE (see `context-mode keys add`) before exposing this service.")
        log.warning("=" * 72)
    app.extensions["context_keys"] = keys

    store, maintenance = open_store(config)
    app.extensions["context_store"] = store
    app.extensions["context_maintenance"] = maintenance
    if config.background:
        from .maintainer import Presence
        maintenance.presence = Presence(config.data_dir)   # idle while a maintainer process runs
        maintenance.start()

    errors.init_app(app)
    metrics.init_app(app)     # first: times and logs every request, also those the doors refuse
    doors.init_app(app)
    app.register_blueprint(units.bp)
    app.register_blueprint(search.bp)
    app.register_blueprint(health.bp)
    register_manage(app)
    hub, registry = register_live(app, store)
    mcp.init_app(app)
    adapters.init_app(app)
    limits.init_app(app)

    def shutdown():
        hub.stop()
        maintenance.stop()
        registry.close()
        store.close()
    app.extensions["context_shutdown"] = shutdown
    atexit.register(shutdown)
    return app


def register_live(app: Flask, store) -> tuple:
    """Live context and the tool registry (issue 16): where changes are read (a change log of what any
    worker or node changes), the hub that tells this worker's listeners, the registry; GET /mcp/stream and
    /mcp/tools. Returns the hub and the registry for shutdown (the hub closes its sources)."""
    from .api import stream, tools
    from .hub import Hub
    from .pg import is_postgresql
    if is_postgresql(store.config.store):
        from .pg.live import PgSources
        from .pg.registry import PgRegistry
        sources = PgSources(store)
        registry = PgRegistry(store, sources)
    else:
        from .hub import FileSources
        from .registry import Registry
        sources = FileSources(store)
        registry = Registry(store, sources.changes)
    hub = Hub(store, sources)
    app.extensions["context_hub"] = hub
    app.extensions["context_registry"] = registry
    app.register_blueprint(stream.bp)
    app.register_blueprint(tools.bp)
    return hub, registry




def register_manage(app: Flask) -> None:
    """Seeing and managing the memory (issue 15): list, stats, export, forget, and the web console."""
    from . import console
    from .api import manage
    app.register_blueprint(manage.bp)
    console.init_app(app)




class StrictJSONProvider(DefaultJSONProvider):
    """Responses are JSON every reader accepts: never NaN or Infinity (issue 12, finding 5)."""

    def dumps(self, obj, **kwargs):
        kwargs.setdefault("allow_nan", False)
        return super().dumps(obj, **kwargs)
