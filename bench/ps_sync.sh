#!/usr/bin/env bash
# Benchmark: the synthetic sync step through the real programs — 1 pserver, 2 trainers,
# 25M fp32 parameters (100 MB pushed and 100 MB pulled per trainer per step) — against
# the PyTorch RPC parameter-server peer (../shared/peers/torch_rpc_ps.py, same sizes,
# plain SGD), alternating, RUNS times each; then iperf3's loopback figure for scale.
# Both sides run with and without their same-host shared memory: pstrain with --shm auto
# (its default: payloads through shared memory) and --shm off (payloads in the gRPC
# calls, as between hosts), the peer with TensorPipe's tcp transport and its auto choice
# (shm transport + cma channel). The headline ratio is against the peer's faster one.
# Prints JSON lines: every run, then the medians and the ratio of step-time medians.
# Not a test: it reports, it never gates. Needs iperf3 (apt-get install iperf3).
#
# usage: [PRECISION=fp32|bf16|fp16] bench/ps_sync.sh [BUILD_DIR=build] [RUNS=3] [PARAMS=25000000] [STEPS=20]
# Each system runs 3 untimed steps, then STEPS timed ones.
# PRECISION (default fp32) is pstrain's --precision: bf16/fp16 push and pull 2 bytes per
# parameter (the peer stays fp32, as it has no such mode).
# BENCH_CORETYPE=keep|NAME chooses the OpenBLAS kernel family (see bench_blas_core in bench/lib.sh).
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"
build=${1:-build}; runs=${2:-3}; params=${3:-25000000}; steps=${4:-20}
precision=${PRECISION:-fp32}
case $precision in fp32) esize=4 ;; bf16|fp16) esize=2 ;;
  *) echo "bench/ps_sync.sh: PRECISION=$precision: expected fp32, bf16 or fp16" >&2; exit 2 ;; esac
peer="$BENCH_PEERS/torch_rpc_ps.py"
bench_need_built "$build" pslaunch pserver trainer
bench_need_peer torch_rpc_ps.py
bench_need_torch
bench_need_iperf3
bench_blas_core "$build"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
# The peer times --steps steps after 3 untimed ones (its --warmup default); pstrain runs 3 +
# STEPS and its median is taken over the last STEPS of trainer 0's per-step metrics (its
# summary's median over all steps, kept as step_ms_median_all_steps, counts the first ones).
warmup=3
bench_header ps_sync "\"precision\":\"$precision\",\"params\":$params,\"trainers\":2,\"pservers\":1,\"steps\":$steps,\"warmup\":$warmup,\"runs\":$runs"
for i in $(seq 1 "$runs"); do
  for shm in auto off; do
    PSTRAIN_SHM=$shm PSTRAIN_METRICS="$tmp/m$shm$i.%t.jsonl" "$build/bin/pslaunch" --pservers 1 \
      --trainers 2 --timeout 600 -- \
      "$build/bin/trainer" --model synthetic --params "$params" --steps $((warmup + steps)) \
      --optimizer sgd --lr 0.01 --precision "$precision" \
      --log-level warn 2>/dev/null | tail -n 1 > "$tmp/p$shm$i.all.json"
    "$BENCH_PY" "$BENCH_DIR/timed_steps.py" "$tmp/p$shm$i.all.json" "$tmp/m$shm$i.0.jsonl" \
      "$warmup" "$steps" > "$tmp/p$shm$i.json"
    echo "{\"run\":$i,\"who\":\"pstrain\",\"shm\":\"$shm\",\"result\":$(cat "$tmp/p$shm$i.json")}"
  done
  for transport in tcp auto; do
    "$BENCH_PY" "$peer" --params "$params" --steps "$steps" --transport "$transport" \
      2>/dev/null | tail -n 1 > "$tmp/t$transport$i.json"
    echo "{\"run\":$i,\"who\":\"torch_rpc\",\"transport\":\"$transport\",\"result\":$(cat "$tmp/t$transport$i.json")}"
  done
done
"$BENCH_PEERS/iperf3_loopback.sh" 3 15201 1 2>/dev/null | head -n 1 > "$tmp/iperf.json" || true
iperf=$(cat "$tmp/iperf.json")
"$BENCH_PY" - "$tmp" "$runs" "$params" "${iperf:-null}" "$esize" <<'PY'
import json, statistics, sys
d, n, params, iperf = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
esize = int(sys.argv[5])
load = lambda p: [json.load(open("%s/%s%d.json" % (d, p, i))) for i in range(1, n + 1)]
med = lambda runs: statistics.median(r["step_ms_median"] for r in runs)
pm, pc = med(load("pauto")), med(load("poff"))
tt, ta = load("ttcp"), load("tauto")
ttm, tam = med(tt), med(ta)
best = min(ttm, tam)
# push + pull of every trainer, like the peer's push_pull_GBps (1e9 B/s)
gbps = 2 * 2 * params * esize / (pm / 1e3) / 1e9
gbps_off = 2 * 2 * params * esize / (pc / 1e3) / 1e9  # payloads in the calls, as between hosts
out = {"pstrain_step_ms_median": pm, "pstrain_shm_off_step_ms_median": pc,
       "torch_rpc_tcp_step_ms_median": ttm, "torch_rpc_auto_step_ms_median": tam,
       "speedup_vs_torch_rpc": round(best / pm, 3),
       "speedup_vs_torch_rpc_tcp": round(ttm / pm, 3),
       "speedup_vs_torch_rpc_auto": round(tam / pm, 3),
       "speedup_shm_off_vs_torch_rpc_tcp": round(ttm / pc, 3),
       "pstrain_push_pull_GBps": round(gbps, 2),
       "pstrain_shm_off_push_pull_GBps": round(gbps_off, 2),
       "torch_rpc_push_pull_GBps_median": statistics.median(
           r["push_pull_GBps"] for r in (tt if ttm <= tam else ta))}
if iperf != "null":
    i = json.loads(iperf)
    out["iperf3_1stream_GBps"] = i["GBps"]
    out["pstrain_vs_iperf3"] = round(gbps / i["GBps"], 3)
    out["pstrain_shm_off_vs_iperf3"] = round(gbps_off / i["GBps"], 3)
print(json.dumps(out))
PY
