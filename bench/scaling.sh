#!/usr/bin/env bash
# Benchmark: how the synchronous step scales with trainers (T) and pservers (S) over real
# (emulated) links. Every process gets its own host of a network lab (scripts/netlab: one
# network namespace per host, LINK on both directions of its link), so the bytes
# cross rate-limited links as between machines; pstrain runs with --shm off.
#   pstrain       pservers on h0..h{S-1}, trainers on h{S}..h{S+T-1}, the synthetic model,
#                 P parameters, fp32 or bf16 on the wire (4 or 2 bytes a parameter);
#   torch_ddp     ../shared/peers/torch_ddp.py, one rank per host on h0..h{T-1} (ring
#                 all-reduce over gloo, fp32, after DDP's broadcast of the model's 4P bytes
#                 of buffers from rank 0); run once per T (pservers 0 in its lines);
#   torch_rpc_ps  ../shared/peers/torch_rpc_ps.py, the PS on h0, trainers on h1..hT (one PS:
#                 only in the cells with S = 1; fp32).
#   pstrain_chain pstrain as above with PSTRAIN_CHAIN (trainer/chain.h): each trainer passes
#                 its sum on to the next, only the last pushes to the pservers (T >= 2;
#                 not in the default SYSTEMS).
# The systems alternate within a cell, RUNS times. Beside each measurement: the cost
# model's prediction (bench/costmodel.py, constants measured here at the start on
# 127.0.0.1, the links at iperf3's rate), the busiest link's utilization and the CPU
# utilization of the 2 cores.
#
# usage: bench/scaling.sh [BUILD_DIR=build]      (as root: the lab needs it)
# env:   LINK=250mbit  PARAMS=5000000  STEPS=30  RUNS=2  (every system first runs 3
#        untimed steps, then STEPS timed ones; 30 rather than 10 for a steadier median
#        where 8 or 12 hosts share the 2 cores: docs/scaling.md)
#        (250 Mbit/s by default: on a 2-core machine 1 Gbit/s links are CPU-bound from
#        T=4, S=4 on: 8 processes moving 160 MB a step keep both cores 0.85-0.9 busy and
#        the links below 0.8; at 250 Mbit/s the cores are 0.4-0.7 busy; docs/scaling.md)
#        FAIR=1: each host's upload shared equally among its peers (scripts/netlab --fair,
#        as a Linux host's fq_codel shares it among flows; this kernel has no fq_codel);
#        FAIR=0: one tbf FIFO a direction, where a pserver's answers to many trainers get
#        unequal shares (docs/scaling.md)
#        TRAINERS="1 2 4 8"  PSERVERS="1 2 4"  PRECISIONS="fp32 bf16"
#        SYSTEMS="pstrain torch_ddp torch_rpc_ps" (and pstrain_chain)
#        OUT=DIR (results.jsonl, table.md, scaling.png, logs/; default: a new temp dir)
#        TIMEOUT=SEC per process (default: from the prediction, at least 120 s)
#        NETLAB_NAME=scal (the lab's name)   BENCH_CORETYPE (see bench/lib.sh)
#        PSTRAIN_BLOCK_BYTES, PSTRAIN_SEND_WINDOW: reach pstrain's trainers (the environment
#        passes through) and the cost model
# stdout: a header JSON line, one JSON line per system and cell (a failed cell: a line with
# "error" and the stderr tail on stderr), then a markdown table and where the plot went.
# JSON field meanings: docs/scaling.md. Not a test: it reports, it never gates.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"
root=$(cd "$BENCH_DIR/.." && pwd)
build=$(cd "${1:-build}" 2>/dev/null && pwd) || bench_die "${1:-build}: no such build directory"
link=${LINK:-250mbit}
fair=${FAIR:-1}
case $fair in 0|1) ;; *) bench_die "FAIR=$fair: expected 1 (scripts/netlab --fair: each upload shared among its peers) or 0 (one tbf FIFO a direction)" ;; esac
params=${PARAMS:-5000000}
steps=${STEPS:-30}
runs=${RUNS:-2}
trainers_list=${TRAINERS:-1 2 4 8}
pservers_list=${PSERVERS:-1 2 4}
precisions=${PRECISIONS:-fp32 bf16}
systems=${SYSTEMS:-pstrain torch_ddp torch_rpc_ps}
export NETLAB_NAME=${NETLAB_NAME:-scal}
netlab=${NETLAB:-$root/scripts/netlab} # NETLAB: another implementation of its contract
costmodel=$BENCH_DIR/costmodel.py
# Every system's untimed steps before its STEPS timed ones: the peers' --warmup; pstrain's
# trainers run WARMUP + STEPS steps and the median is taken over the last STEPS of trainer
# 0's per-step metrics (its own median over all steps would keep the first steps' slow start)
warmup=3
port=7164

