"""gunicorn settings for `make run` (`gunicorn -c service/gunicorn_conf.py 'service:create_app()'`).

Timeouts are deliberate: a slow or stalled client cannot hold a worker thread for long,
and a worker that hangs is replaced. Live streams (subscriptions/listen, GET /mcp/stream) are the
one kind of response that holds a thread for long, on purpose: at most CONTEXT_MAX_STREAMS of a
worker's CONTEXT_THREADS (half by default; service/hub.py), so requests always find a free thread.
The slow-client guard bounds how a request *arrives* and how slowly a response may be read; a stream's
writes are bounded by its own timeout (a client that reads nothing for 30 s is dropped), and its
heartbeats keep idle proxies quiet.
"""
import os
import shutil
import sys

from service import preflight
from service.boot import freeze_heap, limit_malloc_arenas, make_metrics_dir
from service.state import app_state


def _say(line: str) -> None:
    print(f"context-mode: {line}", file=sys.stderr, flush=True)


# A configuration the workers would refuse stops the start here, in the master, with one line and exit
# status 1 (issue 26): not a traceback from every worker and "Worker failed to boot" in a restart loop.
try:
    _config = preflight.check(log=_say)
except preflight.Refused as e:
    sys.exit(f"context-mode: refusing to start: {e}")
for _warning in preflight.warnings(_config):
    _say(f"warning: {_warning}")
limit_malloc_arenas()   # in the master, before any thread: every forked worker keeps the limit

bind = _config.bind
workers = _config.workers
# gunicorn's gthread worker with the slow-client guard: requests (head and body) are buffered without a thread and
# authenticated before their body, every request has a total deadline, a thread's waits on a client are paced and
# every response has a write deadline, gunicorn's own errors are JSON (service/guard/).
worker_class = "service.guard.worker.GuardedWorker"
threads = _config.threads
timeout = 60            # a worker silent this long is killed and replaced
graceful_timeout = 20
keepalive = 5
limit_request_line = 8190
limit_request_fields = 100
limit_request_field_size = 16384
accesslog = None
errorlog = "-"
loglevel = "info"
preload_app = False     # each worker opens its own SQLite connections and threads after fork
# No shared ~/.gunicorn/gunicorn.ctl: every instance on a host would bind the same path.
control_socket_disable = True


# Loaded once here in the master and shared by every forked worker (copy-on-write): the service's
# modules and the segmenter with its dictionary (about 40 MiB less private memory per
# worker, bench/README.md). Imports only: no app, no open file, no thread before the fork.
import service.adapters  # noqa: E402,F401
import service.mcp  # noqa: E402,F401
from service.tokenize import tokenizer_for  # noqa: E402

tokenizer_for(_config).tokens("预热 warm up")
freeze_heap()           # what the workers inherit: never walked by their full collections (service/boot.py)


_maintainer = None
_metrics_dir = None       # the metrics folder on_starting made (None: the operator named one)


def _refuse_open_listeners(addresses) -> None:
    # No keys and a public address: refused whatever set the bind (-b, GUNICORN_CMD_ARGS), one line, exit 1.
    try:
        preflight.check_listeners(_config, addresses)
    except preflight.Refused as e:
        sys.exit(f"context-mode: refusing to start: {e}")


def when_ready(server):
    # What gunicorn really listens on (it may differ from what it was told: inherited or systemd sockets).
    _refuse_open_listeners([listener.getsockname() for listener in server.LISTENERS])
    # Indexing, the read index and the janitor in one process beside the workers (service/maintainer.py).
    global _maintainer
    if _config.background and _config.maintenance_process:
        from service import maintainer
        _maintainer = maintainer.spawn(server)


def on_exit(server):
    from service import maintainer
    maintainer.stop(_maintainer)
    if _metrics_dir:
        shutil.rmtree(_metrics_dir, ignore_errors=True)


def on_starting(server):
    # The final bind (this file's, then GUNICORN_CMD_ARGS', then the command line's), before it is bound.
    _refuse_open_listeners(server.cfg.address)
    # Request histograms from every worker are summed through this directory: one of our own, removed on exit
    # (one a killed start left behind is removed at the next), unless the operator names one.
    global _metrics_dir
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        _metrics_dir = os.environ["PROMETHEUS_MULTIPROC_DIR"] = make_metrics_dir()


def post_worker_init(worker):
    freeze_heap()       # and the worker's app, now loaded
    # Live streams (service/hub.py) end with their final message once gunicorn stops this worker.
    state = app_state(worker.wsgi, optional=True)
    if state is not None:
        state.hub.worker = worker


def child_exit(server, worker):
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess
        multiprocess.mark_process_dead(worker.pid)
