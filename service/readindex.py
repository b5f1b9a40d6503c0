"""The read index (DESIGN.md sections 5 and 6; issue 11): one tantivy index per tenant over every
live day, which default searches read.

FTS5 in the primary day shards stays the index of record (push -> pending row -> indexer). The
tenant's maintenance leader sends indexed rows to ``tenants/<t>/replica/index/`` with exactly the
tokens FTS5 holds (a whitespace analyzer over ``units.tokens``) and commits; every worker's reader
reloads when the commit's ``meta.json`` changes. One index over all days makes BM25's statistics
global by construction, and tantivy evaluates OR queries with block-max WAND in compiled code, so
a query's cost grows with neither the number of day shards nor the matches of its common terms.

Sync protocol, per shard row (``units.indexed``): 1 = in FTS5, not sent; 2 = sent; 3 = sent, but a
duplicate push changed its mutable fields (type, ttl, metadata, parent) since. The index stores
each unit's public fields, so a hit is answered without opening the day files. A pass reads rows 1/3 and the
``read_deletes`` tombstones in one snapshot; deletes by key what must go (tombstones; rows 3; and
every row after a leader change or a failed pass, so a crash between the commit and the flag flip
cannot leave a document twice); adds the rows; commits; then flips the flags. The index is derived
data: when it is missing, damaged or of another format it is rebuilt from the shards.

tantivy ranks with BM25 (k1 1.2, b 0.75, Lucene's idf: the service's formula) but keeps document
lengths in one byte; ``rescore`` scores its best candidates again with the exact lengths. The
statistics count documents deleted but not yet merged away.
"""
from __future__ import annotations

import collections
import datetime
import json
import logging
import math
import os
import shutil
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import tantivy
from tantivy import FieldType, Occur, Query

from .shards import sql

log = logging.getLogger(__name__)

FORMAT = 6
TOKENIZER = "cm_ws"            # whitespace only: the tokens are already ours (service/tokenize.py)
NO_TOKENS = "cm_none"
K1, B = 1.2, 0.75              # tantivy's BM25 parameters (fixed in the engine)
SYNC_BATCH = 5000              # rows (and tombstones) read per shard per round
COMMIT_EVERY = 50_000          # at most this many changes before a commit (bulk builds)
DAY_SHIFT = 2 ** 40            # key = day ordinal * DAY_SHIFT + rowid


def index_dir(t) -> Path:
    return t.dir / "replica" / "index"


def day_key(day: str, rowid: int) -> int:
    return datetime.date.fromisoformat(day).toordinal() * DAY_SHIFT + rowid


def build_schema() -> tantivy.Schema:
    sb = tantivy.SchemaBuilder()
    sb.add_text_field("t", tokenizer_name=TOKENIZER, index_option="freq")
    sb.add_integer_field("key", indexed=True, fast=True)
    sb.add_integer_field("exp", fast=True)
    sb.add_integer_field("ts", fast=True)
    sb.add_integer_field("len", fast=True)     # the exact length in tokens (tantivy keeps one byte of it)
    for name in ("day", "type", "src", "parent"):
        sb.add_text_field(name, tokenizer_name="raw", index_option="basic")
    # the unit's public fields: a hit is answered from here, not from ten day files
    sb.add_text_field("content", stored=True, tokenizer_name=NO_TOKENS, index_option="basic")
    sb.add_text_field("unit", stored=True, tokenizer_name=NO_TOKENS, index_option="basic")
    return sb.build()


def _register(index: tantivy.Index) -> None:
    index.register_tokenizer(TOKENIZER, tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.whitespace()).build())
    # stored, never searched: one raw token, dropped by the length filter
    index.register_tokenizer(NO_TOKENS, tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.raw())
                             .filter(tantivy.Filter.remove_long(1)).build())


def _signature(path: Path):
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def idf_of(n: int, df: int) -> float:
    """Lucene's idf: always positive, so small tenants (a term in most of few units) still rank sanely."""
    return math.log(1 + (n - df + 0.5) / (df + 0.5)) if df else 0.0


def unknown_idf(n: int) -> float:
    """The idf of a term the index does not hold yet, as it will have once the one unit holding it is in."""
    return idf_of(n + 1, 1)


def bm25_supported(config) -> bool:
    return (config.bm25_k1, config.bm25_b) == (K1, B)


