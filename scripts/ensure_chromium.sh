#!/usr/bin/env bash
# The console tests drive Debian's Chromium (no browser download works on this network).
# Installs it when missing and we can (root with apt-get); otherwise says how, and fails.
set -euo pipefail
CHROMIUM="${CRONYARD_CHROMIUM:-/usr/bin/chromium}"
if [ -x "$CHROMIUM" ]; then
    exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "cronyard: installing chromium from Debian packages for the console tests" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
    test -x "$CHROMIUM"
    exit 0
fi
echo "cronyard: $CHROMIUM is missing; install it with: sudo apt-get install chromium (Debian/Ubuntu)" >&2
exit 1
