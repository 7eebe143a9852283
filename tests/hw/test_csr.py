"""hw/lib/csr.py: the register map's checks, and the decoder against a dictionary model."""

import random

import pytest
from amaranth.hdl import Array, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In
from amaranth.sim import Simulator

from hw.interfaces import MmioSignature
from hw.lib.csr import BusDecoder, RegisterMap


def test_map_checks():
    rm = RegisterMap(16)
    rm.add("ctrl", 0x0000, 0x40, doc="control")
    rm.add("db", 0x1000, 0x100)
    cases = [
        (("args", 0x0038, 16), "window 'args' at 0x38..0x47 overlaps 'ctrl' at 0x0..0x3f"),
        (("big", 0x0800, 0x1000), "window 'big' at 0x800..0x17ff overlaps 'db' at 0x1000..0x10ff"),
        (("odd", 0x2004, 8), "window 'odd': base must be a multiple of 8 in [0, 0xfff8], not 8196"),
        (("top", 0xFFF8, 16), "window 'top': size must be a multiple of 8 in [8, 0x8], not 16"),
        (("half", 0x3000, 12), "window 'half': size must be a multiple of 8 in [8, 0xd000], not 12"),
        (("db", 0x4000, 8), "window name 'db' is not a new Python identifier"),
    ]
    for args, msg in cases:
        with pytest.raises(ValueError) as e:
            rm.add(*args)
        assert str(e.value) == msg
    assert rm.lookup(0x103F).name == "db" and rm.lookup(0x0040) is None
    assert [w.name for w in rm] == ["ctrl", "db"]
    assert "| `db` | 0x1000..0x10ff | 32 |" in rm.table()
    with pytest.raises(ValueError) as e:
        RegisterMap(40)
    assert str(e.value) == "addr_width must be an integer in [4, 32], not 40"


class RegFile(wiring.Component):
    """n 64-bit registers: write stores, read answers in the next cycle."""

    def __init__(self, n, addr_width):
        self.n = n
        super().__init__({"bus": In(MmioSignature(addr_width))})

    def elaborate(self, platform):
        m = Module()
        regs = Array(Signal(64, name=f"r{i}") for i in range(self.n))
        idx = self.bus.addr >> 3
        with m.If(self.bus.we):
            m.d.sync += regs[idx].eq(self.bus.wdata)
        m.d.sync += self.bus.rdata.eq(0)
        with m.If(self.bus.re):
            m.d.sync += self.bus.rdata.eq(regs[idx])
        return m


def test_decoder_against_model():
    rm = RegisterMap(12)
    spans = {"a": (0x000, 0x40), "b": (0x100, 0x08), "c": (0x400, 0x200)}
    for name, (base, size) in spans.items():
        rm.add(name, base, size)
    top = Module()
    top.submodules.dec = dec = BusDecoder(rm)
    files = {}
    for name, (base, size) in spans.items():
        files[name] = f = RegFile(size // 8, rm[name].addr_width)
        top.submodules[name] = f
        wiring.connect(top, getattr(dec, name), f.bus)
    rng = random.Random(4)
    model = {}
    stats = {"unmapped": 0, "reads": 0}

    async def tb(ctx):
        for _ in range(1500):
            addr = rng.randrange(0, 1 << 12, 8)
            if rng.random() < 0.5:
                addr = rng.choice([0x000, 0x038, 0x100, 0x400, 0x5F8, 0x040, 0x108, 0x3F8])
            w = rm.lookup(addr)
            if rng.random() < 0.5:
                val = rng.getrandbits(64)
                ctx.set(dec.bus.addr, addr)
                ctx.set(dec.bus.wdata, val)
                ctx.set(dec.bus.we, 1)
                await ctx.tick()
                ctx.set(dec.bus.we, 0)
                if w is not None:
                    model[addr] = val
            else:
                ctx.set(dec.bus.addr, addr)
                ctx.set(dec.bus.re, 1)
                await ctx.tick()
                ctx.set(dec.bus.re, 0)
                _, _, v, d = await ctx.tick().sample(dec.bus.rvalid, dec.bus.rdata)
                assert v
                assert d == model.get(addr, 0), f"read 0x{addr:x}"
                stats["reads"] += 1
            stats["unmapped"] += w is None
        stats["counter"] = ctx.get(dec.unmapped)

    sim = Simulator(top)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()
    assert stats["counter"] == stats["unmapped"] > 50 and stats["reads"] > 500
    assert len(model) > 20


def test_nic_register_map():
    """The NIC's map (hw/regmap.py) puts every named register in the window of the block
    that decodes it, fits the largest doorbell count, and is what docs/formats.md shows."""
    from hw.config import PRESETS
    from hw.regmap import (ARG_BASE, ARG_WORDS, BLUEFLAME_BASE, COUNTER_BASE, Counter,
                           DOORBELL_BASE, Reg, register_map)
    for n in (1, 16, 512):
        rm = register_map(n)
        where = {name: rm.lookup(addr).name for name, addr in (
            ("ID", Reg.ID), ("NODE_ID", Reg.NODE_ID), ("CMD", Reg.CMD),
            ("ARG_LAST", ARG_BASE + 8 * (ARG_WORDS - 1)),
            ("COUNTER_FIRST", COUNTER_BASE), ("COUNTER_LAST", COUNTER_BASE + 8 * max(Counter)),
            ("DB_FIRST", DOORBELL_BASE), ("DB_LAST", DOORBELL_BASE + 8 * (n - 1)),
            ("RQ_DB", Reg.RQ_DB), ("CQ_DB", Reg.CQ_DB), ("ASYNC_EVENT", Reg.ASYNC_EVENT),
            ("BF_LAST", BLUEFLAME_BASE + 64 * n - 8))}
        assert where == {"ID": "control", "NODE_ID": "control", "CMD": "control",
                         "ARG_LAST": "control", "COUNTER_FIRST": "counters",
                         "COUNTER_LAST": "counters", "DB_FIRST": "doorbells",
                         "DB_LAST": "doorbells", "RQ_DB": "queue_doorbells",
                         "CQ_DB": "queue_doorbells", "ASYNC_EVENT": "events",
                         "BF_LAST": "blueflame"}
        after = rm.lookup(DOORBELL_BASE + 8 * n)
        assert after is None or after.name == "queue_doorbells"     # 512: they abut
        assert rm["blueflame"].external and not rm["doorbells"].external
    with pytest.raises(ValueError, match="window 'queue_doorbells' at 0x2000..0x200f overlaps 'doorbells'"):
        register_map(513)
    for cfg in PRESETS.values():
        register_map(cfg.nic.n_doorbells)
