#!/bin/sh
# Installs trainer, pserver and pslaunch from BUILD_DIR/bin into PREFIX/bin, and a man page
# for each, made from its --help by help2man, into PREFIX/share/man/man1/.
# usage: scripts/install.sh PREFIX BUILD_DIR   (make install passes $(DESTDIR)$(PREFIX) $(BUILD))
# Fails with one line, and installs nothing, when PREFIX is not writable (no sudo here).
set -eu
if [ $# -ne 2 ]; then
  echo "usage: $0 PREFIX BUILD_DIR" >&2
  exit 2
fi
prefix=$1
bin=$2/bin
root=$(cd "$(dirname "$0")/.." && pwd)
progs="trainer pserver pslaunch"

command -v help2man >/dev/null 2>&1 \
  || { echo "install: help2man not found (scripts/deps.sh installs it)" >&2; exit 1; }
for p in $progs; do
  [ -x "$bin/$p" ] || { echo "install: $bin/$p not built (make build)" >&2; exit 1; }
done
if ! mkdir -p "$prefix/bin" "$prefix/share/man/man1" 2>/dev/null \
   || [ ! -w "$prefix/bin" ] || [ ! -w "$prefix/share/man/man1" ]; then
  echo "install: cannot write to $prefix/bin and $prefix/share/man/man1;" \
       "pick a PREFIX you own (e.g. PREFIX=\$HOME/.local) or run as root" >&2
  exit 1
fi

# The programs have no --version: help2man takes this string instead (and then does not
# run PROG --version).
version=$(git -C "$root" describe --always --dirty 2>/dev/null || echo dev)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for p in $progs; do
  case $p in
    trainer)  name="train a model alone or against parameter servers" ;;
    pserver)  name="parameter server of a pstrain job" ;;
    pslaunch) name="start pservers and trainers of a pstrain job on one machine" ;;
  esac
  # help2man reads "Usage:" lines (the programs print "usage:") and an "Options:" heading
  # (there is none): it gets the --help text with both, from a stand-in named PROG. The
  # heading goes before the first option line, or before the first group heading ("Cluster:").
  "$bin/$p" --help > "$tmp/$p.help" 2>&1 \
    || { echo "install: $bin/$p --help failed" >&2; exit 1; }
  mkdir -p "$tmp/w"
  awk 'NR == 1 { sub(/^usage:/, "Usage:") }
       NR > 1 && !opts && (/^  +-/ || /^[A-Z].*:$/) { print ""; print "Options:"; opts = 1 }
       { print }' "$tmp/$p.help" > "$tmp/$p.help2"
  printf '#!/bin/sh\ncat "%s"\n' "$tmp/$p.help2" > "$tmp/w/$p"
  chmod +x "$tmp/w/$p"
  LC_ALL=C help2man --no-info --section=1 --source="pstrain $version" --version-string="$version" \
    --name="$name" --output="$tmp/$p.1" "$tmp/w/$p" \
    || { echo "install: help2man failed on $bin/$p --help" >&2; exit 1; }
done
for p in $progs; do
  install -m 0755 "$bin/$p" "$prefix/bin/$p"
  install -m 0644 "$tmp/$p.1" "$prefix/share/man/man1/$p.1"
done
echo "install: $progs in $prefix/bin, their man pages in $prefix/share/man/man1"
