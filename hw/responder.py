"""Responder side of a Reliable Connection queue pair (RNIC receive path).

Models the RC responder of the InfiniBand Architecture Specification vol. 1 release 1.4:

* 9.7 "Reliable service": responder packet checks and execution (packet sequence number,
  opcode sequence, payload length, RETH / AtomicETH validation against the memory-region
  table and the QP's access rights);
* 9.4 operations: SEND (consumes a receive WQE), RDMA WRITE (with immediate: consumes a
  receive WQE without placing data in it), RDMA READ (response packets of at most one MTU),
  COMPARE_SWAP / FETCH_ADD (executed by :class:`~hw.atomic.AtomicUnit`);
* 9.7.5 responder ACK / NAK generation with the AETH (syndromes of :class:`~hw.formats.AethSyndrome`;
  the MSN counts the completed messages);
* chapter 10 QP states: requests are only executed in RTR or RTS; fatal errors move the QP
  to ERR (through ``set_err``).

The responder executes **one request packet at a time** (a sequential FSM): the packet's
meta is latched, the QP context (``qp`` lookup) and the per-QP responder state (a
``lib.memory.Memory`` row: expected PSN, MSN, receive-queue consumer index and the state of
the message in progress) are read, the packet is checked, then executed (payload streamed
to ``dma_wr``; receive WQE and atomics through ``dma_rd``), then the CQE, the QP-error
request and the ACK/NAK are issued in that order and the state row is written back.

RDMA READs do not hold the FSM for the DMA round trip: the FSM queues a descriptor (FIFO of
``max(2, max_rd_atomic)`` entries) for the **read-response engine**, issues all the READ's
DMA reads (at most one MTU each) and goes on with the next request. The engine emits the
READ_RESPONSE packets in order, streaming the DMA data (routed to it by the DMA tag
``READ_DMA_TAG``; the DMA answers in request order) to ``tx.payload``. Every other packet the
responder sends (ACK/NAK, ATOMIC_ACKNOWLEDGE) waits until the queued READ responses are out,
so responses leave in PSN order. Because a READ's DMA reads are issued before the next
request executes, a later WRITE or atomic cannot overtake them at the DMA engine. Atomics
and receive-WQE fetches wait for their own DMA data (one atomic at a time, see
:mod:`hw.atomic`). ``dma_rd`` requests come only from the FSM and the atomic unit (a static
multiplexer selected by the FSM state); ``dma_wr`` from the FSM (payload) or the atomic unit.

Checks, in order (the first failing one decides):

1. QPN not local (``dest_qpn >= n_qps``) or QP not in RTR/RTS: silent drop (``stat_drop``).
2. PSN != expected PSN: NAK PSN sequence error (0x60, AETH psn = expected PSN), no state
   change. Duplicate requests (PSN behind the expected PSN, IBA 9.7.5) are not yet told
   apart: that is the place where duplicate detection plugs in (see ``CHECK`` below).
3. Unknown / response opcode, opcode out of sequence (MIDDLE/LAST without FIRST, a new
   message while one is in progress), bad payload length (> MTU; FIRST/MIDDLE != MTU; payload
   on READ/atomic): NAK invalid request (0x61), QP to ERR.
4. Per operation: RETH/AtomicETH access check (0x62), length (0x61), atomic alignment
   (0x61), empty receive queue (RNR NAK 0x20 | timer 0x0E, no state change), receive WQE
   lkey check (0x63 + CQE LOC_PROT_ERR), receive buffer too short (0x61 + CQE LOC_LEN_ERR).

Every NAK except RNR and PSN sequence error also raises ``set_err`` (QP to ERR). A packet
that is NAKed or dropped has its payload discarded and changes no memory. For WRITE with
immediate the access and length checks come before the receive-queue (RNR) check; for SEND
the RNR check comes first (the WQE is needed for the other checks). A receive WQE whose
length is 0 is not checked against the MR table (like a zero-length RETH).

A ``qp_event`` for a QP (always accepted) rewrites its state row (expected PSN = ``rq_psn``,
MSN 0, consumer index 0, no message in progress); the receive-queue producer index written
by ``rq_db`` is kept (receives are posted from INIT on) except on an event with state RESET
(the QP was created or reset), which clears it. If the event hits the QP of the packet being processed, that packet's
state write-back is cancelled (its CQE/ACK are still issued).

Ports
-----
``rx``: ``In(PacketOut(W))``, ``tx``: ``Out(PacketOut(W))``, ``node_id``: ``In(8)``,
``qp``: ``Out(Lookup(log2(n_qps), QP_LOOKUP))``, ``mr``: ``Out(Lookup(log2(n_mrs), MR_ENTRY))``,
``qp_event``: ``In(QpEvent())``, ``rq_db``: ``In(DoorbellEvent())``, ``set_err``: ``Out(QpErrRequest())``,
``dma_rd``: ``Out(DmaReadClient(W))``, ``dma_wr``: ``Out(DmaWrite(W))``, ``cqe``: ``Out(CqeRequest())``,
``stat_nak``: ``Out(1)``, ``stat_drop``: ``Out(1)``.
"""

