#!/usr/bin/env bash
# make_certs.sh DIR — the certificates of the TLS tests, made with the openssl command:
#   ca, otherca          two CAs
#   server               signed by ca, for 127.0.0.1 and localhost
#   client               signed by ca (a trainer's, for mutual TLS; names no trainer id)
#   trainer-0, trainer-1 signed by ca, each naming its trainer (CN trainer-0; a pod's
#                        name, pstrain-trainer-1-x7k2p, as SAN)
#   expired              signed by ca, expired yesterday
#   other                signed by otherca, for 127.0.0.1
#   wronghost            signed by ca, for pserver.example only
# Each NAME gets NAME.pem and NAME.key (EC P-256).
set -euo pipefail
cd "$1"
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1.key" 2>/dev/null; }
for ca in ca otherca; do
  key "$ca"
  openssl req -x509 -new -key "$ca.key" -out "$ca.pem" -days 30 -subj "/CN=pstrain test $ca" 2>/dev/null
done
cert() { # cert NAME CA SAN DAYS
  key "$1"
  openssl req -new -key "$1.key" -out "$1.csr" -subj "/CN=$1" 2>/dev/null
  printf 'subjectAltName=%s\n' "$3" > "$1.ext"
  openssl x509 -req -in "$1.csr" -CA "$2.pem" -CAkey "$2.key" -CAcreateserial -out "$1.pem" \
    -days "$4" -extfile "$1.ext" 2>/dev/null
  rm -f "$1.csr" "$1.ext"
}
cert server ca "IP:127.0.0.1,DNS:localhost" 30
cert client ca "DNS:trainer" 30
cert trainer-0 ca "DNS:trainer-0" 30
cert trainer-1 ca "DNS:pstrain-trainer-1-x7k2p" 30
cert expired ca "IP:127.0.0.1" -1
cert other otherca "IP:127.0.0.1" 30
cert wronghost ca "DNS:pserver.example" 30
