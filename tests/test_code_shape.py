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
CLIENT = ROOT / "clients" / "python"          # the Python client's package, context_mode_client/


def module_name(path: Path, base: Path = ROOT) -> str:
    parts = list(path.relative_to(base).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def service_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(SERVICE.rglob("*.py"))}


def client_modules() -> dict[str, Path]:
    return {module_name(p, CLIENT): p for p in sorted((CLIENT / "context_mode_client").rglob("*.py"))}


def _targets(node: ast.AST, package: str, known: set[str]) -> set[str]:
    """The known modules one import statement imports."""
    found = set()
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
    return found


def _type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")


def run_time_nodes(tree: ast.AST):
    """``ast.walk``, but not into an ``if TYPE_CHECKING:`` block: what it imports never runs (service/state.py's
    field types, TYPE_CHECKING_IMPORTS)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            todo.extend(child.orelse if _type_checking(child) else [child])


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules of ``known`` that ``name`` imports anywhere in its source (where it runs)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in run_time_nodes(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        found |= _targets(node, package, known)
    found.discard(name)
    return found


def import_graph(modules: dict[str, Path] | None = None) -> dict[str, set[str]]:
    modules = service_modules() if modules is None else modules
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
    assert "service.errors" in graph["service.store.sqlite.connections"]
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


# --- layers: imports point down, packages form no cycle, imports sit at the top (issue 40) ---------------
# service/ from the bottom up: a module imports its own layer and those below, never one above (the root
# package ``service`` is create_app, at the top; every other name covers a module or a package).
LAYERS = (
    ("foundation", ("service.config", "service.errors", "service.formats", "service.instruments", "service.boot",
                    "service.logs", "service.change_numbers", "service.budget", "service.state")),
    ("contracts", ("service.unitkeys", "service.units", "service.params", "service.schemarefs", "service.toolcheck",
                   "service.tokens", "service.tokenize", "service.uris", "service.live", "service.auth",
                   "service.ratelimit", "service.shares")),
    ("ranking", ("service.ranking", "service.packing", "service.readindex")),
    ("storage", ("service.store",)),
    ("live context", ("service.hub",)),
    ("REST", ("service.doors", "service.metrics", "service.api")),
    ("protocols", ("service.mcp", "service.adapters", "service.console")),
    ("processes", ("service", "service.preflight", "service.maintainer", "service.gunicorn_conf",
                   "service.guard", "service.cli")),
)


def layer_of(module: str) -> int | None:
    """The layer a module is in: the longest name of LAYERS that is it or a package holding it."""
    best = None
    for i, (_, names) in enumerate(LAYERS):
        for n in names:
            if module == n or (n != "service" and module.startswith(n + ".")):
                if best is None or len(n) > best[1]:
                    best = (i, len(n))
    return best and best[0]


def test_every_service_module_has_a_layer():
    assert [m for m in service_modules() if layer_of(m) is None] == []


def test_imports_point_down_the_layers():
    up = [f"{m} ({LAYERS[layer_of(m)][0]}) -> {d} ({LAYERS[layer_of(d)][0]})"
          for m, deps in sorted(import_graph().items()) for d in sorted(deps) if layer_of(d) > layer_of(m)]
    assert up == []


def package_graph(graph: dict[str, set[str]], paths: dict[str, Path], root: str) -> dict[str, set[str]]:
    """The import graph between packages: a module counts as its package, except the root package's own
    modules (each its own) and a package's ``__init__`` and ``__main__`` (``pkg:__init__``: what chooses among
    its modules, e.g. service/store/__init__.py choosing a backend; ``pkg.__main__`` runs it)."""
    def node(m: str) -> str:
        if paths[m].name == "__init__.py":
            return f"{m}:__init__"
        if paths[m].name == "__main__.py":
            return m
        package = m.rpartition(".")[0]
        return m if package == root else package
    out: dict[str, set[str]] = {}
    for m, deps in graph.items():
        out.setdefault(node(m), set()).update(node(d) for d in deps if node(d) != node(m))
    for deps in list(out.values()):
        for d in deps:
            out.setdefault(d, set())
    return out


def test_no_import_cycle_among_service_packages():
    """api/ and mcp/ imported each other (through what is now service/uris.py, issue 40): a cycle of packages, which the
    module graph does not show."""
    modules = service_modules()
    packages = package_graph(import_graph(modules), modules, "service")
    assert "service.api" in packages and "service.store:__init__" in packages
    assert cycles(packages) == []


def test_no_import_cycle_in_the_python_client():
    modules = client_modules()
    graph = import_graph(modules)
    assert "context_mode_client.cid" in graph["context_mode_client.hooks.store"]
    assert cycles(graph) == []
    assert cycles(package_graph(graph, modules, "context_mode_client")) == []


def test_no_import_cycle_among_the_benchmarks():
    """bench/http_bench.py imported postgresql.py and alternate_search.py inside functions, and they (and ingest.py)
    import it: a circle the in-function imports hid (issue 52). What several benchmarks share is bench/servers.py."""
    modules = {p.stem: p for p in sorted((ROOT / "bench").glob("*.py"))}
    graph = import_graph(modules)
    assert "servers" in graph["http_bench"] and "http_bench" in graph["alternate_search"]
    assert cycles(graph) == []


# What the service takes from the Python client package (clients/python/context_mode_client/), every use with its
# reason. The server itself runs the client's secret detector, the one the agent hooks mask with (it lives in the
# client because a hook runs without the service; docs/design.md, "One secret detector"): the tool registry's
# refusals and CONTEXT_MASK_PUSHES. The rest is the `context-mode` command's client commands, registered only when
# the client is installed (service/cli/__init__.py).
SECRET_DETECTOR = "context_mode_client.secretscan"
SERVICE_USES_OF_THE_CLIENT = {
    "service.toolcheck": {SECRET_DETECTOR},                 # a tool holding a credential is refused
    "service.units": {SECRET_DETECTOR},                     # CONTEXT_MASK_PUSHES: pushes masked before they are stored
    "service.cli.client": {"context_mode_client", "context_mode_client.textsplit", "context_mode_client.hooks.cli"},
    "service.cli.manage": {"context_mode_client"},
}


def test_the_service_uses_the_client_package_where_stated():
    known = set(client_modules())
    used = {name: deps for name, path in service_modules().items() if (deps := imports_of(name, path, known))}
    assert used == SERVICE_USES_OF_THE_CLIENT
    server = {dep for name, deps in used.items() if not name.startswith("service.cli") for dep in deps}
    assert server == {SECRET_DETECTOR}          # the server needs the client for its secret detector alone


# Only the app's state names the classes of the layers above it, for type checkers only: every layer reads it.
TYPE_CHECKING_IMPORTS = {"service.state"}


def test_only_the_app_state_imports_for_type_checkers_alone():
    found = {name for name, path in service_modules().items()
             if any(_type_checking(n) for n in ast.walk(ast.parse(path.read_text(encoding="utf-8"))))}
    assert found == TYPE_CHECKING_IMPORTS


def test_the_graph_leaves_out_imports_for_type_checkers(tmp_path):
    (tmp_path / "m.py").write_text("from typing import TYPE_CHECKING\nimport a\nif TYPE_CHECKING:\n    import b\n"
                                   "else:\n    import c\n")
    assert imports_of("m", tmp_path / "m.py", {"a", "b", "c"}) == {"a", "c"}


def test_every_service_package_is_installed():
    """A wheel holds only the packages pyproject.toml lists (service.ranking and service.readindex were
    missing): every folder of service/ with an __init__.py is listed."""
    import tomllib
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    assert sorted(module_name(p) for p in SERVICE.rglob("__init__.py") if module_name(p) not in listed) == []


# Where an import inside a function is the design, not a dodge of a cycle or a layer: what loads on demand.
LAZY_IMPORTS = {
    "service": "create_app: every `service.*` import runs this file first, and only an app needs the store, "
               "Flask's blueprints and jieba",
    "service.cli": "a command loads what it runs: `context-mode push` opens no store",
    "service.store": "a backend is loaded on demand: loading one never loads the other",
    "service.store.sqlite": "the backend's modules on demand: `check` and `doctor` load no store",
    "service.store.postgresql": "the backend's modules on demand: `check` and `doctor` load no store",
    "service.gunicorn_conf": "a server hook loads what it runs, in the master or a worker",
}


def function_imports(modules: dict[str, Path]) -> dict[str, list[str]]:
    """Per module, the modules of ``modules`` it imports inside a function (``module:line target`` each)."""
    known = set(modules)
    out: dict[str, list[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for fn in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                for node in ast.walk(fn):
                    for target in sorted(_targets(node, package, known) - {name}):
                        out.setdefault(name, []).append(f"{name}:{node.lineno} {target}")
    return out


def test_imports_sit_at_the_top_of_their_file():
    """An import moved into a function hides a cycle or an import up the layers from a reader (both
    checks above see it): only the modules of LAZY_IMPORTS load modules on demand, and each still does."""
    found = function_imports(service_modules())
    assert [w for m, where in sorted(found.items()) if m not in LAZY_IMPORTS for w in where] == []
    assert sorted(m for m in LAZY_IMPORTS if m not in found) == []
    client = function_imports(client_modules())
    assert [w for where in client.values() for w in where] == []


def test_the_shape_checks_see_layers_packages_and_lazy_imports(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    for f, text in {"__init__.py": "", "a.py": "from .sub import b\n", "sub/__init__.py": "",
                    "sub/b.py": "def f():\n    from .. import c\n", "c.py": "from .sub import d\n",
                    "sub/d.py": "x = 1\n"}.items():
        (pkg / f).write_text(text)
    modules = {module_name(p, tmp_path): p for p in sorted(pkg.rglob("*.py"))}
    graph = import_graph(modules)
    assert cycles(graph) == []                                    # a -> b -> c -> d: no module cycle
    assert cycles(package_graph(graph, modules, "pkg")) == [["pkg.c", "pkg.sub"]]   # but sub -> c -> sub
    assert [w.split()[-1] for w in function_imports(modules)["pkg.sub.b"]] == ["pkg.c"]
    assert layer_of("service.store.sqlite.connections") == layer_of("service.store") < layer_of("service.api.stream")
    assert layer_of("service") == len(LAYERS) - 1 and layer_of("service.units") == 1


def test_only_the_store_and_search_touch_the_searcher():
    """Health, metrics, maintenance and the doors use the store's API (freshness, stats, tokenizer,
    push_batch), never ``store.searcher`` (readindex's ``view.searcher`` is tantivy's own)."""
    allowed = {"service.store.sqlite.store", "service.store.sqlite.search", "service.store.sqlite.readsync",
               "service.store.postgresql.store", "service.store.postgresql.search",
               "service.store.sqlite.engine", "service.store.postgresql.engine",      # the searches' engines
               "service.readindex.reader", "service.readindex.searcher", "service.readindex.threaded",
               # (tantivy's own searcher of the leader's writer: the days it holds, its first expiry)
               "service.readindex.writer", "service.store.postgresql.readsync"}
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
    """sql/sqlite/queries.sql and each area's sql/sqlite/*_queries.sql (queries.sql loads them all: live_queries.sql
    is issue 16's) hold no statement the service never runs (dead SQL drifts from the schema); nor does the
    PostgreSQL backend's sql/postgresql/queries.sql (issue 18) in service/store/postgresql/."""
    names = [n for f in sorted((ROOT / "sql" / "sqlite").glob("*queries.sql")) for n in named_statements(f)]
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


