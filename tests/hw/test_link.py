"""Link: serialisation rate and latency measured in simulation equal the configured ones."""

import random

import pytest
from amaranth.lib.wiring import In, Out
from amaranth.sim import Simulator

from hw.config import preset
from hw.net.fault import COUNTERS, ZERO_SEED_STATE, xorshift32
from hw.net.link import Link, link_params

from .port_drivers import beats_to_frames, frame_beats


def run_link(dut, frames, *, p_valid=1.0, p_ready=1.0, seed=0, max_cycles=20000,
             ready_off=(), faults=None, frame_faults=None, expect_beats=None, counters=None):
    """Offer ``frames`` back to back on ``i`` and collect ``o``; cycle-accurate record.

    Returns (accept_cycles, out) where out is a list of (cycle, beat dict) and
    ``ready_off`` is a set of cycles in which ``o.ready`` is forced low. ``faults`` sets
    ``fault_<name>`` inputs (and loads ``fault_seed``) before the start; ``frame_faults(j)``
    gives inputs set when frame ``j``'s first beat is offered. The run ends when
    ``expect_beats`` (default: all) beats came out; ``counters`` (a dict) receives the
    ``fault_n_*`` counters at the end.
    """
    rng = random.Random(seed)
    W = dut.data_bytes
    beats = [b for f in frames for b in frame_beats(f, W)]
    starts = {}
    for j, f in enumerate(frames):
        starts[sum(len(frame_beats(g, W)) for g in frames[:j])] = j
    if expect_beats is None:
        expect_beats = len(beats)
    accepted, out = [], []
    frames_seen = []

    async def tb(ctx):
        if faults:
            for k, v in faults.items():
                ctx.set(getattr(dut, f"fault_{k}"), v)
            ctx.set(dut.fault_seed_load, 1)
            await ctx.tick()
            ctx.set(dut.fault_seed_load, 0)
        pos, offering = 0, False
        for cycle in range(max_cycles):
            if not offering and pos < len(beats) and rng.random() < p_valid:
                offering = True
                if frame_faults is not None and pos in starts:
                    for k, v in frame_faults(starts[pos]).items():
                        ctx.set(getattr(dut, f"fault_{k}"), v)
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
            if len(out) == expect_beats and pos == len(beats):
                break
        ctx.set(dut.o.ready, 0)
        await ctx.tick()
        frames_seen.append(ctx.get(dut.frames))
        if counters is not None:
            for name in COUNTERS:
                counters[name] = ctx.get(getattr(dut, f"fault_{name}"))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()
    return beats, accepted, out, frames_seen[-1]


def rand_frames(rng, n, lo=1, hi=200):
    return [bytes(rng.randrange(256) for _ in range(rng.randint(lo, hi))) for _ in range(n)]


@pytest.mark.parametrize("latency", [3, 7, 40])
def test_latency_single_beat(latency):
    dut = Link(8, latency, 8.0)
    beats, acc, out, _ = run_link(dut, [bytes(range(8))])
    assert len(out) == 1
    assert out[0][0] - acc[0] == latency
    assert beats_to_frames(out, 64) == [bytes(range(8))]


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
    assert beats_to_frames(out, 64) == frames
    assert nframes == 12


@pytest.mark.parametrize("rate", [0.5, 3.0, 12.5, 100.0])
def test_throughput_matches_rate(rate):
    W = 8
    dut = Link(W, 5, rate)
    rng = random.Random(int(rate * 10))
    frames = rand_frames(rng, 30, 20, 130)
    beats, acc, out, _ = run_link(dut, frames, max_cycles=40000)
    assert beats_to_frames(out, 64) == frames
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
    assert beats_to_frames(out, 64) == frames
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
    assert beats_to_frames(out, 64) == frames


def test_wide_beats():
    dut = Link(64, 12, 25.0)
    rng = random.Random(1)
    frames = rand_frames(rng, 6, 60, 300)
    beats, acc, out, nframes = run_link(dut, frames, p_ready=0.7, seed=2)
    assert beats_to_frames(out, 64) == frames
    assert nframes == 6


