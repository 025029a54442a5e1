#!/usr/bin/python3
"""costmodel.py — predicted step time of a synchronous data-parallel step over a network:
pstrain's parameter servers, a ring all-reduce (torch DDP over gloo), and the PyTorch RPC
parameter server (../shared/peers/torch_rpc_ps.py). No torch needed. docs/scaling.md
explains the formulas; the docstrings of the functions below are the reference.

  bench/costmodel.py --system pstrain --trainers T --pservers S --params P \\
      --precision fp32|bf16 --link-bps R [--block-bytes 4M] [--send-window auto] \\
      [--update-gbps U] [--compute-ms C] [--rtt-ms L] [--json]
  bench/costmodel.py --system pstrain_chain --trainers T --pservers S --params P [...]
  bench/costmodel.py --system ddp --trainers W --params P --link-bps R [...]
  bench/costmodel.py --system torch_rpc_ps --trainers T --params P --link-bps R [...]
  bench/costmodel.py --project [--params 100000000] [--update-gbps U]   (a markdown table)
  bench/costmodel.py --measure BUILD [--params 5000000] [--steps 30]     (JSON: constants)

Without --json it prints one number, the predicted step in milliseconds; with --json an
object with the terms. Rates: bits per second, as a number (1e9) or with tc's units
(kbit, mbit, gbit = 1e3, 1e6, 1e9; kibit, mibit, gibit = powers of 2). Sizes: bytes, with
K/M/G (powers of 2, as pstrain's --block-bytes).

Assumptions (all systems): links are full duplex; every host has one link of rate R in
each direction (tc tbf, or htb with --fair, in scripts/netlab); no latency unless
--rtt-ms (the lab has none: netem is absent); the protocol overhead (TCP/IP headers, gRPC
framing) is ignored, so a prediction is a lower bound by a few per cent; CPU time of the
network stack is not modelled: where the hosts share few cores (the lab: every host on the
same 2 cores) the measurement can be CPU-bound, which the bench's cpu_util column shows.

--measure runs BUILD's programs on 127.0.0.1 to get this machine's constants: the
trainer's compute time of the synthetic model (trainer alone, its time_split.compute_ms),
and the pserver's update rate (Prometheus histogram pstrain_pserver_update_seconds of a
1-pserver run with shared memory, so the network costs nothing: the sum of the trainers'
gradient rows and the SGD step, and the bf16 cast). It prints one JSON line:
{"compute_ns_per_param":..., "update_gbps":{"fp32":...,"bf16":...}, ...}.
"""
import argparse
import json
import math
import os
import re
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

# Defaults measured on the project machine (2 cores, AMD EPYC, KVM; 2026-11-25) with
# `bench/costmodel.py --measure build` (5M parameters); bench/scaling.sh measures its own.
# trainer --model synthetic: forward + backward per parameter. Since 16b152a it writes its
# fixed gradient once on one device, so only the step's bookkeeping is left: 0.022 on an
# "Intel(R) Xeon(R) Processor" (KVM, 2 vCPUs, OPENBLAS_CORETYPE unset; 2026-11-28),
# against 0.69 when it copied it every step.
COMPUTE_NS_PER_PARAM = 0.022
UPDATE_GBPS = {"fp32": 4.0, "bf16": 3.8}  # pserver: GB/s of f32 gradient rows summed + SGD
TORCH_ADD_GBPS = 4.0  # torch_rpc_ps's PS: acc.add_(grad) per trainer, then w.add_(acc)
DDP_COMPUTE_NS_PER_PARAM = 1.0  # torch_ddp.py: (w*x).sum(), backward, SGD step (3 passes)

ESIZE = {"fp32": 4, "bf16": 2, "fp16": 2}


def parse_rate(s):
    """bits/s from '1gbit', '250mbit', '1e9', '100Gbit' (tc's units)."""
    m = re.fullmatch(r"\s*([0-9.eE+-]+)\s*([kmgt]?i?)(bit|bps)?\s*", str(s), re.I)
    if not m:
        raise ValueError("rate '%s': expected bits/s like 1e9, 1gbit or 250mbit" % s)
    num = float(m.group(1))
    pre = m.group(2).lower()
    mult = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12,
            "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}[pre]
    if m.group(3) and m.group(3).lower() == "bps" and pre:
        mult *= 8  # tc: "mbps" is megabytes per second
    return num * mult


