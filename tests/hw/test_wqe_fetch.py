"""WQE fetch: 64-byte DMA read decoded into the WQE layout, with DMA latency and back-pressure."""

import random

import pytest
from amaranth.sim import Simulator

from hw import formats
from hw.wqe_fetch import WqeFetch


def run(W, seed, n=12, bp=0.3, depth=4):
    dut = WqeFetch(W, depth)
    rng = random.Random(seed)
    mem = {}
    addrs = []
    expect = []
    batches = []
    while sum(c for _, c in batches) < n:
        c = min(rng.randrange(1, depth + 1), n - sum(c for _, c in batches))
        batches.append((0x1000 + rng.randrange(0, 1 << 16) * 8 + rng.choice([0, 3]), c))  # also unaligned
    for i in range(n):
        bi = 0
        k = i
        while k >= batches[bi][1]:
            k -= batches[bi][1]
            bi += 1
        addr = batches[bi][0] + 64 * k
        f = dict(opcode=rng.randrange(7), flags=rng.randrange(8), imm=rng.getrandbits(32),
                 wr_id=rng.getrandbits(64), local_addr=rng.getrandbits(64),
                 length=rng.getrandbits(32), lkey=rng.getrandbits(32),
                 remote_addr=rng.getrandbits(64), rkey=rng.getrandbits(32),
                 compare_add=rng.getrandbits(64), swap=rng.getrandbits(64))
        raw = formats.pack(formats.WQE, **f)
        for k, b in enumerate(raw):
            mem[addr + k] = b
        addrs.append(addr)
        expect.append(f)
    got = []
    reqs = []

    async def requester(ctx):
        for a, c in batches:
            while rng.random() < bp:
                await ctx.tick()
            ctx.set(dut.req.payload, {"addr": a, "count": c})
            ctx.set(dut.req.valid, 1)
            await ctx.tick().until(dut.req.ready)
            ctx.set(dut.req.valid, 0)

    async def dma(ctx):
        while True:
            ctx.set(dut.dma.req.ready, rng.random() > bp)
            _, _, v, r, p = await ctx.tick().sample(dut.dma.req.valid, dut.dma.req.ready,
                                                    dut.dma.req.payload)
            if v and r:
                reqs.append((p.addr, p.len, p.tag))
                ctx.set(dut.dma.req.ready, 0)
                for _ in range(rng.randrange(5)):
                    await ctx.tick()
                nb = (p.len + W - 1) // W
                for b in range(nb):
                    while rng.random() < bp:
                        ctx.set(dut.dma.resp.valid, 0)
                        await ctx.tick()
                    cnt = min(W, p.len - b * W)
                    val = sum(mem[p.addr + b * W + k] << (8 * k) for k in range(cnt))
                    ctx.set(dut.dma.resp.payload, {"data": val, "nbytes": cnt,
                                                   "last": b == nb - 1, "tag": p.tag})
                    ctx.set(dut.dma.resp.valid, 1)
                    await ctx.tick().until(dut.dma.resp.ready)
                ctx.set(dut.dma.resp.valid, 0)

    async def consumer(ctx):
        while len(got) < n:
            ctx.set(dut.wqe.ready, rng.random() > bp)
            _, _, v, r, p = await ctx.tick().sample(dut.wqe.valid, dut.wqe.ready,
                                                    dut.wqe.payload)
            if v and r:
                got.append({name: int(getattr(p, name) if name != "opcode" else p.opcode)
                            for name in expect[0]})

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(dma, background=True)
    sim.add_testbench(requester, background=True)
    sim.add_testbench(consumer)
    sim.run()
    assert reqs == [(a, 64 * c, 0) for a, c in batches]
    assert got == expect


@pytest.mark.parametrize("W,bp,depth", [(8, 0.0, 4), (8, 0.4, 4), (16, 0.3, 1), (64, 0.3, 3),
                                        (8, 0.6, 2)])
def test_fetch(W, bp, depth):
    run(W, seed=W + depth, bp=bp, depth=depth, n=20)


def test_consumer_stalled_does_not_block_dma():
    """With the consumer stalled, a full batch is still taken from the DMA; the next request
    waits until slots are free."""
    dut = WqeFetch(8, 2)
    log = {}

    async def tb(ctx):
        ctx.set(dut.dma.req.ready, 1)
        ctx.set(dut.req.payload, {"addr": 0x100, "count": 2})
        ctx.set(dut.req.valid, 1)
        await ctx.tick().until(dut.req.ready)
        ctx.set(dut.req.payload, {"addr": 0x200, "count": 1})
        for b in range(16):
            ctx.set(dut.dma.resp.payload, {"data": b, "nbytes": 8, "last": b == 15, "tag": 0})
            ctx.set(dut.dma.resp.valid, 1)
            assert ctx.get(dut.dma.resp.ready)
            assert not ctx.get(dut.req.ready)
            await ctx.tick()
        ctx.set(dut.dma.resp.valid, 0)
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
