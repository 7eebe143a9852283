"""Completion engine: CQE ring writes, owner bit per pass, full CQ drop, CQ doorbell and event.

A Python model of each CQ ring (producer/consumer index, overflow) predicts every DMA write;
the DMA sink and the two request sources apply random back-pressure.
"""

import random

import pytest
from amaranth import Module
from amaranth.lib import memory, wiring
from amaranth.sim import Simulator

from hw import formats, regmap
from hw.completion import Completion
from hw.config import NicConfig

CFG = NicConfig(data_bytes=8, mtu=256, n_qps=4, n_mrs=4, n_cqs=4, max_outstanding=8)


class Bench(wiring.Component):
    """Completion engine plus a CQ context table (asynchronous read port)."""

    def __init__(self, cfg, cqs):
        self.dut = Completion(cfg)
        init = []
        for i in range(cfg.n_cqs):
            base, log = cqs.get(i, (0, 0))
            init.append(int.from_bytes(formats.pack(regmap.CQ_CTX, base=base, log_size=log), "little"))
        self.table = memory.Memory(shape=regmap.CQ_CTX.size, depth=cfg.n_cqs, init=init)
        super().__init__({})

    def elaborate(self, platform):
        m = Module()
        m.submodules.dut = self.dut
        m.submodules.table = self.table
        rp = self.table.read_port(domain="comb")
        m.d.comb += [rp.addr.eq(self.dut.cq.index), self.dut.cq.data.eq(rp.data)]
        return m


def cqe_fields(rng, i):
    return dict(wr_id=rng.getrandbits(64), status=rng.randrange(22), opcode=rng.choice([0, 1, 2, 128]),
                vendor_err=0, byte_len=rng.getrandbits(32), imm=rng.getrandbits(32),
                qpn=rng.randrange(4), src_qpn=i, flags=rng.choice([0, 1, 0x81]))


def run(cfg, seed, script, cqs, bp=0.3):
    """script: list of ("cqe", port, cqn, fields) / ("db", cqn, ci) / ("ev", cqn) / ("wait", n)."""
    bench = Bench(cfg, cqs)
    dut = bench.dut
    rng = random.Random(seed)
    W = cfg.data_bytes
    writes = []          # (addr, bytes)
    stats = {"cqe": 0, "ovf": 0}
    n_cqe = sum(1 for s in script if s[0] == "cqe")
    done = {"sent": 0}

    async def driver(ctx):
        for item in script:
            if item[0] == "cqe":
                _, port, cqn, f = item
                s = dut.i0 if port == 0 else dut.i1
                while rng.random() < bp:
                    await ctx.tick()
                ctx.set(s.payload, {"cqn": cqn, "cqe": f})
                ctx.set(s.valid, 1)
                await ctx.tick().until(s.ready)
                ctx.set(s.valid, 0)
                done["sent"] += 1
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

    async def sink(ctx):
        cur = None
        while True:
            ctx.set(dut.dma_wr.ready, rng.random() > bp)
            _, _, v, r, p, sc, so = await ctx.tick().sample(
                dut.dma_wr.valid, dut.dma_wr.ready, dut.dma_wr.payload, dut.stat_cqe, dut.stat_overflow)
            stats["cqe"] += sc
            stats["ovf"] += so
            if v and r:
                if cur is None:
                    cur = [p.addr, p.len, b""]
                cur[2] += int(p.data).to_bytes(W, "little")[:p.nbytes]
                if p.last:
                    assert len(cur[2]) == cur[1] == 32
                    writes.append((cur[0], cur[2]))
                    cur = None

    sim = Simulator(bench)
    sim.add_clock(1e-8)
    sim.add_process(sink)
    sim.add_testbench(driver)
    sim.run()
    return writes, stats, dut


def model(script, cqs):
    pi, ci, ovf = {}, {}, set()
    out = []
    for item in script:
        if item[0] == "cqe":
            _, _, cqn, f = item
            base, log = cqs[cqn]
            p, c = pi.get(cqn, 0), ci.get(cqn, 0)
            if (p - c) % 65536 == 1 << log:
                ovf.add(cqn)
                continue
            g = dict(f)
            g["flags"] = (f["flags"] & 0x7F) | ((((p >> log) & 1) ^ 1) << 7)
            out.append((base + (p % (1 << log)) * 32, formats.pack(formats.CQE, **g)))
            pi[cqn] = (p + 1) % 65536
        elif item[0] == "db":
            ci[item[1]] = item[2]
        elif item[0] == "ev":
            pi[item[1]] = ci[item[1]] = 0
            ovf.discard(item[1])
    return out, ovf


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
    return script


@pytest.mark.parametrize("bp", [0.0, 0.4])
def test_ring_wraps_owner_and_overflow(bp):
    rng = random.Random(7)
    # sequential (one request at a time, waits) so that the model's order is exact
    script = []
    for item in make_script(rng):
        script.append(item)
        if item[0] == "cqe":
            script.append(("wait", 30))
    writes, stats, dut = run(CFG, 1, script, CQS, bp=bp)
    exp, ovf = model(script, CQS)
    assert writes == exp
    assert stats["cqe"] == len(exp)
    assert stats["ovf"] == sum(1 for s in script if s[0] == "cqe") - len(exp) > 0
    assert ovf


