"""hw/lib/mem_array.py against a Python model: random writes on every port each cycle (a
later port wins on the same element), random reads on every read port see the value of the
last cycle, and after a reset every element reads ``init`` again: at once with valid bits,
after a sweep that ignores writes with ``reset="sweep"``."""

import random

import pytest
from amaranth.hdl import ClockDomain, Module
from amaranth.sim import Simulator

from hw.lib.mem_array import MemArray

from .port_drivers import drive_random_writes


def _sim(dut, tb):
    m = Module()
    m.domains.sync = cd = ClockDomain()
    m.submodules.dut = dut
    sim = Simulator(m)
    sim.add_clock(1e-8)

    async def bench(ctx):
        await tb(ctx, cd)

    sim.add_testbench(bench)
    sim.run()


@pytest.mark.parametrize("reset", ["valid", "sweep"])
@pytest.mark.parametrize("n,ports,reads,p_write", [
    (1, ("a",), ("x",), 0.7), (5, ("a", "b"), ("x", "y"), 0.6),
    (16, ("a", "b", "c"), ("x",), 0.9), (64, ("a", "b"), ("x", "y", "z"), 0.3)])
def test_against_model(n, ports, reads, p_write, reset):
    dut = MemArray(n, 12, ports, reads, init=7, reset=reset)
    rng = random.Random(n * 31 + len(ports))
    model = [7] * n
    stats = {"collisions": 0, "sweeps": 0, "ignored": 0}

    async def tb(ctx, cd):
        for cycle in range(900):
            busy = ctx.get(dut.busy)
            writes = drive_random_writes(ctx, dut, ports, rng, n, p_write, 12)
            if not busy:
                for r in reads:
                    addr = rng.randrange(n)
                    ctx.set(getattr(dut, r).addr, addr)
                    assert ctx.get(getattr(dut, r).data) == model[addr], f"cycle {cycle}"
            reset = cycle in (300, 301, 650)
            ctx.set(cd.rst, reset)
            await ctx.tick()
            if reset:
                stats["sweeps"] += 1
                model[:] = [7] * n
                # the sweep takes n cycles; elements it has not reached may still hold
                # what was written before, so the model only holds again once it is done.
                # With valid bits the reset is immediate: the writes of this cycle are lost
                continue
            if busy:
                stats["ignored"] += len(writes)
                continue
            if len({a for a, _ in writes}) < len(writes):
                stats["collisions"] += 1
            for addr, val in writes:           # in port order: a later port wins
                model[addr] = val
        assert not ctx.get(dut.busy)

    _sim(dut, tb)
    assert stats["sweeps"] == 3
    assert (stats["ignored"] > 0) == (reset == "sweep")
    if len(ports) > 1:
        assert stats["collisions"] > 2      # the priority rule was exercised


async def _write_indices(ctx, dut, n):
    """Write element i := i through port ``w``, one per cycle."""
    for i in range(n):
        ctx.set(dut.w.en, 1)
        ctx.set(dut.w.addr, i)
        ctx.set(dut.w.data, i)
        await ctx.tick()
    ctx.set(dut.w.en, 0)


def test_sweep_restores_init_and_busy_lasts_n_cycles():
    n = 8
    dut = MemArray(n, 8, ("w",), ("r",), init=0x5A, reset="sweep")

    async def tb(ctx, cd):
        for _ in range(n):                  # the sweep after the start
            assert ctx.get(dut.busy)
            await ctx.tick()
        assert not ctx.get(dut.busy)
        await _write_indices(ctx, dut, n)
        ctx.set(dut.r.addr, 3)
        assert ctx.get(dut.r.data) == 3
        ctx.set(cd.rst, 1)
        await ctx.tick()
        ctx.set(cd.rst, 0)
        busy_cycles = 0
        while ctx.get(dut.busy):
            busy_cycles += 1
            await ctx.tick()
        assert busy_cycles == n
        for i in range(n):
            ctx.set(dut.r.addr, i)
            assert ctx.get(dut.r.data) == 0x5A

    _sim(dut, tb)


