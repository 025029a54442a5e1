#!/usr/bin/env bash
# plot_check.sh BUILD_DIR — scripts/plot on files from a real run, and its errors:
#   1. a short cluster run (1 pserver, 2 trainers, 12 steps of the Fashion-MNIST MLP) writes
#      each trainer's --metrics and --trace file; a local run of the same model writes a
#      third metrics file;
#   2. `plot metrics` (one file; two overlaid), `plot trace` (one trainer; both, with
#      --steps) and `plot scaling` (bench/scaling.sh's output) make PNGs and SVGs: the
#      PNGs start with the PNG signature and have a sane size in pixels and bytes, the SVGs
#      parse as XML and carry the panels' and spans' (or lines') names as text;
#   3. an unfinished last line (a trainer still writing) and a NaN loss still plot;
#   4. a missing, empty, malformed or wrong file, an unknown picture type and bad options
#      exit 2 with exactly one line on stderr that names the file (and line) at fault.
# Needs Debian's python3-matplotlib (scripts/deps.sh installs it): fails without it.
# Ends with "plot_check: N passed, M failed"; exits 1 on any failure. About 10 s.
set -euo pipefail

if [ $# -ne 1 ] || [ ! -d "$1" ]; then
  echo "usage: $0 BUILD_DIR   (the build directory, with bin/trainer, bin/pserver, bin/pslaunch)" >&2
  exit 2
fi
bin="$(cd "$1" && pwd)/bin"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
plot="$root/scripts/plot"
py=/usr/bin/python3
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

passed=0 failed=0
pass() { passed=$((passed + 1)); echo "ok   $*"; }
fail() { failed=$((failed + 1)); echo "FAIL $*"; }
summary() {
  echo "plot_check: $passed passed, $failed failed"
  [ "$failed" -eq 0 ]
}
indent() { sed 's/^/     | /' "$@"; }

if ! "$py" -c 'import matplotlib' 2>/dev/null; then
  fail "python3-matplotlib is missing for $py (scripts/deps.sh installs it)"
  summary
  exit 1
fi

# ---- 1. real files
export OPENBLAS_NUM_THREADS=1
common=(--epochs 1 --steps 12 --batch 128 --hidden 256,256 --block-bytes 256K --seed 0 --progress lines)
if "$bin/pslaunch" --pservers 1 --trainers 2 --timeout 120 -- sh -c \
     "exec \"$bin/trainer\" ${common[*]} --metrics \"$tmp/m\$PSTRAIN_TRAINER_ID.jsonl\" \
      --trace \"$tmp/t\$PSTRAIN_TRAINER_ID.json\" --trace-steps 4:7" \
     >"$tmp/run.out" 2>"$tmp/run.err" &&
   [ -s "$tmp/m0.jsonl" ] && [ -s "$tmp/m1.jsonl" ] && [ -s "$tmp/t0.json" ] && [ -s "$tmp/t1.json" ]; then
  pass "a 1 pserver x 2 trainers run wrote each trainer's metrics and trace"
else
  tail -n 20 "$tmp/run.err" | indent
  fail "a 1 pserver x 2 trainers run with --metrics and --trace"
  summary
  exit 1
fi
if "$bin/trainer" "${common[@]}" --metrics "$tmp/local.jsonl" >/dev/null 2>"$tmp/local.err"; then
  pass "a local run wrote its metrics"
else
  tail -n 20 "$tmp/local.err" | indent
  fail "a local run with --metrics"
fi

# ---- 2. pictures
# check_png FILE MIN_W MIN_H: the PNG signature, and the IHDR's width and height
check_png() {
  "$py" - "$@" <<'EOF'
import struct, sys
path, min_w, min_h = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
data = open(path, "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n", "no PNG signature"
assert data[12:16] == b"IHDR", "no IHDR chunk first"
w, h = struct.unpack(">II", data[16:24])
assert min_w <= w <= 4000 and min_h <= h <= 4000, "%dx%d pixels" % (w, h)
assert 10_000 <= len(data) <= 1_500_000, "%d bytes" % len(data)
EOF
}
# check_svg FILE TEXT...: parses as XML with an <svg> root, and holds every TEXT as text
check_svg() {
  "$py" - "$@" <<'EOF'
import sys, xml.etree.ElementTree as ET
path, want = sys.argv[1], sys.argv[2:]
root = ET.parse(path).getroot()
assert root.tag.endswith("svg"), "root element " + root.tag
text = " ".join(t for t in root.itertext())
missing = [w for w in want if w not in text]
assert not missing, "no text %s" % missing
EOF
}
# picture NAME CHECK... -- PLOT ARGS: runs scripts/plot, then the check
picture() {
  local what="$1" out="$2"
  shift 2
  local check=()
  while [ "$1" != "--" ]; do check+=("$1"); shift; done
  shift
  if ! "$plot" "$@" -o "$out" 2>"$tmp/plot.err"; then
    indent "$tmp/plot.err"
    fail "$what: scripts/plot $*"
  elif ! "${check[@]}" 2>"$tmp/check.err"; then
    tail -n 3 "$tmp/check.err" | indent
    fail "$what: $(basename "$out")"
  else
    pass "$what: $(basename "$out") ($(wc -c <"$out") bytes)"
  fi
}
picture "metrics of one trainer, PNG" "$tmp/m.png" check_png "$tmp/m.png" 1200 700 -- \
  metrics "$tmp/m0.jsonl"
picture "metrics of one trainer, SVG" "$tmp/m.svg" \
  check_svg "$tmp/m.svg" "loss per step" "loss against time" "test_acc" "samples/s" -- \
  metrics "$tmp/m0.jsonl"
picture "two runs overlaid, PNG" "$tmp/cmp.png" check_png "$tmp/cmp.png" 1200 700 -- \
  metrics "$tmp/local.jsonl" "$tmp/m0.jsonl" --label "alone" --label "2 trainers"
picture "two runs overlaid, SVG" "$tmp/cmp.svg" \
  check_svg "$tmp/cmp.svg" "alone" "2 trainers" "comparison of 2 runs" -- \
  metrics "$tmp/local.jsonl" "$tmp/m0.jsonl" --label "alone" --label "2 trainers"
picture "trace of one trainer, PNG" "$tmp/t.png" check_png "$tmp/t.png" 1200 300 -- \
  trace "$tmp/t0.json"
picture "trace of both trainers, steps 5:6, SVG" "$tmp/t.svg" \
  check_svg "$tmp/t.svg" "forward" "backward" "push" "pull" "rpc push" "trainer 1" "step 5" -- \
  trace "$tmp/t0.json" "$tmp/t1.json" --label "trainer 0" --label "trainer 1" --steps 5:6
if "$plot" trace "$tmp/t0.json" -o "$tmp/t3.png" 2>"$tmp/steps.err" &&
   grep -q "drawing 4:6 (choose with --steps A:B)" "$tmp/steps.err"; then
  pass "a trace of 4 steps draws the first 3 and says so"
else
  indent "$tmp/steps.err"
  fail "a trace of 4 steps: the first 3 and a note"
fi

# bench/scaling.sh's output (its stdout: a header, cells, a failed cell, the table)
cat >"$tmp/scaling.out" <<'EOF2'
{"bench":"scaling","link":"1gbit","iperf3_bps":944485326,"params":1000000}
{"system":"pstrain","trainers":1,"pservers":1,"link":"1gbit","precision":"fp32","params":1000000,"step_ms_median":68.9,"predicted_ms":65.1}
{"system":"pstrain","trainers":2,"pservers":1,"link":"1gbit","precision":"fp32","params":1000000,"step_ms_median":116.7,"predicted_ms":130.0}
{"system":"torch_ddp","trainers":1,"pservers":0,"link":"1gbit","precision":"fp32","params":1000000,"step_ms_median":7.2,"predicted_ms":5.5}
{"system":"torch_ddp","trainers":2,"pservers":0,"link":"1gbit","precision":"fp32","params":1000000,"step_ms_median":82.9,"predicted_ms":37.5}
{"system":"torch_rpc_ps","trainers":2,"pservers":1,"link":"1gbit","precision":"fp32","params":1000000,"error":"no output"}

| system | S | wire | T | step ms |
plot: /tmp/x/scaling.png
EOF2
picture "scaling, PNG" "$tmp/sc.png" check_png "$tmp/sc.png" 900 500 -- scaling "$tmp/scaling.out"
picture "scaling, SVG" "$tmp/sc.svg" \
  check_svg "$tmp/sc.svg" "pstrain, S=1, fp32" "torch_ddp, fp32" "measured" "predicted" "trainers" -- \
  scaling "$tmp/scaling.out"

# ---- 3. files that still plot
head -c -20 "$tmp/m0.jsonl" >"$tmp/unfinished.jsonl"
if "$plot" metrics "$tmp/unfinished.jsonl" -o "$tmp/u.png" 2>"$tmp/u.err" &&
   grep -q "unfinished last line" "$tmp/u.err" && check_png "$tmp/u.png" 1200 700; then
  pass "an unfinished last line is skipped with a note"
else
  indent "$tmp/u.err"
  fail "an unfinished last line"
fi
sed '3s/"loss":[0-9.]*/"loss":-nan/; 4s/"loss":[0-9.]*/"loss":inf/' "$tmp/m0.jsonl" >"$tmp/nan.jsonl"
if "$plot" metrics "$tmp/nan.jsonl" -o "$tmp/nan.png" 2>"$tmp/nan.err" &&
   check_png "$tmp/nan.png" 1200 700; then
  pass "C's nan and inf losses plot"
else
  indent "$tmp/nan.err"
  fail "C's nan and inf losses"
fi

# ---- 4. errors: exit 2, one line naming the culprit
: >"$tmp/empty.jsonl"
sed '5s/.*/{"event":"step","step":4,"loss":/' "$tmp/m0.jsonl" >"$tmp/broken.jsonl"
sed '2s/"ms":[0-9.]*/"ms":"fast"/' "$tmp/m0.jsonl" >"$tmp/badms.jsonl"
echo '{"event":"pserver","casts":0,"optimizer_steps":12}' >"$tmp/ps.jsonl"
# expect_error WANT ARGS...: exit 2 and exactly one stderr line containing WANT
expect_error() {
  local want="$1"
  shift
  local rc=0
  "$plot" "$@" >/dev/null 2>"$tmp/err" || rc=$?
  if [ "$rc" -eq 2 ] && [ "$(wc -l <"$tmp/err")" -eq 1 ] && grep -qF -- "$want" "$tmp/err"; then
    pass "error: $(cat "$tmp/err")"
  else
    indent "$tmp/err"
    fail "scripts/plot $*: expected exit 2 and one line with '$want', got exit $rc"
  fi
}
expect_error "$tmp/none.jsonl: no such file" metrics "$tmp/none.jsonl" -o "$tmp/x.png"
expect_error "$tmp/empty.jsonl: empty" metrics "$tmp/empty.jsonl" -o "$tmp/x.png"
expect_error "$tmp/broken.jsonl:5: not a JSON record" metrics "$tmp/broken.jsonl" -o "$tmp/x.png"
expect_error "$tmp/badms.jsonl:2: \"ms\" is \"fast\" (expected a number" \
  metrics "$tmp/badms.jsonl" -o "$tmp/x.png"
expect_error "$tmp/ps.jsonl: no step records" metrics "$tmp/ps.jsonl" -o "$tmp/x.png"
expect_error "unknown picture type '.jpg' (expected a name ending in .png or .svg" \
  metrics "$tmp/m0.jsonl" -o "$tmp/x.jpg"
expect_error "$tmp/m0.jsonl:2: not a Chrome trace" trace "$tmp/m0.jsonl" -o "$tmp/x.png"
expect_error "$tmp/empty.jsonl: empty" trace "$tmp/empty.jsonl" -o "$tmp/x.svg"
expect_error "--steps 5-6: expected A:B" trace "$tmp/t0.json" --steps 5-6 -o "$tmp/x.png"
expect_error "$tmp/t0.json: no spans in steps 50:52 (the file has steps 4-7" \
  trace "$tmp/t0.json" --steps 50:52 -o "$tmp/x.png"
expect_error "--label given 1 time for 2 files" \
  metrics "$tmp/m0.jsonl" "$tmp/m1.jsonl" --label a -o "$tmp/x.png"
expect_error "no output: give -o OUT.png" metrics "$tmp/m0.jsonl"
expect_error "$tmp/m0.jsonl: no scaling records" scaling "$tmp/m0.jsonl" -o "$tmp/x.png"
expect_error "--label is not for 'plot scaling'" scaling "$tmp/scaling.out" --label a -o "$tmp/x.png"
if [ -e "$tmp/x.png" ] || [ -e "$tmp/x.svg" ] || [ -e "$tmp/x.jpg" ]; then
  fail "a failed plot left an output file"
else
  pass "no failed plot left an output file"
fi

summary
