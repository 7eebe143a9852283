"""cocotb side of ``make bench`` (see sim/bench.py).

``idle``: the two-node system with its host models attached, clock only, for BENCH_CYCLES.
``loaded``: a steady random load for BENCH_CYCLES: every QP pair keeps BENCH_WINDOW 8-byte
READs/WRITEs in flight (a new request is posted as soon as one completes), driven from
Python once per work request and once per completion. Each writes its figures to
``$RESULTS_FILE.<test>.json``.
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

CFG = preset(os.environ.get("RNIC_PRESET", "connectx6"))
CYCLES = int(os.environ.get("BENCH_CYCLES", "200000"))
PAIRS = int(os.environ.get("BENCH_PAIRS", "4"))
WINDOW = int(os.environ.get("BENCH_WINDOW", "8"))


def _save(name, cycles, wall, extra=None):
    with open(f"{os.environ['RESULTS_FILE']}.{name}.json", "w") as f:
        json.dump({"cycles": cycles, "wall_s": wall, "cycles_per_s": cycles / wall, **(extra or {})}, f)


@cocotb.test()
async def idle(dut):
    await TwoNodes.start(dut, CFG)
    period_ps = int(round(1e6 / CFG.nic.clock_mhz))
    t0 = time.perf_counter()
    await Timer(CYCLES * period_ps, "ps")
    _save("idle", CYCLES, time.perf_counter() - t0)


@cocotb.test()
async def loaded(dut):
    sysm = await TwoNodes.start(dut, CFG)
    pairs = [await sysm.pair(buf_bytes=1 << 16, sq_depth=64, cq_depth=256) for _ in range(PAIRS)]
    rng = random.Random(1)
    period_ns = 1000.0 / CFG.nic.clock_mhz
    stop_ns = now_ns() + CYCLES * period_ns
    done = 0

    def wr(i, a, b):
        off = rng.randrange(0, (1 << 16) - 8) & ~7
        op = WrOpcode.RDMA_READ if rng.random() < 0.5 else WrOpcode.RDMA_WRITE
        return SendWR(i, op, (a["buf"] + off, 8, a["mr"].lkey), b["buf"] + off, b["mr"].rkey)

    async def worker(a, b):
        nonlocal done
        for i in range(WINDOW):
            await a["qp"].post_send(wr(i, a, b))
        i = WINDOW
        while now_ns() < stop_ns:
            wcs = await sysm.a.wait_completions(a["cq"], 1)
            assert all(w.status == WcStatus.SUCCESS for w in wcs), wcs
            done += len(wcs)
            for _ in wcs:
                await a["qp"].post_send(wr(i, a, b))
                i += 1

    t0 = time.perf_counter()
    c0 = now_ns()
    tasks = [cocotb.start_soon(worker(a, b)) for a, b in pairs]
    for t in tasks:
        await t
    wall = time.perf_counter() - t0
    cycles = int((now_ns() - c0) / period_ns)
    _save("loaded", cycles, wall, {"ops": done, "mops": done / (now_ns() - c0) * 1e3})
