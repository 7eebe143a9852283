"""WQE fetch: 64-byte DMA read decoded into the WQE layout, with DMA latency and back-pressure."""

import random

import pytest
from amaranth.sim import Simulator

from hw import formats
from hw.rnic.wqe_fetch import WqeFetch
from sim.host import HostMemory
from tests.hw.dma_models import PortMemorySim, tick_until


def run(W, seed, n=12, bp=0.3, depth=4, fail=None, p_bf=0.0):
    """Fetch ``n`` random WQEs in random batches through the shared DMA port model (a
    fraction ``p_bf`` of them are single BlueFlame WQEs given with the request); return
    (requests seen by the host, [(fields, err)] out of the block, expected fields)."""
    dut = WqeFetch(W, depth)
    rng = random.Random(seed)
    mem = HostMemory()
    expect = []
    batches = []
    while sum(c for _, c in batches) < n:
        c = min(rng.randrange(1, depth + 1), n - sum(c for _, c in batches))
        batches.append((0x1000 + rng.randrange(0, 1 << 16) * 8 + rng.choice([0, 3]), c))  # also unaligned
    bf = [rng.random() < p_bf for _ in batches]
    batches = [(a, 1 if b else c) for (a, c), b in zip(batches, bf)]
    wqes = []
    for a, c in batches:
        for k in range(c):
            f = dict(opcode=rng.randrange(7), flags=rng.randrange(8), imm=rng.getrandbits(32),
                     wr_id=rng.getrandbits(64), local_addr=rng.getrandbits(64),
                     length=rng.getrandbits(32), lkey=rng.getrandbits(32),
                     remote_addr=rng.getrandbits(64), rkey=rng.getrandbits(32),
                     compare_add=rng.getrandbits(64), swap=rng.getrandbits(64))
            mem.write(a + 64 * k, formats.pack(formats.WQE, **f))
            wqes.append(f)
            expect.append(f)
    got = []
    dma = PortMemorySim(W, mem=mem, seed=seed, lat=(1, 8), p_ready=1 - bp, p_gap=bp, fail=fail)

    async def requester(ctx):
        k = 0
        for (a, c), b in zip(batches, bf):
            while rng.random() < bp:
                await ctx.tick()
            ctx.set(dut.req.payload, {"addr": a, "count": c, "bf": b,
                                      "wqe": wqes[k] if b else {}})
            k += c
            ctx.set(dut.req.valid, 1)
            await tick_until(ctx, dut.req.ready)
            ctx.set(dut.req.valid, 0)

    async def consumer(ctx):
        while len(got) < len(expect):
            ctx.set(dut.wqe.ready, rng.random() > bp)
            _, _, v, r, p = await ctx.tick().sample(dut.wqe.valid, dut.wqe.ready,
                                                    dut.wqe.payload)
            if v and r:
                w = p.wqe
                got.append(({name: int(getattr(w, name) if name != "opcode" else w.opcode)
                             for name in expect[0]}, int(p.err)))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    dma.clock(sim)
    dma.read_port(sim, dut.dma)
    sim.add_testbench(requester, background=True)
    sim.add_testbench(consumer)
    sim.run()
    reqs = [(a, ln, t) for _, a, ln, t in dma.reads]
    assert reqs == [(a, 64 * c, 0) for (a, c), b in zip(batches, bf) if not b]
    return batches, got, expect


@pytest.mark.parametrize("W,bp,depth", [(8, 0.0, 4), (8, 0.4, 4), (16, 0.3, 1), (64, 0.3, 3),
                                        (8, 0.6, 2)])
def test_fetch(W, bp, depth):
    _, got, expect = run(W, seed=W + depth, bp=bp, depth=depth, n=20)
    assert got == [(f, 0) for f in expect]


@pytest.mark.parametrize("W,bp", [(8, 0.0), (16, 0.4), (64, 0.3)])
def test_blueflame_wqes_keep_request_order(W, bp):
    """BlueFlame WQEs (no DMA read) and fetched ones, mixed: they come out in request order
    although the fetched ones wait for the DMA latency."""
    _, got, expect = run(W, seed=3 * W, bp=bp, depth=4, n=40, p_bf=0.5)
    assert got == [(f, 0) for f in expect]


def test_failed_read_marks_its_wqes():
    """Every WQE of a batch the host fails comes out with err; the others are intact."""
    batches, got, expect = run(8, seed=5, n=16, bp=0.2, depth=4,
                               fail=lambda a, n, w: (a // 8) % 3 == 0)
    errs = []
    for a, c in batches:
        errs += [int((a // 8) % 3 == 0)] * c
    assert [e for _, e in got] == errs and 0 < sum(errs) < len(errs)
    assert [f for (f, e) in got if not e] == [f for f, e in zip(expect, errs) if not e]


def test_consumer_stalled_does_not_block_dma():
    """With the consumer stalled, a full batch is still taken from the DMA at once; the next
    request waits until slots are free."""
    dut = WqeFetch(8, 2)
    log = {}

    async def tb(ctx):
        ctx.set(dut.dma.req.ready, 1)
        ctx.set(dut.req.payload, {"addr": 0x100, "count": 2})
        ctx.set(dut.req.valid, 1)
        await ctx.tick().until(dut.req.ready)
        ctx.set(dut.req.payload, {"addr": 0x200, "count": 1})
        for b in range(16):
            ctx.set(dut.dma.rd.payload, {"data": b, "nbytes": 8, "last": b == 15, "tag": 0})
            ctx.set(dut.dma.rd.valid, 1)
            assert ctx.get(dut.dma.rd.ready)
            assert not ctx.get(dut.req.ready)
            await ctx.tick()
        ctx.set(dut.dma.rd.valid, 0)
        await ctx.tick()
        log["blocked"] = not ctx.get(dut.req.ready)
        ctx.set(dut.wqe.ready, 1)
        await ctx.tick().until(dut.wqe.valid)
        await ctx.tick()
        ctx.set(dut.wqe.ready, 0)
        log["free"] = ctx.get(dut.req.ready)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()
    assert log == {"blocked": True, "free": 1}


def test_bad_params():
    with pytest.raises(ValueError, match=r"data_bytes must be a power of two in \[8, 64\], not 12"):
        WqeFetch(12)
    with pytest.raises(ValueError, match=r"depth must be an integer in \[1, 64\], not 0"):
        WqeFetch(8, 0)
