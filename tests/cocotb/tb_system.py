"""cocotb tests of the two-node system (hw/system.py), scored against the reference model.

Run through tests/test_system.py. Environment: ``RNIC_PRESET`` (default ``small``),
``RNIC_HOST`` (``python``, the default, or ``rtl``: the build must match), ``RNIC_REORDER``
(the Python host's completion reordering probability), ``TB_SEED``, ``TB_OPS`` (random test
size), ``TB_BACKPRESSURE`` (the Python host's probability of delaying a request).
"""

import dataclasses
import os
import random

import cocotb
from cocotb.triggers import Timer

from hw.config import preset
from hw.formats import WrOpcode, WcStatus, Access, QpState, RECV_WQE_BYTES
from hw.regmap import Cmd, CmdStatus, Counter
from sim.harness import TwoNodes, ALL_ACCESS
from sim.scoreboard import Scoreboard
from sim.verbs import (SendWR, RecvWR, SendFlags, CommandError, VerbsError, ENOMEM,
                       FIRST_QPN)

CFG = preset(os.environ.get("RNIC_PRESET", "small")).replace(
    host__kind=os.environ.get("RNIC_HOST", "python"),
    host__reorder=float(os.environ.get("RNIC_REORDER", "0")))
if os.environ.get("RNIC_PUS"):          # the requester's processing units (hw/rnic/requester_units.py)
    CFG = CFG.replace(nic__n_pus=int(os.environ["RNIC_PUS"]))
SEED = int(os.environ.get("TB_SEED", "1"))
OPS = int(os.environ.get("TB_OPS", "2000"))
BP = float(os.environ.get("TB_BACKPRESSURE", "0.2"))

W, R, S, SI, WI = (WrOpcode.RDMA_WRITE, WrOpcode.RDMA_READ, WrOpcode.SEND,
                   WrOpcode.SEND_WITH_IMM, WrOpcode.RDMA_WRITE_WITH_IMM)
CAS, FAA = WrOpcode.ATOMIC_CMP_AND_SWP, WrOpcode.ATOMIC_FETCH_AND_ADD


async def fill(host, addr, n, seed):
    rng = random.Random(seed)
    await host.write_mem(addr, bytes(rng.getrandbits(8) for _ in range(n)))


async def setup(dut, **kw):
    sysm = await TwoNodes.start(dut, CFG, backpressure=kw.pop("backpressure", BP), seed=SEED,
                                pcap=kw.pop("pcap", None))
    a, b = await sysm.pair(**kw)
    await fill(sysm.a, a["buf"], 1 << 16, 1)
    await fill(sysm.b, b["buf"], 1 << 16, 2)
    sb = Scoreboard(sysm)
    sb.mirror()
    return sysm, a, b, sb


@cocotb.test()
async def test_each_opcode(dut):
    """WRITE, WRITE_WITH_IMM, SEND, SEND_WITH_IMM, READ, CAS, FAA: single and multi-packet."""
    sysm, a, b, sb = await setup(dut)
    la, lk, ra, rk = a["buf"], a["mr"].lkey, b["buf"], b["mr"].rkey
    mtu = CFG.nic.mtu
    await sb.post_recv(b["qp"], [RecvWR(100 + i, b["buf"] + 0x8000 + 0x800 * i, 0x800, b["mr"].lkey)
                                  for i in range(4)])
    wrs = [
        SendWR(1, W, (la, 8, lk), ra + 64, rk),
        SendWR(2, W, (la + 3, 2 * mtu + 5, lk), ra + 1001, rk),
        SendWR(3, R, (la + 0x2000, 8, lk), ra + 64, rk),
        SendWR(4, R, (la + 0x2100 + 1, 3 * mtu + 7, lk), ra + 5, rk),
        SendWR(5, S, (la + 0x300, 100, lk)),
        SendWR(6, SI, (la + 0x400, mtu + 1, lk), imm=0xCAFEBABE),
        SendWR(7, WI, (la + 0x500, 16, lk), ra + 0x3000, rk, imm=0x12345678),
        SendWR(8, W, (la, 0, 0), ra, rk),
        SendWR(9, CAS, (la + 0x600, 8, lk), ra + 0x4000, rk,
               compare_add=int.from_bytes(sysm.b.mem.read(ra + 0x4000, 8), "little"), swap=77),
        SendWR(10, CAS, (la + 0x608, 8, lk), ra + 0x4000, rk, compare_add=1, swap=99),
        SendWR(11, FAA, (la + 0x610, 8, lk), ra + 0x4008, rk, compare_add=5),
        SendWR(12, FAA, (la + 0x618, 8, lk), ra + 0x4008, rk, compare_add=2**64 - 1),
        SendWR(13, W, (la + 0x700, 8, lk), ra + 0x700, rk, send_flags=0),
        SendWR(14, R, (la + 0x710, 8, lk), ra + 0x700, rk),
    ]
    await sb.post_send(a["qp"], wrs)
    n = await sb.check()
    dut._log.info(f"{n} completions checked")
    counters = await sysm.a.read_counters()
    assert counters["OPS_WRITE"] == 5 and counters["OPS_READ"] == 3
    assert counters["OPS_CAS"] == 2 and counters["OPS_FAA"] == 2
    assert counters["OPS_SEND"] == 2 and counters["CQES"] == 13
    # the harness saw each CQE written into the ring (sim/tb_bench.py times the NIC by them)
    assert sysm.a.cq_writes[a["cq"].cqn] == 13, sysm.a.cq_writes
    assert await sysm.a.wait_cq_writes(a["cq"], 13) == sysm.a.cq_last_write_ns[a["cq"].cqn]
    assert counters["WQE_FETCHES"] >= 1 and counters["DMA_READS"] > 0
    assert counters["RX_DROP_ICRC"] == 0 and counters["RX_DROP_MALFORMED"] == 0
    b_counters = await sysm.b.read_counters()
    assert b_counters["RX_PACKETS"] == counters["TX_PACKETS"]
    assert b_counters["NAKS_SENT"] == 0
    # three receive WQEs consumed (SEND, SEND_WITH_IMM, WRITE_WITH_IMM), each read whole;
    # posted long before the first SEND, so all read ahead (hw/ctx/rq_prefetch.py)
    rq_reads = b_counters["RQ_WQE_PREFETCHES"] + b_counters["RQ_WQE_DEMAND_READS"]
    assert b_counters["RD_RECV_WQE_REQS"] == rq_reads >= 3, b_counters
    assert b_counters["RD_RECV_WQE_BYTES"] == RECV_WQE_BYTES * rq_reads, b_counters
    assert b_counters["RQ_WQE_DEMAND_READS"] == 0, b_counters
    # occupancy: every engine spends at least a cycle per item it handles; beats are
    # counted on both ends of the (lossless) link
    assert counters["BUSY_REQ_SEND"] >= 14 and counters["BUSY_CQE"] >= counters["CQES"], counters
    assert counters["BUSY_REQ_RESP"] >= counters["RX_PACKETS"], counters
    assert b_counters["BUSY_RSP"] >= b_counters["RX_PACKETS"], b_counters
    for c in (counters, b_counters):
        for cache in ("QP", "MR", "CQ"):
            assert c[f"BUSY_{cache}_CACHE"] >= c[f"{cache}_CACHE_HITS"] + c[f"{cache}_CACHE_MISSES"], c
        assert c["TX_PACKETS"] <= c["TX_BEATS"] <= c["TX_BYTES"], c
    assert b_counters["RX_BEATS"] == counters["TX_BEATS"] and counters["RX_BEATS"] == b_counters["TX_BEATS"]