# --- readers (every worker) ----------------------------------------------------------------------
@dataclass(frozen=True)
class View:
    """One committed state of a tenant's read index."""
    searcher: tantivy.Searcher
    schema: tantivy.Schema
    ndocs: int
    sig: object = None        # meta.json's signature when loaded (see ``moved``)
    cache: dict = field(default_factory=dict, compare=False)   # avgdl, once known

    def idf(self, term: str) -> float:
        return idf_of(self.ndocs, self.searcher.doc_freq("t", term))


@dataclass(frozen=True)
class Hit:
    score: float
    address: object


class Reader:
    """A process's handle on one tenant's read index, reloaded when the leader commits."""

    def __init__(self, path: Path):
        self.path = path
        self.index: tantivy.Index | None = None
        self.gen: str | None = None
        self.sig = None
        self.view: View | None = None
        self._lock = threading.Lock()

    def current(self) -> View | None:
        sig = _signature(self.path / "meta.json")
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
            if info.get("format") != FORMAT or not info.get("ready"):
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


def search(view: View, p, terms: list[str], now: int, want: int | None = None) -> list[Hit]:
    """The best ``want`` (default top k) live documents for the query terms and the request's
    filters, by tantivy's score (lengths in one byte)."""
    schema = view.schema
    occur = Occur.Must if p.operator == "and" else Occur.Should
    query = Query.boolean_query([(occur, Query.term_query(schema, "t", term)) for term in terms])
    filters = []
    if p.types:
        filters.append(Query.term_set_query(schema, "type", list(p.types)))
    if p.source and p.source != "*":
        if p.source.endswith("*"):
            # the source names with this prefix, from the term dictionary: no pattern syntax involved
            names = [name for name, _ in view.searcher.terms_with_prefix("src", p.source[:-1])]
            if not names:
                return []
            filters.append(Query.term_set_query(schema, "src", names))
        else:
            filters.append(Query.term_query(schema, "src", p.source))
    if p.since is not None or p.until is not None:
        filters.append(Query.range_query(schema, "ts", FieldType.Integer, p.since, p.until))
    if p.parent_cid:
        filters.append(Query.term_query(schema, "parent", p.parent_cid))
    if filters:
        query = _filtered(query, filters)
    # Expired documents (not yet purged by the janitor) are dropped after ranking, which keeps the
    # plain disjunction tantivy evaluates fastest; when they crowd the top, a range filter instead.
    want = limit = want or p.top_k
    while True:
        hits = view.searcher.search(query, limit, count=False).hits
        expiry = view.searcher.fast_field_values("exp", [a for _, a in hits])
        live = [Hit(score, address) for (score, address), exp in zip(hits, expiry) if exp is not None and exp > now]
        if len(live) >= want or len(hits) < limit:
            return live[:want]
        if limit >= 1024:
            query, limit = _filtered(query, [Query.range_query(schema, "exp", FieldType.Integer, now + 1, None)]), want
            continue
        limit *= 4


def units(view: View, hits: list[Hit]) -> list[dict]:
    """The stored public fields of each hit, as they were when the leader last sent the row."""
    return [_unit(view.searcher.doc(h.address)) for h in hits]


def _filtered(query, filters):
    """``query``'s scores, restricted to documents that pass every filter (which adds nothing to scores)."""
    both = filters[0] if len(filters) == 1 else Query.boolean_query([(Occur.Must, f) for f in filters])
    return Query.boolean_query([(Occur.Must, query), (Occur.Must, Query.const_score_query(both, 0.0))])


@dataclass
class Scored:
    """A candidate scored again with its exact length; tfs per query term."""
    hit: Hit
    score: float
    length: int
    tfs: list[int]


