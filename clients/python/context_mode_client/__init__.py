"""Python client for the Context Mode Service: CIDs, push, search, context packing.

Uses only the public HTTP API (DESIGN.md section 4)::

    from context_mode_client import ContextModeClient
    cm = ContextModeClient("http://localhost:5000", api_key="...")
    cm.push("订单 ORD-7890 shipped", type="tool_output", source="curl_tool_v2.1_prod", ttl=3600)
    for hit in cm.recall("ORD-7890 status"):
        print(hit["cid"], hit["text"])
"""
from __future__ import annotations

from .client import (
    ContextModeClient,
    ContextModeError,
    RETRY_STATUSES,
    compute_cid,
    make_unit,
)
from .live import Stream

__all__ = ["ContextModeClient", "ContextModeError", "RETRY_STATUSES", "Stream", "compute_cid", "make_unit"]
__version__ = "0.1.0"
