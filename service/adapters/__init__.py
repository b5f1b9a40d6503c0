"""Front doors for tools users already run (docs/design.md §8): Dify, Continue, OpenAPI tools.

Adapters only translate shapes: they call the same store functions as the REST views
(``Store.search``, ``parse_search``) and never touch SQL.

Modules: dify.py (POST /retrieval) and conditions.py (its metadata conditions); continue_.py (Continue's
context provider); openapi.py (GET /openapi.json), with openapi_parts.py (its shared pieces), openapi_live.py
(live context and the tool registry) and openapi_manage.py (list, stats, export, forget).
"""
from __future__ import annotations

import logging

from flask import Flask

from . import continue_, dify, openapi

log = logging.getLogger(__name__)


def init_app(app: Flask) -> None:
    problem = openapi.public_url_problem(app.config["CONTEXT"].public_url)
    if problem:
        log.warning("%s: Dify refuses to import /openapi.json as a tool from such an address (its SSRF "
                    "guard); set CONTEXT_PUBLIC_URL to a URL Dify can reach (docs/configuration.md)", problem)
    app.register_blueprint(dify.bp)
    app.register_blueprint(continue_.bp)
    app.register_blueprint(openapi.bp)
