"""What a handler sees of one MCP request: who is calling, under which revision, and the store."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .protocol import INVALID_PARAMS, RESOURCE_NOT_FOUND_LEGACY, Era, RpcError


@dataclass(frozen=True)
class Call:
    tenant: str
    scopes: frozenset[str]
    era: Era
    store: Any            # service.store.Store
    config: Any           # service.config.Config
    cursor_key: bytes
    registry: Any = None  # service/store/base.py RegistryApi (context://tools/{name}, tool_search)

    def not_found(self, uri: str, message: str) -> RpcError:
        """Unknown, malformed, expired or other-tenant resource: -32002 (2025-11-25) or -32602 (2026-07-28)."""
        code = INVALID_PARAMS if self.era.modern else RESOURCE_NOT_FOUND_LEGACY
        return RpcError(code, message, {"uri": uri[:200] if isinstance(uri, str) else None})