# SQL is written in sql/*.sql and run by name; only these modules build statements in Python: SQLite's
# connections.py (connection pragmas, transactions, the FTS5 probe), fts.py (the scoring statement, whose shape
# depends on the query's terms and filters) and manage.py (issue 15's filtered list, export and forget
# statements, built from service/store/filters.py); on PostgreSQL (issue 18) their counterparts scoring.py (the
# match and queued-unit conditions around ranking/bm25.py's scoring SQL), search.py (the queued units' read)
# and manage.py.
SQL_BUILDERS = {"service.store.sqlite.connections", "service.store.sqlite.fts", "service.store.sqlite.manage",
                "service.store.postgresql.search", "service.store.postgresql.scoring", "service.store.postgresql.manage"}
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
# The length norm k1 * (1 - b + b * n / avgdl), a term's share weight * tf / (tf + norm) and its weight
# idf * (k1 + 1) (issue 52: explain and tool search formed it again), in Python or as SQL text, in any
# spelling of the names: only ranking/bm25.py may hold them (ties are equal floats, so every path must compute
# them one way).
_NORM_RE = re.compile(r"1\s*-\s*\S+\s*\+\s*\S+\s*\*\s*\S+\s*/")
_TERM_RE = re.compile(r"\*\s*\S+\s*/\s*\(\s*\S+\s*\+\s*\S*norm")
_WEIGHT_RE = re.compile(r"\(\s*(?:[\w.%():]*k1[\w)]*\s*\+\s*1|1\s*\+\s*[\w.%():]*k1[\w)]*)\s*\)", re.I)


