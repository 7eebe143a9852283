"""The two hosts behind the NIC's host interface: the RTL host (memory on chip) and the Python
host (its RTL adapter driven per transaction), each behind the same PCIe link model.

Checked: every byte read and written, error status for addresses outside the host's memory,
completions split at the host's completion size, the Python host's completion reordering,
the TLP overhead charged by the link, and that both hosts give the same results at the same
cycles for the same workload (reordering off).
"""

import random

import pytest
from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In
from amaranth.sim import Simulator

from hw.config import preset
from hw.dma.host_if import HostInterface
from hw.dma.read_engine import split_reads
from hw.formats import TlpStatus, tlp_cost, tlp_dwords
from hw.host.cpl_emitter import CplEmitter
from hw.host.host_side import HostSide
from hw.host.pcie_link import PcieLink
from hw.interfaces import DmaReadPort, DmaWritePort
from sim.host import HostMemory
from sim.tlp_host import PyHost, TlpHost, split_completions
from tests.hw.dma_models import ClientsSim, PyPortSim, tick_until

BASE = 0x40000
SIZE = 1 << 16


def cfg_of(kind, **kw):
    # 128-byte requests and payloads keep the Python adapter's registers narrow enough for
    # Amaranth's simulator to be quick; the hosts are the same for any size
    kw = {"nic__max_read_request": 128, "nic__max_payload": 128, **kw}
    return preset("small").replace(host__kind=kind, host__rtl_mem_bytes=SIZE,
                                   host__rtl_mem_base=BASE, **kw)


class DmaSystem(wiring.Component):
    """Test top: the NIC's host interface joined to a HostSide (links + host)."""

    def __init__(self, cfg, rings, n_write, rd_max_len=None):
        nic = cfg.nic
        W = nic.data_bytes
        self.hif = HostInterface(W, list(rings), n_write, n_tags=nic.dma_tags,
                                 max_read_request=nic.max_read_request,
                                 max_payload=nic.max_payload,
                                 write_outstanding=nic.dma_write_outstanding,
                                 tlp_overhead=nic.tlp_overhead, rd_max_len=rd_max_len)
        self.side = HostSide(cfg)
        ports = {"rd": In(DmaReadPort(W)).array(len(rings)), "wr": In(DmaWritePort(W)).array(n_write)}
        for name, member in self.side.signature.members.items():
            if not name.startswith("nic_"):
                ports[name] = member
        super().__init__(ports)

    def elaborate(self, platform):
        m = Module()
        m.submodules.hif = hif = self.hif
        m.submodules.side = side = self.side
        for c, p in enumerate(self.rd):
            wiring.connect(m, wiring.flipped(p), hif.rd[c])
        for c, p in enumerate(self.wr):
            wiring.connect(m, wiring.flipped(p), hif.wr[c])
        wiring.connect(m, hif.down, side.nic_down)
        wiring.connect(m, side.nic_up, hif.up)
        m.d.comb += [side.nic_mmio.req.ready.eq(0), side.nic_mmio.rdata.valid.eq(0)]
        for name, member in side.signature.members.items():
            if name.startswith("nic_"):
                continue
            ours, theirs = getattr(self, name), getattr(side, name)
            if member.is_signature:
                if member.flow == In:
                    wiring.connect(m, wiring.flipped(ours), theirs)
                else:
                    wiring.connect(m, theirs, wiring.flipped(ours))
            elif member.flow == In:
                m.d.comb += theirs.eq(ours)
            else:
                m.d.comb += ours.eq(theirs)
        return m


async def _wait_until(ctx, sig, value):
    while ctx.get(sig) != value:
        await ctx.tick()


