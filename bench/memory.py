"""Agent memory on LoCoMo: does a plain default search find the turns that hold a question's answer?

LoCoMo (Maharana et al., "Evaluating Very Long-Term Conversational Memory of LLM Agents", ACL 2024; GitHub
snap-research/locomo, ``data/locomo10.json``, licence CC BY-NC 4.0: research and evaluation only, never
shipped here) holds ten long two-person conversations with questions whose evidence turns are known.

Each conversation is pushed through HTTP into a real gunicorn, two ways, each into its own tenant:

- **threaded**, as a client that knows its sessions pushes (the agent hooks do this): one ``system_notice``
  root per session (``Conversation between <A> and <B>, session <N>, <date>``, metadata ``{"session",
  "date"}``) and every turn a child of its session's root, metadata ``{"dia_id", "session", "speaker",
  "date"}``;
- **flat**: the same turns with no parent and only ``dia_id`` in metadata.

A turn is one unit: ``"<speaker>: <text>"`` (plus `` [shares <blip_caption>]`` where an image was shared),
``type: user_input``, ``source: locomo_<speaker>``. Timestamps keep the real gaps between sessions (shifted
so that the last session was yesterday) and one minute between turns. Each question of categories 1-4 (5,
adversarial, has no evidence) is one plain default search, ``POST /mcp/search {"query": q, "top_k": 10}``.
Evidence recall@k = |evidence ∩ the top k's dia_ids| / |evidence|, averaged over questions (a root has no
dia_id and never counts). Beside the service, over the same turns (one index per conversation): bm25s
(English stemmer and stopwords, k1 1.2, b 0.75) and tantivy (``en_stem``, its BM25).

``--ablations`` also ranks the threaded and flat pushes in process with each component of the thread-aware
ranking (service/ranking/threads.py) turned off or changed, one at a time: the table of what was kept.

    make memory                                   # the development half, as the Makefile points it
    .venv/bin/python bench/memory.py --data path/to/locomo10.json [--conversations conv-26,conv-30]
        [--modes threaded,flat] [--store postgresql] [--ablations] [--name memory]

``--data`` takes the public ``locomo10.json`` (a list of samples with ``sample_id``) or a folder of
``conv-*.json`` files, one sample each.
"""
from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import requests

from common import ROOT, TMP, machine, quiet_service_logs, service_rev, service_src, write_json

DEFAULT_DATA = ROOT.parent / "shared" / "eval" / "locomo-dev"
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
KS = (1, 5, 10)
TTL = 365 * 86_400


# --- the data -----------------------------------------------------------------------------------------
def load(path: Path, names: list[str] | None) -> dict[str, dict]:
    """sample_id -> sample, from locomo10.json or a folder of conv-*.json."""
    if not path.exists():
        raise SystemExit(f"{path} does not exist: get data/locomo10.json from github.com/snap-research/locomo "
                         "(CC BY-NC 4.0) and pass it with --data (make memory LOCOMO=...)")
    if path.is_dir():
        samples = []
        for f in sorted(path.glob("conv-*.json")):
            s = json.loads(f.read_text(encoding="utf-8"))
            # (a sample's own file may hold its conversation's fields at the top, beside qa)
            samples.append(s if "conversation" in s else {"sample_id": f.stem, "conversation": s, "qa": s["qa"]})
    else:
        samples = json.loads(path.read_text(encoding="utf-8"))
    out = {s["sample_id"]: s for s in samples}
    if names:
        missing = [n for n in names if n not in out]
        if missing:
            raise SystemExit(f"not in {path}: {', '.join(missing)}")
        out = {n: out[n] for n in names}
    return out


def sessions(sample: dict) -> list[tuple[int, str, list[dict]]]:
    """(number, date text, turns) of each session that has turns."""
    c = sample["conversation"]
    out, n = [], 1
    while f"session_{n}_date_time" in c:
        turns = c.get(f"session_{n}")
        if isinstance(turns, list) and turns:
            out.append((n, c[f"session_{n}_date_time"], turns))
        n += 1
    return out


