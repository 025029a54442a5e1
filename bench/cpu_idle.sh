#!/usr/bin/env bash
# Benchmark helper: how much of the machine's CPU is idle during the steps of the overlap
# bench's run (MLP 784-4096-4096-10, batch 128, 1 pserver, 1 trainer on cpu:2), for the
# overlapped and the serialized schedule. Overlap can only reclaim CPU that the serialized
# run leaves idle, so on a machine where communication runs on the compute cores this is
# the bound on what bench/overlap.sh can show. Reads /proc/stat over WINDOW seconds in the
# middle of a 60-step run. Prints one JSON line per schedule. Not a test.
#
# usage: bench/cpu_idle.sh [BUILD_DIR=build] [RUNS=2] [SKIP_S=8] [WINDOW_S=6]
# BENCH_CORETYPE=keep|NAME chooses the OpenBLAS kernel family (see bench_blas_core in bench/lib.sh).
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"
build=${1:-build}; runs=${2:-2}; skip=${3:-8}; window=${4:-6}
bench_need_built "$build" pslaunch pserver trainer
bench_need_python
bench_blas_core "$build"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export PSTRAIN_DEVICES=cpu:2
bench_header cpu_idle "\"hidden\":\"4096,4096\",\"batch\":128,\"devices\":\"cpu:2\",\"pservers\":1,\"trainers\":1,\"steps\":60,\"runs\":$runs,\"skip_s\":$skip,\"window_s\":$window"
flags=(--model mlp --hidden 4096,4096 --batch 128 --steps 60 --optimizer momentum --lr 0.01
       --momentum 0.9 --seed 0 --progress none --log-level warn)
for i in $(seq 1 "$runs"); do
  for ov in 1 0; do
    "$build/bin/pslaunch" --pservers 1 --trainers 1 --timeout 900 -- "$build/bin/trainer" \
      "${flags[@]}" --overlap "$ov" > "$tmp/out.json" 2>/dev/null &
    pid=$!
    sleep "$skip"; read -r -a a < /proc/stat
    sleep "$window"; read -r -a b < /proc/stat
    wait "$pid"
    total=0; for k in 1 2 3 4 5 6 7 8; do total=$((total + b[k] - a[k])); done
    idle=$((b[4] - a[4] + b[5] - a[5]))
    step=$(grep -o '"step_ms_median":[0-9.]*' "$tmp/out.json" | cut -d: -f2)
    echo "{\"run\":$i,\"overlap\":$ov,\"idle_percent\":$(awk "BEGIN{printf \"%.1f\", 100*$idle/$total}"),\"step_ms_median\":${step:-null}}"
  done
done
