#!/usr/bin/env bash
# Installs TypeScript's compiler and Node's types (npm) into .ci/node_modules_ts for tests/test_js_client.py,
# which type-checks the JS client's declarations (clients/js/context-mode.d.mts) under --strict. Pinned;
# idempotent. Without npm this step only says so and that test skips with the reason.
set -euo pipefail
cd "$(dirname "$0")/../.."
PREFIX=.ci/node_modules_ts
PACKAGES="typescript@5.9.3 @types/node@20.19.43"
if ! command -v npm >/dev/null 2>&1; then
    echo "npm not found: skipping the TypeScript install (the declarations' test will skip)" >&2
    exit 0
fi
stamp="$PREFIX/.installed-$(echo "$PACKAGES" | tr -c 'A-Za-z0-9.\n' '_')"
if [ -e "$stamp" ] && [ -x "$PREFIX/node_modules/.bin/tsc" ]; then
    echo "TypeScript already installed in $PREFIX"
    exit 0
fi
mkdir -p "$PREFIX"
# shellcheck disable=SC2086
if npm install --prefix "$PREFIX" --no-audit --no-fund --loglevel=error $PACKAGES; then
    rm -f "$PREFIX"/.installed-*
    touch "$stamp"
    echo "TypeScript installed in $PREFIX"
else
    echo "warning: could not install $PACKAGES; the declarations' test will skip" >&2
fi
