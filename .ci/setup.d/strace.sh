#!/usr/bin/env bash
# Debian's strace, for tests/test_durability.py: it traces a real gunicorn to check that every
# acknowledged push's commit was synced (fdatasync of its WAL) before the answer was written.
# Idempotent: installs only when missing. Best effort: if the install fails, or ptrace is not
# allowed here, those tests skip and say why rather than failing the whole CI run at this step.
set -euo pipefail

have() { command -v "$1" >/dev/null 2>&1; }

if have strace; then
    echo "strace already installed"
    exit 0
fi
if have apt-get; then
    export DEBIAN_FRONTEND=noninteractive
    SUDO=""
    if [ "$(id -u)" != 0 ] && have sudo; then SUDO="sudo"; fi
    echo "installing strace"
    { $SUDO apt-get update -qq \
        && $SUDO apt-get install -y -qq --no-install-recommends strace >/dev/null; } \
        || echo "warning: could not install strace; tests/test_durability.py's traced tests will skip" >&2
else
    echo "warning: no apt-get: install strace yourself, or tests/test_durability.py's traced tests skip" >&2
fi
