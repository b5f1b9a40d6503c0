"""Ranking levers beyond bag-of-words BM25 (issue 28), measured offline on the judged sets.

The service's ranking is reproduced exactly, in numpy: its tokens (``service.tokenize.Tokenizer``,
defaults), its query terms (distinct, first seen, at most ``MAX_QUERY_TERMS``) and its BM25 (k1 1.2,
b 0.75, Lucene's idf, exact lengths; ties by document order), over each set's documents as
bench/quality.py makes them (``title + "\\n" + text``). The baseline must equal quality.py's
``bm25s-service-tokens`` rows (and its ``service`` rows up to ties); the measures, computed here, are
checked per query against ranx's on it. Each lever is then measured alone against that baseline:

- ``rm3``: pseudo-relevance feedback as in Anserini's Rm3Reranker, a second retrieval with the
  weighted query; ``rocchio``: the same with the mean of the top documents' tf-idf vectors;
- ``prox``: BM25TP (Büttcher, Clarke and Lushman 2006) over the top 100; ``window``: ordered windows
  of adjacent query-term pairs, the same way;
- ``dfshare``: query terms in more than a share t of the documents weighted by f; ``idfpow``: each
  query term weighted by idf^p;
- ``nostop``: no stopword list at index or query time (``Tokenizer(stopwords=None)``), also with
  ``dfshare`` on top (``nostop-dfshare``), the list replaced by collection statistics;
- ``bigram``: Chinese out-of-vocabulary fallback, character bigrams of runs of single-character Han
  tokens added at index and query time (an index change; its size cost is recorded);
- ``bm25params``: other k1 and b (the grid holds the service's 1.2 / 0.75); ``bm25plus``, ``bm25l``:
  Lv and Zhai's (2011) lower-bounded term-frequency parts, BM25+ (+ delta per matched term) and BM25L
  (shifted length-normalised tf), at the service's k1 and b;
- ``qtf``: query terms weighted by their count in the question (the service: distinct terms, 1 each);
- ``searchmode``: the service already indexes jieba's search mode (``cut_for_search``: each word longer
  than 2 characters also as its 2- and 3-character dictionary substrings); rebuilt here from the plain
  cut (checked equal to the service's tokens on a sample), the lever is either direction: no search
  mode (the plain cut's words only) or every dictionary substring of the longer words (index changes;
  their size is recorded);
- ``fusion``: reciprocal-rank fusion of the baseline with an RM3 ranking (partner and k chosen on A);
- ``bm25l-prox``: the two levers best on A in both sets together (BM25L, then BM25TP over its top 100);
- ``field``: source/metadata as a second field: not measurable here (no per-document metadata).

Every lever's grid is run on each set's queries split in two halves by sha256 of the query id (even:
A, odd: B). The configuration best on A (nDCG@10) is the one reported; every figure is given on A, B
and all, with a paired sign-flip randomization test against the baseline on B and on all.
Tokenized corpora are cached in bench/results/tmp/levers-<set>[-<variant>].pkl. Runs in minutes.

    .venv/bin/python bench/levers.py [--sets stard,scifact] [--levers rm3,rocchio,prox,...]
        [--service-src head|worktree|<rev>] [--name levers] [--no-write]
"""
from __future__ import annotations

import argparse
import copy
import hashlib
import pickle
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from common import ROOT, TMP, machine, service_rev, service_src, write_json
from quality import EVAL_DIR, METRICS, TOP_K, content_of, load_set

K1, B = 1.2, 0.75           # checked against service.ranking.bm25 at start-up
DF_FEEDBACK_CUT = 0.1       # Anserini's feedback-term filter: terms in more than 10 % of documents are skipped
PERMUTATIONS = 10_000
HALVES = ("A", "B", "all")


# --- tokenizers --------------------------------------------------------------------------------
def han_bigram_tokenizer(break_at_stopwords: bool, **kwargs):
    """The service's tokenizer, plus the character bigrams of every run of single-character Han tokens
    in jieba's output (a run is cut at a stopword if ``break_at_stopwords``); the bigrams follow the run."""
    from service.tokenize import Tokenizer

    class HanBigramTokenizer(Tokenizer):
        def __init__(self):
            super().__init__(**kwargs)
            cut, stop = self._cut, self.stopwords

            def cut_with_bigrams(han: str):
                run: list[str] = []
                for w in cut(han):
                    if len(w) == 1 and not (break_at_stopwords and w in stop):
                        run.append(w)
                    else:
                        yield from (a + b for a, b in zip(run, run[1:]))
                        run = []
                    yield w
                yield from (a + b for a, b in zip(run, run[1:]))
            self._cut = cut_with_bigrams

    return HanBigramTokenizer()


def search_mode_tokenizer(max_sub: int | None, **kwargs):
    """The service's tokenizer with its Han words made from jieba's plain cut (HMM off, the same
    segmenter and dictionary), each word longer than 2 characters followed by its substrings of 2 to
    ``max_sub`` characters (at most its length - 1) that are dictionary words: ``max_sub`` 3 is jieba's
    search mode (``cut_for_search``, what the service already uses), 0 no search mode at all (only the
    plain cut's words), None every dictionary substring (search mode extended to 4+ characters). The
    substrings come before their word, as in jieba's search mode."""
    from service.tokenize import Tokenizer

    class SearchModeTokenizer(Tokenizer):
        def __init__(self):
            super().__init__(**kwargs)
            if self.segmenter == "rjieba":
                import rjieba
                plain, has_word = (lambda s: rjieba.cut(s, False)), rjieba.has_word
            else:
                import jieba
                plain, has_word = (lambda s: jieba.cut(s, HMM=False)), (lambda w: bool(jieba.dt.FREQ.get(w)))
            known: dict[str, bool] = {}

            def in_dict(w: str) -> bool:
                v = known.get(w)
                if v is None:
                    v = known[w] = bool(has_word(w))
                return v

            def cut_with_subwords(han: str):
                for w in plain(han):
                    n = len(w)
                    if n > 2:
                        for size in range(2, min(n - 1, n if max_sub is None else max_sub) + 1):
                            for i in range(n - size + 1):
                                if in_dict(w[i:i + size]):
                                    yield w[i:i + size]
                    yield w
            self._cut = cut_with_subwords

    return SearchModeTokenizer()