def test_valid_bits_reset_at_once():
    n = 8
    dut = MemArray(n, 8, ("w",), ("r",), init=0x5A)

    async def tb(ctx, cd):
        assert not ctx.get(dut.busy)
        await _write_indices(ctx, dut, n)
        for i in range(n):
            ctx.set(dut.r.addr, i)
            assert ctx.get(dut.r.data) == i
        ctx.set(cd.rst, 1)
        await ctx.tick()
        ctx.set(cd.rst, 0)
        assert not ctx.get(dut.busy)
        for i in range(n):
            ctx.set(dut.r.addr, i)
            assert ctx.get(dut.r.data) == 0x5A
        ctx.set(dut.w.en, 1)        # usable in the first cycle after the reset
        ctx.set(dut.w.addr, 6)
        ctx.set(dut.w.data, 0x11)
        await ctx.tick()
        ctx.set(dut.w.en, 0)
        for i in range(n):
            ctx.set(dut.r.addr, i)
            assert ctx.get(dut.r.data) == (0x11 if i == 6 else 0x5A)

    _sim(dut, tb)


def test_write_and_read_helpers():
    dut = MemArray(8, 8, ("lo", "hi"), ("x",))
    assert len(dut.write("hi", 2, 9)) == 3
    stmts, value = dut.read("x", 3)
    assert len(stmts) == 1 and value is dut.x.data
    with pytest.raises(ValueError, match=r"port must be one of \('lo', 'hi'\), not 'x'"):
        dut.write("x", 0, 0)
    with pytest.raises(ValueError, match=r"port must be one of \('x',\), not 'lo'"):
        dut.read("lo", 0)


@pytest.mark.parametrize("kw,msg", [
    (dict(n=0, shape=4, ports=("a",), reads=("x",)), "n must be an integer in [1, 65536], not 0"),
    (dict(n=4, shape=4, ports=(), reads=("x",)), "ports must be 1 to 8 distinct identifiers"),
    (dict(n=4, shape=4, ports=("busy",), reads=("x",)), "ports must be 1 to 8 distinct identifiers"),
    (dict(n=4, shape=4, ports=("a",), reads=()), "reads must be 1 to 16 distinct identifiers"),
    (dict(n=4, shape=4, ports=("a",), reads=("a",)), "reads must be 1 to 16 distinct identifiers"),
    (dict(n=4, shape=4, ports=("a",), reads=("x",), reset="flash"),
     "reset must be 'valid' or 'sweep', not 'flash'"),
])
def test_bad_parameters(kw, msg):
    with pytest.raises(ValueError, match=msg.replace("[", r"\[").replace("]", r"\]")):
        MemArray(**kw)


def test_read_by_index_takes_ports_in_turn():
    from amaranth.hdl import Signal
    dut = MemArray(8, 8, ("w",), ("x", "y"))
    a, b, c = Signal(3), Signal(3), Signal(3)
    assert dut[a] is dut.x.data and dut[b] is dut.y.data and dut[a] is dut.x.data
    assert len(dut.read_addrs()) == 2
    with pytest.raises(ValueError, match=r"all 2 read ports are in use"):
        dut[c]


@pytest.mark.parametrize("n", [1, 4, 16])
def test_generations_never_come_back(n):
    """Frequent resets (runs of several cycles too) and rare writes: an element left
    unwritten across many more resets than there are generation numbers
    (``2**(ceil_log2(n) + 2)``) still reads ``init``; the scrubber keeps stale
    generations from coming round again."""
    dut = MemArray(n, 8, ("w",), ("r", "s"), init=0x3C)
    rng = random.Random(n)
    model = [0x3C] * n
    resets = 0

    async def tb(ctx, cd):
        nonlocal resets
        in_reset = False
        for cycle in range(4000):
            for r in ("r", "s"):
                addr = rng.randrange(n)
                ctx.set(getattr(dut, r).addr, addr)
                assert ctx.get(getattr(dut, r).data) == model[addr], f"cycle {cycle}"
            write = rng.random() < 0.05
            addr, val = rng.randrange(n), rng.randrange(256)
            ctx.set(dut.w.en, write)
            ctx.set(dut.w.addr, addr)
            ctx.set(dut.w.data, val)
            reset = rng.random() < (0.6 if in_reset else 0.15)
            ctx.set(cd.rst, reset)
            await ctx.tick()
            in_reset = reset
            if reset:
                resets += 1
                model[:] = [0x3C] * n
            elif write:
                model[addr] = val

    _sim(dut, tb)
    assert resets > 16 * 2 ** (max(n - 1, 0).bit_length() + 2)
