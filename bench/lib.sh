# bench/lib.sh — helpers sourced by every bench script (not run on its own):
#   - dependency checks that say in ONE line what is missing and how to get it, exit 2;
#   - bench_blas_core: the OpenBLAS kernel family pstrain and its peer both run under;
#   - bench_header: the bench's first JSON line (its own fields + machine and BLAS settings);
#   - bench_gemm_build: builds bench/gemm.c (the standalone GEMM benchmark) when needed;
#   - bench_precisions: the precisions this CPU can measure (bf16 only with AVX512_BF16).
#
# DESIGN: every check runs before the first measurement, so a bench either fails in one
# line at once or runs to the end. Anything Python runs under /usr/bin/python3: it is
# Debian's interpreter, the one with torch; a pyenv python3 earlier on PATH has none.
#
# usage (from a script in bench/):  . "$(dirname "$0")/lib.sh"

# shellcheck shell=bash
BENCH_PY=/usr/bin/python3
BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BENCH_PEERS=$(cd "$BENCH_DIR/../.." && pwd)/shared/peers

# bench_precisions "LIST": sets BENCH_PRECISIONS to LIST without bf16 where the CPU lacks
# AVX512_BF16 (a bf16 trainer's GEMMs then run in fp32: docs/precision.md), saying so in
# one JSON line.
bench_precisions() {
  BENCH_PRECISIONS=$1
  if [[ " $1 " == *" bf16 "* ]] && ! grep -qw avx512_bf16 /proc/cpuinfo; then
    echo '{"bf16":"not measured: this CPU lacks AVX512_BF16 (/proc/cpuinfo), so it has no bf16 arithmetic; fp32 only"}'
    BENCH_PRECISIONS=$(echo "$1" | tr ' ' '\n' | { grep -vx bf16 || true; } | xargs)
  fi
}

# bench_die MESSAGE...: the one line, on stderr, and exit 2 (a dependency is missing).
bench_die() {
  echo "bench: $*" >&2
  exit 2
}

# bench_need MESSAGE CMD [ARG...]: runs CMD quietly; when it fails, dies with MESSAGE.
# The check comes after the message so it can be any command with any arguments.
bench_need() {
  local msg=$1
  shift
  "$@" >/dev/null 2>&1 || bench_die "$msg"
}

# bench_need_cmd CMD HOW: CMD must be on PATH; HOW says how to get it.
bench_need_cmd() {
  command -v "$1" >/dev/null 2>&1 || bench_die "$1 not found: $2"
}

# bench_need_python: /usr/bin/python3 (headers, summaries and the peers use it).
bench_need_python() {
  [ -x "$BENCH_PY" ] || bench_die "$BENCH_PY not found: apt-get install python3"
}

# bench_need_torch: torch importable by /usr/bin/python3 (the PyTorch peers).
bench_need_torch() {
  bench_need_python
  bench_need "$BENCH_PY has no torch: apt-get install python3-torch" "$BENCH_PY" -c 'import torch'
}

# bench_need_built BUILD PROG...: each BUILD/bin/PROG built.
bench_need_built() {
  local build=$1 p
  shift
  for p in "$@"; do
    [ -x "$build/bin/$p" ] || bench_die "$build/bin/$p not built: make build BUILD=$build"
  done
}

# bench_need_peer FILE...: each ../shared/peers/FILE beside the repository; prints nothing.
bench_need_peer() {
  local f
  for f in "$@"; do
    [ -f "$BENCH_PEERS/$f" ] || bench_die "$BENCH_PEERS/$f not found (../shared/peers beside the repo)"
  done
}

# bench_need_iperf3: iperf3 and the peers' loopback script that drives it.
bench_need_iperf3() {
  bench_need_cmd iperf3 "apt-get install iperf3"
  [ -x "$BENCH_PEERS/iperf3_loopback.sh" ] ||
    bench_die "$BENCH_PEERS/iperf3_loopback.sh not found or not executable (../shared/peers beside the repo)"
}

# bench_need_tc WHY: tc, for link emulation (WHY names the setting that asked for it).
bench_need_tc() {
  bench_need_cmd tc "$1 needs it: apt-get install iproute2"
}

