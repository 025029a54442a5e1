#!/usr/bin/env bash
# Measurement: how long the rest of a sync job takes to end after a trainer departs (issue
# 17's "done when": every process within 2 s, each with a line naming the trainer and the
# reason). 1 pserver, 2 trainers (MLP hidden 32) on loopback; two cases, RUNS times each:
#   signal: trainer 1 gets SIGTERM 0.5 s after it joined (trainer 0 waits on its step);
#   flags:  trainer 1 is started with other flags and is refused at Init (exit 2).
# Prints one JSON line per run: exit codes and seconds from the departure (the kill, or
# trainer 1's exit) to trainer 0's and the pserver's exit. No peer: none of them tells the
# waiting workers (they wait for their RPC deadline). Not a test: it reports, never gates.
#
# usage: bench/departure.sh [BUILD_DIR=build] [RUNS=3]
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"
build=${1:-build}; runs=${2:-3}
bench_need_built "$build" pserver trainer
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$tmp"' EXIT
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.4f", b - a }'; } # JSON-valid: 0.0123

one() { # one CASE RUN
  local mode=$1 run=$2 port ps t0 t1 h1=32 t r0 r1 rp e0 ep
  "$build/bin/pserver" --port 0 --log-level info > "$tmp/ps.out" 2> "$tmp/ps.err" & ps=$!
  for _ in $(seq 500); do grep -q '"listening"' "$tmp/ps.out" && break; sleep 0.01; done
  port=$(sed -n 's/.*"port":\([0-9]*\).*/\1/p' "$tmp/ps.out")
  [ "$mode" = flags ] && h1=48
  export PSTRAIN_PSERVERS=127.0.0.1:$port PSTRAIN_TRAINERS=2
  PSTRAIN_TRAINER_ID=0 "$build/bin/trainer" --hidden 32 --steps 0 --epochs 1000 \
    --progress none > /dev/null 2> "$tmp/t0.err" & t0=$!
  PSTRAIN_TRAINER_ID=1 "$build/bin/trainer" --hidden "$h1" --steps 0 --epochs 1000 \
    --progress lines > /dev/null 2> "$tmp/t1.err" & t1=$!
  if [ "$mode" = signal ]; then
    for _ in $(seq 3000); do grep -q joined "$tmp/t1.err" && break; sleep 0.01; done
    sleep 0.5; t=$(now); kill -TERM "$t1"
  fi
  r1=0; wait "$t1" || r1=$?
  [ "$mode" = flags ] && t=$(now)
  r0=0; wait "$t0" || r0=$?; e0=$(now)
  rp=0; wait "$ps" || rp=$?; ep=$(now)
  line=$(grep -h -o 'trainer 1 left the job[^(]*([^)]*' "$tmp/t0.err" | head -n 1 | tr -d '"\\')
  echo "{\"case\":\"$mode\",\"run\":$run,\"trainer1_exit\":$r1,\"trainer0_exit\":$r0,\"pserver_exit\":$rp,\"trainer0_s\":$(secs "$t" "$e0"),\"pserver_s\":$(secs "$t" "$ep"),\"trainer0_says\":\"$line)\"}"
}
for i in $(seq 1 "$runs"); do one signal "$i"; one flags "$i"; done
