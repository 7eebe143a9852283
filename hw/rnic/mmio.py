"""The NIC's MMIO front end: host register accesses with back-pressure, and BlueFlame writes.

Models the target side of the host's programmed I/O into the NIC's BAR (PCI Express Base
Specification 4.0, 2.2: memory writes from the root complex are posted, reads are answered
with a completion): requests arrive on ``host.req`` (:func:`~hw.interfaces.MmioPort`) and are
applied to the NIC's internal register bus (:class:`~hw.interfaces.MmioSignature`, shared
by the context, doorbell, counter and event blocks), one per cycle:

* an 8-byte write (``len`` <= 8) is one bus write;
* a 64-byte write to the BlueFlame window (``BLUEFLAME_BASE + 64 * r``) goes whole to
  ``bf`` (the doorbell block: mlx5's BlueFlame, a WQE written into a UAR write-combining
  buffer); a wide write elsewhere is refused and counted (``stat_bad``);
* a read is one bus read; the request is taken when its data has been handed back on
  ``host.rdata``, so a read in flight back-pressures the requests behind it, as does a
  BlueFlame write that ``bf`` does not take.

Ports: ``host: In(MmioPort())``, ``bus: Out(MmioSignature())``, ``bf: Out(stream {addr: 16,
data: 512})``, ``stat_write``, ``stat_read``, ``stat_bad``: ``Out(1)``, ``stat_write_len:
Out(7)`` (bytes of the write taken this cycle).
"""

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ..interfaces import MmioPort, MmioSignature
from ..regmap import BLUEFLAME_BASE, BLUEFLAME_BYTES

__all__ = ["MmioFrontend", "BF_WRITE"]

BF_WRITE = data.StructLayout({"addr": 16, "data": 8 * BLUEFLAME_BYTES})


class MmioFrontend(wiring.Component):
    def __init__(self):
        super().__init__({
            "host": In(MmioPort()),
            "bus": Out(MmioSignature()),
            "bf": Out(stream.Signature(BF_WRITE)),
            "stat_write": Out(1),
            "stat_write_len": Out(7),
            "stat_read": Out(1),
            "stat_bad": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        req = self.host.req
        r = req.payload
        bus = self.bus
        wide = r.len > 8
        in_bf = r.addr >= BLUEFLAME_BASE
        m.d.comb += [bus.addr.eq(r.addr), bus.wdata.eq(r.data[:64]),
                     self.bf.payload.addr.eq(r.addr), self.bf.payload.data.eq(r.data)]
        rd_wait = Signal()             # a bus read was issued, its data not yet handed back
        rd_v = Signal()
        rd_data = Signal(64)
        m.d.comb += [self.host.rdata.valid.eq(rd_v), self.host.rdata.payload.data.eq(rd_data)]
        with m.If(self.host.rdata.valid & self.host.rdata.ready):
            m.d.sync += rd_v.eq(0)
        with m.If(bus.rvalid & rd_wait):
            m.d.sync += [rd_v.eq(1), rd_data.eq(bus.rdata), rd_wait.eq(0)]

        with m.If(req.valid):
            with m.If(r.we & wide):
                with m.If(in_bf & (r.len == BLUEFLAME_BYTES)):
                    m.d.comb += [self.bf.valid.eq(1), req.ready.eq(self.bf.ready)]
                with m.Else():
                    m.d.comb += [req.ready.eq(1), self.stat_bad.eq(1)]
            with m.Elif(r.we):
                m.d.comb += [bus.we.eq(1), req.ready.eq(1)]
            with m.Else():
                # a read: issue it once, take the request when its data is handed back
                with m.If(~rd_wait & ~rd_v):
                    m.d.comb += bus.re.eq(1)
                    m.d.sync += rd_wait.eq(1)
                m.d.comb += req.ready.eq(rd_v & self.host.rdata.ready)
        fire = req.valid & req.ready
        m.d.comb += [self.stat_write.eq(fire & r.we), self.stat_read.eq(fire & ~r.we),
                     self.stat_write_len.eq(Mux(fire & r.we, r.len, 0))]
        return m
