"""WQE fetch: 64-byte DMA read decoded into the WQE layout, with DMA latency and back-pressure."""

import random

import pytest
from amaranth.sim import Simulator

from hw import formats
from hw.wqe_fetch import WqeFetch


def run(W, seed, n=12, bp=0.3):
    dut = WqeFetch(W)
    rng = random.Random(seed)
    mem = {}
    addrs = []
    expect = []
    for i in range(n):
        addr = 0x1000 + rng.randrange(0, 1 << 16) * 8 + rng.choice([0, 3])   # also unaligned
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
        for a in addrs:
            while rng.random() < bp:
                await ctx.tick()
            ctx.set(dut.req.payload.addr, a)
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
    sim.add_process(dma)
    sim.add_testbench(requester, background=True)
    sim.add_testbench(consumer)
    sim.run()
    assert reqs == [(a, 64, 0) for a in addrs]
    assert got == expect


@pytest.mark.parametrize("W,bp", [(8, 0.0), (8, 0.4), (16, 0.3), (64, 0.3)])
def test_fetch(W, bp):
    run(W, seed=W, bp=bp)


def test_bad_width():
    with pytest.raises(ValueError, match=r"data_bytes must be a power of two in \[8, 64\], not 12"):
        WqeFetch(12)
