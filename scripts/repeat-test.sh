#!/usr/bin/env bash
# `make test` N times in a row, each on a fresh clone of this repository at one commit, beside a
# CPU-heavy job (busy loops), as a loaded CI machine or a developer's laptop would run it: the
# suite must stay green there. One line per run in OUT/results.txt (exit status, seconds, pytest's
# summary line); each run's output in OUT/run<i>.log; a failed run's clone is kept for reading.
#
#   scripts/repeat-test.sh [--runs N] [--hogs H] [--commit REV] [--out DIR]
#
# Defaults: 10 runs, 1 busy loop, HEAD, /tmp/lbs-repeat-test. About 25-35 minutes a run on 2 cores.
set -euo pipefail
runs=10 hogs=1 commit=HEAD out=/tmp/lbs-repeat-test
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs=$2; shift 2 ;;
    --hogs) hogs=$2; shift 2 ;;
    --commit) commit=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "repeat-test.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
repo=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)
rev=$(git -C "$repo" rev-parse --verify "$commit^{commit}")
mkdir -p "$out"
pids=()
stop_hogs() { for p in "${pids[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done; pids=(); }
trap stop_hogs EXIT
for i in $(seq 1 "$runs"); do
  clone="$out/clone$i"
  rm -rf "$clone"
  git clone -q "$repo" "$clone"
  git -C "$clone" checkout -q "$rev"
  for _ in $(seq 1 "$hogs"); do sh -c 'while :; do :; done' & pids+=($!); done
  start=$(date +%s)
  rc=0
  (cd "$clone" && make test) >"$out/run$i.log" 2>&1 || rc=$?
  stop_hogs
  summary=$(grep -E '^=+ .*(passed|failed).* in ' "$out/run$i.log" | tail -1 || true)
  echo "run $i ${rev:0:7} rc=$rc seconds=$(( $(date +%s) - start )) $summary" | tee -a "$out/results.txt"
  if [ "$rc" -eq 0 ]; then rm -rf "$clone"; fi
done
