#!/usr/bin/python3
"""call_cycles.py BUILD_DIR — no file of the product calls a file that calls it back.

Reads the product's static libraries with nm: each object (one source file) defines
symbols (T, D, B, R...) and uses others (U). File A depends on file B when A uses a symbol
B defines. Every strongly connected group of more than one file is a circle, printed as
one line. The device and op backend registries are the allowed exception: the registry
(device.c, ops.c, collectives.c) names its backends' tables and a backend calls the
registry's shared helpers (see DESIGN.md, "Layers of the code"). Exit 1 on any other
circle, 2 when a library is missing (build first)."""
import collections
import os
import subprocess
import sys

LIBS = ["libpst_base.a", "libpst_runtime.a", "libpst_nn.a", "libpst_data.a",
        "rpc/libpst_rpc.a", "pserver/libpst_pserver.a", "trainer/libpst_trainer.a"]
# Registry and backend files that may form a circle among themselves only.
REGISTRIES = [
    {"device.c.o", "device_cpu.c.o", "device_cuda.c.o", "cuda_check.c.o"},
    {"ops.c.o", "ops_cpu.c.o", "ops_cuda.cu.o"},
    {"collectives.c.o", "collectives_nccl.c.o", "device_cpu.c.o", "device_cuda.c.o"},
]


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else "build"
    defs, uses = {}, collections.defaultdict(set)
    for lib in LIBS:
        path = os.path.join(build, lib)
        if not os.path.exists(path):
            print("call_cycles: %s is missing (build first)" % path)
            return 2
        out = subprocess.run(["nm", "-A", path], capture_output=True, text=True, check=True)
        for line in out.stdout.splitlines():
            # lib.a:member.o:ADDR T name  or  lib.a:member.o:                 U name
            head, _, rest = line.rpartition(":")
            member = head.split(":")[-1]
            parts = rest.split()
            if len(parts) < 2:
                continue
            kind, name = parts[-2], parts[-1]
            node = "%s:%s" % (os.path.basename(lib), member)
            uses.setdefault(node, set())
            if kind == "U":
                uses[node].add(name)
            elif kind in "TDBRCGSVW":  # a global definition (lower case: file-local)
                defs.setdefault(name, node)
    graph = {n: {defs[s] for s in syms if s in defs and defs[s] != n} for n, syms in uses.items()}
    # Tarjan's strongly connected components
    index, low, stack, on, sccs, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            sccs.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    bad = 0
    for comp in sccs:
        if len(comp) < 2:
            continue
        if any({n.split(":")[1] for n in comp} <= reg for reg in REGISTRIES):
            print("call_cycles: allowed (a backend registry): %s" % " <-> ".join(comp))
            continue
        print("call_cycles: circle: %s" % " <-> ".join(comp))
        bad = 1
    if not bad:
        print("call_cycles: no file calls a file that calls it back (%d files)" % len(graph))
    return bad


if __name__ == "__main__":
    sys.exit(main())
