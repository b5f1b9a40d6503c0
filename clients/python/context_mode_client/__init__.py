"""Python client for the Context Mode Service: CIDs, push, search, context packing.

Uses only the public HTTP API (docs/design.md §4)::

    from context_mode_client import ContextModeClient
    cm = ContextModeClient("http://localhost:5000", api_key="...")
    cm.push("订单 ORD-7890 shipped", type="tool_output", source="curl_tool_v2.1_prod", ttl=3600)
    for hit in cm.recall("ORD-7890 status"):
        print(hit["cid"], hit["text"])

The names below are loaded on first use (PEP 562): the agent hooks (``context_mode_client.hooks``) import this
package on every call and need neither ``requests`` nor the client built on it.
"""
from __future__ import annotations

import importlib

__all__ = ["ContextModeClient", "ContextModeError", "RETRY_STATUSES", "Stream", "compute_cid", "make_unit"]
__version__ = "0.2.0"

_WHERE = {"ContextModeClient": "client", "ContextModeError": "errors", "RETRY_STATUSES": "errors",
          "make_unit": "client", "compute_cid": "cid", "Stream": "live"}


def __getattr__(name: str):
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'context_mode_client' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(list(globals()) + __all__)
