"""cocotb tests of host-interface errors end to end, on the two-node system (hw/system.py).

The Python host fails chosen DMA requests (``fail`` of sim/host.py's PyHostDriver: the read
gets an unsupported-request completion, the write an error response), and a CQ overruns;
each test checks what the work requests complete with, what the QPs do afterwards, the
counters and the asynchronous events, as docs/errors.md describes. Run through
tests/test_system.py (Python host only: the RTL host fails only addresses outside its
memory). Environment as tests/cocotb/tb_system.py.
"""

import os

import cocotb
from cocotb.triggers import Timer

from hw.config import preset
from hw.formats import TlpStatus, WcStatus, WrOpcode
from hw.interfaces import AsyncEventType
from hw.regmap import Counter
from sim.harness import TwoNodes
from sim.verbs import RecvWR, SendWR

CFG = preset(os.environ.get("RNIC_PRESET", "small")).replace(
    host__kind=os.environ.get("RNIC_HOST", "python"),
    host__reorder=float(os.environ.get("RNIC_REORDER", "0")))
SEED = int(os.environ.get("TB_SEED", "1"))
BP = float(os.environ.get("TB_BACKPRESSURE", "0.2"))
W, R, S = WrOpcode.RDMA_WRITE, WrOpcode.RDMA_READ, WrOpcode.SEND


class Faults:
    """``fail`` for TwoNodes.start: DMA requests of ``node`` touching ``[lo, hi)`` (reads or
    writes) get ``UR``; rules can be added while the test runs."""

    def __init__(self):
        self.rules = []
        self.hits = 0

    def add(self, node, lo, hi, is_write):
        self.rules.append((node, lo, hi, is_write))

    def __call__(self, node, addr, n, is_write):
        for nd, lo, hi, w in self.rules:
            if nd == node and w == is_write and addr < hi and addr + n > lo:
                self.hits += 1
                return TlpStatus.UR
        return None


async def setup(dut, **pair):
    assert CFG.host.kind == "python", "the DMA error tests need the Python host"
    faults = Faults()
    sysm = await TwoNodes.start(dut, CFG, backpressure=BP, seed=SEED, fail=faults)
    a, b = await sysm.pair(**pair)
    await sysm.a.write_mem(a["buf"], bytes(range(256)) * 256)
    await sysm.b.write_mem(b["buf"], bytes(255 - i for i in range(256)) * 256)
    return sysm, a, b, faults


async def statuses(host, cq, n):
    wcs = await host.wait_completions(cq, n, 2_000_000)
    return [(w.wr_id, WcStatus(w.status).name) for w in wcs]


async def counters(host, *names):
    return {n: await host.ctx.read_counter(Counter[n]) for n in names}


async def then_flushed(sysm, end):
    """The QP is in ERR: a new WR completes with a flush error."""
    await end["qp"].post_send(SendWR(99, W, (end["buf"], 8, end["mr"].lkey), 0, 0))
    assert await statuses(end["host"], end["qp"].send_cq, 1) == [(99, "WR_FLUSH_ERR")]


@cocotb.test()
async def test_wqe_read_fails(dut):
    """The host fails the read of the send queue: the first WR completes with LOC_QP_OP_ERR
    and wr_id 0 (its WQE is unknown), the next one is flushed; nothing goes on the wire."""
    sysm, a, b, faults = await setup(dut)
    sysm.a.ctx.blueflame = False              # BlueFlame would spare the read
    qp = a["qp"]
    faults.add(0, qp.sq_base, qp.sq_base + 64 * qp.sq_depth, False)
    c0 = await counters(sysm.a, "TX_PACKETS", "DMA_ERRORS", "HIF_ERRORS")
    await qp.post_send([SendWR(1, W, (a["buf"], 8, a["mr"].lkey), b["buf"], b["mr"].rkey),
                        SendWR(2, W, (a["buf"], 8, a["mr"].lkey), b["buf"], b["mr"].rkey)])
    assert await statuses(sysm.a, a["cq"], 2) == [(0, "LOC_QP_OP_ERR"), (0, "WR_FLUSH_ERR")]
    c1 = await counters(sysm.a, "TX_PACKETS", "DMA_ERRORS", "HIF_ERRORS")
    assert c1["TX_PACKETS"] == c0["TX_PACKETS"]
    assert c1["DMA_ERRORS"] > c0["DMA_ERRORS"] and c1["HIF_ERRORS"] > c0["HIF_ERRORS"]
    assert faults.hits > 0


