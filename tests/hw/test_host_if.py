"""The NIC's host interface (hw/dma/): tagged reads with completions in any order, writes with
responses, PCIe splitting and realignment, error status, read-after-write ordering.

Checked against Python models: the splitting rules (``split_reads`` / ``split_writes``),
the host's completion split (``sim.tlp_host.split_completions``) and the memory contents.
"""

import random

import pytest
from amaranth.sim import Simulator

from hw.dma.host_if import HostInterface
from hw.dma.read_engine import DmaReadEngine, split_reads
from hw.dma.write_engine import DmaWriteEngine, split_writes
from hw.formats import TlpStatus
from sim.host import HostMemory
from sim.tlp_host import split_completions
from tests.hw.dma_models import ClientsSim, TlpHostSim

REGION = 1 << 20          # each client reads / writes its own region


def test_split_models():
    """The Python models of the rules: no piece crosses a multiple of the limit, together they
    cover the transfer, every size and alignment 0 .. 64 KB."""
    rng = random.Random(5)
    cases = [(a, n) for a in (0, 1, 7, 63, 64, 511, 4095) for n in (0, 1, 2, 63, 64, 65, 511,
                                                                     512, 513, 4096, 65535, 65536)]
    cases += [(rng.randrange(1 << 20), rng.randrange(1 << 16 + 1)) for _ in range(200)]
    for lim, fn in ((512, split_reads), (256, split_writes), (64, None)):
        for a, n in cases:
            parts = fn(a, n, lim) if fn else [(a + lo, ln) for lo, ln in split_completions(a, n, lim)]
            assert sum(ln for _, ln in parts) == n
            pos = a
            for pa, ln in parts:
                assert pa == pos and 1 <= ln <= lim
                assert pa // lim == (pa + ln - 1) // lim          # no crossing of the limit
                assert pa // 4096 == (pa + ln - 1) // 4096        # nor of 4 KB
                pos += ln
            # every piece but the last ends on a multiple of the limit
            assert all((pa + ln) % lim == 0 for pa, ln in parts[:-1])


def fill(mem, base, n, seed):
    rng = random.Random(seed)
    mem.write(base, bytes(rng.getrandbits(8) for _ in range(n)))


def run_host_if(*, W=8, rings=(16, 64, 32), n_write=2, reads=None, writes=None, seed=0,
                lat=(4, 40), p_ready=1.0, p_client=1.0, n_tags=8, mrrs=512, mps=256,
                fail=None, cpl_bytes=64, max_cycles=200_000, mem=None, before_read=None,
                after_write=None, max_len=None):
    """Drive a HostInterface with :class:`ClientsSim` and a :class:`TlpHostSim`; returns
    (per read client [(tag, data, err)], per write client [(tag, err)], host, state, events)."""
    dut = HostInterface(W, list(rings), n_write, n_tags=n_tags, max_read_request=mrrs,
                        max_payload=mps, write_outstanding=8, rd_max_len=max_len)
    host = TlpHostSim(dut.down, dut.up, W, mem=mem, seed=seed, lat=lat, p_ready=p_ready,
                      cpl_bytes=cpl_bytes, max_payload=mps, fail=fail)
    clients = ClientsSim(dut.rd, dut.wr, W, reads=reads, writes=writes, seed=seed + 1,
                         p_client=p_client, before_read=before_read, after_write=after_write)
    state = {"bad": 0, "q_reads_max": 0, "q_writes_max": 0}

    async def count_bad(ctx):
        while True:
            _, _, bad, qr, qw = await ctx.tick().sample(dut.stat_bad, dut.q_reads, dut.q_writes)
            state["bad"] += bad
            state["q_reads_max"] = max(state["q_reads_max"], qr)
            state["q_writes_max"] = max(state["q_writes_max"], qw)

    async def drain(ctx):
        for _ in range(max(lat) + 50):        # let the last responses drain
            await ctx.tick()
        state["tags_free"] = ctx.get(dut.rd_engine.tags_free)
        state["q_reads"], state["q_writes"] = ctx.get(dut.q_reads), ctx.get(dut.q_writes)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    host.add_to(sim)
    sim.add_testbench(count_bad, background=True)
    clients.run(sim, max_cycles=max_cycles, then=drain)
    state["beat_errs"] = clients.beat_errs
    return clients.got_rd, clients.got_wr, host, state, clients.events


