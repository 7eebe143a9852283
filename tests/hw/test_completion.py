"""Completion engine: CQE ring writes, owner bit per pass, CQ errors (overrun, failed CQE
write, CQ context that could not be read) with their event and the QPs they stop, CQ
doorbell and restart. The CQ contexts are answered request / response after a random
latency (tests/hw/lookup_model.py), as the CQ-context cache does.

A Python model of each CQ ring (producer/consumer index, error state) predicts every DMA
write, event and QP-error request; the DMA port model and the request sources apply random
back-pressure.
"""

import random
from dataclasses import replace

import pytest
from amaranth import Module
from amaranth.lib import wiring
from amaranth.sim import Simulator

from hw import formats, regmap
from hw.rnic.completion import Completion
from hw.config import NicConfig
from hw.interfaces import AsyncEventType
from sim.host import HostMemory
from tests.hw.dma_models import PortMemorySim, tick_until
from tests.hw.lookup_model import TableLookup

CFG = NicConfig(data_bytes=8, mtu=256, n_qps=4, n_mrs=4, n_cqs=4, max_outstanding=8)


class Bench(wiring.Component):
    """Completion engine plus a CQ context table behind a request / response port that
    answers after 1 .. 8 cycles (``bad``: CQs whose context read fails)."""

    def __init__(self, cfg, cqs, bad=(), latency=None, always_ready=False):
        self.dut = Completion(cfg)
        init = []
        for i in range(cfg.n_cqs):
            base, log = cqs.get(i, (0, 0))
            init.append({"base": base, "log_size": log})
        # one table per lookup port, each answering after its own random latency
        self.tables = [TableLookup(self.dut.cqn_bits, regmap.CQ_CTX, init, bad=bad,
                                   latency=latency, always_ready=always_ready)
                       for _ in range(cfg.cq_lookups)]
        super().__init__({})

    def elaborate(self, platform):
        m = Module()
        m.submodules.dut = self.dut
        for k, table in enumerate(self.tables):
            m.submodules[f"table{k}"] = table
            wiring.connect(m, self.dut.cq[k], table.port)
        return m


def cqe_fields(rng, i):
    return dict(wr_id=rng.getrandbits(64), status=rng.randrange(22), opcode=rng.choice([0, 1, 2, 128]),
                vendor_err=0, byte_len=rng.getrandbits(32), imm=rng.getrandbits(32),
                qpn=rng.randrange(4), src_qpn=i, flags=rng.choice([0, 1, 0x81]))


def run(cfg, seed, script, cqs, bp=0.3, fail=None, bad=(), latency=None, always_ready=False):
    """script: list of ("cqe", port, cqn, fields) / ("db", cqn, ci) / ("ev", cqn) / ("wait", n).
    Returns (writes [(addr, bytes)], stats, events [(type, index)], QPs sent to ERR); stats
    has the CQEs placed and dropped and the cycle of the last CQE placed (``last``)."""
    bench = Bench(cfg, cqs, bad, latency, always_ready)
    dut = bench.dut
    rng = random.Random(seed)
    mem = HostMemory()
    dma = PortMemorySim(cfg.data_bytes, mem=mem, seed=seed, lat=(2, 8), p_ready=1 - bp, fail=fail)
    stats = {"cqe": 0, "ovf": 0, "last": 0}
    events, killed = [], []

    async def driver(ctx):
        for item in script:
            if item[0] == "cqe":
                _, port, cqn, f = item
                s = dut.i0 if port == 0 else dut.i1
                while rng.random() < bp:
                    await ctx.tick()
                ctx.set(s.payload, {"cqn": cqn, "cqe": f})
                ctx.set(s.valid, 1)
                await tick_until(ctx, s.ready)
                ctx.set(s.valid, 0)
            elif item[0] == "wait":
                for _ in range(item[1]):
                    await ctx.tick()
            elif item[0] == "db":
                ctx.set(dut.cq_db.payload, {"cqn": item[1], "ci": item[2]})
                ctx.set(dut.cq_db.valid, 1)
                await ctx.tick()
                ctx.set(dut.cq_db.valid, 0)
            elif item[0] == "ev":
                ctx.set(dut.cq_event.payload.cqn, item[1])
                ctx.set(dut.cq_event.valid, 1)
                await ctx.tick()
                ctx.set(dut.cq_event.valid, 0)
        for _ in range(200):
            await ctx.tick()

    async def sinks(ctx):
        t = 0
        while True:
            t += 1
            re, rk = rng.random() > bp, rng.random() > bp
            ctx.set(dut.event.ready, re)
            ctx.set(dut.err_qp.ready, rk)
            _, _, sc, so, ev, ep, kv, kp = await ctx.tick().sample(
                dut.stat_cqe, dut.stat_overflow, dut.event.valid, dut.event.payload,
                dut.err_qp.valid, dut.err_qp.payload)
            stats["cqe"] += sc
            if sc:
                stats["last"] = t
            stats["ovf"] += so
            if ev and re:
                events.append((int(ep.type), int(ep.index)))
            if kv and rk:
                killed.append(int(kp.qpn))

    sim = Simulator(bench)
    sim.add_clock(1e-8)
    dma.clock(sim)
    dma.write_port(sim, dut.dma_wr)
    sim.add_testbench(sinks, background=True)
    sim.add_testbench(driver)
    sim.run()
    for name, a, n, t, ok, data in dma.writes:
        assert n == 32 and t == next(c for c, (b, lg) in cqs.items() if b <= a < b + (32 << lg))
    writes = [(a, data) for _, a, n, t, ok, data in dma.writes]
    return writes, stats, events, killed, dut


