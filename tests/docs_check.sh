#!/usr/bin/env bash
# docs_check.sh BUILD_DIR — docs/configuration.md is what the option table says: the file
# must equal `trainer --config-reference` (and pserver's, the same table). Prints the
# difference and how to mend it, and fails, when they disagree.
set -u
if [ $# -ne 1 ] || [ ! -x "$1/bin/trainer" ]; then
  echo "usage: $0 BUILD_DIR   (with bin/trainer and bin/pserver built)" >&2
  exit 2
fi
root=$(cd "$(dirname "$0")/.." && pwd)
bad=0
for prog in trainer pserver; do
  if ! diff -u "$root/docs/configuration.md" <("$1/bin/$prog" --config-reference) \
      > /tmp/docs_check.$$ 2>&1; then
    cat /tmp/docs_check.$$
    echo "docs_check: docs/configuration.md differs from '$prog --config-reference'" \
         "(common/config.c's option table): run make docs"
    bad=1
  fi
done
rm -f /tmp/docs_check.$$
[ "$bad" -eq 0 ] && echo "docs_check: docs/configuration.md matches the option table"
exit "$bad"
