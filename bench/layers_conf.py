"""service/gunicorn_conf.py as it is, but without the slow-client guard when LAYERS_OFF names ``guard``
(bench/layers.py only)."""
import os
import runpy

if "guard" in os.environ.get("LAYERS_OFF", "").split(","):
    import importlib
    try:
        guard = importlib.import_module("service.guard")
    except ImportError:                   # (a build before the guard became a package)
        guard = importlib.import_module("service.gunicorn_guard")
    guard.install = lambda bounds: None
globals().update({k: v for k, v in runpy.run_path(os.path.join(os.environ["LAYERS_SRC"], "service",
                                                                "gunicorn_conf.py")).items()
                  if not k.startswith("__")})