def model(script, cqs, fail=None):
    """Expected writes (attempted, in order), CQ_ERR events and QPs sent to ERR. A failed CQE
    write puts its CQ in error from the next completion on (the script waits long enough)."""
    pi, ci, bad = {}, {}, set()
    out, events, killed = [], [], []
    for item in script:
        if item[0] == "cqe":
            _, _, cqn, f = item
            base, log = cqs[cqn]
            p, c = pi.get(cqn, 0), ci.get(cqn, 0)
            if cqn in bad or (p - c) % 65536 == 1 << log:
                if cqn not in bad:
                    bad.add(cqn)
                    events.append((AsyncEventType.CQ_ERR, cqn))
                killed.append(f["qpn"])
                continue
            g = dict(f)
            g["flags"] = (f["flags"] & 0x7F) | ((((p >> log) & 1) ^ 1) << 7)
            a = base + (p % (1 << log)) * 32
            out.append((a, formats.pack(formats.CQE, **g)))
            pi[cqn] = (p + 1) % 65536
            if fail and fail(a, 32, True):
                bad.add(cqn)
                events.append((AsyncEventType.CQ_ERR, cqn))
        elif item[0] == "db":
            ci[item[1]] = item[2]
        elif item[0] == "ev":
            pi[item[1]] = ci[item[1]] = 0
            bad.discard(item[1])
    return out, events, killed


CQS = {0: (0x10000, 2), 1: (0x20000, 3), 2: (0x30000, 1), 3: (0x40000, 4)}


def make_script(rng, n=60):
    script = []
    ci = {c: 0 for c in CQS}
    pi = {c: 0 for c in CQS}
    for i in range(n):
        cqn = rng.randrange(4)
        script.append(("cqe", rng.randrange(2), cqn, cqe_fields(rng, i)))
        pi[cqn] += 1
        # the consumer keeps up most of the time, but not always (wait so the write landed)
        if rng.random() < 0.5:
            script.append(("wait", 40))
            ci[cqn] = min(pi[cqn], ci[cqn] + rng.randrange(1, 4))
            script.append(("db", cqn, ci[cqn] % 65536))
        if rng.random() < 0.08:                      # SET_CQ restarts a CQ
            script.append(("wait", 40))
            script.append(("ev", cqn))
            ci[cqn] = pi[cqn] = 0
    return script


def sequential(script, gap=30):
    out = []
    for item in script:
        out.append(item)
        if item[0] == "cqe":
            out.append(("wait", gap))
    return out


