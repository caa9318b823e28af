#!/usr/bin/env bash
# The unit suite (tests/unit: no Redis server) on the oldest and the newest Python that
# pyproject.toml's requires-python and classifiers support, each in its own venv
# (.venv-py3.10, .venv-py3.13) with lbs built for it. `make matrix` runs this; `make test`
# runs it too (see the Makefile), so a 3.10-only or 3.13-only break fails the suite.
#
# Where the interpreters come from, in order: `python3.X` on PATH, then pyenv's versions
# (`pyenv root`, or ~/.pyenv). Neither downloads anything. A version found nowhere is reported
# on stderr and the script fails, unless LBS_MATRIX_OPTIONAL=1 (then it says SKIPPED and goes on).
#
# Usage: scripts/matrix.sh [VERSION ...]     (default: the first and last classifier versions)
set -euo pipefail
cd "$(dirname "$0")/.."

classifiers() {
    sed -n 's/.*"Programming Language :: Python :: \(3\.[0-9]*\)".*/\1/p' pyproject.toml | sort -t. -k2 -n
}

if [ $# -gt 0 ]; then
    versions=("$@")
else
    mapfile -t all < <(classifiers)
    versions=("${all[0]}" "${all[-1]}")
fi

find_python() {
    local v=$1 cand root
    # pyenv's shims are on PATH too but run only the versions a .python-version selects: ask
    # each candidate for its version instead of trusting its name.
    if cand=$(command -v "python$v" 2>/dev/null) && "$cand" -c pass 2>/dev/null; then
        echo "$cand"; return 0
    fi
    root=$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")
    for cand in $(ls -d "$root"/versions/"$v".* 2>/dev/null | sort -t. -k3 -n -r); do
        if [ -x "$cand/bin/python$v" ]; then echo "$cand/bin/python$v"; return 0; fi
    done
    return 1
}

status=0
for v in "${versions[@]}"; do
    if ! py=$(find_python "$v"); then
        if [ "${LBS_MATRIX_OPTIONAL:-0}" = 1 ]; then
            echo "matrix: Python $v SKIPPED: not on PATH (python$v) nor in pyenv's versions" >&2
            continue
        fi
        echo "matrix: Python $v not found: not on PATH (python$v) nor in pyenv's versions" >&2
        status=1
        continue
    fi
    venv=".venv-py$v"
    stamp="$venv/.lbs-matrix"
    echo "matrix: Python $v ($py) in $venv"
    if [ ! -x "$venv/bin/python" ]; then "$py" -m venv "$venv"; fi
    # Rebuild when the core or the packaging changed since the last install.
    if [ ! -f "$stamp" ] || [ -n "$(find pyproject.toml setup.py src/_lbscore -newer "$stamp" \
            \( -name '*.pyx' -o -name '*.pxd' -o -name '*.h' -o -name '*.toml' -o -name '*.py' \) \
            -print -quit)" ]; then
        "$venv/bin/python" -m pip install --quiet --upgrade pip
        "$venv/bin/python" -m pip install --quiet -e . \
            pytest pytest-asyncio pytest-benchmark pytest-timeout hypothesis
        touch "$stamp"
    fi
    if ! LBS_HYPOTHESIS_PROFILE="${LBS_HYPOTHESIS_PROFILE:-smoke}" \
            "$venv/bin/python" -m pytest tests/unit -q -p no:cacheprovider; then
        echo "matrix: the unit suite FAILED on Python $v" >&2
        status=1
    fi
done
exit $status
