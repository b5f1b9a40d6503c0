"""The environment variables of the client side of ``context-mode`` (push, search, import and the
mcp-stdio bridge): one name each, ``CONTEXT_URL`` and ``CONTEXT_API_KEY``. The bridge's older names
still work, with a warning on stderr (one client key variable)."""
from __future__ import annotations

import logging
import os

log = logging.getLogger("context-mode")

URL_VAR = "CONTEXT_URL"
KEY_VAR = "CONTEXT_API_KEY"
DEPRECATED = {URL_VAR: "CONTEXT_MODE_MCP_URL", KEY_VAR: "CONTEXT_MODE_API_KEY"}


def from_env(name: str, environ=None) -> str | None:
    """``name``'s value, else its deprecated spelling's (with a warning on stderr), else None."""
    environ = os.environ if environ is None else environ
    if environ.get(name):
        return environ[name]
    old = DEPRECATED.get(name)
    if old and environ.get(old):
        log.warning("%s is deprecated; set %s instead (the CLI's name)", old, name)
        return environ[old]
    return None
