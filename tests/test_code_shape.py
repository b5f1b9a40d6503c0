"""The shape of service/ (issue 13): imports point one way, in data-flow order.

The import graph is read from the source (every ``import`` and ``from ... import``, also those
inside functions, which a lazy import would otherwise hide), so a cycle fails here before it
can be papered over with an import moved into a function.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from conftest import ROOT

SERVICE = ROOT / "service"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def service_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(SERVICE.rglob("*.py"))}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The service modules ``name`` imports anywhere in its source."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"      # `from . import x` imports the module x
                if sub in known:
                    found.add(sub)
                elif target in known:
                    found.add(target)
    found.discard(name)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = service_modules()
    return {name: imports_of(name, path, set(modules)) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_among_service_modules():
    graph = import_graph()
    # open_store imports the store inside the function: the graph has that edge too.
    assert "service.store.sqlite.store" in graph["service.store.sqlite"]
    assert "service.errors" in graph["service.store.sqlite.shards"]
    assert cycles(graph) == []


def test_the_cycle_check_sees_imports_inside_functions(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text("def later():\n    from .a import thing\n    from pkg import c\n")
    (pkg / "c.py").write_text("import os\n")
    known = {"pkg", "pkg.a", "pkg.b", "pkg.c"}
    graph = {f"pkg.{m}": imports_of(f"pkg.{m}", pkg / f"{m}.py", known) for m in "abc"}
    assert graph == {"pkg.a": {"pkg.b"}, "pkg.b": {"pkg.a", "pkg.c"}, "pkg.c": set()}
    assert cycles(graph) == [["pkg.a", "pkg.b"]]


def test_only_the_store_and_search_touch_the_searcher():
    """Health, metrics, maintenance and the doors use the store's API (freshness, stats, tokenizer,
    push_batch), never ``store.searcher`` (readindex's ``view.searcher`` is tantivy's own)."""
    allowed = {"service.store.sqlite.store", "service.store.sqlite.search", "service.store.sqlite.readsync",
               "service.store.postgresql.store", "service.store.postgresql.search",
               "service.readindex.reader", "service.readindex.searcher", "service.readindex.threaded"}
    reaching = []
    for name, path in service_modules().items():
        if name in allowed:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr == "searcher":
                reaching.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert reaching == []


def named_statements(path) -> list[str]:
    return re.findall(r"^--\s*name:\s*(\S+)\s*$", path.read_text(), flags=re.M)


def test_every_named_statement_is_used():
    """sql/queries.sql and each area's sql/*_queries.sql (shards.sql loads them all: live_queries.sql is
    issue 16's) hold no statement the service never runs (dead SQL drifts from the schema); nor does the
    PostgreSQL backend's sql/postgresql/queries.sql (issue 18) in service/store/postgresql/."""
    names = [n for f in sorted((ROOT / "sql").glob("*queries.sql")) for n in named_statements(f)]
    source = "\n".join(p.read_text(encoding="utf-8") for p in service_modules().values())
    assert len(names) > 60
    assert [n for n in names if f'"{n}"' not in source] == []
    pg_source = "\n".join(p.read_text(encoding="utf-8") for p in sorted((SERVICE / "store" / "postgresql").glob("*.py")))
    pg_names = named_statements(ROOT / "sql" / "postgresql" / "queries.sql")
    assert len(pg_names) > 40
    assert [n for n in pg_names if f'"{n}"' not in pg_source] == []


MAX_FUNCTION_LINES = 80


def function_lengths() -> list[tuple[int, str]]:
    """(lines, where) of every function and method in service/, longest first. Declarative tables
    (the MCP method table, the parameter declarations) are module-level data, not functions."""
    found = []
    for path in service_modules().values():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                found.append((node.end_lineno - node.lineno + 1, f"{path.relative_to(ROOT)}:{node.lineno} {node.name}"))
    return sorted(found, reverse=True)


def test_no_function_over_80_lines():
    lengths = function_lengths()
    assert len(lengths) > 300
    assert [f for f in lengths if f[0] > MAX_FUNCTION_LINES] == []


# SQL is written in sql/*.sql and run by name; only these modules build statements in Python:
# shards.py (connection pragmas, transactions, the FTS5 probe), fts.py (the scoring statement, whose
# shape depends on the query's terms and filters) and manage.py (issue 15's filtered list, export and
# forget statements, built from fts.filters); on PostgreSQL (issue 18) their counterparts pg/search.py
# (the match and queued-unit conditions around fts.scoring_sql) and pg/manage.py.
SQL_BUILDERS = {"service.store.sqlite.shards", "service.store.sqlite.fts", "service.store.sqlite.manage",
                "service.store.postgresql.search", "service.store.postgresql.manage"}
_SQL_RE = re.compile(r"^\s*(SELECT|INSERT|UPDATE|DELETE|WITH|CREATE|ATTACH|DETACH|REPLACE)\s+\S")


def test_no_sql_text_outside_sql_files_and_the_statement_builders():
    found = []
    for name, path in service_modules().items():
        if name in SQL_BUILDERS:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and _SQL_RE.match(node.value):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value[:40]!r}")
    assert found == []


# --- BM25 written once (service/ranking/bm25.py) -------------------------------------------------------
# The length norm k1 * (1 - b + b * n / avgdl) and a term's share weight * tf / (tf + norm), in Python or as
# SQL text, in any spelling of the names: only ranking/bm25.py may hold them (ties are equal floats, so every
# path must compute them one way).
_NORM_RE = re.compile(r"1\s*-\s*\S+\s*\+\s*\S+\s*\*\s*\S+\s*/")
_TERM_RE = re.compile(r"\*\s*\S+\s*/\s*\(\s*\S+\s*\+\s*\S*norm")


