"""Shared bench helpers: which service code to load, percentiles, results, machine facts, plots.

The working tree is shared with engineers editing ``service/`` concurrently, so by default
the benchmarks run a snapshot of the *committed* service (``git archive HEAD service sql``
into bench/results/tmp/src-<sha>/); ``--service-src worktree`` runs the working tree instead.
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tarfile
import io
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
RESULTS = BENCH / "results"
TMP = Path(os.environ.get("BENCH_TMP") or RESULTS / "tmp")     # scratch (BENCH_TMP: runs side by side)
TMP.mkdir(parents=True, exist_ok=True)      # (git-ignored: a fresh clone has no such folder)


class _ExtensionParts:
    """An older build's app parts, read where it kept them (``app.extensions["context_<name>"]``)."""

    def __init__(self, app):
        self._extensions = app.extensions

    def __getattr__(self, name: str):
        return self._extensions[f"context_{name}"]


def app_parts(app):
    """The parts of an app of the service under test (service/state.py's ``app_state``): ``.store``,
    ``.maintenance``, ``.shutdown()``... A build from before service/state.py (``--rev``, ``--old``) kept them in
    ``app.extensions``: this is the one place outside service/state.py that still reads them there."""
    try:
        from service.state import app_state      # (the editable install may find it even for an older build)
    except ImportError:
        return _ExtensionParts(app)
    state = app_state(app, optional=True)
    return state if state is not None else _ExtensionParts(app)


def service_src(mode: str = "head") -> Path:
    """A directory whose ``service/`` and ``sql/`` are the code under test; put first on sys.path."""
    if mode == "worktree":
        src = ROOT
    else:
        rev = subprocess.run(["git", "rev-parse", "--short=10", mode if mode != "head" else "HEAD"], cwd=ROOT,
                             check=True, capture_output=True, text=True).stdout.strip()
        src = TMP / f"src-{rev}"
        if not (src / "service" / "__init__.py").exists():
            data = subprocess.run(["git", "archive", rev, "service", "sql"], cwd=ROOT, check=True,
                                  capture_output=True).stdout
            src.mkdir(parents=True, exist_ok=True)
            with tarfile.open(fileobj=io.BytesIO(data)) as tf:
                tf.extractall(src)
            # Optional front doors not committed yet would otherwise be found in the working tree
            # by the editable install's finder: stub them (no init_app means "not registered").
            for pkg in ("mcp", "adapters"):
                init = src / "service" / pkg / "__init__.py"
                if not init.exists():
                    init.parent.mkdir(parents=True, exist_ok=True)
                    init.write_text('"""Not in this commit (bench snapshot stub)."""\n')
    if str(src) not in sys.path:
        sys.path.insert(0, str(src))
    return src


def add_build_pair(ap, rounds: int) -> None:
    """The arguments of a benchmark that alternates two builds of the service on copies of one corpus
    (bench/alternate.py, bench/alternate_search.py)."""
    ap.add_argument("--new", default="head")
    ap.add_argument("--old", required=True)
    ap.add_argument("--size", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=rounds)
    ap.add_argument("--duration", type=float, default=10)


def service_rev(src: Path) -> str:
    if src == ROOT:
        rev = subprocess.run(["git", "rev-parse", "--short=10", "HEAD"], cwd=ROOT, capture_output=True,
                             text=True).stdout.strip()
        return rev + "+worktree"
    return src.name.removeprefix("src-")


def pct(values, p: float) -> float | None:
    """Nearest-rank percentile (p in 0-100) of a list of numbers."""
    if not values:
        return None
    v = sorted(values)
    k = max(0, min(len(v) - 1, int(round(p / 100 * len(v) + 0.5)) - 1))
    return v[k]


def summary(values_ms) -> dict:
    return {"n": len(values_ms), "p50_ms": r(pct(values_ms, 50)), "p95_ms": r(pct(values_ms, 95)),
            "p99_ms": r(pct(values_ms, 99)), "max_ms": r(max(values_ms) if values_ms else None),
            "mean_ms": r(sum(values_ms) / len(values_ms) if values_ms else None)}


def r(x, nd=2):
    return None if x is None else round(float(x), nd)


def machine() -> dict:
    import psutil
    load = os.getloadavg()
    return {"nproc": os.cpu_count(), "cpu": platform.processor() or platform.machine(),
            "mem_total_gib": round(psutil.virtual_memory().total / 2**30, 1),
            "python": platform.python_version(), "sqlite": __import__("sqlite3").sqlite_version,
            "loadavg_at_start": [round(x, 2) for x in load], "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def write_json(name: str, data: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    print(f"wrote {path.relative_to(ROOT)}")
    return path


def save_plot(fig, name: str, dpi: int = 110) -> Path:
    """Write results/<name>.png (tight layout) and say where."""
    fig.tight_layout()
    path = RESULTS / f"{name}.png"
    fig.savefig(path, dpi=dpi)
    print(f"wrote {path}")
    return path


def plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as pyplot
    return pyplot


def quiet_service_logs() -> None:
    import logging
    logging.basicConfig(level=logging.ERROR)
    logging.getLogger().setLevel(logging.ERROR)
