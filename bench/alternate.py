"""Two builds of the service at fixed offered push loads, alternating round by round (A B, B A, A B,
...) on fresh copies of the same corpus, so that a shared machine's load moves both alike: ack p50/p99,
pushes answered, and the server's CPU per push (every server process) for each rate and round.

    python bench/alternate.py --new head --old 46f0a6a --rates 250,1000 --rounds 3 --name alternate-maintainer
"""
from __future__ import annotations

import argparse
import os
import shutil
import time

import write as W
from common import TMP, add_build_pair, machine, service_rev, service_src, write_json


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_build_pair(ap, rounds=3)
    ap.add_argument("--rates", default="250,1000")
    ap.add_argument("--name", default="alternate")
    a = ap.parse_args(argv)
    from corpus import service_dir
    srcs = {"new": service_src(a.new), "old": service_src(a.old)}
    W.H.write_inputs(a.seed, nonce=f"alt{int(time.time())}")
    bodies = TMP / "http-push-bodies.txt"
    rates = [float(r) for r in a.rates.split(",")]
    out = {"machine": machine(), "new": service_rev(srcs["new"]), "old": service_rev(srcs["old"]),
           "load_at_start": os.getloadavg(), "cells": []}
    for rnd in range(a.rounds):
        for name in (("new", "old") if rnd % 2 == 0 else ("old", "new")):
            d = TMP / "run-alternate"
            shutil.rmtree(d, ignore_errors=True)
            shutil.copytree(service_dir(a.size, a.seed), d / "service")
            port = W.H.free_port()
            proc = W.H.start_service(srcs[name], d / "service", port)
            try:
                W.H.wait_ready(port, 180)
                W.H.wrk(TMP / "http-push.lua", port, 8, 2)
                W.H.wait_idle(proc.pid)
                for rate in rates:
                    c0 = W.server_cpu(proc.pid)
                    ol = W.open_loop(port, bodies, rate, a.duration)
                    cpu = (W.server_cpu(proc.pid) - c0) * 1000 / max(1, ol.get("answered") or 1)
                    out["cells"].append({"round": rnd, "build": name, "rate": rate, "cpu_ms_per_push": round(cpu, 3),
                                         **ol})
                    print(f"{rnd} {name} {rate:6.0f}/s  answered {ol['answered']:6d}  p50 {ol['p50']:8.2f}  "
                          f"p99 {ol['p99']:8.2f} ms  CPU {cpu:.2f} ms/push", flush=True)
                    W.H.wait_idle(proc.pid)
            finally:
                W.H.stop(proc)
    out["load_at_end"] = os.getloadavg()
    write_json(a.name, out)


if __name__ == "__main__":
    main()
