#!/usr/bin/env bash
# Headless Chromium and its WebDriver from Debian, for the console's browser tests
# (tests/test_console_browser.py, driven by Selenium from the `test` extra). Nothing downloads a
# browser at test time: Selenium is pointed at the system chromium and chromedriver.
# fonts-wqy-microhei (1.6 MB) lets screenshots show Chinese text rather than empty boxes.
# Idempotent: installs only what is missing. Best effort: if the install fails, the browser
# tests skip and say why, rather than failing the whole CI run here.
set -euo pipefail

have() { command -v "$1" >/dev/null 2>&1; }

missing=()
have chromium || missing+=(chromium)
have chromedriver || missing+=(chromium-driver)
if ! { have fc-list && [ -n "$(fc-list :lang=zh 2>/dev/null)" ]; }; then missing+=(fonts-wqy-microhei); fi

if [ ${#missing[@]} -gt 0 ]; then
    if have apt-get; then
        export DEBIAN_FRONTEND=noninteractive
        SUDO=""
        if [ "$(id -u)" != 0 ] && have sudo; then SUDO="sudo"; fi
        echo "installing ${missing[*]}"
        { $SUDO apt-get update -qq \
            && $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; } \
            || echo "warning: could not install ${missing[*]}; the console browser tests may skip" >&2
    else
        echo "warning: no apt-get: install chromium and chromedriver yourself, or the console browser tests skip" >&2
    fi
else
    echo "chromium, chromedriver and a Chinese font already installed"
fi

if have chromium; then chromium --version 2>/dev/null || true; fi
if have chromedriver; then chromedriver --version 2>/dev/null || true; fi
