"""The requester's send engine: QP events, doorbells, rewinds, flushes and the sending of
work requests.

One state machine (IBA vol. 1 rel. 1.4: work-request processing 11.4, request packets and
segmentation by the path MTU 9.7.1 and 9.7.2, go-back-N retransmission 9.7.6.1, the flush of
a QP in the Error state 10.3.1 and 11.6.3) serialises the send-side actions. In IDLE it
applies the oldest waiting QP event, or a rewind or a flush of the service queue's oldest
QP, or takes a doorbell (the posted index, checked against the send queue), or takes the
oldest batch of WQEs the fetch issuer (hw/rnic/fetch_issuer.py) has fetched. A batch is sent
WQE by WQE while its QP may issue: the lkey's MR entry is asked for as the WQE is taken
(``mr``), the WQE is checked (hw/rnic/wqe_check.py), enters the QP's tracker and the WQE
cache (``fill``) and is segmented into request packets whose headers
(hw/rnic/request_header.py) go to the packet emitter (``desc``) with a payload read each
(``pay_req``). A WQE that fails the checks enters the tracker with its status and the QP
stops sending (a local error); a rewind sends again from the oldest outstanding message; a
flush completes the tracker's messages, then the posted WQEs (fetched by the engine itself,
``fetching``), with WR_FLUSH_ERR.

The per-QP state is the requester's (hw/rnic/req_state.py): the engine names the QP it
serves (``cur``) and sees its fields in ``view`` in the same cycle, sees the doorbell's QP
(``db_view``) and the waiting event's QP (``ev_view``), and writes through the "tx" port of
every field it changes (``w_<field>``). The READ/atomic count and fence flag are changed by
both engines in one cycle: the engine says what it does (``rd_inc``, ``fence_set``,
``rw_rst_rd``, ``ev_rst_rd``) and the requester merges. The tracker's head entry of ``cur``
comes in on ``ent``; the engine's tracker writes lose to the response engine's
(``rx_trk_we``: it retries the next cycle).

A WQE with a local buffer, nothing waiting, costs four cycles: FETCH_WAIT (taken, its lkey's
MR entry asked for), two in MR_RESP (the MR cache's answer; in its cycle the WQE is checked
and enters the tracker and the WQE cache, CHECK's work, CHECK itself only when a port makes it
wait), one in SEND_META per packet (the header queued, the payload read asked for; after the
last packet the next WQE is taken).

Deadlock freedom (hw/rnic/requester.py): the engine may wait on the transmit path and on
payload-buffer room (SEND_META) for as long as it takes, since nothing of the response path
waits for it; it keeps off the QP the response engine works on (``rx_busy``, ``rcur``).

Parameters: ``cfg`` (:class:`~hw.config.NicConfig`), ``qpn_bits`` in [1, 16], ``mr_bits``
in [1, 16], ``fetch_depth`` in [1, 16].
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from .. import formats, regmap
from ..config import NicConfig
from ..ctx.wqe_cache import WqeLookup
from ..formats import WcStatus, WrOpcode
from ..interfaces import CtxLookup, DoorbellEvent, QpErrRequest, dma_rd_req_layout
from ..lib.checks import check_int
from ..lib.reg_array import RegWriteSignature
from .fetch_issuer import fetched_batch
from .packet_emitter import desc_layout
from .req_state import CUR_FIELDS, TX_FIELDS, req_state_fields
from .request_header import RequestHeader
from .tracker import GATE_ITEM, TRACKER_ENTRY, psn_le, set_cqe, sq_slot_addr
from .wqe_check import WqeCheck
from .wqe_fetch import FETCHED

__all__ = ["SendEngine", "may_issue", "ISSUE_FIELDS"]

#: The per-QP fields :func:`may_issue` reads.
ISSUE_FIELDS = ("rts", "err", "lerr", "ev_pend", "fi", "pi", "rwd_pend", "rnr_wait", "tail",
                "head", "rd_out", "qlim", "fence_wait")

STATS = ("stat_write", "stat_read", "stat_send", "stat_cas", "stat_faa", "stat_wqe_fetch",
         "stat_db_reject", "stat_retransmit", "stat_retry_exc", "stat_wqe_err")


def may_issue(v, max_outstanding):
    """QP ``v`` (an object with the fields of hw/rnic/req_state.py read at one QP) may issue
    a request now: RTS, posted WQEs not yet fetched, room in its tracker and READ/atomic
    budget, not waiting on a fence, an event, a rewind or an RNR wait."""
    count = (v.tail - v.head)[:exact_log2(max_outstanding) + 1]
    return (v.rts & ~v.err & ~v.lerr & ~v.ev_pend & (v.fi != v.pi) & ~v.rwd_pend
            & ~v.rnr_wait & (count != max_outstanding) & (v.rd_out < v.qlim) & ~v.fence_wait)


class SendEngine(wiring.Component):
    def __init__(self, cfg, qpn_bits, mr_bits, fetch_depth):
        if not isinstance(cfg, NicConfig):
            raise ValueError(f"cfg must be a NicConfig, not {type(cfg).__name__}")
        check_int("qpn_bits", qpn_bits, 1, 16)
        check_int("mr_bits", mr_bits, 1, 16)
        check_int("fetch_depth", fetch_depth, 1, 16)
        self.cfg = cfg
        self.qpn_bits = qpn_bits
        self.mr_bits = mr_bits
        self.fetch_depth = fetch_depth
        nq, K = cfg.n_qps, cfg.wqe_batch
        mo_bits = exact_log2(cfg.max_outstanding)
        fields = req_state_fields(cfg)
        #: the fields of the QP being served, as the engine sees them
        self.view_layout = data.StructLayout({f: fields[f][0] for f in CUR_FIELDS})
        qpn = data.StructLayout({"index": qpn_bits})
        members = {
            "db": In(DoorbellEvent()),
            "db_view": In(data.StructLayout({"ci": 16, "fi": 16, "q_sqlog": 5})),
            "db_early": In(1),
            "ev_any": In(1),
            "ev_valid": In(1),
            "ev_sel": In(qpn_bits),
            "ev_view": In(data.StructLayout({"inflight": 1, "ev_reset": 1, "ev_state": 3,
                                             "ev_psn": 24, "rts": 1})),
            "ev_clear": Out(1),
            "ev_rst_rd": Out(1),
            "svc_valid": In(1),
            "svc_qpn": In(qpn_bits),
            "svc_rw": In(1),
            "svc_fl": In(1),
            "svc_rw_go": In(1),
            "svc_fl_go": In(1),
            "svc_take": Out(1),
            "svc_again": Out(1),
            "n_fl": In(range(fetch_depth + 1)),
            "fl_wait": Out(1),
            "batch": In(stream.Signature(fetched_batch(qpn_bits, K))),
            "batch_ok": In(1),
            "n_batch": In(range(K + 1)),
            "fetching": Out(1),
            "fetch_ready": In(1),
            "flushing": Out(1),
            "done": Out(1),
            "ctx": Out(regmap.QP_CTX),
            "wqe_in": In(stream.Signature(FETCHED)),
            "mr": Out(CtxLookup(mr_bits, formats.MR_ENTRY)),
            "qpc": Out(CtxLookup(qpn_bits, regmap.QP_CTX)),
            "wqe_lk": Out(WqeLookup(qpn_bits)),
            "cur": Out(qpn_bits),
            "view": In(self.view_layout),
            "trk_raddr": Out(qpn_bits + mo_bits),
            "ent": In(TRACKER_ENTRY),
            "trk_we": Out(1),
            "trk_waddr": Out(qpn_bits + mo_bits),
            "trk_wdata": Out(TRACKER_ENTRY),
            "rx_trk_we": In(1),
            "fill": Out(stream.Signature(data.StructLayout(
                {"qpn": qpn_bits, "index": 16, "wqe": formats.WQE}))),
            "desc": Out(stream.Signature(desc_layout(nq, cfg.max_outstanding))),
            "res_len": Out(16),
            "res_take": Out(1),
            "res_fits": In(1),
            "pay_req": Out(stream.Signature(dma_rd_req_layout())),
            "cqe": Out(stream.Signature(data.StructLayout({"item": GATE_ITEM, "key": qpn_bits}))),
            "err": Out(QpErrRequest()),
            "rx_busy": In(1),
            "rcur": In(qpn_bits),
            "node_id": In(8),
            "kick": Out(1),
            "rd_inc": Out(1),
            "fence_set": Out(1),
            "rw_rst_rd": Out(1),
            "wake": Out(stream.Signature(qpn, always_ready=True)),
            "wake_done": Out(stream.Signature(qpn, always_ready=True)),
            "bf_reset": Out(1),
            "bf_reset_qpn": Out(qpn_bits),
            "forget": Out(1),
            "forget_key": Out(qpn_bits),
            "active": Out(1),
            "wait_wqe": Out(1), "wait_mr": Out(1), "wait_tx": Out(1), "wait_pay": Out(1),
            **{name: Out(1) for name in STATS},
        }
        for f in TX_FIELDS:
            members[f"w_{f}"] = Out(RegWriteSignature(nq, fields[f][0]))
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        MO = cfg.max_outstanding
        mo_bits = exact_log2(MO)
        mtu_bits = exact_log2(cfg.mtu)
        K = cfg.wqe_batch
        cv, dv, evv = self.view, self.db_view, self.ev_view

        def tx(field, q, value):
            """Statements: the "tx" port of ``field`` writes ``value`` at QP ``q``."""
            w = getattr(self, f"w_{field}")
            return [w.en.eq(1), w.addr.eq(q), w.data.eq(value)]

        def pop_head():
            """Remove the head message of cur (it is completed)."""
            return tx("head", cur, cv.head + 1) + tx("ci", cur, cv.ci + 1)

        # ---------------- registers
        cur = self.cur
        flushing = self.flushing
        fetching = self.fetching
        batch_left = Signal(range(K + 1))   # WQEs of the current batch not yet taken
        wqe = Signal(formats.WQE)
        wqe_err = Signal()           # the host failed the read of this WQE: not to be used
        cqe_reg = Signal(formats.CQE)
        seg_left = Signal(32)        # bytes still to send
        seg_addr = Signal(64)        # local address of the segment
        seg_psn = Signal(24)
        seg_first = Signal()
        meta_done = Signal()
        req_done = Signal()
        act = Signal()               # a batch was taken (inflight[cur] is set)
        done = self.done
        # the context of cur: taken with its batch (looked up when the batch was issued),
        # or looked up by the engine itself for a flush (FL_CTX)
        ctx = self.ctx
        fl_asked = Signal()          # FL_CTX: the lookup request was taken
        # the lkey's MR entry, looked up (request / response) between FETCH_WAIT and CHECK
        mr = Signal(formats.MR_ENTRY)
        mr_lkey = Signal.like(wqe.lkey)
        m.d.comb += [mr_lkey.eq(wqe.lkey), self.mr.req.payload.index.eq(mr_lkey[8:8 + self.mr_bits])]

        nonempty = Signal()
        m.d.comb += nonempty.eq((cv.tail - cv.head)[:mo_bits + 1] != 0)
        e_cur = Signal()             # the QP being sent may still issue
        m.d.comb += e_cur.eq(may_issue(cv, MO))
        ent = self.ent
        m.d.comb += self.trk_raddr.eq(Cat(cv.head[:mo_bits], cur))
        rd_lim = Signal(5)
        m.d.comb += rd_lim.eq(Mux(ctx.max_rd_atomic == 0, 16, ctx.max_rd_atomic))

        # tracker writes (the response engine's win: rx_trk_we)
        tx_trk_we, tx_trk_data = self.trk_we, self.trk_wdata
        tx_trk_head = Signal()        # the head entry (retry exceeded), else the tail
        m.d.comb += self.trk_waddr.eq(Mux(tx_trk_head, Cat(cv.head[:mo_bits], cur),
                                          Cat(cv.tail[:mo_bits], cur)))
        rx_trk_we = self.rx_trk_we
        tx_kick, tx_retry_exc = self.kick, self.stat_retry_exc
        tx_rd_inc, tx_fence_set, rw_rst_rd, ev_rst_rd = (self.rd_inc, self.fence_set,
                                                         self.rw_rst_rd, self.ev_rst_rd)
        wqe_err_stat = self.stat_wqe_err
        ev_clear = self.ev_clear
        wk_tx, wk_done = self.wake, self.wake_done
        rx_busy, rcur = self.rx_busy, self.rcur
        ev_any, ev_sel, db_early = self.ev_any, self.ev_sel, self.db_early
        n_fl, n_batch = self.n_fl, self.n_batch
        e_fq = self.batch_ok
        fq = self.batch.payload
        fq_q, fq_n, fq_bad, fq_ctx = fq.qpn, fq.count, fq.bad, fq.ctx
        tx_cqe_v, tx_cqe_rdy = self.cqe.valid, self.cqe.ready
        tx_err_v, tx_err_rdy = self.err.valid, self.err.ready
        m.d.comb += [self.cqe.payload.item.req.cqn.eq(ctx.send_cq),
                     self.cqe.payload.item.req.cqe.eq(cqe_reg),
                     self.cqe.payload.key.eq(cur), self.err.payload.qpn.eq(cur)]

        # the service queue's oldest QP (a rewind or a flush waits there)
        sv, sq = self.svc_valid, self.svc_qpn
        s_rw, s_fl, s_rw_go, s_fl_go = self.svc_rw, self.svc_fl, self.svc_rw_go, self.svc_fl_go
        s_taken = Signal()            # the engine applies it now
        m.d.comb += self.svc_take.eq(s_taken | (sv & ~s_rw & ~s_fl))
        # a flush waits for the batches in flight: no new batch is issued meanwhile
        fl_wait = self.fl_wait
        fl_wait_q = Signal(self.qpn_bits)
        with m.If(sv & self.svc_take & ~s_fl & (sq == fl_wait_q)):
            m.d.sync += fl_wait.eq(0)       # that QP needs no flush any more
        m.d.comb += wk_done.payload.index.eq(cur)

        m.d.comb += [self.fill.payload.qpn.eq(cur), self.fill.payload.index.eq(cv.fi),
                     self.fill.payload.wqe.eq(wqe)]

        # ---------------- local checks on the fetched WQE (hw/rnic/wqe_check.py)
        m.submodules.wqe_check = chk = WqeCheck(cfg.mtu)
        # the lkey's entry: as it arrives in MR_RESP (an entry that could not be read is no
        # valid entry: LOC_PROT_ERR), else as kept
        in_mr = Signal()
        mr_now = Signal(formats.MR_ENTRY)
        m.d.comb += mr_now.eq(Mux(in_mr, Mux(self.mr.resp.payload.err, 0,
                                              self.mr.resp.payload.data), mr))
        m.d.comb += [chk.wqe.eq(wqe), chk.wqe_err.eq(wqe_err), chk.mr.eq(mr_now),
                     chk.pd.eq(ctx.pd)]
        op = wqe.opcode
        known, is_atomic, is_read, is_write = chk.op.known, chk.op.atomic, chk.op.read, chk.op.write
        single = chk.op.single       # READ / atomic: one packet, no payload
        loc_status = chk.status
        npkts = chk.npkts            # number of PSNs the message uses

        # the head message of a rewound QP: a READ requests only the responses still
        # missing, a WRITE/SEND starts at the first packet the responder does not have
        resume = Signal()
        m.d.comb += resume.eq((is_read | (known & ~is_read & ~is_atomic))
                              & (cv.fi == cv.ci) & (cv.rs_skip != 0))
        resume_ws = Signal()        # resume inside a WRITE/SEND: MIDDLE/LAST packets
        m.d.comb += resume_ws.eq(resume & ~is_read)
        rs_bytes = Signal(32)
        m.d.comb += rs_bytes.eq(cv.rs_skip << mtu_bits)
        last_psn = Signal(24)
        m.d.comb += last_psn.eq(cv.npsn + npkts - 1)

        # ---------------- request packet fields (hw/rnic/request_header.py)
        m.submodules.req_header = hdr = RequestHeader(cfg.mtu)
        skip_bytes = Signal(32)      # READ resumed after skip_bytes of response data
        seg_len, pkt_last, paylen = hdr.seg_len, hdr.last, hdr.paylen
        m.d.comb += [hdr.wqe.eq(wqe), hdr.op.eq(chk.op), hdr.ctx.eq(ctx), hdr.qpn.eq(cur),
                     hdr.node_id.eq(self.node_id), hdr.seg_left.eq(seg_left),
                     hdr.seg_first.eq(seg_first), hdr.seg_psn.eq(seg_psn),
                     hdr.skip_bytes.eq(skip_bytes)]
        msg_slot = Signal(mo_bits)     # tracker slot of the message being sent
        desc = self.desc
        m.d.comb += [desc.payload.meta.eq(hdr.meta), desc.payload.qpn.eq(cur),
                     desc.payload.slot.eq(msg_slot), self.res_len.eq(seg_len),
                     self.pay_req.payload.addr.eq(seg_addr),
                     self.pay_req.payload.len.eq(seg_len),
                     self.pay_req.payload.tag.eq(0)]

        # the flush asks the WQE cache for the head message's wr_id
        fl_lk = self.wqe_lk
        m.d.comb += [fl_lk.req.payload.qpn.eq(cur), fl_lk.req.payload.index.eq(ent.index),
                     fl_lk.req.payload.addr.eq(sq_slot_addr(cv.q_sqb, cv.q_sqlog, ent.index)),
                     fl_lk.req.payload.last.eq(1)]

        with m.FSM(name="send") as send_fsm:
            with m.State("IDLE"):
                db_q = self.db.payload.qpn[:self.qpn_bits]
                m.d.sync += flushing.eq(0)
                with m.If(act):
                    # the batch of cur is done: its QP may be fetched again
                    m.d.comb += done.eq(1)
                    m.d.comb += tx("inflight", cur, 0)
                    m.d.comb += [wk_done.valid.eq(1), wk_done.payload.index.eq(cur)]
                    m.d.sync += act.eq(0)

                def take_batch():
                    # the oldest fetched batch: sent if its QP may still issue, else dropped;
                    # a QP whose context could not be read goes to ERR (nothing was fetched)
                    m.d.comb += self.batch.ready.eq(1)
                    m.d.sync += [cur.eq(fq_q), flushing.eq(0), act.eq(1), batch_left.eq(fq_n),
                                 ctx.eq(fq_ctx)]
                    with m.If(fq_bad):
                        m.d.comb += tx("err", fq_q, 1)
                        m.next = "SET_ERR"
                    with m.Elif(e_fq):
                        m.next = "FETCH_WAIT"
                    with m.Else():
                        m.next = "DRAIN"

                ev_now = ev_any & ~(self.db.valid & db_early)
                # the oldest QP of the service queue: taken below, or queued again if it
                # still needs a rewind or a flush (not in a cycle that applies an event)
                with m.If(sv & ~ev_now & ~s_taken & (s_rw | s_fl)):
                    m.d.comb += [self.svc_take.eq(1), self.svc_again.eq(1)]
                    with m.If(s_fl & (n_fl != 0)):
                        m.d.sync += [fl_wait.eq(1), fl_wait_q.eq(sq)]

                with m.If(ev_now):
                    with m.If(~self.ev_valid):
                        pass            # the event reaches the queue's output next cycle
                    with m.Elif(evv.inflight):
                        # the event waits for the QP's batch in flight, which is dropped
                        # (not eligible: event pending); no doorbell is taken before it
                        with m.If(self.batch.valid):
                            take_batch()
                    # the event waits while the response FSM works on that QP (bounded)
                    with m.Elif(~(rx_busy & (rcur == ev_sel))):
                        m.d.comb += [ev_clear.eq(1), wk_tx.valid.eq(1),
                                     wk_tx.payload.index.eq(ev_sel)]
                        with m.If(evv.ev_reset):
                            m.d.comb += [ev_rst_rd.eq(1), self.forget.eq(1),
                                         self.forget_key.eq(ev_sel), self.bf_reset.eq(1),
                                         self.bf_reset_qpn.eq(ev_sel)]
                            for a in ("pi", "fi", "ci", "head", "tail", "lerr", "rwd_pend",
                                      "rtx_started", "rnr_wait", "retry_used", "rnr_used",
                                      "rs_skip"):
                                m.d.comb += tx(a, ev_sel, 0)
                            m.d.comb += (tx("npsn", ev_sel, evv.ev_psn)
                                         + tx("hi_psn", ev_sel, evv.ev_psn - 1))
                        with m.Elif((evv.ev_state == formats.QpState.RTS.value) & ~evv.rts):
                            # RTR -> RTS: the send queue starts at the given PSN
                            m.d.comb += (tx("npsn", ev_sel, evv.ev_psn)
                                         + tx("hi_psn", ev_sel, evv.ev_psn - 1))
                        m.d.comb += [
                            *tx("rts", ev_sel, evv.ev_state == formats.QpState.RTS.value),
                            *tx("err", ev_sel, evv.ev_state == formats.QpState.ERR.value),
                        ]
                with m.Elif(s_rw_go & ~(self.db.valid & db_early)):
                    m.d.comb += s_taken.eq(1)
                    m.d.sync += cur.eq(sq)
                    m.next = "REWIND"
                with m.Elif(self.db.valid):
                    # doorbell: look the QP up right now (index = db qpn)
                    m.d.comb += self.db.ready.eq(1)
                    posted = Signal(16)
                    fetched = Signal(16)
                    m.d.comb += [posted.eq(self.db.payload.pi - dv.ci),
                                 fetched.eq(dv.fi - dv.ci)]
                    with m.If((posted > (Const(1, 33) << dv.q_sqlog)) | (posted < fetched)):
                        m.d.comb += self.stat_db_reject.eq(1)
                        m.d.sync += cur.eq(db_q)
                        m.d.comb += tx("err", db_q, 1)
                        m.next = "SET_ERR"
                    with m.Else():
                        m.d.comb += tx("pi", db_q, self.db.payload.pi)
                        m.d.comb += [wk_tx.valid.eq(1), wk_tx.payload.index.eq(db_q)]
                with m.Elif(self.batch.valid):
                    take_batch()
                with m.Elif(s_fl_go):
                    # flushes fetch on their own: only when no batch is in flight
                    m.d.comb += s_taken.eq(1)
                    m.d.sync += [cur.eq(sq), flushing.eq(1), fl_wait.eq(0)]
                    m.next = "FL_CTX"

            with m.State("FL_CTX"):
                # the flushed QP's context (its send queue and send CQ): asked for, then
                # taken; one that cannot be read is asked for again (a host that fails ICM
                # reads for good has failed: docs/errors.md)
                qt = self.qpc
                m.d.comb += [qt.req.valid.eq(~fl_asked), qt.req.payload.index.eq(cur),
                             qt.resp.ready.eq(1)]
                with m.If(qt.req.valid & qt.req.ready):
                    m.d.sync += fl_asked.eq(1)
                with m.If(qt.resp.valid):
                    m.d.sync += [fl_asked.eq(0), ctx.eq(qt.resp.payload.data)]
                    with m.If(~qt.resp.payload.err):
                        m.next = "FLUSH"

            with m.State("REWIND"):
                # go-back-N (IBA 9.7.6.1.4): send again from the oldest outstanding message.
                # The WQEs are fetched again from the send queue (the host may not reuse a
                # slot before its completion) and keep their PSNs, so the responder sees the
                # packets it already executed as duplicates.
                with m.If(rx_busy & (rcur == cur)):
                    pass        # the response FSM works on this QP (bounded): wait
                with m.Elif(~nonempty):
                    # everything was acknowledged meanwhile
                    m.d.comb += tx("rwd_pend", cur, 0)
                    m.d.comb += [wk_tx.valid.eq(1), wk_tx.payload.index.eq(cur)]
                    m.next = "IDLE"
                with m.Elif(cv.rwd_cnt & (cv.retry_used == cv.q_retry)):
                    # retry_cnt exhausted: the oldest message fails, the QP goes to ERR
                    # (and is flushed)
                    with m.If(~rx_trk_we):
                        m.d.comb += [
                            tx_trk_we.eq(1), tx_trk_head.eq(1),
                            tx_trk_data.eq(ent),
                            tx_trk_data.status.eq(WcStatus.RETRY_EXC_ERR.value),
                            tx_retry_exc.eq(1),
                        ]
                        m.d.comb += tx("err", cur, 1) + tx("rwd_pend", cur, 0)
                        m.next = "SET_ERR"
                with m.Else():
                    m.d.comb += [tx_kick.eq(1), rw_rst_rd.eq(1), self.stat_retransmit.eq(1)]
                    # a READ: the response packets received; a WRITE/SEND: the packets a
                    # PSN sequence NAK showed the responder to have (go-back-N resends
                    # from the PSN in the NAK)
                    m.d.comb += tx("rs_skip", cur, Mux((ent.opcode <= WrOpcode.RDMA_READ.value)
                                                             & (ent.status == 0), ent.rcv, 0))
                    m.d.comb += [
                        *tx("fi", cur, cv.ci), *tx("tail", cur, cv.head),
                        *tx("npsn", cur, ent.first_psn), *tx("lerr", cur, 0),
                        *tx("rtx_started", cur, 1), *tx("rwd_pend", cur, 0),
                        *tx("retry_used", cur, cv.retry_used + cv.rwd_cnt),
                        wk_tx.valid.eq(1), wk_tx.payload.index.eq(cur),
                    ]
                    m.next = "IDLE"

            with m.State("FLUSH"):
                with m.If(~cv.err):
                    # the failed WQE is now the oldest: the QP goes to ERR, then flushes
                    m.d.comb += tx("err", cur, 1) + tx("lerr", cur, 0)
                    m.next = "SET_ERR"
                with m.Elif(nonempty & ent.noinfo):
                    m.d.sync += set_cqe(cqe_reg, cur, 0, ent.status, ent.opcode, 0)
                    m.d.comb += pop_head()
                    m.next = "CQE"
                with m.Elif(nonempty):
                    m.next = "FL_REQ"          # its wr_id: from the WQE cache
                with m.Else():
                    m.next = "FETCH"

            with m.State("FL_REQ"):
                m.d.comb += fl_lk.req.valid.eq(1)
                with m.If(fl_lk.req.ready):
                    m.next = "FL_RESP"

            with m.State("FL_RESP"):
                m.d.comb += fl_lk.resp.ready.eq(1)
                with m.If(fl_lk.resp.valid):
                    # a WQE that cannot be read again: its wr_id is unknown, 0
                    m.d.sync += set_cqe(cqe_reg, cur,
                                        Mux(fl_lk.resp.payload.err, 0,
                                            fl_lk.resp.payload.info.wr_id),
                                        Mux(ent.status != 0, ent.status,
                                            WcStatus.WR_FLUSH_ERR.value),
                                        ent.opcode, 0)
                    m.d.comb += pop_head()
                    m.next = "CQE"

            with m.State("FETCH"):
                m.d.comb += fetching.eq(1)
                with m.If(self.fetch_ready):
                    m.d.sync += batch_left.eq(n_batch)
                    m.next = "FETCH_WAIT"

            with m.State("FETCH_WAIT"):
                fw = self.wqe_in.payload
                # only a WQE with a local buffer to check needs its lkey's entry: asked for
                # as the WQE is taken (the WQE waits until the MR cache takes the request)
                need_mr = Signal()
                m.d.comb += [need_mr.eq(~(flushing | fw.err | (fw.wqe.length == 0))),
                             mr_lkey.eq(fw.wqe.lkey),
                             self.mr.req.valid.eq(self.wqe_in.valid & need_mr),
                             self.wqe_in.ready.eq(~need_mr | self.mr.req.ready)]
                with m.If(self.wqe_in.valid & self.wqe_in.ready):
                    m.d.comb += self.stat_wqe_fetch.eq(1)
                    m.d.sync += [wqe.eq(fw.wqe), wqe_err.eq(fw.err),
                                 batch_left.eq(batch_left - 1)]
                    with m.If(need_mr):
                        m.next = "MR_RESP"
                    with m.Else():
                        m.next = "CHECK"


            def next_wqe():
                # next WQE of the batch if the QP may still issue, else drop the rest
                with m.If(batch_left == 0):
                    m.next = "IDLE"
                with m.Elif(e_cur):
                    m.next = "FETCH_WAIT"
                with m.Else():
                    m.next = "DRAIN"

            with m.State("NEXT"):
                next_wqe()

            with m.State("DRAIN"):
                m.d.comb += [self.wqe_in.ready.eq(1)]
                with m.If(self.wqe_in.valid):
                    m.d.comb += self.stat_wqe_fetch.eq(1)
                    m.d.sync += batch_left.eq(batch_left - 1)
                    with m.If(batch_left == 1):
                        m.next = "IDLE"

            def check():
                """CHECK's work (also MR_RESP's, in the cycle the lkey's entry arrives): the
                WQE enters the tracker and the WQE cache, or fails, or waits for a port."""
                with m.If(flushing):
                    op3 = Mux(known & ~wqe_err, op[:3], 7)
                    m.d.sync += set_cqe(cqe_reg, cur, Mux(wqe_err, 0, wqe.wr_id),
                                        WcStatus.WR_FLUSH_ERR.value, op3, 0)
                    m.d.comb += tx("fi", cur, cv.fi + 1) + tx("ci", cur, cv.ci + 1)
                    m.next = "CQE"
                with m.Elif(wqe.flags[1] & ~wqe_err & (cv.rd_out != 0)):
                    # fence: wait for the earlier READ/atomic requests, fetch again later.
                    # The rest of the batch is dropped too, even if the fence clears in the
                    # meantime: its WQEs follow the dropped one (fi does not move past it).
                    m.d.comb += tx_fence_set.eq(1)
                    with m.If(batch_left == 0):
                        m.next = "IDLE"
                    with m.Else():
                        m.next = "DRAIN"
                with m.Elif(rx_trk_we):
                    pass        # the tracker write port is taken by the response FSM: retry
                with m.Elif(~self.fill.ready):
                    pass        # the WQE cache's fill queue is full: retry
                with m.Elif(loc_status != 0):
                    m.d.comb += [
                        tx_trk_we.eq(1),
                        # an unreadable WQE's wr_id is unknown: 0 (no copy in the WQE cache)
                        tx_trk_data.index.eq(cv.fi),
                        tx_trk_data.noinfo.eq(wqe_err),
                        self.fill.valid.eq(~wqe_err),
                        tx_trk_data.opcode.eq(Mux(known & ~wqe_err, op[:3], 7)),
                        tx_trk_data.status.eq(loc_status),
                        tx_trk_data.first_psn.eq(cv.npsn),
                        tx_trk_data.last_psn.eq(cv.npsn),
                    ]
                    m.d.comb += [*tx("tail", cur, cv.tail + 1),
                                 *tx("fi", cur, cv.fi + 1),
                                 *tx("lerr", cur, 1), *tx("lerr_idx", cur, cv.fi),
                                 *tx("q_sqb", cur, ctx.sq_base)]
                    m.d.comb += wqe_err_stat.eq(wqe_err)
                    m.next = "NEXT"
                with m.Else():
                    # the message enters the tracker before its first packet is queued
                    m.d.comb += [
                        tx_trk_we.eq(1),
                        tx_trk_data.index.eq(cv.fi),
                        self.fill.valid.eq(1),
                        tx_trk_data.first_psn.eq(cv.npsn),
                        tx_trk_data.last_psn.eq(last_psn),
                        tx_trk_data.opcode.eq(op[:3]),
                        tx_trk_data.signaled.eq(wqe.flags[0]),
                        tx_trk_data.status.eq(0),
                        tx_trk_data.rcv.eq(Mux(resume, cv.rs_skip, 0)),
                        tx_rd_inc.eq(single),
                        self.stat_write.eq(is_write),
                        self.stat_send.eq(known & ~is_write & ~single),
                        self.stat_read.eq(is_read),
                        self.stat_cas.eq(op == WrOpcode.ATOMIC_CMP_AND_SWP.value),
                        self.stat_faa.eq(op == WrOpcode.ATOMIC_FETCH_AND_ADD.value),
                    ]
                    # the first message into an idle QP starts its ACK timer
                    m.d.comb += tx_kick.eq(~nonempty)
                    with m.If(psn_le(cv.hi_psn, last_psn)):
                        m.d.comb += tx("hi_psn", cur, last_psn)
                    m.d.comb += [
                        *tx("tail", cur, cv.tail + 1),
                        *tx("fi", cur, cv.fi + 1),
                        *tx("npsn", cur, cv.npsn + npkts),
                        *tx("qcq", cur, ctx.send_cq),
                        *tx("q_sqb", cur, ctx.sq_base),
                        *tx("q_to", cur, ctx.timeout),
                        *tx("q_retry", cur, ctx.retry_cnt),
                        *tx("q_rnr", cur, ctx.rnr_retry),
                        *tx("rs_skip", cur, 0),
                    ]
                    m.d.sync += [
                        msg_slot.eq(cv.tail[:mo_bits]),
                        seg_left.eq(wqe.length - Mux(resume_ws, rs_bytes, 0)),
                        seg_addr.eq(wqe.local_addr + Mux(resume_ws, rs_bytes, 0)),
                        seg_psn.eq(cv.npsn + Mux(resume, cv.rs_skip, 0)),
                        skip_bytes.eq(Mux(resume & is_read, rs_bytes, 0)),
                        seg_first.eq(~resume_ws),
                        meta_done.eq(0),
                        req_done.eq(0),
                    ]
                    with m.If(single):
                        m.d.comb += tx("qlim", cur, rd_lim)
                    m.next = "SEND_META"

            with m.State("CHECK"):
                check()

            with m.State("MR_RESP"):
                m.d.comb += [self.mr.resp.ready.eq(1), in_mr.eq(1)]
                with m.If(self.mr.resp.valid):
                    # CHECK's work in this cycle, on the entry just arrived (kept in mr for
                    # a retry in CHECK)
                    m.d.sync += mr.eq(mr_now)
                    m.next = "CHECK"
                    check()

            with m.State("SEND_META"):
                # queue the header and request the payload (if the buffer has room for it);
                # may wait here on tx for as long as it takes: the response FSM goes on
                m.d.comb += [
                    desc.valid.eq(~meta_done),
                    self.pay_req.valid.eq(~req_done & (paylen != 0) & self.res_fits),
                    self.res_take.eq(self.pay_req.valid & self.pay_req.ready),
                ]
                mdone = meta_done | desc.ready
                rdone = req_done | self.res_take | (paylen == 0)
                m.d.sync += [meta_done.eq(mdone), req_done.eq(rdone)]
                with m.If(mdone & rdone):
                    m.d.sync += [meta_done.eq(0), req_done.eq(0)]
                    with m.If(pkt_last):
                        next_wqe()          # (what NEXT does, a cycle earlier)
                    with m.Else():          # the next packet of the message
                        m.d.sync += [
                            seg_left.eq(seg_left - cfg.mtu),
                            seg_addr.eq(seg_addr + cfg.mtu),
                            seg_psn.eq(seg_psn + 1),
                            seg_first.eq(0),
                        ]

            with m.State("SET_ERR"):
                m.d.comb += tx_err_v.eq(1)
                with m.If(tx_err_rdy):
                    m.next = "NEXT"

            with m.State("CQE"):
                m.d.comb += tx_cqe_v.eq(1)
                with m.If(tx_cqe_rdy):
                    m.next = "IDLE"

        m.d.comb += [self.active.eq(~send_fsm.ongoing("IDLE")),
                     self.wait_wqe.eq(send_fsm.ongoing("FETCH_WAIT") & ~self.wqe_in.valid),
                     self.wait_mr.eq(send_fsm.ongoing("MR_RESP") & ~self.mr.resp.valid),
                     self.wait_tx.eq(send_fsm.ongoing("SEND_META") & ~meta_done & ~desc.ready),
                     # the payload's read request not yet taken (no room, or the DMA port)
                     self.wait_pay.eq(send_fsm.ongoing("SEND_META") & ~req_done & (paylen != 0)
                                      & ~(self.pay_req.valid & self.pay_req.ready))]
        return m
