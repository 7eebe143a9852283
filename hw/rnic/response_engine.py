"""The requester's response engine: ACKs, NAKs, READ responses and atomic acknowledges.

Takes the packets of the requester's ``rx`` one at a time (IBA vol. 1 rel. 1.4, 9.7.5.1,
requester's response handling) and compares each with the oldest outstanding message of
its QP (the head of the QP's tracker, hw/rnic/tracker.py; the comparison is
hw/rnic/response_check.py). It writes READ response data and atomic results to host memory
(``wr``), completes the acknowledged messages in order (``cqe``, through the requester's
write gate) and asks for the QP's ERR state on a fatal NAK or a bad response (``err``). A
PSN sequence NAK, a lost READ response packet or an ACK that implies one asks for a rewind
(9.7.6.1.4, go-back-N; applied by the send engine), an RNR NAK starts the RNR wait
(9.7.5.2.8). A payload the host failed to read for a request packet (``perr``, from the
packet emitter) fails its message with LOC_PROT_ERR.

The per-QP state is the requester's (memories indexed by QP, hw/rnic/requester.py): the engine
names the QP it works on (``qpn``), sees that QP's fields in ``view`` in the same cycle and
says what happens to them in ``ev`` (pop the head message, progress, ERR, rewind, RNR wait,
a READ / atomic credit returned); the requester applies those writes. The head message's
WQE fields (where the data goes, wr_id, length) come from the WQE cache (``info``, request /
response); the response that completes the message frees the cache entry.

Deadlock freedom (hw/rnic/requester.py, rule 1): the engine never waits on the transmit path
or the send engine, only on ``wr`` (the host always drains writes), ``cqe`` and ``err``.

States: R_IDLE (take a response, or a payload error), R_LOOK / R_INFO (the head message's
WQE fields), R_ACK (classify and act; a READ response's first beat goes to host memory in
the same cycle), R_DATA (the rest of the READ data), R_ATOMIC (the
original value), R_DONE (an empty READ response completes; R_DATA and R_ATOMIC complete
their message with its last write), R_CQE (and, as the CQE leaves, take the next response),
R_ERR, R_PERR, R_DROP / R_BAD_DROP (the payload of a dropped response).

Parameters: ``cfg`` (:class:`~hw.config.NicConfig`), ``qpn_bits`` in [1, 16].

Ports: ``rx: In(PacketOut(W))``; ``rx_ok: In(1)`` (the QP of the response on ``rx.meta``
takes responses: it exists, is in RTS and not in ERR, no reset or ERR event and no flush
waits); ``perr: In(stream of perr_layout)``; ``qpn: Out(qpn_bits)``; ``busy: Out(1)`` (the
engine works on QP ``qpn``: the send engine keeps off it); ``active: Out(1)`` (not idle:
occupancy); ``view: In(resp_view(mo_bits))``; ``ev: Out(RESP_EV)``; ``rnr_code: Out(5)``;
``trk_addr: Out(qpn_bits + mo_bits)`` / ``trk_data: In(TRACKER_ENTRY)`` (the tracker slot
read, and written when ``trk_we``: ``trk_wdata``); ``info: Out(WqeLookup(qpn_bits))``;
``wr: Out(stream of dma_wr_layout)``; ``cqe: Out(stream {item: GATE_ITEM, key})``;
``err: Out(stream {qpn})``; counters ``stat_resp_drop``, ``stat_nak_rx``, ``stat_rnr_rx``,
``stat_retry_exc``, ``stat_pay_err``, ``stat_reread_err`` (pulses).
"""

from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from .. import formats, regmap
from ..config import NicConfig
from ..ctx.wqe_cache import WQE_INFO, WqeLookup
from ..formats import WcStatus, WrOpcode
from ..interfaces import PacketOut, dma_wr_layout
from ..lib.checks import check_int
from .packet_emitter import perr_layout
from .response_check import ResponseCheck
from .tracker import GATE_ITEM, TRACKER_ENTRY, psn_le, set_cqe, sq_slot_addr

__all__ = ["ResponseEngine", "RESP_EV", "resp_view"]

#: What happens to the engine's QP this cycle (the requester writes its per-QP state).
RESP_EV = data.StructLayout({
    "pop": 1,             # the head message is completed: head + 1, ci + 1 (wakes the QP)
    "progress": 1,        # forward progress: retry counters cleared, ACK timer restarted
    "set_err": 1,         # the QP goes to ERR
    "rewind": 1,          # a rewind is requested ...
    "rewind_counts": 1,   # ... and counts against retry_cnt
    "retry_clear": 1,     # retry_cnt's count cleared (a NAK inside a WRITE / SEND)
    "rnr": 1,             # an RNR wait starts (rnr_code), rnr_retry's count + 1
    "rd_dec": 1,          # a READ / atomic completed: its credit is returned
})


