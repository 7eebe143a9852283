"""The NIC's host interface: DMA clients to one ordered pair of TLP streams, with counters.

Puts the :class:`~hw.dma.read_engine.DmaReadEngine` and the
:class:`~hw.dma.write_engine.DmaWriteEngine` on the NIC's host port, as a PCIe endpoint's
transaction layer does (PCI Express Base Specification 4.0, 2.4 "Transaction ordering"):

* **down** (NIC -> host): MRd and MWr TLPs merged at TLP boundaries, alternating when both
  wait. An MRd leaves only after every write the write engine had accepted when its client
  asked for the read (the MRd's ``after``): a read never passes an earlier posted write, so
  a client that has handed a write over may read the result back (the atomic unit does).
* **up** (host -> NIC): read completions go to the read engine, write responses to the write
  engine, by the kind in the first beat's header, or beside a completion beat (its ``wrsp``
  field, :data:`~hw.formats.WRSP_SIDE`: a write response takes no beat of its own while
  completions flow); always accepted.

Counters (one-cycle values for :mod:`hw.rnic.counters`): ``stat_down_bytes`` / ``stat_up_bytes``
are the link bytes of the TLP whose first beat moves this cycle, header and framing included
(``tlp_overhead`` per TLP, :mod:`hw.dma.tlp`); ``stat_mrd``, ``stat_mwr``, ``stat_cpld``
count TLPs; ``stat_err`` completions and write responses with an error status; ``stat_bad``
up TLPs that matched nothing (dropped). Occupancies (added every cycle by the counters
``Q_HIF_READS`` / ``Q_HIF_WRITES``): ``q_reads``, read tags in use (MRds sent and not yet
completely answered); ``q_writes``, write TLPs waiting for their response.

Parameters: ``data_bytes``; ``ring_words`` and ``rd_max_len`` (per read client, see the
read engine); ``n_write`` (write clients); ``n_tags``, ``max_read_request``,
``max_payload``, ``write_outstanding``, ``tlp_overhead`` (bytes in [0, 256]).

Ports: ``rd: In(DmaReadPort(W)).array(len(ring_words))``, ``wr: In(DmaWritePort(W)).array(
n_write)``, ``down: Out(TlpDown(W))``, ``up: In(TlpUp(W))``, the ``stat_*`` outputs.
"""

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ..formats import CplKind, TlpStatus
from ..interfaces import DmaReadPort, DmaWritePort, TlpDown, TlpUp
from ..lib.checks import check_int
from .read_engine import DmaReadEngine
from .tlp import down_cost, up_cost
from .write_engine import DmaWriteEngine

__all__ = ["HostInterface"]


