"""Asynchronous events: a queue the driver reads over MMIO (``ibv_get_async_event``).

Models the affiliated asynchronous events of IBA vol. 1 11.6.3 (mlx5 delivers them through
an event queue): blocks raise events on ``i`` (:data:`~hw.interfaces.ASYNC_EVENT`: a type of
:class:`~hw.interfaces.AsyncEventType` and the CQN or QPN it concerns); they wait in a FIFO
of ``depth`` entries; reading ``ASYNC_EVENT`` returns the oldest (bit 63 valid, bits 27:24
type, bits 23:0 index) and removes it, or 0 when there is none. An event that finds the FIFO
full is dropped and counted (``stat_lost``); ``stat_event`` pulses for every event raised.

The block sits behind the ``events`` window of the register map (``hw.regmap.register_map``):
its one register is at relative address 0.

Ports: ``bus: In(MmioSignature(3))``, ``i: In(AsyncEventStream())``, ``stat_event``,
``stat_lost``: ``Out(1)``.
"""

from amaranth.hdl import Cat, Const, Module
from amaranth.lib import wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from ..interfaces import ASYNC_EVENT, AsyncEventStream, MmioSignature
from ..lib.csr import window_addr_width

__all__ = ["AsyncEvents"]


class AsyncEvents(wiring.Component):
    def __init__(self, depth=16):
        self.depth = depth
        super().__init__({
            "bus": In(MmioSignature(window_addr_width(8))),
            "i": In(AsyncEventStream()),
            "stat_event": Out(1),
            "stat_lost": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.fifo = fifo = SyncFIFOBuffered(width=ASYNC_EVENT.size, depth=self.depth)
        m.d.comb += [
            self.i.ready.eq(1),
            fifo.w_data.eq(self.i.payload),
            fifo.w_en.eq(self.i.valid),
            self.stat_event.eq(self.i.valid),
            self.stat_lost.eq(self.i.valid & ~fifo.w_rdy),
        ]
        bus = self.bus
        hit = bus.re          # the window is the one register (relative address 0)
        m.d.sync += [bus.rvalid.eq(bus.re), bus.rdata.eq(0)]
        with m.If(hit & fifo.r_rdy):
            ev = ASYNC_EVENT(fifo.r_data)
            m.d.comb += fifo.r_en.eq(1)
            m.d.sync += bus.rdata.eq(Cat(ev.index, ev.type, Const(0, 35), Const(1, 1)))
        return m
