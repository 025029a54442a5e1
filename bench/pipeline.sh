#!/usr/bin/env bash
# Measurement: pipeline parallelism inside one trainer (--pipeline), trained alone on the
# King James Bible with a GPT of LAYERS blocks (default 8: 10 layers with the embedding
# and the head, balanced over 4 stages), embd 64, 4 heads, context 64, AdamW.
#   stages  what each stage (device) holds for the GPT of issue 30 (LAYERS blocks, embd
#           256, 4 heads, context 128, batch 8, M = 2P micro-batches) at P = 1, 2, 4 (1F1B):
#           parameters, gradients, activations and the peak, in bytes, from the summary's
#           *_bytes_per_device (one JSON line per stage, then a table);
#   memory  peak bytes per device at a fixed micro-batch of 2 rows for M = P, 4P, 16P, 64P
#           (the global batch grows with M), for 1F1B, interleaved (V = 2) and GPipe: one
#           JSON line per run with peak_bytes_per_device;
#   bubble  the idle compute time of each stage from the Chrome trace of steps 3-7
#           (bench/pipeline_trace.py) for M = 4, 8, 16 against (P - 1) / M and, interleaved,
#           (P - 1) / (V M); per-stage imbalance. Each stage is a one-thread CPU device, so
#           with P above the machine's cores the stages also wait for a core, which the
#           trace counts as compute: P = 2 on 2 cores is the clean case, P = 4 is shown too.
# No peer: none of ours runs a pipeline inside a trainer. Not a test: it reports, it never
# gates.
#
# usage: bench/pipeline.sh [BUILD_DIR=build] [P=4] [LAYERS=8]
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"
build=${1:-build}; P=${2:-4}; layers=${3:-8}
kjv=/usr/local/share/pstrain/kjv.txt
bench_need_built "$build" trainer
bench_need_python
[ -s "$kjv" ] || bench_die "$kjv is missing: scripts/deps.sh writes it from Debian's bible-kjv"
bench_blas_core "$build"
bench_header pipeline "\"stages\":$P,\"layers\":$layers,\"embd\":64,\"heads\":4,\"ctx\":64,\"threads_per_stage\":1"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
here=$(dirname "$0")

train() { # train DEVICES STEPS ARGS... -> the summary line
  local devices=$1 steps=$2; shift 2
  PSTRAIN_DEVICES=$devices "$build/bin/trainer" --model gpt --layers "$layers" --heads 4 \
    --embd 64 --ctx 64 --steps "$steps" --threads 1 --progress none --log-level warn \
    --metrics "" --sample 0 --val-windows 8 "$@" | tail -n 1
}
schedule_args() { # the flags of a schedule name
  case $1 in interleaved) echo "--schedule interleaved --virtual-stages 2" ;;
    *) echo "--schedule $1" ;; esac
}

for p in 1 2 4; do
  args=(--layers "$layers" --embd 256 --ctx 128 --batch 8 --pipeline "$p")
  [ "$p" -gt 1 ] && args+=(--micro-batches $((2 * p)) --schedule 1f1b)
  PSTRAIN_DEVICES=cpu:$p "$build/bin/trainer" --model gpt --heads 4 --steps 2 --threads 1 \
    --progress none --log-level warn --metrics "" --sample 0 --val-windows 2 "${args[@]}" |
    tail -n 1 | "$BENCH_PY" -c '
import json, sys
s = json.loads(sys.stdin.read())
for i, peak in enumerate(s["peak_bytes_per_device"]):
    print(json.dumps({"part": "stages", "stages": len(s["peak_bytes_per_device"]), "stage": i,
                      "params": s["param_bytes_per_device"][i],
                      "grads": s["grad_bytes_per_device"][i],
                      "activations": s["activation_bytes_per_device"][i], "peak": peak}))'
done | tee "$tmp/stages.json"
"$BENCH_PY" -c '
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("P stage      params       grads  activations         peak", file=sys.stderr)
for r in rows:
    print("%d %5d %11d %11d %12d %12d" % (r["stages"], r["stage"], r["params"], r["grads"],
          r["activations"], r["peak"]), file=sys.stderr)' "$tmp/stages.json"

for sched in 1f1b interleaved gpipe; do
  for f in 1 4 16 64; do
    M=$((P * f))
    # shellcheck disable=SC2046
    peak=$(train "cpu:$P" 2 --pipeline "$P" --micro-batches "$M" --batch $((2 * M)) \
      $(schedule_args "$sched") | "$BENCH_PY" -c \
      'import json,sys; print(json.dumps(json.loads(sys.stdin.read())["peak_bytes_per_device"]))')
    echo "{\"part\":\"memory\",\"schedule\":\"$sched\",\"stages\":$P,\"micro_batches\":$M,\"micro_batch_rows\":2,\"peak_bytes_per_device\":$peak}"
  done
done
for p in 2 "$P"; do
  for sched in 1f1b interleaved; do
    for M in 4 8 16; do
      v=1; [ "$sched" = interleaved ] && v=2
      # shellcheck disable=SC2046
      train "cpu:$p" 8 --pipeline "$p" --micro-batches "$M" --batch $((2 * M)) \
        $(schedule_args "$sched") --trace "$tmp/trace.json" --trace-steps 3:7 > /dev/null
      got=$("$BENCH_PY" "$here/pipeline_trace.py" "$tmp/trace.json")
      want=$("$BENCH_PY" -c "print(round(($p - 1) / ($v * $M), 4))")
      echo "{\"part\":\"bubble\",\"schedule\":\"$sched\",\"stages\":$p,\"virtual_stages\":$v,\"micro_batches\":$M,\"formula\":$want,\"measured\":$got}"
    done
  done
done
