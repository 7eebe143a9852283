"""Responder side of a Reliable Connection queue pair (RNIC receive path).

Models the RC responder of the InfiniBand Architecture Specification vol. 1 release 1.4:

* 9.7 "Reliable service": responder packet checks and execution (packet sequence number,
  opcode sequence, payload length, RETH / AtomicETH validation against the memory-region
  table and the QP's access rights);
* 9.4 operations: SEND (consumes a receive WQE), RDMA WRITE (with immediate: consumes a
  receive WQE without placing data in it), RDMA READ (response packets of at most one MTU),
  COMPARE_SWAP / FETCH_ADD (executed by :class:`~hw.rnic.atomic.AtomicUnit`);
* 9.7.5 responder ACK / NAK generation with the AETH (syndromes of :class:`~hw.formats.AethSyndrome`;
  the MSN counts the completed messages);
* chapter 10 QP states: requests are only executed in RTR or RTS; fatal errors move the QP
  to ERR (through ``set_err``).

The responder takes **one request packet at a time** (a sequential FSM): the packet, its
QP context and its rkey's MR entry come from :class:`~hw.rnic.request_lookup.RequestLookup`
(looked up ``cfg.rsp_lookahead`` packets ahead), the QP's responder state row (expected
PSN, MSN, receive consumer index, the message in progress: a ``lib.memory`` row of
:class:`~hw.rnic.responder_state.ResponderState`, which also applies the QP events and
receive doorbells) is read as the packet is taken, :class:`~hw.rnic.request_check.RequestCheck` decides, the FSM
executes (payload to ``wr``, receive WQEs from :class:`~hw.ctx.rq_prefetch.RqPrefetch`,
atomics handed to :class:`~hw.rnic.atomic.AtomicUnit` without waiting, duplicates of atomics
answered from :class:`~hw.rnic.replay_cache.ReplayCache`), then issues the CQE, the QP-error
request and the response in that order and writes the state row back. Responses are never
sent by the FSM: it queues one descriptor in :class:`~hw.rnic.response_queue.ResponseQueue`
(its READ prefetcher and transmitter do the rest) through
:class:`~hw.rnic.responder_gate.ResponderGate` (nothing announces data the host has not
answered for). The request path never waits for ``tx`` (deadlock freedom).

docs/responder.md has the whole behaviour: the FSM's states and their cycles, the receive-WQE
prefetch, atomics and the replay window, the write gate, host-interface errors, the rules
that keep the two nodes free of deadlock, the ordering consequence (IBA 9.5), the checks in
order with their NAKs, ACK coalescing and the QP events.

Ports
-----
``rx``: ``In(PacketOut(W))``, ``tx``: ``Out(PacketOut(W))``, ``node_id``: ``In(8)``,
``qp``: ``Out(Lookup(log2(n_qps), QP_LOOKUP))`` (the QP's state),
``qpc``, ``rkey``: ``Out(CtxLookup(...)).array(cfg.rsp_lookahead)`` (request / response: the
QP-context and MR caches, asked by the request lookahead for each packet ahead),
``mr``: ``Out(CtxLookup(log2(n_mrs), MR_ENTRY))`` (a receive WQE's lkey, in WQE_MR_REQ /
WQE_MR_RESP),
``qp_event``: ``In(QpEvent())``, ``rq_db``: ``In(DoorbellEvent())``, ``set_err``: ``Out(QpErrRequest())``,
``rd_data``, ``rd_wqe``, ``at_rd``: ``Out(DmaReadPort(W))``, ``wr``, ``at_wr``:
``Out(DmaWritePort(W))``, ``cqe``: ``Out(CqeRequest())``,
``stat_nak``: ``Out(1)`` (a NAK leaves on ``tx``), ``stat_drop``: ``Out(1)``,
``stat_resp_full``: ``Out(1)`` (a response waits for room in the response queue this cycle),
``stat_dma_err``: ``Out(range(4))`` (host-interface errors turned into NAKs this cycle),
``stat_busy``: ``Out(1)`` (the state machine is not in IDLE: its occupancy; one request
packet at a time, so busy cycles near the elapsed cycles make the responder the bound),
``stat_q_resp``: the response queue's descriptors not yet sent (its occupancy).

Parameter ``read_buffers`` (power of two in [2, 16], default ``cfg.read_buffers``): size of
the READ payload ring in MTUs. The replay cache holds ``cfg.replay_slots`` results per QP.
"""

from amaranth.hdl import Module, Signal, Const, Mux
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from .atomic import AtomicUnit, ATOMIC_CAS, ATOMIC_FAA
from ..config import NicConfig
from ..formats import (BthOpcode as Op, AethSyndrome as Syn, QpState, WcOpcode, WcStatus,
                      PKT_META, RECV_WQE, CQE_FLAG_IMM, MR_ENTRY)
from ..lib.arbiter import StreamArbiter
from ..interfaces import (PacketOut, Lookup, CtxLookup, QP_LOOKUP, QpEvent, DoorbellEvent, QpErrRequest,
                         DmaReadPort, DmaWritePort, CqeRequest)
from ..ctx.rq_prefetch import RQ_DMA_TAG
from .response_queue import (ResponseQueue, RESP_ENTRY, READ_DMA_TAG, RESP_ACK,
                                   RESP_READ, RESP_ATOMIC, RESP_ATOMIC_PEND)
