#!/usr/bin/env bash
# make bench: every benchmark in bench/, one after the other (each alternates pstrain and
# its peer or baseline in one run and prints ratios of medians). usage: bench/run.sh [BUILD]
set -euo pipefail
build=${1:-build}
here=$(cd "$(dirname "$0")" && pwd)
"$here/mlp.sh" "$build" 3
"$here/gpt.sh" "$build" 3
"$here/gemm.sh" "$build"
"$here/ps_sync.sh" "$build" 3
"$here/overlap.sh" "$build" 3
PRECISION=bf16 "$here/ps_sync.sh" "$build" 3
"$here/precision.sh" "$build" 1
# measurements without a peer (none of ours has these): the pipeline's memory and bubble,
# a pipeline in bf16 and fp16 against fp32 (about 4 min), how fast a departure ends a job,
# and recovery after two pserver kills (about 7 min)
"$here/pipeline.sh" "$build" 4 8
"$here/pipeline_precision.sh" "$build" 500
"$here/hashtable.sh" "$build" 2000000 5
"$here/dlrm.sh" "$build" 3
"$here/departure.sh" "$build" 3
"$here/recovery.sh" "$build" 5 3
"$here/metrics_cost.sh" "$build" 1 3
"$here/tls.sh" "$build" 3
