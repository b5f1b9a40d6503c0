#!/usr/bin/env bash
# PostgreSQL 15 (server and client binaries) from Debian for the PostgreSQL backend's half of the suite (issue 18). The tests start
# their own throwaway primary and streaming hot standby (pg_basebackup -R) on loopback ports with
# tools/pg_cluster.py, from these binaries, as the `postgres` user when CI runs as root (PostgreSQL
# refuses root) and as the current user otherwise. Only the binaries are needed: a cluster the package
# started is stopped. Idempotent: installs only what is missing.
# Not best effort: without PostgreSQL the suite's PostgreSQL half would skip, and CI must run it.
set -euo pipefail

have() { command -v "$1" >/dev/null 2>&1; }

if ls /usr/lib/postgresql/*/bin/pg_basebackup >/dev/null 2>&1; then
    echo "postgresql already installed"
else
    have apt-get || { echo "error: no apt-get: install PostgreSQL 15 yourself" >&2; exit 1; }
    export DEBIAN_FRONTEND=noninteractive
    SUDO=""
    if [ "$(id -u)" != 0 ] && have sudo; then SUDO="sudo"; fi
    echo "installing postgresql"
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq --no-install-recommends postgresql >/dev/null
fi
# The package's default cluster is not used; the tests start their own on free ports.
if have pg_lsclusters; then
    for c in $(pg_lsclusters -h 2>/dev/null | awk '$4 == "online" {print $1 "/" $2}'); do
        ${SUDO:-} pg_ctlcluster "${c%/*}" "${c#*/}" stop || true
    done
fi
ls -d /usr/lib/postgresql/*/bin | head -1
