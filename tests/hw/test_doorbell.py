"""Unit tests of the doorbell registers (hw/rnic/doorbell.py) and the counters (hw/rnic/counters.py)."""

import pytest
from amaranth.sim import Simulator

from hw.config import NicConfig
from hw.rnic.counters import Counters
from hw.rnic.doorbell import Doorbells
from hw.regmap import Reg, DOORBELL_BASE

from .mmio_bus import BehindDecoder, mmio_read, mmio_write

CFG = NicConfig(data_bytes=8, n_qps=8, n_cqs=4, n_mrs=4, n_doorbells=4)


def doorbells():
    """The doorbell block behind the NIC's bus decoder: the tests write the addresses of
    the register map (``top.bus``) and use the block's other ports (``dut``)."""
    dut = Doorbells(CFG)
    top = BehindDecoder(dut, CFG.n_doorbells, {"doorbells": dut.bus, "queue_doorbells": dut.qbus})
    return top, dut


def db_word(qpn, pi):
    return qpn | (pi << 32)


def test_doorbells_validate_binding_and_queue():
    top, dut = doorbells()
    binding = {0: 0, 1: 1, 2: 3, 3: 3}

    async def tb(ctx):
        got = []
        ctx.set(dut.sq_db.ready, 0)
        # Good rings: each QP on its own register.
        for qpn, pi in ((0, 1), (1, 5), (2, 7), (3, 2)):
            ctx.set(dut.bind.data, binding[qpn])
            ctx.set(top.bus.addr, DOORBELL_BASE + 8 * binding[qpn])
            ctx.set(top.bus.wdata, db_word(qpn, pi))
            ctx.set(top.bus.we, 1)
            assert ctx.get(dut.bind.index) == qpn
            assert ctx.get(dut.stat_ring) == 1 and ctx.get(dut.stat_reject) == 0
            await ctx.tick()
        # Wrong register, unknown QP: rejected.
        ctx.set(dut.bind.data, binding[1])
        ctx.set(top.bus.addr, DOORBELL_BASE + 8 * 2)
        ctx.set(top.bus.wdata, db_word(1, 9))
        assert ctx.get(dut.stat_reject) == 1
        await ctx.tick()
        ctx.set(top.bus.addr, DOORBELL_BASE + 8 * 0)
        ctx.set(top.bus.wdata, db_word(CFG.n_qps, 9))
        ctx.set(dut.bind.data, 0)
        assert ctx.get(dut.stat_reject) == 1
        await ctx.tick()
        # Beyond the last register: not a doorbell at all (outside every window).
        ctx.set(top.bus.addr, DOORBELL_BASE + 8 * CFG.n_doorbells)
        assert ctx.get(dut.stat_reject) == 0 and ctx.get(dut.stat_ring) == 0
        assert ctx.get(top.decoder.stat_unmapped) == 1
        await ctx.tick()
        ctx.set(top.bus.we, 0)
        # The register keeps the last value written.
        assert await mmio_read(ctx, top.bus, DOORBELL_BASE + 8 * 3) == db_word(3, 2)
        # Drain the events in order.
        ctx.set(dut.sq_db.ready, 1)
        while ctx.get(dut.sq_db.valid):
            p = ctx.get(dut.sq_db.payload)
            got.append((p.qpn, p.pi))
            await ctx.tick()
        assert got == [(0, 1), (1, 5), (2, 7), (3, 2)]

    sim = Simulator(top)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()


def test_doorbell_events_drain_exactly():
    """Rings of one QP while the consumer is slow: none is rejected; the events come out
    in order and the last one carries the last pi (a newer ring supersedes a pending one)."""
    top, dut = doorbells()

    async def tb(ctx):
        sent, got = [], []
        ctx.set(dut.bind.data, 1)
        for i in range(40):
            qpn, pi = 1, i
            ctx.set(top.bus.addr, DOORBELL_BASE + 8)
            ctx.set(top.bus.wdata, db_word(qpn, pi))
            ctx.set(top.bus.we, 1)
            ctx.set(dut.sq_db.ready, i % 3 == 0)
            assert ctx.get(dut.stat_ring) == 1 and ctx.get(dut.stat_reject) == 0
            sent.append((qpn, pi))
            if ctx.get(dut.sq_db.valid) and ctx.get(dut.sq_db.ready):
                p = ctx.get(dut.sq_db.payload)
                got.append((p.qpn, p.pi))
            await ctx.tick()
        ctx.set(top.bus.we, 0)
        ctx.set(dut.sq_db.ready, 1)
        for _ in range(40):
            if ctx.get(dut.sq_db.valid):
                p = ctx.get(dut.sq_db.payload)
                got.append((p.qpn, p.pi))
            await ctx.tick()
        assert got[-1] == sent[-1]
        assert len(got) < len(sent)               # rings were coalesced
        pis = [pi for _, pi in got]
        assert pis == sorted(set(pis)) and set(got) <= set(sent)

    sim = Simulator(top)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_doorbells_many_qps_random_backpressure(seed):
    """Random rings on every QP (each on its register) against random back-pressure on
    ``sq_db``, compared with a model: no ring is lost, each QP's events carry increasing
    producer indices taken from its rings, the last one its last ring, and the output is
    stable while not taken."""
    import random
    rng = random.Random(seed)
    top, dut = doorbells()
    binding = {q: q % CFG.n_doorbells for q in range(CFG.n_qps)}
    last_pi = {}
    rings = {q: set() for q in range(CFG.n_qps)}
    events = {q: [] for q in range(CFG.n_qps)}

    async def tb(ctx):
        held = None
        for cycle in range(1500):
            ring = cycle < 1200 and rng.random() < 0.6
            if ring:
                q = rng.randrange(CFG.n_qps)
                pi = (last_pi.get(q, 0) + rng.randrange(1, 4)) & 0xFFFF
                ctx.set(dut.bind.data, binding[q])
                ctx.set(top.bus.addr, DOORBELL_BASE + 8 * binding[q])
                ctx.set(top.bus.wdata, db_word(q, pi))
            ctx.set(top.bus.we, ring)
            ctx.set(dut.sq_db.ready, rng.random() < (0.1 if cycle < 1200 else 0.7))
            if ring:
                assert ctx.get(dut.stat_ring) == 1 and ctx.get(dut.stat_reject) == 0
                last_pi[q] = pi
                rings[q].add(pi)
            if ctx.get(dut.sq_db.valid):
                p = ctx.get(dut.sq_db.payload)
                if held is not None:
                    assert (p.qpn, p.pi) == held     # stream stability
                held = (p.qpn, p.pi)
                if ctx.get(dut.sq_db.ready):
                    events[p.qpn].append(p.pi)
                    held = None
            await ctx.tick()
        assert not ctx.get(dut.sq_db.valid)

    sim = Simulator(top)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()
    for q in range(CFG.n_qps):
        if q in last_pi:
            assert events[q] and events[q][-1] == last_pi[q], (q, events[q], last_pi[q])
        assert events[q] == sorted(set(events[q])), (q, events[q])
        assert set(events[q]) <= rings[q]


