"""hw/lib/ready_queue.py against a Python model: each index queued at most once, first pushed
first popped, a push during the pop of the same index queues it again, nothing lost."""

import random

import pytest
from amaranth.sim import Simulator

from hw.lib.ready_queue import ReadyQueue


def run(n, pushes_per_cycle, p_ready, cycles, seed, hot=None):
    """Random pushes (an index, or None for no push, per cycle) and random pop back-pressure.
    Checks every cycle against the model; returns (pops, model merges, counters)."""
    dut = ReadyQueue(n)
    rng = random.Random(seed)
    model = []
    pops = []
    merges = 0
    out = {}

    async def tb(ctx):
        nonlocal merges
        for cycle in range(cycles + 4 * n):
            draining = cycle >= cycles
            push = None
            if not draining and rng.random() < pushes_per_cycle:
                push = rng.choice(hot) if hot and rng.random() < 0.5 else rng.randrange(n)
            ready = draining or rng.random() < p_ready
            ctx.set(dut.push.valid, push is not None)
            ctx.set(dut.push.payload.index, push or 0)
            ctx.set(dut.pop.ready, ready)
            _, _, v, idx, count = await ctx.tick().sample(dut.pop.valid, dut.pop.payload.index,
                                                          dut.count)
            assert count == len(model), f"cycle {cycle}: count {count}, model {len(model)}"
            if v and ready:
                assert model and model[0] == idx, f"cycle {cycle}: popped {idx}, model {model[:3]}"
                model.pop(0)
                pops.append(idx)
            if push is not None:
                if push in model:
                    merges += 1
                else:
                    model.append(push)
        out["pushes"] = ctx.get(dut.pushes)
        out["merged"] = ctx.get(dut.merged)
        out["count"] = ctx.get(dut.count)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()
    assert model == [] and out["count"] == 0
    return pops, merges, out


@pytest.mark.parametrize("n,rate,p_ready", [(4, 0.9, 0.3), (16, 0.6, 0.5), (37, 0.9, 0.9),
                                            (64, 0.3, 1.0)])
def test_against_model(n, rate, p_ready):
    pops, merges, c = run(n, rate, p_ready, 1500, seed=n, hot=[1, 2])
    assert c["merged"] == merges and merges > 0
    assert c["pushes"] == len(pops) + merges
    assert len(set(pops)) == n or n > 37


def test_full_queue_keeps_every_index_once():
    """All n indices queued with the output stalled: no push is lost, none duplicated."""
    pops, merges, c = run(8, 1.0, 0.02, 400, seed=5)
    assert merges > 300 and c["pushes"] == len(pops) + merges


def test_one_pop_per_cycle():
    """Distinct pushes every cycle, output always ready: one index leaves per cycle."""
    dut = ReadyQueue(64)
    got = []

    async def tb(ctx):
        ctx.set(dut.pop.ready, 1)
        for cycle in range(80):
            ctx.set(dut.push.valid, cycle < 64)
            ctx.set(dut.push.payload.index, cycle % 64)
            _, _, v, idx = await ctx.tick().sample(dut.pop.valid, dut.pop.payload.index)
            if v:
                got.append((cycle, idx))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()
    assert [i for _, i in got] == list(range(64))
    assert got[-1][0] - got[0][0] == 63


def test_parameter_checked():
    with pytest.raises(ValueError) as e:
        ReadyQueue(1)
    assert str(e.value) == "n must be an integer in [2, 65536], not 1"
