#!/usr/bin/env bash
# The bits of a refactor: the final param_hash of each job a change to the executor, the
# links or the pserver must leave alone (issue 27's list), short runs on the real programs.
#   mlp_alone     MLP trained alone, one CPU device
#   mlp_cpu4      MLP trained alone on PSTRAIN_DEVICES=cpu:4 (4 devices, reduce + broadcast)
#   mlp_2x2       MLP, 2 pservers + 2 trainers (pslaunch), sync
#   gpt_alone     GPT (2 layers) trained alone
#   gpt_2x2       GPT, 2 pservers + 2 trainers
#   mlp_bf16_2x2  MLP in bf16, 2 pservers + 2 trainers
#   gpt_pipe2     GPT (4 layers) alone, --pipeline 2 on cpu:2, 4 micro-batches
#   gpt_pipe4     GPT (6 layers) alone, --pipeline 4 on cpu:4, 8 micro-batches
#   gpt_pipe2i    GPT (4 layers) alone, --pipeline 2 on cpu:2, interleaved (2 virtual stages)
#   synth_*       the synthetic model (a fixed gradient): alone in fp32, bf16 and fp16, on
#                 cpu:2, with 3 micro-batches; 2 pservers + 2 trainers in fp32 and bf16 with
#                 the payloads in the calls (PSTRAIN_SHM=off) and through shared memory
#   mlp_<opt>_wd  MLP alone with Adam, Adagrad, SGD and momentum, weight decay 0.01 (the
#                 optimizer's other loops)
# Prints "NAME HASH" per job (HASH "failed" when the job did not end well). Compare two
# builds with: diff <(bench/hashes.sh /tmp/before/build) <(bench/hashes.sh build)
# Not a benchmark: it times nothing. Threads are fixed (--threads 1 per device) so the bits
# do not depend on the machine's core count.
# usage: bench/hashes.sh [BUILD_DIR=build] [STEPS=30]
set -uo pipefail
build=${1:-build}
steps=${2:-30}
for p in trainer pserver pslaunch; do
  [ -x "$build/bin/$p" ] || { echo "hashes: $build/bin/$p is not built (make build)" >&2; exit 2; }
done
hash_of() { # the param_hash of the trainer's summary line (stdin), or "failed"
  local h
  h=$(tail -n 1 | sed -n 's/.*"param_hash":"\([0-9a-f]*\)".*/\1/p')
  echo "${h:-failed}"
}
common=(--steps "$steps" --seed 0 --threads 1 --progress none --log-level warn --metrics "")
mlp=(--model mlp --hidden 256,128 --dataset fashion-mnist --batch 64 --optimizer momentum
     --lr 0.05 --momentum 0.9)
gpt=(--model gpt --dataset kjv --layers 2 --heads 2 --embd 32 --ctx 32 --batch 8 --sample 0
     --val-windows 4)
synth=(--model synthetic --params 300000 --optimizer momentum --lr 0.01)
gpt4=(--model gpt --dataset kjv --layers 4 --heads 2 --embd 32 --ctx 32 --batch 8 --sample 0
      --val-windows 4)
alone() { "$build/bin/trainer" "${common[@]}" "$@" 2>/dev/null | hash_of; }
cluster() {
  "$build/bin/pslaunch" --pservers 2 --trainers 2 --timeout 300 -- \
    "$build/bin/trainer" "${common[@]}" "$@" 2>/dev/null | hash_of
}
echo "mlp_alone $(alone "${mlp[@]}")"
echo "mlp_cpu4 $(PSTRAIN_DEVICES=cpu:4 alone "${mlp[@]}")"
echo "mlp_2x2 $(cluster "${mlp[@]}")"
echo "gpt_alone $(alone "${gpt[@]}")"
echo "gpt_2x2 $(cluster "${gpt[@]}")"
echo "mlp_bf16_2x2 $(cluster "${mlp[@]}" --precision bf16)"
echo "gpt_pipe2 $(PSTRAIN_DEVICES=cpu:2 alone "${gpt4[@]}" --pipeline 2 --micro-batches 4)"
echo "gpt_pipe4 $(PSTRAIN_DEVICES=cpu:4 alone "${gpt4[@]}" --layers 6 --pipeline 4 --micro-batches 8)"
echo "gpt_pipe2i $(PSTRAIN_DEVICES=cpu:2 alone "${gpt4[@]}" --pipeline 2 --schedule interleaved \
  --virtual-stages 2 --micro-batches 4)"
for p in fp32 bf16 fp16; do echo "synth_$p $(alone "${synth[@]}" --precision "$p")"; done
echo "synth_cpu2 $(PSTRAIN_DEVICES=cpu:2 alone "${synth[@]}")"
echo "synth_acc3 $(alone "${synth[@]}" --acc-steps 3)"
for shm in off auto; do
  for p in fp32 bf16; do
    echo "synth_2x2_${p}_shm_$shm $(PSTRAIN_SHM=$shm cluster "${synth[@]}" --precision "$p")"
  done
done
for o in adam adagrad sgd momentum; do
  echo "mlp_${o}_wd $(alone "${mlp[@]}" --optimizer "$o" --lr 0.01 --weight-decay 0.01)"
done
