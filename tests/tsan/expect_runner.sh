#!/usr/bin/env bash
# expect_runner.sh RUNNER_SELFTEST — the TSan build's test runner counts every test, enforces
# a test's .timeout, reports skips as skipped (tests/tsan/runner_selftest.c), runs only what
# --filter selects and refuses a filter that selects nothing.
set -u
fail=0
expect() { # WANT_RC WANT_LINE ARGS...: the runner's exit status and a line of its output
  local want_rc=$1 want=$2 out rc
  shift 2
  out=$("$RUNNER" "$@" 2>&1)
  rc=$?
  if [ $rc -ne "$want_rc" ] || ! grep -qF -- "$want" <<<"$out"; then
    echo "expect_runner: $* : want exit $want_rc and '$want'; got exit $rc:"
    tail -5 <<<"$out"
    fail=1
  else
    echo "expect_runner: ${*:-(all)}: $want"
  fi
}
RUNNER=$1
expect 1 "602 tests: 600 passed, 1 failed, 1 skipped"
expect 1 "2 tests: 0 passed, 1 failed, 1 skipped (600 left out by --filter)" --filter 'timing/*'
expect 0 "3 tests: 3 passed, 0 failed, 0 skipped (599 left out by --filter)" \
  --filter 'many/t100' --filter 'many/t101' --filter many/t102
expect 2 "--filter 'nosuch/*' matches no test" --filter 'nosuch/*'
expect 2 "unknown argument '--jobs'" --jobs 2
exit $fail