def bm25_expressions(text: str) -> list[str]:
    """The BM25 expressions in Python source or SQL text, comments and docstrings included (a copy in a
    comment is where the next copy in code starts)."""
    return [m.group(0) for pattern in (_NORM_RE, _TERM_RE, _WEIGHT_RE) for m in pattern.finditer(text)]


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
    "weight = idf * (k1 + 1)",
    "sum(w * (K1+1) for w in idf)",
    "(1 + self.k1) * idf",
    "'%(idf)s * (%(k1)s + 1)'",
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
BACKEND_NAMES = ("sqlite", "postgresql")


def classes_of(path: Path) -> list[str]:
    return [n.name for n in ast.parse(path.read_text(encoding="utf-8")).body if isinstance(n, ast.ClassDef)]


def contracts() -> list[tuple[tuple[Path, str], ...]]:
    """One naming rule (docs/design.md §5): a contract is a class ``<Role>Api`` of service/store/ (a Protocol or a
    base class), and each backend's class for it is ``<Role>``: (the contract, then each backend's class)."""
    found = []
    for path in sorted(STORE.glob("*.py")):
        for name in classes_of(path):
            if name.endswith("Api"):
                impls = tuple((m, name[:-3]) for b in BACKEND_NAMES for m in sorted((STORE / b).glob("*.py"))
                              if name[:-3] in classes_of(m))
                found.append(((path, name), *impls))
    return found


