"""Configuration: read once from ``CONTEXT_*`` environment variables and stored on the app.

Nothing else in the service reads ``os.environ``; everything takes a :class:`Config`.
"""
from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass
from pathlib import Path

ENV_PREFIX = "CONTEXT_"

# Settings that no longer exist, refused when set so that nobody relies on one silently ignored.
REMOVED = {
    "CONTEXT_BM25_K1": "BM25's k1 is tantivy's 1.2 on every search path (the read index cannot rank with another)",
    "CONTEXT_BM25_B": "BM25's b is tantivy's 0.75 on every search path (the read index cannot rank with another)",
}

# The values CONTEXT_SYNCHRONOUS may take (OFF is refused: without any sync a power cut may corrupt a file).
SYNCHRONOUS = ("FULL", "EXTRA", "NORMAL")

BASE_TYPES = ("user_input", "model_thinking", "tool_output", "system_notice")


def is_postgresql(url: str | None) -> bool:
    """Whether a ``CONTEXT_STORE`` (or ``_REPLICA``) value names a PostgreSQL database."""
    return bool(url) and url.split("://", 1)[0] in ("postgresql", "postgres")


def redact(url: str) -> str:
    """A connection URL for logs and messages: never its password."""
    return re.sub(r"://([^:/@]+):[^@]*@", r"://\1:***@", url)


# Set but empty is a mistake for these, not "unset" (which means: no keys, loopback only).
MUST_NOT_BE_EMPTY = ("api_keys_file", "api_keys")


def _bool(v: str) -> bool:
    return v.strip().lower() in ("1", "true", "yes", "on")


def _list(v: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in v.split(",") if x.strip())


