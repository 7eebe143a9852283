"""hw/lib/frame_fifo.py against a Python model: random writes, aborted frames and reads with
back-pressure; the reader sees whole committed frames only, in order, never an aborted one,
and never a beat before its frame's last beat was written."""

import random

import pytest
from amaranth.sim import Simulator

from hw.lib.frame_fifo import FrameFifo


def test_parameters():
    with pytest.raises(ValueError, match=r"^depth must be a power of two in \[2, 65536\], "
                                         r"not 3$"):
        FrameFifo(8, 3)


@pytest.mark.parametrize("seed", range(3))
def test_against_model(seed):
    rng = random.Random(seed)
    dut = FrameFifo(8, 16)
    frames = []
    for n in range(120):
        length = rng.randint(1, 10)
        frames.append(([(n << 8) | b for b in range(length)], rng.random() < 0.25))
    got = []
    committed_at = {}
    stats = {"aborted": 0, "full": 0}

    async def bench(ctx):
        cycle = 0
        for n, (words, abort) in enumerate(frames):
            cut = rng.randint(1, len(words)) if abort else None
            for j, w in enumerate(words):
                if cut is not None and j == cut:
                    break
                while True:
                    ctx.set(dut.i.valid, 1)
                    ctx.set(dut.i.payload, {"data": w, "nbytes": 8,
                                            "last": int(j == len(words) - 1 and cut is None)})
                    ctx.set(dut.o.ready, rng.random() < 0.6)
                    _, _, _, ready, ov, ordy, op = await ctx.tick().sample(
                        dut.i.valid, dut.i.ready, dut.o.valid, dut.o.ready, dut.o.payload)
                    cycle += 1
                    if ov and ordy:
                        got.append((cycle, int(op.data), int(op.last)))
                    if ready:
                        break
                    stats["full"] += 1
            ctx.set(dut.i.valid, 0)
            if cut is not None:
                ctx.set(dut.abort, 1)
                _, _, _, ov, ordy, op = await ctx.tick().sample(dut.abort, dut.o.valid, dut.o.ready,
                                                          dut.o.payload)
                cycle += 1
                if ov and ordy:
                    got.append((cycle, int(op.data), int(op.last)))
                ctx.set(dut.abort, 0)
                stats["aborted"] += 1
            else:
                committed_at[n] = cycle
        ctx.set(dut.o.ready, 1)
        for _ in range(200):
            _, _, _, ov, op = await ctx.tick().sample(dut.o.ready, dut.o.valid, dut.o.payload)
            cycle += 1
            if ov:
                got.append((cycle, int(op.data), int(op.last)))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    want = [w for words, abort in frames if not abort for w in words]
    assert [d for _, d, _ in got] == want
    for c, d, _ in got:
        assert c > committed_at[d >> 8]          # read only after its last beat was written
    assert stats["aborted"] > 10 and stats["full"] > 10, stats
