#!/usr/bin/env bash
# Benchmark: what bf16 (or fp16) parameters cost and save against fp32, through the real
# programs, the two precisions alternating, RUNS times each:
#   - the MLP (784-1024-1024-10, momentum, batch 128) for EPOCHS epochs on a 2 pserver x 2
#     trainer cluster on loopback (pslaunch): test_acc, samples/s, step time;
#   - the GPT (bench/gpt.sh's default model on the King James Bible, AdamW) for STEPS steps
#     training alone on DEVICES (default cpu:2): val_loss, tokens/s, step time.
# Prints every run, then per workload the medians, the test_acc difference (points) and the
# val_loss ratio low/fp32, and the step-time ratio low/fp32. Not a test: it reports, it
# never gates. No peer runs here: PyTorch's CPU autocast is not the same design (it keeps an
# fp32 master on every worker), so the comparison is pstrain against itself.
#
# usage: [LOW=bf16|fp16] bench/precision.sh [BUILD_DIR=build] [RUNS=1] [EPOCHS=5] [STEPS=500]
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"
build=${1:-build}; runs=${2:-1}; epochs=${3:-5}; steps=${4:-500}
low=${LOW:-bf16}
devices=${DEVICES:-cpu:2}
case $low in bf16|fp16) ;; *) bench_die "LOW=$low: expected bf16 or fp16" ;; esac
kjv=/usr/local/share/pstrain/kjv.txt
bench_need_built "$build" pslaunch pserver trainer
[ -s "$kjv" ] || bench_die "$kjv is missing: scripts/deps.sh writes it from Debian's bible-kjv"
bench_blas_core "$build"
bench_header precision "\"low\":\"$low\",\"runs\":$runs,\"mlp_epochs\":$epochs,\"gpt_steps\":$steps,\"gpt_devices\":\"$devices\",\"threads\":2"

tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for i in $(seq 1 "$runs"); do
  for p in fp32 "$low"; do
    "$build/bin/pslaunch" --pservers 2 --trainers 2 --timeout 3000 -- "$build/bin/trainer" \
      --hidden 1024,1024 --batch 128 --epochs "$epochs" --precision "$p" --threads 1 \
      --progress none --log-level warn --metrics "" 2>/dev/null | tail -n 1 > "$tmp/mlp_${p}_$i.json"
    echo "{\"run\":$i,\"workload\":\"mlp\",\"precision\":\"$p\",\"result\":$(cat "$tmp/mlp_${p}_$i.json")}"
  done
  for p in fp32 "$low"; do
    PSTRAIN_DEVICES=$devices "$build/bin/trainer" --model gpt --dataset kjv --steps "$steps" \
      --precision "$p" --threads 2 --val-windows 64 --seed 0 --progress none --metrics "" \
      2>/dev/null | tail -n 1 > "$tmp/gpt_${p}_$i.json"
    echo "{\"run\":$i,\"workload\":\"gpt\",\"precision\":\"$p\",\"result\":$(cat "$tmp/gpt_${p}_$i.json")}"
  done
done
"$BENCH_PY" - "$tmp" "$runs" "$low" <<'PY'
import json, statistics, sys
d, n, low = sys.argv[1], int(sys.argv[2]), sys.argv[3]
load = lambda w, p: [json.load(open("%s/%s_%s_%d.json" % (d, w, p, i))) for i in range(1, n + 1)]
med = lambda rs, k: statistics.median(r[k] for r in rs)
for w in ("mlp", "gpt"):
    f, l = load(w, "fp32"), load(w, low)
    out = {"workload": w}
    for name, rs in (("fp32", f), (low, l)):
        out[name + "_step_ms_median"] = med(rs, "step_ms_median")
        out[name + "_param_bytes_per_device"] = rs[0]["param_bytes_per_device"][0]
        out[name + "_optimizer_bytes_per_device"] = rs[0]["optimizer_bytes_per_device"]
        if w == "mlp":
            out[name + "_test_acc"] = med(rs, "test_acc")
            out[name + "_samples_per_s"] = med(rs, "samples_per_s")
        else:
            out[name + "_val_loss"] = med(rs, "val_loss")
            out[name + "_tokens_per_s"] = med(rs, "tokens_per_s")
    out["step_time_ratio_low_over_fp32"] = round(out[low + "_step_ms_median"] / out["fp32_step_ms_median"], 3)
    if w == "mlp":
        out["test_acc_points_low_minus_fp32"] = round(100 * (out[low + "_test_acc"] - out["fp32_test_acc"]), 2)
    else:
        out["val_loss_ratio_low_over_fp32"] = round(out[low + "_val_loss"] / out["fp32_val_loss"], 4)
    print(json.dumps(out))
PY
