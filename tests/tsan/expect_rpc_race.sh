#!/usr/bin/env bash
# expect_rpc_race.sh — proves the TSan suite still sees races in OUR code across a gRPC
# call, with gRPC's libraries suppressed (tests/tsan/grpc.supp) and the completion queue's
# ordering annotated (rpc/tsan.h); see planted_rpc_race.c.
# usage: tests/tsan/expect_rpc_race.sh PLANTED_RPC_RACE_BINARY GRPC_SUPP
# The planted race must be reported (exit 66, a "data race" warning naming planted_read);
# the clean variant must run silent. Ends with "N passed, N failed".
set -u
bin=$1
supp=$2
pass=0; fail=0
export TSAN_OPTIONS="exitcode=66 halt_on_error=0 suppressions=$supp"
out=$("$bin" rpc 2>&1); rc=$?
if [ "$rc" = 66 ] && grep -q "WARNING: ThreadSanitizer: data race" <<<"$out" &&
   grep -q "planted_read" <<<"$out"; then
  pass=$((pass + 1)); echo "[PASS] a write after the call started, read in its done callback: reported"
else
  fail=$((fail + 1)); echo "[FAIL] expected a TSan data race report (exit 66), got exit $rc:"; echo "$out"
fi
out=$("$bin" clean 2>&1); rc=$?
if [ "$rc" = 0 ] && ! grep -q "ThreadSanitizer" <<<"$out"; then
  pass=$((pass + 1)); echo "[PASS] the write before the call: no report"
else
  fail=$((fail + 1)); echo "[FAIL] expected a clean run, got exit $rc:"; echo "$out"
fi
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
