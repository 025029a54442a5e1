#!/bin/sh
# Installs the Debian packages pstrain needs to build, test, run its demo and install
# (help2man makes the man pages of make install).
# Idempotent and quiet when everything is present; uses sudo when not root.
# usage: scripts/deps.sh [extra-package ...]   (bench/ passes python3-torch, iperf3)
set -eu

pkgs="build-essential cmake pkg-config libopenblas-dev libdnnl-dev zlib1g-dev libcriterion-dev
      dataset-fashion-mnist libprotobuf-c-dev protobuf-c-compiler libgrpc-dev libssl-dev openssl
      libmicrohttpd-dev python3-prometheus-client python3-matplotlib
      bible-kjv iproute2 help2man $*"

missing=""
for p in $pkgs; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing="$missing $p"
  fi
done
# Node.js (for the offline manifest checks) may come from another repository whose
# nodejs conflicts with Debian's npm: install Debian's pair only when neither is there.
command -v npm >/dev/null 2>&1 || missing="$missing nodejs npm"
if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
if [ -n "$missing" ]; then
  echo "pstrain deps: installing$missing" >&2
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq >/dev/null
  # shellcheck disable=SC2086
  $SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi

# --dataset kjv: the King James Bible as one text file (4.4 MB, 73 distinct bytes), written
# once from Debian's bible-kjv (common/config.h's PST_KJV_PATH).
kjv=/usr/local/share/pstrain/kjv.txt
if [ ! -s "$kjv" ]; then
  echo "pstrain deps: writing $kjv from bible-kjv" >&2
  tmp=$(mktemp)
  bible -f -l0 'Gen1:1-Rev22:21' > "$tmp"
  $SUDO mkdir -p "$(dirname "$kjv")"
  $SUDO install -m 0644 "$tmp" "$kjv"
  rm -f "$tmp"
fi