SEARCH_MODE = {"search-mode-py": 3, "no-search-mode": 0, "search-mode-all": None}


def make_tokenizer(variant: str):
    from service.tokenize import Tokenizer
    if variant == "service":
        return Tokenizer()
    if variant == "nostop":
        return Tokenizer(stopwords=None)
    if variant in ("bigram", "bigram-stopbreak"):
        return han_bigram_tokenizer(break_at_stopwords=variant == "bigram-stopbreak")
    if variant in SEARCH_MODE:
        return search_mode_tokenizer(SEARCH_MODE[variant])
    raise ValueError(variant)


# --- the index: the service's BM25, exhaustively ----------------------------------------------
class Index:
    """Term-major postings with each posting's BM25 tf part, document-major term vectors, and every
    document's token ids in order (positions)."""

    def __init__(self, doc_ids: list[str], terms: list[str], flat: np.ndarray, offsets: np.ndarray):
        from scipy import sparse
        self.doc_ids, self.terms, self.flat, self.offsets = doc_ids, terms, flat, offsets
        self.vocab = {t: i for i, t in enumerate(terms)}
        self.n = len(doc_ids)
        self.lengths = np.diff(offsets).astype(np.float64)
        self.avgdl = float(self.lengths.mean())
        rows = np.repeat(np.arange(self.n, dtype=np.int32), np.diff(offsets))
        tf = sparse.coo_matrix((np.ones(len(flat), np.int32), (rows, flat)), shape=(self.n, len(terms))).tocsr()
        tf.sum_duplicates()
        self.by_doc = tf
        by_term = tf.tocsc()
        self.t_ptr, self.t_doc = by_term.indptr, by_term.indices
        self.df = np.diff(self.t_ptr)
        self.df_share = self.df / self.n
        self.idf = np.log(1 + (self.n - self.df + 0.5) / (self.df + 0.5))
        self.t_tf = by_term.data.astype(np.float64)
        self._set_tf_part(K1, B, "bm25", 0.0)

    def _set_tf_part(self, k1: float, b: float, form: str, delta: float) -> None:
        """``norm`` (K of each document) and ``t_sat`` (each posting's term-frequency part): ``bm25``;
        ``bm25+`` (Lv and Zhai 2011), tf(k1 + 1)/(tf + K) + delta for every matched term; ``bm25l`` (Lv and
        Zhai 2011), (k1 + 1)(c + delta)/(k1 + c + delta) with c = tf/(1 - b + b·dl/avgdl)."""
        self.norm = k1 * (1 - b + b * self.lengths / self.avgdl)
        tf = self.t_tf
        if form == "bm25":
            self.t_sat = tf * (k1 + 1) / (tf + self.norm[self.t_doc])
        elif form == "bm25+":
            self.t_sat = tf * (k1 + 1) / (tf + self.norm[self.t_doc]) + delta
        elif form == "bm25l":
            c = tf / (1 - b + b * self.lengths[self.t_doc] / self.avgdl)
            self.t_sat = (k1 + 1) * (c + delta) / (k1 + c + delta)
        else:
            raise ValueError(form)

    def retuned(self, k1: float = K1, b: float = B, form: str = "bm25", delta: float = 0.0) -> "Index":
        """The same index with another term-frequency part (shares everything else; ``_set_tf_part``)."""
        ix = copy.copy(self)
        ix._set_tf_part(k1, b, form, delta)
        return ix

    @property
    def postings(self) -> int:
        return int(self.by_doc.nnz)

    def ids(self, terms: list[str]) -> list[int]:
        return [self.vocab[t] for t in terms if t in self.vocab]

    def scores(self, ids, weights=None) -> np.ndarray:
        """BM25 of every document; each term's contribution times its weight."""
        s = np.zeros(self.n)
        for i, t in enumerate(ids):
            lo, hi = self.t_ptr[t], self.t_ptr[t + 1]
            w = self.idf[t] if weights is None else self.idf[t] * weights[i]
            s[self.t_doc[lo:hi]] += w * self.t_sat[lo:hi]
        return s

    @staticmethod
    def top(s: np.ndarray, k: int = TOP_K) -> np.ndarray:
        """The k best documents with a positive score, best first, ties by document order."""
        cand = np.flatnonzero(s > 0)
        if len(cand) > k:
            kth = np.partition(s[cand], len(cand) - k)[len(cand) - k]
            cand = cand[s[cand] >= kth]
        return cand[np.lexsort((cand, -s[cand]))[:k]]

    def doc_vector(self, d: int) -> tuple[np.ndarray, np.ndarray]:
        lo, hi = self.by_doc.indptr[d], self.by_doc.indptr[d + 1]
        return self.by_doc.indices[lo:hi], self.by_doc.data[lo:hi].astype(np.float64)


