"""The responder's request lookahead (hw/rnic/request_lookup.py) against the tables it looks
into: every packet leaves in order with its QP context and rkey entry (or the lookup's
error), its payload whole; n lookups overlap; a QP reset marks the packets of that QP that
wait in it."""

import random

import pytest
from amaranth.hdl import Module
from amaranth.lib import data, wiring
from amaranth.sim import Simulator

from hw.formats import MR_ENTRY, PKT_META, BthOpcode as Op
from hw.regmap import QP_CTX
from hw.rnic.request_lookup import RKEY_OPCODES, RequestLookup
from tests.hw.lookup_model import TableLookup
from tests.hw.port_drivers import offer, run_lockstep

W = 8
QB, MB = 4, 3
QP_INIT = [(0x1234567 * (q + 1)) & ((1 << 64) - 1) for q in range(1 << QB)]
MR_INIT = [(0x89ABCDEF * (k + 3)) & ((1 << 64) - 1) for k in range(1 << MB)]
QP_BAD, MR_BAD = {5}, {6}


class Bench(wiring.Component):
    """The lookahead with a QP-context table and an MR table behind each of its ports."""

    def __init__(self, n, latency=None):
        self.la = RequestLookup(W, QB, MB, n=n, payload_beats=8)
        qp = [data.Const(QP_CTX, v) for v in QP_INIT]
        mr = [data.Const(MR_ENTRY, v) for v in MR_INIT]
        self.tables = ([TableLookup(QB, QP_CTX, qp, latency, QP_BAD) for _ in range(n)]
                       + [TableLookup(MB, MR_ENTRY, mr, latency, MR_BAD) for _ in range(n)])
        super().__init__({})

    def elaborate(self, platform):
        m = Module()
        m.submodules.la = self.la
        for k, t in enumerate(self.tables):
            m.submodules[f"t{k}"] = t
            port = self.la.qpc[k] if k < self.la.n else self.la.mr[k - self.la.n]
            wiring.connect(m, port, t.port)
        return m


OPS = [Op.READ_REQUEST, Op.WRITE_ONLY, Op.WRITE_FIRST, Op.WRITE_MIDDLE, Op.SEND_ONLY,
       Op.FETCH_ADD, Op.COMPARE_SWAP, Op.WRITE_ONLY_IMM]


def packets(rng, count):
    out = []
    for s in range(count):
        op = rng.choice(OPS)
        paylen = 0 if op in (Op.READ_REQUEST, Op.FETCH_ADD, Op.COMPARE_SWAP) else rng.choice(
            [0, 1, W, W + 3, 5 * W])
        meta = {"opcode": op.value, "psn": s, "paylen": paylen, "dest_qpn": rng.randrange(1 << QB),
                "rkey": (rng.randrange(1 << MB) << 8) | rng.randrange(256)}
        beats = [{"data": (s << 32) | off, "nbytes": min(W, paylen - off), "last": int(off + W >= paylen)}
                 for off in range(0, paylen, W)]
        out.append((meta, beats))
    return out


def field(value, layout, name):
    f = layout[name]
    return (value >> f.offset) & ((1 << f.width) - 1)


def run(n, seed, count=60, latency=None, p_valid=0.8, p_ready=0.7):
    rng = random.Random(seed)
    pkts = packets(rng, count)
    dut = Bench(n, latency)
    la = dut.la
    metas = [{**{k: 0 for k in ("src_node", "dst_node", "se", "ackreq", "udp_sport", "va",
                                "dma_len", "swap_add", "compare", "syndrome", "msn", "orig",
                                "imm")}, **m} for m, _ in pkts]
    beats = [b for _, bs in pkts for b in bs]
    got, _ = run_lockstep(
        dut, [(la.i.meta, metas), (la.i.payload, beats)],
        [(la.o.meta, ("pkt", "ctx", "ctx_err", "mr", "mr_err", "killed")),
         (la.o.payload, ("data", "nbytes", "last"))],
        p_valid=p_valid, p_ready=p_ready, seed=seed + 1, max_cycles=40 * count,
        done=lambda g: len(g[0]) == count and len(g[1]) == len(beats))
    return pkts, got