def rescore(view: View, hits: list[Hit], terms: list[str], weights: list[float], k: int) -> tuple[list[Scored], bool]:
    """The best k of the candidates by BM25 with exact lengths, and whether they are the best k of
    the whole index (``hits`` being tantivy's best, lengths in one byte).

    tantivy keeps a length exactly up to 40 tokens, then within 1/8, which reorders near ties. A
    longer exact length only lowers a score, by at most the factor (1 + n) / (1 + n_exact) (n the
    length norm): so a candidate whose tantivy score is below the k-th best lower bound cannot win,
    and no document past the candidates can either once that bound reaches the last candidate's
    score. The rest are scored exactly: a term's frequency follows from its share of the score
    (tf = n * f / (1 - f), f = share / weight), found by one small search per term but the last,
    restricted to those candidates; the last term's share is what remains of the score."""
    if not hits:
        return [], True
    searcher, schema = view.searcher, view.schema
    lengths = searcher.fast_field_values("len", [h.address for h in hits])
    avgdl = average_length(view, terms, hits[0])
    used = [K1 * (1 - B + B * encoded_length(n) / avgdl) for n in lengths]
    exact = [K1 * (1 - B + B * n / avgdl) for n in lengths]
    low = sorted((min(h.score, h.score * (1 + u) / (1 + e)) for h, u, e in zip(hits, used, exact)), reverse=True)
    bound = low[k - 1] * (1 - 1e-9) if len(low) >= k else 0.0     # (1e-9: float rounding is not a win)
    keep = [i for i, h in enumerate(hits) if h.score >= bound]
    count = collections.Counter(terms)
    weight_of = dict(zip(terms, weights))
    unique = [term for term in count if weight_of[term]]
    share: dict[str, dict[int, float]] = {term: {} for term in unique}   # a term's score per candidate
    if len(unique) > 1:
        addresses = [hits[i].address for i in keep]
        at = {(a.segment_ord, a.doc): i for i, a in zip(keep, addresses)}
        keys = searcher.fast_field_values("key", addresses)
        only = Query.const_score_query(Query.boolean_query(
            [(Occur.Should, Query.term_query(schema, "key", key)) for key in keys]), 0.0)
        for term in unique[:-1]:
            query = Query.boolean_query([(Occur.Must, Query.term_query(schema, "t", term)), (Occur.Must, only)])
            for s, a in searcher.search(query, len(keep), count=False).hits:
                share[term][at[(a.segment_ord, a.doc)]] = s * count[term]
    out = []
    for i in keep:
        h = hits[i]
        rest = h.score - sum(share[term].get(i, 0.0) for term in unique[:-1])
        tf_of = {}
        for term in unique:
            part = share[term].get(i, 0.0) if term != unique[-1] else rest
            f = part / (count[term] * weight_of[term])
            tf_of[term] = round(used[i] * f / (1 - f)) if 1e-6 < f < 1 else 0
        tfs = [tf_of.get(term, 0) for term in terms]
        out.append(Scored(h, sum(w * tf / (tf + exact[i]) for w, tf in zip(weights, tfs)), lengths[i], tfs))
    out.sort(key=lambda x: -x.score)
    # No document past the candidates scores more than the last one did in tantivy; once the k-th
    # exact score reaches that, none can win.
    complete = len(out) < k or out[k - 1].score * (1 + 1e-9) >= hits[-1].score
    # candidates tied with the k-th stay: the caller breaks ties by CID, as the primaries' path does
    end = k
    while end < len(out) and out[end].score == out[k - 1].score:
        end += 1
    return out[:end], complete


def moved(t, view: View) -> bool:
    """Whether the leader has committed since ``view`` was loaded."""
    return _signature(index_dir(t) / "meta.json") != view.sig


def mean_length(view: View, terms: list[str]) -> float:
    """The average document length for scoring units the index does not hold yet: tantivy's own
    (``average_length``, from any document matching a query term), else, when none matches, the
    mean of the exact lengths."""
    if "avgdl" not in view.cache:
        query = Query.boolean_query([(Occur.Should, Query.term_query(view.schema, "t", term)) for term in terms])
        hits = view.searcher.search(query, 1, count=False).hits
        if hits:
            return average_length(view, terms, Hit(*hits[0]))
        if "mean_len" not in view.cache:
            agg = view.searcher.aggregate(Query.all_query(), {"len": {"avg": {"field": "len"}}})
            view.cache["mean_len"] = (agg.get("len") or {}).get("value") or 1.0
        return view.cache["mean_len"]
    return view.cache["avgdl"]


def average_length(view: View, terms: list[str], hit: Hit) -> float:
    """The average document length of this commit as tantivy computes it, read from its explanation
    of one hit (once per commit)."""
    if "avgdl" not in view.cache:
        query = Query.boolean_query([(Occur.Should, Query.term_query(view.schema, "t", term)) for term in terms])
        tree = json.loads(query.explain(view.searcher, hit.address).to_json(), strict=False)
        stack, avgdl = [tree], None
        while stack and avgdl is None:
            node = stack.pop()
            if node.get("description", "").startswith("avgdl"):
                avgdl = node["value"]
            stack.extend(node.get("details") or [])
        view.cache["avgdl"] = avgdl or 1.0
    return view.cache["avgdl"]


