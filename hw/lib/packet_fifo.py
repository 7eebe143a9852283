"""A packet FIFO: headers and payload beats queued apart, so that a receiver takes a packet's
header only when it is ready for it while the sender has already moved on.

A :func:`~hw.interfaces.PacketOut` stream is a header (``meta``) followed by its payload beats
(``payload``, the last one marked). Where one sender feeds several receivers (the response
packets that the processing units' router hands to each unit, hw/rnic/requester_units.py),
a receiver that takes a header only when its engine is idle and the payload only later,
once the engine has classified the packet, holds the shared input for all that time: the
other receivers wait even if they are idle (head-of-line blocking). This FIFO takes headers
and beats as they come, up to ``headers`` headers and ``beats`` payload beats, and hands them
on in the same order. Headers and beats are queued apart: a packet's beats follow its header
in ``payload``'s order, which is the order in which the receiver asks for them (it takes a
packet's whole payload before the next header's).

Parameters: ``data_bytes`` (data path width, a power of two in [1, 512]), ``headers`` (a
power of two in [2, 256]), ``beats`` (a power of two in [2, 1024]).

Ports: ``i: In(PacketOut(data_bytes))``, ``o: Out(PacketOut(data_bytes))``.
"""

from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.wiring import In, Out

from .. import formats
from ..interfaces import PacketOut, beat_layout
from .checks import check_pow2

__all__ = ["PacketFifo"]


class PacketFifo(wiring.Component):
    def __init__(self, data_bytes, headers, beats):
        check_pow2("data_bytes", data_bytes, 1, 512)
        check_pow2("headers", headers, 2, 256)
        check_pow2("beats", beats, 2, 1024)
        self.data_bytes = data_bytes
        self.headers = headers
        self.beats = beats
        super().__init__({"i": In(PacketOut(data_bytes)), "o": Out(PacketOut(data_bytes))})

    def elaborate(self, platform):
        m = Module()
        for name, layout, depth in (("meta", formats.PKT_META, self.headers),
                                    ("payload", beat_layout(self.data_bytes), self.beats)):
            fifo = m.submodules[name] = SyncFIFO(width=layout.size, depth=depth)
            src, dst = getattr(self.i, name), getattr(self.o, name)
            m.d.comb += [fifo.w_data.eq(src.payload), fifo.w_en.eq(src.valid),
                         src.ready.eq(fifo.w_rdy),
                         dst.payload.eq(fifo.r_data), dst.valid.eq(fifo.r_rdy),
                         fifo.r_en.eq(dst.ready)]
        return m
