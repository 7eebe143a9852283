"""Shared building blocks of hw/lib: write gate, wide FIFO, shaper, delay line, checks."""

import random

import pytest
from amaranth.lib import data
from amaranth.sim import Simulator

from hw.lib.checks import check_int, check_number, check_pow2
from hw.lib.delay import DelayLine
from hw.lib.shaper import Shaper
from hw.lib.wide_fifo import WideFifo
from hw.lib.write_gate import WriteGate

from .port_drivers import WriteHost, offer

ITEM = data.StructLayout({"n": 12})


def run_gate(events, *, seed=0, p_ready=0.7, n_cycles=3000, cam=4, clear_all=True):
    """``events``: list of ("w", key, fail) a client write, ("i", key, n) an item. Writes are
    answered in order after a random delay. Returns [(n, key, err, cycle)] and the cycle each
    write was answered."""
    dut = WriteGate(ITEM, 4, depth=16, cam=cam)
    rng = random.Random(seed)
    out = []
    host = WriteHost(dut.done, rng, max_delay=30)

    async def drive(ctx):
        for ev in events:
            if ev[0] == "w":
                await host.write(ctx, dut.wr_issued, ev[1], ev[2])
            else:
                await offer(ctx, dut.i, {"item": {"n": ev[2]}, "key": ev[1]})
            for _ in range(rng.randint(0, 3)):
                await ctx.tick()

    async def sink(ctx):
        for _ in range(n_cycles):
            r = rng.random() < p_ready
            ctx.set(dut.o.ready, r)
            ctx.set(dut.clear, clear_all)
            _, _, v, p = await ctx.tick().sample(dut.o.valid, dut.o.payload)
            if v and r:
                out.append((int(p.item.n), int(p.key), int(p.err), host.cycle))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(drive, background=True)
    sim.add_testbench(host.run, background=True)
    sim.add_testbench(sink)
    sim.run()
    return out, host.answered


def test_write_gate_against_model():
    """Items leave in order, never before the writes issued before them are answered, and an
    item carries err exactly when a write of its key issued before it failed and no earlier
    item of that key took the error already."""
    rng = random.Random(3)
    events = []
    for k in range(120):
        if rng.random() < 0.5:
            events.append(("w", rng.randrange(3), rng.random() < 0.15))
        else:
            events.append(("i", rng.randrange(3), k))
    out, answered = run_gate(events, seed=3, n_cycles=4000)
    items = [e for e in events if e[0] == "i"]
    assert [o[0] for o in out] == [e[2] for e in items]
    # model
    issued = 0
    failed = []                       # (key, write number), not yet taken
    expect = []
    for e in events:
        if e[0] == "w":
            issued += 1
            if e[2]:
                failed.append((e[1], issued))
        else:
            hits = [f for f in failed if f[0] == e[1] and f[1] <= issued]
            expect.append((e[2], e[1], int(bool(hits)), issued))
            for f in hits:
                failed.remove(f)
    for (n, key, err, cyc), (en, ekey, eerr, need) in zip(out, expect):
        assert (n, key, err) == (en, ekey, eerr)
        if need:
            assert cyc > answered[need - 1], f"item {n} left before write {need} was answered"
    assert sum(o[2] for o in out) > 3


def test_write_gate_keeps_error_until_cleared():
    """Without ``clear`` the record stays: every later item of the key carries err."""
    events = [("w", 1, True), ("i", 1, 0), ("i", 2, 1), ("i", 1, 2)]
    out, _ = run_gate(events, clear_all=False, n_cycles=300)
    assert [(n, e) for n, _, e, _ in out] == [(0, 1), (1, 0), (2, 1)]


def test_write_gate_table_full_is_counted():
    dut = WriteGate(ITEM, 4, depth=4, cam=2)
    lost = []

    async def tb(ctx):
        for k in range(3):
            ctx.set(dut.done.payload, {"tag": k, "err": 1})
            ctx.set(dut.done.valid, 1)
            _, _, l = await ctx.tick().sample(dut.stat_lost)
            lost.append(l)
        ctx.set(dut.done.valid, 0)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()
    assert lost == [0, 0, 1]


