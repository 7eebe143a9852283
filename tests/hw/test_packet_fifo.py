"""PacketFifo (hw/lib/packet_fifo.py): packets leave whole and in order under random
back-pressure, headers and beats are taken while the output waits, parameters checked."""

import random

import pytest
from amaranth.sim import Simulator

from hw.lib.packet_fifo import PacketFifo
from tests.hw.port_drivers import make_packets, run_lockstep


@pytest.mark.parametrize("W, headers, beats, seed", [
    (8, 2, 2, 1), (8, 4, 16, 2), (64, 4, 16, 3), (8, 8, 4, 4)])
def test_packets_whole_and_in_order(W, headers, beats, seed):
    rng = random.Random(seed)
    dut = PacketFifo(W, headers, beats)
    pkts = make_packets(rng, 1, 30, W)
    n_meta = len(pkts[0])
    n_beats = sum(len(bs) for _, bs in pkts[0])
    sources = [(dut.i.meta, [m for m, _ in pkts[0]]),
               (dut.i.payload, [b for _, bs in pkts[0] for b in bs])]
    # run_lockstep also asserts that an offered output does not change until taken
    got, _ = run_lockstep(dut, sources, [(dut.o.meta, ["src_node", "psn", "paylen"]),
                                         (dut.o.payload, ["data", "nbytes", "last"])],
                          p_valid=0.6, p_ready=0.5, seed=seed, max_cycles=20000,
                          done=lambda g: len(g[0]) == n_meta and len(g[1]) == n_beats)
    assert len(got[0]) == n_meta and len(got[1]) == n_beats
    metas = [m for _, m in got[0]]
    assert [(m["psn"], m["paylen"]) for m in metas] == [(m["psn"], m["paylen"])
                                                        for m, _ in pkts[0]]
    assert [b for _, b in got[1]] == [b for _, bs in pkts[0] for b in bs]


@pytest.mark.parametrize("headers, beats", [(4, 16), (2, 8)])
def test_takes_while_the_output_waits(headers, beats):
    """With the output never ready, the input takes exactly ``headers`` headers and
    ``beats`` beats: a receiver that is busy does not hold its sender back until then."""
    W = 8
    dut = PacketFifo(W, headers, beats)
    taken = {"meta": 0, "payload": 0}

    async def tb(ctx):
        ctx.set(dut.o.meta.ready, 0)
        ctx.set(dut.o.payload.ready, 0)
        ctx.set(dut.i.meta.valid, 1)
        ctx.set(dut.i.payload.valid, 1)
        ctx.set(dut.i.payload.payload, {"data": 1, "nbytes": W, "last": 1})
        for _ in range(4 * (headers + beats)):
            _, _, mr, pr = await ctx.tick().sample(dut.i.meta.ready, dut.i.payload.ready)
            taken["meta"] += mr
            taken["payload"] += pr

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()
    assert taken == {"meta": headers, "payload": beats}


@pytest.mark.parametrize("kw, msg", [
    (dict(data_bytes=24), r"data_bytes must be a power of two in \[1, 512\], not 24"),
    (dict(headers=3), r"headers must be a power of two in \[2, 256\], not 3"),
    (dict(beats=1), r"beats must be a power of two in \[2, 1024\], not 1"),
])
def test_bad_parameters(kw, msg):
    args = dict(data_bytes=8, headers=4, beats=8)
    args.update(kw)
    with pytest.raises(ValueError, match=msg):
        PacketFifo(**args)