async def _error_case(dut, make_wr, want_status, *, want_responder_err=False, post_recv=None,
                      access=ALL_ACCESS):
    sysm, a, b, sb = await setup(dut, access=access)
    if post_recv is not None:
        await sb.post_recv(b["qp"], post_recv(a, b))
    wrs = [SendWR(1, W, (a["buf"], 8, a["mr"].lkey), b["buf"], b["mr"].rkey),
           make_wr(a, b),
           SendWR(3, W, (a["buf"] + 8, 8, a["mr"].lkey), b["buf"] + 8, b["mr"].rkey),
           SendWR(4, R, (a["buf"] + 16, 8, a["mr"].lkey), b["buf"] + 16, b["mr"].rkey, send_flags=0)]
    await sb.post_send(a["qp"], wrs)
    await sb.check()
    wcs = sb.actual[(0, a["qp"].qpn)]
    statuses = [(w.wr_id, WcStatus(w.status).name) for w in wcs]
    assert statuses[:2] == [(1, "SUCCESS"), (2, want_status)], statuses
    assert all(s == "WR_FLUSH_ERR" for _, s in statuses[2:]) and len(statuses) == 4, statuses
    # The QP is in ERR: a new post completes with a flush error.
    await sb.post_send(a["qp"], SendWR(5, W, (a["buf"], 8, a["mr"].lkey), b["buf"], b["mr"].rkey))
    await sb.check()
    assert WcStatus(sb.actual[(0, a["qp"].qpn)][-1].status) == WcStatus.WR_FLUSH_ERR
    return sysm, a, b, sb


@cocotb.test()
async def test_shared_mr(dut):
    """Three QP pairs behind one PD, buffer and MR per node (``TwoNodes.pair(share=...)``, as
    the bench's peak uses them): each pair WRITEs and READs its own slice of the shared
    buffer; completions and memory against the reference model, and every pair's ends name
    the first pair's MR."""
    sysm = await TwoNodes.start(dut, CFG, backpressure=BP, seed=SEED)
    a, b = await sysm.pair()
    pairs = [(a, b)] + [tuple(await sysm.pair(share=(a, b))) for _ in range(2)]
    await fill(sysm.a, a["buf"], 1 << 16, 1)
    await fill(sysm.b, b["buf"], 1 << 16, 2)
    sb = Scoreboard(sysm)
    sb.mirror()
    assert len({x["qp"].qpn for x, _ in pairs}) == 3
    for i, (x, y) in enumerate(pairs):
        assert x["mr"] is a["mr"] and y["mr"] is b["mr"] and x["pd"] is a["pd"]
        off = 0x1000 * i
        await sb.post_send(x["qp"], [
            SendWR(10 * i + 1, W, (x["buf"] + off, 256, x["mr"].lkey), y["buf"] + off, y["mr"].rkey),
            SendWR(10 * i + 2, R, (x["buf"] + off + 0x800, 64, x["mr"].lkey),
                   y["buf"] + off + 0x400, y["mr"].rkey)])
    await sb.check()
    for x, _ in pairs:
        wcs = sb.actual[(0, x["qp"].qpn)]
        assert [WcStatus(w.status) for w in wcs] == [WcStatus.SUCCESS] * 2, wcs


@cocotb.test()
async def test_error_wrong_rkey(dut):
    await _error_case(dut, lambda a, b: SendWR(2, W, (a["buf"], 8, a["mr"].lkey), b["buf"],
                                               b["mr"].rkey ^ 0x01), "REM_ACCESS_ERR")


@cocotb.test()
async def test_error_out_of_bounds(dut):
    await _error_case(dut, lambda a, b: SendWR(2, R, (a["buf"], 64, a["mr"].lkey),
                                               b["buf"] + (1 << 16) - 32, b["mr"].rkey), "REM_ACCESS_ERR")


@cocotb.test()
async def test_error_missing_right(dut):
    access = (Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ).value
    await _error_case(dut, lambda a, b: SendWR(2, FAA, (a["buf"], 8, a["mr"].lkey), b["buf"],
                                               b["mr"].rkey, compare_add=1), "REM_ACCESS_ERR",
                      access=access)