@cocotb.test()
async def test_payload_read_fails(dut):
    """The host fails the read of a WRITE's source: the WRITE completes with LOC_PROT_ERR and
    its failed packet and the ones after it are not sent (the target keeps those bytes), the
    QP goes to ERR at once, the next WR is flushed (so is a WR still waiting for its ACK then:
    docs/errors.md)."""
    sysm, a, b, faults = await setup(dut)
    la, lk, ra, rk = a["buf"], a["mr"].lkey, b["buf"], b["mr"].rkey
    mtu = CFG.nic.mtu
    faults.add(0, la + 0x1000 + mtu, la + 0x2000, False)
    before = sysm.b.mem.read(ra + 0x1000, 3 * mtu)
    await a["qp"].post_send(SendWR(1, W, (la, 8, lk), ra, rk))
    assert await statuses(sysm.a, a["cq"], 1) == [(1, "SUCCESS")]
    c0 = await counters(sysm.a, "DMA_ERRORS")
    await a["qp"].post_send([SendWR(2, W, (la + 0x1000, 3 * mtu, lk), ra + 0x1000, rk),
                             SendWR(3, W, (la + 16, 8, lk), ra + 16, rk)])
    assert await statuses(sysm.a, a["cq"], 2) == [(2, "LOC_PROT_ERR"), (3, "WR_FLUSH_ERR")]
    assert sysm.b.mem.read(ra, 8) == sysm.a.mem.read(la, 8)
    assert sysm.b.mem.read(ra + 0x1000 + mtu, 2 * mtu) == before[mtu:]
    assert sysm.b.mem.read(ra + 16, 8) != sysm.a.mem.read(la + 16, 8)
    assert (await counters(sysm.a, "DMA_ERRORS"))["DMA_ERRORS"] == c0["DMA_ERRORS"] + 1
    await then_flushed(sysm, a)


@cocotb.test()
async def test_responder_write_fails(dut):
    """The responder's host fails the write of a SEND's payload: the receive completes with
    LOC_PROT_ERR, the requester gets a NAK (remote operational error: REM_OP_ERR), both QPs
    go to ERR."""
    sysm, a, b, faults = await setup(dut)
    dst = b["buf"] + 0x2000
    faults.add(1, dst, dst + 0x1000, True)
    await b["qp"].post_recv(RecvWR(100, dst, 256, b["mr"].lkey))
    c0 = await counters(sysm.b, "NAKS_SENT", "DMA_ERRORS")
    await a["qp"].post_send(SendWR(1, S, (a["buf"], 64, a["mr"].lkey)))
    assert await statuses(sysm.b, b["cq"], 1) == [(100, "LOC_PROT_ERR")]
    assert await statuses(sysm.a, a["cq"], 1) == [(1, "REM_OP_ERR")]
    c1 = await counters(sysm.b, "NAKS_SENT", "DMA_ERRORS")
    assert c1["NAKS_SENT"] == c0["NAKS_SENT"] + 1 and c1["DMA_ERRORS"] > c0["DMA_ERRORS"]
    await then_flushed(sysm, a)
    await then_flushed(sysm, b)


@cocotb.test()
async def test_read_source_fails(dut):
    """The responder's host fails the read of a READ's source: the requester gets a NAK
    (REM_OP_ERR) instead of the data, its buffer keeps its bytes, both QPs go to ERR."""
    sysm, a, b, faults = await setup(dut)
    src = b["buf"] + 0x3000
    n = 3 * CFG.nic.mtu
    faults.add(1, src + CFG.nic.mtu, src + CFG.nic.mtu + 8, False)
    await a["qp"].post_send(SendWR(1, R, (a["buf"] + 0x4000, n, a["mr"].lkey), src,
                                   b["mr"].rkey))
    assert await statuses(sysm.a, a["cq"], 1) == [(1, "REM_OP_ERR")]
    await then_flushed(sysm, a)
    await then_flushed(sysm, b)


@cocotb.test()
async def test_cq_overrun(dut):
    """Six signaled WRs on a CQ of four entries that nobody polls: four CQEs land, the fifth
    overruns the CQ (IBA C11-37): one CQ_ERR asynchronous event, the fifth and sixth
    completions dropped and counted, the QP to ERR. The four CQEs are intact."""
    sysm, a, b, faults = await setup(dut, cq_depth=4)
    la, lk, ra, rk = a["buf"], a["mr"].lkey, b["buf"], b["mr"].rkey
    assert await sysm.a.ctx.get_async_event() is None
    await a["qp"].post_send([SendWR(i, W, (la + 8 * i, 8, lk), ra + 8 * i, rk) for i in range(6)])
    await Timer(20, "us")
    c = await counters(sysm.a, "CQE_DROPS", "ASYNC_EVENTS", "CQES")
    assert c == {"CQE_DROPS": 2, "ASYNC_EVENTS": 1, "CQES": 4}, c
    assert await sysm.a.ctx.get_async_event() == (AsyncEventType.CQ_ERR, a["cq"].cqn)
    assert await sysm.a.ctx.get_async_event() is None
    wcs = await a["cq"].poll_cq(8)
    assert [(w.wr_id, WcStatus(w.status).name) for w in wcs] == [(i, "SUCCESS") for i in range(4)]
    # all six were executed: the data of the last two is there although their CQEs are not
    assert sysm.b.mem.read(ra, 48) == sysm.a.mem.read(la, 48)
