"""Tool registrations whose text is built to make a backtracking secret check slow (issue 39, finding 6): does
the other tenant keep its /healthz and searches?

For each build (``--before`` and the code under test), a fresh gunicorn as `make run` serves it (2 workers x 8
threads, no nginx) with the keys of bench/large_answers.py; beta holds a few hundred small units. Beta's probes
run alone for ``--quiet`` seconds, then while alpha's admin key registers two tools at once, each with
``--kib`` KiB of ``a+`` (then ``a.``, then ``token``) in its input schema's description (the schema may hold 256
KiB): two at once of each text, one pair after the other, as the finding did (``--mode pairs``, the probes
measured for at least ``--attack`` seconds from the first), or two loops registering for ``--attack`` seconds
(``--mode loop``: a sustained load, which measures the registration's own cost). Reported: each
registration's status and seconds (a gunicorn timeout shows as a connection error), beta's p50/p95/max and
timeouts per phase, and the attack phase's p50 over the quiet one's.

    .venv/bin/python bench/registry_load.py                  # before = 14e547d, this worktree after
    .venv/bin/python bench/registry_load.py --mode loop --attack 30 --name registry-load-loop

Writes bench/results/registry-load.json. Loopback only, bounded in time (each registration waits 120 s at most).
"""
from __future__ import annotations

import argparse
import json
import threading
import time

import requests

from common import machine, service_rev, service_src, write_json
from large_answers import ALPHA_ADMIN, BETA, Probes, start, stop, unit


def register(url: str, name: str, text: str, out: list) -> None:
    tool = {"name": name, "description": "A tool whose schema describes its argument at length.",
            "input_schema": {"type": "object", "properties": {"q": {"type": "string", "description": text}}}}
    started = time.perf_counter()
    try:
        rv = requests.post(url + "/mcp/tools", json=tool, headers={"Authorization": f"Bearer {ALPHA_ADMIN}"},
                           timeout=120)
        status = rv.status_code
    except requests.RequestException as e:
        status = type(e).__name__
    out.append({"name": name, "status": status, "seconds": round(time.perf_counter() - started, 2)})


def hostile(url: str, until: float, kib: int, worker: int, out: list) -> None:
    """Register tools until ``until``, cycling through the three texts, each under a new name."""
    i = 0
    while time.monotonic() < until:
        kind, unit_text = TEXTS[i % len(TEXTS)]
        register(url, f"hostile_{worker}_{i}_{kind}", unit_text * (kib * 1024 // len(unit_text)), out)
        i += 1


def pairs(url: str, kib: int, out: list) -> None:
    """The finding: two registrations at once of each text, one pair after the other."""
    for kind, unit_text in TEXTS:
        two = [threading.Thread(target=register, args=(url, f"hostile_{w}_{kind}", unit_text * (kib * 1024 //
                                                                                               len(unit_text)), out))
               for w in range(2)]
        for t in two:
            t.start()
        for t in two:
            t.join()


TEXTS = (("a_plus", "a+"), ("a_dot", "a."), ("token", "token"))


def one_build(src, name: str, kib: int, quiet: float, seconds: float, mode: str) -> dict:
    proc, url, data = start(src, name)
    try:
        small = [unit(f"order ORD-{i} shipped by carrier {i % 7}, 订单 {i} 已发货", "orders_v1") for i in range(300)]
        requests.post(url + "/mcp/push", json=small, headers={"Authorization": f"Bearer {BETA}"},
                      timeout=60).raise_for_status()
        probes = Probes(url)
        for t in probes.threads:
            t.start()
        time.sleep(quiet)
        probes.phase = "attack"
        registrations: list = []
        started = time.monotonic()
        if mode == "loop":
            loops = [threading.Thread(target=hostile, args=(url, started + seconds, kib, w, registrations))
                     for w in range(2)]
            for t in loops:
                t.start()
            for t in loops:
                t.join()
        else:
            pairs(url, kib, registrations)
            time.sleep(max(0.0, started + seconds - time.monotonic()))   # the probes' window: at least this long
        probes.stopping = True
        for t in probes.threads:
            t.join(timeout=15)
        statuses: dict = {}
        for r in registrations:
            statuses[str(r["status"])] = statuses.get(str(r["status"]), 0) + 1
        return {"build": name, "service": service_rev(src), "registration_statuses": statuses,
                "registration_seconds_max": max(r["seconds"] for r in registrations),
                "registrations": registrations, "probes": probes.report()}
    finally:
        stop(proc, data)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", default="14e547d")
    ap.add_argument("--after", default="worktree")
    ap.add_argument("--kib", type=int, default=250)
    ap.add_argument("--quiet", type=float, default=15.0)
    ap.add_argument("--attack", type=float, default=10.0,
                    help="seconds the probes run under attack at least (the loops' length with --mode loop)")
    ap.add_argument("--mode", choices=("pairs", "loop"), default="pairs",
                    help="pairs: the finding, two registrations at once of each text; loop: two loops registering")
    ap.add_argument("--name", default="registry-load")
    args = ap.parse_args(argv)
    runs = []
    for name, rev in (("before", args.before), ("after", args.after)):
        row = one_build(service_src(rev), name, args.kib, args.quiet, args.attack, args.mode)
        print(json.dumps(row), flush=True)
        runs.append(row)
    write_json(args.name, {"machine": machine(), "kib": args.kib, "mode": args.mode, "attack_s": args.attack,
                           "runs": runs})


if __name__ == "__main__":
    main()