# Lucene's SmallFloat.intToByte4, which tantivy uses to store a document's length in one byte.
def _long_to_int4(i: int) -> int:
    bits = i.bit_length()
    if bits < 4:
        return i
    shift = bits - 4
    return ((i >> shift) & 7) | ((shift + 1) << 3)


def _int4_to_long(i: int) -> int:
    bits, shift = i & 7, (i >> 3) - 1
    return bits if shift == -1 else (bits | 8) << shift


_FREE = 255 - _long_to_int4(2 ** 31 - 1)
FIELDNORMS = [i if i < _FREE else _FREE + _int4_to_long(i - _FREE) for i in range(256)]


def _encoded(n: int) -> int:
    lo, hi = 0, 255
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if FIELDNORMS[mid] <= n:
            lo = mid
        else:
            hi = mid - 1
    return FIELDNORMS[lo]


_ENCODED = [_encoded(n) for n in range(4096)]


def encoded_length(n: int) -> int:
    """The document length tantivy scores with: the largest table value not above n."""
    return _ENCODED[n] if n < 4096 else _encoded(n)


class Readers:
    """Every tenant's reader in this process."""

    def __init__(self):
        self._readers: dict[str, Reader] = {}
        self._states: dict[str, tuple] = {}     # tenant -> (state.json signature, parsed)
        self._lock = threading.Lock()

    def view(self, t) -> View | None:
        reader = self._readers.get(t.name)
        if reader is None:
            with self._lock:
                reader = self._readers.setdefault(t.name, Reader(index_dir(t)))
        return reader.current()

    def state(self, t) -> dict | None:
        """The leader's last pass: when, and what the index still lacked then."""
        path = index_dir(t) / "state.json"
        sig = _signature(path)
        cached = self._states.get(t.name)
        if cached is not None and cached[0] == sig:
            return cached[1]
        try:
            state = json.loads(path.read_text())
        except (OSError, ValueError):
            state = None
        self._states[t.name] = (sig, state)
        return state


# --- the writer (the tenant's maintenance leader) ------------------------------------------------
def _snapshot(conn, limit: int):
    """Unsent rows and tombstones of one shard, read in one snapshot."""
    conn.execute("BEGIN")
    try:
        rows = conn.execute(sql("sync_rows"), {"limit": limit}).fetchall()
        deletes = conn.execute(sql("sync_deletes"), {"limit": limit}).fetchall()
    finally:
        conn.execute("COMMIT")
    return rows, deletes


def _page(conn, after: int, limit: int):
    """A rebuild's next page of indexed rows (any sync state) of one shard."""
    return conn.execute(sql("sync_page"), {"after": after, "limit": limit}).fetchall()


def _mark_sent(conn, rows, last_delete: int | None) -> None:
    # Rows read as 1 that a push changed meanwhile are 3 now (unit_upsert) and stay so; rows read as
    # 3 (rare) are compared field by field, since a second change leaves them 3.
    conn.execute(sql("sync_mark_new"), {"ids": json.dumps([r["id"] for r in rows if r["indexed"] == 1])})
    conn.executemany(sql("sync_mark"), ({"id": r["id"], "type": r["type"], "ttl": r["ttl"],
                                         "expires_at": r["expires_at"], "metadata": r["metadata"],
                                         "parent_cid": r["parent_cid"]} for r in rows if r["indexed"] == 3))
    if last_delete is not None:
        conn.execute(sql("sync_deletes_done"), {"n": last_delete})


