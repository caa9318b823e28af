#!/usr/bin/env bash
# Print the path of a usable Chromium on stdout; everything else goes to stderr,
# so `chromium=$(scripts/chromium.sh)` works (make test hands it to the browser
# tests of the dashboard, tests/browser, as LBS_CHROMIUM).
#
# Order of preference:
#   1. $LBS_CHROMIUM, if set (must run, or this fails);
#   2. Debian's `chromium` package (/usr/bin/chromium), or a chromium on PATH;
#   3. Debian's package installed now with apt-get (sudo when not root).
#
# Never a browser download of Playwright's own (`playwright install`): the tests
# launch this binary through Playwright's executable_path.
set -euo pipefail

usable() {
    # A binary that starts and says its version: a broken install (missing libraries) fails here.
    [ -x "$1" ] && "$1" --version >/dev/null 2>&1
}

if [ -n "${LBS_CHROMIUM:-}" ]; then
    usable "$LBS_CHROMIUM" || { echo "chromium.sh: LBS_CHROMIUM=$LBS_CHROMIUM does not run" >&2; exit 1; }
    echo "$LBS_CHROMIUM"
    exit 0
fi

for candidate in /usr/bin/chromium "$(command -v chromium 2>/dev/null || true)"; do
    if [ -n "$candidate" ] && usable "$candidate"; then
        echo "$candidate"
        exit 0
    fi
done

SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo"
echo "chromium.sh: installing Debian's chromium package (about 100 MB) with apt-get" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq >&2
$SUDO apt-get install -y -qq --no-install-recommends chromium >&2
usable /usr/bin/chromium || { echo "chromium.sh: /usr/bin/chromium does not run after the install" >&2; exit 1; }
echo /usr/bin/chromium