from ..lib.checks import check_pow2
from .replay_cache import ReplayCache
from .responder_state import ResponderState
from .request_lookup import RequestLookup
from .responder_gate import ITEM_CQE, ITEM_RESP, ResponderGate
from .request_check import MSG_NONE, MSG_SEND, MSG_WRITE, RSP_STATE, RequestCheck
from ..regmap import QP_CTX, mkey_index  # noqa: F401  (mkey_index: the MR slot computed below is the same function)

__all__ = ["Responder", "RSP_STATE", "RESP_ENTRY", "RNR_TIMER", "UDP_SPORT_BASE",
           "MSG_NONE", "MSG_SEND", "MSG_WRITE", "WQE_DMA_TAG", "READ_DMA_TAG",
           "RESP_ACK", "RESP_READ", "RESP_ATOMIC", "RESP_ATOMIC_PEND"]

#: Default RNR NAK timer code (IBA table 45: 0x0E = 1.28 ms); the responder sends the
#: min_rnr_timer of the QP context
RNR_TIMER = 0x0E
#: UDP source port of responses: 0xC000 | (local QPN & 0x3FFF)
UDP_SPORT_BASE = 0xC000
WQE_DMA_TAG = RQ_DMA_TAG



#: payload beats the request lookahead buffers per packet it looks ahead (an 8-byte WRITE is
#: one beat; a larger payload streams through)
RSP_LOOKAHEAD_BEATS_PER_PACKET = 4