from amaranth.hdl import Module, Signal, Const, Mux
from amaranth.lib import data, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from .atomic import AtomicUnit, ATOMIC_CAS, ATOMIC_FAA
from .config import NicConfig
from .formats import (BthOpcode as Op, AethSyndrome as Syn, Access, QpState, WcOpcode, WcStatus,
                      PKT_META, RECV_WQE, RECV_WQE_BYTES, CQE_FLAG_IMM, MR_ENTRY)
from .interfaces import (PacketOut, Lookup, QP_LOOKUP, QpEvent, DoorbellEvent, QpErrRequest,
                         DmaReadClient, DmaWrite, CqeRequest)
from .regmap import mkey_index  # noqa: F401  (the MR slot computed below is the same function)

__all__ = ["Responder", "RSP_STATE", "RD_DESC", "RNR_TIMER", "UDP_SPORT_BASE",
           "MSG_NONE", "MSG_SEND", "MSG_WRITE", "WQE_DMA_TAG", "READ_DMA_TAG"]

#: RNR NAK timer code sent in the AETH (IBA table 45: 0x0E = 1.92 ms)
RNR_TIMER = 0x0E
#: UDP source port of responses: 0xC000 | (local QPN & 0x3FFF)
UDP_SPORT_BASE = 0xC000
WQE_DMA_TAG = 1
READ_DMA_TAG = 2

MSG_NONE, MSG_SEND, MSG_WRITE = 0, 1, 2

#: Per-QP responder state (one memory row per QP).
RSP_STATE = data.StructLayout({
    "epsn": 24,     # expected PSN of the next request packet
    "msn": 24,      # messages completed
    "ci": 16,       # receive-queue consumer index (free running)
    "inprog": 2,    # MSG_NONE / MSG_SEND / MSG_WRITE: multi-packet message in progress
    "va": 64,       # next address to write (WRITE: remote VA; SEND: receive buffer)
    "rem": 32,      # WRITE: DMA length left; SEND: receive buffer space left
    "count": 32,    # WRITE: total DMA length (byte_len of WRITE_IMM); SEND: bytes so far
    "wr_id": 64,    # SEND: wr_id of the receive WQE being filled
})


#: One RDMA READ handed to the read-response engine.
RD_DESC = data.StructLayout({
    "psn": 24,        # PSN of the first response (= the request's PSN)
    "len": 32,        # DMA length of the READ
    "msn": 24,        # MSN for the AETH of FIRST / LAST / ONLY
    "dest_node": 8,
    "dest_qpn": 24,
    "udp_sport": 16,
})


