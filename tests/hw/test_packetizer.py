"""Packetizer and depacketizer (hw/net/packetizer.py, hw/net/depacketizer.py) against sim/roce.py."""

import random

import pytest
from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.sim import Simulator

from hw.formats import BthOpcode, PKT_META
from hw.net.packetizer import Packetizer
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
    for _ in range(20000):
        _, _, valid, payload = await ctx.tick().sample(s.valid, s.payload)
        if valid:
            break
    else:
        raise AssertionError("timeout waiting for a beat")
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


@pytest.mark.parametrize("w", [16, 32])
def test_packetizer_other_widths(w):
    rng = random.Random(w)
    ops = [BthOpcode.SEND_ONLY, BthOpcode.WRITE_ONLY_IMM, BthOpcode.READ_RESPONSE_FIRST,
           BthOpcode.FETCH_ADD, BthOpcode.ATOMIC_ACKNOWLEDGE, BthOpcode.WRITE_ONLY]
    cases = [random_case(rng, op, 100) for op in ops]
    got = run_packetizer(w, cases, w + 1)
    assert got == [roce.encode(meta, payload) for meta, payload in cases]


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


def test_packetizer_frames_back_to_back():
    """Header-only packets (8-byte READ requests, two beats at W = 64) offered all the time,
    output never back-pressured: the frames leave without an idle cycle between them, each
    byte for byte as sim/roce.py encodes it."""
    w, n = 64, 12
    rng = random.Random(8)
    metas = [random_meta(rng, BthOpcode.READ_REQUEST, b"") for _ in range(n)]
    dut = Packetizer(w)

    async def in_tb(ctx):
        ctx.set(dut.i.meta.valid, 1)
        for meta in metas:
            ctx.set(dut.i.meta.payload, meta_value(meta))
            await ctx.tick().until(dut.i.meta.ready)
        ctx.set(dut.i.meta.valid, 0)

    async def out_tb(ctx):
        ctx.set(dut.o.ready, 1)
        frames, cur, cycles = [], b"", []
        t = 0
        while len(frames) < n:
            _, _, valid, beat = await ctx.tick().sample(dut.o.valid, dut.o.payload)
            t += 1
            assert t < 1000, "timeout"
            if valid:
                cycles.append(t)
                cur += beat.data.to_bytes(w, "little")[:beat.nbytes]
                if beat.last:
                    frames.append(cur)
                    cur = b""
        assert frames == [roce.encode(meta, b"") for meta in metas]
        assert len(cycles) == 2 * n and cycles[-1] - cycles[0] + 1 == 2 * n

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(in_tb, background=True)
    sim.add_testbench(out_tb)
    sim.run()


def test_packetizer_bad_width():
    with pytest.raises(ValueError, match=r"data_bytes must be a power of two in \[8, 64\], not 12"):
        Packetizer(12)
    with pytest.raises(ValueError, match=r"data_bytes must be a power of two in \[8, 64\], not 128"):
        Packetizer(128)


# ---------------------------------------------------------------------------- depacketizer

import struct  # noqa: E402

from hw.net.depacketizer import Depacketizer  # noqa: E402


def rebuild(frame_wo_icrc):
    """Fix IPv4/UDP lengths, IPv4 checksum and ICRC of a frame given without its ICRC."""
    f = bytearray(frame_wo_icrc) + bytes(4)
    f[16:18] = struct.pack("!H", len(f) - 14)
    f[38:40] = struct.pack("!H", len(f) - 34)
    f[24:26] = b"\0\0"
    f[24:26] = struct.pack("!H", roce._ip_checksum(bytes(f[14:34])))
    f[-4:] = roce.icrc(f).to_bytes(4, "little")
    return bytes(f)


def fix_crc(f):
    f = bytearray(f)
    f[-4:] = roce.icrc(f).to_bytes(4, "little")
    return bytes(f)


def set_bytes(frame, off, val, fix_ip=True):
    f = bytearray(frame)
    f[off:off + len(val)] = val
    if fix_ip:
        f[24:26] = b"\0\0"
        f[24:26] = struct.pack("!H", roce._ip_checksum(bytes(f[14:34])))
    return fix_crc(f)