# ---- checks, before anything runs
[ "$(id -u)" = 0 ] || bench_die "needs root (the network lab makes namespaces and tc qdiscs): sudo $0 $*"
for n in $params $steps $runs $trainers_list $pservers_list; do
  case $n in '' | *[!0-9]* | 0) bench_die "PARAMS, STEPS, RUNS, TRAINERS and PSERVERS take positive integers (got '$n')" ;; esac
done
for p in $precisions; do
  case $p in fp32 | bf16) ;; *) bench_die "PRECISIONS: '$p' (expected fp32 and/or bf16)" ;; esac
done
for s in $systems; do
  case $s in pstrain | pstrain_chain | torch_ddp | torch_rpc_ps) ;;
    *) bench_die "SYSTEMS: '$s' (expected pstrain, pstrain_chain, torch_ddp, torch_rpc_ps)" ;; esac
done
[ -x "$netlab" ] || bench_die "$netlab not found or not executable (the network lab)"
bench_need_built "$build" pserver trainer
bench_need_python
bench_need_cmd iperf3 "apt-get install iperf3"
bench_need_tc "the network lab"
case " $systems " in *" torch_"*)
  bench_need_torch
  bench_need_peer torch_ddp.py torch_rpc_ps.py ;;
esac
link_bps=$("$BENCH_PY" -c 'import sys; sys.path.insert(0, sys.argv[1]); import costmodel; print(int(costmodel.parse_rate(sys.argv[2])))' "$BENCH_DIR" "$link") ||
  bench_die "LINK=$link: expected a tc rate like 1gbit or 250mbit"
max_t=0 max_s=0
for t in $trainers_list; do [ "$t" -gt "$max_t" ] && max_t=$t; done
for s in $pservers_list; do [ "$s" -gt "$max_s" ] && max_s=$s; done
hosts=$((max_t + max_s))
[ "$hosts" -ge 2 ] || hosts=2 # iperf3 needs two

bench_blas_core "$build"
out=${OUT:-$(mktemp -d /tmp/scaling.XXXXXX)}
mkdir -p "$out/logs" || bench_die "OUT=$out: cannot create"
out=$(cd "$out" && pwd)
results=$out/results.jsonl
: >"$results"

# ---- the lab; everything this script started goes on exit
pids=()
sampler=
cleanup() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  if [ -n "$sampler" ]; then kill "$sampler" 2>/dev/null || true; fi
  "$netlab" down >/dev/null 2>&1 || true
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# the machine's constants for the model, on 127.0.0.1 before the lab (a few seconds)
consts=$("$costmodel" --measure "$build" --params "$params" --steps 30 2>"$out/logs/measure.err") ||
  { tail -n 5 "$out/logs/measure.err" >&2; bench_die "bench/costmodel.py --measure $build failed"; }