@cocotb.test()
async def test_error_pd_mismatch(dut):
    """An rkey of a region in another protection domain of the responder."""
    sysm = await TwoNodes.start(dut, CFG, backpressure=BP, seed=SEED)
    a, b = await sysm.pair()
    other_pd = sysm.b.ctx.alloc_pd()
    other = await sysm.b.ctx.reg_mr(other_pd, b["buf"], 4096, ALL_ACCESS)
    sb = Scoreboard(sysm)
    sb.mirror()
    await sb.post_send(a["qp"], [SendWR(1, W, (a["buf"], 8, a["mr"].lkey), b["buf"], other.rkey),
                                 SendWR(2, W, (a["buf"], 8, a["mr"].lkey), b["buf"], b["mr"].rkey)])
    await sb.check()
    statuses = [WcStatus(w.status).name for w in sb.actual[(0, a["qp"].qpn)]]
    assert statuses == ["REM_ACCESS_ERR", "WR_FLUSH_ERR"], statuses


@cocotb.test()
async def test_error_misaligned_atomic(dut):
    await _error_case(dut, lambda a, b: SendWR(2, CAS, (a["buf"], 8, a["mr"].lkey), b["buf"] + 4,
                                               b["mr"].rkey), "REM_INV_REQ_ERR")


@cocotb.test()
async def test_error_unknown_opcode(dut):
    await _error_case(dut, lambda a, b: SendWR(2, 0x2A, (a["buf"], 8, a["mr"].lkey), b["buf"],
                                               b["mr"].rkey), "LOC_QP_OP_ERR")


@cocotb.test()
async def test_error_bad_lkey(dut):
    await _error_case(dut, lambda a, b: SendWR(2, W, (a["buf"], 8, a["mr"].lkey ^ 0x80), b["buf"],
                                               b["mr"].rkey), "LOC_PROT_ERR")


@cocotb.test()
async def test_error_send_without_receive(dut):
    await _error_case(dut, lambda a, b: SendWR(2, S, (a["buf"], 8, a["mr"].lkey)),
                      "RNR_RETRY_EXC_ERR")


@cocotb.test()
async def test_error_send_too_long(dut):
    await _error_case(dut, lambda a, b: SendWR(2, S, (a["buf"], 300, a["mr"].lkey)),
                      "REM_INV_REQ_ERR",
                      post_recv=lambda a, b: RecvWR(50, b["buf"], 100, b["mr"].lkey))


@cocotb.test()
async def test_error_send_queue_overflow(dut):
    """post_send refuses to overflow; a doorbell that overflows anyway is rejected and the QP
    fails: DOORBELL_REJECTS counts it, the QP is in ERR, the work request the NIC had already
    taken completes with WR_FLUSH_ERR, those of the rejected doorbell never complete (the NIC
    never took them), and the QP works again once reset (docs/errors.md)."""
    sysm, a, b, sb = await setup(dut, sq_depth=4, rnr_retry=7)
    qp, cq = a["qp"], a["cq"]
    wrs = [SendWR(i, W, (a["buf"], 8, a["mr"].lkey), b["buf"], b["mr"].rkey) for i in range(5)]
    try:
        await qp.post_send(wrs)
    except VerbsError as e:
        assert e.errno == ENOMEM and "send queue full" in str(e), e
    else:
        raise AssertionError("post_send accepted 5 WQEs on a 4-entry send queue")
    # One work request the NIC takes and keeps outstanding: a SEND without a receive at b,
    # RNR-NAKed for ever (rnr_retry 7).
    await qp.post_send(SendWR(10, S, (a["buf"], 8, a["mr"].lkey)))
    for _ in range(2000):
        if (await sysm.a.read_counters())["RNR_NAKS_RECEIVED"]:
            break
    else:
        raise AssertionError("the SEND was never RNR-NAKed")
    # Four more make five beyond the NIC's consumer index on a 4-entry ring.
    await qp.post_send(wrs[1:], allow_overflow=True)
    (wc,) = await sysm.a.wait_completions(cq, 1, 2_000_000)
    assert (wc.wr_id, WcStatus(wc.status)) == (10, WcStatus.WR_FLUSH_ERR), wc
    counters = await sysm.a.read_counters()
    assert counters["DOORBELL_REJECTS"] == 1, counters
    # The rejected doorbell's work requests were never taken: no completion for them.
    await Timer(50, "us")
    assert await cq.poll_cq(8) == []
    assert counters["OPS_WRITE"] == 0 and counters["CQES"] == 1, counters
    # The NIC has the QP in ERR: ERR -> RTS is refused (RTS -> RTS would be accepted).
    try:
        await qp.modify_qp(QpState.RTS, check=False)
    except CommandError as e:
        assert e.status == CmdStatus.BAD_TRANSITION, e
    else:
        raise AssertionError("the NIC accepted RTS for a QP whose doorbell overflowed")
    # Reset and reconnected, the QP works again (b still expects PSN 0: the SEND was only
    # RNR-NAKed; b's receive side is untouched).
    await qp.modify_qp(QpState.RESET)
    await qp.set_remote(b["host"].ctx.node_id, b["qp"].qpn)
    for state in (QpState.INIT, QpState.RTR, QpState.RTS):
        await qp.modify_qp(state, sq_psn=0, rq_psn=0)
    sb.mirror()
    await sb.post_send(qp, SendWR(20, W, (a["buf"], 8, a["mr"].lkey), b["buf"], b["mr"].rkey))
    await sb.check()
    assert [(w.wr_id, WcStatus(w.status).name) for w in sb.actual[(0, qp.qpn)]] == [
        (20, "SUCCESS")]