# bench_blas_core BUILD: exports the OpenBLAS kernel family for everything the bench starts
# afterwards (pstrain, its peer, the header's probe, bench_gemm), so all run the same GEMM
# kernels. OPENBLAS_CORETYPE is read when OpenBLAS loads, so this must come before any run.
#   BENCH_CORETYPE=keep   the environment's OPENBLAS_CORETYPE stays as it is (set or not);
#   BENCH_CORETYPE=NAME   OPENBLAS_CORETYPE=NAME (e.g. Haswell);
#   unset                 what `BUILD/bin/trainer --blas-core` prints: the best family for
#                         this CPU's features, or unset when OpenBLAS's own detection is best.
# Not inherited by default: these machines often set OPENBLAS_CORETYPE=Haswell, slower than
# the CPU's best, and a bench must not measure that unless told to.
bench_blas_core() {
  local build=$1 core
  case "${BENCH_CORETYPE:-}" in
    keep) ;;
    "")
      bench_need_built "$build" trainer
      core=$("$build/bin/trainer" --blas-core) || bench_die "$build/bin/trainer --blas-core failed"
      if [ -n "$core" ]; then export OPENBLAS_CORETYPE=$core; else unset OPENBLAS_CORETYPE; fi
      ;;
    *) export OPENBLAS_CORETYPE=$BENCH_CORETYPE ;;
  esac
}

# bench_header NAME [FIELDS]: prints the first JSON line: {"bench":NAME, FIELDS, then the
# machine and BLAS settings}. FIELDS is JSON object members without braces, e.g.
# '"runs":3,"batch":128'. "openblas_corename" is what OpenBLAS actually loads under the
# current environment (a ctypes probe), null when the probe fails. Dies when FIELDS is not
# valid JSON, so a bench never prints a header a reader cannot parse.
bench_header() {
  bench_need_python
  "$BENCH_PY" - "$1" "${2:-}" <<'PY' || bench_die "bench_header: fields are not valid JSON: ${2:-}"
import ctypes, datetime, json, os, sys
out = {"bench": sys.argv[1]}
try:
    out.update(json.loads("{" + sys.argv[2] + "}"))
except ValueError:
    sys.exit(1)  # the caller says so in one line
cpu = None
with open("/proc/cpuinfo") as f:
    for line in f:
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
try:
    lib = ctypes.CDLL("libopenblas.so.0")
    lib.openblas_get_corename.restype = ctypes.c_char_p
    corename = lib.openblas_get_corename().decode()
except (OSError, AttributeError):
    corename = None
env = lambda k: os.environ.get(k, "unset")
out.update({"cpu": cpu, "cores": os.cpu_count(),
            "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE", "auto"),
            "openblas_corename": corename,
            "openblas_num_threads": env("OPENBLAS_NUM_THREADS"),
            "omp_num_threads": env("OMP_NUM_THREADS"),
            "openblas_l2_size": env("OPENBLAS_L2_SIZE"),
            "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds")})
print(json.dumps(out, separators=(",", ":")))
PY
}

# bench_gemm_build BUILD: builds bench/gemm.c into BENCH_GEMM (default BUILD/bench_gemm)
# when it is missing or older than its sources (with the project's dtype.c for the bf16
# casts and rng.c for the operands), and prints its path. It dlopens OpenBLAS and BLIS side
# by side, so it links neither.
bench_gemm_build() {
  local bin=${BENCH_GEMM:-$1/bench_gemm}
  bench_need_cmd cc "apt-get install build-essential"
  local root=$BENCH_DIR/.. src
  local srcs=("$BENCH_DIR/gemm.c" "$root/common/dtype.c" "$root/common/rng.c")
  local stale=0
  [ -x "$bin" ] || stale=1
  for src in "${srcs[@]}"; do [ "$src" -nt "$bin" ] && stale=1; done
  if [ "$stale" = 1 ]; then
    mkdir -p "$(dirname "$bin")" || bench_die "cannot create $(dirname "$bin")"
    cc -std=c11 -O2 -Wall -Wextra -D_GNU_SOURCE -I"$root" -o "$bin" "${srcs[@]}" -ldl -lm >&2 ||
      bench_die "cannot build $bin from $BENCH_DIR/gemm.c"
  fi
  echo "$bin"
}
