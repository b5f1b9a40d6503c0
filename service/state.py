"""The app's parts (docs/design.md §2): one ``AppState``, set once by ``create_app`` (service/__init__.py) and read
through ``app_state``; nothing else keeps a part of the app on it.

Its fields name classes from every layer above this one; they are imported for type checkers only, so this module
imports nothing of the service at run time and every layer may read the state (tests/test_code_shape.py).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, overload

from flask import Flask, current_app

if TYPE_CHECKING:
    from .auth import KeyRing
    from .config import Config
    from .doors import Allowed
    from .hub import Hub
    from .ratelimit import RateLimit
    from .shares.admission import Admission
    from .shares.answers import AnswerSlots
    from .store.base import MaintenanceApi, RegistryApi, StoreApi

_KEY = "context"                     # the one key this service keeps in ``app.extensions``


@dataclass(frozen=True)
class AppState:
    config: Config
    keys: KeyRing
    store: StoreApi
    maintenance: MaintenanceApi
    hub: Hub
    registry: RegistryApi
    doors: Allowed                   # the hosts and origins the doors accept (service/doors.py)
    admission: Admission             # who may take a thread now (asked by the slow-client guard)
    answers: AnswerSlots             # the threads that write large answers
    rate_limit: RateLimit | None     # None: no rate limit
    shutdown: Callable[[], None]     # stops the hub and the maintenance, closes the registry and the store


def set_app_state(app: Flask, state: AppState) -> None:
    """Give ``app`` its parts, once."""
    if _KEY in app.extensions:
        raise RuntimeError("the app's state is set once, by create_app")
    app.extensions[_KEY] = state


@overload
def app_state(app: Flask | None = None, *, optional: Literal[False] = False) -> AppState: ...
@overload
def app_state(app: Flask | None = None, *, optional: Literal[True]) -> AppState | None: ...


def app_state(app: Flask | None = None, *, optional: bool = False) -> AppState | None:
    """The parts of ``app`` (the current app by default). An app create_app did not make has none: a LookupError,
    or None when ``optional`` (the slow-client guard and gunicorn's hooks serve any app)."""
    state = (app if app is not None else current_app).extensions.get(_KEY)
    if state is None and not optional:
        raise LookupError("this app was not made by service.create_app")
    return state