def malformed_frames(rng):
    """(name, beats or frame) of every malformed kind, each with a correct ICRC."""
    def enc(op, n=0):
        meta, payload = random_case(rng, op, 0)
        payload = rng.randbytes(n)
        return roce.encode(dict(meta, paylen=n), payload)
    send = enc(BthOpcode.SEND_ONLY, 20)
    out = [
        ("ethertype", set_bytes(send, 12, b"\x86\xdd")),
        ("version", set_bytes(send, 14, b"\x46")),
        ("protocol", set_bytes(send, 23, b"\x06")),
        ("ip checksum", set_bytes(send, 24, b"\x12\x34", fix_ip=False)),
        ("dport", set_bytes(send, 36, b"\x12\xb8")),
        ("ip length", set_bytes(send, 16, struct.pack("!H", len(send) - 13))),
        ("udp length", set_bytes(send, 38, struct.pack("!H", len(send) - 33))),
        ("opcode 0x15", set_bytes(send, 42, b"\x15")),
        # the rest of the RC range (0x16/0x17: SEND with Invalidate, not modelled), another
        # transport's opcodes (UC 0x20, UD 0x64), CNP and the top value: docs/errors.md
        ("opcode 0x16", set_bytes(send, 42, b"\x16")),
        ("opcode 0x17", set_bytes(send, 42, b"\x17")),
        ("opcode 0x1f", set_bytes(send, 42, b"\x1f")),
        ("opcode UC SEND_FIRST", set_bytes(send, 42, b"\x20")),
        ("opcode UD SEND_ONLY", set_bytes(send, 42, b"\x64")),
        ("opcode CNP", set_bytes(send, 42, b"\x81")),
        ("opcode 0xff", set_bytes(send, 42, b"\xff")),
        ("tver", set_bytes(send, 43, bytes([send[43] | 1]))),
        ("short for RETH", rebuild(set_bytes(send, 42, b"\x0a")[:54 + 12])),
        ("short for AtomicETH", rebuild(set_bytes(send, 42, b"\x13")[:54 + 24])),
        ("pad > payload", rebuild(set_bytes(enc(BthOpcode.SEND_ONLY, 0), 43, b"\x20")[:-4]
                                  + b"\0")),
        ("pad on ACK", rebuild(set_bytes(enc(BthOpcode.ACKNOWLEDGE), 43, b"\x10")[:-4]
                               + b"\0")),
        ("payload on READ_REQUEST", rebuild(enc(BthOpcode.READ_REQUEST)[:-4] + b"abcd")),
        ("payload on FETCH_ADD", rebuild(enc(BthOpcode.FETCH_ADD)[:-4] + b"abcd")),
        ("payload on ATOMIC_ACK", rebuild(enc(BthOpcode.ATOMIC_ACKNOWLEDGE)[:-4] + b"abcd")),
        ("too short", send[:50]),
        ("too long", enc(BthOpcode.SEND_ONLY, 300)),
    ]
    return out


def icrc_frames(rng, n):
    masked = {15, 22, 24, 25, 40, 41, 46}
    out = []
    for _ in range(n):
        meta, payload = random_case(rng, rng.choice(list(BthOpcode)), 200)
        f = bytearray(roce.encode(meta, payload))
        off = rng.choice([o for o in range(14, len(f)) if o not in masked])
        f[off] ^= 1 << rng.randrange(8)
        out.append((f"flip@{off}", bytes(f)))
    return out


def run_depacketizer(w, items, seed, max_frame_bytes=256, p_idle=0.3, p_idle_out=None):
    """items: (frame bytes or explicit beat list). Returns (packets out, stats)."""
    dut = Depacketizer(w, max_frame_bytes)
    rng = random.Random(seed)
    n_ok = sum(1 for it in items if isinstance(it, bytes)
               and roce.classify(it, max_frame_bytes) == "ok")
    got, stats = [], []
    done = []
    p_out = p_idle if p_idle_out is None else p_idle_out

    async def in_tb(ctx):
        for it in items:
            for beat in (beats_of(it, w) if isinstance(it, bytes) else it):
                await put(ctx, dut.i, beat, rng, p_idle)
        done.append(1)

    async def stat_tb(ctx):
        while True:
            _, _, ok, ic, mf, nb = await ctx.tick().sample(
                dut.stat_ok, dut.stat_icrc, dut.stat_malformed, dut.stat_bytes)
            assert ok + ic + mf <= 1
            if ok or ic or mf:
                stats.append(("ok" if ok else "icrc" if ic else "malformed", nb))

    async def out_tb(ctx):
        for _ in range(n_ok):
            meta = await get(ctx, dut.o.meta, rng, p_out)
            meta = {name: int(getattr(meta, name)) for name, _ in PKT_META}
            payload = b""
            if meta["paylen"]:
                while True:
                    beat = await get(ctx, dut.o.payload, rng, p_out)
                    assert 1 <= beat.nbytes <= w
                    payload += beat.data.to_bytes(w, "little")[:beat.nbytes]
                    if beat.last:
                        break
                    assert beat.nbytes == w
            got.append((meta, payload))
        # nothing else comes out, every input is consumed
        ctx.set(dut.o.meta.ready, 1)
        ctx.set(dut.o.payload.ready, 1)
        for _ in range(200):
            _, _, mv, pv = await ctx.tick().sample(dut.o.meta.valid, dut.o.payload.valid)
            assert not mv and not pv
        assert done

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(in_tb, background=True)
    sim.add_testbench(stat_tb, background=True)
    sim.add_testbench(out_tb)
    sim.run()
    return got, stats


