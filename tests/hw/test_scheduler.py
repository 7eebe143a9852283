"""Round-robin scheduler: grants follow a Python round-robin model under random requests."""

import random

import pytest
from amaranth.sim import Simulator

from hw.scheduler import Scheduler


def run(n, seed, cycles=400):
    dut = Scheduler(n)
    rng = random.Random(seed)
    grants = []

    async def tb(ctx):
        last = n - 1
        for _ in range(cycles):
            req = rng.getrandbits(n) if rng.random() < 0.8 else 0
            ready = rng.random() < 0.7
            ctx.set(dut.req, req)
            ctx.set(dut.grant.ready, ready)
            valid = ctx.get(dut.grant.valid)
            assert valid == (req != 0)
            if req:
                expect = next((last + 1 + i) % n for i in range(n) if req >> ((last + 1 + i) % n) & 1)
                got = ctx.get(dut.grant.payload.qpn)
                assert got == expect, (req, last, got, expect)
                if ready:
                    last = got
                    grants.append(got)
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()
    return grants


@pytest.mark.parametrize("n", [2, 4, 8])
def test_round_robin(n):
    grants = run(n, seed=n)
    assert len(grants) > 100
    assert set(grants) == set(range(n))


def test_fairness_all_requesting():
    dut = Scheduler(4)
    seq = []

    async def tb(ctx):
        ctx.set(dut.req, 0b1111)
        ctx.set(dut.grant.ready, 1)
        for _ in range(8):
            seq.append(ctx.get(dut.grant.payload.qpn))
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()
    assert seq == [0, 1, 2, 3, 0, 1, 2, 3]


def test_bad_n():
    with pytest.raises(ValueError, match=r"n must be a power of two in \[2, 1024\], not 3"):
        Scheduler(3)
