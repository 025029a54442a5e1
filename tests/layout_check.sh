#!/usr/bin/env bash
# layout_check.sh — the dependency arrows of common/ point one way (DESIGN.md, "Layers of
# the code"): the base (common/*.{c,h}) includes nothing from a subfolder; runtime/ and
# data/ include only the base and themselves; nn/ (and its layers/ and models/) may include
# the base and runtime/; a
# backend folder (runtime/cuda, nn/cuda) may include its parent, never the other way round.
# Prints every include that points the wrong way, one line each, and fails if any does.
# usage: tests/layout_check.sh [REPO_ROOT]
set -u
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$root" || exit 2
bad=0
# check FOLDER_GLOB ALLOWED_REGEX: every "common/..." include of those files must match
check() {
  local files=$1 allowed=$2 f line inc
  for f in $files; do
    [ -f "$f" ] || continue
    while IFS= read -r line; do
      inc=${line#*\"}; inc=${inc%%\"*}
      case "$inc" in common/*) ;; *) continue ;; esac
      if ! [[ "$inc" =~ $allowed ]]; then
        echo "layout: $f includes $inc (allowed here: $allowed)"; bad=1
      fi
    done < <(grep -h '^#include "' "$f")
  done
}
base='^common/[a-z0-9_]+\.h$'
check "common/*.c common/*.h" "$base"
check "common/runtime/*.c common/runtime/*.h" "$base|^common/runtime/[a-z0-9_]+\.h$"
check "common/runtime/cuda/*" "$base|^common/runtime/"
check "common/data/*" "$base|^common/data/"
check "common/nn/*.c common/nn/*.h" "$base|^common/runtime/[a-z0-9_]+\.h$|^common/nn/[a-z0-9_]+\.h$"
check "common/nn/layers/* common/nn/models/*" "$base|^common/runtime/[a-z0-9_]+\.h$|^common/nn/"
check "common/nn/cuda/*" "$base|^common/runtime/|^common/nn/"
# The executor runs models through the model interface: trainer/ names no layer class
# (a class tells what the executor needs through its fields: rows_updatable, cost, ...).
while IFS= read -r hit; do
  echo "layout: $hit names a layer class (use the class's fields instead)"; bad=1
done < <(grep -nE '&pst_layer_[a-z_]+|pst_layer_(linear|embedding|transformer_block|lm_head|softmax_xent|fixed_grad)\b' trainer/*.c trainer/*.h 2>/dev/null)
[ "$bad" = 0 ] && echo "layout: every include in common/ points the right way; trainer/ names no layer class"
exit "$bad"
