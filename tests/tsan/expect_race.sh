#!/usr/bin/env bash
# expect_race.sh — proves the ThreadSanitizer suite still sees races in OUR code while
# OpenBLAS runs single-threaded in that build (see planted_race.c).
# usage: tests/tsan/expect_race.sh PLANTED_RACE_BINARY
# Each planted race must be reported (TSan's exit status 66, a "data race" warning whose
# stack names our function); the clean variant, the same program with an event between
# the streams, must run silent. Ends with "N passed, N failed".
set -u
bin=$1
pass=0; fail=0
export OPENBLAS_NUM_THREADS=1
export TSAN_OPTIONS="exitcode=66 halt_on_error=0 ${TSAN_OPTIONS:-}"
check() { # name mode want_race
  local out rc
  out=$("$bin" "$2" 2>&1); rc=$?
  if [ "$3" = 1 ]; then
    if [ "$rc" = 66 ] && grep -q "WARNING: ThreadSanitizer: data race" <<<"$out" &&
       grep -q "planted_read" <<<"$out"; then
      pass=$((pass + 1)); echo "[PASS] $1: TSan reported the planted race"
    else
      fail=$((fail + 1)); echo "[FAIL] $1: expected a TSan data race report (exit 66), got exit $rc:"; echo "$out"
    fi
  else
    if [ "$rc" = 0 ] && ! grep -q "ThreadSanitizer" <<<"$out"; then
      pass=$((pass + 1)); echo "[PASS] $1: no report with the event in place"
    else
      fail=$((fail + 1)); echo "[FAIL] $1: expected a clean run, got exit $rc:"; echo "$out"
    fi
  fi
}
check "race between two streams' host functions" host 1
check "race between a GEMM op and a host function" gemm 1
check "the same streams ordered by an event" clean 0
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
