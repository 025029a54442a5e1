#!/usr/bin/env bash
# make fuzz: runs every libFuzzer target of a PSTRAIN_FUZZ=ON build for SECONDS each, one
# after another, and says where the crashes it found are.
# usage: scripts/fuzz.sh BUILD_DIR [SECONDS=60] [TARGET...]   (default: every fuzz/fuzz_*.c)
# Each target runs on a copy of its seed corpus (fuzz/corpus/<name>/ is never written):
#   BUILD_DIR/fuzz-work/<name>/corpus    the copy, with the inputs the run added
#   BUILD_DIR/fuzz-work/<name>/crashes/  crash-*, leak-*, timeout-*, oom-* (what failed)
#   BUILD_DIR/fuzz-work/<name>/log       libFuzzer's output
# A crash is kept as a corpus file once fixed: minimize it (fuzz_<name> -minimize_crash=1
# -runs=10000 FILE), copy it to fuzz/corpus/<name>/crash-<what>; make test replays it.
# Exits 1 when any target found a crash.
set -euo pipefail
build=${1:?usage: scripts/fuzz.sh BUILD_DIR [SECONDS] [TARGET...]}
seconds=${2:-60}
shift $(($# < 2 ? $# : 2))
src=$(cd "$(dirname "$0")/.." && pwd)
if [ $# -gt 0 ]; then
  targets=("$@")
else
  targets=()
  for f in "$src"/fuzz/fuzz_*.c; do
    n=$(basename "$f" .c)
    [ "$n" = fuzz_util ] || targets+=("${n#fuzz_}")
  done
fi

failed=()
printf '%-14s %8s %12s %10s %8s  %s\n' target seconds executions exec/s corpus crashes >&2
for name in "${targets[@]}"; do
  bin="$build/fuzz/fuzz_$name"
  [ -x "$bin" ] || { echo "fuzz: $bin is not built (make fuzz builds it)" >&2; exit 1; }
  work="$build/fuzz-work/$name"
  rm -rf "$work"
  mkdir -p "$work/corpus" "$work/crashes" "$work/tmp"
  cp "$src/fuzz/corpus/$name"/* "$work/corpus/"
  # stdin from /dev/null: fuzz_config may name /dev/stdin as a token file. TMPDIR: the
  # targets' temporary files stay in the work directory even when a crash skips cleanup.
  rc=0
  TMPDIR="$work/tmp" "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -artifact_prefix="$work/crashes/" -print_final_stats=1 \
    "$work/corpus" </dev/null >"$work/log" 2>&1 || rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$work/log" | tail -1)
  ncorpus=$(find "$work/corpus" -type f | wc -l)
  crashes=$(find "$work/crashes" -type f | sort)
  printf '%-14s %8s %12s %10s %8s  %s\n' "$name" "$seconds" "${execs:-?}" "${rate:-?}" \
    "$ncorpus" "$(echo "$crashes" | grep -c . || true)" >&2
  if [ "$rc" -ne 0 ] || [ -n "$crashes" ]; then
    failed+=("$name")
    echo "fuzz: $name failed (exit $rc); log: $work/log" >&2
    for c in $crashes; do echo "  crash: $c   (reproduce: $bin $c)" >&2; done
    grep -m3 -E 'ERROR: |SUMMARY: |fuzz check failed' "$work/log" | sed 's/^/    /' >&2 || true
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: crashes in: ${failed[*]}" >&2
  exit 1
fi
echo "fuzz: no crash in ${#targets[@]} targets x ${seconds}s" >&2
