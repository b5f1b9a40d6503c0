#!/usr/bin/env bash
# PostgreSQL 15 from Debian for the PostgreSQL backend's tests (issue 18): tests/pg_cluster.py starts a
# throwaway primary and a streaming hot standby (pg_basebackup -R) on loopback from these binaries,
# as the `postgres` user when CI runs as root. Only the binaries are needed: the package's own
# cluster is stopped and kept from starting. Idempotent; best effort: without PostgreSQL the
# tests that need it skip and say why.
set -euo pipefail

if ! ls /usr/lib/postgresql/*/bin/pg_basebackup >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    { apt-get update -qq && apt-get install -y -qq --no-install-recommends postgresql postgresql-contrib >/dev/null; } \
        || echo "warning: could not install postgresql; the PostgreSQL backend's tests will be skipped" >&2
fi
# The package's default cluster is not used; the tests start their own on free ports.
if command -v pg_ctlcluster >/dev/null 2>&1; then
    for c in $(pg_lsclusters -h 2>/dev/null | awk '$4 == "online" {print $1 "/" $2}'); do
        pg_ctlcluster "${c%/*}" "${c#*/}" stop || true
    done
fi
ls -d /usr/lib/postgresql/*/bin 2>/dev/null | head -1 || true
