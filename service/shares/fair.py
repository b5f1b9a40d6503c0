"""Fair shares of a worker's slots (docs/design.md §9, "Fair shares"): what one tenant and one API key may hold
at once of a total, and the counts held against those caps."""
from __future__ import annotations

from flask import g, has_request_context


def share(configured: int, total: int) -> int:
    """One tenant's (or key's) share of ``total`` slots: ``configured``, or with -1 half of them, at least 1."""
    if configured >= 0:
        return max(1, min(configured, total)) if total > 0 else configured
    return max(1, total // 2)


def shares(total: int, tenant_share: int, key_share: int) -> tuple[int, int]:
    """(one tenant's, one key's share of ``total`` slots): each as ``share`` gives it, a key's -1 meaning its
    tenant's, and a key never above its tenant."""
    tenant = share(tenant_share, total)
    key = share(key_share, total) if key_share >= 0 else tenant
    return tenant, min(key, tenant)


def caller_key() -> str | None:
    """The key id of the request being served, or None outside a request (the live hub's own searches)."""
    if not has_request_context():
        return None
    principal = g.get("principal")
    return getattr(principal, "key_id", None)


class FairShares:
    """What is held at once, in all and per tenant and per API key, against each one's cap."""

    def __init__(self, total: int, per_tenant: int, per_key: int):
        self.total, self.per_tenant, self.per_key = total, per_tenant, per_key
        self.used = 0
        self.tenants: dict[str, int] = {}
        self.keys: dict[str, int] = {}

    def full(self, tenant: str, key: str | None) -> str | None:
        """Whose share one more would pass ("server", "key", "tenant": the worker's own first), or None."""
        if self.used >= self.total:
            return "server"
        if key is not None and self.keys.get(key, 0) >= self.per_key:
            return "key"
        return "tenant" if self.tenants.get(tenant, 0) >= self.per_tenant else None

    def add(self, tenant: str, key: str | None) -> None:
        self.used += 1
        self.tenants[tenant] = self.tenants.get(tenant, 0) + 1
        if key is not None:
            self.keys[key] = self.keys.get(key, 0) + 1

    def remove(self, tenant: str, key: str | None) -> None:
        self.used -= 1
        for counts, name in ((self.tenants, tenant), (self.keys, key)):
            if name is not None:
                counts[name] -= 1
                if not counts[name]:
                    del counts[name]