async def cpu_write(ctx, dut, addr, data):
    """The host CPU writes ``data`` at ``addr``, 64 bytes per transaction (mailbox ``cpu``)."""
    for off in range(0, len(data), 64):
        chunk = data[off:off + 64]
        seq = (ctx.get(dut.cpu_seq) + 1) & 0xFFFF
        ctx.set(dut.cpu, {"we": 1, "addr": addr + off, "len": len(chunk),
                          "data": int.from_bytes(chunk, "little")})
        ctx.set(dut.cpu_seq, seq)
        await _wait_until(ctx, dut.cpu_taken, seq)


async def cpu_read(ctx, dut, addr, n):
    out = bytearray()
    for off in range(0, n, 64):
        k = min(64, n - off)
        seq = (ctx.get(dut.cpu_seq) + 1) & 0xFFFF
        ctx.set(dut.cpu, {"we": 0, "addr": addr + off, "len": k, "data": 0})
        ctx.set(dut.cpu_seq, seq)
        rseq = (ctx.get(dut.cpu_rdata_ack) + 1) & 0xFFFF
        await _wait_until(ctx, dut.cpu_rdata_seq, rseq)
        out += int(ctx.get(dut.cpu_rdata.data)).to_bytes(64, "little")[:k]
        ctx.set(dut.cpu_rdata_ack, rseq)
    return bytes(out)


def workload(rng, n_rd=3, n_wr=2, per=12, max_len=700):
    """Reads of preloaded regions and writes to others, inside the host window; returns
    (preload bytes, reads, writes)."""
    pre = bytes(rng.getrandbits(8) for _ in range(0x6000))
    reads = []
    for c in range(n_rd):
        rs = []
        for i in range(per):
            ln = rng.choice([1, 8, 9, 64, 65, rng.randrange(1, max_len)])
            a = BASE + c * 0x2000 + rng.randrange(0, 0x2000 - ln)
            rs.append((a, ln, (c << 8) | i))
        reads.append(rs)
    writes = []
    for c in range(n_wr):
        ws = []
        for i in range(per):
            ln = rng.choice([1, 8, 9, 64, 255, 257, rng.randrange(1, max_len)])
            a = BASE + 0x8000 + c * 0x3000 + rng.randrange(0, 0x3000 - ln)
            ws.append((a, bytes(rng.getrandbits(8) for _ in range(ln)), (c << 8) | i))
        writes.append(ws)
    return pre, reads, writes


def run_system(kind, pre, reads, writes, *, seed=0, reorder=0.0, p_client=1.0, fail=None,
               extra_reads=None, hint=()):
    cfg = cfg_of(kind, host__reorder=reorder)
    W = cfg.nic.data_bytes
    rings = [128] * len(reads)
    dut = DmaSystem(cfg, rings, len(writes))
    clients = ClientsSim(dut.rd, dut.wr, W, reads=reads, writes=writes, seed=seed,
                         p_client=p_client, hint=hint)
    clients.go = False
    out = {}
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    mem = HostMemory()
    if kind == "python":
        mem.write(BASE, pre)
        th = TlpHost(mem, W, cpl_bytes=cfg.host.cpl_bytes, max_payload=cfg.nic.max_payload,
                     fail=fail)
        py = PyHost(th, mem_cycles=dut.side.mem_cycles, reorder=reorder, seed=seed)
        drv = PyPortSim(dut, W, py, max_payload=cfg.nic.max_payload, seed=seed)
        sim.add_testbench(drv.run, background=True)
        out["py"] = py

        async def start(ctx):
            clients.go = True

        async def finish(ctx):
            for _ in range(200):
                await ctx.tick()
            out["mem"] = mem.read(BASE, SIZE)
    else:
        async def start(ctx):
            await cpu_write(ctx, dut, BASE, pre)
            clients.go = True

        async def finish(ctx):
            for _ in range(200):
                await ctx.tick()
            out["mem"] = await cpu_read(ctx, dut, BASE, SIZE)
    sim.add_testbench(start, background=True)

    bytes_seen = {"down": 0, "up": 0}
    out["events"] = []           # (cycle, the host memory then: Python host only)

    async def count(ctx):
        n = 0
        while True:
            _, _, d, u, ev = await ctx.tick().sample(dut.stat_down_bytes, dut.stat_up_bytes,
                                                     dut.cqe_events)
            bytes_seen["down"] += d
            bytes_seen["up"] += u
            if ev != n:
                assert ev == n + 1, "two events in one cycle"
                n = ev
                out["events"].append((clients.cycle, mem.read(BASE, SIZE) if kind == "python"
                                      else None))

    sim.add_testbench(count, background=True)
    clients.run(sim, max_cycles=400_000, then=finish)
    out["bytes"] = bytes_seen
    return clients, out


