"""Atomic execution unit of the RNIC responder.

Models the memory side of the RC atomic operations of the InfiniBand Architecture
Specification vol. 1 release 1.4, chapter 9.4 (COMPARE_SWAP / FETCH_ADD operations) as
executed by the responder (9.7): an 8-byte read-modify-write of a little-endian quadword in
host memory, done through the NIC's DMA ports.

* CAS (``op == 0``): read ``orig``; if ``orig == compare`` write ``swap_add``, otherwise
  write nothing (a failed compare leaves memory untouched).
* FAA (``op == 1``): read ``orig``; write ``(orig + swap_add) mod 2**64``.

Either way the unit answers ``orig`` on its ``o`` stream, once its write (if any) has been
answered by the host. If the host fails the read or the write (``err`` of the DMA ports),
the answer has ``err`` set and the operation must be reported as failed (the responder NAKs
it with a remote operational error); after a failed read nothing is written.

Atomicity: the unit executes **one operation at a time** (it accepts a new request only
after the previous answer has been taken), and its DMA read and write are the only memory
accesses it makes, so two atomics on the same address are serialized: the second one reads
the value the first one wrote (provided the DMA engine / host memory makes a posted write
visible to a later read, as ``sim/host.py`` does: a read does not pass an earlier posted
write). Atomicity against CPU accesses on the host is not modelled (``IBV_ATOMIC_HCA``:
atomic only with respect to this HCA).

Ports
-----
``i``: ``In(stream.Signature({op: 1, addr: 64, compare: 64, swap_add: 64}))``
``o``: ``Out(stream.Signature({orig: 64, err: 1}))``
``dma_rd``: ``Out(DmaReadPort(data_bytes))`` (one 8-byte read per operation)
``dma_wr``: ``Out(DmaWritePort(data_bytes))`` (one 8-byte single-beat write, skipped for a
failed CAS; the unit waits for its ``done``)
"""

from amaranth.hdl import Module, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from .interfaces import DmaReadPort, DmaWritePort

__all__ = ["AtomicUnit", "ATOMIC_REQ", "ATOMIC_RESP", "ATOMIC_CAS", "ATOMIC_FAA", "ATOMIC_DMA_TAG"]

ATOMIC_CAS = 0
ATOMIC_FAA = 1
#: DMA tag of the unit's reads
ATOMIC_DMA_TAG = 3

ATOMIC_REQ = data.StructLayout({"op": 1, "addr": 64, "compare": 64, "swap_add": 64})
ATOMIC_RESP = data.StructLayout({"orig": 64, "err": 1})


def check_data_bytes(data_bytes):
    if (not isinstance(data_bytes, int) or isinstance(data_bytes, bool)
            or not 8 <= data_bytes <= 64 or data_bytes & (data_bytes - 1)):
        raise ValueError(f"data_bytes must be a power of two in [8, 64], not {data_bytes!r}")


class AtomicUnit(wiring.Component):
    """8-byte CAS / FAA through DMA, one operation at a time (see module docstring)."""

    def __init__(self, data_bytes):
        check_data_bytes(data_bytes)
        self.data_bytes = data_bytes
        super().__init__({
            "i": In(stream.Signature(ATOMIC_REQ)),
            "o": Out(stream.Signature(ATOMIC_RESP)),
            "dma_rd": Out(DmaReadPort(data_bytes)),
            "dma_wr": Out(DmaWritePort(data_bytes)),
        })

    def elaborate(self, platform):
        m = Module()
        W = self.data_bytes

        req = Signal(ATOMIC_REQ)
        orig = Signal(64)
        new = Signal(64)
        err = Signal()
        wr, done = self.dma_wr.wr, self.dma_wr.done

        m.d.comb += new.eq(req.swap_add)
        with m.If(req.op == ATOMIC_FAA):
            m.d.comb += new.eq((orig + req.swap_add)[:64])
        do_write = (req.op == ATOMIC_FAA) | (orig == req.compare)

        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += self.i.ready.eq(1)
                with m.If(self.i.valid):
                    m.d.sync += [req.eq(self.i.payload), err.eq(0)]
                    m.next = "READ_REQ"
            with m.State("READ_REQ"):
                m.d.comb += [
                    self.dma_rd.req.valid.eq(1),
                    self.dma_rd.req.payload.addr.eq(req.addr),
                    self.dma_rd.req.payload.len.eq(8),
                    self.dma_rd.req.payload.tag.eq(ATOMIC_DMA_TAG),
                ]
                with m.If(self.dma_rd.req.ready):
                    m.next = "READ_DATA"
            with m.State("READ_DATA"):
                # an 8-byte read is a single beat for every data_bytes >= 8
                m.d.comb += self.dma_rd.rd.ready.eq(1)
                with m.If(self.dma_rd.rd.valid):
                    m.d.sync += [orig.eq(self.dma_rd.rd.payload.data[:64]),
                                 err.eq(self.dma_rd.rd.payload.err)]
                    with m.If(self.dma_rd.rd.payload.last):
                        m.next = "WRITE"
            with m.State("WRITE"):
                with m.If(do_write & ~err):
                    m.d.comb += [
                        wr.valid.eq(1),
                        wr.payload.addr.eq(req.addr),
                        wr.payload.len.eq(8),
                        wr.payload.tag.eq(ATOMIC_DMA_TAG),
                        wr.payload.data.eq(new),
                        wr.payload.nbytes.eq(8),
                        wr.payload.last.eq(1),
                    ]
                    with m.If(wr.ready):
                        m.next = "WAIT_DONE"
                with m.Else():
                    m.next = "ANSWER"
            with m.State("WAIT_DONE"):
                with m.If(done.valid):
                    m.d.sync += err.eq(done.payload.err)
                    m.next = "ANSWER"
            with m.State("ANSWER"):
                m.d.comb += [
                    self.o.valid.eq(1),
                    self.o.payload.orig.eq(orig),
                    self.o.payload.err.eq(err),
                ]
                with m.If(self.o.ready):
                    m.next = "IDLE"
        return m
