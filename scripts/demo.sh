#!/usr/bin/env bash
# make demo: a local cluster — 2 pservers and 2 trainers on 127.0.0.1 — trains the MLP
# 784-1024-1024-10 on Fashion-MNIST in sync mode and prints trainer 0's summary.
# usage: scripts/demo.sh [BUILD_DIR=build]; DEMO_EPOCHS (default 2) sets the length.
set -euo pipefail
build=${1:-build}
epochs=${DEMO_EPOCHS:-2}
echo "pstrain demo: 2 pservers + 2 trainers on 127.0.0.1, Fashion-MNIST, $epochs epoch(s), sync mode" >&2
exec "$build/bin/pslaunch" --pservers 2 --trainers 2 -- \
  "$build/bin/trainer" --model mlp --hidden 1024,1024 --dataset fashion-mnist \
  --epochs "$epochs" --batch 128 --optimizer momentum --lr 0.05 --momentum 0.9 --seed 0 \
  --progress lines