def test_wide_fifo():
    """A 5000-bit FIFO keeps order and data under random push/pop."""
    dut = WideFifo(5000, 8)
    rng = random.Random(1)
    vals = [rng.getrandbits(5000) for _ in range(60)]
    got = []

    async def tb(ctx):
        i = 0
        for _ in range(400):
            push = i < len(vals) and rng.random() < 0.6
            pop = rng.random() < 0.5
            ctx.set(dut.w_en, push)
            if push:
                ctx.set(dut.w_data, vals[i])
            ctx.set(dut.r_en, pop)
            _, _, wr, rr, rd = await ctx.tick().sample(dut.w_rdy, dut.r_rdy, dut.r_data)
            if push and wr:
                i += 1
            if pop and rr:
                got.append(rd)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()
    assert got == vals[:len(got)] and len(got) > 30


def test_shaper_and_delay_params():
    with pytest.raises(ValueError, match=r"max_cost must be an integer in \[1, 65535\], not 0"):
        Shaper(8, 1.0, 0)
    with pytest.raises(ValueError, match=r"rate must be a number in \[0.0009765625, 4096.0\], not 0"):
        Shaper(8, 0, 8)
    with pytest.raises(ValueError, match=r"depth must be a power of two in \[2, 65536\], not 3"):
        DelayLine(8, 4, 3)
    with pytest.raises(ValueError, match=r"key_bits must be an integer in \[1, 16\], not 0"):
        WriteGate(ITEM, 0)
    with pytest.raises(ValueError, match=r"width must be an integer in \[1, 1048576\], not 0"):
        WideFifo(0, 4)


def test_checks():
    check_int("x", 3, 1, 4)
    check_pow2("x", 8, 1, 16)
    check_number("x", 0.5, 0, 1)
    for fn, v in ((check_int, True), (check_int, 5), (check_pow2, 6), (check_number, "a")):
        with pytest.raises(ValueError, match=r"^x must be"):
            fn("x", v, 1, 4)


def test_seq_mailboxes():
    """SeqIn -> SeqOut: every item arrives once, in order, whatever the delays on either side;
    with a testbench answering at once, one item per cycle."""
    from amaranth.hdl import Module
    from amaranth.lib import wiring as w
    from hw.lib.seq_port import SeqIn, SeqOut

    class Top(w.Component):
        def __init__(self):
            self.a, self.b = SeqIn(ITEM), SeqOut(ITEM)
            super().__init__({})

        def elaborate(self, platform):
            m = Module()
            m.submodules.a, m.submodules.b = self.a, self.b
            w.connect(m, self.a.o, self.b.i)
            return m

    for delays, n in ((True, 40), (False, 40)):
        top = Top()
        rng = random.Random(2)
        got, cycles = [], {"n": 0}

        async def src(ctx):
            for k in range(n):
                while ctx.get(top.a.taken) != k & 0xFFFF:
                    await ctx.tick()
                while delays and rng.random() < 0.5:
                    await ctx.tick()
                ctx.set(top.a.data, {"n": k})
                ctx.set(top.a.seq, (k + 1) & 0xFFFF)
                await ctx.tick()

        async def dst(ctx):
            ack = 0
            while len(got) < n:
                await ctx.tick()
                cycles["n"] += 1
                if ctx.get(top.b.seq) != ack and not (delays and rng.random() < 0.5):
                    got.append(int(ctx.get(top.b.data).n))
                    ack = (ack + 1) & 0xFFFF
                    ctx.set(top.b.ack, ack)

        sim = Simulator(top)
        sim.add_clock(1e-8)
        sim.add_testbench(src, background=True)
        sim.add_testbench(dst)
        sim.run()
        assert got == list(range(n))
        if not delays:
            assert cycles["n"] <= 2 * n + 4