def check_depacketizer(w, frames, seed, max_frame_bytes=256, **kw):
    got, stats = run_depacketizer(w, frames, seed, max_frame_bytes, **kw)
    expect = [roce.decode(f) for f in frames if roce.classify(f, max_frame_bytes) == "ok"]
    assert len(got) == len(expect)
    for (m, p), (em, ep, _) in zip(got, expect):
        assert m == em and p == ep
    assert stats == [(roce.classify(f, max_frame_bytes), min(len(f), 65535)) for f in frames]


def test_depacketizer_good_w8():
    rng = random.Random(11)
    frames = [roce.encode(*random_case(rng, op, 150)) for op in BthOpcode for _ in range(2)]
    check_depacketizer(8, frames, 12)


def test_depacketizer_good_w64():
    rng = random.Random(13)
    frames = [roce.encode(*random_case(rng, op, 150)) for op in BthOpcode]
    check_depacketizer(64, frames, 14)


def test_depacketizer_drops_w8():
    rng = random.Random(15)
    frames = []
    kinds = malformed_frames(rng) + icrc_frames(rng, 25)
    for name, bad in kinds:
        want = "icrc" if name.startswith("flip") else "malformed"
        assert roce.classify(bad, 256) == want, name
        frames.append(bad)
        frames.append(roce.encode(*random_case(rng, rng.choice(list(BthOpcode)), 60)))
    check_depacketizer(8, frames, 16)


def test_depacketizer_drops_w64():
    rng = random.Random(17)
    frames = []
    for name, bad in malformed_frames(rng) + icrc_frames(rng, 6):
        frames.append(bad)
        frames.append(roce.encode(*random_case(rng, rng.choice(list(BthOpcode)), 60)))
    check_depacketizer(64, frames, 18)


def test_depacketizer_flip_every_byte():
    """A bit flipped in each byte of a frame: the outcome is the reference's; only the
    bytes the ICRC does not cover and that no header check reads get through."""
    rng = random.Random(27)
    meta, payload = random_case(rng, BthOpcode.SEND_ONLY_IMM, 0)
    payload = rng.randbytes(9)
    good = roce.encode(dict(meta, paylen=9), payload)
    frames, undetected = [], set()
    for off in range(len(good)):
        f = bytearray(good)
        f[off] ^= 1 << rng.randrange(8)
        frames += [bytes(f), good]
        if roce.classify(bytes(f)) == "ok":
            undetected.add(off)
    # MAC addresses, UDP checksum, BTH byte 4 (FECN/BECN/resv6)
    assert undetected == set(range(12)) | {40, 41, 46}
    check_depacketizer(8, frames, 28)


def test_depacketizer_slow_reader():
    """A slow consumer fills the frame ring and the descriptor FIFO: input must wait, and
    no frame may be overwritten before it has been read out."""
    rng = random.Random(23)
    frames = []
    for i in range(40):
        op = rng.choice([BthOpcode.SEND_ONLY, BthOpcode.ACKNOWLEDGE, BthOpcode.WRITE_ONLY])
        meta, payload = random_case(rng, op, 60)
        frames.append(roce.encode(meta, payload))
        if i % 7 == 3:
            frames.append(icrc_frames(rng, 1)[0][1])
    check_depacketizer(8, frames, 24, max_frame_bytes=128, p_idle=0.0, p_idle_out=0.85)
    # mostly header-only frames in a large ring: the descriptor FIFO fills first
    frames = []
    for i in range(30):
        op = rng.choice([BthOpcode.ACKNOWLEDGE, BthOpcode.READ_REQUEST, BthOpcode.SEND_ONLY])
        frames.append(roce.encode(*random_case(rng, op, 8)))
    check_depacketizer(8, frames, 26, max_frame_bytes=1024, p_idle=0.0, p_idle_out=0.95)