def test_rq_and_cq_doorbells():
    top, dut = doorbells()

    async def tb(ctx):
        ctx.set(dut.rq_db.ready, 0)
        ctx.set(dut.cq_db.ready, 0)
        await mmio_write(ctx, top.bus, Reg.RQ_DB, db_word(5, 77))
        await mmio_write(ctx, top.bus, Reg.CQ_DB, db_word(3, 12))
        await ctx.tick()        # the buffered FIFO shows an entry one cycle later
        assert ctx.get(dut.rq_db.valid) and ctx.get(dut.rq_db.payload.qpn) == 5
        assert ctx.get(dut.rq_db.payload.pi) == 77
        assert ctx.get(dut.cq_db.valid) and ctx.get(dut.cq_db.payload.cqn) == 3
        assert ctx.get(dut.cq_db.payload.ci) == 12

    sim = Simulator(top)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()


def test_counters():
    dut = Counters(5)     # alone: its bus addresses are relative to COUNTER_BASE

    async def tb(ctx):
        for i, v in enumerate((1, 0, 7, 3, 2)):
            ctx.set(dut.inc[i], v)
        for _ in range(10):
            await ctx.tick()
        for i in range(5):
            ctx.set(dut.inc[i], 0)
        await ctx.tick()
        vals = [await mmio_read(ctx, dut.bus, 8 * i) for i in range(5)]
        assert vals == [10, 0, 70, 30, 20]
        # beyond the last counter but inside the bus's address range: 0
        assert await mmio_read(ctx, dut.bus, 8 * 5) == 0

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()
    with pytest.raises(ValueError, match=r"n must be an integer in \[1, 256\], not 0"):
        Counters(0)


def test_blueflame_write_rings_and_hands_over_the_wqe():
    """A 64-byte BlueFlame write to register r is a ring of the QP the WQE names with
    pi = index + 1 (checked like an 8-byte ring); a good one also gives its WQE on sq_bf."""
    from hw import formats
    from hw.regmap import BLUEFLAME_BASE
    top, dut = doorbells()
    binding = {0: 0, 5: 2}

    def bf(ctx, reg, qpn, index, wr_id):
        w = int.from_bytes(formats.pack(formats.WQE, opcode=0, index=index, qpn=qpn,
                                        wr_id=wr_id), "little")
        ctx.set(dut.bf.payload, {"addr": BLUEFLAME_BASE + 64 * reg, "data": w})
        ctx.set(dut.bf.valid, 1)
        ctx.set(dut.bind.data, binding.get(qpn, 3))

    async def tb(ctx):
        ctx.set(dut.sq_db.ready, 0)
        assert ctx.get(dut.bf.ready)
        handed = []
        for reg, qpn, index, good in ((0, 0, 0, True), (2, 5, 41, True), (1, 5, 42, False),
                                      (CFG.n_doorbells, 0, 1, False), (2, CFG.n_qps, 0, False)):
            bf(ctx, reg, qpn, index, 1000 + index)
            assert ctx.get(dut.bind.index) == qpn % CFG.n_qps
            assert ctx.get(dut.stat_ring) == good and ctx.get(dut.stat_reject) == (not good)
            assert ctx.get(dut.sq_bf.valid) == good
            if good:
                p = ctx.get(dut.sq_bf.payload)
                handed.append((p.qpn, p.wqe.index, p.wqe.wr_id))
            await ctx.tick()
        ctx.set(dut.bf.valid, 0)
        assert handed == [(0, 0, 1000), (5, 41, 1041)]
        ctx.set(dut.sq_db.ready, 1)
        got = []
        while ctx.get(dut.sq_db.valid):
            p = ctx.get(dut.sq_db.payload)
            got.append((p.qpn, p.pi))
            await ctx.tick()
        assert got == [(0, 1), (5, 42)]

    sim = Simulator(top)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()