def test_overflow_flag_and_event():
    cqs = {0: (0x1000, 1), 1: (0x2000, 1), 2: (0x3000, 1), 3: (0x4000, 1)}
    rng = random.Random(3)
    script = [("cqe", 0, 2, cqe_fields(rng, i)) for i in range(3)] + [("wait", 40)]
    # run twice: before and after a CQ event that restarts the ring
    w1, s1, _ = run(CFG, 2, script, cqs, bp=0.0)
    assert [a for a, _ in w1] == [0x3000, 0x3020]
    assert s1 == {"cqe": 2, "ovf": 1}
    script2 = script + [("ev", 2), ("wait", 2)] + [("cqe", 1, 2, cqe_fields(rng, 9))] + [("wait", 40)]
    w2, s2, _ = run(CFG, 2, script2, cqs, bp=0.0)
    assert [a for a, _ in w2] == [0x3000, 0x3020, 0x3000]
    assert w2[2][1][31] & 0x80    # first pass again after the event
    exp, _ = model(script2, cqs)
    assert w2 == exp


def test_sticky_overflow_port():
    cqs = {c: (0x1000 * (c + 1), 1) for c in range(4)}
    rng = random.Random(4)
    bench = Bench(CFG, cqs)
    dut = bench.dut
    seen = []

    async def tb(ctx):
        ctx.set(dut.dma_wr.ready, 1)
        for i in range(3):
            ctx.set(dut.i1.payload, {"cqn": 3, "cqe": cqe_fields(rng, i)})
            ctx.set(dut.i1.valid, 1)
            await ctx.tick().until(dut.i1.ready)
            ctx.set(dut.i1.valid, 0)
            for _ in range(10):
                await ctx.tick()
        seen.append(ctx.get(dut.overflow))
        ctx.set(dut.cq_db.payload, {"cqn": 3, "ci": 2})
        ctx.set(dut.cq_db.valid, 1)
        await ctx.tick()
        ctx.set(dut.cq_db.valid, 0)
        seen.append(ctx.get(dut.overflow))      # sticky: the doorbell does not clear it
        ctx.set(dut.cq_event.payload.cqn, 3)
        ctx.set(dut.cq_event.valid, 1)
        await ctx.tick()
        ctx.set(dut.cq_event.valid, 0)
        seen.append(ctx.get(dut.overflow))

    sim = Simulator(bench)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()
    assert seen == [0b1000, 0b1000, 0]


def test_concurrent_inputs_round_robin():
    """Both inputs always valid: the engine alternates between them."""
    cqs = {c: (0x10000 * (c + 1), 6) for c in range(4)}
    rng = random.Random(5)
    bench = Bench(CFG, cqs)
    dut = bench.dut
    order = []

    async def src(ctx, port, n):
        s = dut.i0 if port == 0 else dut.i1
        for i in range(n):
            f = cqe_fields(rng, i)
            f["src_qpn"] = port * 100 + i
            ctx.set(s.payload, {"cqn": 0, "cqe": f})
            ctx.set(s.valid, 1)
            await ctx.tick().until(s.ready)
            ctx.set(s.valid, 0)

    async def sink(ctx):
        buf = b""
        while len(order) < 12:
            ctx.set(dut.dma_wr.ready, rng.random() > 0.3)
            _, _, v, r, p = await ctx.tick().sample(dut.dma_wr.valid, dut.dma_wr.ready, dut.dma_wr.payload)
            if v and r:
                buf += int(p.data).to_bytes(8, "little")
                if p.last:
                    order.append(formats.unpack(formats.CQE, buf)["src_qpn"])
                    buf = b""

    sim = Simulator(bench)
    sim.add_clock(1e-8)
    async def src0(ctx):
        await src(ctx, 0, 6)

    async def src1(ctx):
        await src(ctx, 1, 6)

    sim.add_testbench(src0, background=True)
    sim.add_testbench(src1, background=True)
    sim.add_testbench(sink)
    sim.run()
    assert sorted(order) == sorted([i for i in range(6)] + [100 + i for i in range(6)])
    assert order[:6] in ([0, 100, 1, 101, 2, 102], [100, 0, 101, 1, 102, 2])


def test_wide_datapath():
    cfg = NicConfig(data_bytes=64, mtu=256, n_qps=4, n_mrs=4, n_cqs=4, max_outstanding=8)
    rng = random.Random(9)
    script = []
    for item in make_script(rng, 20):
        script.append(item)
        if item[0] == "cqe":
            script.append(("wait", 20))
    writes, stats, _ = run(cfg, 3, script, CQS)
    exp, _ = model(script, CQS)
    assert writes == exp


def test_bad_cfg():
    with pytest.raises(ValueError, match="cfg must be a NicConfig"):
        Completion(8)