def load_index(set_name: str, variant: str, corpus) -> Index:
    """The set's corpus tokenized by ``variant``, from bench/results/tmp/levers-<set>[-<variant>].pkl when
    that was made by the same tokenizer source from the same corpus file."""
    import service.tokenize
    corpus_file = EVAL_DIR / set_name / "corpus.jsonl.gz"
    st = corpus_file.stat() if corpus_file.exists() else None
    key = {"tokenize_sha256": hashlib.sha256(Path(service.tokenize.__file__).read_bytes()).hexdigest(),
           "levers_variant": variant, "corpus": [str(corpus_file), st and st.st_size, st and st.st_mtime_ns]}
    path = TMP / (f"levers-{set_name}.pkl" if variant == "service" else f"levers-{set_name}-{variant}.pkl")
    if path.exists():
        with open(path, "rb") as fh:
            cached = pickle.load(fh)
        if cached["key"] == key:
            return Index(cached["doc_ids"], cached["terms"], cached["flat"], cached["offsets"])
    tok = make_tokenizer(variant)
    vocab: dict[str, int] = {}
    lengths, chunks = [], []
    for _, title, text in corpus:
        toks = tok.tokens(content_of(title, text))
        chunks.append(np.fromiter((vocab.setdefault(t, len(vocab)) for t in toks), np.int32, len(toks)))
        lengths.append(len(toks))
    flat = np.concatenate(chunks) if chunks else np.zeros(0, np.int32)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    data = {"key": key, "doc_ids": [d for d, _, _ in corpus], "terms": list(vocab), "flat": flat, "offsets": offsets}
    TMP.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        pickle.dump(data, fh, protocol=pickle.HIGHEST_PROTOCOL)
    return Index(data["doc_ids"], data["terms"], flat, offsets)


# --- one set -----------------------------------------------------------------------------------
@dataclass
class Query:
    qid: str
    terms: list[str]       # the service's query terms (capped)
    ids: list[int]         # those the index holds
    qtf: list[int]         # each of those ids' count among the question's tokens (the service uses 1)


def base_of(ix: Index, queries: list[Query]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each query's top documents over ``ix`` with their scores (a lever's baseline)."""
    out = {}
    for q in queries:
        s = ix.scores(q.ids)
        docs = ix.top(s)
        out[q.qid] = (docs, s[docs])
    return out


@dataclass
class Judged:
    """One judged set under one tokenization: its index, queries, baseline ranking and halves."""
    name: str
    variant: str
    ix: Index
    queries: list[Query]
    qrels: dict
    half: dict[str, str]
    base: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)   # qid -> (docs, scores)

    @classmethod
    def build(cls, name: str, variant: str, corpus, queries, qrels) -> "Judged":
        from service.ranking.results import MAX_QUERY_TERMS
        ix = load_index(name, variant, corpus)
        tok = make_tokenizer(variant)
        qs = []
        for qid, text in queries:
            tokens = tok.tokens(text)
            terms = list(dict.fromkeys(tokens))[:MAX_QUERY_TERMS]
            assert terms == tok.query_terms(text)[:MAX_QUERY_TERMS]
            counts = Counter(tokens)
            ids = ix.ids(terms)
            qs.append(Query(qid, terms, ids, [counts[ix.terms[t]] for t in ids]))
        half = {qid: "A" if int(hashlib.sha256(qid.encode()).hexdigest(), 16) % 2 == 0 else "B" for qid, _ in queries}
        return cls(name, variant, ix, qs, qrels, half, base_of(ix, qs))

    def ranking(self, weighted=None, ix: Index | None = None) -> dict[str, np.ndarray]:
        """Full retrievals, one per query: ``weighted(q)`` gives (term ids, weights) (default: the
        query's terms, unweighted); over ``ix`` (default: this set's index)."""
        ix = ix or self.ix
        out = {}
        for q in self.queries:
            ids, weights = weighted(q) if weighted is not None else (q.ids, None)
            out[q.qid] = ix.top(ix.scores(ids, weights))
        return out

    def rescored(self, extra: dict[str, np.ndarray], lam: float) -> dict[str, np.ndarray]:
        """The baseline's top 100 re-ordered by score + lam * extra (ties by document order)."""
        out = {}
        for qid, (docs, scores) in self.base.items():
            out[qid] = docs[np.lexsort((docs, -(scores + lam * extra[qid])))]
        return out


# --- measures ----------------------------------------------------------------------------------
DISCOUNT = 1 / np.log2(np.arange(2, 12))     # ranks 1-10


