"""Profile the hot paths with py-spy (sampling, all threads): search at a corpus size, ingest
(push_many then draining the index), and single-unit pushes over HTTP (a gunicorn worker under 50 wrk
writers, only while a thread holds the GIL). Writes collapsed stacks to bench/results/tmp/ and the
top frames (inclusive and self share of samples) to bench/results/profile-<what>.txt.

    python bench/profile.py search --size 1000000 --seconds 30
    python bench/profile.py ingest --units 30000
    python bench/profile.py push --seconds 8

Under load over HTTP (issue 42): one worker of a real gunicorn serving the 100k corpus at 64 wrk connections,
``--load questions`` (whole questions) or ``--load healthz``, on ``--store sqlite`` or ``postgresql`` (the
same units in tools/pg_cluster.py, as bench/http_bench.py --postgresql loads them), or the bare app
(``--store bare``, bench/bare_app.py) for comparison. Threads on a CPU only (py-spy leaves out threads that
wait: for the GIL, a lock, a socket), or with ``--gil`` only the thread that holds the GIL:

    python bench/profile.py http --load questions --store sqlite --seconds 20
"""
from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import time

from common import RESULTS, TMP, app_parts, quiet_service_logs, service_rev, service_src


def workload_search(size: int, seconds: float, seed: int) -> None:
    from corpus import queries, service_dir
    from service import create_app
    from service.params import parse_search
    app = create_app({"data_dir": str(service_dir(size, seed)), "background": False})
    store, cfg = app_parts(app).store, app.config["CONTEXT"]
    qs = queries(2000, seed)
    for q in qs[:30]:
        store.search("default", parse_search({"query": q}, cfg))
    print("READY", flush=True)
    deadline = time.time() + seconds
    i = 30
    while time.time() < deadline:
        store.search("default", parse_search({"query": qs[i % len(qs)]}, cfg))
        i += 1
    print(f"ran {i - 30} searches", flush=True)


def workload_ingest(units: int, seed: int) -> None:
    import shutil
    from corpus import Generator
    from service import create_app
    d = TMP / "profile-ingest"
    shutil.rmtree(d, ignore_errors=True)
    us = list(Generator(seed + 500).units(units))
    app = create_app({"data_dir": str(d), "background": False})
    store, maint = app_parts(app).store, app_parts(app).maintenance
    print("READY", flush=True)
    for i in range(0, len(us), 1000):
        store.push_many("default", us[i:i + 1000])
    while maint.index_tenant(store.tenant("default")):
        pass
    app_parts(app).shutdown()
    shutil.rmtree(d, ignore_errors=True)


IDLE_LEAVES = ("_worker (concurrent/futures/thread.py:81)", "Condition.wait", "Event.wait", "Thread.join",
              "_wait_for_tstate_lock", "SimpleQueue.get")


def summarize(raw_path, top: int = 25) -> str:
    incl, self_, total, idle = collections.Counter(), collections.Counter(), 0, 0
    for line in open(raw_path, encoding="utf-8", errors="replace"):
        stack, _, n = line.rstrip("\n").rpartition(" ")
        if not stack:
            continue
        n = int(n)
        total += n
        frames = [f for f in stack.split(";") if f]
        frames = frames[1:] if frames and frames[0].startswith(("process ", "thread ")) else frames
        if frames and any(frames[-1].startswith(x) for x in IDLE_LEAVES):
            idle += n          # an idle pool thread waiting for work: not a hot path
            continue
        for f in set(frames):
            incl[f] += n
        if frames:
            self_[frames[-1]] += n
    total -= idle
    lines = [f"{total} busy samples ({idle} idle pool-thread samples left out)", "", "inclusive (share of samples with this frame on the stack):"]
    lines += [f"  {100 * n / total:5.1f}%  {f}" for f, n in incl.most_common(top)]
    lines += ["", "self (share of samples with this frame on top):"]
    lines += [f"  {100 * n / total:5.1f}%  {f}" for f, n in self_.most_common(top)]
    return "\n".join(lines)


def profile_push(src, seconds: float, seed: int, raw) -> str:
    """One worker of a real gunicorn (empty data dir) under 50 closed-loop wrk push writers."""
    import shutil
    import uuid

    import psutil
    import http_bench as H
    data = TMP / "profile-push"
    shutil.rmtree(data, ignore_errors=True)
    data.mkdir(parents=True)
    port = H.free_port()
    server = H.start_service(src, data, port)
    try:
        H.wait_ready(port)
        scripts = H.write_inputs(seed, uuid.uuid4().hex[:8])
        H.wrk(scripts["push"], port, 8, 2)                      # warm up: connections, the day file
        procs = [psutil.Process(server.pid)] + psutil.Process(server.pid).children(recursive=True)
        worker = next(p.pid for p in procs[1:] if H.role_of(p.pid, server.pid) == "worker")
        cpu = lambda: sum(p.cpu_times().user + p.cpu_times().system for p in procs)  # noqa: E731
        cpu0 = cpu()
        spy = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "py-spy"), "record", "--gil",
                                "--nonblocking", "--format", "raw", "--rate", "200", "--duration",
                                str(int(seconds)), "--pid", str(worker), "-o", str(raw)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        res = H.wrk(scripts["push"], port, 50, seconds + 2)
        used = cpu() - cpu0
        spy.wait()
        return (f"{res['rps']} pushes/s, p50 {res['p50']} ms, p99 {res['p99']} ms, {res['errors']} errors, "
                f"server CPU {1000 * used / max(1, res['requests']):.3f} ms per push (all processes)")
    finally:
        H.stop(server)
        shutil.rmtree(data, ignore_errors=True)