@pytest.mark.parametrize("bp", [0.0, 0.4])
def test_ring_wraps_owner_and_overrun(bp):
    rng = random.Random(7)
    # sequential (one request at a time, waits) so that the model's order is exact
    script = sequential(make_script(rng))
    writes, stats, events, killed, _ = run(CFG, 1, script, CQS, bp=bp)
    exp, exp_events, exp_killed = model(script, CQS)
    assert writes == exp
    assert stats["cqe"] == len(exp)
    assert stats["ovf"] == len(exp_killed) > 0
    assert events == exp_events and killed == exp_killed


def test_overrun_puts_the_cq_in_error_until_set_cq():
    """A full CQ: the completion is dropped, one CQ_ERR event, its QP to ERR; later
    completions for that CQ are dropped too even after the consumer made room (C11-37: no
    completion is added any more); SET_CQ restarts it."""
    cqs = {0: (0x1000, 1), 1: (0x2000, 1), 2: (0x3000, 1), 3: (0x4000, 1)}
    rng = random.Random(3)
    f = [cqe_fields(rng, i) for i in range(6)]
    script = sequential([("cqe", 0, 2, f[0]), ("cqe", 0, 2, f[1]), ("cqe", 0, 2, f[2]),
                         ("db", 2, 2), ("cqe", 1, 2, f[3]), ("cqe", 0, 1, f[4]),
                         ("ev", 2), ("cqe", 1, 2, f[5])])
    writes, stats, events, killed, _ = run(CFG, 2, script, cqs, bp=0.0)
    assert [a for a, _ in writes] == [0x3000, 0x3020, 0x2000, 0x3000]
    assert writes[3][1][31] & 0x80            # first pass again after SET_CQ
    assert events == [(AsyncEventType.CQ_ERR, 2)]
    assert killed == [f[2]["qpn"], f[3]["qpn"]]
    assert (stats["cqe"], stats["ovf"]) == (4, 2)


def test_failed_cqe_write_puts_the_cq_in_error():
    """The host refuses a CQE write: CQ_ERR, the next completions of that CQ are dropped and
    stop their QPs; other CQs go on."""
    rng = random.Random(11)
    fail = lambda a, n, w: w and a == 0x20000 + 32 * 2     # the third entry of CQ 1
    script = sequential([("cqe", rng.randrange(2), c, cqe_fields(rng, i))
                         for i, c in enumerate([1, 1, 1, 0, 1, 0, 1])], gap=40)
    writes, stats, events, killed, _ = run(CFG, 4, script, CQS, bp=0.2, fail=fail)
    exp, exp_events, exp_killed = model(script, CQS, fail=fail)
    assert writes == exp and events == exp_events == [(AsyncEventType.CQ_ERR, 1)]
    assert killed == exp_killed and len(killed) == 2


def test_cq_context_read_failure_puts_the_cq_in_error():
    """The CQ's context cannot be read from ICM (the cache's fill failed): the completion is
    dropped and counted, one CQ_ERR event, its QP to ERR, later completions of that CQ are
    dropped too; other CQs go on."""
    rng = random.Random(13)
    f = [cqe_fields(rng, i) for i in range(5)]
    script = sequential([("cqe", 0, 0, f[0]), ("cqe", 1, 2, f[1]), ("cqe", 0, 1, f[2]),
                         ("cqe", 0, 2, f[3]), ("cqe", 1, 0, f[4])])
    writes, stats, events, killed, _ = run(CFG, 6, script, CQS, bp=0.2, bad=(2,))
    assert [a for a, _ in writes] == [0x10000, 0x20000, 0x10020]
    assert events == [(AsyncEventType.CQ_ERR, 2)]
    assert killed == [f[1]["qpn"], f[3]["qpn"]]
    assert (stats["cqe"], stats["ovf"]) == (3, 2)


