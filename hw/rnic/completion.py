"""Completion engine: writes completion-queue entries to host CQ rings.

Models the completion-queue part of the verbs interface (InfiniBand Architecture
Specification vol. 1 rel. 1.4, 11.4.2 "Completion queue operations" and 10.8 "Completion
queues"): each work completion becomes a 32-byte :data:`hw.formats.CQE` written by DMA at
``base + (pi mod 2**log_size) * 32``. The owner bit (flags bit 7) is 1 on the first pass
through the ring, 0 on the second, and so on, so that the consumer polls for new entries
without reading a NIC register. The driver returns entries through the CQ doorbell (its
consumer index).

CQ errors (IBA C11-37 and C9-218, 11.6.3.1): a CQ whose ring is full when a completion
arrives (``pi - ci == 2**log_size``: an overrun), or one of whose CQE writes the host
answered with an error, goes into the error state: one ``CQ_ERR`` asynchronous event is
raised (``event``), no completion is added to it any more (each one dropped is counted,
``stat_overflow``) and the QP of every completion that finds it in error is moved to ERR
(``err_qp``), as "the affected QP shall be moved to the error state". SET_CQ (``cq_event``)
restarts the CQ out of the error state.

Producer and consumer indices are 16 bits, free running, so rings of up to 2**15 entries
are supported. They stay on chip (in memories); the CQ's context (ring base, log2 size)
lives in host memory behind the CQ-context cache (:mod:`hw.ctx.cq_cache`) and is looked up
(request / response) for every completion, before its CQE is placed. A context that
could not be read (the cache's fill failed) puts the CQ in error, like a failed CQE write.

The engine is a two-stage pipeline, so that the lookups' latency is not paid per CQE:

* the **front** takes a completion request (``i0`` / ``i1`` round robin), asks for its CQ's
  context on the next of ``cfg.cq_lookups`` lookup ports (in turn: each port has at most one
  lookup outstanding, hw/lib/answer_ports.py) and queues the request, in order;
* the **back** takes the queued requests in order, each with the answer of the port it was
  asked on, in the cycle the answer is there: it checks the CQ (error, overrun), places the
  CQE (producer index, owner bit) and writes it (``32 / W`` beats), or sends the QP to ERR.
  A CQE of ``W`` >= 32 bytes is one beat, written in the cycle it is checked: the back stage
  places a CQE per cycle (narrower: the check, then a cycle per beat).

CQEs are written in the order their requests were taken, as before; the lookups of the next
``cq_lookups - 1`` requests are in flight while a CQE is written. CQ_ERR events leave
through ``event`` as soon as a CQ is in error, beside the pipeline.

Ports
    i0, i1     In(CqeRequest())            completion requests, served round-robin
    cq         Out(CtxLookup(cqn_bits, CQ_CTX)).array(cfg.cq_lookups)
                                           CQ context lookups (request / response), in turn
    cq_event   In(CqEvent())               always ready: the CQ restarts (pi = ci = 0,
                                           error cleared)
    cq_db      In(stream {cqn: 16, ci: 16}) always ready: new consumer index
    dma_wr     Out(DmaWritePort(W))        the CQE (tag: the CQN), 32 bytes in 32/W beats
    err_qp     Out(QpErrRequest())         QPs to move to ERR (their CQ is in error)
    event      Out(AsyncEventStream())     CQ_ERR events
    cq_err     Out(n_cqs)                  error state of each CQ
    stat_cqe, stat_overflow  Out(1)        one-cycle pulses per written / dropped CQE
    stat_busy                Out(1)        high while a request is queued or the back stage
                                           writes a CQE or sends a QP to ERR
"""

from amaranth.hdl import Const, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from .. import formats, regmap
from ..config import NicConfig
from ..lib.encoder import first_set
from ..lib.mem_array import MemArray
from ..interfaces import (CQE_REQUEST, AsyncEventStream, AsyncEventType, CqeRequest, CqEvent, CtxLookup,
                         DmaWritePort, QpErrRequest)

__all__ = ["Completion", "CQ_DB"]

CQ_DB = data.StructLayout({"cqn": 16, "ci": 16})


