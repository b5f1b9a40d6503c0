"""The read index (docs/design.md §6.1): one tantivy index per tenant over every live day, which default
searches read, on either store. One index over all days makes BM25's statistics global by construction, and
tantivy evaluates OR queries with block-max WAND in compiled code, so a query's cost grows with neither the
number of days nor the matches of its common terms.

It holds exactly the service's own tokens (service/tokenize.py, a whitespace analyzer over them) and each
unit's public fields, so a hit is answered without reading the store. It is derived data, written by one
process per tenant (its maintenance leader) and read by every worker, which reloads when a commit's
``meta.json`` changes; when missing, damaged or of another format it is rebuilt from the store. Each store
feeds it its own way (service/store/sqlite/readsync.py).

tantivy ranks with BM25 (k1 1.2, b 0.75, Lucene's idf: the service's formula) but keeps document lengths in
one byte; ``searcher.rescore`` scores its best candidates again with the exact lengths. The statistics count
documents deleted but not yet merged away.

Modules, as tantivy-py splits them: schema.py (fields, documents, files), reader.py (a process's views),
searcher.py (search and exact rescoring), threaded.py (an answer ranked with threads), writer.py (the
leader's side).
"""