def test_each_backend_has_one_class_for_each_contract():
    """StoreApi, RegistryApi, SourcesApi, ChangeLogApi, SlotsApi and MaintenanceApi (the maintenance loop, which the
    member check below did not cover while it was ``Loop``)."""
    found = contracts()
    assert {c[0][1] for c in found} >= {"StoreApi", "RegistryApi", "SourcesApi", "ChangeLogApi", "SlotsApi",
                                        "MaintenanceApi"}
    assert [c[0][1] for c in found if [p.parent.name for p, _ in c[1:]] != list(BACKEND_NAMES)] == []


def test_no_class_is_named_after_its_backend_and_no_contract_after_a_class():
    """Only PostgreSQL's classes carried a prefix (PgStore beside Store): a class says its role, its package the
    backend. And a contract is named apart from the classes that implement it (ChangeLog named both)."""
    backend_classes = {name: m for b in BACKEND_NAMES for m in sorted((STORE / b).glob("*.py")) for name in classes_of(m)}
    named = [f"{m.relative_to(ROOT)}: {name}" for name, m in backend_classes.items()
             if re.match(r"(Pg|Postgres|SQLite|Sqlite|File)[A-Z]", name)]
    assert named == []
    neutral = {name for m in STORE.glob("*.py") for name in classes_of(m)}
    assert sorted(neutral & set(backend_classes)) == []


# A newcomer adding a backend copies a sibling module by module: a role both backends have has one file name on both
# (readsync.py was nodeindex.py on PostgreSQL). A backend's own modules, and what the other does instead:
OWN_MODULES = {
    "sqlite": {"tenant": "one tenant's files (PostgreSQL: every table keyed by tenant)",
               "groupcommit": "one commit per group of pushes (PostgreSQL: one transaction per push)",
               "fts": "the strong search's FTS5 statements (PostgreSQL's SQL is its scoring.py)",
               "backup": "an online copy of the files (PostgreSQL: its own tools and replication)"},
    "postgresql": {"standby": "the streaming standby default searches may read (SQLite has none)",
                   "scoring": "the search's match conditions, scoring statement and pruning (SQLite's: fts.py)"},
}