def bm25_expressions(text: str) -> list[str]:
    """The BM25 expressions in Python source or SQL text, comments and docstrings included (a copy in a
    comment is where the next copy in code starts)."""
    return [m.group(0) for pattern in (_NORM_RE, _TERM_RE) for m in pattern.finditer(text)]


def test_the_bm25_formula_is_written_once():
    home = ROOT / "service" / "ranking" / "bm25.py"
    assert len(bm25_expressions(home.read_text(encoding="utf-8"))) >= 4     # in Python and as SQL, each
    found = [f"{path.relative_to(ROOT)}: {expr}" for path in [*service_modules().values(), *ROOT.glob("sql/**/*.sql")]
             if path != home for expr in bm25_expressions(path.read_text(encoding="utf-8"))]
    assert found == []


@pytest.mark.parametrize("copy", [
    "norm = k1 * (1 - b + b * ntok / avgdl)",
    "K1 * (1 - B + B * r[f'n_{col}'] / avg[col])",
    "':k1 * (1 - :b + :b * ntok / :avgdl) AS norm'",
    "'%(k1)s * (1 - %(b)s + %(b)s * ntok / %(avgdl)s)'",
    "score += w * tf / (tf + norm)",
    "':w0 * tf0 / (tf0 + norm)'",
])
def test_the_formula_check_sees_a_copy(copy):
    assert bm25_expressions(copy)


# --- the two stores as peers (service/store/, docs/design.md §5) -----------------------------------------
BACKENDS = ("service.store.sqlite", "service.store.postgresql")


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_neither_store_imports_the_other():
    graph = import_graph()
    crossing = [f"{m} -> {n}" for m, deps in graph.items() for n in deps
                for own, other in (BACKENDS, BACKENDS[::-1]) if _in(m, own) and _in(n, other)]
    assert crossing == []


def test_loading_the_postgresql_store_loads_no_sqlite_module():
    import subprocess
    import sys
    code = ("import sys, service.store.postgresql.store, service.store.postgresql.search, "
            "service.store.postgresql.live, service.store.postgresql.registry, service.store.postgresql.maintenance; "
            "print(sorted(m for m in sys.modules if m.startswith('service.store.sqlite')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]"


def test_the_root_and_the_front_doors_reach_a_backend_only_through_open_backend():
    """Outside service/store/ a module may import ``service.store`` (open_backend, check_backend, doctor_lines,
    register_cli) and ``service.store.base`` (the contract), never a backend's own modules: the root holds
    only what every backend uses and the front doors."""
    graph = import_graph()
    reaching = [f"{m} -> {n}" for m, deps in graph.items() if not _in(m, "service.store")
                for n in deps if any(_in(n, b) for b in BACKENDS)]
    assert reaching == []


def _class_members(path: Path, name: str) -> set[str]:
    """Public methods, class attributes (annotated or assigned) and attributes its __init__ sets."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    cls = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name)
    found: set[str] = set()
    for node in cls.body:
        if isinstance(node, ast.FunctionDef):
            found.add(node.name)
            if node.name == "__init__":
                for sub in ast.walk(node):
                    targets = sub.targets if isinstance(sub, ast.Assign) else \
                        [sub.target] if isinstance(sub, ast.AnnAssign) else []
                    found.update(t.attr for t in targets if isinstance(t, ast.Attribute)
                                 and isinstance(t.value, ast.Name) and t.value.id == "self")
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            found.add(node.target.id)
        elif isinstance(node, ast.Assign):
            found.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return {m for m in found if not m.startswith("_")}


STORE = SERVICE / "store"
CONTRACTS = [   # (the contract, then the class each backend implements it with)
    ((STORE / "base.py", "StoreApi"), (STORE / "sqlite" / "store.py", "Store"),
     (STORE / "postgresql" / "store.py", "PgStore")),
    ((STORE / "base.py", "RegistryBase"), (STORE / "sqlite" / "registry.py", "Registry"),
     (STORE / "postgresql" / "registry.py", "PgRegistry")),
    ((STORE / "base.py", "Sources"), (STORE / "sqlite" / "live.py", "FileSources"),
     (STORE / "postgresql" / "live.py", "PgSources")),
    ((STORE / "base.py", "ChangeLog"), (STORE / "sqlite" / "live.py", "ChangeLog"),
     (STORE / "postgresql" / "live.py", "PgChangeLog")),
    ((STORE / "base.py", "Slots"), (STORE / "sqlite" / "live.py", "Slots"),
     (STORE / "postgresql" / "live.py", "PgSlots")),
]


def test_every_member_both_stores_implement_is_in_the_contract():
    missing = []
    for (base_path, base), (a_path, a), (b_path, b) in CONTRACTS:
        declared = _class_members(base_path, base)
        both = (_class_members(a_path, a) & _class_members(b_path, b)) - {"__init__"}
        missing += [f"{base}.{m} (implemented by {a} and {b})" for m in sorted(both - declared)]
    assert missing == []


def test_the_contract_check_sees_what_a_class_sets(tmp_path):
    mod = tmp_path / "m.py"
    mod.write_text("class A:\n    x: int\n    y = 1\n    def __init__(self):\n        self.z = 2\n        self._p = 3\n"
                   "    def m(self): pass\n    def _n(self): pass\n")
    assert _class_members(mod, "A") == {"x", "y", "z", "m"}