@cocotb.test()
async def test_error_illegal_transition(dut):
    """RTS -> RTR and RTS -> INIT are not IBA 10.3.1 transitions. The driver refuses them
    without asking the NIC (ValueError); sent anyway, the NIC refuses them with
    BAD_TRANSITION, and the QP stays in RTS: it still carries traffic, and RTS -> RTS (legal
    only from RTS) is accepted."""
    sysm, a, b, sb = await setup(dut)
    qp = a["qp"]
    c0 = await sysm.a.read_counters()
    try:
        await qp.modify_qp(QpState.RTR)
    except ValueError as e:
        assert "cannot go from RTS to RTR" in str(e), e
    else:
        raise AssertionError("the driver accepted RTS -> RTR")
    # The same command, driven to the hardware: through modify_qp without the driver's
    # check, and as a raw MODIFY_QP command (ARG0 = new state, ARG1 = PSNs).
    try:
        await qp.modify_qp(QpState.RTR, check=False)
    except CommandError as e:
        assert e.cmd == Cmd.MODIFY_QP and e.status == CmdStatus.BAD_TRANSITION, e
    else:
        raise AssertionError("the NIC accepted RTS -> RTR")
    try:
        await sysm.a.ctx.command(Cmd.MODIFY_QP, qp.qpn, QpState.INIT.value.to_bytes(8, "little")
                                 + bytes(8))
    except CommandError as e:
        assert e.status == CmdStatus.BAD_TRANSITION, e
    else:
        raise AssertionError("the NIC accepted RTS -> INIT")
    assert qp.state == QpState.RTS
    # Unchanged: the QP still carries traffic both ways (scored against the reference) ...
    la, lk, ra, rk = a["buf"], a["mr"].lkey, b["buf"], b["mr"].rkey
    await sb.post_send(qp, [SendWR(1, W, (la, 64, lk), ra + 0x100, rk),
                            SendWR(2, R, (la + 0x200, 64, lk), ra + 0x300, rk),
                            SendWR(3, FAA, (la + 0x400, 8, lk), ra + 0x500, rk, compare_add=3)])
    await sb.check()
    assert [WcStatus(w.status).name for w in sb.actual[(0, qp.qpn)]] == ["SUCCESS"] * 3
    counters = await sysm.a.read_counters()
    assert counters["OPS_WRITE"] - c0["OPS_WRITE"] == 1, counters
    # ... and RTS -> RTS, legal from RTS and refused from RESET, INIT and ERR, is accepted
    # (raises CommandError otherwise); test_modify_keeps_transport_state checks it changes
    # nothing.
    await qp.modify_qp(QpState.RTS)
    assert qp.state == QpState.RTS


@cocotb.test()
async def test_modify_keeps_transport_state(dut):
    """IBA 10.3.1: RTS -> RTS changes attributes only (the send queue keeps its indices and
    PSNs: nothing already done is done again), and a SEND received while the responder was in
    RTR stays received after RTR -> RTS (its PSN and receive queue carry on)."""
    sysm = await TwoNodes.start(dut, CFG, backpressure=BP, seed=SEED)
    a, b = await sysm.pair()
    sb = Scoreboard(sysm)
    sb.mirror()
    la, lk, ra, rk = a["buf"], a["mr"].lkey, b["buf"], b["mr"].rkey
    await sb.post_send(a["qp"], [SendWR(i, W, (la + 8 * i, 8, lk), ra + 8 * i, rk) for i in range(3)])
    await sb.check()
    c0 = await sysm.a.read_counters()
    await a["qp"].modify_qp(QpState.RTS)
    await b["qp"].modify_qp(QpState.RTS)
    await sb.post_send(a["qp"], SendWR(3, W, (la + 24, 8, lk), ra + 24, rk))
    await sb.check()
    c1 = await sysm.a.read_counters()
    assert c1["OPS_WRITE"] - c0["OPS_WRITE"] == 1, "RTS -> RTS made the NIC send old WQEs again"
    assert [w.wr_id for w in sb.actual[(0, a["qp"].qpn)]] == [0, 1, 2, 3]
    # A second pair whose responder stays in RTR while it receives a SEND.
    ha, hb = sysm.a, sysm.b
    ends = []
    for h in (ha, hb):
        pd = h.ctx.alloc_pd()
        cq = await h.ctx.create_cq(64)
        buf = h.ctx.alloc(1 << 12, 4096)
        mr = await h.ctx.reg_mr(pd, buf, 1 << 12, ALL_ACCESS)
        qp = await h.ctx.create_qp(pd, cq, cq, access=ALL_ACCESS)
        ends.append({"host": h, "qp": qp, "cq": cq, "pd": pd, "mr": mr, "buf": buf})
    x, y = ends
    await x["qp"].set_remote(hb.ctx.node_id, y["qp"].qpn)
    await y["qp"].set_remote(ha.ctx.node_id, x["qp"].qpn)
    for st in (QpState.INIT, QpState.RTR, QpState.RTS):
        await x["qp"].modify_qp(st, sq_psn=5, rq_psn=9)
    for st in (QpState.INIT, QpState.RTR):
        await y["qp"].modify_qp(st, sq_psn=9, rq_psn=5)
    sb2 = Scoreboard(sysm)
    sb2.mirror()
    await sb2.post_recv(y["qp"], [RecvWR(50 + i, y["buf"] + 256 * i, 256, y["mr"].lkey) for i in range(2)])
    await sb2.post_send(x["qp"], SendWR(60, S, (x["buf"], 16, x["mr"].lkey)))
    await sb2.check()
    await y["qp"].modify_qp(QpState.RTS)
    await sb2.post_send(x["qp"], SendWR(61, S, (x["buf"] + 16, 16, x["mr"].lkey)))
    await sb2.check()
    assert [(w.wr_id, WcStatus(w.status).name) for w in sb2.actual[(1, y["qp"].qpn)]] == [
        (50, "SUCCESS"), (51, "SUCCESS")]


