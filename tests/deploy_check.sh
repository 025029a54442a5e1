#!/usr/bin/env bash
# deploy_check.sh BUILD_DIR — offline checks of deploy/ (no cluster, no Docker engine):
#   1. every manifest in deploy/k8s*/ is valid for its Kubernetes schema, and the
#      documents of a directory agree (deploy/validate/validate.js);
#   2. the validator rejects known-bad manifests (deploy/validate/testdata/);
#   3. every container of every pod the manifests create runs
#      `BUILD_DIR/bin/<program> [its args] --check-config` under exactly its environment
#      (env -i + the variables Kubernetes would give it): exit 0 and the expected role,
#      trainer id, trainer count, pserver list, port, bind address and threads; broken
#      variables exit 2 with one line naming the variable; every container resolves the
#      checkpoint directory and failure mode the validator checked against its volumes
#      and its Job's retries, and the shipped manifests recover from failures: every
#      trainer and pserver of deploy/k8s*/ resolves checkpoint_dir=/ckpt, on_failure=wait;
#      every one reads the job's token from its mounted Secret (token=set,
#      token_file=/etc/pstrain/token), and the shipped empty placeholder stops it (exit 2);
#      those of deploy/k8s-tls/ also resolve the TLS files of their mounted certificate.
#      The files a pod mounts from Secrets do not exist here: the validator moves every
#      such path under CASES/fs and writes a stand-in token there (see validate.js);
#   4. the manifest variants (PSTRAIN_* names, Paddle names, TLS) configure the same job,
#      and deploy/k8s-tls/ only adds to the files it shares with deploy/k8s/;
#   5. the runtime packages of deploy/Dockerfile provide every shared library the built
#      programs load, and the data directory (needs dpkg; skipped elsewhere).
# Needs node + npm; installs deploy/validate/node_modules with `npm ci` when missing.
# Ends with "deploy_check: N passed, M failed[, K skipped]"; exits 1 on any failure.
set -euo pipefail

