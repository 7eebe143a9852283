"""A tiny DMA copy engine: the RTL client that tests the host side (hw/host/, sim/host.py).

Not part of the NIC. It reads ``len`` bytes from host address ``src`` and writes them to
``dst`` through a client port pair of the NIC's host interface (:func:`~hw.interfaces.DmaReadPort`,
:func:`~hw.interfaces.DmaWritePort`: byte-addressed, unaligned, data packed from byte 0,
tagged, with error status), in chunks of at most ``chunk`` bytes with up to
``max_outstanding`` reads in flight:

* **Reads.** Chunk ``k`` of a copy is read at ``src + k * chunk`` with tag ``k`` (16 bits);
  the data comes back in request order. Every beat's tag is checked against the chunk it
  should belong to (``BADTAG`` counts mismatches).
* **Store and forward.** A chunk's beats go into a buffer of two chunks; the chunk is
  written only once its last beat is in, and only if no beat of it had ``err`` (the read
  failed: the chunk is dropped, the destination keeps its old bytes, ``ERR`` bit 0 is set).
  So a failed read never writes garbage to ``dst``.
* **Writes.** Each good chunk becomes one DMA write of the same length at ``dst + k *
  chunk``, tagged with a free-running write number; the ``done`` entries must come back in
  write order with those tags (``BADTAG`` again) and ``err`` sets ``ERR``.

Registers (64-bit, ``In(MmioSignature())``, at byte address ``8 * index``):

=====  =========  ========================================================================
addr   name       meaning
=====  =========  ========================================================================
0x00   SRC        source address (R/W)
0x08   DST        destination address (R/W)
0x10   LEN        bytes to copy, 32 bits (R/W); 0 is a copy that is done at once
0x18   GO         write: start a copy of LEN bytes from SRC to DST (the values when it
                  starts: they may be rewritten while a copy runs). A GO while busy is
                  remembered (one) and starts the next copy in the cycle after this one is
                  DONE, so that its first reads can chase the last writes of this one.
0x20   DONE       1 once every read of the copy has returned and every chunk has been
                  written or dropped: every write is handed to the DMA engine (a read asked
                  for later sees its data: the host interface never lets a read pass a
                  write), though not necessarily answered yet; 0 while busy or while a
                  remembered GO waits
0x28   ERR        bit 0: a read beat of this copy had ``err`` or one of its writes was
                  answered with ``err``; bit 1: a write of an earlier copy was answered with
                  ``err`` after this copy's GO. Cleared by GO; final once ACKED reads 1.
0x30   ACKED      1 when every write handed to the DMA engine has been answered
0x38   OVERLAP    read requests of this copy issued while a write of an earlier copy was
                  not yet answered (a read-after-write test checks that it exercised the
                  ordering)
0x40   T_FIRST    cycles from the start (the cycle GO was taken) to the copy's first
                  read beat (0 until then)
0x48   T_LAST     cycles from the start to the copy's last read beat (0 until then)
0x50   T_END      cycles from the start to the first cycle with DONE and ACKED both 1 (0
                  until then)
0x58   BADTAG     read beats of this copy and write answers since its start with an
                  unexpected tag (in-order delivery is the host interface's promise)
=====  =========  ========================================================================

The timing registers let a testbench measure latency and bandwidth without waking up
during the copy.

Parameters: ``data_bytes`` (W, power of two in [8, 64]), ``chunk`` (power of two in
[W, 4096]), ``max_outstanding`` (read requests in flight, integer in [1, 16]).

Ports: ``mmio: In(MmioSignature())``, ``rd: Out(DmaReadPort(W))``, ``wr:
Out(DmaWritePort(W))``.
"""

from amaranth import *
from amaranth.lib import data, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out
from amaranth.utils import bits_for

from hw.interfaces import DMA_USER_TAG_BITS, DmaReadPort, DmaWritePort, MmioSignature

__all__ = ["DmaCopy", "SRC", "DST", "LEN", "GO", "DONE", "ERR", "ACKED", "OVERLAP",
           "T_FIRST", "T_LAST", "T_END", "BADTAG", "ERR_THIS", "ERR_EARLIER"]

SRC, DST, LEN, GO, DONE, ERR, ACKED, OVERLAP = 0x00, 0x08, 0x10, 0x18, 0x20, 0x28, 0x30, 0x38
T_FIRST, T_LAST, T_END, BADTAG = 0x40, 0x48, 0x50, 0x58
ERR_THIS, ERR_EARLIER = 1, 2          # bits of ERR