class Measures:
    """Per-query measures of rankings over one set's queries (nDCG@10 with gain = judgment, as ranx's
    ``ndcg``; MRR@10; recall@10 and @100), and their means on A, B and all. ``check`` compares them with
    ranx itself (which takes seconds per ranking where this takes milliseconds)."""

    def __init__(self, j: Judged):
        self.j = j
        index_of = {d: i for i, d in enumerate(j.ix.doc_ids)}
        self.rel = {q: {index_of.get(d, -1 - k): g for k, (d, g) in enumerate(rels.items())}
                    for q, rels in j.qrels.items()}
        self.idcg = {q: float((np.sort(list(rels.values()))[::-1][:10] * DISCOUNT[:min(10, len(rels))]).sum())
                     for q, rels in j.qrels.items()}
        self.members = {"A": [q for q in j.qrels if j.half[q] == "A"], "B": [q for q in j.qrels if j.half[q] == "B"],
                        "all": list(j.qrels)}

    def per_query(self, ranked: dict[str, np.ndarray]) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {m: {} for m in METRICS}
        for qid, rel in self.rel.items():
            docs = ranked.get(qid)
            gains = np.array([rel.get(d, 0) for d in (docs[:TOP_K].tolist() if docs is not None else [])], float)
            top = gains[:10]
            hits = np.flatnonzero(top > 0)
            out["ndcg@10"][qid] = float((top * DISCOUNT[:len(top)]).sum() / self.idcg[qid])
            out["mrr@10"][qid] = 1.0 / (hits[0] + 1) if len(hits) else 0.0
            out["recall@10"][qid] = len(hits) / len(rel)
            out["recall@100"][qid] = float((gains > 0).sum()) / len(rel)
        return out

    def check(self, ranked: dict[str, np.ndarray], pq: dict) -> float:
        """The largest difference from ranx's per-query figures for the same ranking."""
        from ranx import Qrels, Run, evaluate
        doc_ids = self.j.ix.doc_ids
        run = {}
        for qid in self.j.qrels:
            docs = ranked.get(qid)
            # scores from rank, so ranx keeps this order
            run[qid] = ({doc_ids[d]: float(len(docs) - i) for i, d in enumerate(docs)}
                        if docs is not None and len(docs) else {"__no_result__": 0.0})
        r = Run.from_dict(run)
        evaluate(Qrels.from_dict(self.j.qrels), r, list(METRICS))
        return max(abs(float(r.scores[m][q]) - pq[m][q]) for m in METRICS for q in self.j.qrels)

    def summary(self, pq: dict) -> dict:
        return {h: {m: round(float(np.mean([pq[m][q] for q in qs])), 4) for m in METRICS}
                for h, qs in self.members.items()}

    def p_value(self, pq: dict, base: dict, half: str, metric: str = "ndcg@10", seed: int = 1) -> float:
        """Two-sided paired sign-flip randomization test of the mean difference."""
        qs = self.members[half]
        d = np.array([pq[metric][q] - base[metric][q] for q in qs])
        if not d.any():
            return 1.0
        signs = np.random.default_rng(seed).choice((-1.0, 1.0), size=(PERMUTATIONS, len(d)))
        return round(float((np.abs(signs @ d) >= abs(d.sum()) - 1e-12).mean()), 4)


# --- levers ------------------------------------------------------------------------------------
def rm3_model(j: Judged, q: Query, fb_docs: int, fb_terms: int) -> dict[int, float]:
    """Anserini's relevance model: each of the top fb_docs documents' term vector (terms in at most
    10 % of documents; Anserini's [a-z0-9]{2,20} filter would drop every Chinese term, so it is not
    applied), pruned to its fb_terms most frequent, L1-normalised and weighted by the document's BM25
    score; summed, pruned to fb_terms, L1-normalised."""
    docs, scores = j.base[q.qid]
    rm: dict[int, float] = {}
    for d, score in zip(docs[:fb_docs], scores[:fb_docs]):
        terms, tfs = j.ix.doc_vector(int(d))
        keep = j.ix.df_share[terms] <= DF_FEEDBACK_CUT
        terms, tfs = terms[keep], tfs[keep]
        order = np.lexsort((terms, -tfs))[:fb_terms]
        terms, tfs = terms[order], tfs[order]
        norm = tfs.sum()
        if norm <= 0:
            continue
        for t, v in zip(terms.tolist(), (tfs / norm * score).tolist()):
            rm[t] = rm.get(t, 0.0) + v
    kept = sorted(rm.items(), key=lambda kv: (-kv[1], kv[0]))[:fb_terms]
    total = sum(v for _, v in kept)
    return {t: v / total for t, v in kept} if total > 0 else {}


def interpolated(q: Query, model: dict[int, float], orig_weight: float) -> tuple[list[int], list[float]]:
    """orig_weight × the query (L1: 1/|terms| each, over all its terms as Anserini's) + the rest × model."""
    w = {t: orig_weight / len(q.terms) for t in q.ids} if q.terms else {}
    for t, v in model.items():
        w[t] = w.get(t, 0.0) + (1 - orig_weight) * v
    return list(w), list(w.values())


def lever_rm3(j: Judged):
    for fb_docs in (5, 10, 20):
        for fb_terms in (10, 20):
            models = {q.qid: rm3_model(j, q, fb_docs, fb_terms) for q in j.queries}
            for orig_weight in (0.5, 0.7, 0.9):
                yield ({"fb_docs": fb_docs, "fb_terms": fb_terms, "orig_weight": orig_weight},
                       j.ranking(lambda q, ow=orig_weight, ms=models: interpolated(q, ms[q.qid], ow)))


def rocchio_centroid(j: Judged, q: Query, fb_docs: int, fb_terms: int) -> dict[int, float]:
    """The mean of the top fb_docs documents' L2-normalised tf-idf vectors (same 10 % df filter),
    its fb_terms largest entries."""
    docs, _ = j.base[q.qid]
    acc: dict[int, float] = {}
    for d in docs[:fb_docs]:
        terms, tfs = j.ix.doc_vector(int(d))
        keep = j.ix.df_share[terms] <= DF_FEEDBACK_CUT
        terms, v = terms[keep], tfs[keep] * j.ix.idf[terms[keep]]
        norm = np.sqrt((v * v).sum())
        if norm <= 0:
            continue
        for t, x in zip(terms.tolist(), (v / norm / fb_docs).tolist()):
            acc[t] = acc.get(t, 0.0) + x
    return dict(sorted(acc.items(), key=lambda kv: (-kv[1], kv[0]))[:fb_terms])