@dataclass(frozen=True)
class Config:
    data_dir: str = "./data"
    bind: str = "127.0.0.1:5000"
    workers: int = 2
    threads: int = 8
    # Auth (docs/design.md §9): a keys file, or inline keys "key:tenant:scope+scope;..." for development.
    api_keys_file: str | None = None
    api_keys: str | None = None
    # Unit contract (docs/design.md §3).
    extra_types: tuple[str, ...] = ()
    max_content_bytes: int = 1024 * 1024
    max_metadata_bytes: int = 64 * 1024
    max_source_chars: int = 200
    max_ttl: int = 31_536_000         # 0: no maximum, a unit may be kept for good
    default_ttl: int = 2_592_000      # ttl of a unit pushed without one (30 days); 0: kept for good (needs max_ttl 0)
    future_skew_s: int = 300
    max_batch: int = 1000
    max_body_bytes: int = 32 * 1024 * 1024       # POST /mcp/push (batches); checked before parsing
    max_request_bytes: int = 1024 * 1024         # every other route's body (search, MCP, retrieval, ...)
    max_metadata_depth: int = 32
    max_lineage_bytes: int = 4 * 1024 * 1024     # content in one lineage answer (REST and review-lineage)
    # Mask credentials in every pushed unit (content, source, metadata) with the hooks' detector before it is
    # stored, under the CID of what is stored (docs/design.md §3); off: units are stored as sent.
    mask_pushes: bool = False
    # Tokenizer (docs/design.md §6).
    segmenter: str = "auto"          # auto | rjieba | jieba
    user_dict: str | None = None
    stem: bool = True
    # Indexer and read index (docs/design.md §6.1; service/readindex/).
    index_threads: int = 2
    index_batch: int = 512
    index_poll_ms: int = 200
    index_debounce_ms: int = 100      # at most one indexing pass per this interval (rows pile into one transaction)
    replica_debounce_ms: int = 500    # at most one read-index commit per this interval
    replicas: bool = True             # default searches read the read index (False: the primaries)
    read_index_heap_mb: int = 48      # tantivy writer's indexing memory in the leader
    strong_wait_ms: int = 5000
    # Read-your-writes (docs/consistency-and-scores.md): a default search also reads, from the primary
    # files, the units acknowledged before it that the read index lacks; it indexes those still
    # pending for at most this long (0: off, default searches read the read index alone) ...
    read_your_writes_ms: int = 500
    # A unit with no parent and no metadata.session joins its source's previous unit's thread when that one is
    # 1 s to this many seconds older (0: off, each such unit is a thread of its own; docs/design.md §3).
    thread_gap_s: int = 0
    # ... when they are at most this many (a bulk import's backlog is reported in freshness instead).
    read_your_writes_max: int = 20_000
    janitor_interval_s: float = 30.0
    # Search (docs/design.md §6).
    search_threads: int = 4
    local_top_n: int = 50
    exact_match_limit: int = 120     # at most this many matches in a shard: score them all exactly (cheap when small)
    # CPU one search may spend scoring on the primary files (strong reads, read-your-writes' tail);
    # past it the search stops with 422 query_too_expensive (0: no cap). The read index needs none.
    search_cpu_ms: int = 1000
    # Storage backend (docs/postgresql.md): "sqlite" (files under data_dir) or a postgresql://...
    # URL (a libpq host list follows a promotion); with PostgreSQL, store_replica names a streaming hot
    # standby: it feeds the nodes' read indexes when caught up, and default searches read their tail
    # from it while the primary is down (docs/postgresql.md, "How it runs across machines").
    store: str = "sqlite"
    store_replica: str | None = None
    replica_max_lag_ms: int = 5000
    store_wait_s: float = 0.0         # at start, wait this long for a PostgreSQL primary that does not answer yet
    pg_pool_size: int = 10            # connections per process and server (primary, standby)
    # Every PostgreSQL connection (primary, search and standby pools) waits at most this for a table lock, and
    # runs one statement at most this long (0: no bound), then 503 storage_unavailable (issue 50, M2).
    pg_lock_timeout_ms: int = 2000
    pg_statement_timeout_ms: int = 30_000
    pg_index_batch: int = 2048        # queued units one PostgreSQL indexer transaction takes at most
    # Storage.
    busy_timeout_ms: int = 10_000
    group_commit_units: int = 1000    # concurrent pushes written in one transaction per file, up to this many units (a batch over it goes alone)
    # SQLite's PRAGMA synchronous on every file the service writes (WAL mode). FULL: the WAL is synced
    # at each commit, so an acknowledged push survives a power cut or kernel crash (group commit makes
    # it one sync per file per group). NORMAL: faster, survives a killed process but may lose the
    # last commits before a power cut. EXTRA: FULL, and in WAL mode the same.
    synchronous: str = "FULL"
    cache_size_kib: int = 8192        # catalog connections
    shard_cache_kib: int = 512        # per connection to a day shard (there are many: keep RSS bounded)
    shard_readers: int = 2            # pooled read connections kept per day-shard file
    max_open_shards: int = 64         # primary day files kept open per process (least recently used closed)
    # What one process keeps open for its tenants (service/budget.py; docs/design.md §11, "What a tenant holds"):
    open_files: int = 0               # descriptors its tenants' files may hold; 0: three quarters of RLIMIT_NOFILE
    open_read_indexes: int = 48       # tenants' read indexes kept loaded (one tantivy thread each)
    tenant_idle_s: float = 30.0       # a tenant unused this long has its files, read index and writer closed
    max_days_per_request: int = 100   # distinct days one push may touch (each is a file); 0: no limit
    max_days_per_tenant: int = 400    # day files per tenant (at the default max_ttl live units span ~366)
    # Front doors (docs/design.md §7, §8).
    public_url: str = "http://context-mode:5000"
    # Host/Origin check on every door (docs/design.md §9); the host of public_url is always allowed.
    allowed_hosts: tuple[str, ...] = ("localhost", "127.0.0.1", "[::1]", "::1")
    allowed_origins: tuple[str, ...] = ()
    mcp_allowed_hosts: tuple[str, ...] = ()     # older names of the two above; added to them
    mcp_allowed_origins: tuple[str, ...] = ()
    allow_open: bool = False          # no-keys mode on a non-loopback bind only when this is set
    mcp_cursor_secret: str | None = None   # HMAC key for MCP list cursors (default: a key file in data_dir)
    mcp_list_max_units: int = 500     # resources/list stops after this many recent units (clients cap pages)
    # Per key (client address for requests without one). "auto": 1200/minute when keys are
    # configured, off in no-keys mode (loopback only, one user); "off" disables it everywhere.
    rate_limit: str | None = "auto"
    # Per worker (0: no cap). Under gunicorn a search past a share waits without a thread up to search_wait_s, then
    # 503 search_busy (the worker's slots) or 429 too_many_searches (its key's or tenant's); in a thread it never waits.
    max_concurrent_searches: int = 4
    search_wait_s: float = 2.0
    # While a lighter tenant searches, one tenant's searches use at most this share of a worker's CPU (their thread
    # time over about the last second); past it they wait, holding no thread, up to search_wait_s, then 429 (0: off).
    search_cpu_share: float = 0.25
    read_timeout_s: float = 10.0      # gunicorn drops a client silent this long mid-request (headers or body)
    request_deadline_s: float = 30.0  # ... and one whose headers and body take longer than this in total
    # Slow clients on a worker thread (service/guard/): a thread waits on one client at most
    # slow_client_grace_s in all (per request body, per response) beyond what its pace pays for at these
    # rates (bytes/s; 0: no rate), and every response is written within write_deadline_s of its first byte
    # (0: no deadline). Live streams are bounded by their own write timeout instead.
    slow_client_grace_s: float = 5.0
    min_receive_rate: int = 16_384
    min_send_rate: int = 16_384
    write_deadline_s: float = 600.0
    # What one worker's poller keeps (spooled) for its slow readers, in all and per API key (issue 50, M3); a response
    # past either is written by its thread at the reader's pace (0: no cap).
    slow_reader_bytes: int = 128 << 20
    slow_reader_key_bytes: int = 32 << 20
    access_log: bool = True           # one stderr line per request: tenant, method, route, status, ms
    background: bool = True          # start indexer/janitor threads (tests may turn off)
    # Under gunicorn: indexing, read-index writes and the janitor run in one maintainer process beside
    # the workers (service/maintainer.py), not in a worker's thread; False: in the workers, as before.
    maintenance_process: bool = True
    # Live context: MCP subscriptions/listen and GET /mcp/stream. Each open stream holds one
    # gunicorn thread, so streams per worker stay below CONTEXT_THREADS (service/hub.py).
    max_streams: int = -1             # open streams per worker; -1: half the threads; at most threads - 2
    max_listeners_per_key: int = 16   # open streams of one API key, over every worker
    max_listeners_per_tenant: int = 64
    max_subscriptions: int = 100      # resource URIs in one subscriptions/listen
    listen_poll_ms: int = 100         # how often each worker looks for new units and changes
    listen_heartbeat_s: float = 15.0  # an SSE comment on a quiet stream (proxies and clients keep it open)
    listen_idle_s: float = 1800.0     # a stream that delivered nothing this long ends (client re-listens)
    # Tool registry (service/store/sqlite/registry.py).
    max_tools_per_tenant: int = 10_000
    # Fair shares (README "Bounded work"): of one worker's slots, what one tenant and one API key may hold, so
    # one at its limit leaves room for the others; -1: half of the worker's slots, at least 1 (a key's: the
    # tenant's). Searches past their share wait search_wait_s, then 429; streams get 429 + Retry-After.
    search_share: int = -1            # of max_concurrent_searches (tool searches included)
    search_key_share: int = -1
    stream_share: int = -1            # of the worker's stream slots (max_streams)
    dify_neighbors: int = 1           # units each side of a Dify record in its thread (0-5; 0: the unit alone)
    stream_key_share: int = -1
    shard_share: int = -1             # of max_open_shards: day files one tenant keeps open in a process
    # Of a worker's threads (with keys), what one tenant and one key hold at once, -1: half / the tenant's; a request
    # past it waits without a thread (service/shares/admission.py Admission) up to thread_wait_s, then 429 too_many_requests.
    thread_share: int = -1
    thread_key_share: int = -1
    thread_wait_s: float = 10.0
    tool_search_bytes: int = 8 << 20  # token bytes one tool search scores at most (name, text, schema columns)
    # Large answers: one over large_answer_bytes (what the slow-client guard's poller keeps for a slow reader,
    # service/guard/responses.py) holds a thread while a slow client reads it, so a worker writes at most
    # large_answers of them at once (-1: half its threads), one tenant at most large_answer_share of those and
    # one key large_answer_key_share (-1: half / the tenant's); past them 429 (a key's or tenant's share) or 503
    # (the worker's), with Retry-After.
    large_answer_bytes: int = 8 << 20
    large_answers: int = -1
    large_answer_share: int = -1
    large_answer_key_share: int = -1

    def __post_init__(self):
        mode = str(self.synchronous).strip().upper()
        if mode not in SYNCHRONOUS:
            raise ValueError(f"CONTEXT_SYNCHRONOUS={self.synchronous!r} must be one of {', '.join(SYNCHRONOUS)}: FULL "
                             "(the default) syncs each commit so that an acknowledged push survives a power cut; "
                             "NORMAL may lose the last commits before one.")
        object.__setattr__(self, "synchronous", mode)    # the PRAGMA takes it as given
        if self.max_ttl < 0 or self.default_ttl < 0:
            raise ValueError("CONTEXT_MAX_TTL and CONTEXT_DEFAULT_TTL must be >= 0 (0: no expiry).")
        if self.max_ttl and not 0 < self.default_ttl <= self.max_ttl:
            raise ValueError(f"CONTEXT_DEFAULT_TTL ({self.default_ttl or 'no expiry'}) must be between 1 and "
                             f"CONTEXT_MAX_TTL ({self.max_ttl}); set CONTEXT_MAX_TTL=0 to allow no expiry.")
        if not 0 <= self.search_cpu_share <= 1:
            raise ValueError(f"CONTEXT_SEARCH_CPU_SHARE ({self.search_cpu_share}) must be between 0 (off) and 1: the "
                             "share of a worker's CPU one tenant's searches use while another tenant searches.")
        if not 0 <= self.dify_neighbors <= 5:
            raise ValueError(f"CONTEXT_DIFY_NEIGHBORS ({self.dify_neighbors}) must be between 0 (a record is its unit "
                             "alone) and 5 (units each side of it in its thread).")
        if self.open_files < 0 or self.open_read_indexes < 1 or self.tenant_idle_s <= 0:
            raise ValueError("CONTEXT_OPEN_FILES must be >= 0 (0: from the open-files limit), "
                             "CONTEXT_OPEN_READ_INDEXES >= 1 and CONTEXT_TENANT_IDLE_S > 0.")
        if self.max_streams < -1 or self.max_streams > max(0, self.threads - 2):
            raise ValueError(f"CONTEXT_MAX_STREAMS ({self.max_streams}) must be between 0 and CONTEXT_THREADS - 2 "
                             f"({max(0, self.threads - 2)}): every open stream holds a gunicorn thread, and "
                             "requests need the others. Raise CONTEXT_THREADS to serve more streams.")

    @property
    def keyless(self) -> bool:
        """No API keys configured: every caller is the one 'default' tenant (auth.KeyRing.open, from the config)."""
        return not (self.api_keys_file or self.api_keys)

    @property
    def stream_cap(self) -> int:
        """Streams one worker holds open at most (each holds one of its threads)."""
        return self.threads // 2 if self.max_streams < 0 else self.max_streams

    @property
    def types(self) -> tuple[str, ...]:
        return BASE_TYPES + tuple(t for t in self.extra_types if t not in BASE_TYPES)

    @property
    def backend(self) -> str:
        """"sqlite" or "postgresql", as ``CONTEXT_STORE`` says; RuntimeError (a refused start) otherwise."""
        name = "postgresql" if is_postgresql(self.store) else "sqlite" if self.store == "sqlite" else None
        if name is None:
            raise RuntimeError(f"CONTEXT_STORE must be 'sqlite' or a postgresql://... URL, not {self.store!r}.")
        if self.store_replica and not (name == "postgresql" and is_postgresql(self.store_replica)):
            raise RuntimeError("CONTEXT_STORE_REPLICA is a postgresql://... URL and needs CONTEXT_STORE=postgresql://...")
        return name

    @property
    def data_path(self) -> Path:
        """``data_dir`` as a Path: the data folder every file of this node lives under."""
        return Path(self.data_dir)

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None, **overrides) -> "Config":
        env = os.environ if environ is None else environ
        for name, why in REMOVED.items():
            if env.get(name):
                raise ValueError(f"{name} is no longer a setting: {why}. Unset it.")
        values: dict = {}
        for f in dataclasses.fields(cls):
            name = ENV_PREFIX + f.name.upper()
            raw = env.get(name)
            if raw is not None and not raw.strip() and f.name in MUST_NOT_BE_EMPTY:
                # A typo or a missing compose variable must never turn authentication off.
                raise ValueError(f"{name} is set but empty: name the keys, or unset {name} to run without keys "
                                 "(loopback only).")
            if raw is None or raw == "":
                continue
            try:
                values[f.name] = _coerce(f, raw)
            except ValueError:
                kind = "a whole number" if isinstance(f.default, int) else "a number"
                raise ValueError(f"{name}={raw!r} is not {kind}.") from None
        values.update(overrides)
        return cls(**values)

    @classmethod
    def from_mapping(cls, mapping: dict | None = None) -> "Config":
        """The defaults with a mapping's values (field names, any case, ``CONTEXT_`` prefix optional;
        strings coerced like environment values). The environment is not read: a test's or an
        embedding program's mapping is the whole configuration."""
        known = {f.name: f for f in dataclasses.fields(cls)}
        values = {}
        for k, v in (mapping or {}).items():
            k = k.lower().removeprefix("context_")
            if k not in known:
                continue
            if isinstance(v, str) and not isinstance(known[k].default, str) and known[k].default is not None:
                v = _coerce(known[k], v)
            if isinstance(v, list):
                v = tuple(v)
            values[k] = v
        return cls(**values)

    def replace(self, **changes) -> "Config":
        return dataclasses.replace(self, **changes)


def _coerce(f: dataclasses.Field, raw: str):
    default = f.default
    if isinstance(default, bool):
        return _bool(raw)
    if isinstance(default, int):
        return int(raw)
    if isinstance(default, float):
        return float(raw)
    if isinstance(default, tuple):
        return _list(raw)
    return raw
