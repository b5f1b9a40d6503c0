"""Backend-neutral ranking: BM25's formula and statistics (``bm25``), scoring what an index lacks from its
tokens (``tail``), the 0-1 score and explain (``scoring``), highlights (``snippets``), the shape of a search
answer (``results``) and tool search (``tools``). Both stores rank with these, so they rank alike."""
