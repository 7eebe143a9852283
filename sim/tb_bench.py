"""cocotb side of ``make bench`` (see sim/bench.py).

Runs on a build with an in-simulation clock (``sim.verilator.InternalClock``, plain): no
Python runs per cycle unless a test awaits something that needs it.

``idle``: the two-node system with its hosts attached, reset, then one Timer of
BENCH_CYCLES cycles: the simulator alone, as cocotb drives it.
``loaded``: a steady load for BENCH_CYCLES: every one of BENCH_PAIRS QP pairs keeps
BENCH_WINDOW READs/WRITEs of BENCH_SIZE bytes in flight (a new one is posted as soon as one
completes), Python acting once per work request and once per completion (with the RTL host:
completions awaited on the CQE event line, host memory not mirrored). Each test writes
``$RESULTS_FILE.<test>.json``. BENCH_OP: ``mix`` (half READs, half WRITEs, the default),
``read`` or ``write`` (one kind only: the peak runs).
``burst``: the NIC's processing rate without the host CPU in the way (the peak): each of
BENCH_PAIRS QP pairs has BENCH_BURST work requests written into its send queue before the
clock starts; then every QP's doorbell is rung (one 8-byte doorbell each) and the time until
the NIC has written the last CQE into host memory is measured (the host CPU reads the CQEs
after that); BENCH_ROUNDS rounds. The closed loop of ``loaded`` is
bounded by the host model instead: the Python-driven CPU posts through one CPU port and one
MMIO port (a WQE write, a BlueFlame write and a CQ doorbell per work request, each a
mailbox transfer of at least a cycle), so its rate says how fast that host posts.
"""

import json
import os
import random
import time

import cocotb
from cocotb.triggers import Timer

from hw.config import preset
from hw.formats import WrOpcode, WcStatus
from sim.harness import TwoNodes, now_ns
from sim.verbs import SendWR

CFG = preset(os.environ.get("RNIC_PRESET", "connectx6")).replace(
    host__kind=os.environ.get("RNIC_HOST", "python"))
if os.environ.get("BENCH_N_QPS"):       # the build's n_qps, if not the preset's
    CFG = CFG.replace(nic__n_qps=int(os.environ["BENCH_N_QPS"]))
if os.environ.get("BENCH_PUS"):         # the build's processing units, if not the preset's
    CFG = CFG.replace(nic__n_pus=int(os.environ["BENCH_PUS"]))
CYCLES = int(os.environ.get("BENCH_CYCLES", "200000"))
PAIRS = int(os.environ.get("BENCH_PAIRS", "4"))
WINDOW = int(os.environ.get("BENCH_WINDOW", "8"))
SIZE = int(os.environ.get("BENCH_SIZE", "8"))
# "mix": half READs, half WRITEs (random); "read" / "write": one kind only (the peak runs)
OP = os.environ.get("BENCH_OP", "mix")
if OP not in ("mix", "read", "write"):
    raise ValueError(f"BENCH_OP must be 'mix', 'read' or 'write', not {OP!r}")
BUF = 1 << 16

# BENCH_SHARED=1: the QPs of a node share one protection domain and one memory region (as
# the threads of a SMART client do), so that more pairs than MR-table entries can run
SHARED = os.environ.get("BENCH_SHARED", "0") == "1"


def _save(name, cycles, wall, extra=None):
    with open(f"{os.environ['RESULTS_FILE']}.{name}.json", "w") as f:
        json.dump({"cycles": cycles, "wall_s": wall, "cycles_per_s": cycles / wall,
                   "host": CFG.host.kind, **(extra or {})}, f)


@cocotb.test()
async def idle(dut):
    await TwoNodes.start(dut, CFG, mirror=False)
    period_ps = int(round(1e6 / CFG.nic.clock_mhz))
    t0 = time.perf_counter()
    await Timer(CYCLES * period_ps, "ps")
    _save("idle", CYCLES, time.perf_counter() - t0)


# a hang ends the run (the waits for completions have no timer of their own)
@cocotb.test(timeout_time=int(4 * CYCLES * 1000 / CFG.nic.clock_mhz) + 1_000_000,
             timeout_unit="ns")
