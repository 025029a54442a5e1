#!/usr/bin/env bash
# Measurement (issue 30 item 4): a pipeline in fp32, bf16 and fp16 on a 2 x 2 cluster.
# pslaunch starts 2 pservers and 2 trainers on this host; each trainer runs a GPT of
# LAYERS blocks (embd 128, 4 heads, context 64, batch 16, AdamW lr 0.003) on KJV as a
# pipeline of 2 stages (cpu:2, --micro-batches 4, 1F1B) for STEPS steps. Prints one JSON
# line per precision: val_loss and train_loss (trainer 0's summary), the step's median,
# each pserver's casts per optimizer step against the parameters it owns (its closing
# "casts:" line), fp16's skipped steps; then each low precision's val_loss against fp32's.
# No peer runs a pipeline inside a trainer. Not a test: it reports, it never gates.
#
# usage: bench/pipeline_precision.sh [BUILD_DIR=build] [STEPS=500] [LAYERS=4]
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"
build=${1:-build}; steps=${2:-500}; layers=${3:-4}
kjv=/usr/local/share/pstrain/kjv.txt
bench_need_built "$build" trainer
bench_need_built "$build" pslaunch
bench_need_python
[ -s "$kjv" ] || bench_die "$kjv is missing: scripts/deps.sh writes it from Debian's bible-kjv"
bench_blas_core "$build"
bench_header pipeline_precision "\"steps\":$steps,\"layers\":$layers,\"embd\":128,\"heads\":4,\"ctx\":64,\"batch\":16,\"pipeline\":2,\"micro_batches\":4,\"pservers\":2,\"trainers\":2"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

for prec in fp32 bf16 fp16; do
  # the pservers log at info (their casts line), the trainers at warn
  PSTRAIN_LOG_LEVEL=info PSTRAIN_DEVICES=cpu:2 "$build/bin/pslaunch" --pservers 2 \
    --trainers 2 -- "$build/bin/trainer" --model gpt --dataset kjv --layers "$layers" \
    --heads 4 --embd 128 --ctx 64 --batch 16 --steps "$steps" --seed 5 --lr 0.003 \
    --pipeline 2 --micro-batches 4 --precision "$prec" --threads 1 --progress none \
    --log-level warn --metrics "" --sample 0 >"$tmp/$prec.log" 2>&1 ||
    { tail -n 20 "$tmp/$prec.log" >&2; bench_die "the $prec run failed"; }
  "$BENCH_PY" - "$prec" "$tmp/$prec.log" <<'PY' | tee -a "$tmp/all.json"
import json, re, sys
prec, path = sys.argv[1], sys.argv[2]
text = open(path).read()
summary = next(json.loads(l) for l in text.splitlines() if l.startswith('{"event":"summary"'))
casts = [{"per_step": int(m.group(1)), "owned": int(m.group(2))} for m in
         re.finditer(r"casts: \d+ elements to \S+ in \d+ optimizer steps \((\d+) per step\), "
                      r"(\d+) parameters owned", text)]
print(json.dumps({"part": "precision", "precision": prec, "val_loss": summary["val_loss"],
                  "train_loss": summary["train_loss"],
                  "step_ms_median": summary["step_ms_median"],
                  "skipped_steps": summary.get("skipped_steps", 0),
                  "param_bytes_per_device": summary["param_bytes_per_device"],
                  "pserver_casts": casts}))
PY
done
"$BENCH_PY" - "$tmp/all.json" <<'PY'
import json, sys
runs = {r["precision"]: r for r in map(json.loads, open(sys.argv[1]))}
base = runs["fp32"]["val_loss"]
for p in ("bf16", "fp16"):
    r = runs[p]
    print(json.dumps({"part": "versus_fp32", "precision": p, "val_loss": r["val_loss"],
                      "fp32_val_loss": base,
                      "relative_difference": round((r["val_loss"] - base) / base, 5),
                      "casts_equal_owned": all(c["per_step"] == c["owned"] and c["owned"] > 0
                                               for c in r["pserver_casts"])
                                           and len(r["pserver_casts"]) == 2}))
PY