def parse_bytes(s):
    m = re.fullmatch(r"\s*([0-9.]+)\s*([kmg]?)i?b?\s*", str(s), re.I)
    if not m:
        raise ValueError("size '%s': expected bytes like 4M or 262144" % s)
    return int(float(m.group(1)) * {"": 1, "k": 2**10, "m": 2**20, "g": 2**30}[m.group(2).lower()])


PLAN_ROUNDS = 32           # trainer/plan.h TR_PLAN_ROUNDS: blocks per pserver, at least
PLAN_MIN_BLOCK = 256 << 10  # trainer/plan.h TR_PLAN_MIN_BLOCK: f32 bytes


def pipelined_block_bytes(params, block_bytes, pservers):
    """trainer/plan.c tr_plan_pipelined_bytes: with pservers, blocks of whole elements no
    larger than ceil(P/(32S)) elements, so every pserver gets 32 blocks, but not below
    256 KiB (nor above --block-bytes)."""
    rounds = PLAN_ROUNDS * pservers
    b = -(-params // rounds) * 4
    return min(block_bytes, max(b, PLAN_MIN_BLOCK))


def block_plan(params, block_bytes, pservers):
    """trainer/plan.c tr_plan_build with the pipelined block size: n = ceil(P / (bytes/4))
    blocks (at least S), rounded up to a multiple of S where every block keeps an element,
    of near-equal length, round robin (block i on pserver i mod S). Returns (n, elements
    per block (largest), elements per pserver, [(elements, pserver) per block])."""
    block_bytes = pipelined_block_bytes(params, block_bytes, pservers)
    max_elems = max(1, block_bytes // 4)
    n = -(-params // max_elems)
    n = max(n, min(pservers, params))
    whole = -(-n // pservers) * pservers
    if whole <= params:
        n = whole
    base, extra = divmod(params, n)
    load = [0] * pservers
    blocks = []
    for i in range(n):
        length = base + (1 if i < extra else 0)
        s = i % pservers
        load[s] += length
        blocks.append((length, s))
    return n, base + (1 if extra else 0), load, blocks


def send_window_bytes(send_window, pservers, largest_wire_block):
    """trainer/remote.c tr_remote_window: "auto" is one block per pserver, at least two;
    0 is no limit."""
    if send_window == "auto":
        return max(pservers, 2) * largest_wire_block
    return send_window


def _maxmin(flows, cap):
    """Max-min fair rates (progressive filling): flows is {id: (link, link)}, cap {link:
    bytes/s}. Returns {id: rate}."""
    rate, left, active = {}, dict(cap), set(flows)
    while active:
        users = {}
        for f in active:
            for ln in flows[f]:
                users.setdefault(ln, []).append(f)
        ln = min(users, key=lambda k: left[k] / len(users[k]))
        share = left[ln] / len(users[ln])
        for f in users[ln]:
            rate[f] = share
            active.discard(f)
            for l2 in flows[f]:
                left[l2] -= share
    return rate


def _capacities(trainers, pservers, R):
    """Every host's up and down link: R bytes/s each ("tu"/"td" trainer i, "pu"/"pd"
    pserver k)."""
    cap = {}
    for i in range(trainers):
        cap[("tu", i)] = cap[("td", i)] = R
    for k in range(pservers):
        cap[("pu", k)] = cap[("pd", k)] = R
    return cap


def _fluid(cap, remaining, size, links, moving, flow_done, updates, update_done, finished,
           now):
    """The event loop of the fluid simulations below. remaining: flow -> bytes left;
    moving() -> the flows that move now (a subset of remaining); links(f) -> its links; they
    share each link's capacity (cap) max-min fairly. Each event is a flow ending
    (flow_done(f, now), which may add flows and updates) or an update, (time, block) in
    updates, ending (update_done(block, now)); size(f) sets when a flow counts as ended.
    Runs from now until finished(); returns the time."""
    while not finished():
        flows = {f: links(f) for f in moving()}
        rates = _maxmin(flows, cap) if flows else {}
        dt_flow = min((remaining[f] / rates[f] for f in rates), default=math.inf)
        dt = min(dt_flow, min((u[0] for u in updates), default=math.inf) - now)
        if dt == math.inf:
            raise RuntimeError("simulation stalled")
        now += dt
        for f in list(remaining):
            remaining[f] -= rates.get(f, 0.0) * dt
            if remaining[f] <= 1e-6 * size(f):
                del remaining[f]
                flow_done(f, now)
        for u in [u for u in updates if u[0] <= now + 1e-12]:
            updates.remove(u)
            update_done(u[1], now)
    return now


def simulate(trainers, pservers, elems, owners, e, R, compute_s, upd_s_per_elem, window):
    """A fluid simulation of one pstrain step, for small jobs (the bench's cells).

    Every host has an up and a down link of R bytes/s, and the transfers sharing a link get
    max-min fair shares of it (TCP's fair share; HTTP/2 interleaves the streams of one
    connection). At compute_s each trainer starts pushing its blocks in block order, at
    most `window` bytes in flight (trainer/remote.c: one window per trainer, to all its
    pservers; a block always starts when none is in flight; 0: no limit). When all T
    trainers' pushes of block j arrived, its pserver updates it (one block at a time per
    pserver, T rows x elements x upd_s_per_elem) and then answers the T pulls of it at once
    (pulls are not windowed). The step ends when every trainer has every block.
    elems: elements per block; owners: the pserver of each block; e: wire bytes per
    element. Returns seconds."""
    T, S, n = trainers, pservers, len(elems)
    sizes = [x * e for x in elems]
    next_block = [0] * T   # the next block each trainer pushes
    inflight = [0] * T     # its push bytes in flight
    remaining = {}  # flow -> bytes left; flow = ("push", i, j) or ("pull", i, j)
    pushed = [0] * n
    cpu_free = [compute_s] * S
    updates = []  # (time done, block)
    done_pulls = 0

    def pump(i):
        while next_block[i] < n:
            j = next_block[i]
            if window and inflight[i] and inflight[i] + sizes[j] > window:
                return
            remaining[("push", i, j)] = sizes[j]
            inflight[i] += sizes[j]
            next_block[i] += 1

    def links(f):
        if f[0] == "push":
            return (("tu", f[1]), ("pd", owners[f[2]]))
        return (("pu", owners[f[2]]), ("td", f[1]))

    def flow_done(f, now):
        nonlocal done_pulls
        kind, i, j = f
        if kind == "pull":
            done_pulls += 1
            return
        inflight[i] -= sizes[j]
        pushed[j] += 1
        if pushed[j] == T:
            k = owners[j]
            cpu_free[k] = max(now, cpu_free[k]) + T * elems[j] * upd_s_per_elem
            updates.append((cpu_free[k], j))
        pump(i)

    def update_done(j, now):
        for i in range(T):
            remaining[("pull", i, j)] = sizes[j]

    for i in range(T):
        pump(i)
    return _fluid(_capacities(T, S, R), remaining, lambda f: sizes[f[2]], links,
                  lambda: remaining, flow_done, updates, update_done,
                  lambda: done_pulls == T * n, compute_s)


def pstrain(trainers, pservers, params, precision, link_bps, block_bytes=4 << 20,
            send_window="auto", update_gbps=None, compute_ms=None, rtt_ms=0.0,
            method="auto"):
    """pstrain, sync mode, T trainers and S pservers each on its own host.

    Bytes per step, each direction: a trainer pushes B = P*e (e = 4 fp32, 2 bf16) and pulls
    B; pserver s receives T*L_s*e and sends T*L_s*e (L_s: its parameters; the block plan
    gives the largest, L_max, which is P/S only when the blocks divide evenly). The busiest
    direction of the busiest link carries max(B, T*L_max*e): the link term
        D = max(B, T*L_max*e) / R.
    The blocks (trainer/plan.c): at most --block-bytes of f32, and small enough that every
    pserver gets 32 (but not below 256 KiB); consecutive blocks on different pservers.
    Pipelining (trainer/remote.c): a trainer pushes its blocks in order with at most
    `window` bytes in flight to all its pservers together (--send-window auto: one block
    per pserver, at least two), so rounds of g = window/wb blocks go at once, sharing its
    link; a block's pull is answered once all T trainers pushed it and its pserver updated
    it, and runs on the other direction of the same full-duplex links while later pushes
    still flow. So only the pipeline's tail adds to D: the last round's update and pulls,
    which start after the last push:
        step = C + max(D, U_total) + u_blk + tail + 2*RTT
        tail = max(g*wb, T*ceil(g/S)*wb) / R   (the last round's pulls: g*wb down each
               trainer's link, T*ceil(g/S)*wb up the busiest pserver's);  wb = P/n*e
        u_blk = T*b*4 / U   (one block's update: T f32 gradient rows summed + SGD)
        U_total = T*L_max*4 / U   (all of one pserver's updates: bounds the step when the
                                   pserver's CPU, not its link, is the bottleneck)
    That closed form is used for big jobs (--project). For the bench's cells (T*n <= 4000)
    the prediction is a fluid simulation of the same rules (simulate()), which also gets
    the cases where the bottleneck moves during a step.
    With --rtt-ms L, a trainer's window W bounds its rate to W/L: D is raised to B/(W/L)
    when that is larger (closed form only). C: the trainer's compute (the synthetic model:
    the gradient is made, then pushed; pushes that start during backward are ignored)."""
    e = ESIZE[precision]
    R = link_bps / 8.0  # bytes/s
    U = (update_gbps if update_gbps else UPDATE_GBPS.get(precision, 4.0)) * 1e9
    C = compute_ms if compute_ms is not None else COMPUTE_NS_PER_PARAM * params / 1e6
    n, blk, load, blocks = block_plan(params, block_bytes, pservers)
    lmax = max(load)
    B = params * e
    wb = blk * e
    W = send_window_bytes(send_window, pservers, wb)
    trainer_bytes = B
    pserver_bytes = trainers * lmax * e
    busiest = max(trainer_bytes, pserver_bytes)
    D = busiest / R
    if rtt_ms > 0 and W > 0:
        D = max(D, B / (W / (rtt_ms / 1e3)))
    g = n if W == 0 else min(n, max(1, W // wb))
    tail = max(g * wb, trainers * math.ceil(g / pservers) * wb) / R
    u_blk = trainers * blk * 4 / U
    u_total = trainers * lmax * 4 / U
    closed_s = C / 1e3 + max(D, u_total) + u_blk + tail + 2 * rtt_ms / 1e3
    r = {"system": "pstrain", "predicted_ms": closed_s * 1e3, "method": "closed form",
         "closed_form_ms": closed_s * 1e3, "compute_ms": C,
         "link_ms": D * 1e3, "update_total_ms": u_total * 1e3, "update_block_ms": u_blk * 1e3,
         "tail_ms": tail * 1e3, "rtt_ms": 2 * rtt_ms,
         "bottleneck": "pserver CPU" if u_total > D else
                       ("pserver link" if pserver_bytes > trainer_bytes else "trainer link"),
         "busiest_link_bytes": busiest, "blocks": n, "blocks_in_flight": g,
         "wire_block_bytes": wb, "send_window_bytes": W, "largest_shard_params": lmax}
    if method == "sim" or (method == "auto" and trainers * n <= 4000):
        sim_s = simulate(trainers, pservers, [b[0] for b in blocks], [b[1] for b in blocks],
                         e, R, C / 1e3, 4.0 / U, W) + 2 * rtt_ms / 1e3
        r.update(predicted_ms=sim_s * 1e3, method="simulation", simulation_ms=sim_s * 1e3)
    return r


def simulate_chain(trainers, pservers, elems, owners, e, R, compute_s, upd_s_per_elem,
                   window):
    """A fluid simulation of one pstrain step with PSTRAIN_CHAIN (trainer/chain.h), under
    simulate()'s rules (max-min fair shares of full-duplex links, windows per trainer).
    Trainer 0 sends block j's gradient (e bytes an element) to trainer 1 once its compute is
    over; trainer i >= 1 sends the sum so far (4 bytes an element) to trainer i+1, or the
    last to the block's pserver, once trainer i-1's sum of j has arrived, block order within
    its window. The pserver updates the block (one row) and sends its values (e bytes an
    element) to the last trainer, which passes them to trainer T-2, and so on down. The step
    ends when trainer 0 has every block. Unlike simulate(), the messages a trainer sends
    one way (its sums on, or its values down: one connection each) go one after the
    other, not sharing the link: a block arrives whole a block's time after it left, as
    the lab's chained runs show (ordered: 0.92-1.07 of the measured cells whose cores were
    not full; shared fairly, the fill of a long chain came out up to 1.2x too slow)."""
    T, S, n = trainers, pservers, len(elems)

    def size(kind, i, j):
        return elems[j] * (4 if kind == "sum" and i > 0 else e)

    def links(f):
        kind, i, j = f
        if kind == "sum":
            return (("tu", i), ("pd", owners[j]) if i == T - 1 else ("td", i + 1))
        return (("pu", owners[j]) if i == T - 1 else ("tu", i + 1), ("td", i))

    ready = [set(range(n))] + [set() for _ in range(T - 1)]  # sums each trainer may send
    inflight = [0.0] * T
    remaining = {}
    cpu_free = [compute_s] * S
    updates = []
    done = 0

    def pump(i):
        while ready[i]:
            j = min(ready[i])
            b = size("sum", i, j)
            if window and inflight[i] and inflight[i] + b > window:
                return
            ready[i].discard(j)
            remaining[("sum", i, j)] = b
            inflight[i] += b

    def moving():  # one connection's messages go in order (FIFO): the head of each
        head = {}
        for f in remaining:
            g = (f[0], f[1])
            if g not in head or f[2] < head[g][2]:
                head[g] = f
        return head.values()

    def flow_done(f, now):
        nonlocal done
        kind, i, j = f
        if kind == "val":
            if i > 0:
                remaining[("val", i - 1, j)] = size("val", i - 1, j)
            else:
                done += 1
            return
        inflight[i] -= size(kind, i, j)
        if i == T - 1:
            k = owners[j]
            cpu_free[k] = max(now, cpu_free[k]) + elems[j] * upd_s_per_elem
            updates.append((cpu_free[k], j))
        else:
            ready[i + 1].add(j)
            pump(i + 1)
        pump(i)

    def update_done(j, now):
        remaining[("val", T - 1, j)] = size("val", T - 1, j)

    for i in range(T):
        pump(i)
    return _fluid(_capacities(T, S, R), remaining, lambda f: size(*f), links, moving,
                  flow_done, updates, update_done, lambda: done == n, compute_s)


def pstrain_chain(trainers, pservers, params, precision, link_bps, block_bytes=4 << 20,
                  send_window="auto", update_gbps=None, compute_ms=None):
    """pstrain with PSTRAIN_CHAIN: trainers 0 -> 1 -> ... -> T-1 -> pservers, values back
    down the same way (simulate_chain). Bytes per step and direction: trainer k >= 1 sends
    the sum so far on (4P: f32) and the values down to trainer k-1 (eP), and receives as
    much (trainer 1 gets trainer 0's gradient in eP); trainer 0 sends and receives eP;
    pserver s receives 4*L_s and sends e*L_s. So the busiest link carries (4 + e)P
    whatever T and S: no link carries T of anything. Against pstrain without a chain
    (T*L_max*e on the busiest pserver link) it pays where T*e*L_max/P > 4 + e, about
    T/S > 2 in fp32 and T/S > 3 in bf16. Pipelining adds about two block times a hop
    (fill and drain), 2T hops; the simulation has them."""
    e = ESIZE[precision]
    R = link_bps / 8.0
    U = (update_gbps if update_gbps else UPDATE_GBPS.get(precision, 4.0)) * 1e9
    C = compute_ms if compute_ms is not None else COMPUTE_NS_PER_PARAM * params / 1e6
    n, blk, load, blocks = block_plan(params, block_bytes, pservers)
    T = trainers
    busiest = (4 + e) * params
    W = send_window_bytes(send_window, pservers, blk * 4)
    sim_s = simulate_chain(T, pservers, [b[0] for b in blocks], [b[1] for b in blocks], e, R,
                           C / 1e3, 4.0 / U, W)
    return {"system": "pstrain_chain", "predicted_ms": sim_s * 1e3, "method": "simulation",
            "compute_ms": C, "link_ms": busiest / R * 1e3, "bottleneck": "trainer links",
            "busiest_link_bytes": busiest, "blocks": n, "send_window_bytes": W}


def tree_broadcast(world, nbytes, R):
    """gloo's broadcast from rank 0, as traced on the lab (W = 2, 4, 8; per-interface byte
    counters every 10 ms): rank r sends to every r + 2^k < W with 2^k > r (0 -> 1, 2, 4;
    1 -> 3, 5; 2 -> 6; 3 -> 7), all of its sends at once, sharing its uplink evenly, and
    forwards only once it holds the whole buffer. Returns (seconds until the last rank has
    it, the most bytes any rank sends)."""
    done, most = [0.0] * world, 0.0
    for r in range(world):  # a parent's rank is below its children's
        kids = [r + (1 << k) for k in range(world.bit_length())
                if (1 << k) > r and r + (1 << k) < world]
        for c in kids:
            done[c] = done[r] + len(kids) * nbytes / R
        most = max(most, len(kids) * nbytes)
    return max(done), most


def ddp(world, params, link_bps, compute_ms=None, rtt_ms=0.0, precision="fp32",
        buffer_bytes=None):
    """torch_ddp.py: DDP over gloo. Each forward, DDP broadcasts the module's buffers from
    rank 0 (broadcast_buffers=True, its default; the peer's model registers its fixed
    input x as buffers, 4P bytes), a tree broadcast (tree_broadcast) that ends before
    backward starts; then the ring all-reduce of the gradient: every rank sends and
    receives 2(W-1)/W * 4P bytes (reduce-scatter then all-gather, W-1 chunk steps each),
    all links busy at once, so
        step = C + broadcast(buffers) + 2(W-1)/W * e*P / R + 2(W-1)*RTT
    (e = 4: the peer is fp32). The buckets (25 MB) overlap backward; the synthetic
    backward is cheap, so C (forward + backward + SGD) mostly adds. W = 1: no traffic.
    buffer_bytes 0 gives the ring alone, what a model without buffers (or DDP with
    broadcast_buffers=False) would take."""
    e = ESIZE[precision]
    R = link_bps / 8.0
    C = compute_ms if compute_ms is not None else DDP_COMPUTE_NS_PER_PARAM * params / 1e6
    buf = 4.0 * params if buffer_bytes is None else float(buffer_bytes)
    ring = 2.0 * (world - 1) / world * e * params
    bcast_s, bcast_most = tree_broadcast(world, buf, R)
    step_s = C / 1e3 + bcast_s + ring / R + 2 * (world - 1) * rtt_ms / 1e3
    return {"system": "torch_ddp", "predicted_ms": step_s * 1e3, "compute_ms": C,
            "broadcast_ms": bcast_s * 1e3, "ring_ms": ring / R * 1e3,
            "link_ms": (bcast_s + ring / R) * 1e3, "busiest_link_bytes": bcast_most + ring,
            "bottleneck": "rank 0's uplink (buffer broadcast), then every link (ring)"
            if world > 1 else "none (world 1: no traffic)"}


def torch_rpc_ps(trainers, params, link_bps, compute_ms=None, rtt_ms=0.0, add_gbps=None):
    """../shared/peers/torch_rpc_ps.py: each trainer rpc_sync's its whole fp32 gradient
    (4P bytes, one message, no blocks) to the one PS and waits; the PS adds it to its
    accumulator and, when the T-th arrives, applies w -= lr*acc and answers all T with w
    (4P each). So within a step the pushes and the answers do not overlap: the PS's link
    carries T*4P in, then T*4P out:
        step = C + T*4P/R + T*4P/R + (T+1)*4P/U_add + RTT
    C: the trainer computes nothing (a fixed gradient); default 0."""
    R = link_bps / 8.0
    A = (add_gbps or TORCH_ADD_GBPS) * 1e9
    C = compute_ms if compute_ms is not None else 0.0
    busiest = trainers * 4.0 * params
    upd = (trainers + 1) * 4.0 * params / A
    step_s = C / 1e3 + 2 * busiest / R + upd + rtt_ms / 1e3
    return {"system": "torch_rpc_ps", "predicted_ms": step_s * 1e3, "compute_ms": C,
            "link_ms": 2 * busiest / R * 1e3, "update_total_ms": upd * 1e3,
            "busiest_link_bytes": busiest, "bottleneck": "PS link (push then pull, serialized)"}


def byteps_opt(n, k, M, R):
    """BytePS (Jiang et al., OSDI'20, Theorem 1): n GPU machines, k CPU machines, all with
    bandwidth R bytes/s, model M bytes: t_opt = 2n(n-1)M / ((n^2 + kn - 2k) R), 0 <= k <= n.
    k = 0 is the ring all-reduce's 2(n-1)M/(nR); k = n the non-colocated PS's M/R."""
    k = min(k, n)
    return 2.0 * n * (n - 1) * M / ((n * n + k * n - 2 * k) * R)


# ---- --project ------------------------------------------------------------------------

def project(params, update_gbps, block_bytes, out=sys.stdout):
    """Communication time per step (compute 0) for big jobs: pstrain with S pservers (its
    block plan: 32 blocks per pserver, at most --block-bytes; its auto window) against the
    ring all-reduce and BytePS's optimum with k = S CPU machines."""
    w = out.write
    U = update_gbps or UPDATE_GBPS["fp32"]
    w("Projection: %dM parameters, communication only (compute 0). PS: pstrain's model "
      "(closed form: link term + pipeline tail) with pservers that sum at line rate; in "
      "brackets where the pserver's update rate (%.1f GB/s of f32 rows, this machine's) "
      "would bound it instead. Ring: 2(N-1)/N x e x P / R, same wire dtype. BytePS: "
      "2n(n-1)M/((n^2+kn-2k)R), k = S CPU machines, M = e x P (OSDI'20, Theorem 1).\n\n"
      % (params // 1000000, U))
    w("| trainers | link | wire | S | blocks | PS ms | ring ms | BytePS ms | PS / ring "
      "| machines (PS: T+S) |\n|---|---|---|---|---|---|---|---|---|---|\n")
    for T in (64, 256):
        for gbit in (25, 100):
            R = gbit * 1e9
            for prec in ("fp32", "bf16"):
                e = ESIZE[prec]
                ring = 2.0 * (T - 1) / T * e * params / (R / 8) * 1e3
                for label, S in (("1", 1), ("T/8", T // 8), ("T/4", T // 4), ("T/2", T // 2),
                                 ("T", T)):
                    r = pstrain(T, S, params, prec, R, block_bytes=block_bytes,
                                update_gbps=U, compute_ms=0.0, method="closed")
                    link_only = r["link_ms"] + r["tail_ms"]
                    ps = r["predicted_ms"]
                    cell = "%.0f" % link_only if ps <= link_only * 1.001 else \
                        "%.0f (%.0f)" % (link_only, ps)
                    bp = byteps_opt(T, S, e * params, R / 8) * 1e3
                    w("| %d | %d Gbit/s | %s | %s = %d | %d | %s | %.0f | %.0f | %.2f | %d |\n"
                      % (T, gbit, prec, label, S, r["blocks"], cell, ring, bp,
                         link_only / ring, T + S))
    w("\nPS / ring < 1: the PS is faster. A ring moves 2(N-1)/N x M each way on every "
      "link; a PS with S pservers moves max(M, T x M / S) on the busiest: equal at "
      "S = T^2 / (2(T-1)), about T/2; a PS needs more pservers than that to win, and "
      "S >= T to reach M (BytePS's k = n optimum).\n")


def _size_txt(n):
    for unit, k in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << k and n % (1 << k) == 0:
            return "%d %s" % (n >> k, unit)
    return "%d B" % n


# ---- --measure --------------------------------------------------------------------------

def _free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def _summary(text):
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            try:
                d = json.loads(line)
            except ValueError:
                continue
            if d.get("event") == "summary":
                return d
    raise RuntimeError("no summary line in the trainer's output")


def measure(build, params, steps, timeout=180):
    """The machine's constants: compute ns per parameter and the pserver's update GB/s."""
    bin_ = os.path.join(build, "bin")
    env = dict(os.environ, PSTRAIN_LOG_LEVEL="warn")
    for k in ("PSTRAIN_PSERVERS", "PSTRAIN_TRAINERS", "PSTRAIN_TRAINER_ID"):
        env.pop(k, None)
    common = ["--model", "synthetic", "--params", str(params), "--steps", str(steps),
              "--optimizer", "sgd", "--lr", "0.01", "--log-level", "warn"]
    out = {"params": params, "steps": steps}
    r = subprocess.run([os.path.join(bin_, "trainer")] + common, env=env, timeout=timeout,
                       capture_output=True, text=True, check=True)
    s = _summary(r.stdout)
    out["compute_ms"] = s["time_split"]["compute_ms"]
    out["alone_step_ms"] = s["step_ms_median"]
    out["compute_ns_per_param"] = round(s["time_split"]["compute_ms"] * 1e6 / params, 4)
    out["update_gbps"] = {}
    out["update_ms_per_step"] = {}
    for prec in ("fp32", "bf16"):
        rates = []
        for T in (1, 2):
            port, mport = _free_port(), _free_port()
            ps = subprocess.Popen([os.path.join(bin_, "pserver"), "--port", str(port),
                                   "--metrics-port", str(mport), "--bind", "127.0.0.1",
                                   "--shm", "auto", "--log-level", "warn"], env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            trs = []
            try:
                for i in range(T):
                    e2 = dict(env, PSTRAIN_PSERVERS="127.0.0.1:%d" % port,
                              PSTRAIN_TRAINERS=str(T), PSTRAIN_TRAINER_ID=str(i),
                              PSTRAIN_SHM="auto")
                    trs.append(subprocess.Popen([os.path.join(bin_, "trainer")] + common +
                                                ["--precision", prec], env=e2,
                                                stdout=subprocess.DEVNULL,
                                                stderr=subprocess.DEVNULL))
                last = None
                t_end = time.time() + timeout
                while time.time() < t_end:
                    try:
                        last = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % mport,
                                                      timeout=2).read().decode()
                    except OSError:
                        if ps.poll() is not None:
                            break
                    if all(t.poll() is not None for t in trs) and last:
                        break
                    time.sleep(0.1)
                for t in trs:
                    t.wait(timeout=timeout)
            finally:
                for t in trs:
                    if t.poll() is None:
                        t.kill()
                try:
                    ps.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    ps.kill()
            vals = {}
            for line in (last or "").splitlines():
                m = re.match(r"pstrain_pserver_(update_seconds_sum|update_seconds_count|blocks)"
                             r"\s+(\S+)", line)
                if m:
                    vals[m.group(1)] = float(m.group(2))
            if not vals.get("update_seconds_count") or not vals.get("blocks"):
                raise RuntimeError("no pstrain_pserver_update_seconds from the pserver")
            # The last scrape may miss the last steps: count them by the blocks updated.
            steps_seen = vals["update_seconds_count"] / vals["blocks"]
            per_step = vals["update_seconds_sum"] / steps_seen
            rates.append(T * params * 4 / per_step / 1e9)
            out["update_ms_per_step"]["%s_T%d" % (prec, T)] = round(per_step * 1e3, 3)
        out["update_gbps"][prec] = round(statistics.mean(rates), 3)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.split("\n")[2:]))
    ap.add_argument("--system", choices=["pstrain", "pstrain_chain", "ddp", "torch_ddp",
                                         "torch_rpc_ps"])
    ap.add_argument("--trainers", type=int)
    ap.add_argument("--pservers", type=int, default=1)
    ap.add_argument("--params", type=int)
    ap.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="fp32")
    ap.add_argument("--link-bps", type=parse_rate, help="link rate, bits/s (1e9, 1gbit)")
    ap.add_argument("--block-bytes", type=parse_bytes, default=4 << 20)
    ap.add_argument("--send-window", type=lambda v: v if v == "auto" else parse_bytes(v),
                    default="auto", help="trainer's push window: auto (one block per "
                    "pserver, at least 2), bytes, or 0 (no limit)")
    ap.add_argument("--update-gbps", type=float, default=None,
                    help="pserver update rate, GB/s of f32 gradient rows (default: measured "
                         "here: fp32 %.1f, bf16 %.1f)" % (UPDATE_GBPS["fp32"], UPDATE_GBPS["bf16"]))
    ap.add_argument("--compute-ms", type=float, default=None,
                    help="trainer compute per step (default: %.2f ns per parameter)"
                         % COMPUTE_NS_PER_PARAM)
    ap.add_argument("--rtt-ms", type=float, default=0.0)
    ap.add_argument("--buffer-bytes", type=parse_bytes, default=None,
                    help="ddp: bytes of module buffers DDP broadcasts from rank 0 each step "
                         "(default 4 x params, as torch_ddp.py; 0: the ring alone)")
    ap.add_argument("--method", choices=["auto", "sim", "closed"], default="auto",
                    help="pstrain: fluid simulation or closed form (auto: simulation when "
                         "trainers x blocks <= 4000)")
    ap.add_argument("--json", action="store_true", help="print the terms as JSON")
    ap.add_argument("--project", action="store_true", help="the projection table (markdown)")
    ap.add_argument("--measure", metavar="BUILD", help="measure this machine's constants")
    ap.add_argument("--steps", type=int, default=30, help="--measure: steps per run")
    a = ap.parse_args()
    try:
        if a.measure:
            print(json.dumps(measure(a.measure, a.params or 5_000_000, a.steps)))
            return 0
        if a.project:
            project(a.params or 100_000_000, a.update_gbps, a.block_bytes)
            return 0
        if not (a.system and a.trainers and a.params and a.link_bps):
            ap.error("give --system, --trainers, --params and --link-bps (or --project, "
                     "or --measure BUILD)")
        if a.trainers < 1 or a.pservers < 1 or a.params < 1 or a.link_bps <= 0:
            ap.error("--trainers, --pservers, --params and --link-bps must be positive")
        if a.system == "pstrain":
            r = pstrain(a.trainers, a.pservers, a.params, a.precision, a.link_bps,
                        a.block_bytes, a.send_window, a.update_gbps, a.compute_ms, a.rtt_ms,
                        a.method)
        elif a.system == "pstrain_chain":
            r = pstrain_chain(a.trainers, a.pservers, a.params, a.precision, a.link_bps,
                              a.block_bytes, a.send_window, a.update_gbps, a.compute_ms)
        elif a.system in ("ddp", "torch_ddp"):
            r = ddp(a.trainers, a.params, a.link_bps, a.compute_ms, a.rtt_ms, a.precision,
                    a.buffer_bytes)
        else:
            r = torch_rpc_ps(a.trainers, a.params, a.link_bps, a.compute_ms, a.rtt_ms)
    except (ValueError, RuntimeError, subprocess.SubprocessError, OSError) as e:
        print("costmodel: %s" % e, file=sys.stderr)
        return 2
    if a.json:
        print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v)
                          for k, v in r.items()}))
    else:
        print("%.3f" % r["predicted_ms"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