def expected_memory(pre, writes):
    mem = HostMemory()
    mem.write(BASE, bytes(SIZE))
    mem.write(BASE, pre)
    for ws in writes:
        for a, data, _ in ws:
            mem.write(a, data)
    return mem.read(BASE, SIZE)


@pytest.mark.parametrize("kind", ["rtl", "python"])
def test_event_line_follows_hinted_writes(kind):
    """cqe_events counts the writes whose client set ``hint`` (the CQE writes), once each is
    in host memory: the Python host's memory holds the write when its event comes."""
    rng = random.Random(8)
    pre, reads, writes = workload(rng, n_rd=1, n_wr=2, per=10, max_len=300)
    clients, out = run_system(kind, pre, reads, writes, seed=4, p_client=0.8, hint=(1,))
    assert len(out["events"]) == len(writes[1])
    if kind == "python":
        for (_, img), (a, data, _) in zip(out["events"], writes[1]):
            assert img[a - BASE:a - BASE + len(data)] == data
    # each event comes after the write was handed over and no later than its done
    for (cyc, _), done in zip(out["events"], clients.cycles_wr[1]):
        assert cyc <= done


@pytest.mark.parametrize("kind", ["rtl", "python"])
def test_host_reads_and_writes(kind):
    rng = random.Random(3)
    pre, reads, writes = workload(rng)
    clients, out = run_system(kind, pre, reads, writes, seed=1, p_client=0.7)
    img = HostMemory()
    img.write(BASE, pre)
    for c, rs in enumerate(reads):
        assert [t for t, _, _ in clients.got_rd[c]] == [t for _, _, t in rs]
        for (a, n, t), (_, data, err) in zip(rs, clients.got_rd[c]):
            assert err == 0 and data == img.read(a, n), f"{kind}: read {a:#x}+{n}"
    for c, ws in enumerate(writes):
        assert clients.got_wr[c] == [(t, 0) for _, _, t in ws]
    assert out["mem"] == expected_memory(pre, writes)


def test_python_host_reorders_completions():
    """With reorder 0.4 the Python host sends some reads' completions after later reads'
    (counted by the host); every client still gets its bytes in request order."""
    rng = random.Random(4)
    pre, reads, writes = workload(rng, n_wr=1, per=20)
    clients, out = run_system("python", pre, reads, writes, seed=2, reorder=0.4)
    assert out["py"].reordered >= 3
    img = HostMemory()
    img.write(BASE, pre)
    for c, rs in enumerate(reads):
        for (a, n, t), (tag, data, err) in zip(rs, clients.got_rd[c]):
            assert tag == t and err == 0 and data == img.read(a, n)


def test_hosts_agree():
    """The same workload (no reordering, no back-pressure) gives the same data, the same
    memory and every read and write finished at the same cycle on both hosts."""
    rng = random.Random(5)
    pre, reads, writes = workload(rng)
    a, out_a = run_system("rtl", pre, reads, writes, seed=7)
    b, out_b = run_system("python", pre, reads, writes, seed=7)
    assert a.got_rd == b.got_rd and a.got_wr == b.got_wr
    assert out_a["mem"] == out_b["mem"]
    # the RTL host is preloaded through its CPU port first: compare times from the start
    t0a = min(c for c, *_ in a.events)
    t0b = min(c for c, *_ in b.events)
    assert [[t - t0a for t in c] for c in a.cycles_rd] == [[t - t0b for t in c] for c in b.cycles_rd]
    assert [[t - t0a for t in c] for c in a.cycles_wr] == [[t - t0b for t in c] for c in b.cycles_wr]
    assert out_a["bytes"] == out_b["bytes"]


