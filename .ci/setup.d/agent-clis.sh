#!/usr/bin/env bash
# Installs the agents' own command-line clients, Claude Code (npm @anthropic-ai/claude-code) and Gemini CLI
# (npm @google/gemini-cli), into .ci/node_modules_agents for tests/test_hooks_clients.py (`claude mcp list`,
# `gemini mcp list` against a real gunicorn). Pinned so that CI tests the versions the configs were checked
# with. Idempotent: does nothing when both are installed. Without npm this step only says so; those tests
# then skip with that reason.
set -euo pipefail
cd "$(dirname "$0")/../.."
PREFIX=.ci/node_modules_agents
CLAUDE_CODE=@anthropic-ai/claude-code@2.1.332
GEMINI_CLI=@google/gemini-cli@0.61.0
if ! command -v npm >/dev/null 2>&1; then
    echo "npm not found: skipping the Claude Code / Gemini CLI install (tests/test_hooks_clients.py will skip)" >&2
    exit 0
fi
stamp="$PREFIX/.installed-$(echo "$CLAUDE_CODE $GEMINI_CLI" | tr -c 'A-Za-z0-9.\n' '_')"
if [ -e "$stamp" ] && [ -x "$PREFIX/node_modules/.bin/claude" ] && [ -x "$PREFIX/node_modules/.bin/gemini" ]; then
    echo "Claude Code and Gemini CLI already installed in $PREFIX"
    exit 0
fi
mkdir -p "$PREFIX"
# Best effort, like the other steps: a failed install makes those tests skip and say why.
if npm install --prefix "$PREFIX" --no-audit --no-fund --loglevel=error "$CLAUDE_CODE" "$GEMINI_CLI"; then
    rm -f "$PREFIX"/.installed-*
    touch "$stamp"
    echo "Claude Code and Gemini CLI installed in $PREFIX"
else
    echo "warning: could not install $CLAUDE_CODE $GEMINI_CLI; tests/test_hooks_clients.py will skip" >&2
fi