class Responder(wiring.Component):
    """RC responder: executes request packets, answers ACK/NAK/READ/atomic responses."""

    def __init__(self, cfg, read_buffers=None):
        if not isinstance(cfg, NicConfig):
            raise ValueError(f"cfg must be a hw.config.NicConfig, not {cfg!r}")
        if read_buffers is None:
            read_buffers = cfg.read_buffers
        check_pow2("read_buffers", read_buffers, 2, 16)
        self.cfg = cfg
        self.read_buffers = read_buffers
        W = cfg.data_bytes
        self.qpn_bits = exact_log2(cfg.n_qps)
        self.mr_bits = exact_log2(cfg.n_mrs)
        super().__init__({
            "rx": In(PacketOut(W)),
            "tx": Out(PacketOut(W)),
            "node_id": In(8),
            "qp": Out(Lookup(self.qpn_bits, QP_LOOKUP)),
            "qpc": Out(CtxLookup(self.qpn_bits, QP_CTX)).array(cfg.rsp_lookahead),
            "rkey": Out(CtxLookup(max(1, self.mr_bits), MR_ENTRY)).array(cfg.rsp_lookahead),
            "mr": Out(CtxLookup(max(1, self.mr_bits), MR_ENTRY)),
            "qp_event": In(QpEvent()),
            "rq_db": In(DoorbellEvent()),
            "set_err": Out(QpErrRequest()),
            "rd_data": Out(DmaReadPort(W)),
            "rd_wqe": Out(DmaReadPort(W)),
            "wr": Out(DmaWritePort(W)),
            "at_rd": Out(DmaReadPort(W)),
            "at_wr": Out(DmaWritePort(W)),
            "cqe": Out(CqeRequest()),
            "stat_nak": Out(1),
            "stat_drop": Out(1),
            "stat_resp_full": Out(1),
            "stat_dup": Out(1),
            "stat_seq_drop": Out(1),
            "stat_replay": Out(1),
            "stat_coalesce": Out(1),
            "stat_q_resp": Out(range(cfg.n_qps * cfg.max_outstanding + 1)),
            "stat_dma_err": Out(range(4)),
            "stat_busy": Out(1),
            "stat_rq_prefetch": Out(1),
            "stat_rq_demand": Out(1),
            "stat_rq_wait": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        W = cfg.data_bytes
        mtu = cfg.mtu
        qb = self.qpn_bits

        # the atomic unit: several atomics in flight, serialised per address; each carries
        # its QP, PSN and replay slot, and its answer lands in the replay cache and in the
        # results FIFO that the transmitter takes in order (one per RESP_ATOMIC_PEND)
        AT_CTX = data.StructLayout({"qpn": max(1, qb), "rp": 4, "psn": 24})
        m.submodules.atomic = atomic = AtomicUnit(W, inflight=cfg.atomic_inflight,
                                                  ctx_bits=AT_CTX.size, owner_bits=max(1, qb))
        # the ordered response queue, its READ prefetcher and transmitter
        # (hw/rnic/response_queue.py); it also queues the atomic unit's results
        m.submodules.resp = rq = ResponseQueue(cfg, self.read_buffers)
        at_depth = rq.at_depth
        at_out = Signal(range(at_depth + 1))   # dispatched, their response not yet sent
        at_disp = Signal()                     # the FSM dispatches an atomic
        at_sent = rq.at_sent                   # the transmitter sends a RESP_ATOMIC_PEND
        m.d.sync += at_out.eq(at_out + at_disp - at_sent)

        # ---- per-QP state rows, receive producer indices and the receive-WQE prefetch,
        # with the QP events and receive doorbells that write them (hw/rnic/responder_state.py)
        m.submodules.qp_state = qst = ResponderState(cfg)
        wiring.connect(m, wiring.flipped(self.qp_event), qst.qp_event)
        wiring.connect(m, wiring.flipped(self.rq_db), qst.rq_db)
        wiring.connect(m, qst.dma, wiring.flipped(self.rd_wqe))
        m.d.comb += [self.stat_rq_prefetch.eq(qst.stat_prefetch),
                     self.stat_rq_demand.eq(qst.stat_demand),
                     self.stat_rq_wait.eq(qst.stat_wait)]
        # atomic replay cache: the results of each QP's last atomics (hw/rnic/replay_cache.py)
        m.submodules.replay = replay = ReplayCache(max(1, qb), cfg.replay_slots)
        at_o = atomic.o.payload
        at_ctx = AT_CTX(at_o.ctx)
        m.d.comb += [
            atomic.o.ready.eq(rq.at_result.ready),
            rq.at_result.valid.eq(atomic.o.valid),
            rq.at_result.payload.orig.eq(at_o.orig),
            rq.at_result.payload.err.eq(at_o.err),
            # remember the result for a duplicate of this request (not after a failure)
            replay.put_qpn.eq(at_ctx.qpn),
            replay.put_slot.eq(at_ctx.rp),
            replay.put_psn.eq(at_ctx.psn),
            replay.put_orig.eq(at_o.orig),
            replay.put_en.eq(atomic.o.valid & rq.at_result.ready & ~at_o.err),
        ]
        # ---- registers ----------------------------------------------------------------
        pk = Signal(PKT_META)          # the request packet being processed
        s = Signal(RSP_STATE)          # working copy of its QP's state row
        pi_r = Signal(16)
        killed = Signal()              # a qp_event reset this QP meanwhile: no write-back
        pay_pending = Signal()         # payload beats not yet consumed
        f_cqe = Signal()
        f_err = Signal()
        f_ack = Signal()
        f_wb = Signal()
        ack_syn = Signal(8)
        ack_psn = Signal(24)
        ack_msn = Signal(24)
        c_wr_id = Signal(64)
        c_status = Signal(8)
        c_opcode = Signal(8)
        c_verr = Signal(8)
        c_len = Signal(32)
        c_flags = Signal(8)
        wr_addr = Signal(64)           # destination of the payload being written
        wqe_idx = Signal(16)           # receive index of the WQE this packet consumes
        wqe = Signal(RECV_WQE)
        orig = Signal(64)

        qpn = pk.dest_qpn[:qb]
        qpn_ok = (pk.dest_qpn >> qb) == 0
        # the packet's QP context: looked up ahead (RequestLookup), latched in IDLE
        # (request / response: a context cache answers whenever it can); a context that
        # could not be read (ctx_bad) is no valid QP: the packet is dropped
        ctx = Signal(QP_CTX)
        ctx_bad = Signal()
        qstate = self.qp.data.state
        state_ok = (qstate == QpState.RTR) | (qstate == QpState.RTS)

        # ---- the request packets, with their QP context and rkey entry looked up ahead
        # (hw/rnic/request_lookup.py)
        m.submodules.lookahead = la = RequestLookup(
            W, qb, max(1, self.mr_bits), n=cfg.rsp_lookahead,
            payload_beats=RSP_LOOKAHEAD_BEATS_PER_PACKET * cfg.rsp_lookahead)
        wiring.connect(m, wiring.flipped(self.rx), la.i)
        for k in range(cfg.rsp_lookahead):
            wiring.connect(m, la.qpc[k], wiring.flipped(self.qpc[k]))
            wiring.connect(m, la.mr[k], wiring.flipped(self.rkey[k]))
        rx_meta = la.o.meta
        rx_pay = la.o.payload
        inm = rx_meta.payload.pkt

        m.d.comb += [
            self.qp.index.eq(qpn),
            qst.rd_qpn.eq(inm.dest_qpn[:qb]),
            # the QP's receive state and producer index as the packet is taken (a receive
            # doorbell or a QP event that comes after the packet is not seen by it, however
            # long its context lookup takes; an event resetting the QP meanwhile kills it)
            replay.qpn.eq(qpn), replay.psn.eq(pk.psn), replay.rp.eq(s.rp),
            replay.rfull.eq(s.rfull),
        ]
        # ---- the packet's checks (hw/rnic/request_check.py)
        # the key's MR entry, looked up (request / response) before CHECK and WQE_CHECK
        mr_key = Signal(32)
        e = Signal(MR_ENTRY)
        m.d.comb += [mr_key.eq(pk.rkey), self.mr.req.payload.index.eq(mr_key[8:8 + self.mr_bits])]
        m.submodules.check = chk = RequestCheck(mtu)
        m.d.comb += [chk.pk.eq(pk), chk.state.eq(s), chk.ctx.eq(ctx), chk.mr.eq(e),
                     chk.key.eq(mr_key), chk.wqe.eq(wqe), chk.pi.eq(pi_r)]
        rc = chk.o
        op = pk.opcode
        psn_behind = rc.psn_behind
        is_send_first, is_send_cont = rc.send_first, rc.send_cont
        is_write_first, is_write_cont = rc.write_first, rc.write_cont
        is_last, is_imm, is_wimm = rc.last, rc.imm, rc.wimm
        is_read, is_atomic, known = rc.read, rc.atomic, rc.known
        seq_ok, len_ok, rq_empty = rc.seq_ok, rc.len_ok, rc.rq_empty
        w_va, w_rem = rc.w_va, rc.w_rem
        w_acc_bad, w_len_bad, r_acc_bad = rc.w_acc_bad, rc.w_len_bad, rc.r_acc_bad
        a_align_bad, a_acc_bad, s_len_bad = rc.a_align_bad, rc.a_acc_bad, rc.s_len_bad
        q_prot_bad, q_len_bad = rc.q_prot_bad, rc.q_len_bad
        n_resp = rc.n_resp

        # ---- helpers emitting the decision registers ---------------------------------
        def nak(syn, fatal, psn=None):
            m.d.sync += [
                f_ack.eq(1), ack_syn.eq(syn), ack_psn.eq(pk.psn if psn is None else psn),
                ack_msn.eq(s.msn), f_err.eq(fatal), f_wb.eq(0),
            ]

        def rnr_nak():
            """RNR NAK (IBA 9.7.5.2.8): no state change but ``nak_sent`` (written back)."""
            nak(Syn.RNR_NAK.value | ctx.min_rnr_timer, 0)
            m.d.sync += [f_wb.eq(1), s.nak_sent.eq(1)]

        def commit(msg_last):
            m.d.sync += [
                s.epsn.eq(s.epsn + 1), s.msn.eq(s.msn + msg_last), f_wb.eq(1), s.nak_sent.eq(0),
                f_ack.eq(pk.ackreq), ack_syn.eq(Syn.ACK.value), ack_psn.eq(pk.psn),
                ack_msn.eq(s.msn + msg_last),
            ]

        def completion(status, opcode, byte_len, wr_id, imm_flag):
            m.d.sync += [
                f_cqe.eq(1), c_status.eq(WcStatus(status).value), c_opcode.eq(WcOpcode(opcode).value),
                c_len.eq(byte_len), c_wr_id.eq(wr_id), c_flags.eq(Mux(imm_flag, CQE_FLAG_IMM, 0)),
            ]

        # ---- the ordered response queue (rule 1 of "Deadlock freedom"): ResponseQueue
        m.d.comb += [rq.node_id.eq(self.node_id),
                     self.stat_resp_full.eq(rq.stat_resp_full),
                     self.stat_coalesce.eq(rq.stat_coalesce),
                     self.stat_q_resp.eq(rq.q_level),
                     self.stat_nak.eq(rq.stat_nak)]
        wiring.connect(m, rq.rd, wiring.flipped(self.rd_data))
        wiring.connect(m, rq.tx, wiring.flipped(self.tx))

        # ---- the write gate: CQEs, QP errors and responses leave once the payload writes
        # before them are answered; a failed write turns the QP's next response into a NAK
        # (remote operational error) and its CQEs into LOC_PROT_ERR
        # (hw/rnic/responder_gate.py)
        m.submodules.gate = gate = ResponderGate(qb, cfg.gate_depth)
        wr = self.wr.wr
        wiring.connect(m, wiring.flipped(self.wr.done), gate.done)
        m.d.comb += gate.wr_issued.eq(wr.valid & wr.ready & wr.payload.last)
        wiring.connect(m, gate.cqe, wiring.flipped(self.cqe))
        wiring.connect(m, gate.resp, rq.push)
        gi = gate.i.payload.item
        # set_err: the gate's output (a failed write), the transmitter (a failed READ), the FSM
        m.submodules.err_arb = err_arb = StreamArbiter(data.StructLayout({"qpn": 24}), 3)
        wiring.connect(m, err_arb.o, wiring.flipped(self.set_err))
        wiring.connect(m, gate.err, err_arb.i[0])
        dma_err_fsm = Signal()
        m.d.comb += self.stat_dma_err.eq(dma_err_fsm + gate.stat_err + rq.stat_dma_err)
        wiring.connect(m, rq.set_err, err_arb.i[1])

        def push(kind, psn, syn, msn, arg=0, length=0):
            """Offer one response descriptor to the gate; returns when it is taken."""
            r = gi.resp
            m.d.comb += [
                gate.i.valid.eq(1), gate.i.payload.key.eq(qpn), gi.kind.eq(ITEM_RESP),
                r.kind.eq(kind), r.psn.eq(psn), r.syn.eq(syn),
                r.msn.eq(msn), r.arg.eq(arg), r.len.eq(length), r.qpn.eq(qpn),
                r.dest_node.eq(ctx.dest_node), r.dest_qpn.eq(ctx.dest_qpn),
                r.udp_sport.eq(UDP_SPORT_BASE | pk.dest_qpn[:14]),
            ]
            return gate.i.ready

        # ---- the atomic unit has DMA ports of its own
        wiring.connect(m, atomic.dma_rd, wiring.flipped(self.at_rd))
        wiring.connect(m, atomic.dma_wr, wiring.flipped(self.at_wr))
        wqe_err = Signal()             # the host failed the receive WQE's read
        # a QP event that starts the QP's receive side afresh kills its packet in flight
        ev_reset = qst.ev_reset
        kill_now = ev_reset & (qst.ev_qpn == qpn)

        m.d.comb += [la.kill.eq(ev_reset), la.kill_qpn.eq(qst.ev_qpn), atomic.owner.eq(qpn)]

        def mr_lookup(name, then, key=None, skip=None):
            """States ``<name>_REQ`` / ``<name>_RESP``: look ``key`` (default the packet's
            rkey) up in the MR cache, latch the entry in ``e`` (an entry that could not be
            read is no valid entry: the check fails), go on to ``then``. ``skip``: nothing to
            look up, go on at once."""
            go = Const(1) if skip is None else ~skip
            with m.State(f"{name}_REQ"):
                if key is not None:
                    m.d.comb += mr_key.eq(key)
                m.d.comb += self.mr.req.valid.eq(go)
                with m.If(~go):
                    m.next = then
                with m.Elif(self.mr.req.ready):
                    m.next = f"{name}_RESP"
            with m.State(f"{name}_RESP"):
                m.d.comb += self.mr.resp.ready.eq(1)
                with m.If(self.mr.resp.valid):
                    m.d.sync += e.eq(Mux(self.mr.resp.payload.err, 0, self.mr.resp.payload.data))
                    m.next = then

        def write_beat(addr):
            """Offer the next payload beat to the DMA write port (to ``addr``, the message's
            destination); true in the cycle it is taken. A payload is written only once every
            atomic of this QP taken before has been answered by the host (a WRITE / SEND
            after an atomic must not overtake it: IBA 9.5, ordering within a QP); other QPs'
            atomics do not hold it."""
            m.d.comb += [
                wr.valid.eq(rx_pay.valid & ~atomic.owner_busy),
                rx_pay.ready.eq(wr.ready & ~atomic.owner_busy),
                wr.payload.addr.eq(addr),
                wr.payload.len.eq(pk.paylen),
                wr.payload.tag.eq(qpn),
                wr.payload.data.eq(rx_pay.payload.data),
                wr.payload.nbytes.eq(rx_pay.payload.nbytes),
                wr.payload.last.eq(rx_pay.payload.last),
            ]
            return wr.valid & wr.ready

        # finishing sequence: discard, CQE, QP error, ACK/NAK, write-back
        fin_stages = [("FIN_CQE", f_cqe), ("FIN_ERR", f_err), ("FIN_ACK", f_ack), ("FIN_WB", f_wb)]

        def write_back(row):
            """The last finishing stage, done at once: the state row ``row`` written back and
            IDLE, unless a QP event takes the write port this cycle (then FIN_WB) or reset
            this QP meanwhile (nothing written)."""
            with m.If(killed | kill_now):
                m.next = "IDLE"
            with m.Elif(qst.wb_free):
                m.d.comb += [qst.wb_qpn.eq(qpn), qst.wb_row.eq(row), qst.wb_en.eq(1)]
                m.next = "IDLE"
            with m.Else():
                m.next = "FIN_WB"

        def fin_next(first):
            """Go to the first finishing stage from ``first`` on that has work; the write-back
            (FIN_WB) is done in this cycle if it is the only one left; else IDLE."""
            todo = fin_stages[first:-1]
            for k, (name, flag) in enumerate(todo):
                with (m.If if k == 0 else m.Elif)(flag):
                    m.next = name
            with (m.Elif if todo else m.If)(f_wb):
                write_back(s)
            with m.Else():
                m.next = "IDLE"

        def finish():
            """Leave a state whose work is done and whose finishing flags were set in an
            earlier cycle: drop what is left of the payload (FIN_DISCARD), or go straight to
            the first finishing stage with work (a cycle saved per request)."""
            with m.If(pay_pending):
                m.next = "FIN_DISCARD"
            with m.Else():
                fin_next(0)

        with m.FSM(name="rsp") as fsm:
            with m.State("IDLE"):
                # the next packet, with its QP context and rkey entry (looked up ahead); the
                # QP's state row and receive producer index are read as it is taken (a
                # receive doorbell or a QP event that comes after it is not seen by it)
                m.d.comb += rx_meta.ready.eq(1)
                with m.If(rx_meta.valid):
                    m.d.sync += [
                        pk.eq(inm),
                        killed.eq(0),
                        pay_pending.eq(inm.paylen != 0),
                        f_cqe.eq(0), f_err.eq(0), f_ack.eq(0), f_wb.eq(0), c_verr.eq(0),
                        pi_r.eq(qst.pi), s.eq(qst.row),
                        ctx.eq(rx_meta.payload.ctx), ctx_bad.eq(rx_meta.payload.ctx_err),
                        # an entry that could not be read is no valid entry: the check fails
                        e.eq(Mux(rx_meta.payload.mr_err, 0, rx_meta.payload.mr)),
                    ]
                    with m.If(rx_meta.payload.killed):
                        # its QP was reset (RESET, INIT, RTR) after the packet arrived and
                        # before it was executed: its context and state are gone, the packet
                        # is dropped (the requester of the new incarnation retransmits)
                        m.d.comb += self.stat_drop.eq(1)
                        m.next = "FIN_DISCARD"
                    with m.Else():
                        m.next = "CHECK"

            with m.State("CHECK"):
                with m.If(~qpn_ok | ctx_bad | ~state_ok):
                    m.d.comb += self.stat_drop.eq(1)
                    m.next = "FIN_DISCARD"
                with m.Elif(psn_behind):
                    # duplicate (IBA 9.7.5.1.2, 9.7.5.2.1): the PSN lies in the half of the
                    # PSN space behind the expected PSN
                    m.d.comb += self.stat_dup.eq(1)
                    m.next = "DUP"
                with m.Elif(pk.psn != s.epsn):
                    with m.If(s.nak_sent):
                        # one NAK per sequence gap (IBA 9.7.5.2.2): drop the rest silently
                        m.d.comb += self.stat_seq_drop.eq(1)
                    with m.Else():
                        nak(Syn.NAK_PSN_SEQ_ERR.value, 0, psn=s.epsn)
                        m.d.sync += [f_wb.eq(1), s.nak_sent.eq(1)]
                    m.next = "FIN_DISCARD"
                with m.Elif(~known | ~seq_ok | ~len_ok):
                    nak(Syn.NAK_INV_REQ.value, 1)
                    m.next = "FIN_DISCARD"

                with m.Elif(is_write_first | is_write_cont):
                    with m.If(w_acc_bad):
                        nak(Syn.NAK_REM_ACCESS_ERR.value, 1)
                        m.next = "FIN_DISCARD"
                    with m.Elif(w_len_bad):
                        nak(Syn.NAK_INV_REQ.value, 1)
                        m.next = "FIN_DISCARD"
                    with m.Elif(is_wimm & rq_empty):
                        rnr_nak()
                        m.next = "FIN_DISCARD"
                    with m.Else():
                        commit(is_last)
                        m.d.sync += [
                            wr_addr.eq(w_va),
                            s.va.eq(w_va + pk.paylen),
                            s.rem.eq(w_rem - pk.paylen),
                            s.inprog.eq(Mux(is_last, MSG_NONE, MSG_WRITE)),
                        ]
                        with m.If(is_write_first):
                            m.d.sync += s.count.eq(pk.dma_len)
                        with m.If(is_wimm):
                            m.d.sync += [s.ci.eq(s.ci + 1), wqe_idx.eq(s.ci)]
                            completion(WcStatus.SUCCESS, WcOpcode.RECV_RDMA_WITH_IMM,
                                       Mux(is_write_first, pk.dma_len, s.count), 0, 1)
                        # a one-beat WRITE without immediate is written, acknowledged and
                        # its state written back here, if the write port, the payload and
                        # the gate allow (else the states below finish it)
                        w_s = Signal(RSP_STATE)
                        m.d.comb += [w_s.eq(s), w_s.epsn.eq(s.epsn + 1),
                                     w_s.msn.eq(s.msn + is_last), w_s.nak_sent.eq(0),
                                     w_s.va.eq(w_va + pk.paylen), w_s.rem.eq(w_rem - pk.paylen),
                                     w_s.inprog.eq(Mux(is_last, MSG_NONE, MSG_WRITE)),
                                     w_s.count.eq(Mux(is_write_first, pk.dma_len, s.count))]
                        one_beat = (pk.paylen != 0) & (pk.paylen <= W) & ~is_wimm
                        with m.If(one_beat):
                            with m.If(write_beat(w_va)):
                                m.d.sync += pay_pending.eq(0)
                                with m.If(~pk.ackreq):
                                    write_back(w_s)
                                with m.Else():
                                    with m.If(push(RESP_ACK, pk.psn, Syn.ACK.value,
                                                   s.msn + is_last)):
                                        write_back(w_s)
                                    with m.Else():
                                        m.next = "FIN_ACK"
                            with m.Else():
                                m.next = "WDATA"
                        with m.Elif(pk.paylen != 0):
                            m.next = "WDATA"
                        with m.Elif(is_wimm):
                            m.next = "WQE_REQ"
                        with m.Else():
                            m.next = "FIN_DISCARD"

                with m.Elif(is_send_first):
                    with m.If(rq_empty):
                        rnr_nak()
                        m.next = "FIN_DISCARD"
                    with m.Else():
                        m.d.sync += wqe_idx.eq(s.ci)
                        m.next = "WQE_REQ"

                with m.Elif(is_send_cont):
                    with m.If(s_len_bad):
                        nak(Syn.NAK_INV_REQ.value, 1)
                        completion(WcStatus.LOC_LEN_ERR, WcOpcode.RECV, 0, s.wr_id, 0)
                        m.next = "FIN_DISCARD"
                    with m.Else():
                        commit(is_last)
                        m.d.sync += [
                            wr_addr.eq(s.va),
                            s.va.eq(s.va + pk.paylen),
                            s.rem.eq(s.rem - pk.paylen),
                            s.count.eq(s.count + pk.paylen),
                            s.inprog.eq(Mux(is_last, MSG_NONE, MSG_SEND)),
                        ]
                        with m.If(is_last):
                            completion(WcStatus.SUCCESS, WcOpcode.RECV, s.count + pk.paylen,
                                       s.wr_id, is_imm)
                        with m.If(pk.paylen != 0):
                            m.next = "WDATA"
                        with m.Else():
                            m.next = "FIN_DISCARD"

                with m.Elif(is_read):
                    with m.If(r_acc_bad):
                        nak(Syn.NAK_REM_ACCESS_ERR.value, 1)
                        m.next = "FIN_DISCARD"
                    with m.Else():
                        # the expected PSN advances by the number of responses
                        rd_s = Signal(RSP_STATE)
                        m.d.comb += [rd_s.eq(s), rd_s.msn.eq(s.msn + 1),
                                     rd_s.epsn.eq(pk.psn + n_resp), rd_s.nak_sent.eq(0)]
                        m.d.sync += [f_wb.eq(1), s.eq(rd_s)]
                        # its descriptor queued in this cycle if the gate takes it, and the
                        # state row written back with it; else in RD_PUSH
                        with m.If(pay_pending):
                            m.next = "RD_PUSH"
                        with m.Else():
                            with m.If(push(RESP_READ, pk.psn, Syn.ACK.value, rd_s.msn,
                                           arg=pk.va, length=pk.dma_len)):
                                write_back(rd_s)
                            with m.Else():
                                m.next = "RD_PUSH"

                with m.Else():  # atomic
                    with m.If(a_align_bad):
                        nak(Syn.NAK_INV_REQ.value, 1)
                        m.next = "FIN_DISCARD"
                    with m.Elif(a_acc_bad):
                        nak(Syn.NAK_REM_ACCESS_ERR.value, 1)
                        m.next = "FIN_DISCARD"
                    with m.Else():
                        commit(1)
                        m.d.sync += f_ack.eq(0)     # the ATOMIC_ACKNOWLEDGE is the answer
                        m.next = "AT_IN"

            # ---- receive WQE fetch -------------------------------------------------------
            # the prefetcher answers at once if it holds the WQE, else after reading it
            with m.State("WQE_REQ"):
                m.d.comb += [
                    qst.get.valid.eq(1),
                    qst.get.payload.qpn.eq(qpn),
                    qst.get.payload.idx.eq(wqe_idx),
                    qst.get.payload.base.eq(ctx.rq_base),
                    qst.get.payload.log.eq(ctx.rq_log_size),
                ]
                with m.If(qst.get.ready):
                    m.next = "WQE_DATA"

            with m.State("WQE_DATA"):
                m.d.comb += qst.wqe.ready.eq(1)
                with m.If(qst.wqe.valid):
                    m.d.sync += [wqe.eq(qst.wqe.payload.wqe), wqe_err.eq(qst.wqe.payload.err)]
                    with m.If(is_wimm):
                        m.next = "WQE_IMM"
                    with m.Else():
                        m.next = "WQE_MR_REQ"

            # the receive WQE's lkey (a WQE that could not be read is not looked at)
            mr_lookup("WQE_MR", "WQE_CHECK", key=wqe.lkey, skip=wqe_err)

            with m.State("WQE_IMM"):
                with m.If(wqe_err):
                    # the WQE could not be read: its wr_id is unknown (0), the QP fails
                    m.d.comb += dma_err_fsm.eq(1)
                    nak(Syn.NAK_REM_OP_ERR.value, 1)
                    completion(WcStatus.LOC_QP_OP_ERR, WcOpcode.RECV_RDMA_WITH_IMM, 0, 0, 0)
                with m.Else():
                    m.d.sync += c_wr_id.eq(wqe.wr_id)
                m.next = "FIN_DISCARD"

            with m.State("WQE_CHECK"):
                m.d.comb += mr_key.eq(wqe.lkey)
                m.d.sync += s.ci.eq(s.ci + 1)
                with m.If(wqe_err):
                    m.d.comb += dma_err_fsm.eq(1)
                    nak(Syn.NAK_REM_OP_ERR.value, 1)
                    completion(WcStatus.LOC_QP_OP_ERR, WcOpcode.RECV, 0, 0, 0)
                    m.next = "FIN_DISCARD"
                with m.Elif(q_prot_bad):
                    nak(Syn.NAK_REM_OP_ERR.value, 1)
                    completion(WcStatus.LOC_PROT_ERR, WcOpcode.RECV, 0, wqe.wr_id, 0)
                    m.next = "FIN_DISCARD"
                with m.Elif(q_len_bad):
                    nak(Syn.NAK_INV_REQ.value, 1)
                    completion(WcStatus.LOC_LEN_ERR, WcOpcode.RECV, 0, wqe.wr_id, 0)
                    m.next = "FIN_DISCARD"
                with m.Else():
                    commit(is_last)
                    m.d.sync += [
                        wr_addr.eq(wqe.addr),
                        s.va.eq(wqe.addr + pk.paylen),
                        s.rem.eq(wqe.length - pk.paylen),
                        s.count.eq(pk.paylen),
                        s.wr_id.eq(wqe.wr_id),
                        s.inprog.eq(Mux(is_last, MSG_NONE, MSG_SEND)),
                    ]
                    with m.If(is_last):
                        completion(WcStatus.SUCCESS, WcOpcode.RECV, pk.paylen, wqe.wr_id, is_imm)
                    with m.If(pk.paylen != 0):
                        m.next = "WDATA"
                    with m.Else():
                        m.next = "FIN_DISCARD"

            # ---- payload to memory ----------------------------------------------------
            with m.State("WDATA"):
                with m.If(write_beat(wr_addr) & rx_pay.payload.last):
                    m.d.sync += pay_pending.eq(0)
                    with m.If(is_wimm):
                        m.next = "WQE_REQ"
                    with m.Elif(f_ack & ~f_cqe & ~f_err):
                        # the acknowledge with the last beat (the gate counts a write issued
                        # in the same cycle as issued before it), and the write-back
                        with m.If(push(RESP_ACK, ack_psn, ack_syn, ack_msn)):
                            write_back(s)
                        with m.Else():
                            m.next = "FIN_ACK"
                    with m.Else():
                        fin_next(0)         # the payload is consumed: nothing to discard

            # ---- RDMA READ: queue its descriptor, the engines do the rest -----------
            # ---- duplicates: no second effect (IBA 9.7.5.1.2, 9.7.5.2.1) --------------
            with m.State("DUP"):
                with m.If(is_send_first | is_send_cont | is_write_first | is_write_cont):
                    with m.If(pk.ackreq):
                        # acknowledge everything received so far (the duplicate's effect
                        # has already happened)
                        m.d.sync += [f_ack.eq(1), ack_syn.eq(Syn.ACK.value),
                                     ack_psn.eq(s.epsn - 1), ack_msn.eq(s.msn)]
                    m.next = "FIN_DISCARD"
                with m.Elif(is_read & ~r_acc_bad & len_ok):
                    # re-executed from its RETH (the READ changes no state)
                    m.next = "RD_PUSH"
                with m.Elif(is_atomic & len_ok):
                    m.d.comb += replay.start.eq(1)
                    m.next = "REPLAY"
                with m.Else():
                    m.next = "FIN_DISCARD"

            with m.State("REPLAY"):
                # look the PSN up in this QP's ring of recent atomic results (one slot per
                # cycle); an atomic is never executed twice: not found -> dropped silently
                with m.If(replay.hit):
                    m.d.comb += self.stat_replay.eq(1)
                    m.d.sync += orig.eq(replay.orig)
                    m.next = "AT_ACK"
                with m.Elif(replay.last):
                    m.next = "FIN_DISCARD"
                with m.Else():
                    m.d.comb += replay.step.eq(1)

            with m.State("RD_PUSH"):
                with m.If(push(RESP_READ, pk.psn, Syn.ACK.value, s.msn, arg=pk.va, length=pk.dma_len)):
                    finish()

            # ---- atomics --------------------------------------------------------------
            with m.State("AT_IN"):
                # hand the atomic to the unit (it claims its address, reads, writes) and go
                # on: its ATOMIC_ACKNOWLEDGE takes its place in the response queue (AT_PH)
                # and is sent once the unit has answered (or a NAK if the host failed it)
                ictx = AT_CTX(atomic.i.payload.ctx)
                m.d.comb += [
                    atomic.i.valid.eq(at_out != at_depth),
                    atomic.i.payload.op.eq(Mux(op == Op.FETCH_ADD.value, ATOMIC_FAA, ATOMIC_CAS)),
                    atomic.i.payload.addr.eq(pk.va),
                    atomic.i.payload.compare.eq(pk.compare),
                    atomic.i.payload.swap_add.eq(pk.swap_add),
                    ictx.qpn.eq(qpn),
                    ictx.rp.eq(s.rp),
                    ictx.psn.eq(pk.psn),
                ]
                with m.If(atomic.i.valid & atomic.i.ready):
                    m.d.comb += [at_disp.eq(1), replay.inv_en.eq(1),
                                 replay.inv_qpn.eq(qpn), replay.inv_slot.eq(s.rp)]
                    m.d.sync += [s.rp.eq(s.rp + 1), s.rfull.eq(s.rfull | (s.rp == cfg.replay_slots - 1))]
                    m.next = "AT_PH"

            with m.State("AT_PH"):
                with m.If(push(RESP_ATOMIC_PEND, pk.psn, Syn.ACK.value, s.msn)):
                    finish()

            with m.State("AT_ACK"):
                # a duplicate answered from the replay cache
                with m.If(push(RESP_ATOMIC, pk.psn, Syn.ACK.value, s.msn, arg=orig)):
                    finish()

            # ---- finishing sequence: discard, CQE, QP error, ACK/NAK, write-back ------
            with m.State("FIN_DISCARD"):
                with m.If(pay_pending):
                    m.d.comb += rx_pay.ready.eq(1)
                    with m.If(rx_pay.valid & rx_pay.payload.last):
                        m.d.sync += pay_pending.eq(0)
                with m.Else():
                    fin_next(0)

            with m.State("FIN_CQE"):
                c = gi.cqe
                m.d.comb += [
                    gate.i.valid.eq(1), gate.i.payload.key.eq(qpn), gi.kind.eq(ITEM_CQE),
                    gi.cqn.eq(ctx.recv_cq),
                    c.wr_id.eq(c_wr_id),
                    c.status.eq(c_status),
                    c.opcode.eq(c_opcode),
                    c.vendor_err.eq(c_verr),
                    c.byte_len.eq(c_len),
                    c.imm.eq(Mux(c_flags[0], pk.imm, 0)),
                    c.qpn.eq(qpn),
                    c.src_qpn.eq(ctx.dest_qpn),
                    c.flags.eq(c_flags),
                ]
                with m.If(gate.i.ready):
                    fin_next(1)

            with m.State("FIN_ERR"):
                with m.If(killed | kill_now):
                    # the QP was modified (reset) while this packet was processed: the
                    # error belonged to its old incarnation, the new one stays as it is
                    fin_next(2)
                with m.Else():
                    # at once, not through the gate: the QP must refuse the packets that
                    # follow (the NAK itself stays in order with the other responses)
                    m.d.comb += [err_arb.i[2].valid.eq(1), err_arb.i[2].payload.qpn.eq(qpn)]
                    with m.If(err_arb.i[2].ready):
                        fin_next(2)

            with m.State("FIN_ACK"):
                with m.If(push(RESP_ACK, ack_psn, ack_syn, ack_msn)):
                    fin_next(3)

            with m.State("FIN_WB"):
                with m.If(killed | kill_now):
                    m.next = "IDLE"
                with m.Elif(qst.wb_free):
                    m.d.comb += [qst.wb_qpn.eq(qpn), qst.wb_row.eq(s), qst.wb_en.eq(1)]
                    m.next = "IDLE"
                # else: the write port is taken by an event for another QP this cycle; retry

        with m.If(kill_now & ~fsm.ongoing("IDLE")):
            m.d.sync += killed.eq(1)

        m.d.comb += self.stat_busy.eq(~fsm.ongoing("IDLE"))
        return m
