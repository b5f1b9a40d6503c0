#!/usr/bin/env bash
# nginx from Debian, for tests/test_slow_clients.py: the slow-client attacks run once more against
# tools/nginx/nginx.conf (the compose file's buffering proxy) in front of a real gunicorn on loopback.
# The tests start their own nginx (a foreground process on free ports, a temporary prefix); the
# package's own service, when apt starts one, is stopped. Idempotent: installs only when missing.
# Best effort: without nginx those tests skip and say why.
set -euo pipefail

have() { command -v "$1" >/dev/null 2>&1; }
NGINX=$(command -v nginx || echo /usr/sbin/nginx)

if [ -x "$NGINX" ]; then
    echo "nginx already installed"
else
    export DEBIAN_FRONTEND=noninteractive
    SUDO=""
    if [ "$(id -u)" != 0 ] && have sudo; then SUDO="sudo"; fi
    echo "installing nginx"
    { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq --no-install-recommends nginx >/dev/null; } \
        || { echo "warning: could not install nginx; the tests through nginx will be skipped" >&2; exit 0; }
fi
# Not the package's server on port 80: the tests start their own.
if [ -f /run/nginx.pid ] && kill -0 "$(cat /run/nginx.pid)" 2>/dev/null; then
    "$NGINX" -s quit 2>/dev/null || true
fi
"$NGINX" -v 2>&1
