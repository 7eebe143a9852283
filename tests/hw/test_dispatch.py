"""Unit test of the receive-side packet demux (hw/rnic/dispatch.py)."""

import random

from amaranth.sim import Simulator

from hw.rnic.dispatch import PacketDemux
from hw.formats import BthOpcode

W = 8


def test_routes_requests_responses_and_drops():
    dut = PacketDemux(W, n_qps=4)
    rng = random.Random(1)
    packets = []
    for i in range(60):
        op = rng.choice(list(BthOpcode))
        paylen = rng.choice([0, 0, 5, 8, 17, 40])
        dst_node = rng.choice([1, 1, 1, 2])
        qpn = rng.choice([0, 1, 3, 9])
        packets.append((op, paylen, dst_node, qpn, [rng.getrandbits(64) for _ in range((paylen + W - 1) // W)]))

    got = {"req": [], "resp": []}
    drops = 0

    async def source(ctx):
        ctx.set(dut.node_id, 1)
        for op, paylen, dst, qpn, beats in packets:
            ctx.set(dut.i.meta.valid, 1)
            ctx.set(dut.i.meta.payload, {"opcode": op.value, "paylen": paylen, "dst_node": dst,
                                         "dest_qpn": qpn})
            await ctx.tick().until(dut.i.meta.ready)
            ctx.set(dut.i.meta.valid, 0)
            for k, beat in enumerate(beats):
                ctx.set(dut.i.payload.valid, 1)
                ctx.set(dut.i.payload.payload, {"data": beat, "nbytes": W, "last": k == len(beats) - 1})
                await ctx.tick().until(dut.i.payload.ready)
            ctx.set(dut.i.payload.valid, 0)
            for _ in range(rng.randrange(3)):
                await ctx.tick()

    async def monitor(ctx):
        nonlocal drops
        async for _, _, stat, *vals in ctx.tick().sample(
                dut.stat_drop,
                dut.req.meta.valid, dut.req.meta.ready, dut.req.meta.payload,
                dut.req.payload.valid, dut.req.payload.ready, dut.req.payload.payload,
                dut.resp.meta.valid, dut.resp.meta.ready, dut.resp.meta.payload,
                dut.resp.payload.valid, dut.resp.payload.ready, dut.resp.payload.payload):
            drops += stat
            for name, (mv, mr, mp, pv, pr, pp) in (("req", vals[0:6]), ("resp", vals[6:12])):
                if mv and mr:
                    got[name].append([mp.opcode, mp.dest_qpn, []])
                if pv and pr:
                    got[name][-1][2].append(pp.data)

    async def backpressure(ctx):
        while True:
            for name in ("req", "resp"):
                port = getattr(dut, name)
                ctx.set(port.meta.ready, rng.random() < 0.7)
                ctx.set(port.payload.ready, rng.random() < 0.7)
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(source)
    sim.add_process(monitor)
    sim.add_process(backpressure)
    sim.run_until(4e-5)

    responses = {op.value for op in (BthOpcode.READ_RESPONSE_FIRST, BthOpcode.READ_RESPONSE_MIDDLE,
                                     BthOpcode.READ_RESPONSE_LAST, BthOpcode.READ_RESPONSE_ONLY,
                                     BthOpcode.ACKNOWLEDGE, BthOpcode.ATOMIC_ACKNOWLEDGE)}
    want = {"req": [], "resp": []}
    want_drops = 0
    for op, paylen, dst, qpn, beats in packets:
        if dst != 1 or qpn >= 4:
            want_drops += 1
        else:
            want["req" if op.value in responses else "resp"].append([op.value, qpn, beats])
    assert drops == want_drops
    assert got == want
