#!/usr/bin/env bash
# A local stand-in for python:3.11-slim where Docker Hub cannot be reached, and podman set up to
# run on machines like the CI ones (2 cores, root, no systemd). Used by `make container-smoke`
# (tools/container_smoke.py) only when no image of that name exists. Idempotent.
#   podman + runc: crun fails there (setrlimit RLIMIT_NOFILE, cgroups in hybrid mode); runc works
#   with default ulimits no higher than the machine's hard limits.
#   The base: Debian bookworm's python3 (3.11) via debootstrap, without the PEP 668 marker, as the
#   official image has none. Takes a few minutes; ~200 MB.
set -euo pipefail
BASE=docker.io/library/python:3.11-slim

if ! command -v podman >/dev/null || ! command -v runc >/dev/null || ! command -v debootstrap >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq podman runc debootstrap >/dev/null
fi

conf=/etc/containers/containers.conf
if ! grep -qs '^runtime *= *"runc"' "$conf"; then
    nofile=$(ulimit -Hn); nofile=$(( nofile < 20000 ? nofile : 20000 ))
    mkdir -p /etc/containers
    cat >> "$conf" <<CONF
# Added by tools/container_base.sh: crun cannot run here; runc can, with ulimits under the hard limits.
[containers]
default_ulimits = ["nofile=${nofile}:${nofile}", "nproc=32768:32768"]
[engine]
runtime = "runc"
CONF
    echo "configured podman in $conf (runtime runc, nofile ${nofile})"
fi

if podman image exists "$BASE"; then
    echo "$BASE present"
    exit 0
fi
if podman pull -q "$BASE" 2>/dev/null; then
    exit 0
fi
mirror=$(awk '/^deb /{print $2; exit}' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null || true)
if [ -z "$mirror" ]; then
    mirror=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
fi
mirror=${mirror:-http://deb.debian.org/debian}
rootfs=$(mktemp -d /tmp/python-slim-rootfs.XXXXXX)
trap 'rm -rf "$rootfs"' EXIT
echo "debootstrap bookworm from $mirror (a few minutes)"
debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates,python-is-python3 \
    bookworm "$rootfs" "$mirror" >/dev/null
rm -f "$rootfs"/usr/lib/python3.11/EXTERNALLY-MANAGED
if ls /usr/local/share/ca-certificates/*.crt >/dev/null 2>&1; then
    cp /usr/local/share/ca-certificates/*.crt "$rootfs"/usr/local/share/ca-certificates/
    chroot "$rootfs" update-ca-certificates >/dev/null
fi
tar -C "$rootfs" -c . | podman import --change 'ENV LANG=C.UTF-8' - "$BASE" >/dev/null
echo "built $BASE from Debian packages"
