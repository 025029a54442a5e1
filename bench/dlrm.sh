#!/usr/bin/env bash
# Benchmark (issue 31): the click model, pstrain (--model dlrm, trained alone, its sparse
# rows in an in-process table) against ../shared/peers/torch_dlrm.py on the same
# ctr_synth.py file (ROWS rows, written once to $TMPDIR), the same batch (512), optimizer
# (Adagrad, lr 0.05, dense and sparse), one epoch in file order, 2 threads each, the same
# OpenBLAS kernels; alternating, RUNS times. Prints one JSON line per run (samples/s, test
# AUC and log loss, peak RSS: pstrain's from /usr/bin/time, torch's own), then the ratio of
# the median samples/s, the AUC and log-loss differences, and the RSS ratio. Not a test.
# usage: bench/dlrm.sh [BUILD_DIR=build] [RUNS=3] [ROWS=2000000]
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"
build=${1:-build}; runs=${2:-3}; rows=${3:-2000000}
bench_need_built "$build" trainer
bench_need_torch
bench_need_peer torch_dlrm.py ctr_synth.py
[ -x /usr/bin/time ] || bench_die "/usr/bin/time not found: apt-get install time"
bench_blas_core "$build"
bench_header dlrm "\"rows\":$rows,\"runs\":$runs,\"batch\":512,\"threads\":2"
data=${TMPDIR:-/tmp}/pstrain_ctr_$rows.bin
[ -s "$data" ] || "$BENCH_PY" "$BENCH_PEERS/ctr_synth.py" --rows "$rows" --out "$data" >&2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for r in $(seq 1 "$runs"); do
  /usr/bin/time -f '%M' -o "$tmp/rss" "$build/bin/trainer" --model dlrm --data "$data" \
    --threads 2 --progress none --log-level warn --metrics "" | tail -n 1 >"$tmp/p.json"
  "$BENCH_PY" - "$tmp/p.json" "$tmp/rss" "$r" <<'PY' | tee -a "$tmp/all.json"
import json, sys
s = json.load(open(sys.argv[1]))
rss = int(open(sys.argv[2]).read().split()[-1]) / 1024
print(json.dumps({"run": int(sys.argv[3]), "program": "pstrain", "samples_per_s": s["samples_per_s"],
                  "test_auc": s["test_auc"], "test_logloss": s["test_logloss"],
                  "auc_gap": s["auc_gap"], "rows_touched": s["rows_touched"],
                  "table_bytes": s["table_bytes"], "peak_rss_mb": round(rss, 1)}))
PY
  "$BENCH_PY" "$BENCH_PEERS/torch_dlrm.py" --data "$data" --threads 2 | tail -n 1 |
    "$BENCH_PY" -c '
import json, sys
s = json.loads(sys.stdin.read())
print(json.dumps({"run": int(sys.argv[1]), "program": "torch_dlrm", "samples_per_s": s["samples_per_s"],
                  "test_auc": s["test_auc"], "test_logloss": s["test_logloss"],
                  "auc_gap": s["auc_gap"], "rows_touched": s["rows_touched"],
                  "peak_rss_mb": s["peak_rss_mb"]}))' "$r" | tee -a "$tmp/all.json"
done
"$BENCH_PY" - "$tmp/all.json" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
def med(prog, key):
    return statistics.median(r[key] for r in runs if r["program"] == prog)
print(json.dumps({"summary": "dlrm", "pstrain_samples_per_s": med("pstrain", "samples_per_s"),
                  "torch_samples_per_s": med("torch_dlrm", "samples_per_s"),
                  "ratio": round(med("pstrain", "samples_per_s") / med("torch_dlrm", "samples_per_s"), 3),
                  "auc_minus_torch": round(med("pstrain", "test_auc") - med("torch_dlrm", "test_auc"), 5),
                  "logloss_minus_torch": round(med("pstrain", "test_logloss") - med("torch_dlrm", "test_logloss"), 5),
                  "rss_ratio": round(med("pstrain", "peak_rss_mb") / med("torch_dlrm", "peak_rss_mb"), 3)}))
PY
