"""The switch (hw/net/switch.py) against a Python model: forwarding by destination MAC,
unroutable frames, lossless back-pressure (nothing lost, nothing reordered per input and
output), drop-tail (what leaves is what came in, in order, less the counted drops), the
buffer never holding more than its size, serialisation with the wire overhead, and the
store-and-forward latency. Random valid and ready on every port."""

import random

import pytest

from hw.net.switch import COUNTERS, Switch

from .port_drivers import beats_to_frames, frame_beats, run_lockstep

W = 8


def test_parameters():
    kw = dict(queue_bytes=8192, bytes_per_cycle=8.0, latency_cycles=4)
    with pytest.raises(ValueError, match=r"^n_ports must be an integer in \[2, 16\], not 17$"):
        Switch(17, W, **kw)
    with pytest.raises(ValueError, match=r"^queue_bytes must be an integer in \[4224, 16777216\], "
                                         r"not 1000$"):
        Switch(2, W, **{**kw, "queue_bytes": 1000})
    with pytest.raises(ValueError, match=r"^lossless must be True or False, not 1$"):
        Switch(2, W, **kw, lossless=1)
    with pytest.raises(ValueError, match=r"^routes\[3\] \(an output port\) must be an integer "
                                         r"in \[0, 1\], not 2$"):
        Switch(2, W, **kw, routes={3: 2})


def frame(rng, dst, length, prefix=True):
    body = bytes([2, 0, 0, 0, 0, dst] if prefix else [4, 0, 0, 0, 0, dst])
    return body + bytes(rng.randrange(256) for _ in range(length - 6))


N = 4
ROUTES = {10 + p: p for p in range(N)}          # node 10 + p sits on port p


def traffic(rng, count, hot=None, unroutable=0.0):
    """Per input: frames to random outputs (or all to ``hot``), some unroutable."""
    sent = []
    for k in range(N):
        fs = []
        for _ in range(count):
            p = hot if hot is not None else rng.randrange(N)
            length = rng.choice([14, 64, 70, rng.randint(14, 300)])
            r = rng.random()
            if r < unroutable / 2:
                fs.append((None, frame(rng, 99, length)))              # no table entry
            elif r < unroutable:
                fs.append((None, frame(rng, 10 + p, length, prefix=False)))  # foreign MAC
            else:
                fs.append((p, frame(rng, 10 + p, length)))
        sent.append(fs)
    return sent


def split_by_input(frames_out, sent, p):
    """Each frame that left output p, attributed to its input (frames are unique)."""
    index = {f: k for k in range(N) for q, f in sent[k] if q == p}
    per = {k: [] for k in range(N)}
    for f in frames_out:
        assert f in index, "a frame left an output it was not sent to, or changed"
        per[index[f]].append(f)
    return per