@pytest.mark.parametrize("n,seed", [(1, 1), (2, 2), (3, 3), (4, 4)])
def test_packets_leave_in_order_with_their_lookups(n, seed):
    pkts, (out, pay) = run(n, seed)
    assert len(out) == len(pkts)
    for (meta, _), (_, rec) in zip(pkts, out):
        assert field(rec["pkt"], PKT_META, "psn") == meta["psn"]
        q = meta["dest_qpn"]
        assert rec["ctx_err"] == int(q in QP_BAD)
        if q not in QP_BAD:
            assert rec["ctx"] == QP_INIT[q]
        if Op(meta["opcode"]) in RKEY_OPCODES:
            slot = meta["rkey"] >> 8
            assert rec["mr_err"] == int(slot in MR_BAD)
            if slot not in MR_BAD:
                assert rec["mr"] == MR_INIT[slot]
        assert rec["killed"] == 0
    # the payload, in packet order and whole
    assert [b for _, b in pay] == [b for _, bs in pkts for b in bs]


def cycles_for_reads(n, count=40):
    rng = random.Random(n)
    pkts = [({**m, "opcode": Op.READ_REQUEST.value, "paylen": 0}, []) for m, _ in packets(rng, count)]
    dut = Bench(n, latency=4)
    metas = [m for m, _ in pkts]
    got, _ = run_lockstep(dut, [(dut.la.i.meta, metas)], [(dut.la.o.meta, ("pkt",))],
                          p_valid=1.0, p_ready=1.0, seed=1, max_cycles=20 * count,
                          done=lambda g: len(g[0]) == count)
    assert [field(r["pkt"], PKT_META, "psn") for _, r in got[0]] == [m["psn"] for m in metas]
    return got[0][-1][0] - got[0][0][0]


def test_lookups_overlap():
    """With a four-cycle lookup, one port pair hands on a READ every five cycles or so; three
    overlap their lookups and hand on more than twice as many."""
    one, three = cycles_for_reads(1), cycles_for_reads(3)
    assert three * 2 < one, (one, three)


def test_a_qp_reset_marks_the_packets_of_that_qp_waiting():
    """Two packets wait (QP 1, QP 2) when QP 1 is reset: the first leaves ``killed``; the
    second, and a QP 1 packet taken after the reset, do not."""
    dut = Bench(2, latency=2)
    la = dut.la
    got = []

    def meta(q, psn):
        return {"opcode": Op.READ_REQUEST.value, "psn": psn, "dest_qpn": q, "rkey": 0x100}

    async def tb(ctx):
        ctx.set(la.o.meta.ready, 0)
        for q, psn in ((1, 0), (2, 1)):
            await offer(ctx, la.i.meta, meta(q, psn))
        await ctx.tick().repeat(10)
        ctx.set(la.kill_qpn, 1)
        ctx.set(la.kill, 1)
        await ctx.tick()
        ctx.set(la.kill, 0)
        ctx.set(la.o.meta.ready, 1)
        await offer(ctx, la.i.meta, meta(1, 2))

    async def sink(ctx):
        for _ in range(80):
            _, _, v, r, p = await ctx.tick().sample(la.o.meta.valid, la.o.meta.ready,
                                                    la.o.meta.payload)
            if v and r:
                got.append((p.pkt.psn, p.killed))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.add_testbench(sink)
    sim.run()
    assert got == [(0, 1), (1, 0), (2, 0)]


def test_parameters_are_checked():
    with pytest.raises(ValueError, match=r"^n must be an integer in \[1, 4\], not 5$"):
        RequestLookup(W, QB, MB, n=5)
    with pytest.raises(ValueError, match=r"^payload_beats must be a power of two in \[2, 256\], not 3$"):
        RequestLookup(W, QB, MB, payload_beats=3)