async def random_wr(rng, sb, wr_id, src, dst, op, area, sizes):
    """A random work request ``op`` from ``src`` to ``dst`` (posts the receive it needs).

    Buffer layout, four areas of ``area`` bytes: READ destinations and atomic results,
    write sources, READ sources, write targets (whose first 128 bytes are the atomics'
    counters). Sizes: 0, 1, 8, 64, up to ``sizes[0]`` or up to ``sizes[1]`` bytes.
    """
    dst_area, src_area, read_area, write_area = 0, area, 2 * area, 3 * area
    if op in (CAS, FAA):
        size = 8
        loff = dst_area + (rng.randrange(0, area - 8) & ~7)
        roff = write_area + rng.randrange(0, 16) * 8     # a few shared counters
    else:
        size = rng.choice([0, 1, 8, 64, rng.randrange(1, sizes[0]), rng.randrange(sizes[0], sizes[1])])
        base = dst_area if op == R else src_area
        loff = base + rng.randrange(0, area - size + 1)
        roff = (read_area if op == R else write_area) + rng.randrange(0, area - size + 1)
    if op in (S, SI, WI):
        await sb.post_recv(dst["qp"], RecvWR(wr_id, dst["buf"] + write_area, area, dst["mr"].lkey))
    flags = SendFlags.SIGNALED if rng.random() < 0.8 else 0
    if rng.random() < 0.1:
        flags |= SendFlags.FENCE
    return SendWR(wr_id, op, (src["buf"] + loff, size, src["mr"].lkey), dst["buf"] + roff,
                  dst["mr"].rkey,
                  compare_add=rng.getrandbits(64) if op == FAA else rng.choice([0, rng.getrandbits(64)]),
                  swap=rng.getrandbits(64), imm=rng.getrandbits(32), send_flags=flags)


async def post_batch(sb, batch, deferred=False):
    """Post ``[(src end, SendWR)]`` in order. The last request of each QP is signaled: its
    completion means every earlier (possibly unsignaled) request of the QP is done, so that
    memory can be compared. ``deferred``: write every WQE first and return the QPs whose
    doorbells are still to be rung (:func:`ring_all`)."""
    last = {id(src["qp"]): i for i, (src, _) in enumerate(batch)}
    qps = {}
    for i, (src, wr) in enumerate(batch):
        if last[id(src["qp"])] == i:
            wr = dataclasses.replace(wr, send_flags=wr.send_flags | SendFlags.SIGNALED)
        await sb.post_send(src["qp"], wr, ring=not deferred)
        qps[id(src["qp"])] = src["qp"]
    return list(qps.values())


async def ring_all(qps):
    for qp in qps:
        await qp.ring_sq()


async def run_random(dut, ops, npairs, *, both_directions=True, seed=SEED, timeout_ns=20_000_000,
                     cfg=CFG, backpressure=BP, batch_times=None, deferred=False,
                     settle_ns=2000, sizes=(4096, 20000)):
    """Random traffic over ``npairs`` QP pairs, checked against the reference after each
    batch (``batch_times``: a list to which the time each batch took is appended).
    ``deferred``: each batch's WQEs are all written before its doorbells are rung, and the
    batch is timed from the first doorbell (so that the host CPU's memory writes, which take
    time on the RTL host's CPU port and none on the Python host, are not timed); the
    doorbells are rung ``settle_ns`` after the WQEs are written, so that every batch starts
    from a NIC that has finished the previous batch's tail (the last write responses and
    context reads that follow the CQEs Python waited for) on either host: without it the
    Python host, whose WQE writes take no simulated time, rang the next doorbells while that
    tail was still in flight and the RTL host 560 ns later, so the batches started from
    different NIC states (docs/verification.md)."""
    from sim.harness import now_ns
    rng = random.Random(seed)
    sysm = await TwoNodes.start(dut, cfg, backpressure=backpressure, seed=seed)
    buf = 1 << 17
    # Each pair has its own buffers. Requester side: [0, 32K) receives READ data and atomic
    # results, [32K, 64K) is only ever read (WRITE/SEND sources). Responder side: [64K, 96K)
    # is only read (READ sources), [96K, 128K) is written (WRITE, SEND, atomics). Work
    # requests of one QP execute in order, except that a WRITE/SEND/atomic may overtake an
    # earlier RDMA READ at the responder unless fenced (IBA 9.5): READ sources are kept apart
    # from later writes so that the reference model can predict every byte.
    dst_area, src_area, read_area, write_area = 0, 1 << 15, 1 << 16, 3 << 15
    pairs = [await sysm.pair(buf_bytes=buf, sq_depth=64, rq_depth=64, cq_depth=512)
             for _ in range(npairs)]
    for i, (x, y) in enumerate(pairs):
        await fill(sysm.a, x["buf"], buf, 10 + i)
        await fill(sysm.b, y["buf"], buf, 20 + i)
        for host, end in ((sysm.a, x), (sysm.b, y)):      # shared counters start at 0
            await host.write_mem(end["buf"] + write_area, bytes(128))
    sb = Scoreboard(sysm)
    sb.mirror()
    done = 0
    wr_id = 0
    while done < ops:
        batch = []
        for k, (x, y) in enumerate(pairs):
            # Even pairs send from a to b, odd pairs from b to a: both roles on both nodes.
            src, dst = (x, y) if k % 2 == 0 or not both_directions else (y, x)
            for _ in range(rng.randrange(1, 9)):
                op = rng.choices([W, R, S, SI, WI, CAS, FAA], [30, 30, 10, 5, 5, 10, 10])[0]
                batch.append((src, await random_wr(rng, sb, wr_id, src, dst, op, 1 << 15,
                                                   sizes)))
                wr_id += 1
        if deferred:
            qps = await post_batch(sb, batch, deferred=True)
            await Timer(settle_ns, "ns")
            t0 = now_ns()
            await ring_all(qps)
        else:
            t0 = now_ns()
            await post_batch(sb, batch)
        done += len(batch)
        await sb.check(timeout_ns=timeout_ns)
        if batch_times is not None:
            batch_times.append(now_ns() - t0)
    await sb.check_host_memory()
    dut._log.info(f"random: {done} work requests over {npairs} QP pairs checked")
    return sysm, sb


