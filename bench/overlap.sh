#!/usr/bin/env bash
# Benchmark: the multi-device trainer's overlapped schedule against the same work
# serialized (--overlap 0), on a run where communication and compute are comparable:
# MLP 784-4096-4096-10, batch 128, 1 pserver, 1 trainer with 2 CPU devices (the cores
# shared: one BLAS thread each), alternating, RUNS times each; plus the local compute-only step (same
# devices, no pserver). Prints JSON lines: every run, then the medians and ratios, and
# writes a Chrome trace of steps 10-11 of the last overlapped run to bench/out/overlap.json
# and summarizes it (bench/trace_summary.py).
# Not a test: it reports, it never gates.
#
# LINK=RATE (e.g. LINK=10gbit) emulates a network link between trainer and pserver: tc
# shapes the pserver port's traffic on lo to RATE in each direction (htb, full duplex, like
# a NIC), everything else on lo is untouched, and the qdisc is removed on exit. Without it
# the link is raw loopback, where "communication" is kernel memcpy on the same 2 cores the
# GEMMs use, so overlap can only reclaim the CPU that the serialized run leaves idle.
# Needs root or passwordless sudo, and no root qdisc already on lo.
# Trainer and pserver run under the OpenBLAS kernel family bench_blas_core picks
# (BENCH_CORETYPE=keep|NAME to choose otherwise; bench/lib.sh).
#
# HOST=gpu-like: the setting of a GPU trainer, whose host cores are free for communication
# while the GPU computes: the trainer computes on ONE device with ONE thread (cpu:1,
# --threads 1) pinned to CPU 0 (--compute-cpus 0), and everything else (the pserver, gRPC,
# the send/recv streams) runs on the other CPUs (taskset), so communication can neither
# use nor slow down the compute core, as on a GPU. The default (HOST=cpu) gives the trainer 2 devices on
# the 2 cores, as a CPU trainer runs. The result's "exposed_fraction" is the share of the
# serialized run's communication the overlapped run still shows:
# (overlapped - local compute) / (serialized - local compute).
#
# usage: [HOST=cpu|gpu-like] [LINK=10gbit] [BATCH=128] bench/overlap.sh [BUILD_DIR=build] [RUNS=3] [STEPS=30]
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"
build=${1:-build}; runs=${2:-3}; steps=${3:-30}
link=${LINK:-}; batch=${BATCH:-128}; host=${HOST:-cpu}
pin=()
case "$host" in
  cpu) devices=cpu:2; threads=2 ;;
  gpu-like)
    devices=cpu:1; threads=1
    [ "$(nproc)" -ge 2 ] || bench_die "HOST=gpu-like needs 2 or more CPUs (this machine has $(nproc))"
    bench_need_cmd taskset "apt-get install util-linux"
    pin=(taskset -c "1-$(($(nproc) - 1))") ;;
  *) bench_die "HOST=$host: expected cpu or gpu-like (e.g. HOST=gpu-like)" ;;
