"""A tiny DMA copy engine: the RTL design that tests the cocotb host model (sim/host.py).

Not part of the NIC. It reads ``len`` bytes from host address ``src`` and writes them to
``dst`` through the DMA master ports of ``hw/interfaces.py`` (byte-addressed, unaligned
reads answered in order, beats packed from byte 0), in chunks of at most ``chunk`` bytes
with up to ``max_outstanding`` reads in flight. Each read chunk becomes one DMA write of
the same length: the read data beats are forwarded unchanged as write beats.

Registers (64-bit, ``In(MmioSignature())``): ``SRC`` 0x00, ``DST`` 0x08, ``LEN`` 0x10 (R/W),
``GO`` 0x18 (write: start, ignored while busy), ``DONE`` 0x20 (read: 1 when the last write
beat has been accepted by the host, 0 while busy).
"""

from amaranth import *
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from hw.interfaces import DmaReadReq, DmaReadData, DmaWrite, MmioSignature, DMA_TAG_BITS

__all__ = ["DmaCopy", "SRC", "DST", "LEN", "GO", "DONE"]

SRC, DST, LEN, GO, DONE = 0x00, 0x08, 0x10, 0x18, 0x20


class DmaCopy(wiring.Component):
    """Ports: ``mmio`` In(MmioSignature()), ``rd_req`` Out(DmaReadReq()),
    ``rd_resp`` In(DmaReadData(W)), ``wr`` Out(DmaWrite(W))."""

    def __init__(self, data_bytes=8, chunk=256, max_outstanding=8):
        if (not isinstance(data_bytes, int) or data_bytes not in (8, 16, 32, 64)):
            raise ValueError(f"data_bytes must be a power of two in [8, 64], not {data_bytes!r}")
        if (not isinstance(chunk, int) or chunk & (chunk - 1)
                or not data_bytes <= chunk <= 4096):
            raise ValueError(f"chunk must be a power of two in [{data_bytes}, 4096], "
                             f"not {chunk!r}")
        if not isinstance(max_outstanding, int) or not 1 <= max_outstanding <= 16:
            raise ValueError(f"max_outstanding must be an integer in [1, 16], "
                             f"not {max_outstanding!r}")
        self.data_bytes = data_bytes
        self.chunk = chunk
        self.max_outstanding = max_outstanding
        super().__init__({
            "mmio": In(MmioSignature()),
            "rd_req": Out(DmaReadReq()),
            "rd_resp": In(DmaReadData(data_bytes)),
            "wr": Out(DmaWrite(data_bytes)),
        })

    def elaborate(self, platform):
        m = Module()
        src = Signal(64)
        dst = Signal(64)
        length = Signal(32)
        busy = Signal()
        done = Signal()
        rd_off = Signal(32)
        wr_off = Signal(32)
        outstanding = Signal(range(self.max_outstanding + 1))
        tag = Signal(DMA_TAG_BITS)

        # MMIO
        reg = self.mmio.addr[3:8]
        with m.If(self.mmio.we):
            with m.Switch(reg):
                with m.Case(SRC >> 3):
                    m.d.sync += src.eq(self.mmio.wdata)
                with m.Case(DST >> 3):
                    m.d.sync += dst.eq(self.mmio.wdata)
                with m.Case(LEN >> 3):
                    m.d.sync += length.eq(self.mmio.wdata)
                with m.Case(GO >> 3):
                    with m.If(~busy):
                        m.d.sync += [busy.eq(1), done.eq(0), rd_off.eq(0), wr_off.eq(0)]
        m.d.sync += self.mmio.rvalid.eq(self.mmio.re)
        with m.If(self.mmio.re):
            with m.Switch(reg):
                with m.Case(SRC >> 3):
                    m.d.sync += self.mmio.rdata.eq(src)
                with m.Case(DST >> 3):
                    m.d.sync += self.mmio.rdata.eq(dst)
                with m.Case(LEN >> 3):
                    m.d.sync += self.mmio.rdata.eq(length)
                with m.Case(DONE >> 3):
                    m.d.sync += self.mmio.rdata.eq(done)
                with m.Default():
                    m.d.sync += self.mmio.rdata.eq(0)

        # Read requests.
        rd_left = Signal(32)
        rd_len = Signal(16)
        m.d.comb += rd_left.eq(length - rd_off)
        m.d.comb += rd_len.eq(Mux(rd_left > self.chunk, self.chunk, rd_left))
        m.d.comb += [
            self.rd_req.valid.eq(busy & (rd_off < length)
                                 & (outstanding < self.max_outstanding)),
            self.rd_req.payload.addr.eq(src + rd_off),
            self.rd_req.payload.len.eq(rd_len),
            self.rd_req.payload.tag.eq(tag),
        ]
        issue = self.rd_req.valid & self.rd_req.ready
        with m.If(issue):
            m.d.sync += [rd_off.eq(rd_off + rd_len), tag.eq(tag + 1)]

        # Read data -> writes (one write per read chunk, addr/len on every beat).
        wr_left = Signal(32)
        wr_len = Signal(16)
        m.d.comb += wr_left.eq(length - wr_off)
        m.d.comb += wr_len.eq(Mux(wr_left > self.chunk, self.chunk, wr_left))
        m.d.comb += [
            self.wr.valid.eq(self.rd_resp.valid & busy),
            self.wr.payload.addr.eq(dst + wr_off),
            self.wr.payload.len.eq(wr_len),
            self.wr.payload.data.eq(self.rd_resp.payload.data),
            self.wr.payload.nbytes.eq(self.rd_resp.payload.nbytes),
            self.wr.payload.last.eq(self.rd_resp.payload.last),
            self.rd_resp.ready.eq(self.wr.ready & busy),
        ]
        chunk_done = self.wr.valid & self.wr.ready & self.rd_resp.payload.last
        with m.If(chunk_done):
            m.d.sync += wr_off.eq(wr_off + wr_len)
        m.d.sync += outstanding.eq(outstanding + issue - chunk_done)

        with m.If(busy & (wr_off == length)):
            m.d.sync += [busy.eq(0), done.eq(1)]
        return m
