"""The requester's processing units: ``n_pus`` requesters, each serving a share of the QPs.

ConnectX builds requests and handles responses in several processing units that work in
parallel (SMART, ASPLOS 2024, section 2.2: the NIC's processing rate, 111 Mops of 8-byte
READs on a ConnectX-6, is that of its units together; one unit cannot reach it). Issue 8
section 4 asks for the card's peak to emerge from named pipeline resources, not from a cap on
the output. This block is that resource for the requester: ``NicConfig.n_pus`` copies of
:class:`~hw.rnic.requester.Requester` (send engine, response engine, tracker, retry timers, WQE
cache, BlueFlame buffer, payload buffer), each with the state of the QPs whose
``qpn % n_pus`` is its index.

The units are independent: a QP is always served by the same unit, so everything the
InfiniBand specification orders (the packets, responses and completions of one QP) stays in
one unit, and nothing is ordered between units that the specification does not order (the
CQEs of different QPs in one CQ). Around them:

* inbound, routed by QPN: doorbells, BlueFlame WQEs, QP events, and response packets (by
  their destination QP; a packet's payload follows its header to the same unit, through a
  packet FIFO in front of each unit, :class:`~hw.lib.packet_fifo.PacketFifo`: a unit takes a
  header only when its response engine is idle and the payload only after the packet is
  classified, and without the FIFO the other units would wait all that time);
* outbound, merged round robin: request packets (:class:`~hw.lib.arbiter.PacketArbiter`, packets
  whole), completions and error requests (:class:`~hw.lib.arbiter.StreamArbiter`), and the DMA
  ports (:mod:`hw.lib.dma_merge`: the host interface still sees one WQE-fetch, one payload,
  one WQE re-read and one write client, so its counters stay per kind of transfer);
* context lookups: each unit has its own QP-context and MR-cache lookup ports (``qpc_tx``,
  ``qpc_fetch``, ``mr`` are arrays of ``n_pus``), the caches arbitrate.

A unit numbers its QPs locally (``qpn // n_pus``): its memories hold ``n_qps / n_pus`` QPs,
so the state does not grow with the number of units. This block translates QPNs at the
boundary (doorbells, events, BlueFlame, response packets in; completions, error requests,
context lookups and the UDP source port, ``0xC000 | qpn``, out). The WQE cache is split: each
unit has ``wqe_cache_sets / n_pus`` sets, so the node's capacity is the configured one; every
other requester resource named in :class:`~hw.config.NicConfig` (``fetch_depth``,
``bf_entries``, ``pay_buffers``, ``desc_depth``, ``gate_depth``, ``max_outstanding`` per QP)
is per unit. With ``n_pus = 1`` this block is plain wiring around one requester.

Ports: those of :class:`~hw.rnic.requester.Requester` with node-wide QPNs, except that ``qpc_tx``,
``qpc_fetch`` and ``mr`` are arrays of ``n_pus`` lookups and the counter outputs are sums.
"""

from dataclasses import replace

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.utils import ceil_log2, exact_log2

from ..lib.arbiter import PacketArbiter, StreamArbiter
from ..config import NicConfig
from ..interfaces import CQE_REQUEST
from ..lib.dma_merge import DmaReadMerge, DmaWriteMerge
from ..lib.packet_fifo import PacketFifo
from .requester import COUNTS, Requester, requester_ports

__all__ = ["RequesterUnits", "unit_config"]