class Responder(wiring.Component):
    """RC responder: executes request packets, answers ACK/NAK/READ/atomic responses."""

    def __init__(self, cfg):
        if not isinstance(cfg, NicConfig):
            raise ValueError(f"cfg must be a hw.config.NicConfig, not {cfg!r}")
        self.cfg = cfg
        W = cfg.data_bytes
        self.qpn_bits = exact_log2(cfg.n_qps)
        self.mr_bits = exact_log2(cfg.n_mrs)
        super().__init__({
            "rx": In(PacketOut(W)),
            "tx": Out(PacketOut(W)),
            "node_id": In(8),
            "qp": Out(Lookup(self.qpn_bits, QP_LOOKUP)),
            "mr": Out(Lookup(self.mr_bits, MR_ENTRY)),
            "qp_event": In(QpEvent()),
            "rq_db": In(DoorbellEvent()),
            "set_err": Out(QpErrRequest()),
            "dma_rd": Out(DmaReadClient(W)),
            "dma_wr": Out(DmaWrite(W)),
            "cqe": Out(CqeRequest()),
            "stat_nak": Out(1),
            "stat_drop": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        W = cfg.data_bytes
        mtu = cfg.mtu
        qb = self.qpn_bits

        m.submodules.atomic = atomic = AtomicUnit(W)

        # ---- per-QP state and receive-queue producer indices --------------------------
        m.submodules.state_mem = st_mem = Memory(shape=RSP_STATE, depth=cfg.n_qps, init=[])
        st_rd = st_mem.read_port(domain="comb")
        st_wr = st_mem.write_port()
        m.submodules.pi_mem = pi_mem = Memory(shape=16, depth=cfg.n_qps, init=[])
        pi_rd = pi_mem.read_port(domain="comb")
        pi_wr = pi_mem.write_port()

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
        wqe_addr = Signal(64)
        wqe = Signal(RECV_WQE)
        wqe_beats = RECV_WQE_BYTES // W if W < RECV_WQE_BYTES else 1
        wqe_cnt = Signal(range(wqe_beats + 1))
        rd_addr = Signal(64)           # READ: next DMA request address / bytes left to request
        rd_rem = Signal(32)
        orig = Signal(64)

        qpn = pk.dest_qpn[:qb]
        qpn_ok = (pk.dest_qpn >> qb) == 0
        ctx = self.qp.data.ctx
        qstate = self.qp.data.state
        state_ok = (qstate == QpState.RTR) | (qstate == QpState.RTS)

        m.d.comb += [
            self.qp.index.eq(qpn),
            st_rd.addr.eq(qpn),
            pi_rd.addr.eq(qpn),
        ]

        # ---- opcode classes (from the latched meta) ---------------------------------
        op = pk.opcode

        def op_in(*ops):
            r = Const(0, 1)
            for o in ops:
                r = r | (op == o.value)
            return r

        is_send_first = op_in(Op.SEND_FIRST, Op.SEND_ONLY, Op.SEND_ONLY_IMM)
        is_send_cont = op_in(Op.SEND_MIDDLE, Op.SEND_LAST, Op.SEND_LAST_IMM)
        is_write_first = op_in(Op.WRITE_FIRST, Op.WRITE_ONLY, Op.WRITE_ONLY_IMM)
        is_write_cont = op_in(Op.WRITE_MIDDLE, Op.WRITE_LAST, Op.WRITE_LAST_IMM)
        is_last = op_in(Op.SEND_LAST, Op.SEND_LAST_IMM, Op.SEND_ONLY, Op.SEND_ONLY_IMM,
                        Op.WRITE_LAST, Op.WRITE_LAST_IMM, Op.WRITE_ONLY, Op.WRITE_ONLY_IMM)
        is_full = op_in(Op.SEND_FIRST, Op.SEND_MIDDLE, Op.WRITE_FIRST, Op.WRITE_MIDDLE)
        is_imm = op_in(Op.SEND_LAST_IMM, Op.SEND_ONLY_IMM, Op.WRITE_LAST_IMM, Op.WRITE_ONLY_IMM)
        is_wimm = op_in(Op.WRITE_LAST_IMM, Op.WRITE_ONLY_IMM)
        is_read = op_in(Op.READ_REQUEST)
        is_atomic = op_in(Op.COMPARE_SWAP, Op.FETCH_ADD)
        known = is_send_first | is_send_cont | is_write_first | is_write_cont | is_read | is_atomic
        seq_ok = Mux(s.inprog == MSG_SEND, is_send_cont,
                     Mux(s.inprog == MSG_WRITE, is_write_cont, ~is_send_cont & ~is_write_cont))
        len_ok = ((pk.paylen <= mtu) & (~is_full | (pk.paylen == mtu))
                  & (~(is_read | is_atomic) | (pk.paylen == 0)))
        rq_empty = s.ci == pi_r

        # ---- memory-region check -----------------------------------------------------
        mr_key = Signal(32)
        m.d.comb += [
            mr_key.eq(pk.rkey),
            self.mr.index.eq(mr_key[8:8 + self.mr_bits]),
        ]
        e = self.mr.data

        def mr_ok(right, va, length, remote):
            right = Access(right).value
            ok = (e.valid & (e.key == mr_key) & (e.pd == ctx.pd) & ((e.access & right) != 0)
                  & (va >= e.base) & ((va + length) <= (e.base + e.length)))
            if remote:
                ok = ok & ((ctx.access & right) != 0)
            return ok

        w_va = Mux(is_write_first, pk.va, s.va)
        w_rem = Mux(is_write_first, pk.dma_len, s.rem)
        w_acc_bad = is_write_first & (pk.dma_len != 0) & ~mr_ok(Access.REMOTE_WRITE, pk.va, pk.dma_len, True)
        w_len_bad = (pk.paylen > w_rem) | (is_last & (pk.paylen != w_rem))
        r_acc_bad = (pk.dma_len != 0) & ~mr_ok(Access.REMOTE_READ, pk.va, pk.dma_len, True)
        a_align_bad = pk.va[:3] != 0
        a_acc_bad = ~mr_ok(Access.REMOTE_ATOMIC, pk.va, 8, True)
        s_len_bad = pk.paylen > s.rem
        q_prot_bad = (wqe.length != 0) & ~mr_ok(Access.LOCAL_WRITE, wqe.addr, wqe.length, False)
        q_len_bad = pk.paylen > wqe.length

        rq_mask = ((Const(1, 33) << ctx.rq_log_size) - 1)[:16]
        wqe_slot_addr = ctx.rq_base + ((s.ci & rq_mask) * RECV_WQE_BYTES)

        # ---- helpers emitting the decision registers ---------------------------------
        def nak(syn, fatal, psn=None):
            m.d.sync += [
                f_ack.eq(1), ack_syn.eq(syn), ack_psn.eq(pk.psn if psn is None else psn),
                ack_msn.eq(s.msn), f_err.eq(fatal), f_wb.eq(0),
            ]

        def commit(msg_last):
            m.d.sync += [
                s.epsn.eq(s.epsn + 1), s.msn.eq(s.msn + msg_last), f_wb.eq(1),
                f_ack.eq(pk.ackreq), ack_syn.eq(Syn.ACK.value), ack_psn.eq(pk.psn),
                ack_msn.eq(s.msn + msg_last),
            ]

        def completion(status, opcode, byte_len, wr_id, imm_flag):
            m.d.sync += [
                f_cqe.eq(1), c_status.eq(WcStatus(status).value), c_opcode.eq(WcOpcode(opcode).value),
                c_len.eq(byte_len), c_wr_id.eq(wr_id), c_flags.eq(Mux(imm_flag, CQE_FLAG_IMM, 0)),
            ]

        # ---- tx meta: fields common to every response --------------------------------
        tm = self.tx.meta.payload
        m.d.comb += [
            tm.src_node.eq(self.node_id),
            tm.dst_node.eq(ctx.dest_node),
            tm.dest_qpn.eq(ctx.dest_qpn),
            tm.udp_sport.eq(UDP_SPORT_BASE | pk.dest_qpn[:14]),
        ]

        rd_chunk = Mux(rd_rem > mtu, mtu, rd_rem)
        rd_last = rd_rem <= mtu
        n_resp = Mux(pk.dma_len == 0, 1, (pk.dma_len + (mtu - 1)) >> exact_log2(mtu))

        # ---- read-response engine: READ descriptors, responses emitted in order ------
        rd_depth = max(2, cfg.max_rd_atomic)
        m.submodules.rd_fifo = rd_fifo = SyncFIFOBuffered(width=RD_DESC.size, depth=rd_depth)
        rd_out = Signal(range(rd_depth + 2))   # READs queued or being answered
        rd_inc = Signal()
        rd_dec = Signal()
        m.d.sync += rd_out.eq(rd_out + rd_inc - rd_dec)
        rtx_busy = rd_out != 0

        # dma_rd responses: READ data to the read-response engine, the rest (receive WQE,
        # atomic) to the main FSM; both are in request order on the one response stream
        resp = self.dma_rd.resp
        resp_is_read = resp.payload.tag == READ_DMA_TAG
        m_resp_valid = resp.valid & ~resp_is_read
        m_resp_ready = Signal()
        r_resp_ready = Signal()
        m.d.comb += resp.ready.eq(Mux(resp_is_read, r_resp_ready, m_resp_ready))
        ev = self.qp_event.payload
        ev_ok = self.qp_event.valid & ((ev.qpn >> qb) == 0)
        kill_now = ev_ok & (ev.qpn[:qb] == qpn)

        with m.FSM(name="rsp") as fsm:
            with m.State("IDLE"):
                m.d.comb += self.rx.meta.ready.eq(1)
                with m.If(self.rx.meta.valid):
                    m.d.sync += [
                        pk.eq(self.rx.meta.payload),
                        killed.eq(0),
                        pay_pending.eq(self.rx.meta.payload.paylen != 0),
                        f_cqe.eq(0), f_err.eq(0), f_ack.eq(0), f_wb.eq(0), c_verr.eq(0),
                    ]
                    m.next = "LOAD"

            with m.State("LOAD"):
                m.d.sync += [s.eq(st_rd.data), pi_r.eq(pi_rd.data)]
                m.next = "CHECK"

            with m.State("CHECK"):
                with m.If(~qpn_ok | ~state_ok):
                    m.d.comb += self.stat_drop.eq(1)
                    m.next = "FIN_DISCARD"
                with m.Elif(pk.psn != s.epsn):
                    # Duplicate detection (IBA 9.7.5: PSN in the window behind epsn)
                    # goes here; for now every unexpected PSN is a sequence error.
                    nak(Syn.NAK_PSN_SEQ_ERR.value, 0, psn=s.epsn)
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
                        nak(Syn.RNR_NAK.value | RNR_TIMER, 0)
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
                            m.d.sync += [s.ci.eq(s.ci + 1), wqe_addr.eq(wqe_slot_addr)]
                            completion(WcStatus.SUCCESS, WcOpcode.RECV_RDMA_WITH_IMM,
                                       Mux(is_write_first, pk.dma_len, s.count), 0, 1)
                        with m.If(pk.paylen != 0):
                            m.next = "WDATA"
                        with m.Elif(is_wimm):
                            m.next = "WQE_REQ"
                        with m.Else():
                            m.next = "FIN_DISCARD"

                with m.Elif(is_send_first):
                    with m.If(rq_empty):
                        nak(Syn.RNR_NAK.value | RNR_TIMER, 0)
                        m.next = "FIN_DISCARD"
                    with m.Else():
                        m.d.sync += wqe_addr.eq(wqe_slot_addr)
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
                        m.d.sync += [
                            f_wb.eq(1), s.msn.eq(s.msn + 1), s.epsn.eq(pk.psn + n_resp),
                            rd_addr.eq(pk.va), rd_rem.eq(pk.dma_len),
                        ]
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
            with m.State("WQE_REQ"):
                m.d.comb += [
                    self.dma_rd.req.valid.eq(1),
                    self.dma_rd.req.payload.addr.eq(wqe_addr),
                    self.dma_rd.req.payload.len.eq(RECV_WQE_BYTES),
                    self.dma_rd.req.payload.tag.eq(WQE_DMA_TAG),
                ]
                with m.If(self.dma_rd.req.ready):
                    m.d.sync += wqe_cnt.eq(0)
                    m.next = "WQE_DATA"

            with m.State("WQE_DATA"):
                m.d.comb += m_resp_ready.eq(1)
                beat = resp.payload
                with m.If(m_resp_valid):
                    if W >= RECV_WQE_BYTES:
                        m.d.sync += wqe.as_value().eq(beat.data[:8 * RECV_WQE_BYTES])
                    else:
                        with m.Switch(wqe_cnt):
                            for k in range(wqe_beats):
                                with m.Case(k):
                                    m.d.sync += wqe.as_value().word_select(k, 8 * W).eq(beat.data)
                    m.d.sync += wqe_cnt.eq(wqe_cnt + 1)
                    with m.If(beat.last):
                        with m.If(is_wimm):
                            m.next = "WQE_IMM"
                        with m.Else():
                            m.next = "WQE_CHECK"

            with m.State("WQE_IMM"):
                m.d.sync += c_wr_id.eq(wqe.wr_id)
                m.next = "FIN_DISCARD"

            with m.State("WQE_CHECK"):
                m.d.comb += mr_key.eq(wqe.lkey)
                m.d.sync += s.ci.eq(s.ci + 1)
                with m.If(q_prot_bad):
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
                m.d.comb += [
                    self.dma_wr.valid.eq(self.rx.payload.valid),
                    self.rx.payload.ready.eq(self.dma_wr.ready),
                    self.dma_wr.payload.addr.eq(wr_addr),
                    self.dma_wr.payload.len.eq(pk.paylen),
                    self.dma_wr.payload.data.eq(self.rx.payload.payload.data),
                    self.dma_wr.payload.nbytes.eq(self.rx.payload.payload.nbytes),
                    self.dma_wr.payload.last.eq(self.rx.payload.payload.last),
                ]
                with m.If(self.rx.payload.valid & self.dma_wr.ready & self.rx.payload.payload.last):
                    m.d.sync += pay_pending.eq(0)
                    with m.If(is_wimm):
                        m.next = "WQE_REQ"
                    with m.Else():
                        m.next = "FIN_DISCARD"

            # ---- RDMA READ: queue a descriptor, issue the DMA reads -------------------
            with m.State("RD_PUSH"):
                desc = Signal(RD_DESC)
                m.d.comb += [
                    desc.psn.eq(pk.psn), desc.len.eq(pk.dma_len), desc.msn.eq(s.msn),
                    desc.dest_node.eq(ctx.dest_node), desc.dest_qpn.eq(ctx.dest_qpn),
                    desc.udp_sport.eq(UDP_SPORT_BASE | pk.dest_qpn[:14]),
                    rd_fifo.w_data.eq(desc),
                    rd_fifo.w_en.eq(1),
                ]
                with m.If(rd_fifo.w_rdy):
                    m.d.comb += rd_inc.eq(1)
                    m.next = "RD_REQ"

            with m.State("RD_REQ"):
                # every DMA read of this READ is issued before the next request is executed,
                # so later WRITEs/atomics cannot overtake it at the DMA engine
                with m.If(rd_rem == 0):
                    m.next = "FIN_DISCARD"
                with m.Else():
                    m.d.comb += [
                        self.dma_rd.req.valid.eq(1),
                        self.dma_rd.req.payload.addr.eq(rd_addr),
                        self.dma_rd.req.payload.len.eq(rd_chunk),
                        self.dma_rd.req.payload.tag.eq(READ_DMA_TAG),
                    ]
                    with m.If(self.dma_rd.req.ready):
                        m.d.sync += [rd_addr.eq(rd_addr + rd_chunk), rd_rem.eq(rd_rem - rd_chunk)]
                        with m.If(rd_last):
                            m.next = "FIN_DISCARD"

            # ---- atomics --------------------------------------------------------------
            def connect_atomic_dma():
                a_rd, a_wr = atomic.dma_rd, atomic.dma_wr
                m.d.comb += [
                    self.dma_rd.req.valid.eq(a_rd.req.valid),
                    self.dma_rd.req.payload.eq(a_rd.req.payload),
                    a_rd.req.ready.eq(self.dma_rd.req.ready),
                    a_rd.resp.valid.eq(m_resp_valid),
                    a_rd.resp.payload.eq(resp.payload),
                    m_resp_ready.eq(a_rd.resp.ready),
                    self.dma_wr.valid.eq(a_wr.valid),
                    self.dma_wr.payload.eq(a_wr.payload),
                    a_wr.ready.eq(self.dma_wr.ready),
                ]

            with m.State("AT_IN"):
                connect_atomic_dma()
                m.d.comb += [
                    atomic.i.valid.eq(1),
                    atomic.i.payload.op.eq(Mux(op == Op.FETCH_ADD.value, ATOMIC_FAA, ATOMIC_CAS)),
                    atomic.i.payload.addr.eq(pk.va),
                    atomic.i.payload.compare.eq(pk.compare),
                    atomic.i.payload.swap_add.eq(pk.swap_add),
                ]
                with m.If(atomic.i.ready):
                    m.next = "AT_RUN"

            with m.State("AT_RUN"):
                connect_atomic_dma()
                m.d.comb += atomic.o.ready.eq(1)
                with m.If(atomic.o.valid):
                    m.d.sync += orig.eq(atomic.o.payload.orig)
                    m.next = "AT_ACK"

            with m.State("AT_ACK"):
                with m.If(~rtx_busy):                      # after every queued READ response
                    m.d.comb += [
                        self.tx.meta.valid.eq(1),
                        tm.opcode.eq(Op.ATOMIC_ACKNOWLEDGE.value),
                        tm.psn.eq(pk.psn),
                        tm.syndrome.eq(Syn.ACK.value),
                        tm.msn.eq(s.msn),
                        tm.orig.eq(orig),
                    ]
                    with m.If(self.tx.meta.ready):
                        m.next = "FIN_DISCARD"

            # ---- finishing sequence: discard, CQE, QP error, ACK/NAK, write-back ------
            fin_stages = [("FIN_CQE", f_cqe), ("FIN_ERR", f_err), ("FIN_ACK", f_ack), ("FIN_WB", f_wb)]

            def fin_next(first):
                """Go to the first finishing stage from ``first`` on that has work, else IDLE."""
                todo = fin_stages[first:]
                with m.If(todo[0][1]):
                    m.next = todo[0][0]
                for name, flag in todo[1:]:
                    with m.Elif(flag):
                        m.next = name
                with m.Else():
                    m.next = "IDLE"

            with m.State("FIN_DISCARD"):
                with m.If(pay_pending):
                    m.d.comb += self.rx.payload.ready.eq(1)
                    with m.If(self.rx.payload.valid & self.rx.payload.payload.last):
                        m.d.sync += pay_pending.eq(0)
                with m.Else():
                    fin_next(0)

            with m.State("FIN_CQE"):
                c = self.cqe.payload.cqe
                m.d.comb += [
                    self.cqe.valid.eq(1),
                    self.cqe.payload.cqn.eq(ctx.recv_cq),
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
                with m.If(self.cqe.ready):
                    fin_next(1)

            with m.State("FIN_ERR"):
                m.d.comb += [
                    self.set_err.valid.eq(1),
                    self.set_err.payload.qpn.eq(qpn),
                ]
                with m.If(self.set_err.ready):
                    fin_next(2)

            with m.State("FIN_ACK"):
                with m.If(~rtx_busy):                      # after every queued READ response
                    m.d.comb += [
                        self.tx.meta.valid.eq(1),
                        tm.opcode.eq(Op.ACKNOWLEDGE.value),
                        tm.psn.eq(ack_psn),
                        tm.syndrome.eq(ack_syn),
                        tm.msn.eq(ack_msn),
                    ]
                    with m.If(self.tx.meta.ready):
                        m.d.comb += self.stat_nak.eq(ack_syn != Syn.ACK.value)
                        fin_next(3)

            with m.State("FIN_WB"):
                with m.If(killed | kill_now):
                    m.next = "IDLE"
                with m.Elif(~self.qp_event.valid):
                    m.d.comb += [st_wr.addr.eq(qpn), st_wr.data.eq(s), st_wr.en.eq(1)]
                    m.next = "IDLE"
                # else: the write port is taken by an event for another QP this cycle; retry

        # ---- read-response engine -------------------------------------------------------
        rd = Signal(RD_DESC)
        x_rem = Signal(32)
        x_psn = Signal(24)
        x_first = Signal()
        x_chunk = Mux(x_rem > mtu, mtu, x_rem)
        x_last = x_rem <= mtu
        with m.FSM(name="rtx"):
            with m.State("IDLE"):
                m.d.comb += rd_fifo.r_en.eq(1)
                with m.If(rd_fifo.r_rdy):
                    d = rd_fifo.r_data
                    m.d.sync += [rd.eq(d), x_rem.eq(RD_DESC(d).len), x_psn.eq(RD_DESC(d).psn),
                                 x_first.eq(1)]
                    m.next = "META"
            with m.State("META"):
                has_aeth = x_first | x_last
                m.d.comb += [
                    self.tx.meta.valid.eq(1),
                    tm.dst_node.eq(rd.dest_node),
                    tm.dest_qpn.eq(rd.dest_qpn),
                    tm.udp_sport.eq(rd.udp_sport),
                    tm.opcode.eq(Mux(x_first,
                                     Mux(x_last, Op.READ_RESPONSE_ONLY.value, Op.READ_RESPONSE_FIRST.value),
                                     Mux(x_last, Op.READ_RESPONSE_LAST.value, Op.READ_RESPONSE_MIDDLE.value))),
                    tm.psn.eq(x_psn),
                    tm.syndrome.eq(Mux(has_aeth, Syn.ACK.value, 0)),
                    tm.msn.eq(Mux(has_aeth, rd.msn, 0)),
                    tm.paylen.eq(x_chunk),
                ]
                with m.If(self.tx.meta.ready):
                    with m.If(x_chunk != 0):
                        m.next = "DATA"
                    with m.Else():
                        m.next = "NEXT"
            with m.State("DATA"):
                m.d.comb += [
                    self.tx.payload.valid.eq(resp.valid & resp_is_read),
                    r_resp_ready.eq(self.tx.payload.ready),
                    self.tx.payload.payload.data.eq(resp.payload.data),
                    self.tx.payload.payload.nbytes.eq(resp.payload.nbytes),
                    self.tx.payload.payload.last.eq(resp.payload.last),
                ]
                with m.If(resp.valid & resp_is_read & self.tx.payload.ready & resp.payload.last):
                    m.next = "NEXT"
            with m.State("NEXT"):
                m.d.sync += [x_rem.eq(x_rem - x_chunk), x_psn.eq(x_psn + 1), x_first.eq(0)]
                with m.If(x_last):
                    m.d.comb += rd_dec.eq(1)
                    m.next = "IDLE"
                with m.Else():
                    m.next = "META"

        with m.If(kill_now & ~fsm.ongoing("IDLE")):
            m.d.sync += killed.eq(1)

        # ---- QP events (always ready, priority on the state write port) -------------
        m.d.comb += self.qp_event.ready.eq(1)
        with m.If(ev_ok):
            m.d.comb += [
                st_wr.addr.eq(ev.qpn[:qb]),
                st_wr.data.eq(0),
                st_wr.data.epsn.eq(ev.rq_psn),
                st_wr.en.eq(1),
            ]

        # ---- receive doorbells ------------------------------------------------------
        # A QP (re)created or moved to RESET starts with an empty receive queue; that event
        # takes the write port for one cycle and the doorbell waits in its FIFO.
        db = self.rq_db.payload
        with m.If(ev_ok & (ev.state == QpState.RESET)):
            m.d.comb += [pi_wr.addr.eq(ev.qpn[:qb]), pi_wr.data.eq(0), pi_wr.en.eq(1)]
        with m.Else():
            m.d.comb += [
                self.rq_db.ready.eq(1),
                pi_wr.addr.eq(db.qpn[:qb]),
                pi_wr.data.eq(db.pi),
                pi_wr.en.eq(self.rq_db.valid & ((db.qpn >> qb) == 0)),
            ]
        return m