class Writer:
    """The leader's side of one tenant's read index: sync passes, day drops, rebuilds."""

    def __init__(self, t, config, readers: Readers):
        self.t = t
        self.config = config
        self.readers = readers
        self.path = index_dir(t)
        self.index: tantivy.Index | None = None
        self.writer = None
        self.replacing = True       # delete before add: a previous leader may have sent rows unflagged
        self.dropped: set[str] = set()
        self.gone_done: set[str] = set()
        self.last_commit = 0.0
        self.building = False       # a rebuild whose first full pass has not finished
        self._streamed: dict[str, int] = {}   # while building: the last rowid sent per day
        self.gen: str | None = None

    # --- opening and rebuilding ---------------------------------------------------------------
    def _open(self) -> None:
        if self.writer is not None:
            return
        try:
            info = json.loads((self.path / "format.json").read_text())
            # a build that never finished (the leader died) starts again from nothing
            usable = info.get("format") == FORMAT and info.get("ready") and (self.path / "meta.json").exists()
        except (OSError, ValueError):
            usable = False
        if usable:
            try:
                self.index = tantivy.Index(build_schema(), path=str(self.path), reuse=True)
            except (OSError, ValueError, RuntimeError) as e:
                log.warning("read index of tenant %s is unreadable (%s); rebuilding it", self.t.name, e)
                usable = False
        if not usable:
            self._rebuild()
        _register(self.index)
        self.writer = self.index.writer(self.config.read_index_heap_mb * 1_000_000, 1)

    def _rebuild(self) -> None:
        """Start an empty index; the next pass streams every indexed row of every shard into it.
        Readers use the primaries until that pass marks the new index ready."""
        log.info("building the read index of tenant %s", self.t.name)
        self.close()
        # Tombstones so far name rows already gone (not streamed); a reused rowid must not lose
        # its new document to one of them.
        for day in self.t.primary_days():
            db = self.t.shard(day, create=False)
            if db is not None:
                db.write(lambda c: c.execute(sql("sync_reset_deletes")))
        if self.path.exists():
            old = self.path.with_name(f"index.old-{os.getpid()}-{uuid.uuid4().hex[:8]}")
            os.replace(self.path, old)
            shutil.rmtree(old, ignore_errors=True)
        self.path.mkdir(parents=True)
        self.gen = uuid.uuid4().hex
        self._write_format(ready=False)
        self.index = tantivy.Index(build_schema(), path=str(self.path), reuse=False)
        self.building = True
        self._streamed = {}
        self.replacing = False      # the index is empty: nothing to replace

    def _write_format(self, ready: bool) -> None:
        tmp = self.path / "format.json.tmp"
        tmp.write_text(json.dumps({"format": FORMAT, "gen": self.gen, "ready": ready, "k1": K1, "b": B}))
        os.replace(tmp, self.path / "format.json")

    def close(self) -> None:
        if self.writer is not None:
            try:
                self.writer.rollback()
            except (RuntimeError, ValueError):
                pass
            self.writer = None
        self.index = None

    def drop_day(self, day: str) -> None:
        """The janitor unlinked a day: its documents go at the next pass."""
        self.dropped.add(day)

    # --- a sync pass --------------------------------------------------------------------------
    def due(self) -> bool:
        return time.monotonic() - self.last_commit >= self.config.replica_debounce_ms / 1000

    def sync(self) -> int:
        """Send every unsent change of every shard; commit; flip flags. Returns changes sent."""
        self._open()
        try:
            return self._sync()
        except BaseException:
            self.replacing = True
            if self.building:
                self.close()        # not ready: the next pass builds it again from the start
                raise
            try:
                self.writer.rollback()
            except (RuntimeError, ValueError):
                self.writer = None
            raise

    def _sync(self) -> int:
        w = self.writer
        sent = 0
        pending: list = []        # (day, rows, last tombstone n) to flag once committed
        days = self.t.primary_days()
        dropped = self._drop_gone_days(w, set(days))
        committed = 0             # changes sent as of the last commit
        full_round = True
        while full_round:
            full_round = False
            for day in days:
                db = self.t.shard(day, create=False)
                if db is None:
                    continue
                if self.building:
                    # every indexed row, in pages: rows sent before (2) need no flag change
                    after = self._streamed.get(day, 0)
                    rows, deletes = db.read(_page, after, SYNC_BATCH), []
                    if rows:
                        self._streamed[day] = rows[-1]["id"]
                else:
                    rows, deletes = db.read(_snapshot, SYNC_BATCH)
                if not rows and not deletes:
                    continue
                base = day_key(day, 0)
                full_round = full_round or len(rows) == SYNC_BATCH or len(deletes) == SYNC_BATCH
                for d in deletes:
                    w.delete_documents_by_term("key", base + d["id"])
                for r in rows:
                    key = base + r["id"]
                    if self.replacing or r["indexed"] == 3:
                        w.delete_documents_by_term("key", key)
                    if r["tokens"]:
                        w.add_document(_document(day, key, r))
                # by day, not Db: the store may close a least recently used shard before the commit
                pending.append((day, [r for r in rows if r["indexed"] != 2], deletes[-1]["n"] if deletes else None))
                sent += len(rows) + len(deletes)
                if sent - committed >= COMMIT_EVERY:
                    self._commit(pending)
                    committed, pending = sent, []
        if pending or dropped:
            self._commit(pending)
        if not full_round:
            self.replacing = False
            if self.building:
                self._write_format(ready=True)
                self.building = False
                self._streamed.clear()
                log.info("read index of tenant %s is ready", self.t.name)
        return sent

    def _commit(self, pending) -> None:
        self.writer.commit()
        self.last_commit = time.monotonic()
        for day, rows, last_delete in pending:
            db = self.t.shard(day, create=False)
            if db is not None:
                db.write(_mark_sent, rows, last_delete)

    def _drop_gone_days(self, w, days: set[str]) -> int:
        """Delete the documents of days whose files are gone: the janitor's unlinks, and whatever a
        crash between an unlink and its commit left behind (the days in the term dictionary, which
        keeps a deleted day's name until a merge; ``gone_done`` remembers those already dropped)."""
        view = self.readers.view(self.t)
        indexed = {day for day, _ in view.searcher.terms_with_prefix("day", "")} if view is not None else set()
        gone = (indexed | self.dropped) - days - self.gone_done
        for day in gone:
            w.delete_documents_by_term("day", day)
        self.gone_done = (self.gone_done | gone) - days
        self.dropped.clear()
        return len(gone)

    def write_state(self, seq: int, backlog: int, oldest_ms: int | None, low: int) -> None:
        """What the index lacked at the end of a pass among the units up to ``seq`` (the catalog's
        newest when the pass began), for the freshness reports of every worker; ``low``: every unit
        below this seq is in the index (read-your-writes reads the rest from the primaries)."""
        state = {"ms": int(time.time() * 1000), "seq": seq, "backlog": backlog, "oldest_ms": oldest_ms,
                 "low": low}
        tmp = self.path / f"state.json.tmp-{os.getpid()}"
        tmp.write_text(json.dumps(state))
        os.replace(tmp, self.path / "state.json")