class DmaCopy(wiring.Component):
    def __init__(self, data_bytes=8, chunk=256, max_outstanding=8):
        if (not isinstance(data_bytes, int) or isinstance(data_bytes, bool)
                or data_bytes not in (8, 16, 32, 64)):
            raise ValueError(f"data_bytes must be a power of two in [8, 64], not {data_bytes!r}")
        if (not isinstance(chunk, int) or isinstance(chunk, bool) or chunk & (chunk - 1)
                or not data_bytes <= chunk <= 4096):
            raise ValueError(f"chunk must be a power of two in [{data_bytes}, 4096], "
                             f"not {chunk!r}")
        if (not isinstance(max_outstanding, int) or isinstance(max_outstanding, bool)
                or not 1 <= max_outstanding <= 16):
            raise ValueError(f"max_outstanding must be an integer in [1, 16], "
                             f"not {max_outstanding!r}")
        self.data_bytes = data_bytes
        self.chunk = chunk
        self.max_outstanding = max_outstanding
        #: words of the store-and-forward buffer: two chunks
        self.buffer_words = max(4, 2 * chunk // data_bytes)
        super().__init__({
            "mmio": In(MmioSignature()),
            "rd": Out(DmaReadPort(data_bytes)),
            "wr": Out(DmaWritePort(data_bytes)),
        })

    def elaborate(self, platform):
        m = Module()
        W = self.data_bytes
        CH = self.chunk
        TB = DMA_USER_TAG_BITS

        src = Signal(64)
        dst = Signal(64)
        length = Signal(32)
        c_src = Signal(64)               # of the copy running
        c_dst = Signal(64)
        c_len = Signal(32)
        busy = Signal()
        go_wr = Signal()                 # GO written this cycle
        pending = Signal()               # a GO written while busy
        go = Signal()                    # a copy starts this cycle
        err = Signal(2)
        overlap = Signal(32)
        badtag = Signal(32)
        now = Signal(32)                 # cycles since the copy started, minus one
        t_first = Signal(32)
        t_last = Signal(32)
        t_end = Signal(32)
        ended = Signal(init=1)

        rd_off = Signal(33)              # next byte to request
        wr_off = Signal(33)              # next chunk to write or drop starts here
        issued = Signal(32)              # read requests of this copy
        received = Signal(32)            # of them, whose last beat is in the buffer
        processed = Signal(32)           # chunks written (handed over) or dropped
        rx_tag = Signal(TB)              # tag the next read beat must carry
        w_tag = Signal(TB)               # write number of the next write (free running)
        d_tag = Signal(TB)               # write number the next done must carry
        w_handed = Signal(16)            # writes handed to the DMA engine (free running)
        w_answered = Signal(16)
        earlier = Signal(16)             # answers still due to writes of earlier copies
        acked = Signal()
        m.d.comb += acked.eq(w_handed == w_answered)

        # ---- registers --------------------------------------------------------------------
        bus = self.mmio
        reg = bus.addr[3:8]
        with m.If(bus.we):
            with m.Switch(reg):
                with m.Case(SRC >> 3):
                    m.d.sync += src.eq(bus.wdata)
                with m.Case(DST >> 3):
                    m.d.sync += dst.eq(bus.wdata)
                with m.Case(LEN >> 3):
                    m.d.sync += length.eq(bus.wdata)
                with m.Case(GO >> 3):
                    m.d.comb += go_wr.eq(1)
        m.d.comb += go.eq(~busy & (go_wr | pending))
        with m.If(go):
            m.d.sync += pending.eq(0)
        with m.Elif(go_wr):
            m.d.sync += pending.eq(1)
        m.d.sync += bus.rvalid.eq(bus.re)
        values = {SRC: src, DST: dst, LEN: length, DONE: ~busy & ~pending, ERR: err,
                  ACKED: acked, OVERLAP: overlap, T_FIRST: t_first, T_LAST: t_last, T_END: t_end,
                  BADTAG: badtag}
        with m.If(bus.re):
            with m.Switch(reg):
                for a, v in values.items():
                    with m.Case(a >> 3):
                        m.d.sync += bus.rdata.eq(v)
                with m.Default():
                    m.d.sync += bus.rdata.eq(0)

        m.d.sync += now.eq(now + 1)

        # ---- read requests ----------------------------------------------------------------
        rd_left = Signal(33)
        rd_len = Signal(range(CH + 1))
        m.d.comb += [rd_left.eq(c_len - rd_off),
                     rd_len.eq(Mux(rd_left > CH, CH, rd_left))]
        req = self.rd.req
        m.d.comb += [
            req.valid.eq(busy & (rd_off < c_len)
                         & (issued - received < self.max_outstanding)),
            req.payload.addr.eq(c_src + rd_off),
            req.payload.len.eq(rd_len),
            req.payload.tag.eq(issued[:TB]),
        ]
        issue = req.valid & req.ready
        with m.If(issue):
            m.d.sync += [rd_off.eq(rd_off + rd_len), issued.eq(issued + 1)]

        # ---- read data into the store-and-forward buffer ----------------------------------
        BEAT = data.StructLayout({"data": 8 * W, "nbytes": bits_for(W), "last": 1})
        m.submodules.buf = buf = SyncFIFOBuffered(width=BEAT.size, depth=self.buffer_words)
        # one verdict per chunk in the buffer: 1 = write it, 0 = drop it
        m.submodules.verdict = verdict = SyncFIFOBuffered(
            width=1, depth=max(2, self.buffer_words // max(1, CH // W)) + 2)
        rd = self.rd.rd
        chunk_err = Signal()             # a beat of the chunk coming in had err
        m.d.comb += [
            rd.ready.eq(buf.w_rdy & verdict.w_rdy),
            buf.w_data.eq(Cat(rd.payload.data, rd.payload.nbytes, rd.payload.last)),
            buf.w_en.eq(rd.valid & rd.ready),
        ]
        bad_rx = Signal()
        seen_beat = Signal()             # a read beat of this copy has arrived
        with m.If(rd.valid & rd.ready):
            m.d.comb += bad_rx.eq(rd.payload.tag != rx_tag)
            m.d.sync += seen_beat.eq(1)
            with m.If(~seen_beat):
                m.d.sync += t_first.eq(now + 1)
            e = chunk_err | rd.payload.err
            with m.If(rd.payload.last):
                m.d.comb += [verdict.w_en.eq(1), verdict.w_data.eq(~e)]
                m.d.sync += [chunk_err.eq(0), received.eq(received + 1), rx_tag.eq(rx_tag + 1)]
                with m.If(e):
                    m.d.sync += err.eq(err | ERR_THIS)
                with m.If((received + 1 == issued) & (rd_off >= c_len)):
                    m.d.sync += t_last.eq(now + 1)
            with m.Else():
                m.d.sync += chunk_err.eq(e)

        # ---- chunks out: written or dropped, in order -------------------------------------
        wr_left = Signal(33)
        wr_len = Signal(range(CH + 1))
        m.d.comb += [wr_left.eq(c_len - wr_off),
                     wr_len.eq(Mux(wr_left > CH, CH, wr_left))]
        head = Signal(BEAT)
        m.d.comb += head.eq(buf.r_data)
        wr = self.wr.wr
        keep = verdict.r_data[0]
        m.d.comb += [
            wr.payload.addr.eq(c_dst + wr_off),
            wr.payload.len.eq(wr_len),
            wr.payload.tag.eq(w_tag),
            wr.payload.data.eq(head.data),
            wr.payload.nbytes.eq(head.nbytes),
            wr.payload.last.eq(head.last),
        ]
        out_last = Signal()              # the chunk at the head leaves (its last beat)
        with m.If(verdict.r_rdy & buf.r_rdy):
            with m.If(keep):
                m.d.comb += [wr.valid.eq(1), buf.r_en.eq(wr.ready),
                             out_last.eq(wr.ready & head.last)]
            with m.Else():
                m.d.comb += [buf.r_en.eq(1), out_last.eq(head.last)]
        with m.If(out_last):
            m.d.comb += verdict.r_en.eq(1)
            m.d.sync += [wr_off.eq(wr_off + wr_len), processed.eq(processed + 1)]
            with m.If(keep):
                m.d.sync += [w_tag.eq(w_tag + 1), w_handed.eq(w_handed + 1)]

        # ---- write answers ----------------------------------------------------------------
        done = self.wr.done
        with m.If(done.valid):
            m.d.sync += [w_answered.eq(w_answered + 1), d_tag.eq(d_tag + 1)]
            with m.If(earlier != 0):
                m.d.sync += earlier.eq(earlier - 1)
            with m.If(done.payload.err):
                m.d.sync += err.eq(err | Mux(earlier != 0, ERR_EARLIER, ERR_THIS))

        # ---- tag checks, overlap ----------------------------------------------------------
        bad_done = done.valid & (done.payload.tag != d_tag)
        with m.If(bad_rx | bad_done):
            m.d.sync += badtag.eq(badtag + bad_rx + bad_done)
        with m.If(issue & (earlier != 0)):
            m.d.sync += overlap.eq(overlap + 1)

        # ---- copy state -------------------------------------------------------------------
        with m.If(busy & (rd_off >= c_len) & (processed == issued)):
            m.d.sync += busy.eq(0)
        with m.If(~ended & ~busy & acked):
            m.d.sync += [ended.eq(1), t_end.eq(now + 1)]
        with m.If(go):
            m.d.sync += [
                busy.eq(1), c_src.eq(src), c_dst.eq(dst), c_len.eq(length),
                overlap.eq(0), badtag.eq(0), now.eq(0), t_first.eq(0), t_last.eq(0), t_end.eq(0), ended.eq(0), seen_beat.eq(0),
                rd_off.eq(0), wr_off.eq(0), issued.eq(0), received.eq(0), processed.eq(0),
                rx_tag.eq(0),
                # every write not answered now belongs to an earlier copy
                earlier.eq(w_handed - w_answered - done.valid),
                # an answer arriving now is an earlier copy's
                err.eq(Mux(done.valid & done.payload.err, ERR_EARLIER, 0)),
            ]
        return m
