"""The threads of a worker that write large answers (docs/design.md §9, "Large answers"): how many at once, and
each tenant's and key's share of them."""
from __future__ import annotations

import threading

from flask import Flask, g

from ..errors import ApiError, respond
from ..state import app_state
from .fair import FairShares, shares


class AnswerSlots(FairShares):
    """The threads of a worker that write large answers (over ``threshold`` bytes: exports, big searches,
    lineage, listing pages). A client may read an answer as slowly as the guard allows (service/guard/responses.py:
    one over 8 MiB is written by its thread, paced), so 16 slow readers of exports once held every thread of
    both workers. A worker writes at most ``total`` such answers at once, one tenant ``per_tenant`` and one key
    ``per_key`` of them; past a share the answer is refused at once (waiting would hold a thread too)."""

    def __init__(self, total: int, per_tenant: int, per_key: int, threshold: int):
        super().__init__(total, per_tenant, per_key)
        self.threshold = threshold
        self._lock = threading.Lock()

    @classmethod
    def of(cls, config) -> "AnswerSlots":
        total = config.large_answers if config.large_answers >= 0 else max(1, config.threads // 2)
        return cls(total, *shares(total, config.large_answer_share, config.large_answer_key_share),
                   config.large_answer_bytes)

    def take(self, tenant: str, key: str | None):
        """A release callable for one slot, or raise ApiError: 429 past the key's or tenant's share, 503 past
        the worker's."""
        with self._lock:
            scope = self.full(tenant, key)
            if scope is None:
                self.add(tenant, key)
        if scope is not None:
            whose = {"key": "This API key", "tenant": "This tenant", "server": "This server"}[scope]
            raise ApiError(f"{whose} is already sending its share of large answers (over {self.threshold} bytes) at "
                           "once; retry shortly, or ask for less (filters, a smaller top_k or limit).",
                           code="too_many_large_answers", status=503 if scope == "server" else 429,
                           headers={"Retry-After": "1"})
        released = False

        def release() -> None:
            nonlocal released
            with self._lock:
                if released:
                    return
                released = True
                self.remove(tenant, key)
        return release


def take_answer_slot():
    """A slot for the large answer the current request is about to send (its principal's tenant and key)."""
    principal = g.get("principal")
    slots = app_state().answers
    return slots.take(principal.tenant if principal else "-", getattr(principal, "key_id", None))


def init_app(app: Flask) -> AnswerSlots:
    """Every answer over the threshold takes a slot while its thread writes it (a streamed one, the export,
    takes its own: service/api/manage.py)."""
    slots = AnswerSlots.of(app.config["CONTEXT"])

    @app.after_request
    def _large_answer(response):
        if (response.is_streamed or (response.content_length or 0) <= slots.threshold or response.status_code >= 400
                or g.get("principal") is None):     # the public documents (OpenAPI, console files) are small
            return response
        try:
            release = take_answer_slot()
        except ApiError as e:
            return respond(e.status, e.code, e.message, headers=e.headers)
        response.response = released_when_sent(response.response, release)   # Content-Length stays set
        return response
    return slots


def released_when_sent(body, release):
    """``body``'s pieces, then ``release()``: once the server has taken the last piece (or dropped the client,
    which closes this generator). Also where no server closes the response (a test client)."""
    try:
        yield from body
    finally:
        release()