def backend_modules() -> dict[str, set[str]]:
    return {b: {p.stem for p in (STORE / b).glob("*.py")} - {"__init__"} for b in OWN_MODULES}


def test_both_backends_name_each_role_alike():
    mods = backend_modules()
    for own, other in (("sqlite", "postgresql"), ("postgresql", "sqlite")):
        assert sorted(mods[own] - mods[other] - set(OWN_MODULES[own])) == [], f"{own} only, not in OWN_MODULES"
        assert sorted(set(OWN_MODULES[own]) - (mods[own] - mods[other])) == [], f"{own}: OWN_MODULES is stale"


def test_each_package_names_its_modules():
    """Every package of service/ but the root (README.md's "What is where" has those) lists its modules in its
    docstring (they listed gone ones): every module, none that is not."""
    wrong = {}
    for init in sorted(SERVICE.glob("*/**/__init__.py")):
        mods = {p.stem for p in init.parent.glob("*.py") if not p.stem.startswith("__")}
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        named = set(re.findall(r"(?<![/\w])(\w+)\.py\b", doc))      # (a path: another package's file)
        if named != mods:
            wrong[module_name(init)] = {"unlisted": sorted(mods - named), "gone": sorted(named - mods)}
    assert wrong == {}


def test_every_member_both_stores_implement_is_in_the_contract():
    missing = []
    for (base_path, base), (a_path, a), (b_path, b) in contracts():
        declared = _class_members(base_path, base)
        both = (_class_members(a_path, a) & _class_members(b_path, b)) - {"__init__"}
        missing += [f"{base}.{m} (implemented by {a} and {b})" for m in sorted(both - declared)]
    assert missing == []


def test_the_contract_check_sees_what_a_class_sets(tmp_path):
    mod = tmp_path / "m.py"
    mod.write_text("class A:\n    x: int\n    y = 1\n    def __init__(self):\n        self.z = 2\n        self._p = 3\n"
                   "    def m(self): pass\n    def _n(self): pass\n")
    assert _class_members(mod, "A") == {"x", "y", "z", "m"}


# The request path's checks, each with the test module named after it, which names it back.
TESTED_BY_NAME = {"service/doors.py": "test_doors.py", "service/ratelimit.py": "test_ratelimit.py",
                  "service/shares/": "test_fair_shares.py", "service/guard/": "test_guard.py"}


@pytest.mark.parametrize("module,tests", sorted(TESTED_BY_NAME.items()))
def test_the_door_checks_have_test_modules_named_after_them(module, tests):
    assert (ROOT / module).exists()
    text = (ROOT / "tests" / tests).read_text()
    assert module in text.split('"""')[1], f"tests/{tests}'s docstring does not name {module}"


# --- gunicorn extended, not patched (issue 52) ------------------------------------------------------------
# The slow-client guard is gunicorn's gthread worker subclassed (service/guard/worker.py, named by worker_class);
# it replaced 6 of gunicorn's attributes and util.write_error. Only what gunicorn has no hook for stays replaced,
# in the worker, with its reason beside it.
GUNICORN_REPLACED = {"service/guard/worker.py: util.write_error"}


