#!/usr/bin/env bash
# Benchmark: pstrain's local GPT vs the PyTorch peer (../shared/peers/torch_gpt.py) on the
# same character language model (llm.c's GPT-2 layout, tied output projection) over the
# King James Bible: L layers, H heads, C channels, context T, B sequences a step, AdamW
# lr 1e-3, betas 0.9/0.99, no weight decay, seed 0, STEPS steps, 2 threads each.
# Runs them alternately, RUNS times each, and prints every run plus the medians as JSON
# lines: the ratio of tokens/s medians, both validation losses after the same number of
# steps (the first 64 validation windows at stride T, the peer's rule) and their ratio, and
# pstrain against the machine's ceiling: the 2048^3 sgemm GFLOP/s of OpenBLAS at 2 threads
# (best of 10, before and after the runs, the max kept) divided by the FLOP per token of
# the model's matmuls (forward and backward: 6 per weight of the blocks and the tied
# projection, plus 12 T C per layer for the scores and P V, the causal half not discounted).
# Not a test: it reports, it never gates.
#
# usage: bench/gpt.sh [BUILD_DIR=build] [RUNS=3] [STEPS=500] [LAYERS=4 HEADS=4 EMBD=128 CTX=128 BATCH=16]
# Both programs get the same environment, OPENBLAS_CORETYPE included (bench/lib.sh), and
# two threads. pstrain runs them as DEVICES (default cpu:2: two CPU devices of one thread,
# each computing half of every batch, their gradients summed in device order), its fastest
# layout on 2 cores (measured against cpu:1 with a 2-thread team: 13.6-15.6k vs 11.1-12.0k
# tokens/s at 60 steps); DEVICES=cpu:1 for the other.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"
build=${1:-build}; runs=${2:-3}; steps=${3:-500}
L=${4:-4}; H=${5:-4}; C=${6:-128}; T=${7:-128}; B=${8:-16}
devices=${DEVICES:-cpu:2}
peer="$BENCH_PEERS/torch_gpt.py"
trainer="$build/bin/trainer"
kjv=/usr/local/share/pstrain/kjv.txt
bench_need_built "$build" trainer
bench_need_peer torch_gpt.py
bench_need_torch
[ -s "$kjv" ] || bench_die "$kjv is missing: scripts/deps.sh writes it from Debian's bible-kjv"
bench_blas_core "$build"
gemm=$(bench_gemm_build "$build")
bench_header gpt "\"devices\":\"$devices\",\"runs\":$runs,\"steps\":$steps,\"layers\":$L,\"heads\":$H,\"embd\":$C,\"ctx\":$T,\"batch\":$B,\"threads\":2"
sgemm_peak() { "$gemm" --sgemm-peak --threads 2 --reps 10 | cut -d: -f2 | tr -d '} '; }
sgemm_before=$(sgemm_peak)

tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for i in $(seq 1 "$runs"); do
  PSTRAIN_DEVICES=$devices "$trainer" --model gpt --dataset kjv --layers "$L" --heads "$H" --embd "$C" --ctx "$T" \
    --batch "$B" --steps "$steps" --optimizer adamw --lr 1e-3 --beta1 0.9 --beta2 0.99 \
    --eps 1e-8 --weight-decay 0 --seed 0 --threads 2 --val-windows 64 --progress none \
    --metrics "" 2>/dev/null | tail -n 1 > "$tmp/p$i.json"
  echo "{\"run\":$i,\"who\":\"pstrain\",\"result\":$(cat "$tmp/p$i.json")}"
  "$BENCH_PY" "$peer" --data "$kjv" --layers "$L" --heads "$H" --embd "$C" --ctx "$T" \
    --batch "$B" --steps "$steps" --threads 2 2>/dev/null | tail -n 1 > "$tmp/t$i.json"
  echo "{\"run\":$i,\"who\":\"torch\",\"result\":$(cat "$tmp/t$i.json")}"
done
sgemm_after=$(sgemm_peak)
"$BENCH_PY" - "$tmp" "$runs" "$sgemm_before" "$sgemm_after" "$L" "$C" "$T" <<'PY'
import json, statistics, sys
d, n = sys.argv[1], int(sys.argv[2])
sgemm_before, sgemm_after = float(sys.argv[3]), float(sys.argv[4])
L, C, T = int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
load = lambda p: [json.load(open("%s/%s%d.json" % (d, p, i))) for i in range(1, n + 1)]
p, t = load("p"), load("t")
med = lambda rs, k: statistics.median(r[k] for r in rs)
V = t[0]["vocab"]
out = {"pstrain_tokens_per_s_median": med(p, "tokens_per_s"),
       "torch_tokens_per_s_median": med(t, "tokens_per_s"),
       "pstrain_step_ms_median": med(p, "step_ms_median"),
       "torch_step_ms_median": med(t, "step_ms_median"),
       "pstrain_val_loss": med(p, "val_loss"), "torch_val_loss": med(t, "val_loss")}
out["ratio_tokens_per_s"] = round(out["pstrain_tokens_per_s_median"] / out["torch_tokens_per_s_median"], 3)
out["val_loss_ratio"] = round(out["pstrain_val_loss"] / out["torch_val_loss"], 4)
flop_per_token = 6 * (L * 12 * C * C + C * V) + 12 * L * T * C
out["flop_per_token"] = flop_per_token
out["sgemm_gflops"] = max(sgemm_before, sgemm_after)
out["sgemm_gflops_before"], out["sgemm_gflops_after"] = sgemm_before, sgemm_after
out["ceiling_tokens_per_s"] = round(out["sgemm_gflops"] * 1e9 / flop_per_token, 1)
out["fraction_of_ceiling"] = round(out["pstrain_tokens_per_s_median"] / out["ceiling_tokens_per_s"], 3)
print(json.dumps(out))
PY
