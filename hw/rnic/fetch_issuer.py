"""The requester's WQE fetch issuer: keeps several send-queue reads in flight.

Real NICs overlap the PCIe round trips of WQE fetches of different QPs (SMART, ASPLOS 2024,
section 2: the NIC reads WQEs by DMA after a doorbell; mlx5 BlueFlame carries a WQE in the
doorbell write instead). The issuer takes the oldest QP of the requester's ready queue
(``offer``; woken by doorbells, completions, finished batches: event-driven scheduling,
hw/lib/ready_queue.py) and, if that QP may issue and has no batch in flight (``take_ok``,
evaluated by the requester at the offered QP), reserves it (``reserve``: the requester marks
the QP in flight; at most one batch per QP keeps its WQEs in order) and looks up its context
(``qpc``, request / response, one lookup at a time). With the answer the batch is planned
by the requester (``plan``: the first WQE's address and index, how many WQEs, at most
``wqe_batch``) and the read request is held in a register until the WQE fetcher takes it
(``req``; an offered request stays valid and stable). If the QP's next WQE arrived by
BlueFlame (hw/rnic/bf_buffer.py) that copy is used instead of a DMA read; a DMA read drops the
copies it makes useless. The batch, with the context, enters a FIFO (``batch``) in issue
order, which is the order the fetched WQEs come back in; the send engine takes them from
there. A context that could not be read is queued as a bad batch with nothing fetched (the
send engine puts the QP in ERR).

At most ``fetch_depth`` batches are in flight (``n_fl``: issued and not yet ``done``); none
is issued while ``hold`` (the send engine fetches for a flush, a flush waits, a QP event
waits) and the answer of a lookup waits while the send engine's own fetch is on ``req``'s
path (``fetching``).

Parameters: ``cfg`` (:class:`~hw.config.NicConfig`: ``wqe_batch``, ``bf_entries``),
``qpn_bits`` in [1, 16], ``fetch_depth`` in [1, 16].

Ports: ``offer: In(stream {index})``; ``take_ok: In(1)``; ``hold: In(1)``; ``reserve:
Out(1)``; ``done: In(1)``; ``n_fl: Out(range(fetch_depth + 1))``; ``qpc: Out(CtxLookup)``;
``sel: Out(qpn_bits)`` (the reserved QP, whose batch the requester plans) and ``ctx:
Out(QP_CTX)`` (its context, valid with ``qpc.resp``); ``plan: In(BATCH_PLAN)``;
``fetching: In(1)``; ``req: Out(stream fetch_request_layout)``; ``batch: Out(stream
FETCHED_BATCH)``; ``bf: In(stream SQ_BF, always ready)``; ``bf_reset: In(1)`` /
``bf_reset_qpn: In(qpn_bits)`` (drop every BlueFlame copy of a QP that is reset; wins over
the issuer's own drop in the same cycle); ``stat_bf_hit``, ``stat_bf_miss``.
"""

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from .. import regmap
from .bf_buffer import SQ_BF, BlueFlameBuffer
from ..config import NicConfig
from ..interfaces import CtxLookup
from ..lib.checks import check_int
from .wqe_fetch import fetch_request_layout

__all__ = ["FetchIssuer", "batch_plan", "fetched_batch"]


def batch_plan(wqe_batch):
    """A planned batch: the first WQE's host address and send-queue index, and the WQEs to
    read (what is posted, up to the end of the ring, the tracker's room and ``wqe_batch``)."""
    return data.StructLayout({"addr": 64, "first": 16, "count": range(wqe_batch + 1)})


def fetched_batch(qpn_bits, wqe_batch):
    """A batch issued and not yet taken: its QP, WQE count (0: nothing was fetched), whether
    the QP's context could not be read, and the context."""
    return data.StructLayout({"qpn": qpn_bits, "count": range(wqe_batch + 1), "bad": 1,
                              "ctx": regmap.QP_CTX})