@cocotb.test()
async def test_random_mixed(dut):
    """Random traffic over 12 QPs (6 pairs, 3 in each direction), sizes 0 B to beyond 16 KB."""
    npairs = CFG.nic.n_qps - FIRST_QPN
    sysm, sb = await run_random(dut, OPS, npairs)
    if CFG.host.blueflame:      # every WR is posted alone: some WQEs come by BlueFlame
        for h in (sysm.a, sysm.b):
            assert await h.ctx.read_counter(Counter.BLUEFLAME_WQES) > 0
    # the MR table, the CQ and the QP contexts are in ICM: with fewer cache entries than
    # regions (CQs, QPs) in use, lookups miss, dirty entries (SET_MR, SET_CQ, SET_QP) are
    # written back and read again, and the scoreboard saw every byte and completion right
    # through them; the three caches share the ICM DMA clients
    for h in (sysm.a, sysm.b):
        c = await h.read_counters()
        dut._log.info("MR, CQ and QP caches: " + ", ".join(f"{k} {c[k]}" for k in (
            "MR_CACHE_HITS", "MR_CACHE_MISSES", "MR_CACHE_EVICTIONS", "MR_CACHE_WRITEBACKS",
            "CQ_CACHE_HITS", "CQ_CACHE_MISSES", "CQ_CACHE_EVICTIONS", "CQ_CACHE_WRITEBACKS",
            "QP_CACHE_HITS", "QP_CACHE_MISSES", "QP_CACHE_EVICTIONS", "QP_CACHE_WRITEBACKS",
            "RD_ICM_REQS", "RD_ICM_BYTES", "WR_ICM_REQS", "WR_ICM_BYTES")))
        assert c["RD_ICM_BYTES"] == 32 * c["RD_ICM_REQS"]
        assert (c["WR_ICM_BYTES"] == 32 * c["WR_ICM_REQS"]
                == 32 * (c["MR_CACHE_WRITEBACKS"] + c["CQ_CACHE_WRITEBACKS"]
                         + c["QP_CACHE_WRITEBACKS"]))
        assert c["RD_ICM_REQS"] <= (c["MR_CACHE_MISSES"] + c["CQ_CACHE_MISSES"]
                                    + c["QP_CACHE_MISSES"])
        # one QP per pair on each node, fewer cache entries than QPs: contexts are evicted
        # (dirty from SET_QP: written back) and read again
        if CFG.nic.qp_cache_sets * CFG.nic.qp_cache_ways < npairs:
            assert c["QP_CACHE_EVICTIONS"] > 0 and c["QP_CACHE_WRITEBACKS"] > 0, c
        # one CQ per pair on each node: every signaled completion looks its CQ up
        assert c["CQ_CACHE_HITS"] + c["CQ_CACHE_MISSES"] >= c["CQES"]
        if CFG.nic.cq_cache_sets * CFG.nic.cq_cache_ways < npairs:
            assert c["CQ_CACHE_EVICTIONS"] > 0 and c["CQ_CACHE_WRITEBACKS"] > 0, c
        # the WQE cache: every miss read one WQE (64 bytes) again from its send queue
        dut._log.info("WQE cache: " + ", ".join(f"{k} {c[k]}" for k in (
            "WQE_CACHE_HITS", "WQE_CACHE_MISSES", "WQE_CACHE_EVICTIONS",
            "RD_WQE_REREAD_REQS", "RD_WQE_REREAD_BYTES")))
        assert c["RD_WQE_REREAD_REQS"] == c["WQE_CACHE_MISSES"]
        assert c["RD_WQE_REREAD_BYTES"] == 64 * c["WQE_CACHE_MISSES"]
        assert c["WQE_CACHE_HITS"] + c["WQE_CACHE_MISSES"] > 0
        if CFG.nic.mr_cache_sets * CFG.nic.mr_cache_ways < npairs:
            assert c["RD_ICM_REQS"] > 0 and c["MR_CACHE_EVICTIONS"] > 0
            assert c["MR_CACHE_WRITEBACKS"] >= npairs - CFG.nic.mr_cache_sets * CFG.nic.mr_cache_ways
        else:
            assert c["RD_ICM_REQS"] == 0 and c["MR_CACHE_EVICTIONS"] == 0


@cocotb.test()
async def test_random_within_caches(dut):
    """The counterpart of test_random_mixed (whose regions and outstanding requests exceed
    the caches): random traffic whose working set fits, one QP pair (one region per node: the
    MR cache holds 2) and batches of at most 8 work requests (the WQE cache holds 8 WQEs,
    consecutive send-queue indices in consecutive sets). Completions and memory against the
    reference model; no MR or CQ context is read from ICM or evicted, no WQE is read again."""
    entries = CFG.nic.wqe_cache_sets * CFG.nic.wqe_cache_ways
    assert entries >= 8 and CFG.nic.mr_cache_sets * CFG.nic.mr_cache_ways >= 1
    sysm, sb = await run_random(dut, OPS, 1, sizes=(256, 2048))
    for h in (sysm.a, sysm.b):
        c = await h.read_counters()
        dut._log.info("within the caches: " + ", ".join(f"{k} {c[k]}" for k in (
            "MR_CACHE_HITS", "MR_CACHE_MISSES", "MR_CACHE_EVICTIONS", "RD_ICM_REQS",
            "WQE_CACHE_HITS", "WQE_CACHE_MISSES", "WQE_CACHE_EVICTIONS", "RD_WQE_REREAD_REQS")))
        assert c["MR_CACHE_HITS"] > OPS // 2
        assert c["RD_ICM_REQS"] == 0 and c["MR_CACHE_EVICTIONS"] == 0, c
        assert c["CQ_CACHE_EVICTIONS"] == 0 and c["CQ_CACHE_HITS"] >= c["CQES"], c
        assert c["WQE_CACHE_MISSES"] == 0 and c["RD_WQE_REREAD_REQS"] == 0, c
    # node a sends every request: its WQE cache was used
    assert (await sysm.a.read_counters())["WQE_CACHE_HITS"] > OPS // 2


