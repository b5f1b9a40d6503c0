"""The one secret detector on adversarial input (issue 39, findings 5 and 6): how long the tool registry's check
(``secretscan.first``, what service/toolcheck.py asks) and the hooks' masking (``masking.mask``) take over 1 MiB
of input built to make a backtracking pattern slow (``a+``, ``a.``, ``token``, and one case per rule family), and
over a realistic tool output; the two detectors they replace (service/toolcheck.py's SECRET_VALUES and the
former clients/python/context_mode_client/masking.py, read from ``--before``) over growing sizes of the same
input, each call in a child process stopped after ``--timeout`` seconds; and what importing the detector costs a
hook's fresh process.

    .venv/bin/python bench/secretscan.py                     # before = 14e547d (the last commit with both)
    .venv/bin/python bench/secretscan.py --before <rev> --timeout 20

Writes bench/results/secretscan.json. Nothing here is a test: it prints what it measured.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, machine, write_json

MIB = 1 << 20
CLIENT = ROOT / "clients" / "python"
sys.path.insert(0, str(CLIENT))

# unit repeated to fill the input; each aims at one way a pattern could read the text again and again
UNITS = {
    "a+": "a+", "a.": "a.", "token": "token", "token, space": "token ", "token=": "token=", "token: ": "token: ",
    'password="': 'password="', "auth": "auth", "a:bcd@ (user:pw@host)": "a:bcd@", "://": "://", "eyJ": "eyJ",
    "eyJ…. (JWT parts)": "eyJaaaaaaaaa.", "ghp_": "ghp_", "sk-": "sk-", "AKIA": "AKIA", "00": "00", "s.": "s.",
    "PEM BEGIN": "-----BEGIN PRIVATE KEY-----", "Bearer ": "Bearer ", "--password ": "--password ",
    "mysql -p": "mysql -pxx ", "?key=": "?key=", "1Q~ (Azure)": "1Q~", "-us1 (Mailchimp)": "-us1",
    "plain x": "x", "quotes": '"',
}


def fill(unit: str, size: int) -> str:
    return (unit * (size // len(unit) + 1))[:size]


def realistic(size: int) -> str:
    """A tool output: log lines, JSON, a curl line, an env dump, Chinese text, with a few secrets."""
    lines = ['{"order_id": "ORD-7890", "status": "shipped", "carrier": "顺丰", "items": [1, 2, 3]}',
             "2024-05-01T10:00:00Z INFO request id 550e8400-e29b-41d4-a716-446655440000 took 12 ms",
             "commit 3f786850e387550fdab836ed7e6dc881de23001b (HEAD -> main)",
             "curl -H 'Authorization: Bearer abcdefghij0123456789' https://api.example.com/v1/orders?page=2",
             "DB_PASSWORD=correct-horse-battery-staple", "订单 ORD-7890 已发货, 预计明天送达",
             "    at com.example.orders.Service.ship(Service.java:42)",
             "export PATH=/usr/local/bin:$PATH && make test", "GITHUB_TOKEN=ghp_0123456789abcdefABCDEF0123456789abcd"]
    return fill("\n".join(lines) + "\n", size)


def median_seconds(fn, text: str, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn(text)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def new_detector() -> dict:
    from context_mode_client import masking, secretscan
    rows = []
    for name, unit in UNITS.items():
        text = fill(unit, MIB)
        rows.append({"input": name, "registry_check_s": round(median_seconds(secretscan.first, text), 3),
                     "hook_mask_s": round(median_seconds(masking.mask, text), 3)})
        print(json.dumps(rows[-1]), flush=True)
    text = realistic(MIB)
    rows.append({"input": "realistic tool output", "registry_check_s": round(median_seconds(secretscan.first, text), 3),
                 "hook_mask_s": round(median_seconds(masking.mask, text), 3)})
    print(json.dumps(rows[-1]), flush=True)
    return {"size_bytes": MIB, "rows": rows,
            "worst_registry_check_s": max(r["registry_check_s"] for r in rows),
            "worst_hook_mask_s": max(r["hook_mask_s"] for r in rows)}


OLD_CHILD = """
import re, sys, time, json
kind, unit, size, path = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
text = (unit * (size // len(unit) + 1))[:size]
src = open(path).read()
if kind == "registry":
    start = src.index("SECRET_VALUES = re.compile(")
    end = src.index(")))", start) + 3
    scope = {"re": re}
    exec(src[start:end], scope)
    fn = scope["SECRET_VALUES"].search
else:
    scope = {"__name__": "old_masking"}
    exec(compile(src, "old_masking", "exec"), scope)
    fn = scope["mask"]
started = time.perf_counter()
fn(text)
print(time.perf_counter() - started)
"""


def old_detectors(before: str, timeout: float) -> dict:
    """The replaced detectors, each call in a child process (a regex holding the GIL cannot be interrupted)."""
    folder = Path(tempfile.mkdtemp(prefix="secretscan-before-"))
    paths = {}
    for kind, rel in (("registry", "service/toolcheck.py"), ("hook", "clients/python/context_mode_client/masking.py")):
        paths[kind] = folder / f"{kind}.py"
        paths[kind].write_text(subprocess.run(["git", "show", f"{before}:{rel}"], cwd=ROOT, check=True,
                                              capture_output=True, text=True).stdout)
    rows = []
    for name in ("a+", "a.", "token", "token: ", "://", "plain x"):
        for size in (4096, 16384, 65536, MIB):
            row = {"input": name, "size_bytes": size}
            for kind in ("registry", "hook"):
                try:
                    out = subprocess.run([sys.executable, "-c", OLD_CHILD, kind, UNITS[name], str(size),
                                          str(paths[kind])], capture_output=True, text=True, timeout=timeout)
                    row[f"{kind}_s"] = round(float(out.stdout.strip()), 3)
                except subprocess.TimeoutExpired:
                    row[f"{kind}_s"] = f">{timeout:g}"
            rows.append(row)
            print(json.dumps(row), flush=True)
            if all(isinstance(row[k], str) for k in ("registry_s", "hook_s")):
                break                                        # larger sizes only take longer
    shutil.rmtree(folder, ignore_errors=True)
    return {"before": before, "timeout_s": timeout, "rows": rows}


IMPORT_CHILD = """
import importlib.util, sys, time
import requests, typing, functools      # what a hook has imported anyway
started = time.perf_counter()
spec = importlib.util.spec_from_file_location("detector", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
imported = time.perf_counter()
module.mask("curl -H 'Authorization: Bearer abcdefghij0123456789' https://api.example.com " * 100)
print(imported - started, time.perf_counter() - imported)
"""


def import_cost(before: str, runs: int = 15) -> dict:
    """Importing the detector in a fresh process, its bytecode cached (as an installed package has it), then
    masking 8 KB; the former masking module (which compiled its patterns at import) beside it."""
    folder = Path(tempfile.mkdtemp(prefix="secretscan-import-"))
    new = folder / "secretscan.py"
    shutil.copy(CLIENT / "context_mode_client" / "secretscan.py", new)
    old = folder / "old_masking.py"
    old.write_text(subprocess.run(["git", "show", f"{before}:clients/python/context_mode_client/masking.py"],
                                  cwd=ROOT, check=True, capture_output=True, text=True).stdout)
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(folder)], check=True, env=env)
    out = {}
    for name, path in (("secretscan", new), ("former masking.py", old)):
        imports, masks = [], []
        for _ in range(runs):
            rv = subprocess.run([sys.executable, "-c", IMPORT_CHILD, str(path)], capture_output=True, text=True,
                                env=env, check=True)
            i, m = map(float, rv.stdout.split())
            imports.append(i)
            masks.append(m)
        out[name] = {"import_ms_p50": round(statistics.median(imports) * 1000, 2),
                     "mask_8kb_ms_p50": round(statistics.median(masks) * 1000, 2)}
        print(name, json.dumps(out[name]), flush=True)
    shutil.rmtree(folder, ignore_errors=True)
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", default="14e547d", help="the commit whose two detectors are compared")
    ap.add_argument("--timeout", type=float, default=20.0, help="seconds one call of a former detector may take")
    args = ap.parse_args(argv)
    result = {"machine": machine(), "python": sys.version.split()[0]}
    print("== the detector, 1 MiB of each input (median of 3)")
    result["detector"] = new_detector()
    print("== import cost in a fresh process")
    result["import"] = import_cost(args.before)
    print(f"== the former detectors ({args.before}), growing inputs")
    result["before"] = old_detectors(args.before, args.timeout)
    write_json("secretscan", result)


if __name__ == "__main__":
    main()