@pytest.mark.parametrize("kind", ["rtl", "python"])
def test_outside_memory_is_an_error(kind):
    """A read or write outside the host's memory gets UR: err for the client, nothing written."""
    fail = (lambda a, n, w: TlpStatus.UR if not (BASE <= a and a + n <= BASE + SIZE) else None)
    reads = [[(BASE + 0x100, 16, 1), (BASE + SIZE - 8, 16, 2), (BASE + 0x200, 8, 3)]]
    writes = [[(BASE + SIZE + 0x100, b"\x55" * 32, 4), (BASE + 0x9000, b"\x66" * 8, 5)]]
    pre = bytes(range(256)) * 2
    clients, out = run_system(kind, pre, reads, writes, fail=fail)
    assert [(t, e) for t, _, e in clients.got_rd[0]] == [(1, 0), (2, 1), (3, 0)]
    assert clients.got_wr[0] == [(4, 1), (5, 0)]
    assert out["mem"][0x9000:0x9008] == b"\x66" * 8


def test_link_charges_overhead():
    """Bytes the link charges are header + framing per TLP plus the payload in DWs: a 512-byte
    read is 512 / max_read_request MRds down and 8 completions of 64 bytes up (host
    cpl_bytes 64)."""
    cfg = cfg_of("python")
    oh = cfg.nic.tlp_overhead
    reads = [[(BASE, 512, 1)]]
    clients, out = run_system("python", bytes(512), reads, [[]])
    parts = split_completions(BASE, 512, 64)
    assert out["bytes"]["down"] == len(split_reads(BASE, 512, cfg.nic.max_read_request)) * tlp_cost(0, oh)
    assert out["bytes"]["up"] == sum(tlp_cost(tlp_dwords(BASE + lo, n), oh) for lo, n in parts)


def test_link_rate_and_latency():
    """A stream of 256-byte writes leaves the link at pcie_gbps including the 24 bytes of
    overhead per TLP, and each arrives latency_cycles after it entered."""
    W, lat, rate = 8, 20, 4.0
    dut = PcieLink(W, "down", lat, rate, 24)
    n_tlp = 40
    beats = 256 // W
    t_in, t_out = [], []

    async def src(ctx):
        for k in range(n_tlp):
            for b in range(beats):
                ctx.set(dut.i.payload, {"hdr": {"kind": 1, "tag": k, "addr": 256 * k, "len": 256},
                                        "data": b, "last": b == beats - 1})
                ctx.set(dut.i.valid, 1)
                await tick_until(ctx, dut.i.ready)
                if b == 0:
                    t_in.append(cyc["n"])
        ctx.set(dut.i.valid, 0)

    cyc = {"n": 0}

    async def sink(ctx):
        ctx.set(dut.o.ready, 1)
        first = True
        while len(t_out) < n_tlp:
            _, _, v, p = await ctx.tick().sample(dut.o.valid, dut.o.payload)
            cyc["n"] += 1
            if v:
                if first:
                    t_out.append(cyc["n"])
                first = bool(p.last)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(src, background=True)
    sim.add_testbench(sink)
    sim.run()
    # steady state (the idle link starts with up to one beat of saved credit)
    span = t_in[-1] - t_in[4]
    expect = (n_tlp - 5) * (256 + 24) / rate
    assert abs(span - expect) <= 1, (span, expect)
    assert all(o - i in (lat, lat + 1) for i, o in zip(t_in, t_out)), list(zip(t_in, t_out))[:5]


