#!/usr/bin/env bash
# Benchmark: pstrain's local trainer vs the PyTorch peer (../shared/peers/torch_mlp.py) on
# the same MLP 784-1024-1024-10, Fashion-MNIST, SGD momentum 0.9, lr 0.05, seed 0.
# Runs them alternately, RUNS times each, and prints every run plus the medians and the
# ratio of samples/s medians as JSON lines. Not a test: it reports, it never gates.
#
# usage: bench/mlp.sh [BUILD_DIR=build] [RUNS=3] [EPOCHS=1] [BATCH=128]
# Both programs get the same environment. OpenBLAS 0.3.21 does not recognise every
# current CPU and then falls back to its slowest (Prescott) kernels; when
# OPENBLAS_CORETYPE is unset this script sets it to what the trainer itself picks
# (trainer --blas-core), so both sides run the same GEMM kernels.
set -euo pipefail
build=${1:-build}; runs=${2:-3}; epochs=${3:-1}; batch=${4:-128}
here=$(cd "$(dirname "$0")/.." && pwd)
peer="$here/../shared/peers/torch_mlp.py"
trainer="$build/bin/trainer"
[ -x "$trainer" ] || { echo "bench: $trainer not built (run make)" >&2; exit 2; }
[ -f "$peer" ] || { echo "bench: $peer not found (../shared/peers beside the repo)" >&2; exit 2; }
/usr/bin/python3 -c 'import torch' 2>/dev/null || { echo "bench: /usr/bin/python3 has no torch: apt-get install python3-torch" >&2; exit 2; }
if [ -z "${OPENBLAS_CORETYPE:-}" ]; then
  core=$("$trainer" --blas-core)
  [ -n "$core" ] && export OPENBLAS_CORETYPE=$core
fi
echo "{\"bench\":\"mlp\",\"openblas_coretype\":\"${OPENBLAS_CORETYPE:-}\",\"runs\":$runs,\"epochs\":$epochs,\"batch\":$batch}"

tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for i in $(seq 1 "$runs"); do
  "$trainer" --model mlp --hidden 1024,1024 --dataset fashion-mnist --epochs "$epochs" \
    --batch "$batch" --optimizer momentum --lr 0.05 --momentum 0.9 --seed 0 --threads 2 \
    --progress none 2>/dev/null | tail -n 1 > "$tmp/p$i.json"
  echo "{\"run\":$i,\"who\":\"pstrain\",\"result\":$(cat "$tmp/p$i.json")}"
  /usr/bin/python3 "$peer" --epochs "$epochs" --batch "$batch" --threads 2 2>/dev/null \
    | tail -n 1 > "$tmp/t$i.json"
  echo "{\"run\":$i,\"who\":\"torch\",\"result\":$(cat "$tmp/t$i.json")}"
done
/usr/bin/python3 - "$tmp" "$runs" <<'PY'
import json, statistics, sys
d, n = sys.argv[1], int(sys.argv[2])
load = lambda p: [json.load(open("%s/%s%d.json" % (d, p, i))) for i in range(1, n + 1)]
p, t = load("p"), load("t")
med = lambda rs, k: statistics.median(r[k] for r in rs)
out = {"pstrain_samples_per_s_median": med(p, "samples_per_s"),
       "torch_samples_per_s_median": med(t, "samples_per_s"),
       "pstrain_step_ms_median": med(p, "step_ms_median"),
       "torch_step_ms_median": med(t, "step_ms_median"),
       "pstrain_test_acc": p[0]["test_acc"], "torch_test_acc": t[0]["test_acc"]}
out["ratio_samples_per_s"] = round(out["pstrain_samples_per_s_median"] / out["torch_samples_per_s_median"], 3)
print(json.dumps(out))
PY
