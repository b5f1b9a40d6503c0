# Context Mode Service: gunicorn + Flask, SQLite FTS5 shards under /data (docs/design.md §1 and §5).
# Build: docker build -t context-mode-service .   Run: docker compose up -d (see docker-compose.yml)
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    CONTEXT_DATA_DIR=/data \
    CONTEXT_BIND=0.0.0.0:5000

# An unprivileged user owns the data directory and nothing else: the code stays root's, read-only to it.
# /data is 0700 as the service keeps its own folders (a new named volume copies this mode).
RUN groupadd --system --gid 10001 app \
    && useradd --system --uid 10001 --gid app --create-home --home-dir /home/app --shell /usr/sbin/nologin app \
    && mkdir -p /data \
    && chown app:app /data \
    && chmod 0700 /data

WORKDIR /app
# Dependencies from the lock file (exact versions, hashes checked), in a layer of their own.
COPY requirements/run.txt requirements/run.txt
RUN pip install --no-cache-dir --require-hashes -r requirements/run.txt
COPY pyproject.toml README.md ./
COPY service/ service/
COPY sql/ sql/
COPY clients/python/ clients/python/
# Editable, so the image runs the same tree the tests ran (sql/ beside service/, as in a checkout).
RUN pip install --no-cache-dir --no-deps -e . ./clients/python

USER 10001:10001
# Warm jieba's dictionary cache (/tmp/jieba.cache, owned by this user) and check FTS5, the data
# directory and the tokenizer once at build time, so the first request does not pay for it. (Keys come
# at run time: checked as for a loopback bind here, the CMD's doctor checks them for real.)
RUN python -c "import jieba; jieba.initialize()" \
    && CONTEXT_BIND=127.0.0.1:5000 context-mode doctor

VOLUME ["/data"]
EXPOSE 5000

# slim has no curl: ask /healthz with the standard library, on the port CONTEXT_BIND names.
# Shell form (CMD-SHELL): podman's Docker API splits exec-form arguments on spaces. (DL3025 is about
# CMD's signal handling; hadolint applies it to HEALTHCHECK's CMD too, where it does not matter.)
# hadolint ignore=DL3025
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
    CMD python -c "import os, sys, urllib.request; port = os.environ.get('CONTEXT_BIND', ':5000').rpartition(':')[2]; sys.exit(0 if urllib.request.urlopen(f'http://127.0.0.1:{port}/healthz', timeout=4).status == 200 else 1)"

# exec: gunicorn replaces the shell and runs as PID 1, so it receives SIGTERM and shuts down gracefully.
CMD ["sh", "-c", "context-mode doctor --quiet && exec gunicorn -c service/gunicorn_conf.py 'service:create_app()'"]
