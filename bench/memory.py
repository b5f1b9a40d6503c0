"""Agent memory on LoCoMo: does a plain default search find the turns that hold a question's answer, on every path?

LoCoMo (Maharana et al., "Evaluating Very Long-Term Conversational Memory of LLM Agents", ACL 2024; GitHub
snap-research/locomo, ``data/locomo10.json``, licence CC BY-NC 4.0: research and evaluation only, never
shipped here) holds ten long two-person conversations with questions whose evidence turns are known. The
development half is conv-26, conv-30, conv-41, conv-42 and conv-43 (the default); the other five are held out.

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

Every path, threaded push (``--paths``): ``default`` (the read index), ``strong`` (``"consistency":
"strong"``, the primaries), ``primaries`` (a second server with CONTEXT_REPLICAS=false) and ``building`` (in
process: default searches while the read index is not built yet, the primaries answering); each with its
R@k and the share of questions whose top 10 is the default path's.

``--loco``: leave-one-conversation-out, in process: every weight of the ranking (service/ranking/threads.py) at
0, half, as shipped and 1.5x, one at a time; for each conversation the setting best on the other four is
measured on it, and the mean over conversations is reported beside the shipped weights'.
``--ablations``: each component turned off or changed, one at a time (the table of what was kept).
``--twin DIR``: the Chinese twin (``medium_locomo_zh.json``, ``medium_locomo_en.json``: two conversations
translated, the same questions) pushed threaded into one server, both languages' figures side by side.

    make memory                                   # the development half (LOCOMO=path/to/locomo10.json)
    .venv/bin/python bench/memory.py --data path/to/locomo10.json [--conversations conv-26,conv-30]
        [--modes threaded,flat] [--paths default,strong,primaries,building] [--store postgresql] [--loco]
        [--ablations] [--twin DIR] [--name memory]

``--data`` takes the public ``locomo10.json`` (a list of samples with ``sample_id``) or a folder of
``conv-*.json`` files, one sample each.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import datetime
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from common import ROOT, TMP, app_parts, machine, quiet_service_logs, service_rev, service_src, write_json

DEFAULT_DATA = ROOT.parent / "shared" / "eval" / "locomo-dev"
DEV = ("conv-26", "conv-30", "conv-41", "conv-42", "conv-43")      # the development half; the rest is held out
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
        import requests
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

    def search(self, query: str, **kind) -> list[dict]:
        rv = self.s.post(f"{self.url}/mcp/search", json={"query": query, "top_k": 10, **kind}, timeout=60)
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

    def search(self, query: str, **kind) -> list[dict]:
        rv = self.client.post("/mcp/search", json={"query": query, "top_k": 10, **kind}, headers=self.headers)
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


def ask(api: Http, sample: dict, **kind) -> list[tuple[dict, list, list]]:
    """(question, the top 10's dia_ids, their CIDs) of every question."""
    out = []
    for q in questions(sample):
        found = api.search(q["question"], **kind)
        out.append((q, [(r.get("metadata") or {}).get("dia_id") for r in found], [r["cid"] for r in found]))
    return out


def agreement(runs: list, base: list) -> float:
    """The share of questions whose top 10 (CIDs, in order) is ``base``'s."""
    return round(sum(a[2] == b[2] for a, b in zip(runs, base)) / max(1, len(base)), 3)


def wait_indexed(url: str, keys: dict, timeout: float = 300) -> None:
    """Until no tenant's default search lacks a unit (read index caught up): answers as a steady service's."""
    import requests
    deadline = time.monotonic() + timeout
    for key in keys.values():
        while True:
            rv = requests.post(f"{url}/mcp/search", json={"query": "zzzz", "top_k": 1},
                               headers={"Authorization": f"Bearer {key}"}, timeout=30).json()
            if rv["freshness"]["index_pending"] == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.5)


def wait_read_index(data: Path, tenants: list[str], timeout: float = 300) -> None:
    """Until every tenant's read index is built and serves default searches (while one is being built the
    primaries answer: the ``building`` path, measured on its own)."""
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


