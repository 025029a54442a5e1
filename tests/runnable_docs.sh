#!/usr/bin/env bash
# runnable_docs.sh BUILD_DIR SOURCE_DIR — every fenced sh block of README.md and
# docs/getting-started.md that is marked runnable runs, on loopback, and exits 0.
#
# The marker is an HTML comment on the line right before the fence; GitHub renders it as
# nothing:
#
#     <!-- runnable -->
#     ```sh
#     build/bin/trainer --epochs 5 ...
#     ```
#
# Unmarked blocks are not run (`make demo`, `make test`, commands for several hosts). A
# marker that is not directly followed by a ```sh (or ```bash) fence is an error, and so is
# finding no marked block at all: the check cannot pass by running nothing.
#
# Each block runs as written, with `bash -e -o pipefail`, stdin from /dev/null, under
# `timeout` ($RUNNABLE_DOCS_TIMEOUT seconds, 120 by default), in a fresh temporary
# directory that holds a symlink build -> BUILD_DIR and one to every other top-level entry
# of SOURCE_DIR, so the blocks' relative paths (build/bin/trainer, scripts/...) resolve and
# the files they write (metrics, checkpoints) land in the temporary directory.
#
# How the blocks are shortened: the text stays what a user should type (e.g. --epochs 5);
# the check only sets the environment. Every PSTRAIN_* and Paddle variable of the caller is
# removed, then PSTRAIN_STEPS=20 is exported ($RUNNABLE_DOCS_STEPS): the trainer stops after
# that many optimizer steps, whatever --epochs says (--steps caps --epochs; a flag wins
# over its own variable only, and the marked blocks do not pass --steps). pslaunch passes
# the environment on to its trainers and pservers, and picks free ports on 127.0.0.1 itself.
# So a marked block must not pass --steps, and must not name hosts other than 127.0.0.1 or
# fixed ports.
#
# Prints one line per block (file:line of the fence, exit status, seconds) and the tail of
# the output of a block that failed. Exit status 1 when a block failed, 2 on a usage error.
set -u
if [ $# -ne 2 ] || [ ! -x "$1/bin/trainer" ] || [ ! -f "$2/README.md" ]; then
  echo "usage: $0 BUILD_DIR SOURCE_DIR   (with bin/trainer, bin/pserver, bin/pslaunch built)" >&2
  exit 2
fi
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
steps=${RUNNABLE_DOCS_STEPS:-20}
limit=${RUNNABLE_DOCS_TIMEOUT:-120}
docs=(README.md docs/getting-started.md)

tmp=$(mktemp -d "${TMPDIR:-/tmp}/runnable_docs.XXXXXX") || exit 2
trap 'rm -rf "$tmp"' EXIT

# Hermetic environment: nothing of the caller's configuration leaks into the blocks.
for v in $(env | sed -n 's/^\(PSTRAIN_[A-Za-z0-9_]*\)=.*/\1/p; s/^\(PADDLE_[A-Za-z0-9_]*\)=.*/\1/p'); do
  unset "$v"
done
unset TRAINING_ROLE POD_IP
export PSTRAIN_STEPS=$steps

# extract FILE: writes each marked block to $tmp/blocks/N.sh and "N FILE LINE" to the index.
mkdir -p "$tmp/blocks"
: >"$tmp/index"
bad=0
for doc in "${docs[@]}"; do
  if [ ! -f "$src/$doc" ]; then
    echo "runnable_docs: $doc: no such file in $src"
    bad=1
    continue
  fi
  awk -v doc="$doc" -v out="$tmp/blocks" -v index_file="$tmp/index" -v start="$(wc -l <"$tmp/index")" '
    function trim(s) { gsub(/^[ \t]+|[ \t\r]+$/, "", s); return s }
    BEGIN { n = start; state = 0; err = 0 }
    state == 2 {                                   # inside a marked block
      if (trim($0) ~ /^```$/) { close(f); state = 0; next }
      print > f; next
    }
    state == 1 {                                   # the line after a marker
      if (trim($0) ~ /^```(sh|bash)$/) {
        n++; f = out "/" n ".sh"; printf "" > f
        print n, doc, NR >> index_file; state = 2; next
      }
      printf "runnable_docs: %s:%d: the runnable marker is not followed by a ```sh fence\n", doc, NR - 1
      err = 1; state = 0
    }
    trim($0) == "<!-- runnable -->" { state = 1 }
    END {
      if (state == 1) { printf "runnable_docs: %s: the runnable marker ends the file\n", doc; err = 1 }
      if (state == 2) { printf "runnable_docs: %s: a runnable block is not closed\n", doc; err = 1 }
      exit err
    }' "$src/$doc" || bad=1
done

count=$(wc -l <"$tmp/index")
if [ "$count" -eq 0 ]; then
  echo "runnable_docs: no block marked <!-- runnable --> in ${docs[*]}: nothing was checked"
  exit 1
fi

failed=0
total_start=$(date +%s%N)
while read -r n doc line; do
  work="$tmp/work.$n"
  mkdir "$work"
  for e in "$src"/* "$src"/.[!.]*; do
    [ -e "$e" ] || continue
    case "${e##*/}" in build|.git) continue ;; esac
    ln -s "$e" "$work/${e##*/}"
  done
  ln -s "$build" "$work/build"
  t0=$(date +%s%N)
  (cd "$work" && timeout -k 10 "$limit" bash -e -o pipefail "$tmp/blocks/$n.sh" \
     </dev/null >"$tmp/log.$n" 2>&1)
  rc=$?
  secs=$(( ($(date +%s%N) - t0) / 1000000 ))
  if [ "$rc" -eq 0 ]; then
    printf 'runnable_docs: %s:%d: exit 0, %d.%01d s\n' "$doc" "$line" $((secs / 1000)) $((secs % 1000 / 100))
  else
    what="exit $rc"
    [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && what="exit $rc (timed out after ${limit} s)"
    printf 'runnable_docs: %s:%d: FAILED, %s, %d.%01d s; the block:\n' "$doc" "$line" "$what" $((secs / 1000)) $((secs % 1000 / 100))
    sed 's/^/    | /' "$tmp/blocks/$n.sh"
    echo "  the last lines of its output:"
    tail -n 20 "$tmp/log.$n" | sed 's/^/    /'
    failed=1
  fi
done <"$tmp/index"
total=$(( ($(date +%s%N) - total_start) / 1000000 ))

if [ "$failed" -ne 0 ] || [ "$bad" -ne 0 ]; then
  printf 'runnable_docs: %d marked block(s), FAILED (%d.%01d s; PSTRAIN_STEPS=%s)\n' "$count" $((total / 1000)) $((total % 1000 / 100)) "$steps"
  exit 1
fi
printf 'runnable_docs: %d marked block(s) of %s ran and exited 0 (%d.%01d s; PSTRAIN_STEPS=%s)\n' \
  "$count" "${docs[*]}" $((total / 1000)) $((total % 1000 / 100)) "$steps"
exit 0
