#!/usr/bin/env bash
# Benchmark: pstrain's local GPT vs the PyTorch peer (../shared/peers/torch_gpt.py) on the
# same character language model (llm.c's GPT-2 layout, tied output projection) over the
# King James Bible: L layers, H heads, C channels, context T, B sequences a step, AdamW
# lr 1e-3, betas 0.9/0.99, no weight decay, seed 0, STEPS steps, 2 threads each.
# Runs them alternately, RUNS times each, and prints every run plus the medians as JSON
# lines: the ratio of tokens/s medians, both validation losses after the same number of
# steps (the first 64 validation windows at stride T, the peer's rule) and their ratio, and
# pstrain against the machine's ceiling: the 2048^3 sgemm GFLOP/s at 2 threads of the faster
# of OpenBLAS and oneDNN (the trainer's two fp32 GEMM libraries, --gemm)
# (best of 10, before and after the runs, the max kept) divided by the FLOP per token of
# the model's matmuls (forward and backward: 6 per weight of the blocks and the tied
# projection, plus 12 T C per layer for the scores and P V, the causal half not discounted);
# and beside it the fraction of OpenBLAS's 2048^3 rate alone (fraction_of_openblas_ceiling).
# Not a test: it reports, it never gates.
#
# usage: bench/gpt.sh [BUILD_DIR=build] [RUNS=3] [STEPS=500] [LAYERS=4 HEADS=4 EMBD=128 CTX=128 BATCH=16]
# Both programs get the same environment, OPENBLAS_CORETYPE included (bench/lib.sh), and
# two threads. pstrain runs every layout in LAYOUTS (default "cpu:2 cpu:1": two CPU devices
# of one thread each, each computing half of every batch with their gradients summed in
# device order; and one device with a 2-thread team splitting every op) in every precision
# in PRECISIONS (default "fp32 bf16"); each run of the loop runs every cell once, then the
# peer once. bf16 is measured only on a CPU with AVX512_BF16, where a bf16 trainer runs its
# linear GEMMs in bf16 (--bf16-gemm auto: oneDNN's kernels; docs/precision.md); elsewhere
# the bench says so in one line and measures fp32 only. One JSON line per cell: its
# medians, the ratio to the peer's median, the fraction of the ceiling, and for bf16 the
# fp32 cell's step over its own (step_speedup_vs_fp32) and its val_loss over fp32's. DEVICES=cpu:N
# (the older knob) is the same as LAYOUTS=cpu:N.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"
build=${1:-build}; runs=${2:-3}; steps=${3:-500}
L=${4:-4}; H=${5:-4}; C=${6:-128}; T=${7:-128}; B=${8:-16}
layouts=${LAYOUTS:-${DEVICES:-cpu:2 cpu:1}}
precisions=${PRECISIONS:-fp32 bf16}
peer="$BENCH_PEERS/torch_gpt.py"
trainer="$build/bin/trainer"
kjv=/usr/local/share/pstrain/kjv.txt
bench_need_built "$build" trainer
bench_need_peer torch_gpt.py
bench_need_torch
[ -s "$kjv" ] || bench_die "$kjv is missing: scripts/deps.sh writes it from Debian's bible-kjv"
bench_blas_core "$build"
gemm=$(bench_gemm_build "$build")
bench_precisions "$precisions"
precisions=$BENCH_PRECISIONS
cells=()
for l in $layouts; do for pr in $precisions; do cells+=("$l/$pr"); done; done
[ ${#cells[@]} -gt 0 ] || bench_die "LAYOUTS and PRECISIONS leave no cell to run"
bench_header gpt "\"layouts\":\"$layouts\",\"precisions\":\"$precisions\",\"runs\":$runs,\"steps\":$steps,\"layers\":$L,\"heads\":$H,\"embd\":$C,\"ctx\":$T,\"batch\":$B,\"threads\":2"
sgemm_peak() {
  "$gemm" --sgemm-peak --threads 2 --reps 10 |
    sed -n 's/.*"sgemm_gflops":\([0-9.]*\),"openblas_gflops":\([0-9.]*\).*/\1:\2/p'
}
sgemm_before=$(sgemm_peak)

tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for i in $(seq 1 "$runs"); do
  for c in "${cells[@]}"; do
    l=${c%/*}; pr=${c#*/}; f="$tmp/p-${l//:/_}-$pr-$i.json"
    PSTRAIN_DEVICES=$l "$trainer" --model gpt --dataset kjv --layers "$L" --heads "$H" --embd "$C" --ctx "$T" \
      --batch "$B" --steps "$steps" --optimizer adamw --lr 1e-3 --beta1 0.9 --beta2 0.99 \
      --eps 1e-8 --weight-decay 0 --seed 0 --threads 2 --val-windows 64 --progress none \
      --precision "$pr" --metrics "" 2>/dev/null | tail -n 1 > "$f"
    echo "{\"run\":$i,\"who\":\"pstrain\",\"layout\":\"$l\",\"precision\":\"$pr\",\"result\":$(cat "$f")}"
  done
  "$BENCH_PY" "$peer" --data "$kjv" --layers "$L" --heads "$H" --embd "$C" --ctx "$T" \
    --batch "$B" --steps "$steps" --threads 2 2>/dev/null | tail -n 1 > "$tmp/t$i.json"
  echo "{\"run\":$i,\"who\":\"torch\",\"result\":$(cat "$tmp/t$i.json")}"
done
sgemm_after=$(sgemm_peak)
"$BENCH_PY" - "$tmp" "$runs" "$sgemm_before" "$sgemm_after" "$L" "$C" "$T" "${cells[@]}" <<'PY'
import json, statistics, sys
d, n = sys.argv[1], int(sys.argv[2])
# each probe "BEST:OPENBLAS": the faster library's GFLOP/s, and OpenBLAS's alone
(sgemm_before, ob_before), (sgemm_after, ob_after) = (
    [float(v) for v in a.split(":")] for a in sys.argv[3:5])
L, C, T = int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
cells = sys.argv[8:]
med = lambda rs, k: statistics.median(r[k] for r in rs)
t = [json.load(open("%s/t%d.json" % (d, i))) for i in range(1, n + 1)]
V = t[0]["vocab"]
flop_per_token = 6 * (L * 12 * C * C + C * V) + 12 * L * T * C
sgemm = max(sgemm_before, sgemm_after)
ceiling = sgemm * 1e9 / flop_per_token
for c in cells:
    layout, precision = c.split("/")
    p = [json.load(open("%s/p-%s-%s-%d.json" % (d, layout.replace(":", "_"), precision, i)))
         for i in range(1, n + 1)]
    out = {"layout": layout, "precision": precision, "pstrain_gemm": p[0].get("cpu_gemm", "openblas"),
           "pstrain_tokens_per_s_median": med(p, "tokens_per_s"),
           "torch_tokens_per_s_median": med(t, "tokens_per_s"),
           "pstrain_step_ms_median": med(p, "step_ms_median"),
           "torch_step_ms_median": med(t, "step_ms_median"),
           "pstrain_val_loss": med(p, "val_loss"), "torch_val_loss": med(t, "val_loss")}
    out["ratio_tokens_per_s"] = round(out["pstrain_tokens_per_s_median"] / out["torch_tokens_per_s_median"], 3)
    out["val_loss_ratio"] = round(out["pstrain_val_loss"] / out["torch_val_loss"], 4)
    out["flop_per_token"] = flop_per_token
    out["sgemm_gflops"] = sgemm
    out["sgemm_gflops_before"], out["sgemm_gflops_after"] = sgemm_before, sgemm_after
    out["ceiling_tokens_per_s"] = round(ceiling, 1)
    out["fraction_of_ceiling"] = round(out["pstrain_tokens_per_s_median"] / ceiling, 3)
    # the same against OpenBLAS's 2048^3 rate alone (the ceiling before oneDNN's sgemm)
    ob = max(ob_before, ob_after)
    out["openblas_sgemm_gflops"] = ob
    out["fraction_of_openblas_ceiling"] = round(
        out["pstrain_tokens_per_s_median"] * flop_per_token / (ob * 1e9), 3)
    if precision != "fp32" and layout + "/fp32" in cells:
        f = [json.load(open("%s/p-%s-fp32-%d.json" % (d, layout.replace(":", "_"), i)))
             for i in range(1, n + 1)]
        out["step_speedup_vs_fp32"] = round(med(f, "step_ms_median") / out["pstrain_step_ms_median"], 3)
        out["val_loss_vs_fp32"] = round(out["pstrain_val_loss"] / med(f, "val_loss"), 4)
    print(json.dumps(out))
PY
