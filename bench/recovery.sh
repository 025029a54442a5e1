#!/usr/bin/env bash
# Measurement (issue 14): the Fashion-MNIST MLP (784-1024-1024-10, batch 128, momentum),
# EPOCHS epochs on 2 trainers x 2 pservers through pslaunch:
#   faults  the final param_hash of the run without faults, and of a run with a checkpoint
#           every 100 steps where pserver 1 is killed (SIGKILL) once step KILL1's
#           checkpoint is written and pserver 0 once step KILL2's is (pslaunch --restart 2
#           starts the killed pserver again; the other processes stay up and the job rolls
#           back to the newest complete checkpoint: --on-failure wait); for each kill, the
#           step trainer 0 was at, the step it resumed at, and the seconds from its
#           "rolling back" line to its "resuming at step" line;
#   cost    with and without --checkpoint-every 100, alternating, RUNS times each: the
#           medians of samples/s (which a checkpoint's step counts in; the median step
#           time does not) and of step_ms_median, and their ratios.
# Prints JSON lines. No peer: none of ours resumes bit for bit. Not a test: it reports.
#
# usage: bench/recovery.sh [BUILD_DIR=build] [EPOCHS=5] [RUNS=3] [KILL1=500] [KILL2=1500]
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"
build=${1:-build}; epochs=${2:-5}; runs=${3:-3}; kill1=${4:-500}; kill2=${5:-1500}
bench_need_built "$build" trainer pserver pslaunch
bench_need_python
bench_blas_core "$build"
bench_header recovery "\"epochs\":$epochs,\"runs\":$runs,\"trainers\":2,\"pservers\":2,\"kills_after\":[$kill1,$kill2]"
tmp=$(mktemp -d); trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$tmp"' EXIT
bin=$(cd "$build/bin" && pwd)
job() { # job [PSLAUNCH_ARGS...] -- [TRAINER_ARGS...]: the summary line on stdout
  local pre=() post=() seen=0
  for a in "$@"; do
    if [ "$a" = -- ]; then seen=1; elif [ $seen = 0 ]; then pre+=("$a"); else post+=("$a"); fi
  done
  "$bin/pslaunch" --pservers 2 --trainers 2 --timeout 1800 "${pre[@]}" -- "$bin/trainer" \
    --epochs "$epochs" --steps 0 --threads 1 --progress none --metrics "" "${post[@]}"
}
field() { "$BENCH_PY" -c "import json,sys; print(json.loads(sys.stdin.read())['$1'])"; }

want=$(job -- --log-level warn 2>/dev/null | tail -n 1 | field param_hash)
mkdir "$tmp/ckpt"
PSTRAIN_CHECKPOINT_DIR="$tmp/ckpt" job --restart 2 -- --checkpoint-every 100 --log-level info \
  > "$tmp/out" 2> "$tmp/err" &
launcher=$!
for k in 1 0; do
  at=$kill1; [ "$k" = 0 ] && at=$kill2
  until grep -q "checkpoint: step $at written" "$tmp/err"; do sleep 0.01; done
  for p in $(pgrep -f "^$bin/pserver"); do
    if tr '\0' '\n' < "/proc/$p/environ" | grep -qx "PSTRAIN_PSERVER_ID=$k"; then
      kill -9 "$p"
    fi
  done
done
wait "$launcher"
got=$(tail -n 1 "$tmp/out" | field param_hash)
restarts=$(grep -c 'starting pserver [0-9]* again' "$tmp/err" || true)
rollbacks=$("$BENCH_PY" - "$tmp/err" <<'PY'
import json, re, sys
def secs(t):
    h, m, s = t.split(":")
    return int(h) * 3600 + int(m) * 60 + float(s)
out, start = [], None
for line in open(sys.argv[1]):
    m = re.match(r"\[trainer 0\] (\d\d:\d\d:\d\d\.\d+) \w+ trainer\[0\](?: step (\d+))?: (.*)", line)
    if not m:
        continue
    if "rolling back to the newest complete checkpoint" in m.group(3) and start is None:
        start = (secs(m.group(1)), int(m.group(2) or 0))
    r = re.match(r"resuming at step (\d+)", m.group(3))
    if r and start:
        out.append({"failed_at_step": start[1], "resumed_at_step": int(r.group(1)),
                    "rollback_s": round(secs(m.group(1)) - start[0], 3)})
        start = None
print(json.dumps(out))
PY
)
echo "{\"part\":\"faults\",\"param_hash_without_faults\":\"$want\",\"param_hash_with_two_pserver_kills\":\"$got\",\"restarts\":$restarts,\"rollbacks\":$rollbacks,\"equal\":$([ "$want" = "$got" ] && echo true || echo false)}"

for i in $(seq 1 "$runs"); do
  job -- --log-level warn 2>/dev/null | tail -n 1 > "$tmp/plain.json"
  rm -rf "$tmp/ckpt2"
  PSTRAIN_CHECKPOINT_DIR="$tmp/ckpt2" job -- --checkpoint-every 100 --log-level warn \
    2>/dev/null | tail -n 1 > "$tmp/ckpt.json"
  echo "{\"part\":\"cost\",\"run\":$i,\"plain\":$(cat "$tmp/plain.json"),\"checkpoint_every_100\":$(cat "$tmp/ckpt.json")}" | tee -a "$tmp/cost"
done
"$BENCH_PY" - "$tmp/cost" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
med = lambda who, k: statistics.median(r[who][k] for r in rows)
sp, sc = med("plain", "samples_per_s"), med("checkpoint_every_100", "samples_per_s")
mp, mc = med("plain", "step_ms_median"), med("checkpoint_every_100", "step_ms_median")
print(json.dumps({"part": "cost", "median_samples_per_s_plain": sp,
                  "median_samples_per_s_checkpoint_every_100": sc,
                  "throughput_ratio": round(sc / sp, 4), "median_step_ms_plain": mp,
                  "median_step_ms_checkpoint_every_100": mc, "step_ms_ratio": round(mc / mp, 4)}))
PY