def min_ring(W, max_len, mrrs=512):
    need = -(-min(mrrs, max_len) // W) + 1
    return max(4, 1 << (need - 1).bit_length())


def random_reads(rng, c, n, max_len):
    out = []
    for i in range(n):
        ln = rng.choice([1, 2, 7, 8, 9, 63, 64, 65, rng.randrange(1, max_len + 1),
                         rng.randrange(1, max_len + 1)])
        a = c * REGION + rng.randrange(0, REGION - ln)
        if rng.random() < 0.2:                      # straddle a 4 KB boundary
            a = c * REGION + 4096 * rng.randrange(1, 100) - rng.randrange(1, min(ln, 600) + 1)
        out.append((a, ln, (c << 8) | (i & 0xFF)))
    return out


@pytest.mark.parametrize("W,seed,p_ready,p_client", [(8, 1, 1.0, 1.0), (8, 2, 0.5, 0.6),
                                                     (16, 3, 0.8, 0.7), (64, 4, 0.7, 0.5)])
def test_reads_out_of_order(W, seed, p_ready, p_client):
    """Three read clients, random sizes and alignments, completions back in any order (random
    latency per request, split at 64 B), random back-pressure everywhere: every client gets
    exactly its bytes, in request order, with its tags; the MRds follow the splitting rule."""
    rng = random.Random(seed)
    mem = HostMemory()
    max_len = [64, 3000, 1500]
    # the smallest legal ring for client 0, twice that for the others
    rings = [min_ring(W, ml) * (1 if c == 0 else 2) for c, ml in enumerate(max_len)]
    for c in range(3):
        fill(mem, c * REGION, REGION, 100 + c)
    reads = [random_reads(rng, c, 25, max_len[c]) for c in range(3)]
    got, _, host, state, _ = run_host_if(W=W, rings=rings, reads=reads, seed=seed, mem=mem,
                                         p_ready=p_ready, p_client=p_client, lat=(3, 60),
                                         max_len=max_len)
    for c in range(3):
        assert [g[0] for g in got[c]] == [t for _, _, t in reads[c]]
        for (a, n, t), (tag, data, err) in zip(reads[c], got[c]):
            assert err == 0 and data == mem.read(a, n), f"client {c} read {a:#x}+{n}"
        # this client's MRds, in order, are the concatenated splits of its requests
        mine = [(a, n) for _, _, a, n in host.mrd if a // REGION == c]
        assert mine == [p for a, n, _ in reads[c] for p in split_reads(a, n, 512)]
    assert host.protocol_errors == []
    # completions really came back out of order: some MRd was answered after a later one
    assert host.sent != sorted(host.sent)
    assert sorted(set(host.sent)) == list(range(len(host.mrd)))
    assert state["bad"] == 0 and state["tags_free"] == 8
    # the occupancy outputs (Q_HIF_READS): several tags were in use at once, never more
    # than the pool, none once every read is answered
    assert 2 <= state["q_reads_max"] <= 8 and state["q_reads"] == 0


def test_reads_large_through_small_ring():
    """Reads of up to 64 KB stream through a ring of 16 words (W = 64: 1 KB) as their TLPs
    complete; every size class and alignment."""
    mem = HostMemory()
    fill(mem, 0, 3 << 16, 7)
    reads = [[(a, n, i) for i, (a, n) in enumerate([(0, 65536), (3, 65533), (4093, 9000),
                                                     (100, 1), (4095, 2), (8191, 4097)])]]
    got, _, host, state, _ = run_host_if(W=64, rings=(16,), reads=reads, n_write=1, mem=mem,
                                         seed=9, lat=(2, 30), n_tags=16)
    for (a, n, t), (tag, data, err) in zip(reads[0], got[0]):
        assert tag == t and err == 0 and data == mem.read(a, n)
    assert len(host.mrd) == sum(len(split_reads(a, n, 512)) for a, n, _ in reads[0])


@pytest.mark.parametrize("W,seed", [(8, 11), (64, 12)])
def test_writes_split_and_realigned(W, seed):
    """Two write clients: every write lands byte-exact, nothing else is touched, MWrs follow
    the splitting rule and a client write's TLPs are contiguous; done in order, with tags."""
    rng = random.Random(seed)
    mem = HostMemory()
    shadow = HostMemory()
    writes = []
    for c in range(2):
        ws = []
        for i in range(20):
            ln = rng.choice([1, 3, 8, 64, 65, 255, 256, 257, rng.randrange(1, 3000)])
            a = c * REGION + rng.randrange(0, REGION - ln)
            if rng.random() < 0.2:
                a = c * REGION + 4096 * rng.randrange(1, 100) - rng.randrange(1, min(ln, 300) + 1)
            data = bytes(rng.getrandbits(8) for _ in range(ln))
            ws.append((a, data, i))
            shadow.write(a, data)
        writes.append(ws)
    fill(mem, 0, 2 * REGION, 3)
    fill(shadow, 0, 2 * REGION, 3)
    for c in range(2):
        for a, data, _ in writes[c]:
            shadow.write(a, data)
    _, got, host, state, _ = run_host_if(W=W, rings=(min_ring(W, 512),), n_write=2,
                                         writes=writes, seed=seed, mem=mem, p_ready=0.6,
                                         p_client=0.7)
    for c in range(2):
        assert got[c] == [(t, 0) for _, _, t in writes[c]]
    assert mem.read(0, 2 * REGION) == shadow.read(0, 2 * REGION)
    # Q_HIF_WRITES: several TLPs waited for their response at once (write_outstanding 8),
    # none once every write is answered
    assert 2 <= state["q_writes_max"] <= 8 and state["q_writes"] == 0
    expect = {c: [p for a, d, _ in writes[c] for p in split_writes(a, len(d), 256)] for c in range(2)}
    assert [(a, n) for _, _, a, n in host.mwr if a // REGION == 0] == expect[0]
    assert [(a, n) for _, _, a, n in host.mwr if a // REGION == 1] == expect[1]
    # a client write's TLPs are back to back (writes never interleave)
    seq = [(a // REGION) for _, _, a, _ in host.mwr]
    runs = []
    for c in seq:
        if not runs or runs[-1][0] != c:
            runs.append([c, 0])
        runs[-1][1] += 1
    assert sum(r[1] for r in runs) == len(host.mwr)
    assert host.protocol_errors == [] and state["bad"] == 0


def test_errors_reach_the_client():
    """Reads and writes touching a failing range get err (reads: on the last beat; the other
    requests are unaffected); a failed TLP of a write changes nothing."""
    BAD = (0x5000, 0x6000)

    def fail(a, n, is_write):
        return TlpStatus.UR if a < BAD[1] and a + n > BAD[0] else None

    mem = HostMemory()
    fill(mem, 0, 0x10000, 1)
    before = mem.read(0, 0x10000)
    reads = [[(0x1000, 100, 1), (0x4F00, 0x300, 2), (0x5800, 8, 3), (0x7000, 2000, 4)]]
    writes = [[(0x2000, b"\x11" * 50, 5), (0x5FF0, b"\x22" * 40, 6), (0x3000, b"\x33" * 600, 7)]]
    got_rd, got_wr, host, state, _ = run_host_if(W=8, rings=(128,), n_write=1, reads=reads,
                                                 writes=writes, mem=mem, fail=fail, seed=3)
    assert [(t, e) for t, _, e in got_rd[0]] == [(1, 0), (2, 1), (3, 1), (4, 0)]
    # read 2 is two TLPs, [0x4F00, 0x5000) good and [0x5000, 0x5200) failed: err is set on
    # the beats from the failed TLP on
    assert state["beat_errs"][0][1] == [0] * (0x100 // 8) + [1] * (0x200 // 8)
    assert got_rd[0][0][1] == before[0x1000:0x1064]
    assert got_rd[0][3][1] == before[0x7000:0x7000 + 2000]
    assert got_wr[0] == [(5, 0), (6, 1), (7, 0)]
    # the host fails per TLP: the part in the failing range is not written, the TLP past
    # 0x6000 (split at the 256-byte boundary) is
    assert mem.read(0x5FF0, 16) == before[0x5FF0:0x6000]
    assert mem.read(0x6000, 24) == b"\x22" * 24
    assert mem.read(0x3000, 600) == b"\x33" * 600
    assert state["tags_free"] == 8


@pytest.mark.parametrize("W", [8, 64])
def test_error_on_a_word_that_straddles_tlps(W):
    """An unaligned read across a TLP boundary (realigned on delivery, docs of
    hw/dma/read_engine.py): the client word holding bytes of both TLPs carries the failed
    one's err; the words before it do not, and their bytes are right."""
    BAD = 0x5000

    def fail(a, n, is_write):
        return TlpStatus.UR if a + n > BAD and a >= BAD else None

    mem = HostMemory()
    fill(mem, 0, 0x10000, 2)
    a, n = BAD - 253, 0x300
    got_rd, _, _, state, _ = run_host_if(W=W, rings=(128,), n_write=1, reads=[[(a, n, 1)]],
                                         mem=mem, fail=fail, seed=4)
    nbeats = -(-n // W)
    assert state["beat_errs"][0][0] == [int(min(a + (i + 1) * W, a + n) > BAD)
                                        for i in range(nbeats)]
    assert got_rd[0][0][2] == 1
    good = (BAD - a) // W * W                    # bytes in the words before the straddling one
    assert got_rd[0][0][1][:good] == mem.read(a, good)


def test_read_does_not_pass_earlier_write():
    """Each read is asked for right after the write of the same bytes was handed over (its
    last beat taken), while the other writer keeps the write engine busy: it always returns
    the new bytes (the MRd leaves only after the MWr; the host applies requests in link
    order), for unaligned writes whose tail word forms a TLP of its own too."""
    rng = random.Random(21)
    mem = HostMemory()
    fill(mem, 0, 2 * REGION, 8)
    w0, rd = [], []
    for i in range(30):
        ln = rng.choice([8, 9, 250, 257, 300, rng.randrange(1, 700)])
        a = rng.randrange(0, REGION - 1024)
        if i % 3 == 0:                       # ends one byte into a new MPS block
            a = 256 * rng.randrange(4, 2000) - ln + 1
        w0.append((a, bytes(rng.getrandbits(8) for _ in range(ln)), i))
        rd.append((a, ln, i))
    noise = [(REGION + 4096 * i, bytes(1000), 100 + i) for i in range(30)]
    handed = set()

    def after_write(c, i):
        if c == 0:
            handed.add(i)

    async def before_read(ctx, c, i):
        while i not in handed:
            await ctx.tick()

    got_rd, got_wr, host, state, _ = run_host_if(
        W=8, rings=(128,), n_write=2, reads=[rd], writes=[w0, noise], mem=mem, seed=4,
        lat=(5, 30), before_read=before_read, after_write=after_write)
    for (a, data, i), (tag, got, err) in zip(w0, got_rd[0]):
        assert tag == i and err == 0 and got == data, f"read {i} at {a:#x} saw stale bytes"


def test_bad_completion_is_dropped_and_counted():
    """A completion for a tag that is not outstanding is dropped (stat_bad), nothing breaks."""
    dut = HostInterface(8, [128], 1, n_tags=4)
    log = {}

    async def tb(ctx):
        ctx.set(dut.down.ready, 1)
        ctx.set(dut.up.payload, {"hdr": {"kind": 0, "tag": 2, "status": 0, "lo": 0, "len": 8,
                                         "dw": 2, "last": 1}, "data": 0x1234, "last": 1})
        ctx.set(dut.up.valid, 1)
        _, _, bad = await ctx.tick().sample(dut.stat_bad)
        ctx.set(dut.up.valid, 0)
        log["bad"] = bad
        await ctx.tick()
        log["free"] = ctx.get(dut.rd_engine.tags_free)
        log["rd_valid"] = ctx.get(dut.rd[0].rd.valid)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()
    assert log == {"bad": 1, "free": 4, "rd_valid": 0}


def test_bad_params():
    with pytest.raises(ValueError, match=r"data_bytes must be a power of two in \[8, 64\], not 24"):
        DmaReadEngine(24, [16])
    with pytest.raises(ValueError, match=r"n_tags must be an integer in \[1, 256\], not 0"):
        DmaReadEngine(8, [128], n_tags=0)
    with pytest.raises(ValueError, match=r"ring_words\[1\] must be a power of two in \[128, 65536\], not 64"):
        DmaReadEngine(8, [128, 64])
    with pytest.raises(ValueError, match=r"max_read_request must be a power of two in \[64, 4096\], not 100"):
        DmaReadEngine(8, [128], max_read_request=100)
    with pytest.raises(ValueError, match=r"max_payload must be a power of two in \[64, 4096\], not 32"):
        DmaWriteEngine(8, 1, max_payload=32)
    with pytest.raises(ValueError, match=r"outstanding must be a power of two in \[2, 256\], not 3"):
        DmaWriteEngine(8, 1, outstanding=3)
    with pytest.raises(ValueError, match=r"tlp_overhead must be an integer in \[0, 256\], not -1"):
        HostInterface(8, [128], 1, tlp_overhead=-1)


def test_one_word_writes_of_two_clients_leave_back_to_back():
    """Two clients each offering one-word writes all the time, MWr never back-pressured: a
    write of the other client is taken in the cycle the last word of one leaves, so the
    engine sends one TLP per cycle; a client alone too, since an idle engine takes a write
    with its first word (before 2026-12-08 a client alone got one every two cycles)."""
    W, n = 8, 40

    def cycles(clients):
        dut = DmaWriteEngine(W, 2, outstanding=256)
        seen = []

        async def bench(ctx):
            ctx.set(dut.mwr.ready, 1)
            for c in clients:
                ctx.set(dut.wr[c].wr.payload, {"addr": 0x1000 * (c + 1), "len": W, "tag": c,
                                               "data": 0x55, "nbytes": W, "last": 1})
                ctx.set(dut.wr[c].wr.valid, 1)
            t = 0
            while len(seen) < n:
                _, _, v, hdr = await ctx.tick().sample(dut.mwr.valid, dut.mwr.payload.hdr)
                t += 1
                if v:
                    seen.append((t, int(hdr.addr)))

        sim = Simulator(dut)
        sim.add_clock(1e-8)
        sim.add_testbench(bench)
        sim.run()
        assert {a for _, a in seen} == {0x1000 * (c + 1) for c in clients}
        return seen[-1][0] - seen[0][0] + 1

    assert cycles([0, 1]) == n
    assert cycles([0]) == n


def test_one_tlp_reads_of_one_client_are_taken_every_cycle():
    """One client offering one-word reads all the time, MRd never back-pressured, enough tags
    and ring: a request is taken in the cycle the last TLP of the one before is issued, so
    one MRd leaves per cycle (before 2026-12-08 one every two cycles: the next request was
    taken only once the engine was idle)."""
    W, n = 8, 24
    dut = DmaReadEngine(W, [256], n_tags=64)
    seen = []

    async def bench(ctx):
        ctx.set(dut.mrd.ready, 1)
        ctx.set(dut.rd[0].req.valid, 1)
        k = 0
        ctx.set(dut.rd[0].req.payload, {"addr": 0x1000, "len": W, "tag": 0})
        t = 0
        while len(seen) < n:
            taken = ctx.get(dut.rd[0].req.ready)
            _, _, v, hdr = await ctx.tick().sample(dut.mrd.valid, dut.mrd.payload.hdr)
            t += 1
            if taken:
                k += 1
                ctx.set(dut.rd[0].req.payload, {"addr": 0x1000 + W * k, "len": W, "tag": 0})
            if v:
                seen.append((t, int(hdr.addr)))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert [a for _, a in seen] == [0x1000 + W * i for i in range(n)]
    assert seen[-1][0] - seen[0][0] + 1 == n
