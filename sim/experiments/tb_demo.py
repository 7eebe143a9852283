"""cocotb side of the demo experiment (see sim/experiments/demo.py).

Phase 1, latency: one QP, 8-byte RDMA READs posted one at a time; each round trip is
measured from the moment the host starts the doorbell write until the CQE is visible in
host memory (what ``ibv_post_send`` .. ``ibv_poll_cq`` sees).
Phase 2, throughput: every QP pair runs a batch-synchronous closed loop of 8-byte READs
(post ``depth`` requests, each with its own doorbell, then wait for all), as in the SMART
benchmark; phase 3 repeats it with a mix of READ, WRITE and fetch-and-add.
The measurements go to ``$RESULTS_FILE`` as JSON.
"""

import json
import os
import random
import time

import cocotb

from hw.config import preset
from hw.formats import WrOpcode, WcStatus
from sim.harness import TwoNodes, now_ns
from sim.verbs import SendWR

CFG = preset(os.environ.get("RNIC_PRESET", "connectx6")).replace(
    host__kind=os.environ.get("RNIC_HOST", "python"))


@cocotb.test()
async def demo(dut):
    ops = int(os.environ.get("DEMO_OPS", "2000"))
    qps = int(os.environ.get("DEMO_QPS", "12"))
    depth = int(os.environ.get("DEMO_DEPTH", "1"))
    rtt_samples = int(os.environ.get("DEMO_RTT_SAMPLES", "100"))
    rng = random.Random(int(os.environ.get("DEMO_SEED", "1")))
    wall0 = time.perf_counter()
    sysm = await TwoNodes.start(dut, CFG, pcap=os.environ.get("PCAP") or None)
    pairs = [await sysm.pair(buf_bytes=1 << 16, sq_depth=64, cq_depth=256) for _ in range(qps)]

    # Phase 1: unloaded READ round trip.
    a, b = pairs[0]
    rtts = []
    for i in range(rtt_samples):
        off = rng.randrange(0, (1 << 16) - 8) & ~7
        # the WQE goes into the send queue first (host CPU time, not timed: it takes none
        # in the Python host and a few cycles on the RTL host's CPU port), then the clock
        # starts with the doorbell (a BlueFlame write carrying the WQE)
        await a["qp"].post_send(SendWR(i, WrOpcode.RDMA_READ, (a["buf"] + off, 8, a["mr"].lkey),
                                       b["buf"] + off, b["mr"].rkey), ring=False)
        t0 = now_ns()
        await a["qp"].ring_sq()
        (wc,) = await sysm.a.wait_completions(a["cq"], 1)
        assert wc.status == WcStatus.SUCCESS, wc
        rtts.append(now_ns() - t0)

    # Phase 2: closed-loop 8-byte READs, `qps` QPs at `depth` (SMART Fig. 4a: 12 threads at
    # depth 1 give 5.1 Mops). Phase 3: the same loop with a mix of READ, WRITE and FAA.
    async def worker(a, b, n, mix):
        done = 0
        for base in range(0, n, depth):
            batch = min(depth, n - base)
            for j in range(batch):
                off = rng.randrange(0, (1 << 16) - 8) & ~7
                op = rng.choice(mix)
                await a["qp"].post_send(SendWR(base + j, op, (a["buf"] + off, 8, a["mr"].lkey),
                                               b["buf"] + off, b["mr"].rkey, compare_add=1))
            wcs = await sysm.a.wait_completions(a["cq"], batch)
            assert all(w.status == WcStatus.SUCCESS for w in wcs), wcs
            done += batch
        return done

    async def phase(mix):
        t_start = now_ns()
        per_qp = max(depth, ops // qps)
        tasks = [cocotb.start_soon(worker(a, b, per_qp, mix)) for a, b in pairs]
        done = 0
        for t in tasks:
            done += await t
        return done, now_ns() - t_start

    done, elapsed_ns = await phase([WrOpcode.RDMA_READ])
    mixed_done, mixed_ns = await phase([WrOpcode.RDMA_READ, WrOpcode.RDMA_WRITE,
                                        WrOpcode.ATOMIC_FETCH_AND_ADD])
    counters = {"a": await sysm.a.read_counters(), "b": await sysm.b.read_counters()}
    sysm.close()
    wall = time.perf_counter() - wall0
    result = {
        "rtt_ns": rtts,
        "throughput_ops": done,
        "throughput_ns": elapsed_ns,
        "mops": done / elapsed_ns * 1e3,
        "mixed_ops": mixed_done,
        "mixed_mops": mixed_done / mixed_ns * 1e3,
        "qps": qps,
        "depth": depth,
        "cycles": sysm.cycles,
        "wall_s": wall,
        "counters": counters,
        "pcap_frames": sum(m.frames for m in sysm.monitors),
    }
    with open(os.environ["RESULTS_FILE"], "w") as f:
        json.dump(result, f)