def profile_http(src, load: str, store: str, size: int, seconds: float, seed: int, raw, gil: bool) -> str:
    """One worker of a real gunicorn under 64 wrk connections of ``load``, sampled by py-spy (non-blocking)."""
    import shutil

    import psutil
    import http_bench as H
    from corpus import service_dir
    run = TMP / "profile-http"
    shutil.rmtree(run, ignore_errors=True)
    shutil.copytree(service_dir(size, seed), run / "service")
    cluster, port = None, H.free_port()
    try:
        if store == "bare":
            import bare_app
            bare_app.build(run / "service", run / "bare")
            server = H.start_bare(src, run / "bare", port)
        elif store == "postgresql":
            from servers import wait_index
            cluster, env = H.pg_store(run / "service", TMP / "profile-pg-cluster")
            server = H.start_gunicorn(src, "service:create_app()", port, "profile-pg.log", str(src),
                                      CONTEXT_DATA_DIR=str(run / "pg-node"), **env)
        else:
            server = H.start_service(src, run / "service", port)
        H.wait_ready(port, 600)
        if store == "postgresql":
            wait_index(port, 1800)
        scripts = H.write_inputs(seed, "profile", kind="questions")
        H.wrk(scripts[{"questions": "search"}.get(load, load)], port, 64, 5)       # warm up
        procs = [psutil.Process(server.pid)] + psutil.Process(server.pid).children(recursive=True)
        worker = next(p.pid for p in procs[1:] if H.role_of(p.pid, server.pid) == "worker")
        cpu = lambda: sum(p.cpu_times().user + p.cpu_times().system for p in procs)  # noqa: E731
        cpu0 = cpu()
        spy = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "py-spy"), "record",
                                *(["--gil"] if gil else []),
                                "--nonblocking", "--format", "raw", "--rate", "250", "--duration",
                                str(int(seconds)), "--pid", str(worker), "-o", str(raw)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        res = H.wrk(scripts[{"questions": "search"}.get(load, load)], port, 64, seconds + 2)
        used = cpu() - cpu0
        spy.wait()
        H.stop(server)
        return (f"{res['rps']} requests/s, p50 {res['p50']} ms, p99 {res['p99']} ms, {res['errors']} errors, "
                f"server CPU {1000 * used / max(1, res['requests']):.3f} ms per request (all its processes)")
    finally:
        if cluster is not None:
            cluster.stop()
        shutil.rmtree(run, ignore_errors=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("search", "ingest", "push", "http"))
    ap.add_argument("--load", choices=("questions", "healthz"), default="questions")
    ap.add_argument("--store", choices=("sqlite", "postgresql", "bare"), default="sqlite")
    ap.add_argument("--gil", action="store_true", help="http: only the thread holding the GIL")
    ap.add_argument("--size", type=int, default=None, help="units (search: 1,000,000; http: 100,000)")
    ap.add_argument("--units", type=int, default=30_000)
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--service-src", default="head")
    ap.add_argument("--workload", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    a.size = a.size or (100_000 if a.what == "http" else 1_000_000)
    src = service_src(a.service_src)
    if a.workload:
        quiet_service_logs()
        if a.what == "search":
            workload_search(a.size, a.seconds, a.seed)
        else:
            workload_ingest(a.units, a.seed)
        return
    TMP.mkdir(parents=True, exist_ok=True)
    tag = {"search": f"search-{a.size}", "push": "push-gil", "http": f"http-{a.load}-{a.store}{'-gil' if a.gil else ''}"}.get(a.what, a.what)
    raw = TMP / f"profile-{tag}.collapsed"
    if a.what == "http":
        run = profile_http(src, a.load, a.store, a.size, a.seconds, a.seed, raw, a.gil)
        text = (f"py-spy profile of one worker under 64 connections of {a.load}, {a.store}, {a.size} units, "
                f"service {service_rev(src)}\n{run}\n") + summarize(raw, top=40)
        out = RESULTS / f"profile-{tag}.txt"
        out.write_text(text + "\n")
        print(text)
        print(f"wrote {out}")
        return
    if a.what == "push":
        run = profile_push(src, a.seconds, a.seed, raw)
        text = f"py-spy --gil profile of one worker under 50 push writers, service {service_rev(src)}\n{run}\n"
        text += summarize(raw, top=40)
        out = RESULTS / f"profile-{tag}.txt"
        out.write_text(text + "\n")
        print(text)
        print(f"wrote {out}")
        return
    # Start the workload, wait until its setup is done, then attach: startup is not profiled.
    work = subprocess.Popen([sys.executable, __file__, a.what, "--workload", "--size", str(a.size),
                             "--units", str(a.units), "--seconds", str(a.seconds), "--seed", str(a.seed),
                             "--service-src", a.service_src], stdout=subprocess.PIPE, text=True)
    for line in work.stdout:
        if line.startswith("READY"):
            break
    spy = os.path.join(os.path.dirname(sys.executable), "py-spy")
    subprocess.run([spy, "record", "--format", "raw", "--rate", "200", "--pid", str(work.pid),
                    "-o", str(raw)], check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    print(work.stdout.read().strip())
    work.wait()
    text = f"py-spy profile of {a.what} ({tag}), service {service_rev(src)}\n" + summarize(raw)
    out = RESULTS / f"profile-{tag}.txt"
    out.write_text(text + "\n")
    print(text)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
