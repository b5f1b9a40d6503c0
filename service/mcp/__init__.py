"""MCP adapter (docs/design.md §7): the store as MCP resources, prompts and tools.

``transport`` is the Streamable HTTP endpoint, ``dispatch`` the method table, and
``resources`` / ``prompts`` / ``tools`` the handlers; ``stdio`` bridges local-process hosts.
The adapter calls the same store functions as the REST API and contains no SQL.
"""
from __future__ import annotations

from flask import Flask

from . import manage
from .transport import bp


def init_app(app: Flask) -> None:
    manage.register()         # context_forget and context://stats
    app.register_blueprint(bp)