async def loaded(dut):
    sysm = await TwoNodes.start(dut, CFG, mirror=False)
    pairs = []
    # BENCH_SHARED (the peak: up to 62 pairs): one PD, buffer and MR per node for all pairs,
    # and rings no larger than the window needs, so that every pair's rings (each aligned to
    # 4 KB) fit the RTL host's memory (1 MB by default)
    depths = dict(cq_depth=4 * WINDOW, rq_depth=16) if SHARED else dict(cq_depth=256)
    for _ in range(PAIRS):
        share = pairs[0] if SHARED and pairs else None
        pairs.append(await sysm.pair(buf_bytes=BUF, sq_depth=64, share=share, **depths))
    rng = random.Random(1)
    period_ns = 1000.0 / CFG.nic.clock_mhz
    stop_ns = now_ns() + CYCLES * period_ns
    done = 0
    moved = 0

    def wr(i, a, b):
        off = rng.randrange(0, BUF - SIZE + 1) & ~7
        read = rng.random() < 0.5 if OP == "mix" else OP == "read"
        op = WrOpcode.RDMA_READ if read else WrOpcode.RDMA_WRITE
        return SendWR(i, op, (a["buf"] + off, SIZE, a["mr"].lkey), b["buf"] + off, b["mr"].rkey)

    async def worker(a, b):
        nonlocal done, moved
        await a["qp"].post_send([wr(i, a, b) for i in range(WINDOW)])
        i = WINDOW
        while now_ns() < stop_ns:
            wcs = await sysm.a.wait_completions(a["cq"], 1, None)
            assert all(w.status == WcStatus.SUCCESS for w in wcs), wcs
            done += len(wcs)
            moved += SIZE * len(wcs)
            await a["qp"].post_send([wr(i + k, a, b) for k in range(len(wcs))])
            i += len(wcs)

    t0 = time.perf_counter()
    c0 = now_ns()
    tasks = [cocotb.start_soon(worker(a, b)) for a, b in pairs]
    for t in tasks:
        await t
    wall = time.perf_counter() - t0
    sim_ns = now_ns() - c0
    cycles = int(sim_ns / period_ns)
    # the NICs' counters after the run (read over MMIO once the measurement is over): what
    # limited the rate (cache misses, retransmissions, back-pressure) can be read from them
    counters = {"a": await sysm.a.read_counters(), "b": await sysm.b.read_counters()}
    _save("loaded", cycles, wall, {"size": SIZE, "ops": done, "mops": done / sim_ns * 1e3,
                                   "gbps": moved * 8 / sim_ns, "counters": counters})


BURST = int(os.environ.get("BENCH_BURST", "64"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))


@cocotb.test(timeout_time=int(ROUNDS * BURST * PAIRS * 100 * 1000 / CFG.nic.clock_mhz)
             + 2_000_000, timeout_unit="ns")
async def burst(dut):
    sysm = await TwoNodes.start(dut, CFG, mirror=False)
    pairs = []
    for _ in range(PAIRS):
        share = pairs[0] if pairs else None
        pairs.append(await sysm.pair(buf_bytes=BUF, sq_depth=BURST, share=share,
                                     cq_depth=BURST, rq_depth=16))
    rng = random.Random(1)
    read = OP == "read"
    op = WrOpcode.RDMA_READ if read else WrOpcode.RDMA_WRITE
    done, sim_ns, wall, first = 0, 0.0, 0.0, 0
    c0 = None
    for r in range(ROUNDS):
        for a, b in pairs:           # written before the clock starts; nothing rung yet
            wrs = []
            for i in range(BURST):
                off = rng.randrange(0, BUF - SIZE + 1) & ~7
                wrs.append(SendWR(r * BURST + i, op, (a["buf"] + off, SIZE, a["mr"].lkey),
                                  b["buf"] + off, b["mr"].rkey))
            await a["qp"].post_send(wrs, ring=False)
        if r == 1:
            c0 = {"a": await sysm.a.read_counters(), "b": await sysm.b.read_counters()}

        # the round ends when the NIC has written the last CQE into host memory: the host
        # CPU reads the CQEs afterwards (a CQ holds the whole round), so that its one read per
        # CQE and one CQ doorbell per poll through its one port (sim/verbs.py poll_cq) do
        # not bound the rate measured
        marks = {a["cq"].cqn: sysm.a.cq_writes.get(a["cq"].cqn, 0) for a, _ in pairs}
        t = now_ns()
        w = time.perf_counter()
        tasks = [cocotb.start_soon(sysm.a.wait_cq_writes(a["cq"], marks[a["cq"].cqn] + BURST))
                 for a, _ in pairs]
        for a, _ in pairs:
            await a["qp"].ring_sq()
        t_end = t
        for task in tasks:
            t_end = max(t_end, await task)
        w_end = time.perf_counter()
        n = 0
        for a, _ in pairs:
            wcs = await sysm.a.wait_completions(a["cq"], BURST, None)
            assert all(wc.status == WcStatus.SUCCESS for wc in wcs), wcs
            n += len(wcs)
        if r == 0:
            first = n                # the first round warms the caches: not counted
            continue
        done += n
        sim_ns += t_end - t
        wall += w_end - w
    period_ns = 1000.0 / CFG.nic.clock_mhz
    c1 = {"a": await sysm.a.read_counters(), "b": await sysm.b.read_counters()}
    counters = {k: {n: c1[k][n] - c0[k][n] for n in c1[k]} for k in c1}
    _save("burst", int(sim_ns / period_ns), wall,
          {"size": SIZE, "op": OP, "ops": done, "warmup_ops": first,
           "mops": done / sim_ns * 1e3, "pairs": PAIRS, "burst": BURST, "rounds": ROUNDS,
           "counters": counters})
