"""hw/lib/ready_queue.py against a Python model: each index queued at most once, first pushed
first popped, a push during the pop of the same index queues it again, nothing lost."""

import random

import pytest
from amaranth.sim import Simulator

from hw.lib.ready_queue import ReadyQueue
from tests.hw.port_drivers import Resettable


def drive(dut, n, cycles, p_ready, rng, pick):
    """Pushes chosen by ``pick(draining) -> [index or None per push port]`` and random pop
    back-pressure, checked every cycle against the model (in one cycle the lower port's push
    comes first). Returns (pops, model merges, counters)."""
    model = []
    pops = []
    merges = 0
    out = {}

    async def tb(ctx):
        nonlocal merges
        for cycle in range(cycles + 4 * n):
            draining = cycle >= cycles
            pushes = pick(draining)
            for port, idx in zip(dut.push, pushes):
                ctx.set(port.valid, idx is not None)
                ctx.set(port.payload.index, idx or 0)
            ready = draining or rng.random() < p_ready
            ctx.set(dut.pop.ready, ready)
            _, _, v, idx, count = await ctx.tick().sample(dut.pop.valid, dut.pop.payload.index,
                                                          dut.count)
            assert count == len(model), f"cycle {cycle}: count {count}, model {len(model)}"
            if v and ready:
                assert model and model[0] == idx, f"cycle {cycle}: popped {idx}, model {model[:3]}"
                model.pop(0)
                pops.append(idx)
            for push in pushes:
                if push is None:
                    continue
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


def run(n, pushes_per_cycle, p_ready, cycles, seed, hot=None):
    """One push port: an index (half the time one of ``hot``) with probability
    ``pushes_per_cycle``."""
    rng = random.Random(seed)

    def pick(draining):
        if draining or rng.random() >= pushes_per_cycle:
            return [None]
        return [rng.choice(hot) if hot and rng.random() < 0.5 else rng.randrange(n)]

    return drive(ReadyQueue(n), n, cycles, p_ready, rng, pick)


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
            ctx.set(dut.push[0].valid, cycle < 64)
            ctx.set(dut.push[0].payload.index, cycle % 64)
            _, _, v, idx = await ctx.tick().sample(dut.pop.valid, dut.pop.payload.index)
            if v:
                got.append((cycle, idx))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()
    assert [i for _, i in got] == list(range(64))
    assert got[-1][0] - got[0][0] == 63


def run_ports(n, ports, rate, p_ready, cycles, seed):
    """Several push ports at random, now and then the same index on two of them."""
    rng = random.Random(seed)

    def pick(draining):
        pushes = []
        for _ in range(ports):
            idx = None
            if not draining and rng.random() < rate:
                idx = pushes[-1] if pushes and pushes[-1] is not None and rng.random() < 0.2 \
                    else rng.randrange(n)
            pushes.append(idx)
        return pushes

    return drive(ReadyQueue(n, ports=ports), n, cycles, p_ready, rng, pick)


@pytest.mark.parametrize("n,ports,rate,p_ready", [(4, 2, 0.8, 0.5), (16, 3, 0.5, 0.7),
                                                  (37, 4, 0.4, 0.9), (64, 2, 0.3, 1.0)])
def test_push_ports_against_model(n, ports, rate, p_ready):
    pops, merges, c = run_ports(n, ports, rate, p_ready, 1200, seed=n * ports)
    assert c["merged"] == merges > 0 and len(pops) == c["pushes"] - merges


def test_reset_empties_the_queue():
    """An index queued before a reset is not queued after it: pushed again, it comes out."""
    dut = Resettable(ReadyQueue(8))

    async def tb(ctx):
        ctx.set(dut.pop.ready, 0)
        for i in (3, 5):
            ctx.set(dut.push[0].valid, 1)
            ctx.set(dut.push[0].payload.index, i)
            await ctx.tick()
        ctx.set(dut.push[0].valid, 0)
        await ctx.tick()
        assert ctx.get(dut.count) == 2
        ctx.set(dut.rst, 1)
        await ctx.tick()
        ctx.set(dut.rst, 0)
        assert ctx.get(dut.count) == 0 and not ctx.get(dut.pop.valid)
        ctx.set(dut.push[0].valid, 1)
        ctx.set(dut.push[0].payload.index, 5)
        await ctx.tick()
        ctx.set(dut.push[0].valid, 0)
        ctx.set(dut.pop.ready, 1)
        await ctx.tick()
        assert ctx.get(dut.pop.valid) and ctx.get(dut.pop.payload.index) == 5
        assert ctx.get(dut.count) == 1

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()


def test_parameter_checked():
    with pytest.raises(ValueError) as e:
        ReadyQueue(1)
    assert str(e.value) == "n must be an integer in [2, 65536], not 1"
    with pytest.raises(ValueError) as e:
        ReadyQueue(8, ports=5)
    assert str(e.value) == "ports must be an integer in [1, 4], not 5"