read -r compute_ms upd_fp32 upd_bf16 < <("$BENCH_PY" -c '
import json, sys
d = json.loads(sys.argv[1])
print(d["compute_ms"], d["update_gbps"]["fp32"], d["update_gbps"]["bf16"])' "$consts")

# torch_ddp's compute: world 1 on 127.0.0.1 (no all-reduce traffic: the step is compute)
ddp_compute_ms=null
case " $systems " in *" torch_ddp "*)
  ddp_compute_ms=$("$BENCH_PY" "$BENCH_PEERS/torch_ddp.py" --params "$params" --world 1 \
    --steps 10 --warmup 2 2>"$out/logs/ddp1.err" | "$BENCH_PY" -c '
import json, sys
print(json.loads(sys.stdin.read().strip().splitlines()[-1])["step_ms_median"])') ||
    { tail -n 5 "$out/logs/ddp1.err" >&2; bench_die "torch_ddp.py --world 1 on 127.0.0.1 failed"; }
  ;;
esac
consts=$("$BENCH_PY" -c 'import json, sys; d = json.loads(sys.argv[1]); d["ddp_compute_ms"] = json.loads(sys.argv[2]); print(json.dumps(d))' "$consts" "$ddp_compute_ms")

"$netlab" down >/dev/null 2>&1 || true
fair_arg=(); [ "$fair" = 1 ] && fair_arg=(--fair)
"$netlab" up --hosts "$hosts" --link "$link" "${fair_arg[@]}" >"$out/logs/netlab.out" 2>"$out/logs/netlab.err" ||
  { tail -n 5 "$out/logs/netlab.err" >&2; bench_die "scripts/netlab up --hosts $hosts --link $link ${fair_arg[*]} failed"; }
declare -A addr
for ((h = 0; h < hosts; h++)); do
  addr[h$h]=$("$netlab" addr "h$h") || bench_die "scripts/netlab addr h$h failed"
done

# iperf3 h1 -> h0, 3 s, one stream: the link as TCP sees it
iperf_bps=null
"$netlab" run h0 -- timeout 20 iperf3 -s -1 -p 5201 </dev/null >/dev/null 2>&1 &
ip_srv=$!
pids+=("$ip_srv")
for try in 1 2 3 4 5; do
  sleep 0.5
  if "$netlab" run h1 -- timeout 15 iperf3 -c "${addr[h0]}" -p 5201 -t 3 -J \
    </dev/null >"$out/logs/iperf3.json" 2>/dev/null; then
    iperf_bps=$("$BENCH_PY" -c 'import json, sys; print(int(json.load(open(sys.argv[1]))["end"]["sum_received"]["bits_per_second"]))' \
      "$out/logs/iperf3.json" 2>/dev/null) || iperf_bps=null
    break
  fi
  [ "$try" = 5 ] && echo "bench: iperf3 between h1 and h0 failed; iperf3_bps is null" >&2
done
wait "$ip_srv" 2>/dev/null || true
# The model prices payload bytes at the rate TCP gets through the link (iperf3's, where
# measured): tbf and htb count whole packets, and the headers take about 4% of its rate.
model_bps=$link_bps
[ "$iperf_bps" = null ] || model_bps=$iperf_bps

# CPU sampler: /proc/stat's first line every 0.25 s, with a timestamp
(while :; do
  read -r _ u n s i w q sq st _ </proc/stat
  echo "$(date +%s.%N) $((u + n + s + q + sq + st)) $((u + n + s + i + w + q + sq + st))"
  sleep 0.25
done) >"$out/logs/cpu.txt" &
sampler=$!

list_json() { "$BENCH_PY" -c 'import json, sys; print(json.dumps(sys.argv[1].split()))' "$1"; }
list_int() { "$BENCH_PY" -c 'import json, sys; print(json.dumps([int(x) for x in sys.argv[1].split()]))' "$1"; }
bench_header scaling "\"link\":\"$link\",\"fair\":$fair,\"link_bps\":$link_bps,\"iperf3_bps\":$iperf_bps,\
\"model_link_bps\":$model_bps,\
\"params\":$params,\"steps\":$steps,\"warmup\":$warmup,\"runs\":$runs,\"trainers\":$(list_int "$trainers_list"),\
\"pservers\":$(list_int "$pservers_list"),\"precisions\":$(list_json "$precisions"),\
\"systems\":$(list_json "$systems"),\"hosts\":$hosts,\"netlab\":\"$NETLAB_NAME\",\
\"measured\":$consts,\"loadavg_1m\":$(cut -d' ' -f1 /proc/loadavg),\"out\":\"$out\"" |
  tee -a "$results"

# ---- one run of one system: writes $out/logs/<tag>.{out,err,time}; returns non-zero on failure
# predict SYSTEM T S PREC: the cost model's JSON
predict() {
  local upd=$upd_fp32
  [ "$4" = bf16 ] && upd=$upd_bf16
  case $1 in
    pstrain | pstrain_chain) "$costmodel" --system "$1" --trainers "$2" --pservers "$3" --params "$params" \
      --precision "$4" --link-bps "$model_bps" --update-gbps "$upd" --compute-ms "$compute_ms" \
      --block-bytes "${PSTRAIN_BLOCK_BYTES:-4M}" --send-window "${PSTRAIN_SEND_WINDOW:-auto}" --json ;;
    torch_ddp) "$costmodel" --system ddp --trainers "$2" --params "$params" --link-bps "$model_bps" \
      --compute-ms "$ddp_compute_ms" --json ;;
    torch_rpc_ps) "$costmodel" --system torch_rpc_ps --trainers "$2" --params "$params" --link-bps "$model_bps" --json ;;
  esac
}

