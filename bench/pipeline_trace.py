#!/usr/bin/env python3
"""The pipeline bubble from a pstrain Chrome trace (trainer --pipeline P --trace): for each
traced step, the window from its first forward to its last backward on any stage, and per
stage (device compute track) its compute time (forward and backward spans; the copies
between stages are not compute). The bubble of a stage is (window - compute) / compute,
the schedule formula's (P - 1) / M under equal stages; imbalance is the largest stage's
compute over the mean. Prints one JSON line: the medians over the traced steps.

With --exchange, instead: each stage's exchange with the pservers. A stage's send track
("reduce+push" spans, the block in args.index) says which blocks it pushes; the "rpc push"
track's spans (issue to answer, args.index the block) are then attributed to the stage
that sent them. Per traced step: the blocks each stage pushed, the time its pushes were in
flight (the union of their spans), and the time every stage had a push in flight at once
(the overlap: the stages exchanging concurrently, each its own blocks). Medians over the
steps.

usage: bench/pipeline_trace.py [--exchange] TRACE.json"""
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


def union(intervals):
    """The intervals merged: a sorted list of disjoint (start, end)."""
    out = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def intersect(xs, ys):
    """The intersection of two unions of intervals."""
    out, i, j = [], 0, 0
    while i < len(xs) and j < len(ys):
        a, b = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        if a < b:
            out.append((a, b))
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return out


def exchange(path):
    events = json.load(open(path))["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events
             if e.get("ph") == "M" and e["name"] == "thread_name"}
    sends = [e for e in events if e.get("ph") == "X" and e["name"] == "reduce+push"]
    tracks = sorted({e["tid"] for e in sends}, key=lambda t: names.get(t, str(t)))
    steps = sorted({e["args"]["step"] for e in sends})
    if not sends or len(tracks) < 2:
        sys.exit("pipeline_trace.py: no reduce+push spans on two stages in " + path)
    stage_of = {e["args"]["index"]: e["tid"] for e in sends}
    spans = [dict(e, tid=stage_of[e["args"]["index"]]) for e in events
             if e.get("ph") == "X" and e["name"] == "push" and e["args"]["index"] in stage_of]
    rows = []
    for step in steps:
        per = [union([(e["ts"], e["ts"] + e["dur"]) for e in spans
                      if e["tid"] == t and e["args"]["step"] == step]) for t in tracks]
        both = per[0]
        for u in per[1:]:
            both = intersect(both, u)
        rows.append({
            "blocks": [sum(1 for e in spans if e["tid"] == t and e["args"]["step"] == step)
                       for t in tracks],
            "in_flight_ms": [sum(b - a for a, b in u) / 1000.0 for u in per],
            "overlap_ms": sum(b - a for a, b in both) / 1000.0,
        })
    med = statistics.median
    n = len(tracks)
    print(json.dumps({
        "steps": len(rows),
        "stages": [names.get(t, str(t)) for t in tracks],
        "blocks": [med([r["blocks"][i] for r in rows]) for i in range(n)],
        "in_flight_ms": [round(med([r["in_flight_ms"][i] for r in rows]), 3) for i in range(n)],
        "overlap_ms": round(med([r["overlap_ms"] for r in rows]), 3),
    }, separators=(",", ":")))


if __name__ == "__main__":
    args = sys.argv[1:]
    if len(args) == 2 and args[0] == "--exchange":
        exchange(args[1])
    elif len(args) == 1:
        main(args[0])
    else:
        sys.exit(__doc__)