def test_concurrent_inputs_round_robin():
    """Both inputs always valid: the engine alternates between them."""
    cqs = {c: (0x10000 * (c + 1), 6) for c in range(4)}
    rng = random.Random(5)
    bench = Bench(CFG, cqs)
    dut = bench.dut
    mem = HostMemory()
    dma = PortMemorySim(8, mem=mem, seed=5, p_ready=0.7)

    async def src(ctx, port, n):
        s = dut.i0 if port == 0 else dut.i1
        for i in range(n):
            f = cqe_fields(rng, i)
            f["src_qpn"] = port * 100 + i
            ctx.set(s.payload, {"cqn": 0, "cqe": f})
            ctx.set(s.valid, 1)
            await tick_until(ctx, s.ready)
            ctx.set(s.valid, 0)

    async def src0(ctx):
        await src(ctx, 0, 6)

    async def src1(ctx):
        await src(ctx, 1, 6)

    async def main(ctx):
        while len(dma.writes) < 12:
            await ctx.tick()

    sim = Simulator(bench)
    sim.add_clock(1e-8)
    dma.clock(sim)
    dma.write_port(sim, dut.dma_wr)
    sim.add_testbench(src0, background=True)
    sim.add_testbench(src1, background=True)
    sim.add_testbench(main)
    sim.run()
    order = [formats.unpack(formats.CQE, d)["src_qpn"] for *_, d in dma.writes]
    assert sorted(order) == sorted([i for i in range(6)] + [100 + i for i in range(6)])
    assert order[:6] in ([0, 100, 1, 101, 2, 102], [100, 0, 101, 1, 102, 2])


@pytest.mark.parametrize("lookups", [1, 2, 3])
def test_back_to_back_in_request_order(lookups):
    """Requests back to back from both inputs (no waits), each lookup port answering after
    its own random latency: the CQEs are written in the order the requests were taken, each
    at its CQ's next entry with its owner bit, whatever order the answers come in."""
    cfg = replace(CFG, cq_lookups=lookups)
    rng = random.Random(20 + lookups)
    cqs = {c: (0x10000 * (c + 1), 6) for c in range(4)}
    script = [("cqe", rng.randrange(2), rng.randrange(4), cqe_fields(rng, i)) for i in range(80)]
    writes, stats, events, killed, _ = run(cfg, 8, script, cqs, bp=0.3)
    exp, _, _ = model(script, cqs)
    assert writes == exp and len(writes) == 80 and not events and not killed


def test_lookups_in_flight_overlap_their_latency():
    """Without back-pressure and with a fixed lookup latency, two lookup ports place CQEs
    faster than one: the second CQE's lookup is in flight while the first is written."""
    cfg = replace(CFG, data_bytes=64, cq_lookups=1)
    cqs = {c: (0x10000 * (c + 1), 6) for c in range(4)}
    rng = random.Random(4)
    script = [("cqe", 0, rng.randrange(4), cqe_fields(rng, i)) for i in range(40)]
    last = {}
    for k in (1, 2):
        writes, stats, *_ = run(replace(cfg, cq_lookups=k), 9, script, cqs, bp=0.0, latency=3)
        assert writes == model(script, cqs)[0]
        last[k] = stats["last"]
    assert last[2] < 0.8 * last[1], last


def test_one_cqe_per_cycle_with_lookups_enough():
    """A one-beat CQE (W >= 32) is written in the cycle it is checked: with four lookups in
    flight of a three-cycle lookup, 40 CQEs back to back are placed in about a cycle each
    (the back stage took two cycles per CQE before: more than 80)."""
    cfg = replace(CFG, data_bytes=64, cq_lookups=4)
    cqs = {c: (0x10000 * (c + 1), 6) for c in range(4)}
    rng = random.Random(5)
    script = [("cqe", 0, rng.randrange(4), cqe_fields(rng, i)) for i in range(40)]
    writes, stats, *_ = run(cfg, 9, script, cqs, bp=0.0, latency=3, always_ready=True)
    assert writes == model(script, cqs)[0]
    assert stats["last"] < 60, stats


def test_wide_datapath():
    cfg = NicConfig(data_bytes=64, mtu=256, n_qps=4, n_mrs=4, n_cqs=4, max_outstanding=8)
    rng = random.Random(9)
    script = sequential(make_script(rng, 20), gap=20)
    writes, stats, events, killed, dut = run(cfg, 3, script, CQS)
    exp, exp_events, _ = model(script, CQS)
    assert writes == exp and events == exp_events


def test_bad_cfg():
    with pytest.raises(ValueError, match="cfg must be a NicConfig"):
        Completion(8)