# run_procs TAG TIMEOUT: starts every "HOST|OUTFILE|CMD..." line of $procs (the first is the
# reporter), waits for all; rc of the worst. The inner `timeout` stops a stuck process in
# its host; the outer one stops `netlab run` itself if that hangs.
run_procs() {
  local tag=$1 to=$2 line host ofile i=0 rc=0 r
  local -a mine=() cmd
  date +%s.%N >"$out/logs/$tag.time"
  while IFS= read -r line; do
    [ -n "$line" ] || continue
    host=${line%%|*}
    line=${line#*|}
    ofile=${line%%|*}
    read -r -a cmd <<<"${line#*|}"
    timeout -k 5 $((to + 30)) "$netlab" run "$host" -- timeout -k 5 "$to" "${cmd[@]}" \
      </dev/null >"$ofile" 2>"$out/logs/$tag.p$i.err" &
    mine+=($!)
    pids+=($!)
    i=$((i + 1))
  done <<<"$procs"
  for p in "${mine[@]}"; do
    r=0
    wait "$p" || r=$?
    [ "$r" -gt "$rc" ] && rc=$r
  done
  date +%s.%N >>"$out/logs/$tag.time"
  pids=()
  return "$rc"
}

# one_run SYSTEM T S PREC RUN TIMEOUT
one_run() {
  local sys=$1 t=$2 s=$3 prec=$4 run=$5 to=$6 i
  local tag="$sys-T$t-S$s-$prec-r$run" env_common
  env_common="env OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-} PSTRAIN_SHM=off PSTRAIN_LOG_LEVEL=warn"
  [ -n "${OPENBLAS_CORETYPE:-}" ] || env_common="env -u OPENBLAS_CORETYPE PSTRAIN_SHM=off PSTRAIN_LOG_LEVEL=warn"
  procs=""
  case $sys in
    pstrain | pstrain_chain)
      local list="" k chain=""
      for ((k = 0; k < s; k++)); do list+="${list:+,}${addr[h$k]}:$port"; done
      if [ "$sys" = pstrain_chain ]; then
        for ((k = 0; k < t; k++)); do chain+="${chain:+,}${addr[h$((s + k))]}:7200"; done
        chain="PSTRAIN_CHAIN=$chain"
      fi
      # trainer 0 first: its stdout is the report
      for ((i = 0; i < t; i++)); do
        procs+="h$((s + i))|$out/logs/$tag.t$i.out|$env_common $chain PSTRAIN_PSERVERS=$list PSTRAIN_TRAINERS=$t PSTRAIN_TRAINER_ID=$i PSTRAIN_METRICS=$out/logs/$tag.t$i.metrics $build/bin/trainer --model synthetic --params $params --steps $((warmup + steps)) --optimizer sgd --lr 0.01 --precision $prec --progress none"$'\n'
      done
      for ((k = 0; k < s; k++)); do
        procs+="h$k|$out/logs/$tag.s$k.out|$env_common PSTRAIN_PORT=$port $build/bin/pserver"$'\n'
      done
      ;;
    torch_ddp)
      for ((i = 0; i < t; i++)); do
        procs+="h$i|$out/logs/$tag.t$i.out|$env_common $BENCH_PY $BENCH_PEERS/torch_ddp.py --params $params --world $t --rank $i --master ${addr[h0]}:29500 --ifname eth0 --steps $steps --warmup $warmup --timeout $to"$'\n'
      done
      ;;
    torch_rpc_ps)
      for ((i = 0; i <= t; i++)); do
        procs+="h$i|$out/logs/$tag.t$i.out|$env_common $BENCH_PY $BENCH_PEERS/torch_rpc_ps.py --params $params --trainers $t --rank $i --master ${addr[h0]}:29500 --ifname eth0 --transport tcp --steps $steps --warmup $warmup"$'\n'
      done
      ;;
  esac
  run_procs "$tag" "$to"
}

