#!/usr/bin/env python3
"""pstrain's step median over its timed steps, as the peers time theirs.

The peers (../shared/peers) run --warmup untimed steps, then --steps timed ones, and report
the median of the timed ones. pstrain's trainer reports the median over all its steps in
its summary; a bench that gives it the same untimed steps runs WARMUP + STEPS steps with
--metrics and takes the median of the last STEPS "step" records of that file (trainer 0's:
in a sync job every trainer takes the same steps).

usage: bench/timed_steps.py SUMMARY METRICS WARMUP STEPS
  SUMMARY  a file whose last JSON line with step_ms_median is the trainer's summary
  METRICS  the trainer's --metrics file (JSON lines; "event":"step" records with "ms")
prints the summary with step_ms_median over the timed steps and the trainer's own median
as step_ms_median_all_steps; exits 1 with one line on stderr naming what is missing.
"""
import json
import statistics
import sys


def summary(path):
    """The last JSON line of PATH that has step_ms_median, or raise ValueError."""
    with open(path) as f:
        lines = [line for line in f if line.startswith("{")]
    for line in reversed(lines):
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if "step_ms_median" in d:
            return d
    raise ValueError("no step_ms_median in %s" % path)


def timed(d, metrics, warmup, steps):
    """D (a trainer summary) with step_ms_median over steps [WARMUP, WARMUP + STEPS) of
    the METRICS file; raises ValueError or OSError naming what is missing."""
    ms = {}
    with open(metrics) as f:
        for line in f:
            e = json.loads(line)
            if e.get("event") == "step":
                ms[e["step"]] = e["ms"]
    last = [ms[k] for k in sorted(ms) if k >= warmup]
    if len(last) != steps:
        raise ValueError("%s holds %d timed steps after %d untimed ones, not %d"
                         % (metrics, len(last), warmup, steps))
    d = dict(d)
    d["step_ms_median_all_steps"] = d["step_ms_median"]
    d["step_ms_median"] = statistics.median(last)
    return d


def main(argv):
    if len(argv) != 5:
        sys.exit("usage: bench/timed_steps.py SUMMARY METRICS WARMUP STEPS")
    try:
        print(json.dumps(timed(summary(argv[1]), argv[2], int(argv[3]), int(argv[4]))))
    except (OSError, ValueError, KeyError) as e:
        sys.exit("bench/timed_steps.py: %s" % e)


if __name__ == "__main__":
    main(sys.argv)
