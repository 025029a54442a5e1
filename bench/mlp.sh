#!/usr/bin/env bash
# Benchmark: pstrain's local trainer vs the PyTorch peer (../shared/peers/torch_mlp.py) on
# the same MLP 784-1024-1024-10, Fashion-MNIST, SGD momentum 0.9, lr 0.05, seed 0.
# Runs them alternately, RUNS times each, and prints every run plus, per cell, the medians,
# the ratio of samples/s medians and pstrain against the machine's ceiling: the 2048^3 sgemm
# GFLOP/s at 2 threads of the faster of OpenBLAS (under the same kernels) and oneDNN, the
# trainer's two fp32 GEMM libraries (bench_gemm --sgemm-peak, best of 10 each, measured
# before and after the runs, the max kept)
# divided by the FLOP per sample: 3 GEMMs x 2 FLOP x the weights (11.2 MFLOP for 784-1024-1024-10);
# beside it the fraction of OpenBLAS's 2048^3 rate alone (fraction_of_openblas_ceiling).
# Not a test: it reports, it never gates.
#
# usage: bench/mlp.sh [BUILD_DIR=build] [RUNS=3] [EPOCHS=1] [BATCH=128]
# Both programs get the same environment, OPENBLAS_CORETYPE included: bench_blas_core
# (bench/lib.sh) sets it to the trainer's pick for this CPU unless BENCH_CORETYPE says
# otherwise, so both sides run the same GEMM kernels.
# pstrain runs in every layout of LAYOUTS (default "cpu:1 cpu:2": one device with a 2-thread
# team, and two devices of one thread each). After the 784-1024-1024-10 runs, the wider
# family WIDE (default "2048:64 4096:32 4096:128": hidden width:batch, both hidden layers that
# wide) trains WIDE_STEPS steps (default 200) per run in each layout, alternating with the
# peer (its --hidden, --max-steps) the same way. One JSON line per cell: layout, hidden,
# batch, medians, the ratio to the peer and the fraction of that shape's ceiling.
# Every cell runs in each precision of PRECISIONS (default "fp32 bf16"; bf16 only on a CPU
# with AVX512_BF16, where a bf16 trainer's GEMMs run in bf16: elsewhere the bench says so in
# one line); a bf16 cell adds the fp32 cell's step over its own and its test accuracy
# minus fp32's. The ceiling is fp32's sgemm rate for both.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"
build=${1:-build}; runs=${2:-3}; epochs=${3:-1}; batch=${4:-128}
layouts=${LAYOUTS:-cpu:1 cpu:2}
precisions=${PRECISIONS:-fp32 bf16}
wide=${WIDE-2048:64 4096:32 4096:128}
wide_steps=${WIDE_STEPS:-200}
peer="$BENCH_PEERS/torch_mlp.py"
trainer="$build/bin/trainer"
bench_need_built "$build" trainer
bench_need_peer torch_mlp.py
bench_need_torch
bench_blas_core "$build"
gemm=$(bench_gemm_build "$build")
bench_precisions "$precisions"
precisions=$BENCH_PRECISIONS
[ -n "$precisions" ] || bench_die "PRECISIONS leaves no precision to run"
bench_header mlp "\"layouts\":\"$layouts\",\"precisions\":\"$precisions\",\"wide\":\"$wide\",\"wide_steps\":$wide_steps,\"runs\":$runs,\"epochs\":$epochs,\"batch\":$batch,\"threads\":2"
sgemm_peak() {
  "$gemm" --sgemm-peak --threads 2 --reps 10 |
    sed -n 's/.*"sgemm_gflops":\([0-9.]*\),"openblas_gflops":\([0-9.]*\).*/\1:\2/p'
}
sgemm_before=$(sgemm_peak)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
# shape h:b:steps (steps 0: EPOCHS epochs); results in $tmp/{p-LAYOUT,t}-h-b-i.json
shapes=("1024:$batch:0")
for w in $wide; do shapes+=("$w:$wide_steps"); done
cells=()
for shape in "${shapes[@]}"; do
  IFS=: read -r h b n <<< "$shape"
  if [ "$n" = 0 ]; then len=(--epochs "$epochs"); plen=(--epochs "$epochs")
  else len=(--epochs 1 --steps "$n"); plen=(--epochs 1 --max-steps "$n"); fi
  for i in $(seq 1 "$runs"); do
    for l in $layouts; do for pr in $precisions; do
      f="$tmp/p-${l//:/_}_$pr-$h-$b-$i.json"
      PSTRAIN_DEVICES=$l "$trainer" --model mlp --hidden "$h,$h" --dataset fashion-mnist "${len[@]}" \
        --batch "$b" --optimizer momentum --lr 0.05 --momentum 0.9 --seed 0 --threads 2 \
        --precision "$pr" --progress none 2>/dev/null | tail -n 1 > "$f"
      echo "{\"run\":$i,\"who\":\"pstrain\",\"layout\":\"$l\",\"precision\":\"$pr\",\"hidden\":$h,\"batch\":$b,\"result\":$(cat "$f")}"
    done; done
    "$BENCH_PY" "$peer" "${plen[@]}" --hidden "$h" --batch "$b" --threads 2 2>/dev/null \
      | tail -n 1 > "$tmp/t-$h-$b-$i.json"
    echo "{\"run\":$i,\"who\":\"torch\",\"hidden\":$h,\"batch\":$b,\"result\":$(cat "$tmp/t-$h-$b-$i.json")}"
  done
  for l in $layouts; do for pr in $precisions; do cells+=("${l//:/_}_$pr/$h/$b"); done; done
