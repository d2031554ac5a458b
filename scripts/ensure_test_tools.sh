#!/usr/bin/env bash
# Third-party tools the tests drive, from Debian's packages (no other download works on
# this network): Chromium for the console tests, promtool (package prometheus) to check
# /metrics and the example alert rules. Installs what is missing when we can (root with
# apt-get); otherwise says how, and fails.
set -euo pipefail
CHROMIUM="${CRONYARD_CHROMIUM:-/usr/bin/chromium}"
missing=()
[ -x "$CHROMIUM" ] || missing+=(chromium)
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "cronyard: installing ${missing[*]} from Debian packages for the tests" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    test -x "$CHROMIUM"
    command -v promtool >/dev/null
    exit 0
fi
echo "cronyard: missing ${missing[*]}; install with: sudo apt-get install ${missing[*]} (Debian/Ubuntu)" >&2
exit 1