def questions(sample: dict) -> list[dict]:
    return [q for q in sample["qa"] if q.get("category") in CATEGORIES and q.get("evidence")]


def pushes(sample: dict, mode: str, now: int) -> list[tuple[dict | None, list[dict]]]:
    """Per session: (its root or None, its turns), with timestamps as the harness sets them."""
    c = sample["conversation"]
    a, b = c["speaker_a"], c["speaker_b"]
    found = sessions(sample)
    when = [datetime.datetime.strptime(d, "%I:%M %p on %d %B, %Y").replace(tzinfo=datetime.timezone.utc)
            for _, d, _ in found]
    shift = now - 86_400 - int(when[-1].timestamp()) - 60 * len(found[-1][2])   # the last session: yesterday
    out = []
    for (n, date, turns), start in zip(found, when):
        t0 = int(start.timestamp()) + shift
        root = None
        if mode == "threaded":
            root = {"type": "system_notice", "source": "locomo_session", "timestamp": t0, "ttl": TTL,
                    "content": f"Conversation between {a} and {b}, session {n}, {date}",
                    "metadata": {"session": n, "date": date}}
        units = []
        for i, t in enumerate(turns):
            text = f"{t['speaker']}: {t['text']}" + (f" [shares {t['blip_caption']}]" if t.get("blip_caption") else "")
            meta = {"dia_id": t["dia_id"]}
            if mode == "threaded":
                meta.update(session=n, speaker=t["speaker"], date=date)
            units.append({"type": "user_input", "source": f"locomo_{t['speaker'].lower()}", "timestamp": t0 + 60 * (i + 1),
                          "ttl": TTL, "content": text, "metadata": meta})
        out.append((root, units))
    return out


def anchor() -> int:
    """The start of today (UTC): the pushes' timestamps, so their CIDs and the ties they settle, are the same
    in every run of a day."""
    return int(time.time()) // 86_400 * 86_400


def recall(ranked: list[str | None], evidence: list[str], k: int) -> float:
    ev = set(evidence)
    return len(ev & {d for d in ranked[:k] if d}) / len(ev)


def score(runs: list[tuple[dict, list]]) -> dict:
    """Evidence recall@1/5/10, overall and per category (R@10), over (question, ranked dia_ids) pairs."""
    total = collections.defaultdict(float)
    by_cat: dict[int, list[float]] = collections.defaultdict(list)
    for q, ranked in runs:
        for k in KS:
            total[k] += recall(ranked, q["evidence"], k)
        by_cat[q["category"]].append(recall(ranked, q["evidence"], 10))
    n = len(runs) or 1
    return {**{f"R@{k}": round(total[k] / n, 3) for k in KS}, "questions": len(runs),
            "R@10_by_category": {CATEGORIES[c]: round(sum(v) / len(v), 3) for c, v in sorted(by_cat.items())}}


# --- the service --------------------------------------------------------------------------------------
class Http:
    """A tenant of a running service, through its HTTP API (one key per tenant)."""

    def __init__(self, url: str, key: str):
        self.url, self.s = url, requests.Session()
        self.s.headers["Authorization"] = f"Bearer {key}"

    def push(self, units: list[dict]) -> list[dict]:
        rv = self.s.post(f"{self.url}/mcp/push", json={"units": units}, timeout=60)
        rv.raise_for_status()
        out = rv.json()["results"]
        bad = [r for r in out if r.get("status") not in ("ok", "duplicate")]
        if bad:
            raise RuntimeError(f"push refused: {bad[:3]}")
        return out

    def search(self, query: str) -> list[dict]:
        rv = self.s.post(f"{self.url}/mcp/search", json={"query": query, "top_k": 10}, timeout=60)
        rv.raise_for_status()
        return rv.json()["results"]