def rocchio_query(q: Query, centroid: dict[int, float], beta: float) -> tuple[list[int], list[float]]:
    """alpha (1) × the L2-normalised query + beta × the centroid."""
    w = {t: 1 / np.sqrt(len(q.terms)) for t in q.ids} if q.terms else {}
    for t, v in centroid.items():
        w[t] = w.get(t, 0.0) + beta * v
    return list(w), list(w.values())


def lever_rocchio(j: Judged):
    for fb_docs in (5, 10, 20):
        for fb_terms in (10, 20):
            cents = {q.qid: rocchio_centroid(j, q, fb_docs, fb_terms) for q in j.queries}
            for beta in (0.25, 0.5, 0.75, 1.0):
                yield ({"fb_docs": fb_docs, "fb_terms": fb_terms, "beta": beta},
                       j.ranking(lambda q, bt=beta, cs=cents: rocchio_query(q, cs[q.qid], bt)))


def occurrences(j: Judged, q: Query, docs: np.ndarray, gap: int = 0):
    """The query terms' occurrences in ``docs`` (their token lists laid end to end, ``gap`` positions
    apart), in order: the document's rank, the position, the term's index in the sorted query ids."""
    qids = np.array(sorted(set(q.ids)), dtype=np.int32)
    starts, ends = j.ix.offsets[docs], j.ix.offsets[docs + 1]
    toks = np.concatenate([j.ix.flat[s:e] for s, e in zip(starts, ends)])
    rank = np.repeat(np.arange(len(docs)), ends - starts)
    hit = np.flatnonzero(np.isin(toks, qids))
    return rank[hit], hit + rank[hit] * gap, np.searchsorted(qids, toks[hit]), qids


def bm25tp(j: Judged, q: Query) -> np.ndarray:
    """Büttcher et al.'s term proximity over the baseline's top documents: for every two adjacent
    occurrences of different query terms at distance d, each term's accumulator gains the other's
    idf / d²; prox = Σ_t min(1, idf_t) · acc_t (k1 + 1) / (acc_t + K)."""
    docs, _ = j.base[q.qid]
    out = np.zeros(len(docs))
    if len(set(q.ids)) < 2 or not len(docs):
        return out
    rank, pos, local, qids = occurrences(j, q, docs)
    pair = (rank[1:] == rank[:-1]) & (local[1:] != local[:-1])
    a, b, r = local[:-1][pair], local[1:][pair], rank[1:][pair]
    inv = 1.0 / (pos[1:][pair] - pos[:-1][pair]) ** 2
    idf = j.ix.idf[qids]
    acc = np.zeros((len(docs), len(qids)))
    np.add.at(acc, (r, a), idf[b] * inv)
    np.add.at(acc, (r, b), idf[a] * inv)
    k = j.ix.norm[docs][:, None]
    return (np.minimum(1.0, idf)[None, :] * acc * (K1 + 1) / (acc + k)).sum(axis=1)


WINDOWS = (1, 2, 4, 8)


def ordered_windows(j: Judged, q: Query) -> dict[int, np.ndarray]:
    """For each window w: Σ over adjacent query-term pairs (t, u) (query order) of
    min(idf_t, idf_u) · c (k1 + 1) / (c + K), c = occurrences of t followed by u within w positions."""
    docs, _ = j.base[q.qid]
    out = {w: np.zeros(len(docs)) for w in WINDOWS}
    pairs = [(t, u) for t, u in zip(q.ids, q.ids[1:]) if t != u]
    if not pairs or not len(docs):
        return out
    gap = max(WINDOWS) + 1
    rank, pos, local, qids = occurrences(j, q, docs, gap)
    k = j.ix.norm[docs]
    for t, u in pairs:
        lt, lu = np.searchsorted(qids, t), np.searchsorted(qids, u)
        pt, pu = pos[local == lt], pos[local == lu]
        if not len(pt) or not len(pu):
            continue
        after = np.searchsorted(pu, pt, side="right")
        weight = min(j.ix.idf[t], j.ix.idf[u])
        for w in WINDOWS:
            matched = np.searchsorted(pu, pt + w, side="right") > after
            c = np.bincount(rank[local == lt][matched], minlength=len(docs))
            out[w] += weight * c * (K1 + 1) / (c + k)
    return out


def lever_prox(j: Judged):
    extra = {q.qid: bm25tp(j, q) for q in j.queries}
    for lam in (0.1, 0.25, 0.5, 1.0, 2.0, 4.0):
        yield {"lambda": lam}, j.rescored(extra, lam)


def lever_window(j: Judged):
    extras = {q.qid: ordered_windows(j, q) for q in j.queries}
    for w in WINDOWS:
        extra = {qid: e[w] for qid, e in extras.items()}
        for lam in (0.1, 0.25, 0.5, 1.0, 2.0):
            yield {"window": w, "lambda": lam}, j.rescored(extra, lam)


def df_weights(j: Judged, q: Query, share: float, factor: float) -> tuple[list[int], list[float] | None]:
    """Terms in more than ``share`` of the documents weighted by ``factor``, unless every term is (the
    query is then left as it is)."""
    common = [j.ix.df_share[t] > share for t in q.ids]
    if all(common):
        return q.ids, None
    return q.ids, [factor if c else 1.0 for c in common]


def lever_dfshare(j: Judged):
    for share in (0.01, 0.02, 0.05, 0.1, 0.2):
        for factor in (0.0, 0.25, 0.5):
            yield ({"df_share_over": share, "factor": factor},
                   j.ranking(lambda q, s=share, f=factor: df_weights(j, q, s, f)))


def lever_idfpow(j: Judged):
    for p in (-0.5, -0.25, 0.25, 0.5, 1.0, 1.5, 2.0):
        yield {"p": p}, j.ranking(lambda q, p=p: (q.ids, list(j.ix.idf[q.ids] ** p)))