def run_http(src: Path, samples: dict, modes: list[str], store_env: dict, paths: list[str],
             replicas: bool = True) -> dict:
    """Push every (conversation, mode) into its tenant of one gunicorn, then ask every question, by each of
    ``paths`` this server answers (default, strong). Returns {(mode, path): [(question, dia_ids, cids)]}."""
    import http_bench as hb
    data = Path(tempfile.mkdtemp(prefix="memory-", dir=TMP))
    keys = {tenant_of(s, m): f"memory-bench-key-{tenant_of(s, m)}" for s in samples for m in modes}
    port = hb.free_port()
    env = {} if replicas else {"CONTEXT_REPLICAS": "false"}
    proc = hb.start_gunicorn(src, "service:create_app()", port, "memory-service.log", str(src),
                             CONTEXT_DATA_DIR=str(data),
                             CONTEXT_API_KEYS=";".join(f"{k}:{t}:push+search" for t, k in keys.items()),
                             **store_env, **env)
    url = f"http://127.0.0.1:{port}"
    kinds = {"default": {}, "strong": {"consistency": "strong"}}
    try:
        hb.wait_ready(port)
        now = anchor()
        for sid, sample in samples.items():
            for mode in modes:
                n = push_all(Http(url, keys[tenant_of(sid, mode)]), sample, mode, now)
                print(f"   pushed {sid} {mode}: {n} units", flush=True)
        if replicas:
            wait_read_index(data, list(keys))
        wait_indexed(url, keys)
        return {(mode, path): [r for sid, s in samples.items()
                               for r in ask(Http(url, keys[tenant_of(sid, mode)]), s, **kinds[path])]
                for mode in modes for path in paths}
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


# --- in process: the read index not built yet, leave-one-conversation-out, ablations -----------------------
class Memory:
    """Every (conversation, mode) pushed once into an in-process app (its maintainer's passes run here), for
    questions asked many times with the ranking's constants changed in between (``weights``)."""

    def __init__(self, samples: dict, modes: list[str], config: dict | None = None, read_index: bool = True):
        quiet_service_logs()
        from service import create_app
        self.samples, self.modes = samples, modes
        self.data = Path(tempfile.mkdtemp(prefix="memory-ip-", dir=TMP))
        keys = {tenant_of(s, m): f"memory-bench-key-{tenant_of(s, m)}" for s in samples for m in modes}
        # (no rate limit: a grid asks every question many times a minute)
        self.app = create_app({"data_dir": str(self.data), "background": False, "rate_limit": "off", **(config or {}),
                               "api_keys": ";".join(f"{k}:{t}:push+search" for t, k in keys.items())})
        client = self.app.test_client()
        self.api = {t: InProcess(client, k) for t, k in keys.items()}
        now = anchor()
        for sid, sample in samples.items():
            for mode in modes:
                push_all(self.api[tenant_of(sid, mode)], sample, mode, now)
        maintenance = app_parts(self.app).maintenance
        if not read_index:      # the state of a read index still being built: the primaries answer
            maintenance.sync_read_index = lambda writer: 0
        while maintenance.run_once():
            pass

    def ask(self, mode: str, **kind) -> dict[str, list]:
        """Per conversation, its questions' (question, dia_ids, cids)."""
        return {sid: ask(self.api[tenant_of(sid, mode)], s, **kind) for sid, s in self.samples.items()}

    def close(self) -> None:
        app_parts(self.app).shutdown()
        shutil.rmtree(self.data, ignore_errors=True)


@contextlib.contextmanager
def weights(**changed):
    """The ranking's constants (service/ranking/threads.py, and rank.py's copies) changed for the block."""
    from service.ranking import rank, threads
    saved = {k: getattr(threads, k) for k in changed}
    try:
        for k, v in changed.items():
            setattr(threads, k, v)
            if hasattr(rank, k):
                setattr(rank, k, v)
        yield
    finally:
        for k, v in saved.items():
            setattr(threads, k, v)
            if hasattr(rank, k):
                setattr(rank, k, v)


WEIGHTS = ("THREAD", "NEAR_1", "NEAR_2", "ASKED", "NAMED", "LENGTH")


