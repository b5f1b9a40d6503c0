"""gunicorn settings for tests/test_group_commit.py: the service's own, plus a worker that, after the
first group commit holding two or more requests, writes that group's CIDs to $CRASH_MARKER and
SIGKILLs the whole service before any of those requests is answered (a crash between a group's
commit and its acks)."""
import json
import os
import signal

from service.gunicorn_conf import *  # noqa: F403  (the service's settings, unchanged)
from service import gunicorn_conf as _base

_base_post_worker_init = getattr(_base, "post_worker_init", None)


def post_worker_init(worker):
    if _base_post_worker_init is not None:
        _base_post_worker_init(worker)
    from service.store.sqlite.store import Store
    marker = os.environ["CRASH_MARKER"]
    original = Store._write_group

    def write_then_die(self, t, jobs):
        original(self, t, jobs)
        if len(jobs) >= 2 and not os.path.exists(marker):
            cids = [u.cid for job in jobs for _, u in job.valid]
            with open(marker + ".tmp", "w") as f:
                json.dump({"requests": len(jobs), "cids": cids}, f)
            os.replace(marker + ".tmp", marker)
            os.killpg(os.getpgid(0), signal.SIGKILL)
    Store._write_group = write_then_die
