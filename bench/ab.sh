#!/usr/bin/env bash
# Benchmark: one build against another on the synthetic sync step through the real
# programs (pslaunch, pserver, trainer), alternating A, B, A, B... RUNS times each, so that
# a change's cost is measured under the same machine state as what it changes. Same job as
# bench/ps_sync.sh (1 pserver, 2 trainers, 25M parameters, plain SGD) by default.
# Prints JSON lines: the header, every run (with cpu_s: the user + system seconds of all its
# processes, start-up included), then the medians and B's step and CPU over A's.
# Not a test: it reports, it never gates.
#
# JOB=mlp or JOB=gpt instead runs bench/mlp.sh's or bench/gpt.sh's pstrain job (trained
# alone; gpt on DEVICES, default cpu:2) for STEPS steps (PARAMS is then ignored): the same
# comparison for the compute path.
#
# usage: [JOB=synthetic|mlp|gpt] [PRECISION=fp32|bf16|fp16] [PSTRAIN_SHM=auto|off]
#        [TRAINERS=2] [PSERVERS=1] bench/ab.sh BUILD_A BUILD_B [RUNS=5] [PARAMS=25000000] [STEPS=20]
# e.g. the commit before a change against the working tree:
#   git worktree add /tmp/before HEAD~1 && make -C /tmp/before build
#   bench/ab.sh /tmp/before/build build 5
# A_FLAGS and B_FLAGS add trainer flags to one side (word-split), so one build compares
# two settings: A_FLAGS="--gemm openblas" B_FLAGS="--gemm onednn" JOB=gpt bench/ab.sh build build
# BENCH_CORETYPE=keep|NAME chooses the OpenBLAS kernel family (bench_blas_core in lib.sh;
# taken from BUILD_B's trainer, and used for both).
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"
[ $# -ge 2 ] || bench_die "usage: bench/ab.sh BUILD_A BUILD_B [RUNS=5] [PARAMS=25000000] [STEPS=20]"
a=$1; b=$2; runs=${3:-5}; params=${4:-25000000}; steps=${5:-20}
precision=${PRECISION:-fp32}; shm=${PSTRAIN_SHM:-auto}
trainers=${TRAINERS:-2}; pservers=${PSERVERS:-1}
job=${JOB:-synthetic}; devices=${DEVICES:-cpu:2}
case $job in synthetic|mlp|gpt) ;;
  *) bench_die "JOB=$job: expected synthetic, mlp or gpt" ;; esac
case $precision in fp32|bf16|fp16) ;;
  *) bench_die "PRECISION=$precision: expected fp32, bf16 or fp16" ;; esac
case $shm in auto|off) ;; *) bench_die "PSTRAIN_SHM=$shm: expected auto or off" ;; esac
bench_need_built "$a" pslaunch pserver trainer
bench_need_built "$b" pslaunch pserver trainer
bench_blas_core "$b"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
rev() { git -C "$1/.." rev-parse --short HEAD 2>/dev/null || echo unknown; }
read -r -a a_flags <<< "${A_FLAGS:-}"
read -r -a b_flags <<< "${B_FLAGS:-}"
bench_header ab "\"a_flags\":\"${A_FLAGS:-}\",\"b_flags\":\"${B_FLAGS:-}\",\"a\":\"$a\",\"a_commit\":\"$(rev "$a")\",\"b\":\"$b\",\"b_commit\":\"$(rev "$b")\",\"job\":\"$job\",\"precision\":\"$precision\",\"shm\":\"$shm\",\"params\":$params,\"trainers\":$trainers,\"pservers\":$pservers,\"steps\":$steps,\"runs\":$runs"
TIMEFORMAT='%U %S' # bash's time: user and system seconds of the run, its processes' too
for i in $(seq 1 "$runs"); do
  for side in a b; do
    build=$a; flags=("${a_flags[@]}")
    [ "$side" = b ] && build=$b && flags=("${b_flags[@]}")
    { time { case $job in
      synthetic)
        PSTRAIN_SHM=$shm "$build/bin/pslaunch" --pservers "$pservers" --trainers "$trainers" \
          --timeout 600 -- "$build/bin/trainer" --model synthetic --params "$params" \
          --steps "$steps" --optimizer sgd --lr 0.01 --precision "$precision" \
          --log-level warn "${flags[@]}" ;;
      mlp) # bench/mlp.sh's job
        "$build/bin/trainer" --model mlp --hidden 1024,1024 --dataset fashion-mnist \
          --steps "$steps" --batch 128 --optimizer momentum --lr 0.05 --momentum 0.9 \
          --seed 0 --threads 2 --precision "$precision" --progress none --metrics "" \
          "${flags[@]}" ;;
      gpt) # bench/gpt.sh's job
        PSTRAIN_DEVICES=$devices "$build/bin/trainer" --model gpt --dataset kjv --layers 4 \
          --heads 4 --embd 128 --ctx 128 --batch 16 --steps "$steps" --optimizer adamw \
          --lr 1e-3 --beta1 0.9 --beta2 0.99 --eps 1e-8 --weight-decay 0 --seed 0 \
          --threads 2 --val-windows 8 --sample 0 --precision "$precision" --progress none \
          --metrics "" "${flags[@]}" ;;
    esac 2>/dev/null | tail -n 1 > "$tmp/$side$i.json"; }; } 2> "$tmp/$side$i.cpu"
    read -r user sys < "$tmp/$side$i.cpu"
    cpu=$(awk -v u="$user" -v s="$sys" 'BEGIN { print u + s }')
    echo "$cpu" > "$tmp/$side$i.cpu" # the medians below read it
    echo "{\"run\":$i,\"side\":\"$side\",\"cpu_s\":$cpu,\"result\":$(cat "$tmp/$side$i.json")}"
  done
done
"$BENCH_PY" - "$tmp" "$runs" <<'PY'
import json, statistics, sys
d, n = sys.argv[1], int(sys.argv[2])
med = lambda s: statistics.median(json.load(open("%s/%s%d.json" % (d, s, i)))["step_ms_median"]
                                  for i in range(1, n + 1))
ma, mb = med("a"), med("b")
cpu = lambda s: statistics.median(float(open("%s/%s%d.cpu" % (d, s, i)).read())
                                  for i in range(1, n + 1))
ca, cb = cpu("a"), cpu("b")
print(json.dumps({"a_step_ms_median": ma, "b_step_ms_median": mb, "b_over_a": round(mb / ma, 4),
                  "a_cpu_s_median": round(ca, 3), "b_cpu_s_median": round(cb, 3),
                  "b_over_a_cpu": round(cb / ca, 4)}))
PY
