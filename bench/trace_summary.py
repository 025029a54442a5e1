#!/usr/bin/env python3
"""Summarizes a pstrain Chrome trace (trainer --trace) for the overlap bench: for each
traced step that has a next traced step, when backward ran, how many pushes started
during backward, when the next step's first forward started, and how many pulls were
still in flight then (forward starting before the last pull returns). Times in ms from
the step's first forward. Prints one JSON line per step.

usage: bench/trace_summary.py TRACE.json"""
import json
import sys


def main(path):
    events = json.load(open(path))["traceEvents"]
    spans = [e for e in events if e.get("ph") == "X"]

    def of(name, step):
        return [e for e in spans if e["name"] == name and e["args"]["step"] == step]

    steps = sorted({e["args"]["step"] for e in spans})
    for step in steps:
        fwd, nxt = of("forward", step), of("forward", step + 1)
        bwd, push, pull = of("backward", step), of("push", step), of("pull", step)
        if not (fwd and nxt and bwd and push and pull):
            continue
        t0 = min(e["ts"] for e in fwd)
        ms = lambda t: round((t - t0) / 1000.0, 1)
        end = lambda e: e["ts"] + e["dur"]
        bwd_end = max(end(e) for e in bwd)
        next_fwd = min(e["ts"] for e in nxt)
        last_pull = max(end(e) for e in pull)
        print(json.dumps({
            "step": step,
            "backward_ms": [ms(min(e["ts"] for e in bwd)), ms(bwd_end)],
            "first_push_ms": ms(min(e["ts"] for e in push)),
            "pushes_started_during_backward": sum(e["ts"] < bwd_end for e in push),
            "pushes": len(push),
            "next_forward_ms": ms(next_fwd),
            "last_pull_returns_ms": ms(last_pull),
            "pulls_in_flight_at_next_forward": sum(end(e) > next_fwd for e in pull),
            "forward_before_last_pull": next_fwd < last_pull,
        }))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