if [ $# -ne 1 ] || [ ! -d "$1" ]; then
  echo "usage: $0 BUILD_DIR   (the build directory, with bin/trainer and bin/pserver)" >&2
  exit 2
fi
bin="$(cd "$1" && pwd)/bin"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
val="$root/deploy/validate"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

passed=0 failed=0 skipped=0
pass() { passed=$((passed + 1)); echo "ok   $*"; }
fail() { failed=$((failed + 1)); echo "FAIL $*"; }
skip() { skipped=$((skipped + 1)); echo "skip $*"; }
summary() {
  local s="deploy_check: $passed passed, $failed failed"
  [ "$skipped" -gt 0 ] && s="$s, $skipped skipped"
  echo "$s"
  [ "$failed" -eq 0 ]
}
indent() { sed 's/^/     | /' "$@"; }

cd "$root"

# ---- the validator's packages
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  fail "node and npm are needed (scripts/deps.sh installs them)"
  summary
  exit 1
fi
if [ ! -d "$val/node_modules" ] || [ "$val/package-lock.json" -nt "$val/node_modules/.package-lock.json" ]; then
  if ! npm ci --prefix "$val" --no-audit --no-fund --loglevel=error >"$tmp/npm.log" 2>&1; then
    indent "$tmp/npm.log"
    fail "npm ci --prefix deploy/validate"
    summary
    exit 1
  fi
fi
validate() { node "$val/validate.js" "$@"; }

# ---- 1. schemas and consistency; writes the --check-config cases
cases="$tmp/cases"
if validate --cases "$cases" >"$tmp/validate.log" 2>&1; then
  pass "manifests: $(tail -n 1 "$tmp/validate.log")"
else
  indent "$tmp/validate.log"
  fail "manifests: deploy/k8s*/ do not validate"
fi

# ---- 2. the validator catches what it should
for f in deploy/validate/testdata/*.yaml; do
  want="$(sed -n 's/^# expect-error: //p' "$f" | head -n 1)"
  if [ -z "$want" ]; then
    fail "$f: has no '# expect-error:' line"
    continue
  fi
  if validate "$f" >"$tmp/neg.log" 2>&1; then
    indent "$tmp/neg.log"
    fail "$f: accepted, expected an error containing: $want"
  elif grep -F -- "FAIL $f" "$tmp/neg.log" | grep -qF -- "$want"; then
    pass "$f rejected: $want"
  else
    indent "$tmp/neg.log"
    fail "$f: rejected, but no error line names $f and contains: $want"
  fi
done

# ---- 3. each container's environment through the real configuration loader
out="$tmp/out"
mkdir -p "$out"
if [ -f "$cases/cases.tsv" ]; then
  while IFS=$'\t' read -r -u 3 name program want_rc want_err; do
    exe="$bin/$program"
    if [ ! -x "$exe" ]; then
      fail "$name: $exe is not built"
      continue
    fi
    mapfile -t envv <"$cases/$name.env"
    mapfile -t argv <"$cases/$name.args"
    rc=0
    env -i "${envv[@]}" "$exe" "${argv[@]}" --check-config \
      </dev/null >"$out/$name.out" 2>"$out/$name.err" || rc=$?
    if [ "$want_rc" = 0 ]; then
      if [ "$rc" -ne 0 ]; then
        indent "$out/$name.err"
        fail "$name: $program --check-config exited $rc, expected 0"
      elif validate --compare "$cases/$name.expect.json" "$out/$name.out" >"$tmp/cmp.log" 2>&1; then
        pass "$name: $program resolves $(tr '\n' ' ' <"$cases/$name.expect.json" | cut -c1-150)"
      else
        indent "$tmp/cmp.log"
        fail "$name: $program --check-config resolved other values"
      fi
    else
      lines="$(wc -l <"$out/$name.err")"
      if [ "$rc" -ne "$want_rc" ]; then
        indent "$out/$name.out" "$out/$name.err"
        fail "$name: $program exited $rc, expected $want_rc"
      elif [ "$lines" -ne 1 ] || ! grep -qF -- "$want_err" "$out/$name.err"; then
        indent "$out/$name.err"
        fail "$name: expected one line on stderr naming $want_err"
      else
        pass "$name: exit $rc, $(cat "$out/$name.err")"
      fi
    fi
  done 3<"$cases/cases.tsv"
else
  fail "no --check-config cases (the validator failed)"
fi

# Every process of the shipped manifests, by case name.
shipped=(k8s.pstrain-trainer.trainer.0 k8s.pstrain-trainer.trainer.1
         k8s.pstrain-pserver.pserver.0 k8s.pstrain-pserver.pserver.1
         k8s-paddle-env.pstrain-paddle-trainer.trainer.0 k8s-paddle-env.pstrain-paddle-trainer.trainer.1
         k8s-paddle-env.pstrain-paddle-pserver.pserver.0 k8s-paddle-env.pstrain-paddle-pserver.pserver.1
         k8s-tls.pstrain-trainer.trainer.0 k8s-tls.pstrain-trainer.trainer.1
         k8s-tls.pstrain-pserver.pserver.0 k8s-tls.pstrain-pserver.pserver.1)
# get KEY CASE: one value of a case's --check-config output, a path as the pod sees it
# (without the CASES/fs the validator moved the Secrets' files under).
get() {
  local v
  v="$(validate --get "$1" "$out/$2.out" 2>&1 || true)"
  echo "${v#"$cases/fs"}"
}

# The shipped manifests recover from a lost pod (deploy/README.md, "Failures and
# recovery"): each process checkpoints to its volume at /ckpt and waits for restarts.
for c in "${shipped[@]}"; do
  if [ ! -s "$out/$c.out" ]; then
    fail "recovery settings of $c: no --check-config output"
    continue
  fi
  dir="$(validate --get checkpoint_dir "$out/$c.out" 2>&1 || true)"
  mode="$(validate --get on_failure "$out/$c.out" 2>&1 || true)"
  if [ "$dir" = /ckpt ] && [ "$mode" = wait ]; then
    pass "recovery settings of $c: checkpoint_dir=$dir on_failure=$mode"
  else
    fail "recovery settings of $c: checkpoint_dir=$dir on_failure=$mode, expected /ckpt and wait"
  fi
done

# The shipped manifests authenticate (deploy/README.md, "Security"): every process reads
# the job's token from the Secret mounted at /etc/pstrain; the TLS variant's also use the
# certificates cert-manager issues into the Secret mounted at /tls (mutual TLS).
for c in "${shipped[@]}"; do
  if [ ! -s "$out/$c.out" ]; then
    fail "authentication of $c: no --check-config output"
    continue
  fi
  token="$(get token "$c")" file="$(get token_file "$c")"
  if [ "$token" = set ] && [ "$file" = /etc/pstrain/token ]; then
    pass "authentication of $c: token=$token token_file=$file"
  else
    fail "authentication of $c: token=$token token_file=$file, expected set and /etc/pstrain/token"
  fi
  case "$c" in
    k8s-tls.*.pserver.*) keys="tls_cert=/tls/tls.crt tls_key=/tls/tls.key tls_ca=/tls/ca.crt" ;;
    k8s-tls.*.trainer.*) keys="tls_ca=/tls/ca.crt tls_client_cert=/tls/tls.crt tls_client_key=/tls/tls.key" ;;
    *) keys="tls_ca=" ;; # the plain variants: no TLS
  esac
  got=""
  for kv in $keys; do got="$got ${kv%%=*}=$(get "${kv%%=*}" "$c")"; done
  if [ "$got" != " $keys" ]; then
    fail "TLS of $c:$got, expected $keys"
  elif [ "$keys" = "tls_ca=" ]; then
    pass "TLS of $c: none (a plain variant)"
  else
    pass "TLS of $c:$got"
  fi
done

# ---- 4. the Paddle-names variant configures the same job as the PSTRAIN_* one
same_job() { # same_job CASE_A CASE_B KEYS_THAT_MAY_DIFFER
  if [ ! -s "$out/$1.out" ] || [ ! -s "$out/$2.out" ]; then
    fail "same job: $1 / $2: no --check-config output to compare"
  elif validate --same "$out/$1.out" "$out/$2.out" "$3" >"$tmp/same.log" 2>&1; then
    pass "same job: $1 = $2 (but $3)"
  else
    indent "$tmp/same.log"
    fail "same job: $1 and $2 differ"
  fi
}
same_job k8s.pstrain-trainer.trainer.0 k8s-paddle-env.pstrain-paddle-trainer.trainer.0 pservers
same_job k8s.pstrain-trainer.trainer.1 k8s-paddle-env.pstrain-paddle-trainer.trainer.1 pservers
same_job k8s.pstrain-pserver.pserver.0 k8s-paddle-env.pstrain-paddle-pserver.pserver.0 pservers,bind
same_job k8s.pstrain-pserver.pserver.1 k8s-paddle-env.pstrain-paddle-pserver.pserver.1 pservers,bind
# ... and the TLS variant the same job as the plain one, TLS aside
same_job k8s.pstrain-trainer.trainer.0 k8s-tls.pstrain-trainer.trainer.0 tls_ca,tls_client_cert,tls_client_key
same_job k8s.pstrain-trainer.trainer.1 k8s-tls.pstrain-trainer.trainer.1 tls_ca,tls_client_cert,tls_client_key
same_job k8s.pstrain-pserver.pserver.0 k8s-tls.pstrain-pserver.pserver.0 tls_ca,tls_cert,tls_key
same_job k8s.pstrain-pserver.pserver.1 k8s-tls.pstrain-pserver.pserver.1 tls_ca,tls_cert,tls_key
# deploy/k8s-tls/ holds the whole job (so `kubectl apply -f deploy/k8s-tls/` needs nothing
# else): each file it shares with deploy/k8s/ is a copy, or the copy with lines added.
for f in deploy/k8s-tls/*.yaml; do
  base="deploy/k8s/$(basename "$f")"
  [ -f "$base" ] || continue
  if cmp -s "$base" "$f"; then
    pass "$f: the same as $base"
  elif ! diff "$base" "$f" | grep -q '^<'; then
    pass "$f: $base with lines added ($(diff "$base" "$f" | grep -c '^>'))"
  else
    diff "$base" "$f" | grep '^<' | indent
    fail "$f: differs from $base in lines other than added ones (edit both)"
  fi
done

# ---- 5. the image's runtime packages cover what the programs load
pkgs="$(sed -n 's/^ARG RUNTIME_PACKAGES="\(.*\)"$/\1/p' deploy/Dockerfile)"
if [ -z "$pkgs" ]; then
  fail "deploy/Dockerfile: no ARG RUNTIME_PACKAGES=\"...\" line"
elif ! command -v dpkg-query >/dev/null 2>&1; then
  skip "runtime packages: no dpkg here to map libraries to packages"
else
  # The packages of the runtime stage and everything they depend on (as installed here).
  declare -A have=()
  read -r -a queue <<<"$pkgs"
  while [ ${#queue[@]} -gt 0 ]; do
    p="${queue[0]}"
    queue=("${queue[@]:1}")
    [ -n "${have[$p]:-}" ] && continue
    deps="$(dpkg-query -W -f='${Depends}, ${Pre-Depends}' "$p" 2>/dev/null)" || continue
    have[$p]=1
    for d in $(echo "$deps" | tr ',|' '\n' | sed 's/([^)]*)//g; s/:[a-z0-9]*//; s/ //g' | sort -u); do
      [ -z "${have[$d]:-}" ] && queue+=("$d")
    done
  done
  owner() { # owner FILE -> the package that ships it (tries the /usr-merged twin too)
    local f="$1" g
    for g in "$f" "$(readlink -f "$f")" "${f#/usr}" "/usr$f"; do
      dpkg-query -S "$g" 2>/dev/null | sed -n '1s/:.*//p' | grep . && return 0
    done
    return 1
  }
  for p in $pkgs; do
    dpkg-query -W "$p" >/dev/null 2>&1 || fail "runtime package $p is not installed here: cannot check it"
  done
  for prog in trainer pserver; do
    exe="$bin/$prog"
    if [ ! -x "$exe" ]; then
      fail "runtime libraries of $prog: $exe is not built"
      continue
    fi
    missing=""
    cuda_libs=""
    while read -r lib path; do
      case "$path" in
        # The image is CPU-only (its builder has no CUDA toolkit: PSTRAIN_CUDA=OFF); a local
        # build with the CUDA backend also loads the toolkit's libraries.
        /usr/local/cuda*) cuda_libs="$cuda_libs $lib"; continue ;;
      esac
      if [ "$path" = "not" ]; then
        missing="$missing $lib(not found)"
        continue
      fi
      pkg="$(owner "$path" || true)"
      pkg="${pkg%%,*}"
      if [ -z "$pkg" ] || [ -z "${have[$pkg]:-}" ]; then
        missing="$missing $lib(${pkg:-no package})"
      fi
    done < <(ldd "$exe" | sed -n 's/^[[:space:]]*\([^ ]*\) => \([^ ]*\).*/\1 \2/p')
    if [ -n "$cuda_libs" ]; then
      skip "runtime libraries of $prog from the CUDA toolkit (not in the CPU-only image):$cuda_libs"
    fi
    if [ -z "$missing" ]; then
      pass "runtime libraries of $prog: all from RUNTIME_PACKAGES or their dependencies"
    else
      fail "runtime libraries of $prog not provided by RUNTIME_PACKAGES:$missing"
    fi
  done
  # The data directory the trainers read must come from a runtime package.
  for c in k8s.pstrain-trainer.trainer.0 k8s-paddle-env.pstrain-paddle-trainer.trainer.0; do
    [ -s "$out/$c.out" ] || continue
    dir="$(validate --get data "$out/$c.out")"
    pkg="$(owner "$dir" || true)"
    if [ -n "$pkg" ] && [ -n "${have[$pkg]:-}" ]; then
      pass "data directory of $c: $dir from $pkg"
    else
      fail "data directory of $c: $dir is not shipped by RUNTIME_PACKAGES (${pkg:-no package})"
    fi
  done
fi

summary