def run_loco(samples: dict) -> dict:
    """Leave one conversation out over a grid of the ranking's weights (each at 0, 0.5x, 1x and 1.5x of the
    shipped value, one at a time): per conversation the setting best on the other four (evidence R@10 over their
    questions), measured on it; the mean over conversations beside the shipped weights' mean."""
    from service.ranking import threads
    mem = Memory(samples, ["threaded"])
    grid = {"shipped": {}}
    for name in WEIGHTS:
        for f in (0.0, 0.5, 1.5):
            grid[f"{name} x{f}"] = {name: round(getattr(threads, name) * f, 3)}
    per: dict[str, dict[str, list]] = {}
    for label, change in grid.items():
        with weights(**change):
            per[label] = mem.ask("threaded")
    mem.close()
    folds = {}
    for held in samples:
        train = [s for s in samples if s != held]
        chosen = max(grid, key=lambda g: (score([r[:2] for s in train for r in per[g][s]])["R@10"], g == "shipped"))
        folds[held] = {"chosen": chosen, "R@10": score([r[:2] for r in per[chosen][held]])["R@10"],
                       "R@5": score([r[:2] for r in per[chosen][held]])["R@5"],
                       "shipped R@10": score([r[:2] for r in per["shipped"][held]])["R@10"]}
        print(f"   {held}: chose {chosen!r} on the other four, R@10 {folds[held]['R@10']:.3f} "
              f"(shipped {folds[held]['shipped R@10']:.3f})", flush=True)
    mean = lambda key: round(sum(f[key] for f in folds.values()) / len(folds), 3)   # noqa: E731
    return {"grid": list(grid), "folds": folds, "mean R@10": mean("R@10"), "mean R@5": mean("R@5"),
            "shipped mean R@10": mean("shipped R@10")}


ABLATIONS = {
    # name: the constants changed (service/ranking/threads.py)
    "BM25 alone (every weight 0; heads still below their turns)": {k: 0.0 for k in WEIGHTS},
    "no thread evidence (THREAD 0)": {"THREAD": 0.0},
    "no near evidence at place ± 1 (NEAR_1 0)": {"NEAR_1": 0.0},
    "no near evidence at place ± 2 (NEAR_2 0, WINDOW 1)": {"NEAR_2": 0.0, "WINDOW": 1},
    "no asked evidence (ASKED 0)": {"ASKED": 0.0},
    "no named source (NAMED 0)": {"NAMED": 0.0},
    "no length prior (LENGTH 0)": {"LENGTH": 0.0},
    "no neighbors pulled in (PULL 0)": {"PULL": 0},
    "neighbors of the pool's best 20 pulled in (PULL 20)": {"PULL": 20},
    "pool of 100": {"POOL": 100},
    "the weights before issue 48 (thread 0.6, near 0.4 at ± 1 only, nothing else)":
        {"THREAD": 0.6, "NEAR_1": 0.4, "NEAR_2": 0.0, "WINDOW": 1, "ASKED": 0.0, "NAMED": 0.0, "LENGTH": 0.0},
}


def run_ablations(samples: dict, modes: list[str]) -> dict:
    mem = Memory(samples, modes)
    out = {}
    for name, change in {"kept (as shipped)": {}, **ABLATIONS}.items():
        with weights(**change):
            out[name] = {mode: score([r[:2] for runs in mem.ask(mode).values() for r in runs]) for mode in modes}
        print(f"   {name:60s} " + "  ".join(f"{m} R@5 {out[name][m]['R@5']:.3f} R@10 {out[name][m]['R@10']:.3f}"
                                            for m in modes), flush=True)
    mem.close()
    return out


def run_building(samples: dict) -> list:
    """Default searches while every tenant's read index is still being built (the primaries answer)."""
    mem = Memory(samples, ["threaded"], read_index=False)
    try:
        return [r for runs in mem.ask("threaded").values() for r in runs]
    finally:
        mem.close()


# --- main ---------------------------------------------------------------------------------------------
def table(rows: dict) -> str:
    head = "| system | R@1 | R@5 | R@10 | R@10 by category: " + " / ".join(CATEGORIES.values()) + " |"
    lines = [head, "|---|---|---|---|---|"]
    for name, r in rows.items():
        cats = " / ".join(f"{r['R@10_by_category'].get(c, 0):.3f}" for c in CATEGORIES.values())
        lines.append(f"| {name} | {r['R@1']:.3f} | {r['R@5']:.3f} | {r['R@10']:.3f} | {cats} |")
    return "\n".join(lines)


def run_paths(src: Path, samples: dict, modes: list[str], paths: list[str], store_env: dict) -> dict:
    """The service over HTTP by every path asked for: {system name: figures}, agreement with the default path."""
    runs = run_http(src, samples, modes, store_env, [p for p in paths if p in ("default", "strong")] or ["default"])
    if "primaries" in paths:
        print("== a second server with CONTEXT_REPLICAS=false", flush=True)
        runs[("threaded", "primaries")] = run_http(src, samples, ["threaded"], store_env, ["default"],
                                                   replicas=False)[("threaded", "default")]
    if "building" in paths:
        print("== in process, default searches while the read index is being built", flush=True)
        runs[("threaded", "building")] = run_building(samples)
    out = {}
    for (mode, path), got in runs.items():
        name = f"service, {mode} push" + ("" if path == "default" else f", {path} path")
        out[name] = score([r[:2] for r in got])
        if path != "default" and (mode, "default") in runs:
            out[name]["top 10 as the default path's"] = agreement(got, runs[(mode, "default")])
    return out