def lever_variant(j: Judged):
    """A re-tokenized index (and queries), BM25 as the baseline: the whole lever is the variant."""
    yield {"tokens": j.variant}, {qid: docs for qid, (docs, _) in j.base.items()}


def lever_bm25params(j: Judged):
    """k1 and b of the service's BM25 (the grid holds the service's own 1.2 / 0.75)."""
    for k1 in (0.6, 0.9, 1.2, 1.5, 2.0):
        for b in (0.3, 0.4, 0.5, 0.6, 0.75, 0.9):
            yield {"k1": k1, "b": b}, j.ranking(ix=j.ix.retuned(k1, b))


def lever_bm25plus(j: Judged):
    for delta in (0.25, 0.5, 1.0):
        yield {"delta": delta}, j.ranking(ix=j.ix.retuned(form="bm25+", delta=delta))


def lever_bm25l(j: Judged):
    for delta in (0.25, 0.5, 1.0):
        yield {"delta": delta}, j.ranking(ix=j.ix.retuned(form="bm25l", delta=delta))


QTF_WEIGHTS = {
    "qtf": lambda c: c,
    "1+log": lambda c: 1 + np.log(c),
    "sqrt": np.sqrt,
    **{f"k3={k3}": (lambda c, k3=k3: (k3 + 1) * c / (k3 + c)) for k3 in (1, 2, 8)},   # BM25's query part
}


def lever_qtf(j: Judged):
    """Each query term weighted by a function of its count in the question (the service: 1 each)."""
    for name, f in QTF_WEIGHTS.items():
        yield {"weight": name}, j.ranking(lambda q, f=f: (q.ids, list(f(np.array(q.qtf, np.float64)))))


def rrf(a: np.ndarray, b: np.ndarray, k: float) -> np.ndarray:
    """Reciprocal-rank fusion of two rankings, Σ 1/(k + rank), the top 100 (ties by document order)."""
    s: dict[int, float] = {}
    for ranked in (a, b):
        for r, d in enumerate(ranked.tolist(), 1):
            s[d] = s.get(d, 0.0) + 1.0 / (k + r)
    docs = np.fromiter(s, np.int64, len(s))
    sc = np.fromiter(s.values(), np.float64, len(s))
    return docs[np.lexsort((docs, -sc))[:TOP_K]]


def lever_fusion(j: Judged):
    """RRF of the baseline with an RM3 ranking (fb_docs 10; the partner and k both chosen on A)."""
    for fb_terms in (10, 20):
        models = {q.qid: rm3_model(j, q, 10, fb_terms) for q in j.queries}
        for orig_weight in (0.7, 0.9):
            other = j.ranking(lambda q, ow=orig_weight, ms=models: interpolated(q, ms[q.qid], ow))
            for k in (10, 30, 60, 100):
                yield ({"partner": f"rm3 fb_docs=10 fb_terms={fb_terms} orig_weight={orig_weight}", "k": k},
                       {qid: rrf(docs, other[qid], k) for qid, (docs, _) in j.base.items()})


def lever_bm25l_prox(j: Judged):
    """The two levers best on A in both sets together: BM25L retrieval, then BM25TP (the same
    accumulators, with the baseline's K) added to the BM25L scores of its top 100."""
    for delta in (0.25, 0.5):
        ix = j.ix.retuned(form="bm25l", delta=delta)
        jl = copy.copy(j)
        jl.base = base_of(ix, j.queries)
        extra = {q.qid: bm25tp(jl, q) for q in j.queries}
        for lam in (0.1, 0.25, 0.5, 1.0, 2.0):
            yield {"delta": delta, "lambda": lam}, jl.rescored(extra, lam)


@dataclass(frozen=True)
class Lever:
    configs: object                     # Judged -> iterator of (params, ranking)
    cost: str
    variants: tuple[str, ...] = ("service",)


LEVERS = {
    "rm3": Lever(lever_rm3, "a second full retrieval with up to |q| + fb_terms terms, after reading the top "
                 "fb_docs documents' term vectors (the service would re-tokenize their content)"),
    "rocchio": Lever(lever_rocchio, "as rm3: a second retrieval with up to |q| + fb_terms terms, fb_docs "
                     "term vectors read"),
    "prox": Lever(lever_prox, "positions of the query terms in the top 100 documents (the service stores "
                  "no positions: re-tokenize 100 contents, or an index with positions); no new retrieval"),
    "window": Lever(lever_window, "as prox: positions in the top 100; no new retrieval"),
    "dfshare": Lever(lever_dfshare, "none (df is known at query time)"),
    "idfpow": Lever(lever_idfpow, "none (p < 0 flattens idf: the other direction, for where the optimum is)"),
    "nostop": Lever(lever_variant, "index change: every stopword indexed (more postings, longer lists "
                    "for the most common terms)", ("nostop",)),
    "nostop-dfshare": Lever(lever_dfshare, "index change as nostop; query-time weights free", ("nostop",)),
    "bigram": Lever(lever_variant, "index change: a bigram token per adjacent pair of single-character "
                    "Han tokens (tokens per document below)", ("bigram", "bigram-stopbreak")),
    "bm25params": Lever(lever_bm25params, "none (k1 and b are constants of the score)"),
    "bm25plus": Lever(lever_bm25plus, "none at query time: + delta·idf per matched term (the engines' "
                      "BM25 would need a custom rank function)"),
    "bm25l": Lever(lever_bm25l, "as bm25plus: another term-frequency formula, no new data"),
    "qtf": Lever(lever_qtf, "none (the question's token counts are at hand; the engines take per-term weights)"),
    "searchmode": Lever(lever_variant, "index change: the Han words of jieba's plain cut without (no-search-mode) "
                        "or with every (search-mode-all) dictionary substring of its longer words; the service "
                        "already indexes jieba's search mode, its 2- and 3-character substrings "
                        "(tokens per document below)", ("no-search-mode", "search-mode-all")),
    "fusion": Lever(lever_fusion, "as rm3 (a second full retrieval), plus merging the two top 100s"),
    "bm25l-prox": Lever(lever_bm25l_prox, "as prox (positions in the top 100), over BM25L's top 100"),
}
FIELD_NOTE = ("not measurable on these sets: their documents carry no per-document source or metadata "
              "(every unit would share one source), so a second field adds nothing to measure; not built")