class Completion(wiring.Component):
    def __init__(self, cfg):
        if not isinstance(cfg, NicConfig):
            raise ValueError(f"cfg must be a NicConfig, not {type(cfg).__name__}")
        self.cfg = cfg
        self.cqn_bits = ceil_log2(cfg.n_cqs)
        self.n_lk = cfg.cq_lookups
        W = cfg.data_bytes
        super().__init__({
            "i0": In(CqeRequest()),
            "i1": In(CqeRequest()),
            "cq": Out(CtxLookup(max(1, self.cqn_bits), regmap.CQ_CTX)).array(self.n_lk),
            "cq_event": In(CqEvent()),
            "cq_db": In(stream.Signature(CQ_DB)),
            "dma_wr": Out(DmaWritePort(W)),
            "err_qp": Out(QpErrRequest()),
            "event": Out(AsyncEventStream()),
            "cq_err": Out(cfg.n_cqs),
            "stat_cqe": Out(1),
            "stat_overflow": Out(1),
            "stat_busy": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        W = cfg.data_bytes
        n = cfg.n_cqs
        P = self.n_lk
        cb = max(1, self.cqn_bits)
        nbeats = max(1, formats.CQE_BYTES // W)
        beat_bytes = min(W, formats.CQE_BYTES)
        wr, done = self.dma_wr.wr, self.dma_wr.done

        # Producer / consumer indices per CQ, written through write ports:
        # "fsm" the CQE writer, "db" the CQ doorbell, "ev" a (re)created CQ, which wins.
        # In memories whose valid bits a reset clears (hw/lib/mem_array.py), read at cur.
        m.submodules.q_pi = pi = MemArray(n, 16, ("fsm", "ev"), ("cur",))
        m.submodules.q_ci = ci = MemArray(n, 16, ("db", "ev"), ("cur",))
        bad = Signal(n)            # CQ in error
        told = Signal(n)           # its CQ_ERR event has been raised
        m.d.comb += self.cq_err.eq(bad)

        # ---- front: take a request, ask for its CQ's context on the next port, queue it
        pend_layout = CQE_REQUEST
        m.submodules.pend = pend = SyncFIFOBuffered(width=pend_layout.size, depth=P)
        prio = Signal()            # 0: i0 first, 1: i1 first
        ask = Signal(range(P))     # the port the next lookup goes on
        take1 = Signal()
        m.d.comb += take1.eq(self.i1.valid & (prio | ~self.i0.valid))
        src = Signal(pend_layout)
        m.d.comb += src.eq(Mux(take1, self.i1.payload.as_value(), self.i0.payload.as_value()))
        offer = Signal()
        m.d.comb += offer.eq((self.i0.valid | self.i1.valid) & pend.w_rdy)
        asked = Signal()
        for k, lk in enumerate(self.cq):
            m.d.comb += [lk.req.valid.eq(offer & (ask == k)), lk.req.payload.index.eq(src.cqn[:cb])]
            with m.If(ask == k):
                m.d.comb += asked.eq(lk.req.valid & lk.req.ready)
        m.d.comb += [self.i1.ready.eq(asked & take1), self.i0.ready.eq(asked & ~take1),
                     pend.w_en.eq(asked), pend.w_data.eq(src)]
        with m.If(asked):
            m.d.sync += [prio.eq(~take1), ask.eq(Mux(ask == P - 1, 0, ask + 1))]

        # ---- back: the oldest request with its answer
        head = Signal(pend_layout)
        m.d.comb += head.eq(pend.r_data)
        serve = Signal(range(P))   # the port whose answer the oldest request waits for
        ans_v = Signal()
        ans = Signal.like(self.cq[0].resp.payload)
        for k, lk in enumerate(self.cq):
            with m.If(serve == k):
                m.d.comb += [ans_v.eq(lk.resp.valid), ans.eq(lk.resp.payload)]
        ctx = Signal(regmap.CQ_CTX)
        m.d.comb += ctx.eq(ans.data)
        cur = Signal(self.cqn_bits)
        m.d.comb += cur.eq(head.cqn[:self.cqn_bits])
        size = Signal(33)
        mask = Signal(32)
        m.d.comb += [size.eq(Const(1, 33) << ctx.log_size), mask.eq(size - 1)]
        used = Signal(16)
        m.d.comb += used.eq(pi[cur] - ci[cur])
        full = Signal()
        m.d.comb += full.eq(used == size)
        owner = Signal()
        m.d.comb += owner.eq(~(pi[cur] >> ctx.log_size)[0])

        wcq = Signal(self.cqn_bits)     # the CQ of the CQE being written (its write's tag)
        kqpn = Signal.like(head.cqe.qpn)
        addr = Signal(64)
        wdata = Signal(8 * formats.CQE_BYTES)
        beat = Signal(range(nbeats + 1))

        # a CQ in error whose event has not been raised yet: raised beside the pipeline
        untold = bad & ~told
        ev_any, ev_cq = first_set(m, untold, "ev")
        set_bad = Signal(n)            # overrun or completion for a CQ in error
        set_bad_wr = Signal(n)         # a CQE write failed
        set_told = Signal(n)
        m.d.comb += [self.event.valid.eq(ev_any),
                     self.event.payload.type.eq(AsyncEventType.CQ_ERR),
                     self.event.payload.index.eq(ev_cq)]
        with m.If(self.event.valid & self.event.ready):
            m.d.comb += set_told.eq(1 << ev_cq)

        with m.FSM() as fsm:
            with m.State("LOOK"):
                go = pend.r_rdy & ans_v
                # a context that could not be read from ICM, an overrun, or a CQ already in
                # error: the CQ is (stays) in error, nothing more is added to it, and the QP
                # that needed it goes to ERR
                failed = ans.err | full | bad.bit_select(cur, 1)
                flags = Signal(8)
                m.d.comb += flags.eq((head.cqe.flags & 0x7F) | (owner << 7))
                entry = Signal(formats.CQE)
                m.d.comb += [entry.eq(head.cqe), entry.flags.eq(flags)]
                place = Signal(64)
                m.d.comb += place.eq(ctx.base + ((pi[cur] & mask) * formats.CQE_BYTES))
                if nbeats == 1:
                    # a CQE that is one beat is written in this cycle: one CQE per cycle
                    m.d.comb += [
                        wr.valid.eq(go & ~failed),
                        wr.payload.addr.eq(place),
                        wr.payload.len.eq(formats.CQE_BYTES),
                        wr.payload.tag.eq(cur),
                        wr.payload.data.eq(entry.as_value()),
                        wr.payload.nbytes.eq(beat_bytes),
                        wr.payload.last.eq(1),
                        wr.payload.hint.eq(1),          # the host's event line follows CQEs
                    ]
                    take = go & (failed | wr.ready)
                else:
                    take = go
                with m.If(take):
                    for k, lk in enumerate(self.cq):
                        with m.If(serve == k):
                            m.d.comb += lk.resp.ready.eq(1)
                    m.d.comb += pend.r_en.eq(1)
                    m.d.sync += [serve.eq(Mux(serve == P - 1, 0, serve + 1)),
                                 kqpn.eq(head.cqe.qpn), wcq.eq(cur)]
                    with m.If(failed):
                        m.d.comb += [self.stat_overflow.eq(1), set_bad.eq(1 << cur)]
                        m.next = "KILL_QP"
                    with m.Else():
                        m.d.comb += pi.write("fsm", cur, pi[cur] + 1)
                        m.d.comb += self.stat_cqe.eq(1)
                        if nbeats > 1:
                            m.d.sync += [addr.eq(place), wdata.eq(entry.as_value()), beat.eq(0)]
                            m.next = "WRITE"
            with m.State("KILL_QP"):
                m.d.comb += [self.err_qp.valid.eq(1), self.err_qp.payload.qpn.eq(kqpn)]
                with m.If(self.err_qp.ready):
                    m.next = "LOOK"
            with m.State("WRITE"):
                m.d.comb += [
                    wr.valid.eq(1),
                    wr.payload.addr.eq(addr),
                    wr.payload.len.eq(formats.CQE_BYTES),
                    wr.payload.tag.eq(wcq),
                    wr.payload.data.eq(wdata[:8 * beat_bytes]),
                    wr.payload.nbytes.eq(beat_bytes),
                    wr.payload.last.eq(beat == nbeats - 1),
                    wr.payload.hint.eq(1),          # the host's event line follows CQEs
                ]
                with m.If(wr.ready):
                    m.d.sync += [wdata.eq(wdata >> (8 * beat_bytes)), beat.eq(beat + 1)]
                    with m.If(beat == nbeats - 1):
                        m.next = "LOOK"

        # a CQE write the host refused: the CQ is in error (a CQ protection error)
        with m.If(done.valid & done.payload.err):
            m.d.comb += set_bad_wr.eq(1 << done.payload.tag[:self.cqn_bits])

        # Host-side updates win over the engine's own pi increment in the same cycle.
        m.d.comb += [self.cq_db.ready.eq(1), self.cq_event.ready.eq(1)]
        clear = Signal(n)
        with m.If(self.cq_db.valid):
            m.d.comb += ci.write("db", self.cq_db.payload.cqn[:self.cqn_bits],
                                 self.cq_db.payload.ci)
        with m.If(self.cq_event.valid):
            q = self.cq_event.payload.cqn[:self.cqn_bits]
            m.d.comb += pi.write("ev", q, 0) + ci.write("ev", q, 0)
            m.d.comb += clear.eq(1 << q)
        m.d.sync += [bad.eq((bad | set_bad | set_bad_wr) & ~clear),
                     told.eq((told | set_told) & ~clear)]
        m.d.comb += pi.read_addrs() + ci.read_addrs()
        m.d.comb += self.stat_busy.eq(~fsm.ongoing("LOOK") | pend.r_rdy)
        return m
