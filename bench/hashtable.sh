#!/usr/bin/env bash
# Measurement (issue 31): the sparse table's index (pserver/sparse_index.c) against
# Debian's uthash and genht, N distinct u64 keys, RUNS alternating runs, single thread
# (bench/hashtable.c says what each step times). No BLAS, no peer program: the two
# libraries are the peers. Not a test: it reports, it never gates.
# usage: bench/hashtable.sh [BUILD_DIR=build] [N=2000000] [RUNS=5]
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"
build=${1:-build}; n=${2:-2000000}; runs=${3:-5}
[ -x "$build/bin/bench_hashtable" ] ||
  bench_die "$build/bin/bench_hashtable is not built: apt-get install uthash-dev libgenht1-dev, then make build"
bench_need_python
bench_header hashtable "\"keys\":$n,\"runs\":$runs"
"$build/bin/bench_hashtable" "$n" "$runs"
