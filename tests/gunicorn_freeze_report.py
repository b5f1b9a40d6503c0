"""gunicorn settings for tests/test_gc_freeze.py: the service's own, plus a report to $FREEZE_REPORT of how
many objects full collections leave out, from the master (once the service's settings have loaded), each
worker (once its app is loaded, with whether the app and its store are still walked) and the maintainer
(when it freezes its heap)."""
import gc
import json
import os

from service.gunicorn_conf import *  # noqa: F403  (the service's settings, unchanged)
from service import boot
from service import gunicorn_conf as _base
from service.state import app_state


def _report(role: str, **extra) -> None:
    line = {"role": role, "pid": os.getpid(), "frozen": gc.get_freeze_count(), **extra}
    with open(os.environ["FREEZE_REPORT"], "a") as f:
        f.write(json.dumps(line) + "\n")


_report("master")
_freeze = boot.freeze_heap


def _maintainer_freeze() -> None:       # service/maintainer.py imports it from service.boot when it runs
    _freeze()
    _report("maintainer")


boot.freeze_heap = _maintainer_freeze


def post_worker_init(worker):
    _base.post_worker_init(worker)
    app = worker.wsgi
    walked = {id(o) for o in gc.get_objects()}
    _report("worker", app_walked=id(app) in walked,
            store_walked=id(app_state(app).store) in walked)