# report SYSTEM T S PREC PREDICTION_JSON TAG...: one JSON line for the cell (runs' median)
report() {
  "$BENCH_PY" - "$BENCH_DIR" "$out" "$link" "$link_bps" "$iperf_bps" "$params" "$steps" "$warmup" "$@" <<'PY'
import json, statistics, sys
sys.path.insert(0, sys.argv.pop(1))
import timed_steps
out, link, link_bps, iperf, params, steps, warmup = sys.argv[1:8]
sysname, t, s, prec, pred = sys.argv[8:13]
tags = sys.argv[13:]
link_bps, params, steps, t, s = float(link_bps), int(params), int(steps), int(t), int(s)
warmup = int(warmup)
iperf = None if iperf == "null" else float(iperf)
pred = json.loads(pred)
cpu = []
for line in open(out + "/logs/cpu.txt"):
    f = line.split()
    if len(f) == 3:
        cpu.append((float(f[0]), int(f[1]), int(f[2])))

def cpu_util(t0, t1):
    """Busy fraction of all cores between t0 and t1, from the samples nearest inside."""
    inside = [c for c in cpu if t0 <= c[0] <= t1]
    if len(inside) < 2:
        return None
    a, b = inside[0], inside[-1]
    return (b[1] - a[1]) / (b[2] - a[2]) if b[2] > a[2] else None

def result(tag):
    reporter = "%s/logs/%s.t0.out" % (out, tag)
    try:
        d = timed_steps.summary(reporter)
        if sysname.startswith("pstrain"):  # the peers' untimed steps: timed_steps.py
            d = timed_steps.timed(d, "%s/logs/%s.t0.metrics" % (out, tag), warmup, steps)
    except (OSError, ValueError, KeyError) as e:
        return None, str(e)
    return d, None

ok, errors, cpus = [], [], []
for tag in tags:
    d, err = result(tag)
    if d is None:
        errors.append("%s: %s" % (tag, err))
        continue
    ok.append(d)
    t0, t1 = [float(x) for x in open("%s/logs/%s.time" % (out, tag)).read().split()[:2]]
    # the timed steps: the last STEPS x median ms before the processes ended
    span = max(1.0, steps * d["step_ms_median"] / 1e3)
    u = cpu_util(max(t0, t1 - span), t1)
    if u is not None:
        cpus.append(u)
line = {"system": sysname, "trainers": t, "pservers": s, "link": link, "link_bps": link_bps,
        "precision": prec, "params": params, "steps": steps, "runs": len(ok)}
if not ok:
    line["error"] = "; ".join(errors)
    print(json.dumps(line))
    sys.exit(0)
step = statistics.median(d["step_ms_median"] for d in ok)
busiest = pred["busiest_link_bytes"]
line.update({
    "step_ms_median": round(step, 3),
    "step_ms_runs": [d["step_ms_median"] for d in ok],
    "predicted_ms": round(pred["predicted_ms"], 3),
    "measured_over_predicted": round(step / pred["predicted_ms"], 3),
    "bottleneck": pred["bottleneck"],
    "busiest_link_bytes": busiest,
    "bottleneck_util": round(busiest / (link_bps / 8 * step / 1e3), 4),
    "bottleneck_util_iperf3": round(busiest / (iperf / 8 * step / 1e3), 4) if iperf else None,
    "cpu_util": round(statistics.median(cpus), 3) if cpus else None,
    "predicted": {k: v for k, v in pred.items()
                  if k not in ("system", "predicted_ms", "busiest_link_bytes", "bottleneck")},
})
if sysname == "torch_ddp" and t == 1:
    line["degenerate"] = "world 1: no all-reduce traffic, the step is compute only"
if sysname == "torch_ddp":
    line["pservers"] = 0
if errors:
    line["failed_runs"] = len(errors)
    line["errors"] = errors
print(json.dumps(line))
PY
}

