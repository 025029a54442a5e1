#!/usr/bin/env bash
# Benchmark: pstrain's local trainer vs the PyTorch peer (../shared/peers/torch_mlp.py) on
# the same MLP 784-1024-1024-10, Fashion-MNIST, SGD momentum 0.9, lr 0.05, seed 0.
# Runs them alternately, RUNS times each, and prints every run plus the medians and the
# ratio of samples/s medians as JSON lines; the last line also puts pstrain against the
# machine's ceiling: the 2048^3 sgemm GFLOP/s of OpenBLAS at 2 threads under the same kernels
# (bench_gemm --sgemm-peak, best of 10, measured before and after the runs, the max kept)
# divided by 11.2 MFLOP per sample (3 GEMMs x 2 FLOP x the 1.86M weights of 784-1024-1024-10).
# Not a test: it reports, it never gates.
#
# usage: bench/mlp.sh [BUILD_DIR=build] [RUNS=3] [EPOCHS=1] [BATCH=128]
# Both programs get the same environment, OPENBLAS_CORETYPE included: bench_blas_core
# (bench/lib.sh) sets it to the trainer's pick for this CPU unless BENCH_CORETYPE says
# otherwise, so both sides run the same GEMM kernels.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"
build=${1:-build}; runs=${2:-3}; epochs=${3:-1}; batch=${4:-128}
peer="$BENCH_PEERS/torch_mlp.py"
trainer="$build/bin/trainer"
bench_need_built "$build" trainer
bench_need_peer torch_mlp.py
bench_need_torch
bench_blas_core "$build"
gemm=$(bench_gemm_build "$build")
bench_header mlp "\"runs\":$runs,\"epochs\":$epochs,\"batch\":$batch,\"threads\":2"
sgemm_peak() { "$gemm" --sgemm-peak --threads 2 --reps 10 | cut -d: -f2 | tr -d '} '; }
sgemm_before=$(sgemm_peak)

tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for i in $(seq 1 "$runs"); do
  "$trainer" --model mlp --hidden 1024,1024 --dataset fashion-mnist --epochs "$epochs" \
    --batch "$batch" --optimizer momentum --lr 0.05 --momentum 0.9 --seed 0 --threads 2 \
    --progress none 2>/dev/null | tail -n 1 > "$tmp/p$i.json"
  echo "{\"run\":$i,\"who\":\"pstrain\",\"result\":$(cat "$tmp/p$i.json")}"
  "$BENCH_PY" "$peer" --epochs "$epochs" --batch "$batch" --threads 2 2>/dev/null \
    | tail -n 1 > "$tmp/t$i.json"
  echo "{\"run\":$i,\"who\":\"torch\",\"result\":$(cat "$tmp/t$i.json")}"
done
sgemm_after=$(sgemm_peak)
"$BENCH_PY" - "$tmp" "$runs" "$sgemm_before" "$sgemm_after" <<'PY'
import json, statistics, sys
d, n = sys.argv[1], int(sys.argv[2])
sgemm_before, sgemm_after = float(sys.argv[3]), float(sys.argv[4])
load = lambda p: [json.load(open("%s/%s%d.json" % (d, p, i))) for i in range(1, n + 1)]
p, t = load("p"), load("t")
med = lambda rs, k: statistics.median(r[k] for r in rs)
out = {"pstrain_samples_per_s_median": med(p, "samples_per_s"),
       "torch_samples_per_s_median": med(t, "samples_per_s"),
       "pstrain_step_ms_median": med(p, "step_ms_median"),
       "torch_step_ms_median": med(t, "step_ms_median"),
       "pstrain_test_acc": p[0]["test_acc"], "torch_test_acc": t[0]["test_acc"]}
out["ratio_samples_per_s"] = round(out["pstrain_samples_per_s_median"] / out["torch_samples_per_s_median"], 3)
# 3 GEMMs (forward, weight and input gradient) x 2 FLOP per multiply-add x the weights.
flop_per_sample = 3 * 2 * (784 * 1024 + 1024 * 1024 + 1024 * 10)
out["sgemm_gflops"] = max(sgemm_before, sgemm_after)
out["sgemm_gflops_before"], out["sgemm_gflops_after"] = sgemm_before, sgemm_after
out["ceiling_samples_per_s"] = round(out["sgemm_gflops"] * 1e9 / flop_per_sample, 1)
out["fraction_of_ceiling"] = round(out["pstrain_samples_per_s_median"] / out["ceiling_samples_per_s"], 3)
print(json.dumps(out))
PY
