"""Send work-queue element fetch.

Models how the requester reads posted send work requests (InfiniBand Architecture
Specification vol. 1 rel. 1.4, 11.4 "Work request processing"; the 64-byte element is
:data:`hw.formats.WQE`) from the host send queue: one DMA read of ``count`` consecutive WQEs,
which come out decoded, one by one, in order.

Every requested WQE has a reserved slot in an internal FIFO of ``depth`` entries, so the
DMA data is always accepted at once. A request is accepted only while ``count`` slots are
free; ``count`` must be in [1, depth]. If the host fails the read (``err`` on the DMA data,
:func:`~hw.interfaces.DmaReadPort`), every WQE it covered comes out with ``err`` set and its
contents must not be used (the requester completes it with ``LOC_QP_OP_ERR``).

A request with ``bf`` set carries its WQE (one, ``count`` = 1: a WQE the host wrote by
BlueFlame, ``hw/rnic/doorbell.py``) and reads nothing: the WQE waits in a FIFO of ``depth``
entries and comes out in request order with the fetched ones, so that the consumer sees
the WQEs of all requests in the order they were made whatever the DMA latency.

Ports
    req   In(stream {addr: 64, count: bits_for(depth), bf: 1, wqe: WQE})
                                                          first WQE's host address, WQEs to
                                                          read (or the BlueFlame WQE)
    dma   Out(DmaReadPort(W))                             DMA read port (tag 0)
    wqe   Out(stream {wqe: WQE, err: 1})                  the decoded WQEs, in order
"""

from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out
from amaranth.utils import bits_for

from .. import formats
from ..interfaces import DmaReadPort

__all__ = ["WqeFetch", "FETCHED", "fetch_request_layout"]

#: A fetched WQE and whether the host failed its read.
FETCHED = data.StructLayout({"wqe": formats.WQE, "err": 1})


def fetch_request_layout(depth):
    return data.StructLayout({"addr": 64, "count": bits_for(depth), "bf": 1,
                              "wqe": formats.WQE})


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
            "req": In(stream.Signature(fetch_request_layout(depth))),
            "dma": Out(DmaReadPort(data_bytes)),
            "wqe": Out(stream.Signature(FETCHED)),
        })

    def elaborate(self, platform):
        m = Module()
        W = self.data_bytes
        K = self.depth
        nbeats = formats.WQE_BYTES // W

        m.submodules.fifo = fifo = SyncFIFOBuffered(width=FETCHED.size, depth=K)
        m.submodules.bf_fifo = bf_fifo = SyncFIFOBuffered(width=formats.WQE.size, depth=K)
        # the requests in order: {bf, count}; the head one is being output
        cb = bits_for(K)
        m.submodules.order = order = SyncFIFOBuffered(width=1 + cb, depth=K + 1)
        reserved = Signal(range(K + 1))      # fetched WQEs requested and not yet taken
        take_req = Signal()
        take_out = Signal()

        rq = self.req.payload
        cnt = rq.count
        room = Signal()
        m.d.comb += [
            room.eq(Mux(rq.bf, bf_fifo.w_rdy, cnt <= K - reserved) & order.w_rdy),
            self.dma.req.valid.eq(self.req.valid & ~rq.bf & room),
            self.dma.req.payload.addr.eq(rq.addr),
            self.dma.req.payload.len.eq(cnt * formats.WQE_BYTES),
            self.dma.req.payload.tag.eq(0),
            self.req.ready.eq(room & (rq.bf | self.dma.req.ready)),
            take_req.eq(self.req.valid & self.req.ready),
            order.w_en.eq(take_req),
            order.w_data.eq(Cat(rq.bf, Mux(rq.bf, 1, cnt))),
            bf_fifo.w_en.eq(take_req & rq.bf),
            bf_fifo.w_data.eq(rq.wqe),
        ]
        rd = self.dma.rd

        # assembly: beats arrive lowest bytes first and are shifted in from the top
        buf = Signal(8 * formats.WQE_BYTES)
        beat = Signal(range(nbeats))
        full = Signal(8 * formats.WQE_BYTES)
        if nbeats == 1:
            m.d.comb += full.eq(rd.payload.data)
        else:
            m.d.comb += full.eq(Cat(buf[8 * W:], rd.payload.data))
        # the DMA engine's err is "this beat or an earlier one of the read failed": the WQE
        # whose last beat this is failed if it is set
        m.d.comb += [
            rd.ready.eq(1),
            fifo.w_data.eq(Cat(full, rd.payload.err)),
            fifo.w_en.eq(rd.valid & (beat == nbeats - 1)),
        ]
        with m.If(rd.valid):
            m.d.sync += buf.eq(full)
            if nbeats > 1:
                m.d.sync += beat.eq(Mux(beat == nbeats - 1, 0, beat + 1))

        # output: from the FIFO the head request names, ``count`` WQEs
        head_bf = order.r_data[0]
        head_n = order.r_data[1:]
        done_n = Signal(cb)                   # WQEs of the head request already output
        m.d.comb += [
            self.wqe.valid.eq(order.r_rdy & Mux(head_bf, bf_fifo.r_rdy, fifo.r_rdy)),
            self.wqe.payload.eq(Mux(head_bf, Cat(bf_fifo.r_data, C(0, 1)), fifo.r_data)),
            take_out.eq(self.wqe.valid & self.wqe.ready),
            fifo.r_en.eq(take_out & ~head_bf),
            bf_fifo.r_en.eq(take_out & head_bf),
        ]
        with m.If(take_out):
            with m.If(done_n + 1 == head_n):
                m.d.comb += order.r_en.eq(1)
                m.d.sync += done_n.eq(0)
            with m.Else():
                m.d.sync += done_n.eq(done_n + 1)
        m.d.sync += reserved.eq(reserved + Mux(take_req & ~rq.bf, cnt, 0)
                                - (take_out & ~head_bf))
        return m