def run_twin(src: Path, folder: Path, store_env: dict) -> dict:
    """The Chinese twin and its English original, threaded, in one server: both languages' figures."""
    twins = {}
    for lang in ("zh", "en"):
        for sid, sample in load(folder / f"medium_locomo_{lang}.json", None).items():
            twins[f"{sid}-{lang}"] = sample
    runs = run_http(src, twins, ["threaded"], store_env, ["default"])[("threaded", "default")]
    by_lang: dict[str, list] = {"en": [], "zh": []}
    at = 0
    for sid, sample in twins.items():        # (run_http asks the samples in this order)
        n = len(questions(sample))
        by_lang[sid[-2:]] += [r[:2] for r in runs[at:at + n]]
        at += n
    return {f"service, threaded push, {label}": score(by_lang[lang])
            for lang, label in (("en", "English"), ("zh", "Chinese"))}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(DEFAULT_DATA), help="locomo10.json, or a folder of conv-*.json")
    ap.add_argument("--conversations", default="",
                    help="sample ids (default: the development half, " + ",".join(DEV) + ", where the data holds it)")
    ap.add_argument("--modes", default="threaded,flat")
    ap.add_argument("--paths", default="default", help="default,strong,primaries,building")
    ap.add_argument("--store", choices=("sqlite", "postgresql"), default="sqlite")
    ap.add_argument("--loco", action="store_true")
    ap.add_argument("--ablations", action="store_true")
    ap.add_argument("--twin", default="", help="the folder of the Chinese twin (medium_locomo_{zh,en}.json)")
    ap.add_argument("--no-baselines", action="store_true")
    ap.add_argument("--service-src", default="worktree")
    ap.add_argument("--name", default="memory")
    ap.add_argument("--check-data", action="store_true", help="only check that the data holds the conversations")
    a = ap.parse_args(argv)
    samples = load(Path(a.data), [n for n in a.conversations.split(",") if n] or None)
    if not a.conversations and set(DEV) <= set(samples):
        samples = {n: samples[n] for n in DEV}
    if a.check_data:
        print(f"{a.data}: {len(samples)} conversations, {sum(len(questions(s)) for s in samples.values())} questions")
        return
    src = service_src(a.service_src)
    modes = [m for m in a.modes.split(",") if m]
    out = {"machine": machine(), "service_rev": service_rev(src), "data": os.path.basename(a.data.rstrip("/")),
           "conversations": list(samples), "questions": sum(len(questions(s)) for s in samples.values()),
           "store": a.store, "harness": "evidence recall@k over dia_ids, top_k 10, one plain default search per "
                                        "question (categories 1-4)", "systems": {}}
    cluster = None
    try:
        store_env = {}
        if a.store == "postgresql":
            from servers import pg_cluster
            cluster = pg_cluster(TMP / "memory-pg-cluster")
            store_env = {"CONTEXT_STORE": cluster.primary_url, "CONTEXT_STORE_REPLICA": cluster.standby_url}
        print(f"== service ({a.store}) over HTTP: {', '.join(samples)}", flush=True)
        out["systems"].update(run_paths(src, samples, modes, [p for p in a.paths.split(",") if p], store_env))
        if a.twin:
            print("== the Chinese twin and its English original", flush=True)
            out["twin"] = run_twin(src, Path(a.twin), store_env)
    finally:
        if cluster is not None:
            cluster.stop()
    if not a.no_baselines:
        out["systems"]["bm25s (English stemmer, stopwords), k1 1.2 b 0.75"] = run_bm25s(samples)
        out["systems"]["tantivy en_stem, its BM25"] = run_tantivy(samples)
    print(table(out["systems"]), flush=True)
    if a.twin:
        print(table(out["twin"]), flush=True)
    if a.loco:
        print("== leave one conversation out, in process", flush=True)
        out["loco"] = run_loco(samples)
        print(f"   mean R@10 {out['loco']['mean R@10']:.3f} (shipped weights {out['loco']['shipped mean R@10']:.3f}), "
              f"R@5 {out['loco']['mean R@5']:.3f}", flush=True)
    if a.ablations:
        print("== ablations, in process (the service's code, one component changed)", flush=True)
        out["ablations"] = run_ablations(samples, modes)
    write_json(a.name, out)


if __name__ == "__main__":
    main()