UNIT_FIELDS = ("cid", "type", "source", "timestamp", "ttl", "metadata", "parent_cid", "expires_at")


def _document(day: str, key: int, r) -> tantivy.Document:
    doc = tantivy.Document()
    doc.add_text("t", r["tokens"])
    # the unit's other public fields in UNIT_FIELDS order; metadata stays the JSON text it is stored as
    doc.add_text("content", r["content"])
    doc.add_text("unit", json.dumps([r[name] for name in UNIT_FIELDS], ensure_ascii=False))
    doc.add_integer("key", key)
    doc.add_integer("exp", r["expires_at"])
    doc.add_integer("ts", r["timestamp"])
    doc.add_integer("len", r["ntok"])
    doc.add_text("day", day)
    doc.add_text("type", r["type"])
    doc.add_text("src", r["source"])
    if r["parent_cid"]:
        doc.add_text("parent", r["parent_cid"])
    return doc


def _unit(doc: tantivy.Document) -> dict:
    cid, type_, source, timestamp, ttl, meta, parent, expires_at = json.loads(doc.get_first("unit"))
    return {"cid": cid, "type": type_, "source": source, "timestamp": timestamp, "ttl": ttl,
            "content": doc.get_first("content") or "", "metadata": json.loads(meta) if meta else None,
            "parent_cid": parent, "expires_at": expires_at}


def backlog(t, seq: int = 2 ** 62) -> tuple[int, int | None, int]:
    """(rows the read index lacks, oldest push among them in ms, lowest seq of a unit it lacks or
    ``seq`` + 1) over a tenant's shards, among the units up to ``seq``."""
    total, oldest, low = 0, None, seq + 1
    for day in t.primary_days():
        db = t.shard(day, create=False)
        if db is None:
            continue
        n, first, lowest = db.read(lambda c: c.execute(sql("sync_backlog"), {"seq": seq}).fetchone())
        total += n
        if n and first < 1e18:
            oldest = int(first) if oldest is None else min(oldest, int(first))
        if lowest < 9e18:
            low = min(low, int(lowest))
    return total, oldest, low
