#!/usr/bin/env bash
# Benchmark: OpenBLAS against Debian's BLIS (libblis4-pthread) on the trainer's GEMM shapes
# (MLP 784-1024-1024-10 and 784-4096-4096-10 at batch 128, and 2048^3), one process,
# alternating, same thread count; plus OpenBLAS's bf16 cblas_sbgemm when the library has it.
# Builds bench/gemm.c into BUILD/bench_gemm (or $BENCH_GEMM) when needed. Prints the header,
# then bench_gemm's JSON lines: libraries, sanity checks, one line per shape and library,
# and the GEMM time of one MLP step per library. Not a test: it reports, it never gates.
#
# usage: [BENCH_CORETYPE=keep|NAME] [BENCH_BLIS_ARCH=auto|native|NAME] \
#        bench/gemm.sh [BUILD_DIR=build] [THREADS=2] [REPS=20]
# OpenBLAS runs under the kernel family bench_blas_core picks (bench/lib.sh); BLIS under
# BENCH_BLIS_ARCH (bench_gemm --blis-arch; default auto: skx on an AVX-512 CPU, because
# BLIS 0.9.0 does not recognise newer CPUs and would fall back to its generic kernels).
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"
build=${1:-build}; threads=${2:-2}; reps=${3:-20}
blis_arch=${BENCH_BLIS_ARCH:-auto}
bench_blas_core "$build"
bin=$(bench_gemm_build "$build")
bench_header gemm "\"threads\":$threads,\"reps\":$reps,\"blis_arch\":\"$blis_arch\""
"$bin" --threads "$threads" --reps "$reps" --blis-arch "$blis_arch"
