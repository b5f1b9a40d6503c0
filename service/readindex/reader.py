"""A process's views of the tenants' read indexes: each reloads when the leader commits."""
from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path

import tantivy

from ..budget import Kept
from ..ranking.bm25 import idf_of
from ..change_numbers import INDEX, ChangeNumbers
from .schema import index_dir, same_format, signature

log = logging.getLogger(__name__)

IDF_CACHE = 20_000      # terms remembered per commit (a view lives until the next commit)


@dataclass
class ViewCache:
    """What searches learn of one commit, kept while its view lives (until the next commit)."""
    avgdl: float | None = None       # tantivy's average length, read from one explanation (searcher.py)
    mean_len: float | None = None    # the mean exact length, while no document matches (searcher.py)
    idf: dict = field(default_factory=dict)        # by term, up to IDF_CACHE
    sources: dict | None = None      # the sources by their hash (threaded.py)
    fields: dict = field(default_factory=dict)     # a document's fast fields by address (threaded.py)
    places: dict = field(default_factory=dict)     # what a thread's place holds (threaded.py)


@dataclass(frozen=True)
class View:
    """One committed state of a tenant's read index."""
    searcher: tantivy.Searcher
    schema: tantivy.Schema
    ndocs: int
    sig: object = None        # meta.json's signature when loaded (see ``moved``)
    cache: ViewCache = field(default_factory=ViewCache, compare=False)

    def idf(self, term: str) -> float:
        """A term's idf in this commit, asked of tantivy once per commit and term (each call releases and
        retakes the GIL among the worker's request handlers; questions repeat their common words)."""
        known = self.cache.idf
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
        self.state_path = str(path / "state.json")
        self.index: tantivy.Index | None = None
        self.gen: str | None = None
        self.sig = None
        self.view: View | None = None
        self.seen = None                             # meta.json's signature when last looked at
        self.known: tuple | None = None              # (INDEX change number, view) when last looked up
        self.state: tuple | None = None              # (state.json signature, parsed, change number)
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

    def close(self) -> None:
        """Let go of the index (its tantivy file watcher ends, its files are unmapped once no search holds a view)."""
        with self._lock:
            self.index = self.view = self.known = None
            self.gen = self.sig = None

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
    """Every tenant's reader in this process: at most ``keep`` of them (a loaded index holds a tantivy file
    watcher and keeps its files mapped), the least recently used, and any unused for ``idle_s``,
    let go (service/budget.py, issue 49); a tenant's next search loads its index again (a fraction of a
    millisecond for a small one).

    What a search asks of them (the leader's state, the latest view, whether the leader committed since) is
    answered from memory while the tenant's ``INDEX`` change number is the one read when it was last looked up
    (service/change_numbers.py): the leader's every commit, build start, ready mark and state sets a new one. Only
    then are the files looked at (their signatures, as before the numbers: a file that did not really
    change keeps its view)."""

    def __init__(self, root: Path, keep: int = 48, idle_s: float = 30.0):
        self.root = Path(root)
        self.change_numbers = ChangeNumbers.of(self.root)
        self._kept = Kept(keep, idle_s, lambda _tenant, reader: reader.close())

    def _reader(self, tenant: str) -> Reader:
        reader = self._kept.get(tenant)
        if reader is None:
            reader = self._kept.add(tenant, Reader(index_dir(self.root, tenant)))
        return reader

    def view(self, tenant: str) -> View | None:
        """The tenant's latest committed view, or None (no index, or one not ready)."""
        number = self.change_numbers.read(INDEX, tenant)       # (before the files: a change while they are read shows)
        reader = self._reader(tenant)
        known = reader.known
        if known is not None and known[0] == number:
            return known[1]
        view = reader.current()
        # (the files' commit could not be loaded: look again next time)
        reader.known = (number, view) if reader.seen is None or reader.seen == reader.sig else None
        return view

    def moved(self, tenant: str, view: View) -> bool:
        """Whether the leader has committed since ``view`` was loaded."""
        reader = self._kept.peek(tenant)
        known = reader.known if reader is not None else None
        if known is not None and known[1] is view and known[0] == self.change_numbers.read(INDEX, tenant):
            return False
        meta = reader.meta if reader is not None else str(index_dir(self.root, tenant) / "meta.json")
        return signature(meta) != view.sig

    def state(self, tenant: str) -> dict | None:
        """The leader's last pass: when, and what the index still lacked then."""
        number = self.change_numbers.read(INDEX, tenant)
        reader = self._reader(tenant)
        cached = reader.state
        if cached is not None and cached[2] == number:
            return cached[1]
        sig = signature(reader.state_path)
        if cached is not None and cached[0] == sig:
            reader.state = (sig, cached[1], number)
            return cached[1]
        try:
            with open(reader.state_path, encoding="utf-8") as fh:
                state = json.loads(fh.read())
        except (OSError, ValueError):
            state = None
        reader.state = (sig, state, number)
        return state

    def loaded(self) -> int:
        """Read indexes this process holds loaded now."""
        return sum(1 for reader in self._kept.values() if reader.index is not None)

    def sweep(self) -> None:
        """Let go of the readers unused for ``idle_s``."""
        self._kept.sweep()

    def close(self) -> None:
        self._kept.close_all()