@cocotb.test()
async def test_wqe_cache_guard(dut):
    """The WQE cache (docs/caches.md): 64 signaled READs of one QP, posted in groups of
    ``k``. With groups of 4 (fewer outstanding than the cache's entries) no WQE is read
    again; with all 64 rung at once, more are outstanding than the cache holds, responses
    find their WQE evicted and read it again: the host-interface read bytes per request
    rise. The READs are one MTU each: a response takes ``mtu / data_bytes`` beats, the
    request a few, so the requests run ahead of the responses and up to ``max_rd_atomic``
    are outstanding (8-byte READs come back about as fast as they go out: since the cache
    frees a completed WQE's way, e442682, those keep within the cache and miss on none).
    Completions and memory are checked against the reference model."""
    sysm, a, b, sb = await setup(dut, sq_depth=128, cq_depth=256)
    # the QP's processing unit has its share of the WQE cache
    entries = CFG.nic.wqe_cache_sets * CFG.nic.wqe_cache_ways // CFG.nic.n_pus
    assert CFG.nic.max_rd_atomic > entries, "the guard needs more outstanding than entries"
    la, lk, ra, rk = a["buf"], a["mr"].lkey, b["buf"], b["mr"].rkey
    n = CFG.nic.mtu
    assert 64 * n <= 0x8000, "the READs' buffers must fit the filled regions"
    per_req = {}
    for group in (4, 64):
        c0 = await sysm.a.read_counters()
        for g in range(0, 64, group):
            await sb.post_send(a["qp"], [SendWR(1000 * group + i, R, (la + n * i, n, lk),
                                                ra + 0x100 + n * i, rk)
                                         for i in range(g, g + group)])
            await sb.check()
        c1 = await sysm.a.read_counters()
        d = {k: c1[k] - c0[k] for k in ("WQE_CACHE_HITS", "WQE_CACHE_MISSES",
                                        "RD_WQE_REREAD_REQS", "RD_WQE_REREAD_BYTES",
                                        "HIF_DOWN_BYTES", "HIF_UP_BYTES", "DMA_READ_BYTES")}
        per_req[group] = (d["HIF_DOWN_BYTES"] + d["HIF_UP_BYTES"]) / 64
        dut._log.info(f"groups of {group}: {d}, host-interface bytes per READ "
                      f"{per_req[group]:.1f}")
        assert d["WQE_CACHE_HITS"] + d["WQE_CACHE_MISSES"] == 64      # one lookup per READ
        assert d["RD_WQE_REREAD_BYTES"] == 64 * d["RD_WQE_REREAD_REQS"] == 64 * d["WQE_CACHE_MISSES"]
        if group <= entries:
            assert d["WQE_CACHE_MISSES"] == 0, d
        else:
            assert d["WQE_CACHE_MISSES"] > 0, d
    assert per_req[64] > per_req[4] + 16, per_req


@cocotb.test()
async def test_blueflame(dut):
    """A single WR posted by BlueFlame needs no WQE read: ten WRITEs, one at a time, leave
    RD_WQE_REQS unchanged and are quicker by about one DMA read round trip than the same
    WRITEs rung by an 8-byte doorbell (the driver's blueflame off)."""
    from sim.harness import now_ns
    sysm, a, b, sb = await setup(dut, backpressure=None)
    la, lk, ra, rk = a["buf"], a["mr"].lkey, b["buf"], b["mr"].rkey
    lat = {}
    for bf in (True, False):
        sysm.a.ctx.blueflame = bf
        c0 = await sysm.a.read_counters()
        times = []
        for i in range(10):
            t = now_ns()
            await sb.post_send(a["qp"], SendWR(i, W, (la + 8 * i, 8, lk), ra + 8 * i, rk))
            await sb.check()
            times.append(now_ns() - t)
        c1 = await sysm.a.read_counters()
        d = {k: c1[k] - c0[k] for k in ("BLUEFLAME_WQES", "BLUEFLAME_MISSES", "RD_WQE_REQS",
                                        "WQE_FETCHES")}
        dut._log.info(f"blueflame={bf}: {d}, latency {sorted(times)} ns")
        if bf:
            assert d == {"BLUEFLAME_WQES": 10, "BLUEFLAME_MISSES": 0, "RD_WQE_REQS": 0,
                         "WQE_FETCHES": 10}, d
        else:
            assert d == {"BLUEFLAME_WQES": 0, "BLUEFLAME_MISSES": 0, "RD_WQE_REQS": 10,
                         "WQE_FETCHES": 10}, d
        lat[bf] = sorted(times)[5]
    saved = lat[False] - lat[True]
    rtt = CFG.host.dma_read_ns
    assert 0.5 * rtt <= saved <= 2 * rtt, (lat, rtt)


