#!/usr/bin/env bash
# make demo-ctr: the click model (--model dlrm) trained alone for one epoch on a click file
# with a planted truth, written by ctr-synth (300,000 rows, 26 sparse fields with
# vocabularies of 10 to 10^6, 13 dense features), and its summary line on stdout: test_auc
# against the file's Bayes-optimal AUC is auc_gap. Everything else goes to stderr.
# usage: scripts/demo_ctr.sh [BUILD_DIR=build]; DEMO_ROWS (default 300000) and DEMO_SEED
# (default 1) pick the file. It is written once into BUILD_DIR/data/ (not next to kjv.txt
# in /usr/local/share/pstrain: it is made from a build, needs no root, and make clean
# removes it), named by its rows and seed, and kept for the next run.
set -euo pipefail
build=${1:-build}
rows=${DEMO_ROWS:-300000}
seed=${DEMO_SEED:-1}
data=$build/data/ctr-synth-${rows}rows-seed${seed}.bin
if [ ! -s "$data" ]; then
  mkdir -p "$build/data"
  echo "pstrain demo-ctr: writing $data with ctr-synth ($rows rows, seed $seed)" >&2
  # under another name until complete: an interrupted run leaves no file to reuse
  "$build/bin/ctr-synth" --rows "$rows" --seed "$seed" --out "$data.part" >&2
  mv "$data.part" "$data"
fi
echo "pstrain demo-ctr: the click model alone, 1 epoch on $data" >&2
exec "$build/bin/trainer" --model dlrm --dataset ctr --data "$data" --epochs 1 --progress lines