class FetchIssuer(wiring.Component):
    def __init__(self, cfg, qpn_bits, fetch_depth):
        if not isinstance(cfg, NicConfig):
            raise ValueError(f"cfg must be a NicConfig, not {type(cfg).__name__}")
        check_int("qpn_bits", qpn_bits, 1, 16)
        check_int("fetch_depth", fetch_depth, 1, 16)
        self.cfg = cfg
        self.qpn_bits = qpn_bits
        self.fetch_depth = fetch_depth
        K = cfg.wqe_batch
        super().__init__({
            "offer": In(stream.Signature(data.StructLayout({"index": qpn_bits}))),
            "take_ok": In(1),
            "hold": In(1),
            "reserve": Out(1),
            "done": In(1),
            "n_fl": Out(range(fetch_depth + 1)),
            "qpc": Out(CtxLookup(qpn_bits, regmap.QP_CTX)),
            "sel": Out(qpn_bits),
            "ctx": Out(regmap.QP_CTX),
            "plan": In(batch_plan(K)),
            "fetching": In(1),
            "req": Out(stream.Signature(fetch_request_layout(K * fetch_depth))),
            "batch": Out(stream.Signature(fetched_batch(qpn_bits, K))),
            "bf": In(stream.Signature(SQ_BF, always_ready=True)),
            "bf_reset": In(1),
            "bf_reset_qpn": In(qpn_bits),
            "stat_bf_hit": Out(1),
            "stat_bf_miss": Out(range(cfg.bf_entries + 1)),
        })

    def elaborate(self, platform):
        m = Module()
        K, KF = self.cfg.wqe_batch, self.fetch_depth
        layout = fetched_batch(self.qpn_bits, K)
        # batches issued and not yet taken by the send engine, in issue order
        m.submodules.fq = fq = SyncFIFOBuffered(width=layout.size, depth=KF)
        m.d.comb += [self.batch.valid.eq(fq.r_rdy), self.batch.payload.eq(fq.r_data),
                     fq.r_en.eq(self.batch.ready)]

        m.d.sync += self.n_fl.eq(self.n_fl + self.reserve - self.done)
        g_q = self.sel                    # the reserved QP whose context is looked up
        g_req = Signal()                  # its lookup request is offered
        g_busy = Signal()                 # a lookup is requested or awaited
        qf = self.qpc
        m.d.comb += [qf.req.valid.eq(g_req), qf.req.payload.index.eq(g_q),
                     self.ctx.eq(qf.resp.payload.data)]
        with m.If(qf.req.valid & qf.req.ready):
            m.d.sync += g_req.eq(0)

        # BlueFlame: the QP's next WQE may be here already (one WQE, no DMA read)
        m.submodules.bf = bfb = BlueFlameBuffer(self.qpn_bits, self.cfg.bf_entries)
        wiring.connect(m, wiring.flipped(self.bf), bfb.i)
        plan = self.plan
        m.d.comb += [bfb.qpn.eq(g_q), bfb.index.eq(plan.first),
                     self.stat_bf_hit.eq(bfb.stat_hit), self.stat_bf_miss.eq(bfb.stat_miss)]
        g_bad = qf.resp.payload.err
        g_cnt = Signal(range(K + 1))
        m.d.comb += g_cnt.eq(Mux(g_bad, 0, Mux(bfb.hit, 1, plan.count)))
        w = Signal(layout)
        m.d.comb += [w.qpn.eq(g_q), w.count.eq(g_cnt), w.bad.eq(g_bad),
                     w.ctx.eq(qf.resp.payload.data), fq.w_data.eq(w)]

        pend_v = Signal()
        pend = Signal(self.req.payload.shape())
        m.d.comb += [self.req.valid.eq(pend_v), self.req.payload.eq(pend)]
        with m.If(pend_v & self.req.ready):
            m.d.sync += pend_v.eq(0)

        # the offered QP: reserved if it may issue and has no batch in flight, else dropped
        # (the write that lets it issue again wakes it again)
        with m.If(~g_busy & ~self.hold & (self.n_fl != KF) & self.offer.valid):
            m.d.comb += self.offer.ready.eq(1)
        with m.If(self.offer.valid & self.offer.ready & self.take_ok):
            m.d.comb += self.reserve.eq(1)
            m.d.sync += [g_q.eq(self.offer.payload.index), g_req.eq(1), g_busy.eq(1)]
        # the answer: the batch is planned now (the QP's indices may have moved since it was
        # reserved, only forward: a doorbell) and queued; never while the send engine fetches
        g_ans = Signal()
        m.d.comb += [qf.resp.ready.eq(~pend_v & ~self.fetching),
                     g_ans.eq(qf.resp.valid & qf.resp.ready)]
        with m.If(g_ans):
            m.d.comb += fq.w_en.eq(1)
            m.d.sync += [g_busy.eq(0), pend_v.eq(~g_bad), pend.addr.eq(plan.addr),
                         pend.count.eq(g_cnt), pend.bf.eq(bfb.hit), pend.wqe.eq(bfb.wqe)]
            with m.If(g_bad):
                pass            # nothing is fetched: the send engine puts the QP in ERR
            with m.Elif(bfb.hit):
                m.d.comb += bfb.take.eq(1)
            with m.Else():
                # the batch is read by DMA: copies of its WQEs (or older ones) are useless
                m.d.comb += [bfb.inval.valid.eq(1), bfb.inval.payload.qpn.eq(g_q),
                             bfb.inval.payload.first.eq(plan.first),
                             bfb.inval.payload.count.eq(plan.count)]
        with m.If(self.bf_reset):
            m.d.comb += [bfb.inval.valid.eq(1), bfb.inval.payload.qpn.eq(self.bf_reset_qpn),
                         bfb.inval.payload.all.eq(1)]
        return m
