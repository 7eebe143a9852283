"""The responder's per-QP memories: receive state rows, receive producer indices, and the
receive-WQE prefetcher they feed; with the QP events and receive doorbells that write them.

Models the part of an RC responder's QP context that changes with every request
(InfiniBand Architecture Specification vol. 1 rel. 1.4, 9.7.5.1: the expected PSN and the
MSN; 9.7.5.2.2: whether a PSN-sequence NAK was sent; the receive queue's consumer index and
the message in progress, ``RSP_STATE`` of hw/rnic/request_check.py), kept in ``lib.memory``
arrays with one row per QP and combinational read ports (docs/responder.md):

* **row** / **pi**: the state row and the receive producer index of QP ``rd_qpn``, read as
  the responder takes a packet.
* **write-back** (``wb_*``): the responder writes a row back; a QP event that starts the
  receive side has priority on the write port (``wb_free`` is low that cycle: try again).
* **QP events** (``qp_event``, always accepted): to RESET, INIT or RTR the QP's row starts
  afresh (expected PSN ``rq_psn``, the rest 0) and so does its receive-WQE prefetch row (the
  receive queue the event names); RTS and ERR leave both as they are, so that what a QP
  received in RTR stays received after RTR -> RTS (IBA 10.3.1). ``ev_reset`` / ``ev_qpn``
  tell the responder (a packet of that QP in flight belongs to its old incarnation).
* **receive doorbells** (``rq_db``): the QP's producer index is written and the prefetcher
  kicked to read the next WQE; an event to RESET (the QP created or reset) clears the index
  instead and the doorbell waits that cycle.
* **receive WQEs** (``get`` / ``wqe``, ``dma``): :class:`~hw.ctx.rq_prefetch.RqPrefetch`,
  one WQE held per QP, read ahead over ``dma``.

Parameters: ``cfg`` (:class:`~hw.config.NicConfig`).
"""

from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from ..config import NicConfig
from ..formats import QpState
from ..interfaces import DmaReadPort, DoorbellEvent, QpEvent
from ..ctx.rq_prefetch import RqPrefetch
from .request_check import RSP_STATE

__all__ = ["ResponderState"]


class ResponderState(wiring.Component):
    def __init__(self, cfg):
        if not isinstance(cfg, NicConfig):
            raise ValueError(f"cfg must be a hw.config.NicConfig, not {cfg!r}")
        self.cfg = cfg
        qb = self.qpn_bits = max(1, exact_log2(cfg.n_qps))
        self.prefetch = RqPrefetch(cfg)
        get_sig = self.prefetch.signature.members["get"].signature.flip()   # an In member
        wqe_sig = self.prefetch.signature.members["wqe"].signature
        super().__init__({
            "qp_event": In(QpEvent()),
            "rq_db": In(DoorbellEvent()),
            "rd_qpn": In(qb), "row": Out(RSP_STATE), "pi": Out(16),
            "wb_en": In(1), "wb_qpn": In(qb), "wb_row": In(RSP_STATE), "wb_free": Out(1),
            "ev_reset": Out(1), "ev_qpn": Out(qb),
            "get": In(get_sig), "wqe": Out(wqe_sig),
            "dma": Out(DmaReadPort(cfg.data_bytes)),
            "stat_prefetch": Out(1), "stat_demand": Out(1), "stat_wait": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        qb = exact_log2(cfg.n_qps)
        m.submodules.state_mem = st_mem = Memory(shape=RSP_STATE, depth=cfg.n_qps, init=[])
        st_rd = st_mem.read_port(domain="comb")
        st_wr = st_mem.write_port()
        m.submodules.pi_mem = pi_mem = Memory(shape=16, depth=cfg.n_qps, init=[])
        pi_rd = pi_mem.read_port(domain="comb")
        pi_wr = pi_mem.write_port()
        m.submodules.rq_prefetch = rqpf = self.prefetch
        wiring.connect(m, rqpf.dma, wiring.flipped(self.dma))
        wiring.connect(m, wiring.flipped(self.get), rqpf.get)
        wiring.connect(m, rqpf.wqe, wiring.flipped(self.wqe))
        pi_g = pi_mem.read_port(domain="comb")
        pi_k = pi_mem.read_port(domain="comb")
        m.d.comb += [
            pi_g.addr.eq(rqpf.pi_g_addr), rqpf.pi_g.eq(pi_g.data),
            pi_k.addr.eq(rqpf.pi_k_addr), rqpf.pi_k.eq(pi_k.data),
            self.stat_prefetch.eq(rqpf.stat_prefetch),
            self.stat_demand.eq(rqpf.stat_demand),
            self.stat_wait.eq(rqpf.stat_wait),
            st_rd.addr.eq(self.rd_qpn[:qb]), self.row.eq(st_rd.data),
            pi_rd.addr.eq(self.rd_qpn[:qb]), self.pi.eq(pi_rd.data),
        ]

        ev = self.qp_event.payload
        ev_ok = self.qp_event.valid & ((ev.qpn >> qb) == 0)
        # RESET, INIT and RTR start the receive side afresh (RTR: at the given PSN); RTS and
        # ERR keep its state (IBA 10.3.1: a receive in RTR stays consumed after RTR -> RTS)
        ev_reset = ev_ok & (ev.state != QpState.RTS) & (ev.state != QpState.ERR)
        m.d.comb += [self.qp_event.ready.eq(1), self.ev_reset.eq(ev_reset),
                     self.ev_qpn.eq(ev.qpn[:qb]), self.wb_free.eq(~ev_reset)]
        with m.If(ev_reset):
            m.d.comb += [st_wr.addr.eq(ev.qpn[:qb]), st_wr.data.eq(0),
                         st_wr.data.epsn.eq(ev.rq_psn), st_wr.en.eq(1)]
        with m.Else():
            m.d.comb += [st_wr.addr.eq(self.wb_qpn[:qb]), st_wr.data.eq(self.wb_row),
                         st_wr.en.eq(self.wb_en)]

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
                # the prefetcher may read the QP's next receive WQE now
                rqpf.kick.valid.eq(pi_wr.en),
                rqpf.kick.payload.qpn.eq(db.qpn[:qb]),
            ]
        m.d.comb += [rqpf.reset.eq(ev_reset), rqpf.reset_qpn.eq(ev.qpn[:qb]),
                     rqpf.reset_new.eq(ev.new), rqpf.reset_base.eq(ev.rq_base),
                     rqpf.reset_log.eq(ev.rq_log)]
        return m