class InProcess(Http):
    """The same through Flask's test client (ablations: the service's code with one thing changed)."""

    def __init__(self, client, key: str):
        self.client, self.headers = client, {"Authorization": f"Bearer {key}"}

    def push(self, units: list[dict]) -> list[dict]:
        rv = self.client.post("/mcp/push", json={"units": units}, headers=self.headers)
        assert rv.status_code == 200, rv.get_json()
        return rv.get_json()["results"]

    def search(self, query: str) -> list[dict]:
        rv = self.client.post("/mcp/search", json={"query": query, "top_k": 10}, headers=self.headers)
        assert rv.status_code == 200, rv.get_json()
        return rv.get_json()["results"]


def tenant_of(sample_id: str, mode: str) -> str:
    return f"{sample_id.replace('conv-', 'c')}-{mode}"


def push_all(api: Http, sample: dict, mode: str, now: int) -> int:
    n = 0
    for root, units in pushes(sample, mode, now):
        if root is not None:
            cid = api.push([root])[0]["cid"]
            for u in units:
                u["parent_cid"] = cid
            n += 1
        api.push(units)
        n += len(units)
    return n


def ask(api: Http, sample: dict) -> list[tuple[dict, list]]:
    return [(q, [(r.get("metadata") or {}).get("dia_id") for r in api.search(q["question"])]) for q in questions(sample)]


def wait_indexed(url: str, keys: dict, timeout: float = 300) -> None:
    """Until no tenant's default search lacks a unit (read index caught up): answers as a steady service's."""
    deadline = time.monotonic() + timeout
    for key in keys.values():
        while True:
            rv = requests.post(f"{url}/mcp/search", json={"query": "zzzz", "top_k": 1},
                               headers={"Authorization": f"Bearer {key}"}, timeout=30).json()
            if rv["freshness"]["index_pending"] == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.5)


def wait_read_index(data: Path, tenants: list[str], timeout: float = 300) -> None:
    """Until every tenant's read index is built and serves default searches: while one is being built the
    primaries answer, and they rank by BM25 alone (docs/design.md §6), so a run that asked meanwhile measured
    a mix (one run gave threaded R@10 0.708 for 0.743)."""
    deadline = time.monotonic() + timeout
    for tenant in tenants:
        path = data / "tenants" / tenant / "replica" / "index" / "format.json"
        while True:
            try:
                if json.loads(path.read_text()).get("ready"):
                    break
            except (OSError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"the read index of {tenant} was not built within {timeout:.0f} s")
            time.sleep(0.2)


def run_http(src: Path, samples: dict, modes: list[str], store_env: dict) -> dict:
    """Push every (conversation, mode) into its tenant of one gunicorn, then ask every question."""
    import http_bench as hb
    data = Path(tempfile.mkdtemp(prefix="memory-", dir=TMP))
    keys = {tenant_of(s, m): f"memory-bench-key-{tenant_of(s, m)}" for s in samples for m in modes}
    port = hb.free_port()
    proc = hb.start_gunicorn(src, "service:create_app()", port, "memory-service.log", str(src),
                             CONTEXT_DATA_DIR=str(data),
                             CONTEXT_API_KEYS=";".join(f"{k}:{t}:push+search" for t, k in keys.items()),
                             **store_env)
    url = f"http://127.0.0.1:{port}"
    try:
        hb.wait_ready(port)
        now = anchor()
        for sid, sample in samples.items():
            for mode in modes:
                n = push_all(Http(url, keys[tenant_of(sid, mode)]), sample, mode, now)
                print(f"   pushed {sid} {mode}: {n} units", flush=True)
        wait_read_index(data, list(keys))
        wait_indexed(url, keys)
        out = {}
        for mode in modes:
            runs = [r for sid, s in samples.items() for r in ask(Http(url, keys[tenant_of(sid, mode)]), s)]
            out[f"service, {mode} push"] = score(runs)
        return out
    finally:
        hb.stop(proc)
        shutil.rmtree(data, ignore_errors=True)


# --- baselines over the same turns --------------------------------------------------------------------
def turns_of(sample: dict) -> list[tuple[str, str]]:
    return [(u["metadata"]["dia_id"], u["content"]) for _, units in pushes(sample, "flat", anchor())
            for u in units]


