#!/usr/bin/env bash
# expect_runner.sh RUNNER_SELFTEST — the TSan build's test runner counts every test, enforces
# a test's .timeout and reports skips as skipped (tests/tsan/runner_selftest.c).
set -u
out=$("$1" 2>&1)
rc=$?
want="602 tests: 600 passed, 1 failed, 1 skipped"
if [ $rc -ne 1 ] || ! grep -q "^$want\$" <<<"$out"; then
  echo "expect_runner: want exit 1 and '$want'; got exit $rc:"
  tail -5 <<<"$out"
  exit 1
fi
echo "expect_runner: $want (the 1 s timeout was enforced)"
