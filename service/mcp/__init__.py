"""MCP adapter (docs/design.md §7): the store as MCP resources, prompts and tools.

transport.py is the Streamable HTTP endpoint, dispatch.py the method table, protocol.py the protocol's
facts (revisions, error codes, the envelope) and context.py what a handler sees of one request;
resources.py, prompts.py, tools.py and manage.py (forget, stats) the handlers; listen.py the
``subscriptions/listen`` stream. (Local-process hosts reach it through service/cli/stdio.py.)
The adapter calls the same store functions as the REST API and contains no SQL.
"""
from __future__ import annotations

from flask import Flask

from . import manage
from .transport import bp


def init_app(app: Flask) -> None:
    manage.register()         # context_forget and context://stats
    app.register_blueprint(bp)