# --- running -----------------------------------------------------------------------------------
def fmt_params(params: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in params.items()) or "-"


def print_row(set_name: str, lever: str, params: str, s: dict, took: float) -> None:
    print(f"{set_name:8} {lever:15} {params:42} nDCG@10 A {s['A']['ndcg@10']:.4f} B {s['B']['ndcg@10']:.4f} "
          f"all {s['all']['ndcg@10']:.4f}  R@100 all {s['all']['recall@100']:.4f}  ({took:.1f} s)", flush=True)


def run_lever(name: str, lever: Lever, judged: dict[str, Judged], base_pq: dict, m: Measures) -> dict:
    """Every configuration of the lever's grid (over each of its tokenizations); the best on A."""
    grid, pqs = [], []
    for variant in lever.variants:
        j = judged[variant]
        t0 = time.perf_counter()
        for params, ranked in lever.configs(j):
            pq = m.per_query(ranked)
            s = m.summary(pq)
            grid.append({"params": params, **s})
            pqs.append(pq)
            print_row(j.name, name, fmt_params(params), s, time.perf_counter() - t0)
            t0 = time.perf_counter()
    best = max(range(len(grid)), key=lambda i: (grid[i]["A"]["ndcg@10"], -i))
    chosen = grid[best]
    base = m.summary(base_pq)
    delta = {h: {k: round(chosen[h][k] - base[h][k], 4) for k in METRICS} for h in HALVES}
    return {"cost": lever.cost, "grid": grid, "chosen": chosen, "delta": delta,
            "p_ndcg@10": {h: m.p_value(pqs[best], base_pq, h) for h in ("B", "all")}}


def index_cost(judged: dict[str, Judged]) -> dict:
    return {v: {"tokens_per_doc": round(float(j.ix.lengths.mean()), 2), "postings": j.ix.postings,
                "vocabulary": len(j.ix.terms), "query_terms_mean": round(float(np.mean([len(q.terms) for q in j.queries])), 2)}
            for v, j in judged.items()}