@cocotb.test()
async def test_mmio_register_map(dut):
    """Through the NIC's bus decoder: named registers answer; accesses outside every window
    (beyond the last doorbell register, in a gap) are ignored, read 0 and are counted in
    MMIO_UNMAPPED; a write beyond the last doorbell register rings nothing."""
    from hw.regmap import DOORBELL_BASE, ID_VALUE, Reg
    sysm, a, b, sb = await setup(dut, backpressure=None)
    ctx = sysm.a.ctx
    c0 = await sysm.a.read_counters()
    assert await ctx.mmio_read(Reg.ID) == ID_VALUE
    beyond = DOORBELL_BASE + 8 * CFG.nic.n_doorbells
    await ctx.mmio_write(beyond, a["qp"].qpn | (1 << 32))
    assert await ctx.mmio_read(beyond) == 0
    await ctx.mmio_write(0x4000, 0xFFFF_FFFF)
    assert await ctx.mmio_read(0x4000) == 0
    c1 = await sysm.a.read_counters()
    d = {k: c1[k] - c0[k] for k in ("MMIO_UNMAPPED", "DOORBELLS", "DOORBELL_REJECTS")}
    assert d == {"MMIO_UNMAPPED": 4, "DOORBELLS": 0, "DOORBELL_REJECTS": 0}, d
    # the QP still works
    la, lk, ra, rk = a["buf"], a["mr"].lkey, b["buf"], b["mr"].rkey
    await sb.post_send(a["qp"], SendWR(1, W, (la, 8, lk), ra, rk))
    await sb.check()


@cocotb.test(skip=CFG.host.kind != "rtl")
async def test_unmirrored_event_line(dut):
    """The RTL host without a Python copy of its memory (full-speed mode): completions are
    awaited on the host's event line only, which brings each CQE into Python's copy of the
    CQ rings (so polling reads nothing through the CPU port); Python reads other memory
    through the CPU port and never wakes for the NIC's other DMA writes."""
    sysm = await TwoNodes.start(dut, CFG, mirror=False, seed=SEED)
    a, b = await sysm.pair()
    la, lk, ra, rk = a["buf"], a["mr"].lkey, b["buf"], b["mr"].rkey
    data = bytes(range(256)) * 4
    await sysm.a.write_mem(la, data)
    await a["qp"].post_send([SendWR(1, W, (la, 1024, lk), ra, rk),
                             SendWR(2, R, (la + 2048, 512, lk), ra + 256, rk)])
    wcs = await sysm.a.wait_completions(a["cq"], 2)
    assert [(w.wr_id, WcStatus(w.status)) for w in wcs] == [(1, WcStatus.SUCCESS),
                                                             (2, WcStatus.SUCCESS)]
    assert sysm.a.mem.cpu_reads == 0 and sysm.a.mem.events == 2 and sysm.b.mem.events == 0
    assert await sysm.b.mem.readback(ra, 1024) == data
    assert await sysm.a.mem.readback(la + 2048, 512) == data[256:768]
    assert sysm.a.mem.wakeups == 0 and sysm.a.mem.writes == 0
    assert int(dut.a_cqe_events.value) == 2


@cocotb.test()
async def test_agreement_record(dut):
    """A fixed workload (no host back-pressure, no reordering) whose results the pytest side
    compares between the Python and the RTL host (tests/test_system.py): completions, the
    memory of every buffer and the time of each batch, written to ``AGREE_FILE``."""
    import hashlib
    import json
    cfg = CFG.replace(host__reorder=0.0)
    times = []
    sysm, sb = await run_random(dut, 300, 4, seed=77, cfg=cfg, backpressure=None,
                                batch_times=times, deferred=True)
    wcs = {f"{k[0]}/{k[1]}": [(w.wr_id, int(getattr(w.status, "value", w.status)), w.byte_len)
                              for w in v] for k, v in sorted(sb.actual.items())}
    mem = {}
    for h in (sysm.a, sysm.b):
        lo, hi = h.ctx.host_base, h.ctx._brk
        mem[str(h.ctx.node_id)] = hashlib.sha256(h.mem.read(lo, hi - lo)).hexdigest()
    path = os.environ.get("AGREE_FILE")
    if path:
        with open(path, "w") as f:
            json.dump({"host": cfg.host.kind, "completions": wcs, "memory": mem,
                       "batch_ns": times}, f)


@cocotb.test()
async def test_pcap_capture(dut):
    """Every frame both links carry goes into a pcap (checked by tests/test_system.py)."""
    path = os.environ.get("PCAP_FILE")
    assert path, "PCAP_FILE not set"
    sysm, a, b, sb = await setup(dut, pcap=path)
    la, lk, ra, rk = a["buf"], a["mr"].lkey, b["buf"], b["mr"].rkey
    await sb.post_recv(b["qp"], [RecvWR(100, b["buf"] + 0x8000, 0x800, b["mr"].lkey),
                                  RecvWR(101, b["buf"] + 0x8800, 0x800, b["mr"].lkey)])
    await sb.post_send(a["qp"], [
        SendWR(1, W, (la, 300, lk), ra + 64, rk),
        SendWR(2, R, (la + 0x2000, 600, lk), ra + 64, rk),
        SendWR(3, SI, (la + 0x300, 20, lk), imm=0xCAFEBABE),
        SendWR(4, WI, (la + 0x500, 16, lk), ra + 0x3000, rk, imm=0x12345678),
        SendWR(5, CAS, (la + 0x600, 8, lk), ra + 0x4000, rk, compare_add=1, swap=2),
        SendWR(6, FAA, (la + 0x610, 8, lk), ra + 0x4008, rk, compare_add=5),
        SendWR(7, W, (la, 8, lk), ra, rk ^ 1),            # NAK: remote access error
    ])
    await sb.check()
    sysm.close()
    frames = sum(m.frames for m in sysm.monitors)
    counters = (await sysm.a.read_counters(), await sysm.b.read_counters())
    assert frames == counters[0]["TX_PACKETS"] + counters[1]["TX_PACKETS"], (frames, counters)
