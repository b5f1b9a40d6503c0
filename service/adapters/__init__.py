"""Front doors for tools users already run (DESIGN.md section 8): Dify, Continue, OpenAPI tools.

Adapters only translate shapes: they call the same store functions as the REST views
(``Store.search``, ``parse_search``) and never touch SQL.
"""
from __future__ import annotations

from flask import Flask


def init_app(app: Flask) -> None:
    from . import continue_, dify, openapi
    app.register_blueprint(dify.bp)
    app.register_blueprint(continue_.bp)
    app.register_blueprint(openapi.bp)
