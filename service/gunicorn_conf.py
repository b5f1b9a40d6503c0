"""gunicorn settings for `make run` (`gunicorn -c service/gunicorn_conf.py 'service:create_app()'`).

Timeouts are deliberate: a slow or stalled client cannot hold a worker thread for long,
and a worker that hangs is replaced.
"""
import os
import tempfile

from service.config import Config

_config = Config.from_env()

bind = _config.bind
workers = _config.workers
worker_class = "gthread"
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


def _bound_socket_reads(seconds: float) -> None:
    """gthread reads a request's headers and body on a worker thread with no deadline, so a
    client that stops sending mid-request (slowloris) holds that thread forever. Give every
    connection's socket a read timeout once gunicorn makes it blocking."""
    from gunicorn.workers import gthread

    original = gthread.TConn.init
    if getattr(original, "_bounded", False):
        return

    def init(self):
        original(self)
        self.sock.settimeout(seconds)
    init._bounded = True
    gthread.TConn.init = init


if _config.read_timeout_s > 0:
    _bound_socket_reads(_config.read_timeout_s)   # in the master, so every forked worker has it


def on_starting(server):
    # Request histograms from every worker are summed through this directory.
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="context-mode-metrics-")


def child_exit(server, worker):
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess
        multiprocess.mark_process_dead(worker.pid)