esac
here=$(cd "$(dirname "$0")/.." && pwd)
bench_need_built "$build" pslaunch pserver trainer
bench_need_python
if [ -n "$link" ]; then bench_need_tc "LINK=$link"; fi
bench_blas_core "$build"
mkdir -p "$here/bench/out"
tmp=$(mktemp -d)
shaped=0
sudo=(); [ "$(id -u)" = 0 ] || sudo=(sudo -n)
cleanup() {
  [ "$shaped" = 1 ] && "${sudo[@]}" tc qdisc del dev lo root 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
port_args=()
if [ -n "$link" ]; then
  if "${sudo[@]}" tc qdisc show dev lo | grep -q "^qdisc htb\|^qdisc tbf"; then
    echo "bench: lo already has a shaping qdisc; remove it first (tc qdisc del dev lo root)" >&2; exit 2
  fi
  port=$("$BENCH_PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  shaped=1
  "${sudo[@]}" tc qdisc add dev lo root handle 1: htb || { shaped=0; echo "bench: LINK=$link: cannot add a qdisc to lo (needs root or sudo)" >&2; exit 2; }
  for dir in 1:dport 2:sport; do
    "${sudo[@]}" tc class add dev lo parent 1: classid "1:${dir%%:*}" htb rate "$link" ceil "$link" \
      burst 1m cburst 1m quantum 200000
    "${sudo[@]}" tc filter add dev lo parent 1: protocol ip prio 1 u32 match ip "${dir#*:}" "$port" 0xffff \
      flowid "1:${dir%%:*}"
  done
  port_args=(--base-port "$port")
fi
flags=(--model mlp --hidden 4096,4096 --batch "$batch" --steps "$steps" --optimizer momentum
       --lr 0.01 --momentum 0.9 --seed 0 --progress none --log-level warn --threads "$threads")
[ "$host" = gpu-like ] && flags+=(--compute-cpus 0)
export PSTRAIN_DEVICES=$devices
bench_header overlap "\"host\":\"$host\",\"hidden\":\"4096,4096\",\"batch\":$batch,\"devices\":\"$devices\",\"threads\":$threads,\"pservers\":1,\"trainers\":1,\"steps\":$steps,\"runs\":$runs,\"link\":\"${link:-loopback}\""
for i in $(seq 1 "$runs"); do
  trace=()
  [ "$i" = "$runs" ] && trace=(--trace "$here/bench/out/overlap.json" --trace-steps 10:11)
  "${pin[@]}" "$build/bin/pslaunch" --pservers 1 --trainers 1 --timeout 900 "${port_args[@]}" -- "$build/bin/trainer" \
    "${flags[@]}" --overlap 1 "${trace[@]}" 2>/dev/null | tail -n 1 > "$tmp/o$i.json"
  echo "{\"run\":$i,\"schedule\":\"overlap\",\"result\":$(cat "$tmp/o$i.json")}"
  "${pin[@]}" "$build/bin/pslaunch" --pservers 1 --trainers 1 --timeout 900 "${port_args[@]}" -- "$build/bin/trainer" \
    "${flags[@]}" --overlap 0 2>/dev/null | tail -n 1 > "$tmp/s$i.json"
  echo "{\"run\":$i,\"schedule\":\"serialized\",\"result\":$(cat "$tmp/s$i.json")}"
  "${pin[@]}" "$build/bin/trainer" "${flags[@]}" 2>/dev/null | tail -n 1 > "$tmp/l$i.json"
  echo "{\"run\":$i,\"schedule\":\"local compute only\",\"result\":$(cat "$tmp/l$i.json")}"
done
"$BENCH_PY" - "$tmp" "$runs" <<'PY'
import json, statistics, sys
d, n = sys.argv[1], int(sys.argv[2])
med = lambda p: statistics.median(json.load(open("%s/%s%d.json" % (d, p, i)))["step_ms_median"]
                                  for i in range(1, n + 1))
o, s, l = med("o"), med("s"), med("l")
print(json.dumps({"overlap_step_ms_median": o, "serialized_step_ms_median": s,
                  "local_compute_step_ms_median": l,
                  "overlap_over_serialized": round(o / s, 3),
                  "exposed_fraction": round((o - l) / (s - l), 3) if s > l else None,
                  "overlap_over_local_compute": round(o / l, 3),
                  "serialized_over_local_compute": round(s / l, 3)}))
# The trainers' own time split (summary time_split, means per step) beside it: the parts
# add up to the step; the communication not hidden of the overlapped schedule over the
# serialized one is what exposed_fraction estimates from the three step times.
parts = ("compute_ms", "comm_ms", "wait_ms", "data_ms", "other_ms")
def split(p):
    rows = [json.load(open("%s/%s%d.json" % (d, p, i)))["time_split"] for i in range(1, n + 1)]
    m = {k: statistics.median(r[k] for r in rows) for k in ("step_ms",) + parts}
    m["parts_over_step"] = round(sum(m[k] for k in parts) / m["step_ms"], 4)
    return m
so, ss, sl = split("o"), split("s"), split("l")
exposed = (so["comm_ms"] + so["wait_ms"]) / (ss["comm_ms"] + ss["wait_ms"]) \
    if ss["comm_ms"] + ss["wait_ms"] > 0 else None
print(json.dumps({"time_split_overlap": so, "time_split_serialized": ss,
                  "time_split_local": sl,
                  "split_exposed_fraction": round(exposed, 3) if exposed is not None else None}))
PY
# What the trace of the last overlapped run shows (pushes during backward; the next forward
# before the last pull returns).
"$BENCH_PY" "$here/bench/trace_summary.py" "$here/bench/out/overlap.json"
