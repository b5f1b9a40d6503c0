#!/usr/bin/env bash
# Installs the MCP Inspector CLI (npm @modelcontextprotocol/inspector) into .ci/node_modules_inspector
# for tests/test_mcp_inspector.py. Idempotent: does nothing when it is already installed.
# Without npm this step only says so; the inspector test then skips with that reason.
set -euo pipefail
cd "$(dirname "$0")/../.."
PREFIX=.ci/node_modules_inspector
if ! command -v npm >/dev/null 2>&1; then
    echo "npm not found: skipping the MCP Inspector install (tests/test_mcp_inspector.py will skip)" >&2
    exit 0
fi
if [ -x "$PREFIX/node_modules/.bin/mcp-inspector" ]; then
    echo "MCP Inspector already installed in $PREFIX"
    exit 0
fi
mkdir -p "$PREFIX"
npm install --prefix "$PREFIX" --no-audit --no-fund --loglevel=error @modelcontextprotocol/inspector
echo "MCP Inspector installed in $PREFIX"
