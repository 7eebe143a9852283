"""cocotb side of the loss experiment (see sim/experiments/loss.py).

For each loss rate in ``LOSS_RATES`` the link fault injectors of both directions drop that
fraction of frames (data and acknowledgements alike, seeded); ``LOSS_QPS`` QP pairs then
run a closed loop that keeps ``LOSS_DEPTH`` work requests outstanding per QP: RDMA WRITEs
of ``LOSS_SIZE`` bytes and, one in ten, a fetch-and-add of 1 on a counter of the pair.
Each work request's latency runs from its post to its completion being seen by the host.
Afterwards every work request must have completed exactly once, successfully, and every
counter must equal the number of adds. The measurements go to ``$RESULTS_FILE`` as JSON.
"""

import json
import os
import random
import time

import cocotb

from hw.config import preset
from hw.formats import WrOpcode, WcStatus
from sim.faults import LinkFaults
from sim.harness import TwoNodes, now_ns
from sim.verbs import SendWR, SendFlags

CFG = preset(os.environ.get("RNIC_PRESET", "small")).replace(
    host__kind=os.environ.get("RNIC_HOST", "python"))
COUNTER_OFF = 0xF000


@cocotb.test()
async def loss_sweep(dut):
    rates = [float(x) for x in os.environ.get("LOSS_RATES", "0,0.01").split(",")]
    ops = int(os.environ.get("LOSS_OPS", "400"))
    nq = int(os.environ.get("LOSS_QPS", "4"))
    depth = int(os.environ.get("LOSS_DEPTH", "4"))
    size = int(os.environ.get("LOSS_SIZE", "4096"))
    seed = int(os.environ.get("LOSS_SEED", "1"))
    timeout = int(os.environ.get("LOSS_TIMEOUT", "3"))     # 33 us, as loss.PARAMS
    rng = random.Random(seed)
    wall0 = time.perf_counter()
    sysm = await TwoNodes.start(dut, CFG, seed=seed)
    links = [LinkFaults(dut, d) for d in ("ab", "ba")]
    pairs = [await sysm.pair(buf_bytes=1 << 16, sq_depth=64, cq_depth=256, timeout=timeout,
                             retry_cnt=7, rnr_retry=7) for _ in range(nq)]
    for a, b in pairs:
        await sysm.b.write_mem(b["buf"] + COUNTER_OFF, bytes(8))
    adds = [0] * nq
    points = []
    for k, rate in enumerate(rates):
        for i, lf in enumerate(links):
            await lf.configure(seed=seed * 100 + 2 * k + i + 1, loss=rate)
        c0 = (await sysm.a.read_counters(), await sysm.b.read_counters())
        f0 = [lf.counters() for lf in links]
        lat_ns, done_ids, bad = [], [], []
        wr_base = k * 1_000_000

        async def worker(q):
            a, b = pairs[q]
            n = ops // nq
            posted = {}
            nxt = 0
            written = 0
            while nxt < n or posted:
                while nxt < n and len(posted) < depth:
                    wr_id = wr_base + q * 10_000 + nxt
                    if rng.random() < 0.1:
                        wr = SendWR(wr_id, WrOpcode.ATOMIC_FETCH_AND_ADD,
                                    (a["buf"] + 0x8000 + 8 * (nxt % 512), 8, a["mr"].lkey),
                                    b["buf"] + COUNTER_OFF, b["mr"].rkey, compare_add=1,
                                    send_flags=SendFlags.SIGNALED)
                        adds[q] += 1
                    else:
                        off = (nxt * size) % (0x8000 - size + 1)
                        wr = SendWR(wr_id, WrOpcode.RDMA_WRITE, (a["buf"], size, a["mr"].lkey),
                                    b["buf"] + off, b["mr"].rkey, send_flags=SendFlags.SIGNALED)
                    posted[wr_id] = (now_ns(), wr.opcode)
                    await a["qp"].post_send(wr)
                    nxt += 1
                for wc in await sysm.a.wait_completions(a["cq"], 1, 100_000_000):
                    if wc.wr_id not in posted or wc.status != WcStatus.SUCCESS:
                        bad.append((q, wc.wr_id, str(wc.status)))
                        continue
                    t_post, op = posted.pop(wc.wr_id)
                    lat_ns.append(now_ns() - t_post)
                    done_ids.append(wc.wr_id)
                    if op == WrOpcode.RDMA_WRITE:
                        written += size
            return written

        t0 = now_ns()
        tasks = [cocotb.start_soon(worker(q)) for q in range(nq)]
        written = 0
        for t in tasks:
            written += await t
        elapsed = now_ns() - t0
        counters_ok = all(sysm.b.mem.read_int(b["buf"] + COUNTER_OFF) == adds[q]
                          for q, (a, b) in enumerate(pairs))
        c1 = (await sysm.a.read_counters(), await sysm.b.read_counters())
        f1 = [lf.counters() for lf in links]

        def delta(name):
            return sum(c1[i][name] - c0[i][name] for i in range(2))

        expected = {wr_base + q * 10_000 + j for q in range(nq) for j in range(ops // nq)}
        exactly_once = (not bad and len(done_ids) == len(set(done_ids))
                        and set(done_ids) == expected and counters_ok)
        points.append({
            "loss": rate, "ops": len(done_ids), "elapsed_ns": elapsed, "bytes": written,
            "goodput_gbps": written * 8 / elapsed, "lat_ns": lat_ns,
            "exactly_once": exactly_once, "bad": bad[:10], "counters_ok": counters_ok,
            "frames_lost": sum(f1[i]["n_lost"] - f0[i]["n_lost"] for i in range(2)),
            "frames": sum(f1[i]["n_frames"] - f0[i]["n_frames"] for i in range(2)),
            "retransmits": delta("RETRANSMITS"), "timeouts": delta("ACK_TIMEOUTS"),
            "duplicates": delta("DUPLICATES"), "atomic_replays": delta("ATOMIC_REPLAYS"),
            "naks": delta("NAKS_RECEIVED"), "retry_exceeded": delta("RETRY_EXCEEDED"),
        })
        dut._log.info(f"loss {rate:.3%}: {len(done_ids)} WRs, goodput "
                      f"{points[-1]['goodput_gbps']:.2f} Gb/s, exactly once {exactly_once}")
    for lf in links:
        await lf.configure(seed=1)
    result = {"points": points, "cycles": sysm.cycles, "wall_s": time.perf_counter() - wall0,
              "qps": nq, "depth": depth, "size": size, "timeout": timeout}
    with open(os.environ["RESULTS_FILE"], "w") as f:
        json.dump(result, f)
