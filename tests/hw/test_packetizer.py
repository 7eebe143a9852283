"""Packetizer and depacketizer (hw/packetizer.py, hw/depacketizer.py) against sim/roce.py."""

import random

import pytest
from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.sim import Simulator

from hw.formats import BthOpcode, PKT_META
from hw.packetizer import Packetizer
from sim import roce


# ---------------------------------------------------------------------------- helpers

async def put(ctx, s, payload, rng, p_idle):
    while rng.random() < p_idle:
        ctx.set(s.valid, 0)
        await ctx.tick()
    ctx.set(s.valid, 1)
    ctx.set(s.payload, payload)
    await ctx.tick().until(s.ready)
    ctx.set(s.valid, 0)


async def get(ctx, s, rng, p_idle):
    while rng.random() < p_idle:
        ctx.set(s.ready, 0)
        await ctx.tick()
    ctx.set(s.ready, 1)
    payload, = await ctx.tick().sample(s.payload).until(s.valid)
    ctx.set(s.ready, 0)
    return payload


def beats_of(data, w):
    return [{"data": int.from_bytes(data[i:i + w], "little"), "nbytes": len(data[i:i + w]),
             "last": int(i + w >= len(data))} for i in range(0, len(data), w)]


def meta_value(meta):
    return {name: int(meta.get(name, 0)) for name, _ in PKT_META}


def random_meta(rng, op, payload):
    meta = {name: rng.getrandbits(w) for name, w in roce._WIDTH.items()}
    meta["opcode"] = op.value
    meta["paylen"] = len(payload)
    return meta


def random_case(rng, op, maxlen):
    n = 0 if op in roce.NO_PAYLOAD_OPCODES else rng.choice(
        [0, 1, 2, 3, 4, 5, rng.randrange(0, maxlen + 1), rng.randrange(0, maxlen + 1)])
    payload = rng.randbytes(n)
    return random_meta(rng, op, payload), payload


async def read_frame(ctx, s, w, rng, p_idle):
    out = b""
    while True:
        beat = await get(ctx, s, rng, p_idle)
        n = beat.nbytes
        assert 1 <= n <= w
        out += beat.data.to_bytes(w, "little")[:n]
        if beat.last:
            return out
        assert n == w, "short beat before the last one"


def run_packetizer(w, cases, seed, p_idle=0.3):
    dut = Packetizer(w)
    rng = random.Random(seed)
    got = []

    async def meta_tb(ctx):
        for meta, _ in cases:
            await put(ctx, dut.i.meta, meta_value(meta), rng, p_idle)

    async def pay_tb(ctx):
        for _, payload in cases:
            for beat in beats_of(payload, w):
                await put(ctx, dut.i.payload, beat, rng, p_idle)

    async def out_tb(ctx):
        for _ in cases:
            got.append(await read_frame(ctx, dut.o, w, rng, p_idle))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(meta_tb, background=True)
    sim.add_testbench(pay_tb, background=True)
    sim.add_testbench(out_tb)
    sim.run()
    return got


# ---------------------------------------------------------------------------- packetizer

def test_packetizer_w8_all_opcodes():
    rng = random.Random(1)
    cases = [random_case(rng, op, 600) for op in BthOpcode for _ in range(3)]
    got = run_packetizer(8, cases, 2)
    assert len(got) == len(cases)
    for (meta, payload), frame in zip(cases, got):
        assert frame == roce.encode(meta, payload), BthOpcode(meta["opcode"])


def test_packetizer_w64():
    rng = random.Random(3)
    ops = [BthOpcode.SEND_ONLY, BthOpcode.WRITE_ONLY_IMM, BthOpcode.READ_RESPONSE_ONLY,
           BthOpcode.COMPARE_SWAP, BthOpcode.ATOMIC_ACKNOWLEDGE, BthOpcode.SEND_LAST_IMM,
           BthOpcode.WRITE_FIRST, BthOpcode.ACKNOWLEDGE]
    cases = [random_case(rng, op, 300) for op in ops for _ in range(2)]
    got = run_packetizer(64, cases, 4)
    assert len(got) == len(cases)
    for (meta, payload), frame in zip(cases, got):
        assert frame == roce.encode(meta, payload), BthOpcode(meta["opcode"])


def test_packetizer_throughput():
    """Without back-pressure a long payload goes out at one beat per cycle."""
    w = 8
    dut = Packetizer(w)
    payload = bytes(range(256)) * 2
    meta = random_meta(random.Random(5), BthOpcode.SEND_ONLY, payload)

    async def in_tb(ctx):
        ctx.set(dut.i.meta.valid, 1)
        ctx.set(dut.i.meta.payload, meta_value(meta))
        await ctx.tick().until(dut.i.meta.ready)
        ctx.set(dut.i.meta.valid, 0)
        ctx.set(dut.i.payload.valid, 1)
        for beat in beats_of(payload, w):
            ctx.set(dut.i.payload.payload, beat)
            await ctx.tick().until(dut.i.payload.ready)
        ctx.set(dut.i.payload.valid, 0)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(in_tb, background=True)

    async def timed(ctx):
        ctx.set(dut.o.ready, 1)
        data = b""
        t = 0
        valid_cycles = []
        while True:
            _, _, valid, beat = await ctx.tick().sample(dut.o.valid, dut.o.payload)
            t += 1
            assert t < 2000, "timeout"
            if valid:
                valid_cycles.append(t)
                data += beat.data.to_bytes(w, "little")[:beat.nbytes]
                if beat.last:
                    break
        assert data == roce.encode(meta, payload)
        span = valid_cycles[-1] - valid_cycles[0] + 1
        assert span == len(valid_cycles), (span, len(valid_cycles))

    sim.add_testbench(timed)
    sim.run()


def test_packetizer_bad_width():
    with pytest.raises(ValueError, match=r"data_bytes must be a power of two in \[8, 64\], not 12"):
        Packetizer(12)
    with pytest.raises(ValueError, match=r"data_bytes must be a power of two in \[8, 64\], not 128"):
        Packetizer(128)
