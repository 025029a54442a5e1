#!/usr/bin/env bash
# gpu_check.sh — run from a bundle made by scripts/gpu_bundle.sh (as BUNDLE/run.sh) on a
# machine with an NVIDIA GPU and the CUDA 13 runtime, cuBLAS and NCCL: make test-gpu's
# suites, the bf16 GEMMs on the host CPU, then short training runs on cuda:0 beside the same
# runs on the machine's CPU.
# Logs go to $OUT (default /tmp/gpu-check). Exit status: the number of failed suites.
set -u
D=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/gpu-check}
mkdir -p "$OUT" "$D/lib"
cd "$D" || exit 1
tar xJf libs.tar.xz -C lib && xz -dkf data/kjv.txt.xz || exit 1
dirs=""
for n in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libnccl.so.2; do
  p=$(find /usr/local/cuda* /usr/lib/x86_64-linux-gnu /opt -name "$n" 2>/dev/null | head -1)
  echo "$n -> ${p:-MISSING}"
  [ -n "$p" ] && dirs="$dirs:$(dirname "$p")"
done
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
export LD_LIBRARY_PATH=$D/lib$dirs
ldd bin/trainer tests/test_ops | grep "not found"
failed=0
for t in test_cuda_nogpu test_device test_ops test_seq_ops test_collectives; do
  timeout 240 "tests/$t" -j4 >"$OUT/$t.log" 2>&1 || failed=$((failed + 1))
  echo "== $t: $(tail -1 "$OUT/$t.log")"
done
# bf16 GEMMs on the host CPU (these machines' Xeons have AVX512_BF16 and AMX): the products
# and the executor's schedules with oneDNN's kernel (test_exec reads the data where the
# development machines keep it: copied there when missing)
mkdir -p /usr/share/datasets/fashion-mnist /usr/local/share/pstrain 2>/dev/null &&
  cp -n data/fashion-mnist/* /usr/share/datasets/fashion-mnist/ &&
  cp -n data/kjv.txt /usr/local/share/pstrain/kjv.txt
timeout 240 tests/test_gemm_bf16 --verbose >"$OUT/test_gemm_bf16.log" 2>&1 || failed=$((failed + 1))
echo "== test_gemm_bf16: $(grep -m1 "bf16 GEMMs" "$OUT/test_gemm_bf16.log"); $(tail -1 "$OUT/test_gemm_bf16.log")"
timeout 240 tests/test_exec --filter 'exec/bf16*' >"$OUT/test_exec_bf16.log" 2>&1 || failed=$((failed + 1))
echo "== test_exec bf16: $(tail -1 "$OUT/test_exec_bf16.log")"
grep -q "parity runs on" "$OUT/test_ops.log" ||
  { echo "gpu_check: no GPU was used (test_ops skipped its CUDA parity)"; failed=$((failed + 1)); }
M="bin/trainer --model mlp --hidden 1024,1024 --dataset fashion-mnist --data data/fashion-mnist
   --epochs 2 --batch 128 --optimizer momentum --lr 0.05 --momentum 0.9 --seed 0 --precision fp32"
G="bin/trainer --model gpt --dataset text --data data/kjv.txt --layers 4 --heads 4 --embd 128
   --ctx 128 --batch 16 --optimizer adamw --lr 1e-3 --beta2 0.99 --weight-decay 0 --seed 0"
run() { # label, devices, command...
  local label=$1 dev=$2
  shift 2
  echo "== $label ($dev)"
  PSTRAIN_DEVICES=$dev timeout 150 "$@" 2>&1 | tail -1 | tee -a "$OUT/train.log"
}
run "MLP fp32" cuda:0 $M
run "MLP fp32" cpu:1 $M
run "MLP bf16" cuda:0 $M --precision bf16
run "GPT 300 steps" cuda:0 $G --steps 300 --sample 0
run "GPT 300 steps" cpu:1 $G --steps 300 --sample 0
run "MLP, 2 pservers x 2 trainers" cuda:0 bin/pslaunch --pservers 2 --trainers 2 -- $M --epochs 1
run "GPT, 1 pserver x 2 trainers" cuda:0 bin/pslaunch --pservers 1 --trainers 2 -- $G --steps 100 --sample 0
exit $failed
