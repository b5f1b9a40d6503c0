"""The storage backends (docs/design.md §5): ``sqlite/`` (the embedded default: files per tenant and day) and
``postgresql/`` (one database every node shares, a streaming standby), both implementing ``base.py``'s
contract. ``CONTEXT_STORE`` names one (``Config.backend``); it is opened here and nowhere else (``open_backend``).

What both share: base.py (the contract), loop.py (the maintenance worker and its contract), push.py (the push
rules), filters.py (a request's filters), exact.py (what both primaries give the ranking alike), statements.py (sql/'s named statements, with the unit's columns)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


def _module(name: str):
    # imported on demand: the PostgreSQL backend never loads the SQLite one, nor the other way round
    if name == "postgresql":
        from . import postgresql
        return postgresql
    from . import sqlite
    return sqlite


def check_backend(config) -> None:
    """Stop the start, with a message, on a storage setting that cannot work (before anything is opened)."""
    _module(config.backend).check(config)


def doctor_lines(config) -> list[tuple[bool, str]]:
    """``context-mode doctor``'s lines about storage: (ok, text) each."""
    try:
        name = config.backend
    except RuntimeError as e:
        return [(False, str(e))]
    return _module(name).doctor(config)


def store_problem(config) -> str | None:
    """Why the backend's server does not answer now, or None (SQLite: its files need no server)."""
    if config.backend != "postgresql":
        return None
    from .postgresql import reachable_problem
    return reachable_problem(config.store)


def register_cli(main) -> None:
    """The stores' own commands: ``backup`` and ``restore`` copy SQLite's files (they refuse on PostgreSQL)."""
    from .sqlite import backup
    backup.register_cli(main)


@dataclass
class Backend:
    """The chosen backend, opened: its store, the background maintenance of this process, and ``live``,
    which makes the live hub's sources and the tool registry (only an app needs them)."""
    name: str
    store: object
    maintenance: object
    live: Callable[[], tuple]


def open_backend(config) -> Backend:
    """Open the backend ``CONTEXT_STORE`` names."""
    name = config.backend
    module = _module(name)
    store, maintenance = module.open_store(config)
    return Backend(name, store, maintenance, lambda: module.open_live(store))