def unit_config(cfg):
    """The configuration one processing unit is built with: its share of the QPs and of the
    WQE cache's sets. The QP-context cache is the node's (a unit has none): its sets are
    capped at the unit's QPs only so that the unit's configuration passes the checks (64
    QPs in four units of ``connectx6``, whose QP-context cache has 64 sets)."""
    n = cfg.n_pus
    return replace(cfg, n_qps=cfg.n_qps // n, wqe_cache_sets=cfg.wqe_cache_sets // n, n_pus=1,
                   qp_cache_sets=min(cfg.qp_cache_sets, cfg.n_qps // n))


class RequesterUnits(wiring.Component):
    def __init__(self, cfg):
        if not isinstance(cfg, NicConfig):
            raise ValueError(f"cfg must be a NicConfig, not {type(cfg).__name__}")
        self.cfg = cfg
        self.n = n = cfg.n_pus
        self.shift = exact_log2(n)
        self.ucfg = unit_config(cfg)
        ports = requester_ports(cfg, max(1, ceil_log2(cfg.n_qps)),
                                max(1, ceil_log2(cfg.n_mrs)), units=n)
        super().__init__(ports)

    def _glob(self, local, k):
        """The node-wide QPN of a unit's local QPN."""
        return Cat(Const(k, self.shift), local) if self.shift else local

    def elaborate(self, platform):
        m = Module()
        n, s, cfg = self.n, self.shift, self.cfg
        W = cfg.data_bytes
        units = [Requester(self.ucfg) for _ in range(n)]
        for k, u in enumerate(units):
            m.submodules[f"pu{k}"] = u
        if n == 1:
            self._connect_one(m, units[0])
            return m

        def unit_of(qpn):
            return qpn[:s] if s else Const(0, 1)

        # inbound, routed by QPN
        for k, u in enumerate(units):
            m.d.comb += [u.node_id.eq(self.node_id)]
            for src, dst in ((self.db, u.db), (self.qp_event, u.qp_event), (self.bf, u.bf)):
                m.d.comb += [dst.payload.eq(src.payload),
                             dst.payload.qpn.eq(src.payload.qpn >> s),
                             dst.valid.eq(src.valid & (unit_of(src.payload.qpn) == k))]
        for src in (self.db, self.qp_event):
            with m.Switch(unit_of(src.payload.qpn)):
                for k, u in enumerate(units):
                    with m.Case(k):
                        dst = u.db if src is self.db else u.qp_event
                        m.d.comb += src.ready.eq(dst.ready)
        self._route_rx(m, units)

        # context lookups: the unit's local index, node-wide
        for k, u in enumerate(units):
            for mine, theirs in ((self.qpc_tx[k], u.qpc_tx), (self.qpc_fetch[k], u.qpc_fetch)):
                m.d.comb += [mine.req.valid.eq(theirs.req.valid),
                             mine.req.payload.index.eq(self._glob(theirs.req.payload.index, k)),
                             theirs.req.ready.eq(mine.req.ready)]
                wiring.connect(m, wiring.flipped(mine.resp), theirs.resp)
            wiring.connect(m, wiring.flipped(self.mr[k]), u.mr)

        # outbound: packets (the UDP source port names the node-wide QPN), completions and
        # error requests, merged round robin
        m.submodules.tx_arb = tx_arb = PacketArbiter(W, n)
        for k, u in enumerate(units):
            a = tx_arb.i[k]
            sport = u.tx.meta.payload.udp_sport
            m.d.comb += [
                a.meta.valid.eq(u.tx.meta.valid), u.tx.meta.ready.eq(a.meta.ready),
                a.meta.payload.eq(u.tx.meta.payload),
                a.meta.payload.udp_sport.eq(Const(0xC000, 16) | self._glob(sport[:14 - s], k)),
            ]
            wiring.connect(m, u.tx.payload, a.payload)
        wiring.connect(m, tx_arb.o, wiring.flipped(self.tx))

        m.submodules.cqe_arb = cqe_arb = StreamArbiter(CQE_REQUEST, n)
        m.submodules.err_arb = err_arb = StreamArbiter(data.StructLayout({"qpn": 24}), n)
        for k, u in enumerate(units):
            for src, a in ((u.cqe, cqe_arb.i[k]), (u.set_err, err_arb.i[k])):
                m.d.comb += [a.valid.eq(src.valid), src.ready.eq(a.ready),
                             a.payload.eq(src.payload)]
            m.d.comb += [cqe_arb.i[k].payload.cqe.qpn.eq(self._glob(u.cqe.payload.cqe.qpn, k)),
                         err_arb.i[k].payload.qpn.eq(self._glob(u.set_err.payload.qpn, k))]
        wiring.connect(m, cqe_arb.o, wiring.flipped(self.cqe))
        wiring.connect(m, err_arb.o, wiring.flipped(self.set_err))

        # DMA: one client port each for WQE fetches, payload reads, WQE re-reads and writes
        rd_depth = min(256, 1 << ceil_log2(16 * n))
        wr_depth = min(256, 1 << ceil_log2(32 * n))
        for name in ("wqe_rd", "pay_rd", "reread_rd"):
            merge = m.submodules[f"{name}_merge"] = DmaReadMerge(W, n, rd_depth)
            for k, u in enumerate(units):
                wiring.connect(m, getattr(u, name), merge.i[k])
            wiring.connect(m, merge.o, wiring.flipped(getattr(self, name)))
        m.submodules.wr_merge = wr_merge = DmaWriteMerge(W, n, wr_depth)
        for k, u in enumerate(units):
            wiring.connect(m, u.dma_wr, wr_merge.i[k])
        wiring.connect(m, wr_merge.o, wiring.flipped(self.dma_wr))

        # counters: the units' increments added up
        for name, _ in COUNTS:
            m.d.comb += getattr(self, name).eq(sum(getattr(u, name) for u in units))
        return m

    def _connect_one(self, m, u):
        """One unit: every port straight through (the design of a single requester)."""
        for name in ("db", "qp_event", "rx", "bf"):
            wiring.connect(m, wiring.flipped(getattr(self, name)), getattr(u, name))
        for name in ("wqe_rd", "pay_rd", "reread_rd", "dma_wr", "tx", "set_err", "cqe"):
            wiring.connect(m, getattr(u, name), wiring.flipped(getattr(self, name)))
        for name in ("qpc_tx", "qpc_fetch", "mr"):
            wiring.connect(m, getattr(u, name), wiring.flipped(getattr(self, name)[0]))
        m.d.comb += u.node_id.eq(self.node_id)
        for name, _ in COUNTS:
            m.d.comb += getattr(self, name).eq(getattr(u, name))

    def _route_rx(self, m, units):
        """Response packets to the unit of their destination QP: the header picks the unit,
        the payload beats (``ceil(paylen / W)``) follow it there, through a packet FIFO in
        front of each unit (``pu_rx_headers``, ``pu_rx_beats``), so that a unit whose
        response engine is busy does not hold the packets of the other units."""
        s, W = self.shift, self.cfg.data_bytes
        rx = self.rx
        meta = rx.meta.payload
        in_pay = Signal()
        owner = Signal(range(max(self.n, 2)))
        left = Signal(16)
        unit = Signal(range(max(self.n, 2)))
        m.d.comb += unit.eq(meta.dest_qpn[:s] if s else 0)
        fifos = []
        for k, u in enumerate(units):
            f = m.submodules[f"rx_fifo{k}"] = PacketFifo(W, self.cfg.pu_rx_headers,
                                                         self.cfg.pu_rx_beats)
            fifos.append(f.i)
            wiring.connect(m, f.o, u.rx)
            m.d.comb += [
                f.i.meta.payload.eq(meta),
                f.i.meta.payload.dest_qpn.eq(meta.dest_qpn >> s),
                f.i.meta.valid.eq(rx.meta.valid & ~in_pay & (unit == k)),
                f.i.payload.payload.eq(rx.payload.payload),
                f.i.payload.valid.eq(rx.payload.valid & in_pay & (owner == k)),
            ]
        with m.Switch(Mux(in_pay, owner, unit)):
            for k, f in enumerate(fifos):
                with m.Case(k):
                    m.d.comb += [rx.meta.ready.eq(f.meta.ready & ~in_pay),
                                 rx.payload.ready.eq(f.payload.ready & in_pay)]
        with m.If(rx.meta.valid & rx.meta.ready):
            beats = (meta.paylen + W - 1) // W
            m.d.sync += [owner.eq(unit), left.eq(beats), in_pay.eq(meta.paylen != 0)]
        with m.If(rx.payload.valid & rx.payload.ready):
            m.d.sync += left.eq(left - 1)
            with m.If(left == 1):
                m.d.sync += in_pay.eq(0)