done
sgemm_after=$(sgemm_peak)
"$BENCH_PY" - "$tmp" "$runs" "$sgemm_before" "$sgemm_after" "${cells[@]}" <<'PY'
import json, statistics, sys
d, n = sys.argv[1], int(sys.argv[2])
# each probe "BEST:OPENBLAS": the faster library's GFLOP/s, and OpenBLAS's alone
(sgemm_before, ob_before), (sgemm_after, ob_after) = (
    [float(v) for v in a.split(":")] for a in sys.argv[3:5])
sgemm = max(sgemm_before, sgemm_after)
med = lambda rs, k: statistics.median(r[k] for r in rs)
for c in sys.argv[5:]:
    layout, h, b = c.split("/")
    load = lambda who: [json.load(open("%s/%s-%s-%s-%d.json" % (d, who, h, b, i)))
                        for i in range(1, n + 1)]
    p, t = load("p-" + layout), load("t")
    h = int(h)
    layout, precision = layout.rsplit("_", 1)
    out = {"layout": layout.replace("_", ":"), "precision": precision, "hidden": h, "batch": int(b),
           "pstrain_samples_per_s_median": med(p, "samples_per_s"),
           "torch_samples_per_s_median": med(t, "samples_per_s"),
           "pstrain_step_ms_median": med(p, "step_ms_median"),
           "torch_step_ms_median": med(t, "step_ms_median"),
           "pstrain_test_acc": p[0]["test_acc"], "torch_test_acc": t[0]["test_acc"],
           "pstrain_gemm": p[0].get("cpu_gemm", "openblas")}
    out["ratio_samples_per_s"] = round(out["pstrain_samples_per_s_median"] / out["torch_samples_per_s_median"], 3)
    # 3 GEMMs (forward, weight and input gradient) x 2 FLOP per multiply-add x the weights.
    flop_per_sample = 3 * 2 * (784 * h + h * h + h * 10)
    out["sgemm_gflops"] = sgemm
    out["sgemm_gflops_before"], out["sgemm_gflops_after"] = sgemm_before, sgemm_after
    out["ceiling_samples_per_s"] = round(sgemm * 1e9 / flop_per_sample, 1)
    out["fraction_of_ceiling"] = round(out["pstrain_samples_per_s_median"] / out["ceiling_samples_per_s"], 3)
    # the same against OpenBLAS's 2048^3 rate alone (the ceiling before oneDNN's sgemm)
    ob = max(ob_before, ob_after)
    out["openblas_sgemm_gflops"] = ob
    out["fraction_of_openblas_ceiling"] = round(
        out["pstrain_samples_per_s_median"] * flop_per_sample / (ob * 1e9), 3)
    if precision != "fp32" and "%s_fp32/%d/%s" % (layout, h, b) in sys.argv[5:]:
        f = load("p-%s_fp32" % layout)
        out["step_speedup_vs_fp32"] = round(med(f, "step_ms_median") / out["pstrain_step_ms_median"], 3)
        out["test_acc_minus_fp32"] = round(out["pstrain_test_acc"] - f[0]["test_acc"], 4)
    print(json.dumps(out))
PY