def _root_name(node: ast.AST) -> str | None:
    while isinstance(node, ast.Attribute | ast.Subscript):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def gunicorn_assignments(path: Path, where: str) -> list[str]:
    """Assignments (or setattr calls) to an attribute of anything imported from gunicorn, as ``where: target``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.asname or a.name.split(".")[0] for a in node.names if a.name.split(".")[0] == "gunicorn")
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "gunicorn":
            names.update(a.asname or a.name for a in node.names)
    for node in ast.walk(tree):                  # and what is bound to one of them (``worker = gthread.ThreadWorker``)
        if isinstance(node, ast.Assign):
            pairs = [(t, node.value) for t in node.targets]
            pairs += [p for t, v in pairs if isinstance(t, ast.Tuple) and isinstance(v, ast.Tuple)
                      for p in zip(t.elts, v.elts)]
            names.update(t.id for t, v in pairs if isinstance(t, ast.Name) and _root_name(v) in names)
    found = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, ast.AugAssign | ast.AnnAssign) else \
            [node.args[0]] if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "setattr" else []
        targets = [e for t in targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])]
        found += [f"{where}: {ast.unparse(t)}" for t in targets
                  if (isinstance(t, ast.Attribute) or isinstance(node, ast.Call)) and _root_name(t) in names]
    return found


def test_no_gunicorn_attribute_is_assigned_outside_the_guards_worker():
    found = [f for path in service_modules().values()
             for f in gunicorn_assignments(path, str(path.relative_to(ROOT)))]
    assert sorted(found) == sorted(GUNICORN_REPLACED)


def test_the_gunicorn_check_sees_a_patch(tmp_path):
    mod = tmp_path / "m.py"
    mod.write_text("import gunicorn.http.wsgi\nfrom gunicorn.workers import gthread as g\nfrom gunicorn import util\n"
                   "g.ThreadWorker.handle = h\nutil.write_error = w\nsetattr(g.TConn, 'close', c)\n"
                   "gunicorn.http.wsgi.Response.should_close = s\nother.x = 1\nself.sock = util\n"
                   "w, c = g.ThreadWorker, g.TConn\nc.close, w.run = f, r\n")
    assert sorted(gunicorn_assignments(mod, "m")) == ["m: c.close", "m: g.TConn", "m: g.ThreadWorker.handle",
                                                      "m: gunicorn.http.wsgi.Response.should_close",
                                                      "m: util.write_error", "m: w.run"]


def test_gunicorn_runs_the_guarded_worker():
    """service/gunicorn_conf.py names the guard's worker, a subclass of gunicorn's threaded one."""
    from gunicorn.util import load_class
    from gunicorn.workers.gthread import ThreadWorker
    text = (SERVICE / "gunicorn_conf.py").read_text(encoding="utf-8")
    [name] = re.findall(r'^worker_class = "([\w.]+)"$', text, re.M)
    assert issubclass(load_class(name), ThreadWorker) and name == "service.guard.worker.GuardedWorker"


# --- the app's parts in one typed state (issue 52) ---------------------------------------------------------
# create_app sets one AppState (service/state.py) and everything reads it through app_state(); 26 look-ups in
# service/ and 161 in tests and bench named its parts by string keys. bench/common.py's app_parts still reads an
# older build's (--rev, --old) where that build kept them.
_EXTENSION_KEY_RE = re.compile(r"""extensions\s*(?:\[|\.get\(|\.setdefault\(|\.pop\()\s*f?["']context""")
STATE_READERS_OF_EXTENSIONS = {"bench/common.py"}


def extension_lookups(text: str) -> list[str]:
    return _EXTENSION_KEY_RE.findall(text)


def test_no_part_of_the_app_is_looked_up_by_a_string_key():
    files = [*SERVICE.rglob("*.py"), *(ROOT / "tests").glob("*.py"), *(ROOT / "bench").glob("*.py")]
    found = [f"{p.relative_to(ROOT)}: {hit}" for p in sorted(files) if p != Path(__file__)
             and str(p.relative_to(ROOT)) not in STATE_READERS_OF_EXTENSIONS
             for hit in extension_lookups(p.read_text(encoding="utf-8"))]
    assert found == []


@pytest.mark.parametrize("lookup", ['app.extensions["context_store"]', "current_app.extensions.get('context_hub')",
                                    'app.extensions [ "context_keys"]', 'a.extensions.setdefault("context_x", {})',
                                    "self._extensions[f\"context_{name}\"]"])
def test_the_string_key_check_sees_a_lookup(lookup):
    assert extension_lookups(lookup)


# --- one name per function (issue 52) ------------------------------------------------------------------------
# Three functions were named scoring_sql, two tool_uri (the same one twice) and two parse_search (a search's
# parameters, and a tool search's). A public function's name is defined in one module of service/, but where the
# same role has a function in several places: a module and its namesake in the other backend, each module's
# init_app and register_cli, and these, each the same operation at another door or source.
SHARED_NAMES = {
    "best": "the best k of one source: read-your-writes' tail, the read index, the read index with threads",
    "check": "a configuration's check: the server's preflight, and each backend's",
    "doctor": "`context-mode doctor`, and each backend's lines of it",
    "export": "an export: the REST view and the command", "forget": "the REST view and the command",
    "push": "the REST view and the command", "search": "the REST view, the command, the MCP resource, the index",
    "list_units": "the REST view, the command and each backend's", "stats": "the REST view, the command, each backend's",
    "main": "a process's entry: the command line, the maintainer", "run": "`context-mode run`, the maintainer's loop",
    "parse": "a request's fields (params.py), a resource URI (uris.py)",
    "paths": "each OpenAPI module's paths", "register": "a blueprint's or MCP table's registration, the index schema's",
    "schema": "a parameter's JSON Schema (params.py), each backend's schema script",
    "score": "each backend's scoring statement run: SQLite's fts.py, PostgreSQL's scoring.py",
}
PER_MODULE = {"init_app", "register_cli"}


def shared_names() -> dict[str, list[str]]:
    """Public module-level function names defined in more than one module of service/, but a backend module's
    namesake in the other backend (@overload stubs of one function count once)."""
    found: dict[str, set[str]] = {}
    for path in service_modules().values():
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and not node.name.startswith("_"):
                found.setdefault(node.name, set()).add(str(path.relative_to(ROOT)))
    peer = re.compile(r"/(sqlite|postgresql)/")
    return {name: sorted(paths) for name, paths in found.items()
            if len({peer.sub("/<backend>/", p) for p in paths}) > 1}


def test_a_function_name_means_one_thing():
    names = shared_names()
    assert sorted(set(names) - set(SHARED_NAMES) - PER_MODULE) == []
    assert sorted(set(SHARED_NAMES) - set(names)) == []           # (a name no longer shared leaves the list)


# --- "thread" is a conversation's in the packages that keep them (issue 52) ---------------------------------------
# The store, the ranking and the read index assign, read and rank a unit's thread (docs/design.md §3 "Threads"); an
# OS thread there is named by its role, a worker or a pool, so that "thread" in their code and prose is a
# conversation's. (Code names threading's classes, which these phrases do not match.)
THREAD_PACKAGES = ("store", "ranking", "readindex")
_OS_THREAD_RE = re.compile(r"\b(?:background|maintenance|tantivy|watcher|request's|worker's|another|each|own|OS|daemon|"
                           r"indexer|search|writer)\s+threads?\b|\bthreads?[- ](?:pool|switch\w*|included|waits)\b",
                           re.I)


def os_threads(text: str) -> list[str]:
    return [m.group(0) for m in _OS_THREAD_RE.finditer(text)]


def test_a_thread_in_the_store_the_ranking_and_the_read_index_is_a_conversations():
    found = [f"{path.relative_to(ROOT)}: {phrase}" for package in THREAD_PACKAGES
             for path in sorted((SERVICE / package).rglob("*.py")) for phrase in os_threads(path.read_text("utf-8"))]
    assert found == []


@pytest.mark.parametrize("prose", [
    "In each process one background thread does the maintenance",
    "(a tantivy thread each while loaded)",
    "keeps threads free for everything else, in the request's thread",
    "cost every search two thread switches",
    "another worker's thread, or another process's indexer",
    "fn over shards on the thread pool",
    "units per thread-pool task",
])
def test_the_thread_check_sees_an_os_thread(prose):
    assert os_threads(prose)


@pytest.mark.parametrize("prose", [
    "a child joins its parent's thread", "The highest place taken in this thread", "a thread's head",
    "leaves it a thread of its own", "self._worker = threading.Thread(target=self._run)",
    "ThreadPoolExecutor(n, thread_name_prefix='search')",
])
def test_the_thread_check_lets_a_conversations_thread_be(prose):
    assert os_threads(prose) == []