def run_bm25s(samples: dict) -> dict:
    import bm25s
    import Stemmer
    stemmer = Stemmer.Stemmer("english")
    runs = []
    for sample in samples.values():
        ids, texts = zip(*turns_of(sample))
        retriever = bm25s.BM25(method="lucene", k1=1.2, b=0.75)
        retriever.index(bm25s.tokenize(list(texts), stopwords="en", stemmer=stemmer, show_progress=False),
                        show_progress=False)
        for q in questions(sample):
            qt = bm25s.tokenize([q["question"]], stopwords="en", stemmer=stemmer, show_progress=False)
            if not qt.vocab:
                runs.append((q, []))
                continue
            docs, scores = retriever.retrieve(qt, k=min(10, len(ids)), show_progress=False)
            runs.append((q, [ids[i] for i, s in zip(docs[0], scores[0]) if s > 0]))
    return score(runs)


def run_tantivy(samples: dict) -> dict:
    import tantivy
    runs = []
    for sample in samples.values():
        sb = tantivy.SchemaBuilder()
        sb.add_text_field("body", stored=False, tokenizer_name="en_stem")
        sb.add_integer_field("i", stored=True, fast=True)
        schema = sb.build()
        index = tantivy.Index(schema)
        w = index.writer(50_000_000, 1)
        turns = turns_of(sample)
        for i, (_, text) in enumerate(turns):
            w.add_document(tantivy.Document(body=text, i=i))
        w.commit()
        index.reload()
        searcher = index.searcher()
        for q in questions(sample):
            words = [t for t in "".join(ch if ch.isalnum() else " " for ch in q["question"]).split()]
            query = index.parse_query(" OR ".join(words), ["body"]) if words else None
            hits = searcher.search(query, 10).hits if query is not None else []
            runs.append((q, [turns[searcher.doc(a)["i"][0]][0] for _, a in hits]))
    return score(runs)


# --- ablations (in process) ---------------------------------------------------------------------------
ABLATIONS = {
    # name: (what it changes, the patch)
    "BM25 alone (no thread, no neighbor)": {"THREAD_WEIGHT": 0.0, "NEIGHBOR_WEIGHT": 0.0},
    "thread evidence only (neighbor 0)": {"NEIGHBOR_WEIGHT": 0.0},
    "neighbor evidence only (thread 0)": {"THREAD_WEIGHT": 0.0},
    "thread evidence from its best match only (SECOND 0)": {"SECOND": 0.0},
    "thread evidence with its second match in full (SECOND 1)": {"SECOND": 1.0},
    "no neighbors pulled in (PULL 0)": {"PULL": 0},
    "pool of 50": {"POOL": 50},
    "pool of 100": {"POOL": 100},
    "neighbors of the pool's best 5 pulled in (PULL 5)": {"PULL": 5},
    "thread 0.3, neighbor 0.2": {"THREAD_WEIGHT": 0.3, "NEIGHBOR_WEIGHT": 0.2},
    "thread 1.0, neighbor 0.6": {"THREAD_WEIGHT": 1.0, "NEIGHBOR_WEIGHT": 0.6},
    "heads as plain units": {"head": False},
    "time adjacency per source, 30 min (CONTEXT_THREAD_GAP_S=1800)": {"config": {"thread_gap_s": 1800}},
}


