"""Send work-queue element fetch.

Models how the requester reads a posted send work request (InfiniBand Architecture
Specification vol. 1 rel. 1.4, 11.4 "Work request processing"; the 64-byte element is
:data:`hw.formats.WQE`) from the host send queue with one DMA read, and hands it on decoded.
One fetch is in flight at a time.

Ports
    req   In(stream {addr: 64})     host address of the WQE (64 bytes are read)
    dma   Out(DmaReadClient(W))     DMA read port (tag 0)
    wqe   Out(stream WQE)           the decoded WQE, one per request, in order
"""

from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from . import formats
from .interfaces import DmaReadClient

__all__ = ["WqeFetch"]


class WqeFetch(wiring.Component):
    def __init__(self, data_bytes):
        if (not isinstance(data_bytes, int) or isinstance(data_bytes, bool)
                or not 8 <= data_bytes <= 64 or data_bytes & (data_bytes - 1)):
            raise ValueError(f"data_bytes must be a power of two in [8, 64], not {data_bytes!r}")
        self.data_bytes = data_bytes
        super().__init__({
            "req": In(stream.Signature(data.StructLayout({"addr": 64}))),
            "dma": Out(DmaReadClient(data_bytes)),
            "wqe": Out(stream.Signature(formats.WQE)),
        })

    def elaborate(self, platform):
        m = Module()
        W = self.data_bytes
        nbeats = formats.WQE_BYTES // W
        buf = Signal(8 * formats.WQE_BYTES)

        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += [
                    self.dma.req.valid.eq(self.req.valid),
                    self.dma.req.payload.addr.eq(self.req.payload.addr),
                    self.dma.req.payload.len.eq(formats.WQE_BYTES),
                    self.dma.req.payload.tag.eq(0),
                    self.req.ready.eq(self.dma.req.ready),
                ]
                with m.If(self.req.valid & self.dma.req.ready):
                    m.next = "COLLECT"
            with m.State("COLLECT"):
                m.d.comb += self.dma.resp.ready.eq(1)
                with m.If(self.dma.resp.valid):
                    # beats arrive lowest bytes first: shift in from the top
                    if nbeats == 1:
                        m.d.sync += buf.eq(self.dma.resp.payload.data)
                    else:
                        m.d.sync += buf.eq(Cat(buf[8 * W:], self.dma.resp.payload.data))
                    with m.If(self.dma.resp.payload.last):
                        m.next = "OUT"
            with m.State("OUT"):
                m.d.comb += [
                    self.wqe.valid.eq(1),
                    self.wqe.payload.eq(buf),
                ]
                with m.If(self.wqe.ready):
                    m.next = "IDLE"
        return m