def test_long_stall_does_not_wrap_time_stamps():
    # latency 3 -> 3-bit time stamps; stall output far longer than their range
    dut = Link(8, 3, 8.0, fifo_beats=16)
    frames = [bytes([k]) * 32 for k in range(4)]
    stall = set(range(2, 300))
    beats, acc, out, _ = run_link(dut, frames, ready_off=stall, max_cycles=600)
    assert beats_to_frames(out, 64) == frames
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
    (dict(max_frame_bytes=10), r"max_frame_bytes must be an integer in \[64, 16384\], not 10"),
    (dict(reorder_window=0), r"reorder_window must be an integer in \[1, 16\], not 0"),
    (dict(faults=1), r"faults must be True or False, not 1"),
])
def test_bad_parameters(kw, msg):
    args = dict(data_bytes=8, latency_cycles=4, bytes_per_cycle=1.0)
    args.update(kw)
    with pytest.raises(ValueError, match=msg):
        Link(**args)


def lost_frames(seed, n, loss):
    """Python model of the injector's loss decisions (no other fault enabled)."""
    st, out = seed or ZERO_SEED_STATE, []
    for _ in range(n):
        s1 = xorshift32(st)
        out.append((s1 & 0xFFFF) < loss)
        st = xorshift32(xorshift32(s1))
    return out


def test_fault_loss_keeps_latency_of_delivered_frames():
    W, lat = 8, 20
    dut = Link(W, lat, 8.0, faults=True)
    rng = random.Random(21)
    frames = rand_frames(rng, 30, 1, 60)
    lost = lost_frames(5, len(frames), 0x5000)
    kept = [f for f, x in zip(frames, lost) if not x]
    n_kept_beats = sum(len(frame_beats(f, W)) for f in kept)
    ctr = {}
    beats, acc, out, nframes = run_link(dut, frames, faults=dict(seed=5, loss=0x5000),
                                        expect_beats=n_kept_beats, counters=ctr)
    assert beats_to_frames(out, 64) == kept
    assert ctr["n_lost"] == sum(lost) > 0
    assert ctr["n_frames"] == len(frames) and nframes == len(kept)
    # the accepted beats of the kept frames come out exactly `lat` cycles later
    kept_acc = []
    k = 0
    for f, x in zip(frames, lost):
        nb = len(frame_beats(f, W))
        if not x:
            kept_acc += acc[k:k + nb]
        k += nb
    assert [c for c, _ in out] == [a + lat for a in kept_acc]


def test_fault_down_drops_frames_while_down():
    W = 8
    dut = Link(W, 6, 4.0, faults=True)
    frames = rand_frames(random.Random(22), 12, 8, 40)
    down = [3 <= j < 7 for j in range(len(frames))]
    kept = [f for f, d in zip(frames, down) if not d]
    ctr = {}
    beats, acc, out, nframes = run_link(
        dut, frames, frame_faults=lambda j: {"down": int(down[j])}, p_ready=0.7, seed=4,
        expect_beats=sum(len(frame_beats(f, W)) for f in kept), counters=ctr)
    assert beats_to_frames(out, 64) == kept
    assert ctr["n_down"] == 4 and ctr["n_lost"] == 0 and ctr["n_frames"] == 12


def test_fault_ports_only_with_faults():
    assert "fault_loss" not in Link(8, 4, 2.0).signature.members
    dut = Link(8, 4, 2.0, faults=True, max_frame_bytes=64)
    assert dut.signature.members["fault_loss"].flow == In
    assert dut.signature.members["fault_n_lost"].flow == Out
    # controls at 0: same timing as without the injector
    frames = rand_frames(random.Random(23), 6, 1, 100)
    runs = [run_link(d, frames, p_ready=0.6, seed=5)
            for d in (dut, Link(8, 4, 2.0, max_frame_bytes=64))]
    assert runs[0] == runs[1]
    assert beats_to_frames(runs[0][2], 64) == frames