# stderr tail of a failed run
show_failure() {
  local tag=$1 f
  echo "bench: $tag failed; stderr tails:" >&2
  for f in "$out/logs/$tag".p*.err; do
    [ -s "$f" ] || continue
    echo "  -- $(basename "$f")" >&2
    tail -n 6 "$f" | sed 's/^/  | /' >&2
  done
}

# ---- the cells
first_s=${pservers_list%% *}
for t in $trainers_list; do
  for s in $pservers_list; do
    for prec in $precisions; do
      cell_systems=()
      for sys in $systems; do
        case $sys in
          pstrain) cell_systems+=(pstrain) ;;
          pstrain_chain) [ "$t" -ge 2 ] && cell_systems+=(pstrain_chain) ;;
          torch_ddp) [ "$prec" = fp32 ] && [ "$s" = "$first_s" ] && cell_systems+=(torch_ddp) ;;
          torch_rpc_ps) [ "$prec" = fp32 ] && [ "$s" = 1 ] && cell_systems+=(torch_rpc_ps) ;;
        esac
      done
      [ "${#cell_systems[@]}" -gt 0 ] || continue
      declare -A pred=() tags=() tos=()
      for sys in "${cell_systems[@]}"; do
        pred[$sys]=$(predict "$sys" "$t" "$s" "$prec")
        tos[$sys]=${TIMEOUT:-$("$BENCH_PY" -c '
import json, sys
p = json.loads(sys.argv[1])["predicted_ms"]
print(int(max(120, 60 + 8 * p * (int(sys.argv[2]) + 5) / 1e3)))' "${pred[$sys]}" "$steps")}
        tags[$sys]=""
      done
      for ((run = 1; run <= runs; run++)); do
        for sys in "${cell_systems[@]}"; do
          tag="$sys-T$t-S$s-$prec-r$run"
          one_run "$sys" "$t" "$s" "$prec" "$run" "${tos[$sys]}" || show_failure "$tag"
          tags[$sys]+=" $tag"
        done
      done
      for sys in "${cell_systems[@]}"; do
        # shellcheck disable=SC2086 # the tags are words
        report "$sys" "$t" "$s" "$prec" "${pred[$sys]}" ${tags[$sys]} | tee -a "$results"
      done
      unset pred tags tos
    done
  done
done

# ---- the table and the plot
"$BENCH_PY" - "$results" <<'PY' | tee "$out/table.md"
import json, sys
rows = []
head = None
for line in open(sys.argv[1]):
    try:
        d = json.loads(line)
    except ValueError:
        continue
    if d.get("bench"):
        head = d
    elif "system" in d:
        rows.append(d)
rows.sort(key=lambda d: (d["system"], d["pservers"], d["precision"], d["trainers"]))
f = lambda v, fmt: "-" if v is None else fmt % v
print()
print("Measured against predicted: %s links (iperf3 %s; %s), %s parameters, %s steps, "
      "median of %s runs" % (head["link"], f(head["iperf3_bps"] and head["iperf3_bps"] / 1e6,
                                             "%.0f Mbit/s"),
                             "uploads shared per peer" if head.get("fair") else "one FIFO a link",
                             head["params"], head["steps"], head["runs"]))
print()
print("| system | S | wire | T | step ms | predicted ms | meas/pred | busiest link util "
      "| CPU util (2 cores) |")
print("|---|---|---|---|---|---|---|---|---|")
for d in rows:
    if "error" in d:
        print("| %s | %d | %s | %d | failed | | | | |" % (d["system"], d["pservers"],
                                                      d["precision"], d["trainers"]))
        continue
    print("| %s | %d | %s | %d | %.1f | %.1f | %.2f | %.2f | %s |" % (
        d["system"], d["pservers"], d["precision"], d["trainers"], d["step_ms_median"],
        d["predicted_ms"], d["measured_over_predicted"], d["bottleneck_util"],
        f(d.get("cpu_util"), "%.2f")))
PY
if "$root/scripts/plot" scaling "$results" -o "$out/scaling.png" 2>"$out/logs/plot.err"; then
  echo "plot: $out/scaling.png"
else
  echo "plot: failed ($(tail -n 1 "$out/logs/plot.err"))"
fi
echo "results: $results"
