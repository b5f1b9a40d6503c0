"""A process's views of the tenants' read indexes: each reloads when the leader commits."""
from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path

import tantivy

from ..ranking.bm25 import idf_of
from ..signals import INDEX, Signals
from .schema import index_dir, same_format, signature

log = logging.getLogger(__name__)

IDF_CACHE = 20_000      # terms remembered per commit (a view lives until the next commit)


@dataclass(frozen=True)
class View:
    """One committed state of a tenant's read index."""
    searcher: tantivy.Searcher
    schema: tantivy.Schema
    ndocs: int
    sig: object = None        # meta.json's signature when loaded (see ``moved``)
    cache: dict = field(default_factory=dict, compare=False)   # avgdl, once known; idf by term

    def idf(self, term: str) -> float:
        """A term's idf in this commit, asked of tantivy once per commit and term (each call releases and
        retakes the GIL among the worker's threads; questions repeat their common words)."""
        known = self.cache.setdefault("idf", {})
        idf = known.get(term)
        if idf is None:
            idf = idf_of(self.ndocs, self.searcher.doc_freq("t", term))
            if len(known) < IDF_CACHE:
                known[term] = idf
        return idf


@dataclass(frozen=True)
class Hit:
    score: float
    address: object


class Reader:
    """A process's handle on one tenant's read index, reloaded when the leader commits."""

    def __init__(self, path: Path):
        self.path = path
        self.meta = str(path / "meta.json")          # (stat by every search: its string made once)
        self.index: tantivy.Index | None = None
        self.gen: str | None = None
        self.sig = None
        self.view: View | None = None
        self.seen = None                             # meta.json's signature when last looked at
        self._lock = threading.Lock()

    def current(self) -> View | None:
        sig = self.seen = signature(self.meta)
        if sig is None:
            return None
        if sig != self.sig:
            with self._lock:
                if sig != self.sig:
                    self._load(sig)
        return self.view

    def _load(self, sig) -> None:
        try:
            info = json.loads((self.path / "format.json").read_text())
            if not same_format(info) or not info.get("ready"):
                # another version's index, or one still being built: the primaries answer meanwhile
                self.view, self.sig = None, sig
                return
            if self.index is None or info.get("gen") != self.gen:
                index = tantivy.Index.open(str(self.path))
                index.config_reader("Manual")
                self.index, self.gen = index, info.get("gen")
            else:
                self.index.reload()
            searcher = self.index.searcher()
            # every document has one day: the days' document frequencies add up to tantivy's N
            # (which, like them, counts documents deleted but not yet merged away)
            ndocs = sum(n for _, n in searcher.terms_with_prefix("day", ""))
            self.view = View(searcher, self.index.schema, ndocs, sig)
            self.sig = sig
        except (OSError, ValueError, RuntimeError) as e:
            # A commit or a rebuild under way (files replaced between our reads): keep the previous
            # view and try again on the next search.
            log.debug("read index %s not reloaded yet: %s", self.path, e)


class Readers:
    """Every tenant's reader in this process.

    What a search asks of them (the leader's state, the latest view, whether the leader committed since) is
    answered from memory while the tenant's ``INDEX`` change number is the one read when it was last looked up
    (service/signals.py): the leader's every commit, build start, ready mark and state sets a new one. Only
    then are the files looked at (their signatures, as before the numbers: a file that did not really
    change keeps its view)."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.signals = Signals.of(self.root)
        self._readers: dict[str, Reader] = {}
        self._states: dict[str, tuple] = {}     # tenant -> (state.json signature, parsed, change number)
        self._views: dict[str, tuple] = {}      # tenant -> (change number, view)
        self._files: dict[str, tuple[str, str]] = {}
        self._lock = threading.Lock()

    def _paths(self, tenant: str) -> tuple[str, str]:
        """The tenant's meta.json and state.json, as strings made once (every search stats them)."""
        paths = self._files.get(tenant)
        if paths is None:
            folder = index_dir(self.root, tenant)
            paths = self._files[tenant] = (str(folder / "meta.json"), str(folder / "state.json"))
        return paths

    def view(self, tenant: str) -> View | None:
        """The tenant's latest committed view, or None (no index, or one not ready)."""
        number = self.signals.read(INDEX, tenant)       # (before the files: a change while they are read shows)
        known = self._views.get(tenant)
        if known is not None and known[0] == number:
            return known[1]
        reader = self._readers.get(tenant)
        if reader is None:
            with self._lock:
                reader = self._readers.setdefault(tenant, Reader(index_dir(self.root, tenant)))
        view = reader.current()
        if reader.seen is None or reader.seen == reader.sig:
            self._views[tenant] = (number, view)
        else:                       # the files' commit could not be loaded: look again next time
            self._views.pop(tenant, None)
        return view

    def moved(self, tenant: str, view: View) -> bool:
        """Whether the leader has committed since ``view`` was loaded."""
        known = self._views.get(tenant)
        if known is not None and known[1] is view and known[0] == self.signals.read(INDEX, tenant):
            return False
        return signature(self._paths(tenant)[0]) != view.sig

    def state(self, tenant: str) -> dict | None:
        """The leader's last pass: when, and what the index still lacked then."""
        number = self.signals.read(INDEX, tenant)
        cached = self._states.get(tenant)
        if cached is not None and cached[2] == number:
            return cached[1]
        path = self._paths(tenant)[1]
        sig = signature(path)
        if cached is not None and cached[0] == sig:
            self._states[tenant] = (sig, cached[1], number)
            return cached[1]
        try:
            with open(path, encoding="utf-8") as fh:
                state = json.loads(fh.read())
        except (OSError, ValueError):
            state = None
        self._states[tenant] = (sig, state, number)
        return state