class HostInterface(wiring.Component):
    def __init__(self, data_bytes, ring_words, n_write, *, n_tags=32, max_read_request=512,
                 max_payload=256, write_outstanding=32, tlp_overhead=24, rd_max_len=None):
        check_int("tlp_overhead", tlp_overhead, 0, 256)
        self.overhead = tlp_overhead
        self.rd_engine = DmaReadEngine(data_bytes, ring_words, n_tags=n_tags,
                                       max_read_request=max_read_request, max_len=rd_max_len)
        self.wr_engine = DmaWriteEngine(data_bytes, n_write, max_payload=max_payload,
                                        outstanding=write_outstanding)
        self.data_bytes = data_bytes
        super().__init__({
            "rd": In(DmaReadPort(data_bytes)).array(len(ring_words)),
            "wr": In(DmaWritePort(data_bytes)).array(n_write),
            "down": Out(TlpDown(data_bytes)),
            "up": In(TlpUp(data_bytes)),
            "stat_down_bytes": Out(16),
            "stat_up_bytes": Out(16),
            "stat_mrd": Out(1),
            "stat_mwr": Out(1),
            "stat_cpld": Out(1),
            "stat_err": Out(2),
            "stat_bad": Out(1),
            "q_reads": Out(range(n_tags + 1)),
            "q_writes": Out(range(write_outstanding + 1)),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.rd_engine = rde = self.rd_engine
        m.submodules.wr_engine = wre = self.wr_engine
        for c, port in enumerate(self.rd):
            wiring.connect(m, wiring.flipped(port), rde.rd[c])
        for c, port in enumerate(self.wr):
            wiring.connect(m, wiring.flipped(port), wre.wr[c])
        m.d.comb += rde.w_accepted.eq(wre.accepted)

        # ---- down: MRd (one beat) and MWr TLPs, never a read before an earlier write ------
        down = self.down
        mrd, mwr = rde.mrd, wre.mwr
        rd_ok = Signal()
        m.d.comb += rd_ok.eq(mrd.valid & ~(wre.emitted - mrd.payload.after)[15])
        in_wr = Signal()          # inside a multi-beat MWr
        hold = Signal()           # an offer not yet taken keeps its source
        hold_rd = Signal()
        prefer_rd = Signal()
        sel_rd = Signal()
        with m.If(in_wr):
            m.d.comb += sel_rd.eq(0)
        with m.Elif(hold):
            m.d.comb += sel_rd.eq(hold_rd)
        with m.Else():
            m.d.comb += sel_rd.eq(rd_ok & (prefer_rd | ~mwr.valid))
        with m.If(sel_rd):
            m.d.comb += [
                down.valid.eq(rd_ok),
                down.payload.hdr.eq(mrd.payload.hdr),
                down.payload.data.eq(0),
                down.payload.last.eq(1),
                mrd.ready.eq(down.ready & rd_ok),
            ]
        with m.Else():
            m.d.comb += [
                down.valid.eq(mwr.valid),
                down.payload.eq(mwr.payload),
                mwr.ready.eq(down.ready),
            ]
        fire = down.valid & down.ready
        m.d.sync += [hold.eq(down.valid & ~down.ready & ~in_wr), hold_rd.eq(sel_rd)]
        with m.If(fire):
            m.d.sync += in_wr.eq(~sel_rd & ~down.payload.last)
            with m.If(~in_wr):
                m.d.sync += prefer_rd.eq(~sel_rd)
        d_first = ~in_wr
        m.d.comb += [
            self.stat_down_bytes.eq(Mux(fire & d_first, down_cost(down.payload.hdr, self.overhead), 0)),
            self.stat_mrd.eq(fire & sel_rd),
            self.stat_mwr.eq(fire & ~sel_rd & d_first),
        ]

        # ---- up: completions to the read engine, write responses to the write engine -----
        up = self.up
        u_first = Signal(init=1)
        u_kind = Signal(CplKind)
        kind = Mux(u_first, up.payload.hdr.kind, u_kind)
        m.d.comb += up.ready.eq(1)
        with m.If(up.valid):
            m.d.sync += u_first.eq(up.payload.last)
            with m.If(u_first):
                m.d.sync += u_kind.eq(up.payload.hdr.kind)
        is_cpl = kind == CplKind.CPLD
        # a write response: a beat of its own (WRRSP) or beside a completion beat (wrsp)
        side = up.valid & is_cpl & up.payload.wrsp.valid
        rsp = Signal.like(wre.rsp.payload)
        m.d.comb += rsp.eq(up.payload.hdr)
        with m.If(is_cpl):
            m.d.comb += [rsp.kind.eq(CplKind.WRRSP), rsp.tag.eq(up.payload.wrsp.tag),
                         rsp.status.eq(up.payload.wrsp.status)]
        m.d.comb += [
            rde.cpl.valid.eq(up.valid & is_cpl),
            rde.cpl.payload.eq(up.payload),
            wre.rsp.valid.eq((up.valid & ~is_cpl & u_first) | side),
            wre.rsp.payload.eq(rsp),
            self.stat_up_bytes.eq(Mux(up.valid & u_first, up_cost(up.payload.hdr, self.overhead), 0)),
            self.stat_cpld.eq(up.valid & u_first & is_cpl),
            self.stat_err.eq((up.valid & u_first & (up.payload.hdr.status != TlpStatus.SC))
                             + (side & (up.payload.wrsp.status != TlpStatus.SC))),
            self.stat_bad.eq(rde.stat_bad | wre.stat_bad),
            self.q_reads.eq(rde.n_tags - rde.tags_free),
            self.q_writes.eq(wre.pending),
        ]
        return m
