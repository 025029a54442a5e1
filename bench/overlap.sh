#!/usr/bin/env bash
# Benchmark: the multi-device trainer's overlapped schedule against the same work
# serialized (--overlap 0), on a run where communication and compute are comparable:
# MLP 784-4096-4096-10, batch 128, 1 pserver, 1 trainer with 2 CPU devices (the cores
# shared: one BLAS thread each), alternating, RUNS times each; plus the local compute-only step (same
# devices, no pserver). Prints JSON lines: every run, then the medians and ratios, and
# writes a Chrome trace of steps 10-11 of the last overlapped run to bench/out/overlap.json.
# Not a test: it reports, it never gates.
#
# usage: bench/overlap.sh [BUILD_DIR=build] [RUNS=3] [STEPS=30]
set -euo pipefail
build=${1:-build}; runs=${2:-3}; steps=${3:-30}
here=$(cd "$(dirname "$0")/.." && pwd)
[ -x "$build/bin/pslaunch" ] || { echo "bench: $build/bin/pslaunch not built (run make)" >&2; exit 2; }
mkdir -p "$here/bench/out"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
flags=(--model mlp --hidden 4096,4096 --batch 128 --steps "$steps" --optimizer momentum
       --lr 0.01 --momentum 0.9 --seed 0 --progress none --log-level warn)
export PSTRAIN_DEVICES=cpu:2
echo "{\"bench\":\"overlap\",\"hidden\":\"4096,4096\",\"devices\":\"cpu:2\",\"pservers\":1,\"trainers\":1,\"steps\":$steps,\"runs\":$runs}"
for i in $(seq 1 "$runs"); do
  trace=()
  [ "$i" = "$runs" ] && trace=(--trace "$here/bench/out/overlap.json" --trace-steps 10:11)
  "$build/bin/pslaunch" --pservers 1 --trainers 1 --timeout 900 -- "$build/bin/trainer" \
    "${flags[@]}" --overlap 1 "${trace[@]}" 2>/dev/null | tail -n 1 > "$tmp/o$i.json"
  echo "{\"run\":$i,\"schedule\":\"overlap\",\"result\":$(cat "$tmp/o$i.json")}"
  "$build/bin/pslaunch" --pservers 1 --trainers 1 --timeout 900 -- "$build/bin/trainer" \
    "${flags[@]}" --overlap 0 2>/dev/null | tail -n 1 > "$tmp/s$i.json"
  echo "{\"run\":$i,\"schedule\":\"serialized\",\"result\":$(cat "$tmp/s$i.json")}"
  "$build/bin/trainer" "${flags[@]}" 2>/dev/null | tail -n 1 > "$tmp/l$i.json"
  echo "{\"run\":$i,\"schedule\":\"local compute only\",\"result\":$(cat "$tmp/l$i.json")}"
done
/usr/bin/python3 - "$tmp" "$runs" <<'PY'
import json, statistics, sys
d, n = sys.argv[1], int(sys.argv[2])
med = lambda p: statistics.median(json.load(open("%s/%s%d.json" % (d, p, i)))["step_ms_median"]
                                  for i in range(1, n + 1))
o, s, l = med("o"), med("s"), med("l")
print(json.dumps({"overlap_step_ms_median": o, "serialized_step_ms_median": s,
                  "local_compute_step_ms_median": l,
                  "overlap_over_serialized": round(o / s, 3),
                  "overlap_over_local_compute": round(o / l, 3),
                  "serialized_over_local_compute": round(s / l, 3)}))
PY
