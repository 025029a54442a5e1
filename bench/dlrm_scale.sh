#!/usr/bin/env bash
# Benchmark (issue 31, "scale past memory"): the click model on a file whose key space is
# far larger than memory (ctr-synth --max-vocab 1e8: 26 fields, 2.1e8 ids in all), trained
# by 2 trainers with 2 pservers in sync mode on 127.0.0.1, each pserver's table limited to
# MAX_ROWS rows (--sparse-max-rows). Every 2 s it prints each pserver's sparse rows, bytes,
# rows created and evicted (its /metrics) and resident memory, then trainer 0's summary
# and what a dense table of the whole key space would take. Not a test: nothing is timed
# against a peer (torch_dlrm allocates every row of every table: it cannot run this file).
# usage: bench/dlrm_scale.sh [BUILD_DIR=build] [ROWS=2000000] [MAX_ROWS=400000]
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"
build=${1:-build}; rows=${2:-2000000}; max_rows=${3:-400000}
bench_need_built "$build" trainer
bench_need_built "$build" pserver
bench_need_built "$build" ctr-synth
bench_need_cmd curl "apt-get install curl"
bench_blas_core "$build"
bench_header dlrm_scale "\"rows\":$rows,\"max_vocab\":100000000,\"max_rows_per_pserver\":$max_rows,\"pservers\":2,\"trainers\":2"
data=${TMPDIR:-/tmp}/pstrain_ctr_${rows}_vocab1e8.bin
[ -s "$data" ] || "$build/bin/ctr-synth" --rows "$rows" --max-vocab 100000000 --out "$data" >&2
tmp=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
base=$((20000 + RANDOM % 20000)) # ports base, +1 (pservers), +10, +11 (their /metrics)
for i in 0 1; do
  PSTRAIN_ROLE=pserver PSTRAIN_BIND=127.0.0.1 PSTRAIN_PORT=$((base + i)) PSTRAIN_PSERVER_ID=$i \
    PSTRAIN_METRICS_PORT=$((base + 10 + i)) PSTRAIN_LOG_LEVEL=warn \
    "$build/bin/pserver" >"$tmp/ps$i.out" 2>"$tmp/ps$i.err" &
  pids+=($!)
done
ps_pids=("${pids[@]}")
for t in 0 1; do
  PSTRAIN_PSERVERS="127.0.0.1:$base,127.0.0.1:$((base + 1))" PSTRAIN_TRAINERS=2 \
    PSTRAIN_TRAINER_ID=$t "$build/bin/trainer" --model dlrm --data "$data" --threads 1 \
    --sparse-max-rows "$max_rows" --progress none --log-level warn --metrics "" \
    --connect-timeout-ms 20000 >"$tmp/t$t.out" 2>"$tmp/t$t.err" &
  pids+=($!)
done
t0=$(date +%s)
# one JSON line every 2 s while trainer 0 runs: each pserver's table and memory
while kill -0 "${pids[2]}" 2>/dev/null; do
  sleep 2
  line="{\"t_s\":$(($(date +%s) - t0))"
  for i in 0 1; do
    m=$(curl -s --max-time 1 "http://127.0.0.1:$((base + 10 + i))/metrics" || true)
    get() { echo "$m" | awk -v k="$1" '$1 == k {print $2; exit}'; }
    rss=$(awk '/^VmRSS/ {print $2}' "/proc/${ps_pids[$i]}/status" 2>/dev/null || echo 0)
    line+=",\"ps$i\":{\"rows\":$(get pstrain_pserver_sparse_rows),"
    line+="\"bytes\":$(get pstrain_pserver_sparse_bytes),"
    line+="\"created\":$(get pstrain_pserver_sparse_rows_created),"
    line+="\"evicted\":$(get pstrain_pserver_sparse_rows_evicted),\"rss_mb\":$((rss / 1024))}"
  done
  echo "$line}" | sed 's/:,/:null,/g; s/:}/:null}/g'
done
wait "${pids[2]}" "${pids[3]}" || bench_die "a trainer failed: $(tail -n 3 "$tmp"/t*.err)"
wait "${ps_pids[@]}" || true
tail -n 1 "$tmp/t0.out" >"$tmp/sum.json"
"$BENCH_PY" - "$tmp/sum.json" "$data" "$max_rows" <<'PY'
import json, struct, sys
s = json.load(open(sys.argv[1]))
with open(sys.argv[2], "rb") as f:
    h = f.read(64)
    F = struct.unpack_from("<I", h, 12)[0]
    vocab = struct.unpack("<%dI" % F, f.read(4 * F))
dense = sum(vocab) * 16 * 4 * 2  # every id's row of 16 and its Adagrad state, f32
print(json.dumps({"summary": "dlrm_scale", "test_auc": s["test_auc"], "auc_gap": s["auc_gap"],
                  "samples_per_s_trainer0": s["samples_per_s"], "rows_touched": s["rows_touched"],
                  "rows_evicted": s["rows_evicted"], "table_rows": s["table_rows"],
                  "table_bytes": s["table_bytes"], "key_space": sum(vocab),
                  "dense_table_bytes": dense,
                  "table_rows_within_2x_max_rows": s["table_rows"] <= 2 * int(sys.argv[3]),
                  "bytes_per_row": round(s["table_bytes"] / max(s["table_rows"], 1), 1)}))
PY
