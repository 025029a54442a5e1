#!/usr/bin/env bash
# Measurement (issue 15): what TLS costs on the synthetic sync step through the real
# programs (the ps_sync bench's job: 25M parameters, 1 pserver, 2 trainers, sgd),
# alternating RUNS times: plaintext, TLS (the pserver's certificate verified by the
# trainers) and mutual TLS (client certificates too), all with a token. Certificates are
# made at run time by tests/tls/make_certs.sh. Reports the medians of step_ms_median and
# their ratios to plaintext. Not a test. --shm off for all three: the payloads go in the
# calls, through TLS, as between hosts (on one host they would skip it through shared
# memory).
#
# usage: bench/tls.sh [BUILD_DIR=build] [RUNS=3] [STEPS=20] [PARAMS=25000000]
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"
build=${1:-build}; runs=${2:-3}; steps=${3:-20}; params=${4:-25000000}
here=$(cd "$(dirname "$0")/.." && pwd)
bench_need_built "$build" pslaunch pserver trainer
bench_need_python
bench_need_cmd openssl "apt-get install openssl"
bench_blas_core "$build"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
bash "$here/tests/tls/make_certs.sh" "$tmp"
echo "bench-token-$RANDOM$RANDOM" > "$tmp/token"
bench_header tls "\"params\":$params,\"trainers\":2,\"pservers\":1,\"steps\":$steps,\"runs\":$runs"
job() { # job plain|tls|mtls: trainer 0's summary
  local v=(PSTRAIN_TOKEN_FILE="$tmp/token" PSTRAIN_SHM=off)
  case "$1" in
    tls) v+=(PSTRAIN_TLS_CERT="$tmp/server.pem" PSTRAIN_TLS_KEY="$tmp/server.key"
             PSTRAIN_TLS_CA="$tmp/ca.pem") ;;
    mtls) v+=(PSTRAIN_TLS_CERT="$tmp/server.pem" PSTRAIN_TLS_KEY="$tmp/server.key"
              PSTRAIN_TLS_CA="$tmp/ca.pem" PSTRAIN_TLS_CLIENT_CERT="$tmp/client.pem"
              PSTRAIN_TLS_CLIENT_KEY="$tmp/client.key") ;;
  esac
  # tls: the trainers verify the pserver (CA) but a pserver given PSTRAIN_TLS_CA requires
  # client certificates: the pserver of plain "tls" must not see the CA.
  if [ "$1" = tls ]; then
    env "${v[@]}" "$build/bin/pslaunch" --pservers 1 --trainers 2 --timeout 600 \
      --pserver-cmd "$tmp/pserver-no-ca" -- "$build/bin/trainer" --model synthetic \
      --params "$params" --steps "$steps" --optimizer sgd --lr 0.01 --log-level warn
  else
    env "${v[@]}" "$build/bin/pslaunch" --pservers 1 --trainers 2 --timeout 600 \
      --pserver-cmd "$(cd "$build/bin" && pwd)/pserver" -- "$build/bin/trainer" \
      --model synthetic --params "$params" --steps "$steps" --optimizer sgd --lr 0.01 \
      --log-level warn
  fi
}
printf '#!/bin/sh\nunset PSTRAIN_TLS_CA PSTRAIN_TLS_CLIENT_CERT PSTRAIN_TLS_CLIENT_KEY\nexec "%s" "$@"\n' \
  "$(cd "$build/bin" && pwd)/pserver" > "$tmp/pserver-no-ca"
chmod +x "$tmp/pserver-no-ca"
for i in $(seq 1 "$runs"); do
  for t in plain tls mtls; do
    job "$t" 2>/dev/null | tail -n 1 > "$tmp/$t$i.json"
    echo "{\"run\":$i,\"transport\":\"$t\",\"result\":$(cat "$tmp/$t$i.json")}"
  done
done
"$BENCH_PY" - "$tmp" "$runs" <<'PY'
import json, statistics, sys
d, n = sys.argv[1], int(sys.argv[2])
med = lambda t, k: statistics.median(json.load(open(f"{d}/{t}{i}.json"))[k] for i in range(1, n + 1))
p, t, m = (med(x, "step_ms_median") for x in ("plain", "tls", "mtls"))
print(json.dumps({"step_ms_median_plain": p, "step_ms_median_tls": t,
                  "step_ms_median_mutual_tls": m, "tls_over_plain": round(t / p, 3),
                  "mutual_tls_over_plain": round(m / p, 3)}))
PY
