"""Backend-neutral ranking: BM25's formula and statistics (bm25.py), scoring what an index lacks from its
tokens (tail.py), the 0-1 score and explain (scoring.py), ranking with threads (threads.py), the one ranking step every path and both stores call, over an engine's pool
(rank.py), highlights
(snippets.py), the shape of a search answer (results.py) and tool search (tools.py). Both stores rank with
these, so they rank alike."""
