#!/usr/bin/env python3
"""The pipeline bubble from a pstrain Chrome trace (trainer --pipeline P --trace): for each
traced step, the window from its first forward to its last backward on any stage, and per
stage (device compute track) its compute time (forward and backward spans; the copies
between stages are not compute). The bubble of a stage is (window - compute) / compute,
the schedule formula's (P - 1) / M under equal stages; imbalance is the largest stage's
compute over the mean. Prints one JSON line: the medians over the traced steps.

usage: bench/pipeline_trace.py TRACE.json"""
import json
import statistics
import sys


def main(path):
    events = json.load(open(path))["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events
             if e.get("ph") == "M" and e["name"] == "thread_name"}
    spans = [e for e in events if e.get("ph") == "X" and e["name"] in ("forward", "backward")]
    steps = sorted({e["args"]["step"] for e in spans})
    per_step = []
    for step in steps:
        mine = [e for e in spans if e["args"]["step"] == step]
        t0 = min(e["ts"] for e in mine)
        t1 = max(e["ts"] + e["dur"] for e in mine)
        busy = {}
        for e in mine:
            busy[e["tid"]] = busy.get(e["tid"], 0.0) + e["dur"]
        stages = [busy[t] for t in sorted(busy)]
        window = t1 - t0
        per_step.append({
            "window_ms": window / 1000.0,
            "bubble": [(window - b) / b for b in stages],
            "imbalance": max(stages) / statistics.mean(stages),
            "compute_ms": [b / 1000.0 for b in stages],
        })
    if not per_step:
        sys.exit("pipeline_trace.py: no forward/backward spans in " + path)
    med = lambda xs: statistics.median(xs)
    nst = len(per_step[0]["bubble"])
    print(json.dumps({
        "steps": len(per_step),
        "stages": [names.get(t, str(t)) for t in sorted({e["tid"] for e in spans})],
        "window_ms": round(med([s["window_ms"] for s in per_step]), 3),
        "compute_ms": [round(med([s["compute_ms"][i] for s in per_step]), 3) for i in range(nst)],
        "bubble": [round(med([s["bubble"][i] for s in per_step]), 4) for i in range(nst)],
        "bubble_mean": round(med([statistics.mean(s["bubble"]) for s in per_step]), 4),
        "imbalance": round(med([s["imbalance"] for s in per_step]), 4),
    }, separators=(",", ":")))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