def run_set(set_name: str, levers: list[str]) -> dict:
    t0 = time.perf_counter()
    corpus, queries, qrels = load_set(set_name, None)
    variants = ["service"] + sorted({v for name in levers for v in LEVERS[name].variants} - {"service"})
    judged = {v: Judged.build(set_name, v, corpus, queries, qrels) for v in variants}
    search_mode_check = None
    if "searchmode" in levers:
        # the variants' Han words are rebuilt from the plain cut: with 2- and 3-character substrings
        # (search-mode-py) they must be the service's tokens
        ref, py = make_tokenizer("service"), make_tokenizer("search-mode-py")
        sample = corpus[::max(1, len(corpus) // 2000)]
        differ = sum(ref.tokens(content_of(t, x)) != py.tokens(content_of(t, x)) for _, t, x in sample)
        search_mode_check = {"documents": len(sample), "differ": differ}
        print(f"[{set_name}] search mode rebuilt from the plain cut: {differ} of {len(sample)} documents "
              "tokenized differently from the service", flush=True)
    del corpus
    m = Measures(judged["service"])
    base_ranked = {qid: docs for qid, (docs, _) in judged["service"].base.items()}
    base_pq = m.per_query(base_ranked)
    base = m.summary(base_pq)
    off = m.check(base_ranked, base_pq)
    if off > 1e-9:
        raise SystemExit(f"[{set_name}] the measures differ from ranx's by up to {off}")
    n_a = len(m.members["A"])
    print(f"[{set_name}] {judged['service'].ix.n} docs, {len(queries)} queries (A {n_a}, B {len(queries) - n_a}); "
          f"indexes ready in {time.perf_counter() - t0:.1f} s", flush=True)
    print_row(set_name, "baseline", "service BM25", base, time.perf_counter() - t0)
    out = {"docs": judged["service"].ix.n, "queries": {"A": n_a, "B": len(queries) - n_a, "all": len(queries)},
           "baseline": base, "measures_vs_ranx_max_diff": off, "index": index_cost(judged), "levers": {}}
    for name in levers:
        t1 = time.perf_counter()
        res = run_lever(name, LEVERS[name], judged, base_pq, m)
        res["time_s"] = round(time.perf_counter() - t1, 1)
        out["levers"][name] = res
    out["levers"]["field"] = {"cost": "-", "note": FIELD_NOTE}
    if search_mode_check is not None:
        out["search_mode_py_vs_service"] = search_mode_check
    if "qtf" in levers:
        qs = judged["service"].queries
        out["queries_with_repeated_terms"] = sum(any(c > 1 for c in q.qtf) for q in qs)
        from service.ranking.results import MAX_QUERY_TERMS
        out["queries_at_max_terms"] = sum(len(q.terms) >= MAX_QUERY_TERMS for q in qs)
    if "bigram" in levers:
        same = all(np.array_equal(judged[v].ix.flat, judged["service"].ix.flat) for v in LEVERS["bigram"].variants)
        out["bigram_tokens_identical_to_service"] = bool(same)
    out["time_s"] = round(time.perf_counter() - t0, 1)
    return out


# --- report ------------------------------------------------------------------------------------
def signed(x: float) -> str:
    return f"{x:+.4f}"


def fmt_markdown(payload: dict) -> str:
    out = ["# Ranking levers beyond BM25 (bench/levers.py, issue 28)", "",
           f"Command: `{payload['command']}` (service {payload['service_rev']}); wall {payload['wall_s']:.0f} s.", "",
           "Each lever alone against the service's BM25, reproduced offline over the service's tokens. "
           "Queries split by sha256 of the id (even: A, odd: B); parameters chosen on A (nDCG@10), reported on "
           "B (held out) and all. p: paired sign-flip randomization test of the nDCG@10 difference "
           f"({PERMUTATIONS} samples). Rescoring levers (prox, window) re-order the top 100: R@100 cannot move "
           "(bm25l-prox re-orders BM25L's top 100: its R@100 is BM25L's).", "",
           "| set | lever | chosen on A | nDCG@10 A | B | all | R@100 all | Δ A | Δ B | Δ all | Δ R@100 | p B | p all |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for set_name, s in payload["sets"].items():
        b = s["baseline"]
        out.append(f"| {set_name} | baseline | service BM25 | {b['A']['ndcg@10']:.4f} | {b['B']['ndcg@10']:.4f} | "
                   f"{b['all']['ndcg@10']:.4f} | {b['all']['recall@100']:.4f} | | | | | | |")
        for name, lv in s["levers"].items():
            if "chosen" not in lv:
                out.append(f"| {set_name} | {name} | not measurable (below) | | | | | | | | | | |")
                continue
            c, d = lv["chosen"], lv["delta"]
            out.append(f"| {set_name} | {name} | {fmt_params(c['params'])} | {c['A']['ndcg@10']:.4f} | "
                       f"{c['B']['ndcg@10']:.4f} | {c['all']['ndcg@10']:.4f} | {c['all']['recall@100']:.4f} | "
                       f"{signed(d['A']['ndcg@10'])} | {signed(d['B']['ndcg@10'])} | {signed(d['all']['ndcg@10'])} | "
                       f"{signed(d['all']['recall@100'])} | {lv['p_ndcg@10']['B']} | {lv['p_ndcg@10']['all']} |")
    out += ["", *verdicts(payload), "", "Index size per tokenization (mean tokens per document, postings, vocabulary):", "",
            "| set | tokens | tokens/doc | postings | vocabulary | query terms (mean) |", "|---|---|---|---|---|---|"]
    for set_name, s in payload["sets"].items():
        for v, c in s["index"].items():
            out.append(f"| {set_name} | {v} | {c['tokens_per_doc']} | {c['postings']} | {c['vocabulary']} | "
                       f"{c['query_terms_mean']} |")
    out += ["", "Extra work per query:", ""]
    some = next(iter(payload["sets"].values()))["levers"]
    out += [f"- {name}: {lv['cost']}" for name, lv in some.items() if "chosen" in lv]
    out += [f"- field: {FIELD_NOTE}", ""]
    return "\n".join(out)


def verdicts(payload: dict) -> list[str]:
    """Which levers help every measured set on the held-out half B and on all (nDCG@10)."""
    sets = payload["sets"]
    names = [n for n in next(iter(sets.values()))["levers"] if all("chosen" in s["levers"].get(n, {}) for s in sets.values())]
    lines = [f"Helps every set ({', '.join(sets)}) on B and on all: "]
    helping = [n for n in names if all(s["levers"][n]["delta"][h]["ndcg@10"] > 0 for s in sets.values() for h in ("B", "all"))]
    lines[0] += ", ".join(helping) if helping else "none"
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sets", default="stard,scifact")
    ap.add_argument("--levers", default=",".join(LEVERS), help=f"any of {', '.join(LEVERS)} (field: a note, always)")
    ap.add_argument("--service-src", default="head", help="head (default), worktree or a revision")
    ap.add_argument("--name", default="levers", help="results file name (bench/results/<name>.json and .md)")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)
    levers = [n for n in args.levers.split(",") if n and n != "field"]
    bad = [n for n in levers if n not in LEVERS]
    if bad:
        ap.error(f"unknown lever {bad[0]!r}; known: {', '.join(LEVERS)}, field")
    src = service_src(args.service_src)
    from service.ranking import bm25
    assert (bm25.K1, bm25.B) == (K1, B), "the service's BM25 parameters changed: update K1, B here"
    t0 = time.perf_counter()
    sets = {name: run_set(name, levers) for name in args.sets.split(",") if name}
    argv_s = " ".join(argv if argv is not None else sys.argv[1:])
    payload = {"command": ".venv/bin/python bench/levers.py" + (f" {argv_s}" if argv_s else ""),
               "service_rev": service_rev(src), "eval_dir": str(EVAL_DIR), "machine": machine(),
               "split": "sha256(query id) even: A (tune), odd: B (held out)", "bm25": {"k1": K1, "b": B},
               "top_k": TOP_K, "wall_s": round(time.perf_counter() - t0, 1), "sets": sets}
    md = fmt_markdown(payload)
    print(md)
    if not args.no_write:
        write_json(args.name, payload)
        path = ROOT / "bench" / "results" / f"{args.name}.md"
        path.write_text(md, encoding="utf-8")
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