def test_depacketizer_throughput():
    """Back-to-back frames are received at one beat per cycle (input never waits) when
    the output is always ready."""
    w = 8
    rng = random.Random(25)
    frames = [roce.encode(*random_case(rng, BthOpcode.SEND_ONLY, 300)) for _ in range(6)]
    frames += [roce.encode(*random_case(rng, BthOpcode.ACKNOWLEDGE, 0)) for _ in range(4)]
    dut = Depacketizer(w)
    beats = [b for f in frames for b in beats_of(f, w)]
    n_out = []

    async def in_tb(ctx):
        ctx.set(dut.i.valid, 1)
        for i, beat in enumerate(beats):
            ctx.set(dut.i.payload, beat)
            _, _, ready = await ctx.tick().sample(dut.i.ready)
            assert ready, f"input stalled at beat {i}"
        ctx.set(dut.i.valid, 0)

    async def out_tb(ctx):
        ctx.set(dut.o.meta.ready, 1)
        ctx.set(dut.o.payload.ready, 1)
        for _ in range(len(beats) + 100):
            _, _, mv = await ctx.tick().sample(dut.o.meta.valid)
            n_out.append(mv)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(in_tb, background=True)
    sim.add_testbench(out_tb)
    sim.run()
    assert sum(n_out) == len(frames)


def test_depacketizer_bad_beats():
    """Malformed beat structure (empty beat, short beat in the middle) and giant frames."""
    w = 8
    rng = random.Random(19)
    good = [roce.encode(*random_case(rng, BthOpcode.SEND_ONLY, 40)) for _ in range(4)]
    b0 = beats_of(good[0], w)
    mid_short = b0[:3] + [dict(b0[3], nbytes=5)] + b0[4:]
    empty = b0[:2] + [dict(b0[2], nbytes=0)] + b0[2:]
    giant = [{"data": rng.getrandbits(64), "nbytes": 8, "last": 0} for _ in range(8192)]
    giant.append({"data": 0, "nbytes": 3, "last": 1})
    items = [mid_short, good[1], empty, good[2], giant, good[3]]
    got, stats = run_depacketizer(w, items, 20, p_idle=0.1)
    assert [p for _, p in got] == [roce.decode(f)[1] for f in good[1:]]
    assert stats == [("malformed", len(good[0]) - 3), ("ok", len(good[1])),
                     ("malformed", len(good[0])), ("ok", len(good[2])),
                     ("malformed", 65535), ("ok", len(good[3]))]


def test_roundtrip_w8():
    """depacketizer(packetizer(x)) == x with back-pressure on both ends."""
    w = 8
    rng = random.Random(21)
    cases = [random_case(rng, op, 300) for op in BthOpcode for _ in range(2)]
    top = Module()
    top.submodules.tx = tx = Packetizer(w)
    top.submodules.rx = rx = Depacketizer(w)
    wiring.connect(top, tx.o, rx.i)
    got = []

    async def meta_tb(ctx):
        for meta, _ in cases:
            await put(ctx, tx.i.meta, meta_value(meta), rng, 0.3)

    async def pay_tb(ctx):
        for _, payload in cases:
            for beat in beats_of(payload, w):
                await put(ctx, tx.i.payload, beat, rng, 0.3)

    async def out_tb(ctx):
        for _ in cases:
            meta = await get(ctx, rx.o.meta, rng, 0.3)
            meta = {name: int(getattr(meta, name)) for name, _ in PKT_META}
            payload = b""
            for _ in range(-(-meta["paylen"] // w)):
                beat = await get(ctx, rx.o.payload, rng, 0.3)
                payload += beat.data.to_bytes(w, "little")[:beat.nbytes]
            got.append((meta, payload))

    sim = Simulator(top)
    sim.add_clock(1e-8)
    sim.add_testbench(meta_tb, background=True)
    sim.add_testbench(pay_tb, background=True)
    sim.add_testbench(out_tb)
    sim.run()
    assert got == [(roce.normalize(meta, payload), payload) for meta, payload in cases]


def test_depacketizer_bad_params():
    with pytest.raises(ValueError, match=r"data_bytes must be a power of two in \[8, 64\], not 3"):
        Depacketizer(3)
    with pytest.raises(ValueError, match=r"max_frame_bytes must be an integer in \[128, 65535\], not 64"):
        Depacketizer(8, 64)
    with pytest.raises(ValueError, match=r"max_frame_bytes must be an integer in \[128, 65535\], not 70000"):
        Depacketizer(8, 70000)