@pytest.mark.parametrize("W,cpl", [(8, 64), (64, 64), (64, 128), (16, 256)])
def test_emitter_splits_like_the_model(W, cpl):
    """Every alignment and length up to 512 bytes: the completions (lo, len, dw, last, words)
    are those of the Python model, the words are the right ones of the request."""
    rng = random.Random(W + cpl)
    cases = [(a, n) for a in (0, 1, 7, 63, 64, 4095 - 64) for n in (1, 2, 63, 64, 65, 200, 512 - (a % 64))]
    cases += [(rng.randrange(4096), rng.randrange(1, 513)) for _ in range(30)]
    cases = [(a, n) for a, n in cases if n >= 1]
    dut = CplEmitter(W, cpl, 512 // W + 1)
    got = []

    async def tb(ctx):
        ctx.set(dut.up.ready, 1)
        for a, n in cases:
            nw = (a % W + n + W - 1) // W
            words = [((a - a % W) // W + i) * 1000 for i in range(nw)]
            ctx.set(dut.req.payload, {"tag": 5, "status": 0, "addr": a % 4096, "len": n})
            ctx.set(dut.req.valid, 1)
            tlps = []
            cur = None
            latched = 0
            done = False
            while not done:
                ctx.set(dut.word.data, words[latched] if latched < nw else 0)
                _, _, en, idx, v, p, rr = await ctx.tick().sample(
                    dut.word.en, dut.word.index, dut.up.valid, dut.up.payload, dut.req.ready)
                if v:
                    if cur is None:
                        h = p.hdr
                        cur = [int(h.lo), int(h.len), int(h.dw), int(h.last), []]
                    cur[4].append(int(p.data))
                    if p.last:
                        tlps.append(tuple(cur[:4]) + (tuple(cur[4]),))
                        done = bool(cur[3])
                        cur = None
                if en:
                    latched = int(idx)
                if rr:
                    ctx.set(dut.req.valid, 0)
            got.append(tlps)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()
    for (a, n), tlps in zip(cases, got):
        parts = split_completions(a, n, cpl)
        exp = []
        for i, (lo, ln) in enumerate(parts):
            s = a + lo
            k0 = (s - s % W - (a - a % W)) // W
            nw = (s % W + ln + W - 1) // W
            exp.append((lo, ln, tlp_dwords(s, ln), int(i == len(parts) - 1),
                        tuple(((a - a % W) // W + k0 + j) * 1000 for j in range(nw))))
        assert tlps == exp, (a, n)


def test_emitter_one_word_reads_leave_every_cycle():
    """Requests of one word each, offered back to back with ``up`` always ready: a
    completion leaves in every cycle (a request's first part leaves in the cycle it is
    taken), each with its own tag and word; a four-word request takes four."""
    W = 64
    dut = CplEmitter(W, 64, 512 // W + 1)
    reqs = [(t, 64 * t + 8, 8) for t in range(8)] + [(8, 0x200, 256), (9, 0x400, 8)]
    seen = []

    async def tb(ctx):
        ctx.set(dut.up.ready, 1)
        k = 0
        latched = 0
        for cyc in range(60):
            if k < len(reqs):
                t, a, n = reqs[k]
                ctx.set(dut.req.payload, {"tag": t, "status": 0, "addr": a, "len": n})
            ctx.set(dut.req.valid, int(k < len(reqs)))
            ctx.set(dut.word.data, latched)
            _, _, en, idx, v, p, rr = await ctx.tick().sample(
                dut.word.en, dut.word.index, dut.up.valid, dut.up.payload, dut.req.ready)
            if v:
                seen.append((cyc, int(p.hdr.tag), int(p.data)))
            if en:
                latched = (reqs[min(k, len(reqs) - 1)][1] // W + int(idx)) * 1000
            if rr:
                k += 1

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()
    cycles = [c for c, _, _ in seen]
    assert [t for _, t, _ in seen] == list(range(8)) + [8] * 4 + [9]
    assert [d for _, _, d in seen] == [(64 * t + 8) // W * 1000 for t in range(8)] + \
        [(0x200 // W + j) * 1000 for j in range(4)] + [0x400 // W * 1000]
    assert cycles == list(range(cycles[0], cycles[0] + len(seen))), cycles


@pytest.mark.parametrize("seed,p_up", [(1, 1.0), (2, 0.6)])
def test_up_mux_write_responses_ride_on_completions(seed, p_up):
    """The hosts' UpMux: completion beats pass in order and unchanged; every write response
    arrives once, in order, beside a completion beat (``wrsp``) or as a WRRSP beat of its
    own, and only as its own beat when no completion beat is offered; the stream rule
    holds on ``up``. With completions always offered and ``up`` always ready, no response
    takes a beat of its own."""
    from hw.formats import CplKind
    from hw.host.up_mux import UpMux
    rng = random.Random(seed)
    W = 8
    dut = UpMux(W)
    cpls = [(t, k, k == 2) for t in range(30) for k in range(3)]      # (tag, beat, last)
    rsps = [(100 + i, rng.choice([TlpStatus.SC, TlpStatus.UR])) for i in range(40)]
    always = p_up == 1.0
    got_c, got_r, own = [], [], 0

    async def tb(ctx):
        nonlocal own
        ci = ri = 0
        prev = None
        for cyc in range(2000):
            c_v = ci < len(cpls) and (always or rng.random() < 0.7)
            if prev is not None and prev[0]:       # an offered beat stays offered
                c_v = ci < len(cpls)
            ctx.set(dut.cpl.valid, c_v)
            if ci < len(cpls):
                t, k, last = cpls[ci]
                ctx.set(dut.cpl.payload, {"hdr": {"kind": CplKind.CPLD, "tag": t, "last": last},
                                          "data": k, "last": last})
            r_v = ri < len(rsps) and (always or rng.random() < 0.5 or (prev and prev[1]))
            ctx.set(dut.wrsp.valid, r_v)
            if ri < len(rsps):
                ctx.set(dut.wrsp.payload, {"tag": rsps[ri][0], "status": rsps[ri][1]})
            ctx.set(dut.up.ready, rng.random() < p_up)
            await ctx.delay(1e-9)
            up_v, up_r = ctx.get(dut.up.valid), ctx.get(dut.up.ready)
            p = ctx.get(dut.up.payload)
            snap = (p.hdr.kind, int(p.hdr.tag), int(p.data), int(p.wrsp.valid), int(p.wrsp.tag))
            if prev is not None and prev[2] and not prev[3]:
                assert up_v and snap == prev[4], f"cycle {cyc}: up offer withdrawn or changed"
            c_taken = ctx.get(dut.cpl.valid) and ctx.get(dut.cpl.ready)
            r_taken = ctx.get(dut.wrsp.valid) and ctx.get(dut.wrsp.ready)
            if up_v and up_r:
                if p.hdr.kind == CplKind.WRRSP:
                    own += 1
                    # only when no completion beat was offered (or one was offered without
                    # it, the response arriving later, and is done now)
                    assert not c_v or not always, "a response took a beat of its own"
                    got_r.append((int(p.hdr.tag), p.hdr.status))
                else:
                    got_c.append((int(p.hdr.tag), int(p.data), bool(p.last)))
                    if p.wrsp.valid:
                        got_r.append((int(p.wrsp.tag), p.wrsp.status))
            prev = (c_v and not c_taken, r_v and not r_taken, up_v, up_r, snap)
            ci += c_taken
            ri += r_taken
            await ctx.tick()
        assert ci == len(cpls) and ri == len(rsps)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()
    assert got_c == [(t, k, last) for t, k, last in cpls]
    assert got_r == rsps
    if always:
        # 40 responses, 90 completion beats always offered: the 30 that outlast them only
        assert own == 0
