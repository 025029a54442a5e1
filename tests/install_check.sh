#!/usr/bin/env bash
# install_check.sh BUILD_DIR — what make install does (scripts/install.sh), into a fresh
# PREFIX: the three programs in PREFIX/bin, executable, and a man page for each in
# PREFIX/share/man/man1 that man renders, with its name and one flag of its --help.
# Skipped (exit 0) when help2man or man is not installed.
set -u
if [ $# -ne 1 ] || [ ! -x "$1/bin/trainer" ]; then
  echo "usage: $0 BUILD_DIR   (with bin/trainer, bin/pserver and bin/pslaunch built)" >&2
  exit 2
fi
for tool in help2man man; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "install_check: skipped: $tool not installed"
    exit 0
  fi
done
root=$(cd "$(dirname "$0")/.." && pwd)
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT
fail() { echo "install_check: $*"; exit 1; }

"$root/scripts/install.sh" "$prefix" "$1" > "$prefix.log" 2>&1 \
  || { cat "$prefix.log"; rm -f "$prefix.log"; fail "scripts/install.sh $prefix $1 failed"; }
rm -f "$prefix.log"
# program, then a flag its page must show
for pair in trainer:--steps pserver:--port pslaunch:--pservers; do
  prog=${pair%%:*} flag=${pair#*:}
  if [ ! -f "$prefix/bin/$prog" ] || [ ! -x "$prefix/bin/$prog" ]; then
    fail "$prefix/bin/$prog missing or not executable"
  fi
  page=$prefix/share/man/man1/$prog.1
  [ -f "$page" ] || fail "$page missing"
  text=$(MANPAGER=cat MANWIDTH=80 LC_ALL=C man -l "$page" 2>&1) \
    || fail "man -l $page failed: $(printf '%s\n' "$text" | head -1)"
  printf '%s\n' "$text" | grep -Eq "^ +$prog - " \
    || fail "man page of $prog has no NAME line '$prog - ...'"
  printf '%s\n' "$text" | grep -q -- "$flag" \
    || fail "man page of $prog does not show $flag"
done
echo "install_check: trainer, pserver, pslaunch and their man pages install and render"
