"""What several benchmarks use to set up what they measure, with nothing of any one benchmark: a throwaway
PostgreSQL primary and standby (tools/pg_cluster.py), units pushed in process, a node's read index waited for, an
older build's copy of the data brought up to date. Each benchmark imports these from here, so none imports another
to reach them (bench/http_bench.py once imported postgresql.py and alternate_search.py, which import it: a circle).
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import time

from common import BENCH, ROOT, app_parts


def pg_tool():
    """tools/pg_cluster.py, loaded as a module (tools/ is not a package)."""
    spec = importlib.util.spec_from_file_location("pg_cluster", ROOT / "tools" / "pg_cluster.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return tool


def pg_cluster(base):
    """A fresh primary and streaming standby under ``base`` (fsync on, 256 MB of shared buffers each)."""
    shutil.rmtree(base, ignore_errors=True)
    return pg_tool().Cluster(base, shared_buffers="256MB").start()


def push_all(app, units: list[dict]) -> None:
    """Push the units in batches of 1,000 (``push_many``, in process); any refused unit stops the run."""
    store = app_parts(app).store
    for i in range(0, len(units), 1000):
        for res in store.push_many("default", units[i:i + 1000]):
            if not isinstance(res, dict):
                raise RuntimeError(f"push failed: {res}")


def wait_index(port: int, timeout: float) -> float:
    """Until the node's /readyz says its read index lacks no unit; seconds waited."""
    import requests
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        try:
            body = requests.get(f"http://127.0.0.1:{port}/readyz", timeout=10).json()
            behind = (body.get("read_index") or {}).get("units")
            if behind == 0:
                return round(time.perf_counter() - t0, 1)
        except (requests.RequestException, ValueError):
            pass
        time.sleep(1)
    raise RuntimeError(f"node on port {port}: read index not built in {timeout} s")


def up_to_date(src, data_dir) -> None:
    """Bring a copy's derived files (the read index of this build's format) up to date with that build, in a
    process of its own, before it serves (as corpus.service_dir does for the bench's own build)."""
    code = ("import sys; sys.path[:0] = [sys.argv[1], sys.argv[3]]; from service import create_app; "
            "from common import app_parts; app = create_app({'data_dir': sys.argv[2], 'background': False}); "
            "parts = app_parts(app); parts.maintenance.run_once(); parts.shutdown()")
    subprocess.run([sys.executable, "-c", code, str(src), str(data_dir), str(BENCH)], check=True, capture_output=True,
                   env=dict(os.environ, PYTHONPATH=str(src)), timeout=900)
