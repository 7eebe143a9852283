"""Link: serialisation rate and latency measured in simulation equal the configured ones."""

import random

import pytest
from amaranth.sim import Simulator

from hw.config import preset
from hw.link import Link, link_params


def frame_beats(frame, W):
    beats = []
    for off in range(0, len(frame), W):
        chunk = frame[off:off + W]
        beats.append({"data": int.from_bytes(chunk, "little"), "nbytes": len(chunk),
                      "last": int(off + W >= len(frame))})
    return beats


def run_link(dut, frames, *, p_valid=1.0, p_ready=1.0, seed=0, max_cycles=20000,
             ready_off=()):
    """Offer ``frames`` back to back on ``i`` and collect ``o``; cycle-accurate record.

    Returns (accept_cycles, out) where out is a list of (cycle, beat dict) and
    ``ready_off`` is a set of cycles in which ``o.ready`` is forced low.
    """
    rng = random.Random(seed)
    W = dut.data_bytes
    beats = [b for f in frames for b in frame_beats(f, W)]
    accepted, out = [], []
    frames_seen = []

    async def tb(ctx):
        pos, offering = 0, False
        for cycle in range(max_cycles):
            if not offering and pos < len(beats) and rng.random() < p_valid:
                offering = True
            ctx.set(dut.i.valid, offering)
            if offering:
                ctx.set(dut.i.payload, beats[pos])
            ctx.set(dut.o.ready, cycle not in ready_off and rng.random() < p_ready)
            _, _, iv, ir, ov, ordy, op, nfr = await ctx.tick().sample(
                dut.i.valid, dut.i.ready, dut.o.valid, dut.o.ready, dut.o.payload, dut.frames)
            frames_seen.append(nfr)
            if iv and ir:
                accepted.append(cycle)
                pos += 1
                offering = False
            if ov and ordy:
                out.append((cycle, {"data": op.data, "nbytes": op.nbytes, "last": op.last}))
            if len(out) == len(beats):
                break
        ctx.set(dut.o.ready, 0)
        await ctx.tick()
        frames_seen.append(ctx.get(dut.frames))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()
    return beats, accepted, out, frames_seen[-1]


def decode(out):
    frames, cur = [], b""
    for _, b in out:
        cur += b["data"].to_bytes(64, "little")[:b["nbytes"]]
        if b["last"]:
            frames.append(cur)
            cur = b""
    return frames


def rand_frames(rng, n, lo=1, hi=200):
    return [bytes(rng.randrange(256) for _ in range(rng.randint(lo, hi))) for _ in range(n)]


@pytest.mark.parametrize("latency", [3, 7, 40])
def test_latency_single_beat(latency):
    dut = Link(8, latency, 8.0)
    beats, acc, out, _ = run_link(dut, [bytes(range(8))])
    assert len(out) == 1
    assert out[0][0] - acc[0] == latency
    assert decode(out) == [bytes(range(8))]


def test_latency_below_pipeline_is_min_latency():
    dut = Link(8, 0, 8.0)
    assert dut.effective_latency == Link.MIN_LATENCY
    _, acc, out, _ = run_link(dut, [b"\x55" * 5])
    assert out[0][0] - acc[0] == Link.MIN_LATENCY


def test_throughput_64_byte_frames_4_bytes_per_cycle():
    dut = Link(8, 10, 4.0)
    frames = [bytes([k] * 64) for k in range(12)]
    beats, acc, out, nframes = run_link(dut, frames)
    # every beat: exactly latency after acceptance (nothing back-pressures the output)
    assert [c for c, _ in out] == [a + 10 for a in acc]
    # steady state: one 8-byte beat per 2 cycles, one frame per 16 cycles
    last_beats = [c for c, b in out if b["last"]]
    gaps = {b - a for a, b in zip(last_beats, last_beats[1:])}
    assert gaps == {16}
    assert decode(out) == frames
    assert nframes == 12


@pytest.mark.parametrize("rate", [0.5, 3.0, 12.5, 100.0])
def test_throughput_matches_rate(rate):
    W = 8
    dut = Link(W, 5, rate)
    rng = random.Random(int(rate * 10))
    frames = rand_frames(rng, 30, 20, 130)
    beats, acc, out, _ = run_link(dut, frames, max_cycles=40000)
    assert decode(out) == frames
    total = sum(len(f) for f in frames)
    span = acc[-1] - acc[0]
    # bytes sent before the last beat, divided by the cycles it took: the configured rate
    # (at most one beat per cycle); allow the rounding of the first/last beat.
    sent = total - beats[-1]["nbytes"]
    expected = min(rate, W)
    if rate >= W:
        assert span == len(beats) - 1
    else:
        assert abs(sent / span - expected) <= expected * 0.01 + W / span


def test_backpressure_and_random_valid_keep_data_intact():
    W = 8
    dut = Link(W, 20, 6.0, fifo_beats=8)
    rng = random.Random(7)
    frames = rand_frames(rng, 40, 1, 100)
    beats, acc, out, nframes = run_link(dut, frames, p_valid=0.6, p_ready=0.4, seed=3,
                                        max_cycles=60000)
    assert decode(out) == frames
    assert nframes == len(frames)
    # no beat is ever visible before its latency has elapsed
    assert all(c - a >= 20 for (c, _), a in zip(out, acc))


def test_full_fifo_back_pressures_input():
    W = 8
    dut = Link(W, 6, 8.0, fifo_beats=4)
    frames = [bytes([k]) * 64 for k in range(3)]
    stall = set(range(0, 200))
    beats, acc, out, _ = run_link(dut, frames, ready_off=stall, max_cycles=400)
    # 4 beats in the FIFO plus one in the output register; then input waits for o.ready
    assert sum(1 for a in acc if a < 200) == 5
    assert decode(out) == frames


def test_wide_beats():
    dut = Link(64, 12, 25.0)
    rng = random.Random(1)
    frames = rand_frames(rng, 6, 60, 300)
    beats, acc, out, nframes = run_link(dut, frames, p_ready=0.7, seed=2)
    assert decode(out) == frames
    assert nframes == 6


def test_long_stall_does_not_wrap_time_stamps():
    # latency 3 -> 3-bit time stamps; stall output far longer than their range
    dut = Link(8, 3, 8.0, fifo_beats=16)
    frames = [bytes([k]) * 32 for k in range(4)]
    stall = set(range(2, 300))
    beats, acc, out, _ = run_link(dut, frames, ready_off=stall, max_cycles=600)
    assert decode(out) == frames
    # after the stall, the queued beats leave one per cycle
    cycles = [c for c, _ in out]
    assert cycles == list(range(300, 300 + len(cycles)))


def test_link_params_from_preset():
    cfg = preset("small")
    p = link_params(cfg)
    assert p == {"data_bytes": 8, "latency_cycles": 25, "bytes_per_cycle": 50.0}  # 100 Gb/s at 250 MHz
    Link(**p)


@pytest.mark.parametrize("kw, msg", [
    (dict(data_bytes=12), r"data_bytes must be a power of two in \[8, 64\], not 12"),
    (dict(latency_cycles=-1), r"latency_cycles must be an integer in \[0, 16777216\], not -1"),
    (dict(bytes_per_cycle=0), r"bytes_per_cycle must be a number in \[0.0009765625, 4096.0\]"),
    (dict(fifo_beats=6), r"fifo_beats must be a power of two in \[4, 65536\], not 6"),
])
def test_bad_parameters(kw, msg):
    args = dict(data_bytes=8, latency_cycles=4, bytes_per_cycle=1.0)
    args.update(kw)
    with pytest.raises(ValueError, match=msg):
        Link(**args)
