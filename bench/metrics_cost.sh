#!/usr/bin/env bash
# Measurement (issue 16): what serving /metrics costs. The Fashion-MNIST MLP
# (784-1024-1024-10, batch 128, momentum), EPOCHS epochs on 2 trainers x 1 pserver through
# pslaunch, alternating RUNS times: (a) every process with --metrics-port and a scraper
# that GETs every /metrics once a second (as a Prometheus would, 15 times more often than
# its default), (b) no metrics at all. Reports the medians of trainer 0's samples/s and
# step_ms_median and their ratios, and how many scrapes were answered. Not a test.
#
# usage: bench/metrics_cost.sh [BUILD_DIR=build] [EPOCHS=1] [RUNS=3]
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"
build=${1:-build}; epochs=${2:-1}; runs=${3:-3}
bench_need_built "$build" trainer pserver pslaunch
bench_need_python
bench_blas_core "$build"
bench_header metrics_cost "\"epochs\":$epochs,\"runs\":$runs,\"trainers\":2,\"pservers\":1,\"scrape_every_s\":1"
tmp=$(mktemp -d); trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$tmp"' EXIT
bin=$(cd "$build/bin" && pwd)
# Fixed ports for the scraper: the pserver's from PSTRAIN_METRICS_PORT, the trainers' from
# --metrics-port (each trainer its own: +1 per trainer id through PSTRAIN_TRAINER_ID).
base=$((20000 + RANDOM % 20000))
job() { # job on|off: trainer 0's summary line on stdout
  if [ "$1" = on ]; then
    PSTRAIN_METRICS_PORT=$base "$bin/pslaunch" --pservers 1 --trainers 2 --timeout 1800 -- \
      bash -c 'exec "$0" --metrics-port $(('"$base"' + 1 + PSTRAIN_TRAINER_ID)) "$@"' \
      "$bin/trainer" --epochs "$epochs" --progress none --metrics "" --log-level warn
  else
    "$bin/pslaunch" --pservers 1 --trainers 2 --timeout 1800 -- \
      "$bin/trainer" --epochs "$epochs" --progress none --metrics "" --log-level warn
  fi
}
scraper() { # scrapes every port once a second; counts the answers in $tmp/scrapes
  exec "$BENCH_PY" - "$base" "$tmp/scrapes" <<'PY'
import sys, time, urllib.request
base, out = int(sys.argv[1]), sys.argv[2]
n = 0
while True:
    for p in (base, base + 1, base + 2):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{p}/metrics", timeout=1).read()
            n += 1
        except Exception:
            pass
    try:
        open(out, "w").write(str(n))
    except OSError:
        break
    time.sleep(1)
PY
}
for i in $(seq 1 "$runs"); do
  scraper & spid=$!
  job on 2>/dev/null | tail -n 1 > "$tmp/on.json"
  kill "$spid" 2>/dev/null || true; wait "$spid" 2>/dev/null || true
  job off 2>/dev/null | tail -n 1 > "$tmp/off.json"
  echo "{\"run\":$i,\"scrapes\":$(cat "$tmp/scrapes" 2>/dev/null || echo 0),\"metrics_and_scraper\":$(cat "$tmp/on.json"),\"no_metrics\":$(cat "$tmp/off.json")}" | tee -a "$tmp/rows"
done
"$BENCH_PY" - "$tmp/rows" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
med = lambda who, k: statistics.median(r[who][k] for r in rows)
on, off = med("metrics_and_scraper", "samples_per_s"), med("no_metrics", "samples_per_s")
son, soff = med("metrics_and_scraper", "step_ms_median"), med("no_metrics", "step_ms_median")
print(json.dumps({"part": "medians", "samples_per_s_metrics": on, "samples_per_s_none": off,
                  "throughput_ratio": round(on / off, 4), "step_ms_median_metrics": son,
                  "step_ms_median_none": soff, "step_ms_ratio": round(son / soff, 4),
                  "scrapes_per_run": statistics.median(r["scrapes"] for r in rows)}))
PY