@pytest.mark.parametrize("seed", range(3))
def test_lossless_delivers_everything_in_order(seed):
    rng = random.Random(seed)
    dut = Switch(N, W, queue_bytes=4224 + 512, bytes_per_cycle=6.0, latency_cycles=5,
                 routes=ROUTES)
    sent = traffic(rng, 25, unroutable=0.1)
    counters = {}
    sources = [(dut.i[k], [b for _, f in sent[k] for b in frame_beats(f, W)]) for k in range(N)]
    sinks = [(dut.o[p], ("data", "nbytes", "last")) for p in range(N)]
    want = sum(1 for fs in sent for p, _ in fs if p is not None)
    got = run_and_count(dut, sources, sinks, want, counters, p_valid=0.8, p_ready=0.5,
                        seed=seed, max_cycles=40000)
    for p in range(N):
        per = split_by_input(beats_to_frames(got[p], W), sent, p)
        for k in range(N):
            assert per[k] == [f for q, f in sent[k] if q == p], (k, p)
    assert counters["n_drops"] == [0] * N
    assert counters["n_unroutable"] == [sum(1 for q, _ in sent[k] if q is None) for k in range(N)]
    assert sum(counters["n_unroutable"]) > 0
    assert counters["n_frames"] == [len(beats_to_frames(got[p], W)) for p in range(N)]
    assert counters["n_bytes"] == [sum(map(len, beats_to_frames(got[p], W))) for p in range(N)]
    cells = -(-(4224 + 512) // W)
    assert all(0 < b <= cells * W for b in counters["max_bytes"]), counters


def run_and_count(dut, sources, sinks, want, counters, **kw):
    """port_drivers.run_lockstep until ``want`` frames have left (or ``max_cycles``), then
    50 idle cycles and the switch's counters, in the same simulation."""
    async def after(ctx):
        for s, _ in sources:
            ctx.set(s.valid, 0)
        for s, _ in sinks:
            ctx.set(s.ready, 1)
        for _ in range(50):
            await ctx.tick()
        for c in COUNTERS:
            counters[c] = [ctx.get(getattr(dut, c)[p]) for p in range(N)]

    def done(got):
        return sum(sum(b["last"] for _, b in g) for g in got) >= want

    got, _ = run_lockstep(dut, sources, sinks, done=done, after=after, **kw)
    return got


@pytest.mark.parametrize("seed", range(3))
def test_drop_tail_drops_whole_frames_and_counts_them(seed):
    """All inputs to a slow output: the queue overflows; what leaves is intact and in order,
    the rest is counted as drops; nothing is back-pressured."""
    rng = random.Random(seed)
    dut = Switch(N, W, queue_bytes=4224, bytes_per_cycle=2.0, latency_cycles=3,
                 routes=ROUTES, lossless=False)
    sent = traffic(rng, 30, hot=1)
    counters = {}
    sources = [(dut.i[k], [b for _, f in sent[k] for b in frame_beats(f, W)]) for k in range(N)]
    sinks = [(dut.o[p], ("data", "nbytes", "last")) for p in range(N)]
    got = run_and_count(dut, sources, sinks, 10 ** 9, counters, p_valid=1.0, p_ready=1.0,
                        seed=seed, max_cycles=30000)
    out = beats_to_frames(got[1], W)
    per = split_by_input(out, sent, 1)
    for k in range(N):
        mine = [f for q, f in sent[k] if q == 1]
        it = iter(mine)
        assert all(f in it for f in per[k]), "not a subsequence: reordered or changed"
    total = sum(1 for fs in sent for q, _ in fs if q == 1)
    assert counters["n_drops"][1] == total - len(out) > 0
    assert counters["n_frames"][1] == len(out)
    assert all(not got[p] for p in range(N) if p != 1)
    assert counters["max_bytes"][1] <= -(-4224 // W) * W


def test_serialisation_with_wire_overhead_and_latency():
    """One input sending 64-byte frames back to back to one output at 8 bytes a cycle: a
    frame every (64 + 24) / 8 = 11 cycles; the first beat leaves no sooner than the latency
    after the frame's last beat arrived (store and forward)."""
    dut = Switch(N, W, queue_bytes=8192, bytes_per_cycle=8.0, latency_cycles=20,
                 routes=ROUTES)
    rng = random.Random(1)
    fs = [frame(rng, 12, 64) for _ in range(20)]
    sent = [[] for _ in range(N)]
    sent[0] = [(2, f) for f in fs]
    sources = [(dut.i[k], [b for _, f in sent[k] for b in frame_beats(f, W)]) for k in range(N)]
    sinks = [(dut.o[p], ("data", "nbytes", "last")) for p in range(N)]
    counters = {}
    got = run_and_count(dut, sources, sinks, 20, counters, p_valid=1.0, p_ready=1.0, seed=0,
                        max_cycles=2000)
    assert beats_to_frames(got[2], W) == fs
    ends = [c for c, b in got[2] if b["last"]]
    gaps = [b - a for a, b in zip(ends, ends[1:])]
    assert gaps[5:] == [11] * len(gaps[5:]), gaps
    # the first frame's 8 beats enter in cycles 0..7 at the earliest
    first_out = got[2][0][0]
    assert first_out >= 7 + 20, first_out


@pytest.mark.parametrize("seed", range(2))
def test_lossless_incast_fills_the_queue_and_loses_nothing(seed):
    """Every input to one slow, often stalled output: the queue fills to its size (less at
    most one frame's reserved room) and never beyond; the inputs are held back, nothing is
    lost or reordered."""
    rng = random.Random(seed)
    qb = 4224 + 1024
    dut = Switch(N, W, queue_bytes=qb, bytes_per_cycle=3.0, latency_cycles=3, routes=ROUTES)
    sent = traffic(rng, 25, hot=3)
    counters = {}
    sources = [(dut.i[k], [b for _, f in sent[k] for b in frame_beats(f, W)]) for k in range(N)]
    sinks = [(dut.o[p], ("data", "nbytes", "last")) for p in range(N)]
    got = run_and_count(dut, sources, sinks, 4 * 25, counters, p_valid=1.0, p_ready=0.3,
                        seed=seed, max_cycles=60000)
    per = split_by_input(beats_to_frames(got[3], W), sent, 3)
    for k in range(N):
        assert per[k] == [f for _, f in sent[k]], k
    cap = -(-qb // W) * W
    assert cap - 4224 - 4 * 300 <= counters["max_bytes"][3] <= cap, counters["max_bytes"]
    assert counters["n_drops"] == [0] * N
