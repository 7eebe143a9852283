"""hw/lib/reg_array.py against a Python model: random writes on every port each cycle, a
later port wins on the same element, reads see the value of the last cycle, init applies."""

import random

import pytest
from amaranth.sim import Simulator

from hw.lib.reg_array import RegArray

from .port_drivers import drive_random_writes


@pytest.mark.parametrize("n,ports,p_write", [(1, ("a",), 0.7), (5, ("a", "b"), 0.6),
                                             (16, ("a", "b", "c"), 0.9), (64, ("a", "b"), 0.3)])
def test_against_model(n, ports, p_write):
    dut = RegArray(n, 12, ports, init=7)
    rng = random.Random(n * 31 + len(ports))
    model = [7] * n
    collisions = 0

    async def tb(ctx):
        nonlocal collisions
        for cycle in range(600):
            writes = drive_random_writes(ctx, dut, ports, rng, n, p_write, 12)
            # before the edge every element still holds the model's value
            assert [ctx.get(dut.q[i]) for i in range(n)] == model, f"cycle {cycle}"
            await ctx.tick()
            if len({a for a, _ in writes}) < len(writes):
                collisions += 1
            for addr, val in writes:           # in port order: a later port wins
                model[addr] = val
        assert [ctx.get(dut.q[i]) for i in range(n)] == model

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()
    if len(ports) > 1:
        assert collisions > 2           # the priority rule was exercised


def test_read_by_index_and_write_helper():
    dut = RegArray(8, 8, ("lo", "hi"))
    sel = dut[3]

    async def tb(ctx):
        for stmt_port, addr, val in (("lo", 3, 11), ("hi", 5, 22)):
            port = getattr(dut, stmt_port)
            ctx.set(port.en, 1)
            ctx.set(port.addr, addr)
            ctx.set(port.data, val)
        await ctx.tick()
        ctx.set(dut.lo.en, 0)
        ctx.set(dut.hi.en, 0)
        assert ctx.get(dut.q[3]) == 11 and ctx.get(dut.q[5]) == 22 and ctx.get(dut.q[0]) == 0

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()
    stmts = dut.write("hi", 2, 9)
    assert len(stmts) == 3
    assert sel.shape().width == 8


@pytest.mark.parametrize("kw,msg", [
    (dict(n=0, shape=4, ports=("a",)), "n must be an integer in [1, 65536], not 0"),
    (dict(n=4, shape=4, ports=()), "ports must be 1 to 8 distinct identifiers"),
    (dict(n=4, shape=4, ports=("a", "a")), "ports must be 1 to 8 distinct identifiers"),
    (dict(n=4, shape=4, ports=("q",)), "ports must be 1 to 8 distinct identifiers"),
    (dict(n=4, shape=4, ports=("1x",)), "ports must be 1 to 8 distinct identifiers"),
])
def test_bad_parameters(kw, msg):
    with pytest.raises(ValueError) as e:
        RegArray(**kw)
    assert msg in str(e.value)
    dut = RegArray(4, 4, ("a",))
    with pytest.raises(ValueError, match="port must be one of"):
        dut.write("b", 0, 1)
