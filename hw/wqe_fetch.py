"""Send work-queue element fetch.

Models how the requester reads posted send work requests (InfiniBand Architecture
Specification vol. 1 rel. 1.4, 11.4 "Work request processing"; the 64-byte element is
:data:`hw.formats.WQE`) from the host send queue: one DMA read of ``count`` consecutive WQEs,
which come out decoded, one by one, in order.

Every requested WQE has a reserved slot in an internal FIFO of ``depth`` entries, so the
DMA response is always accepted (never back-pressured): a stalled WQE consumer cannot block
the host's in-order read responses for other DMA clients. A request is accepted only while
``count`` slots are free; ``count`` must be in [1, depth].

Ports
    req   In(stream {addr: 64, count: bits_for(depth)})  first WQE's host address, WQEs to read
    dma   Out(DmaReadClient(W))                           DMA read port (tag 0)
    wqe   Out(stream WQE)                                 the decoded WQEs, in order
"""

from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out
from amaranth.utils import bits_for

from . import formats
from .interfaces import DmaReadClient

__all__ = ["WqeFetch"]


class WqeFetch(wiring.Component):
    def __init__(self, data_bytes, depth=4):
        if (not isinstance(data_bytes, int) or isinstance(data_bytes, bool)
                or not 8 <= data_bytes <= 64 or data_bytes & (data_bytes - 1)):
            raise ValueError(f"data_bytes must be a power of two in [8, 64], not {data_bytes!r}")
        if not isinstance(depth, int) or isinstance(depth, bool) or not 1 <= depth <= 64:
            raise ValueError(f"depth must be an integer in [1, 64], not {depth!r}")
        self.data_bytes = data_bytes
        self.depth = depth
        super().__init__({
            "req": In(stream.Signature(data.StructLayout({"addr": 64, "count": bits_for(depth)}))),
            "dma": Out(DmaReadClient(data_bytes)),
            "wqe": Out(stream.Signature(formats.WQE)),
        })

    def elaborate(self, platform):
        m = Module()
        W = self.data_bytes
        K = self.depth
        nbeats = formats.WQE_BYTES // W

        m.submodules.fifo = fifo = SyncFIFOBuffered(width=formats.WQE.size, depth=K)
        reserved = Signal(range(K + 1))      # WQEs requested and not yet taken by the consumer
        take_req = Signal()
        take_out = Signal()

        cnt = self.req.payload.count
        m.d.comb += [
            self.dma.req.valid.eq(self.req.valid & (cnt <= K - reserved)),
            self.dma.req.payload.addr.eq(self.req.payload.addr),
            self.dma.req.payload.len.eq(cnt * formats.WQE_BYTES),
            self.dma.req.payload.tag.eq(0),
            self.req.ready.eq(self.dma.req.ready & (cnt <= K - reserved)),
            take_req.eq(self.req.valid & self.req.ready),
        ]

        # assembly: beats arrive lowest bytes first and are shifted in from the top
        buf = Signal(8 * formats.WQE_BYTES)
        beat = Signal(range(nbeats))
        full = Signal(8 * formats.WQE_BYTES)
        if nbeats == 1:
            m.d.comb += full.eq(self.dma.resp.payload.data)
        else:
            m.d.comb += full.eq(Cat(buf[8 * W:], self.dma.resp.payload.data))
        m.d.comb += [
            self.dma.resp.ready.eq(1),
            fifo.w_data.eq(full),
            fifo.w_en.eq(self.dma.resp.valid & (beat == nbeats - 1)),
        ]
        with m.If(self.dma.resp.valid):
            m.d.sync += buf.eq(full)
            if nbeats > 1:
                m.d.sync += beat.eq(Mux(beat == nbeats - 1, 0, beat + 1))

        m.d.comb += [
            self.wqe.valid.eq(fifo.r_rdy),
            self.wqe.payload.eq(fifo.r_data),
            fifo.r_en.eq(self.wqe.ready),
            take_out.eq(self.wqe.valid & self.wqe.ready),
        ]
        m.d.sync += reserved.eq(reserved + Mux(take_req, cnt, 0) - take_out)
        return m