def resp_view(mo_bits):
    """The per-QP fields the engine reads at its QP."""
    return data.StructLayout({
        "head": mo_bits + 1, "count": mo_bits + 1,   # tracker head and messages in it
        "hi_psn": 24,          # the highest PSN the QP has sent
        "rtx_started": 1,      # rewound, no progress since: ignore further NAKs
        "rnr_wait": 1,
        "rnr_used": 3, "rnr_retry": 3,
        "send_cq": regmap.QP_CTX["send_cq"].shape,
        "sq_base": 64, "sq_log": 5,
        "rts": 1, "err": 1,
        "kills": 1,            # a reset or ERR event waits: nothing left to complete
    })


class ResponseEngine(wiring.Component):
    def __init__(self, cfg, qpn_bits):
        if not isinstance(cfg, NicConfig):
            raise ValueError(f"cfg must be a NicConfig, not {type(cfg).__name__}")
        check_int("qpn_bits", qpn_bits, 1, 16)
        self.cfg = cfg
        self.qpn_bits = qpn_bits
        self.mo_bits = exact_log2(cfg.max_outstanding)
        W = cfg.data_bytes
        super().__init__({
            "rx": In(PacketOut(W)),
            "rx_ok": In(1),
            "perr": In(stream.Signature(perr_layout(cfg.n_qps, cfg.max_outstanding))),
            "qpn": Out(qpn_bits),
            "busy": Out(1),
            "active": Out(1),
            "view": In(resp_view(self.mo_bits)),
            "ev": Out(RESP_EV),
            "rnr_code": Out(5),
            "trk_addr": Out(qpn_bits + self.mo_bits),
            "trk_data": In(TRACKER_ENTRY),
            "trk_we": Out(1),
            "trk_wdata": Out(TRACKER_ENTRY),
            "info": Out(WqeLookup(qpn_bits)),
            "wr": Out(stream.Signature(dma_wr_layout(W))),
            "cqe": Out(stream.Signature(data.StructLayout(
                {"item": GATE_ITEM, "key": qpn_bits}))),
            "err": Out(stream.Signature(data.StructLayout({"qpn": 24}))),
            **{name: Out(1) for name in ("stat_resp_drop", "stat_nak_rx", "stat_rnr_rx",
                                         "stat_retry_exc", "stat_pay_err",
                                         "stat_reread_err")},
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        mo_bits = self.mo_bits
        v, ev, wr = self.view, self.ev, self.wr
        rcur = self.qpn
        rxm = Signal(formats.PKT_META)
        rcqe_reg = Signal(formats.CQE)
        rcqe_ret_ack = Signal()      # after the CQE go back to R_LOOK (else R_IDLE)
        rcqe_silent = Signal()       # an unsignaled success: announced only if it failed
        rx_addr = Signal(64)
        rx_complete = Signal()       # this response completes the head message
        rinfo = Signal(WQE_INFO)     # the head message's WQE fields (from the WQE cache)
        rinfo_ok = Signal()          # rinfo holds the fields of WQE rinfo_idx of rcur
        rinfo_idx = Signal(16)
        in_info = Signal()           # R_INFO: the WQE fields arrive on the lookup's answer
        info = Signal(WQE_INFO)      # the head message's WQE fields as R_ACK's work sees them
        m.d.comb += info.eq(Mux(in_info, self.info.resp.payload.info, rinfo))

        # the tracker slot: a payload error names its message's (perr.slot), else the head
        in_perr = Signal()
        perr = self.perr.payload
        r_slot = Signal(mo_bits)
        m.d.comb += [r_slot.eq(Mux(in_perr, perr.slot, v.head[:mo_bits])),
                     self.trk_addr.eq(Cat(r_slot, rcur))]
        rent = self.trk_data
        rnonempty = v.count != 0

        m.submodules.check = chk = ResponseCheck(cfg.mtu)
        m.d.comb += [chk.rxm.eq(rxm), chk.head.eq(rent), chk.nonempty.eq(rnonempty),
                     chk.length.eq(info.length), chk.hi_psn.eq(v.hi_psn)]
        rc = chk.o
        syn = rxm.syndrome
        rx_addr_now = Signal(64)     # where a READ response's data go
        m.d.comb += rx_addr_now.eq(info.local_addr + rc.rx_off)

        # the head message's WQE fields; the lookup that completes the message frees them
        lk = self.info
        m.d.comb += [lk.req.payload.qpn.eq(rcur), lk.req.payload.index.eq(rent.index),
                     lk.req.payload.addr.eq(sq_slot_addr(v.sq_base, v.sq_log, rent.index)),
                     lk.req.payload.last.eq(rc.last_use)]

        cq = self.cqe.payload
        m.d.comb += [cq.item.req.cqn.eq(v.send_cq), cq.item.req.cqe.eq(rcqe_reg),
                     cq.item.silent.eq(rcqe_silent), cq.key.eq(rcur),
                     self.err.payload.qpn.eq(rcur), self.rnr_code.eq(syn[:5])]

        def fail(status):
            """The head message (or the one a payload error names) fails with ``status``
            and the QP goes to ERR."""
            return [self.trk_we.eq(1), self.trk_wdata.eq(rent), self.trk_wdata.status.eq(status),
                    ev.set_err.eq(1)]

        def rewind(counts):
            return [ev.rewind.eq(1), ev.rewind_counts.eq(counts)]

        def take():
            """Take a payload error or the next response (R_IDLE's work; R_CQE does it too as
            its CQE leaves, so that a READ costs no idle cycle between two responses)."""
            m.d.comb += self.rx.meta.ready.eq(~self.perr.valid)
            m.d.sync += rinfo_ok.eq(0)
            with m.If(self.perr.valid):
                m.d.sync += rcur.eq(perr.qpn)
                m.next = "R_PERR"
            with m.Elif(self.rx.meta.valid):
                m.d.sync += [rxm.eq(self.rx.meta.payload),
                             rcur.eq(self.rx.meta.payload.dest_qpn[:self.qpn_bits])]
                with m.If(self.rx_ok):
                    m.next = "R_LOOK"
                with m.Else():
                    m.d.comb += self.stat_resp_drop.eq(1)
                    with m.If(self.rx.meta.payload.paylen != 0):
                        m.next = "R_DROP"
                    with m.Else():
                        m.next = "R_IDLE"
            with m.Else():
                m.next = "R_IDLE"

        def write_beat(addr):
            """Offer the response's next payload beat to host memory at ``addr`` (the
            packet's place); true in the cycle its last beat is taken."""
            beat = self.rx.payload
            m.d.comb += [
                wr.valid.eq(beat.valid),
                wr.payload.addr.eq(addr),
                wr.payload.len.eq(rxm.paylen),
                wr.payload.tag.eq(rcur),
                wr.payload.data.eq(beat.payload.data),
                wr.payload.nbytes.eq(beat.payload.nbytes),
                wr.payload.last.eq(beat.payload.last),
                beat.ready.eq(wr.ready),
            ]
            return beat.valid & wr.ready & beat.payload.last

        def done(complete=rx_complete):
            """The response's data are written: a READ / atomic that completes is popped, its
            credit given back and its CQE (silent if unsignaled: it still passes the write
            gate, so that a failed data write completes it in error) goes to R_CQE."""
            with m.If(complete):
                m.d.comb += [ev.pop.eq(1), ev.progress.eq(1), ev.rd_dec.eq(1)]
                m.d.sync += set_cqe(rcqe_reg, rcur, info.wr_id, 0, rent.opcode,
                                    Mux(rent.opcode == WrOpcode.RDMA_READ.value,
                                        info.length, 8))
                m.d.sync += [rcqe_ret_ack.eq(0), rcqe_silent.eq(~rent.signaled)]
                m.next = "R_CQE"
            with m.Else():
                m.next = "R_IDLE"

        def act():
            """R_ACK's work (also R_INFO's, in the cycle the WQE fields arrive): classify
            the response against the head message and act on it."""
            with m.If(rc.ack_ghost):
                m.d.comb += self.stat_resp_drop.eq(1)
                m.next = "R_IDLE"
            with m.Elif(rc.head_ws & rc.ack_covers):
                # implicit or explicit acknowledgement of a WRITE/SEND
                m.d.comb += [ev.pop.eq(1), ev.progress.eq(1)]
                # an ACK of exactly this message's last PSN covers no later one: the
                # next response is taken at once (else R_LOOK: the next message, if the
                # ACK covers it)
                more = rxm.psn != rent.last_psn
                with m.If(rent.signaled):
                    m.d.sync += set_cqe(rcqe_reg, rcur, info.wr_id, 0, rent.opcode,
                                        info.length)
                    m.d.sync += [rcqe_ret_ack.eq(more), rcqe_silent.eq(0)]
                    m.next = "R_CQE"
                with m.Elif(more):
                    m.next = "R_LOOK"
                with m.Else():
                    take()
            with m.Elif(rc.is_seq_nak):
                # PSN sequence error: go back to the oldest outstanding message (once
                # per retransmission: later NAKs of the same gap are ignored)
                m.d.comb += self.stat_nak_rx.eq(1)
                # A NAK that shows the responder further inside the head WRITE/SEND
                # than known is taken even during a retransmission: it is about the
                # retransmitted packets, not a second NAK of the gap already rewound.
                with m.If(rnonempty & (~v.rtx_started | rc.nak_more) & ~v.rnr_wait):
                    # the responder got part of a WRITE/SEND (it expects a PSN inside
                    # the message): progress, not counted against retry_cnt
                    inside = rc.head_ws & (rxm.psn != rent.first_psn)
                    m.d.comb += [*rewind(~inside), ev.retry_clear.eq(inside)]
                    with m.If(rc.nak_more):
                        # the rewind resends from the NAK's PSN
                        m.d.comb += [self.trk_we.eq(1), self.trk_wdata.eq(rent),
                                     self.trk_wdata.rcv.eq(rc.nak_off)]
                m.next = "R_IDLE"
            with m.Elif(rc.is_rnr & (~rnonempty | v.rnr_wait)):
                m.d.comb += [self.stat_nak_rx.eq(1), self.stat_rnr_rx.eq(1)]
                m.next = "R_IDLE"
            with m.Elif(rc.is_rnr & ((v.rnr_used != v.rnr_retry) | (v.rnr_retry == 7))):
                # RNR NAK (IBA 9.7.5.2.8): wait the coded time, then retransmit
                m.d.comb += [self.stat_nak_rx.eq(1), self.stat_rnr_rx.eq(1), ev.rnr.eq(1)]
                m.next = "R_IDLE"
            with m.Elif(rc.is_nak):
                # a fatal NAK, or an RNR NAK with rnr_retry exhausted
                m.d.comb += [self.stat_nak_rx.eq(1), self.stat_rnr_rx.eq(rc.is_rnr),
                             self.stat_retry_exc.eq(rc.is_rnr & rnonempty)]
                with m.If(rnonempty):
                    m.d.comb += fail(rc.nak_status)
                    m.next = "R_ERR"
                with m.Else():
                    m.next = "R_IDLE"
            with m.Elif(rc.implied_nak):
                with m.If(~v.rtx_started & ~v.rnr_wait):
                    m.d.comb += rewind(1)
                m.next = "R_IDLE"
            with m.Elif(rc.is_ack):
                m.next = "R_IDLE"
            with m.Elif(rc.bad_resp):
                m.d.comb += [self.stat_resp_drop.eq(1), *fail(WcStatus.BAD_RESP_ERR.value)]
                with m.If(rxm.paylen != 0):
                    m.next = "R_BAD_DROP"
                with m.Else():
                    m.next = "R_ERR"
            with m.Elif(rc.is_rresp & rc.rresp_match):
                # count the packet in the head entry (the next one must follow it)
                m.d.comb += [self.trk_we.eq(1), self.trk_wdata.eq(rent),
                             self.trk_wdata.rcv.eq(rent.rcv + 1), ev.progress.eq(1)]
                m.d.sync += [rx_addr.eq(rx_addr_now), rx_complete.eq(rc.rresp_end)]
                with m.If(rxm.paylen != 0):
                    # the first beat goes to host memory in this cycle if it is there
                    # (a one-beat response costs no R_DATA cycle)
                    with m.If(write_beat(rx_addr_now)):
                        done(rc.rresp_end)
                    with m.Else():
                        m.next = "R_DATA"
                with m.Else():
                    m.next = "R_DONE"
            with m.Elif(rc.is_rresp & rc.rresp_gap):
                # a READ response packet was lost: retransmit without waiting for the
                # timeout
                m.d.comb += self.stat_resp_drop.eq(1)
                with m.If(~v.rtx_started & ~v.rnr_wait):
                    m.d.comb += rewind(1)
                with m.If(rxm.paylen != 0):
                    m.next = "R_DROP"
                with m.Else():
                    m.next = "R_IDLE"
            with m.Elif(rc.is_aack & rc.aack_match):
                m.d.sync += [rx_addr.eq(info.local_addr), rx_complete.eq(1)]
                m.next = "R_ATOMIC"
            with m.Elif(rxm.paylen != 0):
                m.d.comb += self.stat_resp_drop.eq(1)
                m.next = "R_DROP"
            with m.Else():
                m.d.comb += self.stat_resp_drop.eq(~rc.is_ack)
                m.next = "R_IDLE"

        with m.FSM(name="resp") as fsm:
            with m.State("R_IDLE"):
                take()

            with m.State("R_LOOK"):
                m.d.comb += self.busy.eq(1)
                with m.If(rc.need_info):
                    m.d.comb += lk.req.valid.eq(1)
                    with m.If(lk.req.ready):
                        m.d.sync += rinfo_idx.eq(rent.index)
                        m.next = "R_INFO"
                with m.Else():
                    m.next = "R_ACK"

            with m.State("R_INFO"):
                m.d.comb += [self.busy.eq(1), lk.resp.ready.eq(1), in_info.eq(1)]
                with m.If(lk.resp.valid):
                    m.d.sync += rinfo.eq(lk.resp.payload.info)
                    with m.If(lk.resp.payload.err):
                        # the WQE could not be read again: the WR ends in LOC_QP_OP_ERR (its
                        # wr_id unknown), the QP goes to ERR; the response is dropped
                        m.d.comb += fail(WcStatus.LOC_QP_OP_ERR.value)
                        m.d.comb += [self.trk_wdata.noinfo.eq(1), self.stat_reread_err.eq(1)]
                        with m.If(rxm.paylen != 0):
                            m.next = "R_BAD_DROP"
                        with m.Else():
                            m.next = "R_ERR"
                    with m.Else():
                        # R_ACK's work in this cycle, on the fields just arrived
                        m.d.sync += rinfo_ok.eq(1)
                        act()

            with m.State("R_ACK"):
                m.d.comb += self.busy.eq(1)
                with m.If(rc.need_info & ~(rinfo_ok & (rinfo_idx == rent.index))):
                    # the head changed since R_LOOK (the send engine put a message into the
                    # empty queue, e.g. one sent again after a rewind): look its WQE up
                    m.next = "R_LOOK"
                with m.Else():
                    act()

            with m.State("R_DATA"):
                m.d.comb += self.busy.eq(1)
                with m.If(write_beat(rx_addr)):
                    done()

            with m.State("R_ATOMIC"):
                m.d.comb += [
                    self.busy.eq(1),
                    wr.valid.eq(1),
                    wr.payload.addr.eq(rx_addr),
                    wr.payload.len.eq(8),
                    wr.payload.tag.eq(rcur),
                    wr.payload.data.eq(rxm.orig),
                    wr.payload.nbytes.eq(8),
                    wr.payload.last.eq(1),
                ]
                with m.If(wr.ready):
                    done()

            with m.State("R_DONE"):
                m.d.comb += self.busy.eq(1)
                done()

            with m.State("R_PERR"):
                # the host failed a packet's payload read: its message (if still there, in
                # this incarnation of the QP) fails with LOC_PROT_ERR, the QP goes to ERR
                m.d.comb += [self.busy.eq(1), in_perr.eq(1), self.perr.ready.eq(1)]
                there = ((perr.slot - v.head[:mo_bits])[:mo_bits] < v.count)
                mine = (v.rts & ~v.err & ~v.kills & there & (rent.status == 0)
                        & psn_le(rent.first_psn, perr.psn) & psn_le(perr.psn, rent.last_psn))
                with m.If(mine):
                    # the WR ends here (counted once, whatever packets of it failed)
                    m.d.comb += [*fail(WcStatus.LOC_PROT_ERR.value), self.stat_pay_err.eq(1)]
                    m.next = "R_ERR"
                with m.Else():
                    m.next = "R_IDLE"

            with m.State("R_DROP"):
                # the payload of a dropped response (no QP state is touched: not busy)
                m.d.comb += self.rx.payload.ready.eq(1)
                with m.If(self.rx.payload.valid & self.rx.payload.payload.last):
                    m.next = "R_IDLE"

            with m.State("R_BAD_DROP"):
                # the payload of a bad response, then the QP's error
                m.d.comb += [self.busy.eq(1), self.rx.payload.ready.eq(1)]
                with m.If(self.rx.payload.valid & self.rx.payload.payload.last):
                    m.next = "R_ERR"

            with m.State("R_CQE"):
                m.d.comb += [self.busy.eq(1), self.cqe.valid.eq(1)]
                with m.If(self.cqe.ready):
                    with m.If(rcqe_ret_ack):
                        m.next = "R_LOOK"
                    with m.Else():
                        take()

            with m.State("R_ERR"):
                m.d.comb += [self.busy.eq(1), self.err.valid.eq(1)]
                with m.If(self.err.ready):
                    m.next = "R_IDLE"

        m.d.comb += self.active.eq(~fsm.ongoing("R_IDLE"))
        return m
