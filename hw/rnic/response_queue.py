"""The responder's ordered response queue, its READ prefetcher and its transmitter.

Models the response side of an RC responder (InfiniBand Architecture Specification vol. 1
rel. 1.4, 9.7.5 "Responder: generating responses"; 9.5 ordering): the responder returns
ACKs, NAKs, READ responses and atomic acknowledges in the order of the requests, so every
response of every QP goes through ONE ordered queue (a ``lib.memory`` ring of
``n_qps * max_outstanding`` descriptors, :data:`RESP_ENTRY`) and leaves strictly in queue
order. The request FSM of :class:`~hw.rnic.responder.Responder` writes a descriptor and goes on
with the next request: it never waits for ``tx`` (rule 1 of the responder's "Deadlock
freedom").

Three parts work on the queue:

* **push** (``push`` stream): a descriptor enters the queue; a positive ACK whose QP's
  previous positive ACK is the newest entry, still queued and not yet offered on ``tx``
  (at least two entries queued), replaces it instead (ACK coalescing, ``stat_coalesce``: the
  newer ACK acknowledges everything the older one did). A full queue holds ``push``
  (``stat_resp_full`` pulses each cycle it waits).
* the **READ prefetcher** walks the queue ahead of the transmitter; for every READ
  descriptor it issues the DMA read (``rd``) of each response packet (at most one MTU,
  tag :data:`READ_DMA_TAG`) as soon as the payload ring (``read_buffers`` MTUs of beats)
  has room reserved for the whole packet, so read data is always taken at once (rule 2);
  a one-packet READ's read is requested in the cycle the prefetcher looks at it, so it
  passes one such READ per cycle.
  It does not pass a ``RESP_ATOMIC_PEND`` whose result has not arrived: a READ behind an
  atomic must read what the atomic wrote.
* the **transmitter** takes the descriptors in queue order and sends them on ``tx``: an
  ACK/NAK or ATOMIC_ACKNOWLEDGE as one header (a pending atomic's original value from the
  atomic unit's next result, ``at_result``, which this block queues), a READ as its
  READ_RESPONSE FIRST/MIDDLE/LAST/ONLY packets, each header leaving only once its packet's
  whole payload is in the ring (store and forward), then the payload from the ring. A READ's
  first header leaves in the cycle its descriptor is looked at (if its payload is there)
  and the next descriptor is taken with a packet's last beat, so a one-beat READ response
  costs two cycles, its header and its beat (four before 2026-12-07: this transmitter held
  four-unit READ peaks at 59 Mops, its queue 450 deep).

Host-interface errors (docs/errors.md): a READ packet whose data the host failed to read is
replaced by a NAK (remote operational error, IBA 9.7.5.2.4) at its PSN, the rest of that
READ is dropped, and the QP is asked to go to ERR (``set_err``); a pending atomic whose
result failed becomes such a NAK too.

Ports
-----
``push``: ``In(stream(RESP_ENTRY))``; ``at_result``: ``In(stream(AT_RES))``, the atomic unit's
answers in dispatch order (``n_qps * replay_slots`` of them are held); ``at_sent``:
``Out(1)``, a pending atomic's answer leaves; ``rd``: ``Out(DmaReadPort(W))``;
``tx``: ``Out(PacketOut(W))``; ``node_id``: ``In(8)``; ``set_err``: ``Out(QpErrRequest())``;
``stat_nak`` (a NAK leaves), ``stat_dma_err`` (a host failure became a NAK),
``stat_resp_full``, ``stat_coalesce``: ``Out(1)``; ``q_level``: the descriptors queued and
not yet sent (the counter ``Q_RSP_QUEUE`` adds it every cycle).

Parameters: ``cfg`` (:class:`~hw.config.NicConfig`), ``read_buffers`` (the READ payload
ring in MTUs, a power of two in [2, 16]).
"""

from amaranth.hdl import Module, Signal, Mux
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from ..config import NicConfig
from ..formats import BthOpcode as Op, AethSyndrome as Syn
from ..interfaces import PacketOut, QpErrRequest, DmaReadPort, beat_layout
from ..lib.checks import check_pow2

__all__ = ["ResponseQueue", "RESP_ENTRY", "AT_RES", "READ_DMA_TAG",
           "RESP_ACK", "RESP_READ", "RESP_ATOMIC", "RESP_ATOMIC_PEND"]

#: DMA tag of the READ payload reads.
READ_DMA_TAG = 2