def run_ablations(samples: dict, modes: list[str]) -> dict:
    quiet_service_logs()
    from service import create_app
    from service.ranking import threads
    from service.readindex import threaded
    out = {}
    for name, patch in {"kept (as shipped)": {}, **ABLATIONS}.items():
        saved = {k: getattr(threads, k) for k in patch if k not in ("head", "config")}
        head = threads.Evidence.head
        for k, v in patch.items():
            if k == "head":
                threads.Evidence.head = lambda self, c: False
            elif k != "config":
                setattr(threads, k, v)
                if hasattr(threaded, k):
                    setattr(threaded, k, v)
        try:
            data = Path(tempfile.mkdtemp(prefix="memory-ab-", dir=TMP))
            keys = {tenant_of(s, m): f"memory-bench-key-{tenant_of(s, m)}" for s in samples for m in modes}
            app = create_app({"data_dir": str(data), "background": False, **patch.get("config", {}),
                              "api_keys": ";".join(f"{k}:{t}:push+search" for t, k in keys.items())})
            client = app.test_client()
            now = anchor()
            for sid, sample in samples.items():
                for mode in modes:
                    push_all(InProcess(client, keys[tenant_of(sid, mode)]), sample, mode, now)
            while app.extensions["context_maintenance"].run_once():
                pass
            out[name] = {mode: score([r for sid, s in samples.items()
                                      for r in ask(InProcess(client, keys[tenant_of(sid, mode)]), s)])
                         for mode in modes}
            app.extensions["context_shutdown"]()
            shutil.rmtree(data, ignore_errors=True)
        finally:
            threads.Evidence.head = head
            for k, v in saved.items():
                setattr(threads, k, v)
                if hasattr(threaded, k):
                    setattr(threaded, k, v)
        print(f"   {name:42s} " + "  ".join(f"{m} R@5 {out[name][m]['R@5']:.3f} R@10 {out[name][m]['R@10']:.3f}"
                                            for m in modes), flush=True)
    return out


# --- main ---------------------------------------------------------------------------------------------
def table(rows: dict) -> str:
    head = "| system | R@1 | R@5 | R@10 | R@10 by category: " + " / ".join(CATEGORIES.values()) + " |"
    lines = [head, "|---|---|---|---|---|"]
    for name, r in rows.items():
        cats = " / ".join(f"{r['R@10_by_category'].get(c, 0):.3f}" for c in CATEGORIES.values())
        lines.append(f"| {name} | {r['R@1']:.3f} | {r['R@5']:.3f} | {r['R@10']:.3f} | {cats} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(DEFAULT_DATA), help="locomo10.json, or a folder of conv-*.json")
    ap.add_argument("--conversations", default="", help="sample ids, e.g. conv-26,conv-30 (default: all in --data)")
    ap.add_argument("--modes", default="threaded,flat")
    ap.add_argument("--store", choices=("sqlite", "postgresql"), default="sqlite")
    ap.add_argument("--ablations", action="store_true")
    ap.add_argument("--no-baselines", action="store_true")
    ap.add_argument("--service-src", default="worktree")
    ap.add_argument("--name", default="memory")
    a = ap.parse_args(argv)
    src = service_src(a.service_src)
    samples = load(Path(a.data), [n for n in a.conversations.split(",") if n])
    modes = [m for m in a.modes.split(",") if m]
    out = {"machine": machine(), "service_rev": service_rev(src), "data": os.path.basename(a.data.rstrip("/")),
           "conversations": list(samples), "questions": sum(len(questions(s)) for s in samples.values()),
           "store": a.store, "harness": "evidence recall@k over dia_ids, top_k 10, one plain default search per "
                                        "question (categories 1-4)", "systems": {}}
    cluster = None
    try:
        store_env = {}
        if a.store == "postgresql":
            sys.path.insert(0, str(Path(__file__).parent))
            from postgresql import pg_cluster
            cluster = pg_cluster(TMP / "memory-pg-cluster")
            store_env = {"CONTEXT_STORE": cluster.primary_url, "CONTEXT_STORE_REPLICA": cluster.standby_url}
        print(f"== service ({a.store}) over HTTP: {', '.join(samples)}", flush=True)
        out["systems"].update(run_http(src, samples, modes, store_env))
    finally:
        if cluster is not None:
            cluster.stop()
    if not a.no_baselines:
        out["systems"]["bm25s (English stemmer, stopwords), k1 1.2 b 0.75"] = run_bm25s(samples)
        out["systems"]["tantivy en_stem, its BM25"] = run_tantivy(samples)
    print(table(out["systems"]), flush=True)
    if a.ablations:
        print("== ablations, in process (the service's code, one component changed)", flush=True)
        out["ablations"] = run_ablations(samples, modes)
    write_json(a.name, out)


if __name__ == "__main__":
    main()
