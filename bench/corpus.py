"""Deterministic generator of realistic context units, and cached data dirs built from them.

Text comes from real corpora (the judged sets' documents: Chinese statutes, English abstracts) and jieba's
dictionary frequencies; nothing is copied into the repo. Units come in time order over the
30 UTC days before today (30 day shards), with parent chains inside sessions and TTLs that
keep them live for months. Queries (2-4 terms) come from *held-back* units drawn from the
same generator stream but never pushed.

    python bench/corpus.py --size 20000 --seed 1      # build (or reuse) the service data dir
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import random
import re
import shutil
import time
from functools import lru_cache
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
RESULTS = BENCH / "results"
TMP = RESULTS / "tmp"
# The judged sets' folder (bench/README.md, "Judged sets"): QUALITY_DATA, else the team machines' copy.
EVAL_DIR = Path(os.environ.get("QUALITY_DATA") or ROOT.parent / "shared" / "eval").resolve()
EVAL_ZH = EVAL_DIR / "stard" / "corpus.jsonl.gz"
EVAL_EN = EVAL_DIR / "scifact" / "corpus.jsonl.gz"

DAY = 86_400
DAYS = 30
TYPES = (("tool_output", 0.40), ("user_input", 0.25), ("model_thinking", 0.25), ("system_notice", 0.10))
TOOLS = ("curl_tool", "sql_runner", "web_search", "file_reader", "shell_exec", "jira_api", "order_api",
         "k8s_ctl", "git_tool", "pdf_parser", "law_lookup", "paper_search")
ENVS = ("prod", "staging", "dev", "local")
STATUSES = ("shipped", "pending", "failed", "refunded", "delivered", "cancelled", "on_hold")
ID_PREFIXES = ("ORD", "INC", "JIRA", "TKT", "PR", "REQ", "SKU")
ZH_ASK = ("请帮我查一下", "帮我总结", "关于", "我想知道", "能不能解释", "请对比", "查询", "为什么")
EN_ASK = ("Can you check", "Summarize", "What does the paper say about", "Explain", "Find the status of",
          "Compare", "Why did")
THINK_ZH = ("首先需要确认", "根据工具输出", "看起来", "下一步应该", "用户关心的是", "结论是")
THINK_EN = ("Let me check", "The tool output shows", "It seems that", "Next I should verify",
            "The user is asking about", "So the answer is")
NOTICES = ("context window at {n}% capacity", "tool {tool} timed out after {n} ms, retrying",
           "rate limit reached for {tool}; backing off {n} s", "session resumed from checkpoint {id}",
           "memory compaction dropped {n} units", "{tool} upgraded to v{v}")
ZH_NOTICES = ("系统提示：{w1}服务响应缓慢", "会话已切换到{w1}模式", "注意：{w1}与{w2}的数据尚未同步")


def cid_of(content: str, timestamp: int, source: str) -> str:
    """docs/design.md §3: first 12 hex of sha256(content + str(timestamp) + source)."""
    return hashlib.sha256((content + str(timestamp) + source).encode("utf-8")).hexdigest()[:12]


# --- source text ------------------------------------------------------------------------------
_ZH_SPLIT = re.compile(r"(?<=[。；！？\n])")
_EN_SPLIT = re.compile(r"(?<=[.;!?])\s+")


def _read_jsonl(path: Path):
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        for line in fh:
            yield json.loads(line)


def _sentences(path, splitter, shortest: int, longest: int) -> list[str]:
    """The sentences of a judged corpus whose length is within [shortest, longest] characters."""
    out = []
    for doc in _read_jsonl(path):
        for s in splitter.split(doc.get("text", "")):
            s = s.strip()
            if shortest <= len(s) <= longest:
                out.append(s)
    return out


@lru_cache(maxsize=1)
def text_pools() -> tuple[list[str], list[str], list[str], list[float]]:
    """(Chinese sentences, English sentences, jieba dictionary words, their cumulative weights)."""
    zh = _sentences(EVAL_ZH, _ZH_SPLIT, 6, 300)
    en = _sentences(EVAL_EN, _EN_SPLIT, 20, 400)
    import jieba
    words, weights = [], []
    with open(Path(jieba.__file__).parent / "dict.txt", encoding="utf-8") as fh:
        for line in fh:
            parts = line.split()
            if len(parts) >= 2 and len(parts[0]) >= 2 and parts[1].isdigit():
                words.append(parts[0])
                weights.append(int(parts[1]))
    # Keep the 60k most frequent words: a realistic vocabulary, with Zipf-like frequencies.
    order = sorted(range(len(words)), key=lambda i: -weights[i])[:60_000]
    words = [words[i] for i in order]
    cum, acc = [], 0.0
    for i in order:
        acc += weights[i]
        cum.append(acc)
    return zh, en, words, cum


class Generator:
    """Units in time order; ``units(n)`` is deterministic for a (seed, anchor day)."""

    def __init__(self, seed: int = 1, anchor: int | None = None):
        self.rng = random.Random(seed)
        self.zh, self.en, self.words, self.cum = text_pools()
        # Today's UTC midnight: units fill the 30 whole days before it, so they make 30 shards.
        self.anchor = anchor if anchor is not None else (int(time.time()) // DAY) * DAY
        self.start = self.anchor - DAYS * DAY
        self.ids = [f"{p}-{self.rng.randint(1000, 99999)}" for p in ID_PREFIXES for _ in range(400)]

    # --- pieces -------------------------------------------------------------------------------
    def _zh(self, lo=1, hi=2) -> str:
        r = self.rng
        return "".join(r.choice(self.zh) for _ in range(r.randint(lo, hi)))

    def _en(self, lo=1, hi=2) -> str:
        r = self.rng
        return " ".join(r.choice(self.en) for _ in range(r.randint(lo, hi)))

    def _words(self, k: int) -> list[str]:
        return self.rng.choices(self.words, cum_weights=self.cum, k=k)

    def _ident(self) -> str:
        return self.rng.choice(self.ids)

    def _mixed(self) -> str:
        r = self.rng
        x = r.random()
        if x < 0.45:
            return self._zh(1, 2)
        if x < 0.75:
            return self._en(1, 2)
        return self._zh(1, 1) + " " + self._en(1, 1)

    def source(self) -> str:
        r = self.rng
        return f"{r.choice(TOOLS)}_v{r.randint(1, 4)}.{r.randint(0, 9)}_{r.choice(ENVS)}"

    def content(self, kind: str) -> str:
        r = self.rng
        if kind == "user_input":
            if r.random() < 0.55:
                s = r.choice(ZH_ASK) + "".join(self._words(r.randint(2, 5)))
                if r.random() < 0.5:
                    s += "：" + self._zh(1, 1)
            else:
                s = r.choice(EN_ASK) + " " + self._en(1, 1)
            if r.random() < 0.3:
                s += f" {self._ident()}"
            return s
        if kind == "model_thinking":
            parts = []
            for _ in range(r.randint(2, 4)):
                if r.random() < 0.5:
                    parts.append(r.choice(THINK_ZH) + "，" + self._zh(1, 1))
                else:
                    parts.append(r.choice(THINK_EN) + " " + self._en(1, 1))
                if r.random() < 0.25:
                    parts.append(f"({self._ident()})")
            return " ".join(parts)
        if kind == "tool_output":
            x = r.random()
            if x < 0.45:
                obj = {"id": self._ident(), "status": r.choice(STATUSES), "http_status": r.choice((200, 200, 201, 404, 500)),
                       "items": r.randint(0, 40), "note": self._mixed()}
                if r.random() < 0.4:
                    obj["tags"] = self._words(r.randint(1, 4))
                return json.dumps(obj, ensure_ascii=False)
            if x < 0.70:
                lines = []
                for _ in range(r.randint(2, 5)):
                    lvl = r.choice(("INFO", "INFO", "WARN", "ERROR", "DEBUG"))
                    lines.append(f"{lvl} {r.choice(TOOLS)}: {self._ident()} {' '.join(self._words(r.randint(1, 3)))} "
                                 f"latency_ms={r.randint(1, 900)}")
                return "\n".join(lines)
            if x < 0.88:
                return self._zh(2, 4)   # a retrieved statute passage
            return self._en(2, 3)       # a retrieved abstract passage
        n = r.randint(1, 99)
        if r.random() < 0.4:
            w = self._words(2)
            return r.choice(ZH_NOTICES).format(w1=w[0], w2=w[1])
        return r.choice(NOTICES).format(n=n, tool=r.choice(TOOLS), id=self._ident(), v=f"{r.randint(1, 4)}.{n}")

    def kind(self) -> str:
        x, acc = self.rng.random(), 0.0
        for name, p in TYPES:
            acc += p
            if x < acc:
                return name
        return TYPES[-1][0]

    # --- units --------------------------------------------------------------------------------
    def units(self, n: int):
        """Yield n unit dicts (with cid), timestamps increasing over the 30 days, sessions with parents."""
        r = self.rng
        span = DAYS * DAY - 60
        session_src, chain = None, []
        for i in range(n):
            if not chain or r.random() < 0.08:          # a new session every ~12 units
                session_src, chain = self.source(), []
            ts = self.start + int(span * (i + r.random()) / n)
            kind = self.kind()
            src = session_src if r.random() < 0.7 else self.source()
            content = self.content(kind)
            unit = {"type": kind, "source": src, "timestamp": ts,
                    "ttl": 60 * DAY + r.randint(0, 30 * DAY), "content": content,
                    "metadata": {"session": hashlib.md5(session_src.encode()).hexdigest()[:8], "i": i}}
            if chain and r.random() < 0.6:
                unit["parent_cid"] = r.choice(chain[-3:])
            unit["cid"] = cid_of(content, ts, src)
            chain.append(unit["cid"])
            yield unit


_QUERY_WORD = re.compile(r"^(?:[\u4e00-\u9fff]{2,}|[A-Za-z][A-Za-z-]{3,}|[A-Z]+-\d+)$")
_Q_STOP = frozenset("the and that with from this were have been which their there than these into also "
                    "什么 怎么 如何 我们 可以 应该 需要 没有 一个 这个 那个 根据 看起来 首先 结论".split())


def queries(n: int, seed: int = 1) -> list[str]:
    """n queries of 2-4 terms, each drawn from one held-back unit (never pushed)."""
    import rjieba
    g = Generator(seed=seed + 1_000_003)   # a different stream: these units are not in the corpus
    rng = random.Random(seed)
    out: list[str] = []
    for u in g.units(n * 4):
        words = [w for w in rjieba.cut(u["content"]) if _QUERY_WORD.match(w) and w.lower() not in _Q_STOP]
        words = list(dict.fromkeys(words))
        k = rng.randint(2, 4)
        if len(words) < k:
            continue
        start = rng.randint(0, len(words) - k)
        pick = words[start:start + k] if rng.random() < 0.5 else rng.sample(words, k)
        out.append(" ".join(pick))
        if len(out) == n:
            break
    return out


def questions(n: int, seed: int = 1) -> list[str]:
    """n real questions, whole sentences as people asked them: the judged sets' queries (STARD's Chinese
    questions, SciFact's English claims), alternating, in a seeded order. Their judged documents need not be in
    the corpus: these measure cost, bench/quality.py measures answers."""
    rng = random.Random(seed)
    sets = []
    for name in ("stard", "scifact"):
        with open(EVAL_DIR / name / "queries.jsonl", encoding="utf-8") as fh:
            texts = [json.loads(line)["text"] for line in fh if line.strip()]
        rng.shuffle(texts)
        sets.append(texts)
    out = []
    for i in range(n):
        texts = sets[i % 2]
        out.append(texts[(i // 2) % len(texts)])
    return out


# --- cached data dirs -------------------------------------------------------------------------
def corpus_key(size: int, seed: int) -> str:
    return f"n{size}-s{seed}"


def service_dir(size: int, seed: int = 1, *, rebuild: bool = False, log=print) -> Path:
    """A service data dir holding ``size`` indexed units with fresh replicas (cached).

    Built with whatever ``service`` is first on sys.path (see common.service_src); the
    on-disk format is the committed one, so a cached dir is reused across service changes
    unless --rebuild.
    """
    from common import app_parts
    from service.store.sqlite.queries import schema
    # The shard schema version is part of the key: a version change (e.g. v1 -> v2) builds a new
    # corpus; additive changes (new indexes, tables) are applied when the cached shards are opened.
    fmt = "v" + re.search(r"'schema_version', (\d+)", schema("shard_schema.sql")).group(1)
    d = TMP / f"service-{corpus_key(size, seed)}-{fmt}"
    if (d / "READY").exists() and not rebuild:
        # Bring derived files up to date with this service code (e.g. the read index of another
        # format): one maintenance pass, a no-op when nothing is due.
        from service import create_app
        app = create_app({"data_dir": str(d), "background": False})
        t0 = time.perf_counter()
        if app_parts(app).maintenance.run_once() or time.perf_counter() - t0 > 5:
            log(f"  brought cached corpus {size} up to date in {time.perf_counter() - t0:.1f} s")
        app_parts(app).shutdown()
        return d
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    from service import create_app
    app = create_app({"data_dir": str(d), "background": False})
    store = app_parts(app).store
    maint = app_parts(app).maintenance
    t0 = time.perf_counter()
    batch, pushed = [], 0
    for u in Generator(seed).units(size):
        batch.append(u)
        if len(batch) == 1000:
            _push(store, batch)
            pushed += len(batch)
            batch = []
            if pushed % 100_000 == 0:
                log(f"  pushed {pushed} units ({pushed / (time.perf_counter() - t0):.0f}/s)")
    if batch:
        _push(store, batch)
    t1 = time.perf_counter()
    indexed = 0
    while True:
        n = maint.run_once()
        indexed += n
        if n == 0:
            break
    time.sleep(1.1)               # past the replica debounce: one more pass copies every shard
    maint.run_once()
    t2 = time.perf_counter()
    app_parts(app).shutdown()
    info = {"size": size, "seed": seed, "push_s": round(t1 - t0, 2), "index_and_replica_s": round(t2 - t1, 2),
            "indexed": indexed, "built_at": int(time.time())}
    (d / "READY").write_text(json.dumps(info))
    log(f"  built service corpus {size}: push {t1 - t0:.1f} s, index+replicas {t2 - t1:.1f} s")
    return d


def _push(store, batch) -> None:
    for r in store.push_many("default", batch):
        if not isinstance(r, dict):
            raise RuntimeError(f"push failed: {r}")


def baseline_db(size: int, seed: int = 1, *, rebuild: bool = False, log=print) -> Path:
    """The naive baseline's single SQLite file holding the same units (cached)."""
    from baseline.app import BaselineStore
    path = TMP / f"baseline-{corpus_key(size, seed)}.db"
    ready = path.with_suffix(".ready")
    if ready.exists() and path.exists() and not rebuild:
        return path
    for p in (path, Path(str(path) + "-wal"), Path(str(path) + "-shm")):
        if p.exists():
            p.unlink()
    TMP.mkdir(parents=True, exist_ok=True)
    store = BaselineStore(path)
    t0 = time.perf_counter()
    batch = []
    for u in Generator(seed).units(size):
        batch.append(u)
        if len(batch) == 1000:
            store.push_many(batch)
            batch = []
    if batch:
        store.push_many(batch)
    store.close()
    ready.write_text(json.dumps({"size": size, "seed": seed, "build_s": round(time.perf_counter() - t0, 2)}))
    log(f"  built baseline corpus {size}: {time.perf_counter() - t0:.1f} s")
    return path


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=20_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--sample", type=int, default=0, help="print this many units and queries, build nothing")
    ap.add_argument("--baseline", action="store_true", help="also build the baseline DB")
    ap.add_argument("--rebuild", action="store_true")
    ap.add_argument("--service-src", default="head", help="head (committed snapshot) or worktree")
    a = ap.parse_args(argv)
    from common import quiet_service_logs, service_src
    service_src(a.service_src)
    quiet_service_logs()
    if a.sample:
        for u in Generator(a.seed).units(a.sample):
            print(json.dumps(u, ensure_ascii=False)[:400])
        for q in queries(a.sample, a.seed):
            print("Q:", q)
        return
    print(service_dir(a.size, a.seed, rebuild=a.rebuild))
    if a.baseline:
        print(baseline_db(a.size, a.seed, rebuild=a.rebuild))


if __name__ == "__main__":
    main()