#: Kinds of response descriptors. RESP_ATOMIC_PEND: the ATOMIC_ACKNOWLEDGE of an atomic
#: still executing in the atomic unit; its original value is taken from the unit's results,
#: in order, when the descriptor is sent (a reserved place in the ordered queue).
RESP_ACK, RESP_READ, RESP_ATOMIC, RESP_ATOMIC_PEND = 0, 1, 2, 3

#: One entry of the ordered response queue.
RESP_ENTRY = data.StructLayout({
    "kind": 2,        # RESP_ACK (ACK / NAK / RNR NAK), RESP_READ, RESP_ATOMIC(_PEND)
    "psn": 24,        # PSN of the (first) response
    "syn": 8,         # AETH syndrome (READ: ACK)
    "msn": 24,        # AETH MSN
    "dest_node": 8,
    "dest_qpn": 24,
    "udp_sport": 16,
    "arg": 64,        # READ: virtual address; ATOMIC: original value
    "len": 32,        # READ: DMA length
    "qpn": 24,        # the local QP
})

#: One answer of the atomic unit: the original value, or the host failed the atomic.
AT_RES = data.StructLayout({"orig": 64, "err": 1})


class ResponseQueue(wiring.Component):
    """Ordered response queue with ACK coalescing, READ prefetcher and transmitter."""

    def __init__(self, cfg, read_buffers):
        if not isinstance(cfg, NicConfig):
            raise ValueError(f"cfg must be a hw.config.NicConfig, not {cfg!r}")
        check_pow2("read_buffers", read_buffers, 2, 16)
        self.cfg = cfg
        self.read_buffers = read_buffers
        #: pending atomic results held (at most n_qps * replay_slots atomics are outstanding
        #: from a conforming peer: max_rd_atomic <= 16 per QP)
        self.at_depth = cfg.n_qps * cfg.replay_slots
        W = cfg.data_bytes
        super().__init__({
            "push": In(stream.Signature(RESP_ENTRY)),
            "at_result": In(stream.Signature(AT_RES)),
            "at_sent": Out(1),
            "rd": Out(DmaReadPort(W)),
            "tx": Out(PacketOut(W)),
            "node_id": In(8),
            "set_err": Out(QpErrRequest()),
            "stat_nak": Out(1),
            "stat_dma_err": Out(1),
            "stat_resp_full": Out(1),
            "stat_coalesce": Out(1),
            "q_level": Out(range(cfg.n_qps * cfg.max_outstanding + 1)),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        W = cfg.data_bytes
        mtu = cfg.mtu
        qb = exact_log2(cfg.n_qps)
        at_depth = self.at_depth

        # the atomic unit's answers, taken in order by the transmitter
        m.submodules.at_res = at_res = SyncFIFOBuffered(width=AT_RES.size, depth=at_depth)
        m.d.comb += [
            self.at_result.ready.eq(at_res.w_rdy),
            at_res.w_en.eq(self.at_result.valid),
            at_res.w_data.eq(self.at_result.payload),
        ]
        at_sent = self.at_sent

        # ---- the ordered queue --------------------------------------------------------
        qd = cfg.n_qps * cfg.max_outstanding
        qk = exact_log2(qd)
        m.submodules.resp_q = resp_q = Memory(shape=RESP_ENTRY, depth=qd, init=[])
        q_wr = resp_q.write_port()
        q_rp = resp_q.read_port(domain="sync", transparent_for=(q_wr,))    # prefetcher
        q_rt = resp_q.read_port(domain="sync", transparent_for=(q_wr,))    # transmitter
        q_w = Signal(qk + 1)           # free-running pointers: write >= prefetch >= transmit
        q_p = Signal(qk + 1)
        q_t = Signal(qk + 1)
        q_full = (q_w - q_t)[:qk + 1] == qd
        m.d.comb += self.q_level.eq((q_w - q_t)[:qk + 1])
        q_entry = self.push.payload
        # ACK coalescing: the newest entry is a positive ACK of QP la_qpn, not yet sent
        la_valid = Signal()
        la_qpn = Signal(qb)
        # the newest entry is neither sent nor offered on tx: at least two entries queued
        q_two = (q_w - q_t)[:qk + 1] >= 2
        q_over = Signal()              # the offered entry replaces the newest (coalesced ACK)
        q_push = Signal()              # ... or is appended
        m.d.comb += [
            q_over.eq(self.push.valid & la_valid & (la_qpn == q_entry.qpn[:qb])
                      & (q_entry.kind == RESP_ACK) & (q_entry.syn == Syn.ACK.value) & q_two),
            q_push.eq(self.push.valid & ~q_over),
            self.push.ready.eq(q_over | ~q_full),
            q_wr.addr.eq(Mux(q_over, q_w - 1, q_w)[:qk]),
            q_wr.data.eq(q_entry),
            q_wr.en.eq((q_push & ~q_full) | q_over),
            self.stat_resp_full.eq(q_push & q_full),
            self.stat_coalesce.eq(q_over),
        ]
        with m.If(q_push & ~q_full):
            m.d.sync += q_w.eq(q_w + 1)
        with m.If(q_wr.en):
            m.d.sync += [la_valid.eq((q_entry.kind == RESP_ACK) & (q_entry.syn == Syn.ACK.value)),
                         la_qpn.eq(q_entry.qpn)]

        # ---- READ payload ring (rule 2 of "Deadlock freedom") --------------------------
        cap = self.read_buffers * mtu // W            # beats; a power of two
        ck = exact_log2(cap)
        m.submodules.ring = ring = Memory(shape=beat_layout(W), depth=cap, init=[])
        ring_wr = ring.write_port()
        ring_rd = ring.read_port(domain="sync", transparent_for=())
        r_wp = Signal(ck)                  # next beat written by DMA data
        r_rp = Signal(ck)                  # next beat sent
        r_used = Signal(range(cap + 1))    # beats reserved (requested, not yet sent)
        r_alloc = Signal(range(mtu // W + 1))
        r_free = Signal()
        n_filled = Signal(ck + 1)          # packets completely in the ring (free running)
        n_sent = Signal(ck + 1)            # packets whose payload has been sent
        m.d.sync += r_used.eq(r_used + r_alloc - r_free)
        # per packet in the ring: did the host fail its read
        m.submodules.pkt_err = pkt_err = SyncFIFOBuffered(width=1, depth=cap)
        resp = self.rd.rd
        m.d.comb += [resp.ready.eq(1), pkt_err.w_data.eq(resp.payload.err),
                     pkt_err.w_en.eq(resp.valid & resp.payload.last)]
        with m.If(resp.valid):
            m.d.comb += [
                ring_wr.addr.eq(r_wp),
                ring_wr.data.data.eq(resp.payload.data),
                ring_wr.data.nbytes.eq(resp.payload.nbytes),
                ring_wr.data.last.eq(resp.payload.last),
                ring_wr.en.eq(1),
            ]
            m.d.sync += r_wp.eq(r_wp + 1)
            with m.If(resp.payload.last):
                m.d.sync += n_filled.eq(n_filled + 1)

        # ---- read prefetcher: walks the response queue, requests READ data ----------
        p_adv = Signal()
        p_pend = Signal()              # the prefetcher passes a RESP_ATOMIC_PEND
        p_ahead = Signal(range(at_depth + 1))   # ... passed, not yet sent
        m.d.sync += p_ahead.eq(p_ahead + p_pend - at_sent)
        m.d.comb += q_rp.addr.eq((q_p + p_adv)[:qk])    # data of entry q_p in the next cycle
        m.d.sync += q_p.eq(q_p + p_adv)
        pe = q_rp.data
        pf_addr = Signal(64)
        pf_rem = Signal(32)
        pf_chunk = Mux(pf_rem > mtu, mtu, pf_rem)
        pf_beats = (pf_chunk + (W - 1)) >> exact_log2(W)
        p_req = self.rd.req
        with m.FSM(name="prefetch") as pf_fsm:
            with m.State("SCAN"):
                with m.If(q_p != q_w):
                    with m.If((pe.kind == RESP_READ) & (pe.len != 0) & (pe.len <= mtu)):
                        # a one-packet READ: its read is requested from here (ISSUE's work),
                        # so that the prefetcher passes a READ per cycle (two before
                        # 2026-12-08); the entry stays until the request is taken
                        s_beats = (pe.len + (W - 1)) >> exact_log2(W)
                        m.d.comb += [
                            p_req.valid.eq(cap - r_used >= s_beats),
                            p_req.payload.addr.eq(pe.arg),
                            p_req.payload.len.eq(pe.len),
                            p_req.payload.tag.eq(READ_DMA_TAG),
                        ]
                        with m.If(p_req.valid & p_req.ready):
                            m.d.comb += [r_alloc.eq(s_beats), p_adv.eq(1)]
                    with m.Elif((pe.kind == RESP_READ) & (pe.len != 0)):
                        m.d.sync += [pf_addr.eq(pe.arg), pf_rem.eq(pe.len)]
                        m.next = "ISSUE"
                    with m.Elif(pe.kind == RESP_ATOMIC_PEND):
                        # not past an atomic still executing: a later READ must read what
                        # the atomic wrote (and the transmitter then never waits for it)
                        with m.If(at_res.level > p_ahead):
                            m.d.comb += [p_adv.eq(1), p_pend.eq(1)]
                    with m.Else():
                        m.d.comb += p_adv.eq(1)
            with m.State("ISSUE"):
                m.d.comb += [
                    p_req.valid.eq(cap - r_used >= pf_beats),
                    p_req.payload.addr.eq(pf_addr),
                    p_req.payload.len.eq(pf_chunk),
                    p_req.payload.tag.eq(READ_DMA_TAG),
                ]
                with m.If(p_req.valid & p_req.ready):
                    m.d.comb += r_alloc.eq(pf_beats)
                    m.d.sync += [pf_addr.eq(pf_addr + pf_chunk), pf_rem.eq(pf_rem - pf_chunk)]
                    with m.If(pf_rem <= mtu):
                        m.d.comb += p_adv.eq(1)
                        m.next = "SCAN"

        # ---- response transmitter: the queue in order, READ packets store-and-forward
        tm = self.tx.meta.payload
        t_adv = Signal()
        m.d.comb += q_rt.addr.eq((q_t + t_adv)[:qk])
        m.d.sync += q_t.eq(q_t + t_adv)
        te = q_rt.data
        rd = Signal(RESP_ENTRY)
        x_rem = Signal(32)
        x_psn = Signal(24)
        x_first = Signal()
        x_bad = Signal()               # a packet of this READ could not be read from memory
        x_chunk = Mux(x_rem > mtu, mtu, x_rem)
        x_last = x_rem <= mtu
        r_fire = Signal()
        m.d.comb += [
            ring_rd.addr.eq(r_rp + r_fire),
            tm.src_node.eq(self.node_id),
        ]

        def header(e, opcode, psn, syn, msn):
            m.d.comb += [
                tm.dst_node.eq(e.dest_node),
                tm.dest_qpn.eq(e.dest_qpn),
                tm.udp_sport.eq(e.udp_sport),
                tm.opcode.eq(opcode),
                tm.psn.eq(psn),
                tm.syndrome.eq(syn),
                tm.msn.eq(msn),
            ]

        # the next packet in the ring is completely there (the ring holds the packets in
        # queue order, so it is the one whose header is to go)
        filled = (n_filled != n_sent) & pkt_err.r_rdy

        with m.FSM(name="rtx"):
            with m.State("IDLE"):
                # only entries the prefetcher has passed or is working on (a READ whose
                # packets are being requested; each header waits for its payload below)
                with m.If((q_t != q_p) | pf_fsm.ongoing("ISSUE")):
                    with m.If(te.kind == RESP_READ):
                        m.d.sync += [rd.eq(te), x_rem.eq(te.len), x_psn.eq(te.psn), x_first.eq(1),
                                     x_bad.eq(0)]
                        # the first packet's header leaves in this cycle if its payload is in
                        # the ring and was read (META's work for the first packet, a cycle
                        # earlier); else META waits for it or sends the NAK of a failed read
                        i_chunk = Mux(te.len > mtu, mtu, te.len)
                        i_ok = (i_chunk == 0) | (filled & ~pkt_err.r_data)
                        m.d.comb += [self.tx.meta.valid.eq(i_ok), tm.paylen.eq(i_chunk)]
                        header(te, Mux(te.len <= mtu, Op.READ_RESPONSE_ONLY.value,
                                       Op.READ_RESPONSE_FIRST.value),
                               te.psn, Syn.ACK.value, te.msn)
                        with m.If(self.tx.meta.valid & self.tx.meta.ready):
                            with m.If(i_chunk != 0):
                                m.d.comb += pkt_err.r_en.eq(1)
                                m.next = "DATA"
                            with m.Else():
                                m.next = "NEXT"
                        with m.Else():
                            m.next = "META"
                    with m.Else():
                        # an atomic's acknowledge: from the descriptor (a duplicate answered
                        # from the replay cache) or the unit's next result; a failed one
                        # (the host failed its read or write, or a payload write before it)
                        # is a NAK, remote operational error (IBA 9.7.5.2.4), QP to ERR
                        pend = te.kind == RESP_ATOMIC_PEND
                        res = AT_RES(at_res.r_data)
                        res_bad = pend & res.err
                        syn = Mux(res_bad, Syn.NAK_REM_OP_ERR.value, te.syn)
                        is_at = ((te.kind == RESP_ATOMIC) | pend) & (syn == Syn.ACK.value)
                        m.d.comb += [
                            self.tx.meta.valid.eq(~pend | at_res.r_rdy),
                            tm.orig.eq(Mux(is_at, Mux(pend, res.orig, te.arg), 0)),
                        ]
                        header(te, Mux(is_at, Op.ATOMIC_ACKNOWLEDGE.value, Op.ACKNOWLEDGE.value),
                               te.psn, syn, te.msn)
                        with m.If(self.tx.meta.valid & self.tx.meta.ready):
                            m.d.comb += [
                                t_adv.eq(1),
                                self.stat_nak.eq(~is_at & (syn != Syn.ACK.value)),
                                at_res.r_en.eq(pend),
                                at_sent.eq(pend),
                            ]
                            with m.If(res_bad & (te.syn == Syn.ACK.value)):
                                m.d.comb += self.stat_dma_err.eq(1)
                                m.d.sync += rd.eq(te)
                                m.next = "ERRQ"
            with m.State("META"):
                has_aeth = x_first | x_last
                # the host failed this packet's read: a NAK (remote operational error, IBA
                # 9.7.5.2.4) at its PSN instead, the rest of the READ is dropped, QP to ERR
                failed = (x_chunk != 0) & filled & (pkt_err.r_data | x_bad)
                with m.If(failed):
                    with m.If(x_bad):
                        m.d.comb += pkt_err.r_en.eq(1)
                        m.next = "SKIP"
                    with m.Else():
                        m.d.comb += self.tx.meta.valid.eq(1)
                        header(rd, Op.ACKNOWLEDGE.value, x_psn, Syn.NAK_REM_OP_ERR.value, rd.msn)
                        with m.If(self.tx.meta.ready):
                            m.d.comb += [pkt_err.r_en.eq(1), self.stat_nak.eq(1),
                                         self.stat_dma_err.eq(1)]
                            m.d.sync += x_bad.eq(1)
                            m.next = "SKIP"
                with m.Else():
                    # store and forward: the header leaves once its payload is in the ring
                    m.d.comb += [self.tx.meta.valid.eq((x_chunk == 0) | filled),
                                 tm.paylen.eq(x_chunk)]
                    header(rd,
                           Mux(x_first,
                               Mux(x_last, Op.READ_RESPONSE_ONLY.value, Op.READ_RESPONSE_FIRST.value),
                               Mux(x_last, Op.READ_RESPONSE_LAST.value, Op.READ_RESPONSE_MIDDLE.value)),
                           x_psn, Mux(has_aeth, Syn.ACK.value, 0), Mux(has_aeth, rd.msn, 0))
                    with m.If(self.tx.meta.valid & self.tx.meta.ready):
                        with m.If(x_chunk != 0):
                            m.d.comb += pkt_err.r_en.eq(1)
                            m.next = "DATA"
                        with m.Else():
                            m.next = "NEXT"
            with m.State("SKIP"):
                # the payload of a packet not sent
                m.d.comb += [r_fire.eq(1), r_free.eq(1)]
                m.d.sync += r_rp.eq(r_rp + 1)
                with m.If(ring_rd.data.last):
                    m.d.sync += n_sent.eq(n_sent + 1)
                    m.next = "NEXT"
            with m.State("DATA"):
                m.d.comb += [
                    self.tx.payload.valid.eq(1),
                    self.tx.payload.payload.eq(ring_rd.data),
                    r_fire.eq(self.tx.payload.ready),
                    r_free.eq(self.tx.payload.ready),
                ]
                with m.If(r_fire):
                    m.d.sync += r_rp.eq(r_rp + 1)
                    with m.If(ring_rd.data.last):
                        # NEXT's work with the last beat (no packet sent in full failed)
                        m.d.sync += [n_sent.eq(n_sent + 1), x_rem.eq(x_rem - x_chunk),
                                     x_psn.eq(x_psn + 1), x_first.eq(0)]
                        with m.If(x_last):
                            m.d.comb += t_adv.eq(1)
                            m.next = "IDLE"
                        with m.Else():
                            m.next = "META"
            with m.State("NEXT"):
                m.d.sync += [x_rem.eq(x_rem - x_chunk), x_psn.eq(x_psn + 1), x_first.eq(0)]
                with m.If(x_last):
                    m.d.comb += t_adv.eq(1)
                    with m.If(x_bad):
                        m.next = "ERRQ"
                    with m.Else():
                        m.next = "IDLE"
                with m.Else():
                    m.next = "META"
            with m.State("ERRQ"):
                m.d.comb += [self.set_err.valid.eq(1), self.set_err.payload.qpn.eq(rd.qpn)]
                with m.If(self.set_err.ready):
                    m.next = "IDLE"
        return m
