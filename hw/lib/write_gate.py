"""Write gate: holds what a DMA client announces until the writes before it are answered.

A client that writes host memory and then announces the result (a requester's CQE after
the READ data it wrote, a responder's ACK after the payload of a WRITE) must not announce
before it knows the writes succeeded: the host answers every write (``DmaWritePort.done``,
in order) and a failed write must change what is announced (an error completion, a NAK
instead of an ACK). The gate does this without stalling the client: items enter in order
(``i``) as soon as the writes they depend on have been handed to the DMA engine
(``wr_issued`` pulses once per client write), each stamped with the number of writes issued
so far, and leave in order (``o``) once that many writes are answered.

A write that fails (``done.err``) is recorded with its client tag (the ``key``, e.g. a QPN)
in a small table (``cam`` entries). An item of the same key that depends on that write (it
entered after the write was issued) leaves with ``err`` set; the owner decides what that
means and, with the transfer, raises ``clear`` to drop the record (or leaves it for the
next item of that key). ``forget`` / ``forget_key`` drop the records of a key (the QP was
reset). A failure that finds the table full is counted (``stat_lost``) and not recorded.

Parameters: ``item`` (layout of the payload), ``key_bits`` in [1, 16], ``depth`` (items
held, power of two in [2, 1024]), ``cam`` in [1, 32].

Ports: ``i: In(stream {item, key})``, ``wr_issued: In(1)``, ``done: In(stream DMA_WR_DONE,
always ready)``, ``o: Out(stream {item, key, err})``, ``clear: In(1)``, ``forget: In(1)``,
``forget_key: In(key_bits)``, ``stat_lost: Out(1)``, ``held: Out(range(depth + 1))``.
"""

from amaranth.hdl import Cat, Module, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from ..interfaces import DMA_WR_DONE
from .checks import check_int, check_pow2
from .encoder import lowest_one_hot

__all__ = ["WriteGate"]


class WriteGate(wiring.Component):
    def __init__(self, item, key_bits, *, depth=64, cam=8):
        check_int("key_bits", key_bits, 1, 16)
        check_pow2("depth", depth, 2, 1024)
        check_int("cam", cam, 1, 32)
        self.item = item
        self.key_bits = key_bits
        self.depth = depth
        self.n_cam = cam
        self.entry = data.StructLayout({"item": item, "key": key_bits, "seq": 16})
        super().__init__({
            "i": In(stream.Signature(data.StructLayout({"item": item, "key": key_bits}))),
            "wr_issued": In(1),
            "done": In(stream.Signature(DMA_WR_DONE, always_ready=True)),
            "o": Out(stream.Signature(data.StructLayout({"item": item, "key": key_bits, "err": 1}))),
            "clear": In(1),
            "forget": In(1),
            "forget_key": In(key_bits),
            "stat_lost": Out(1),
            "held": Out(range(depth + 1)),
        })

    def elaborate(self, platform):
        m = Module()
        issued = Signal(16)
        answered = Signal(16)
        m.d.sync += issued.eq(issued + self.wr_issued)
        with m.If(self.done.valid):
            m.d.sync += answered.eq(answered + 1)

        m.submodules.fifo = fifo = SyncFIFOBuffered(width=self.entry.size, depth=self.depth)
        m.d.comb += [
            fifo.w_data.eq(Cat(self.i.payload.item, self.i.payload.key, issued + self.wr_issued)),
            fifo.w_en.eq(self.i.valid),
            self.i.ready.eq(fifo.w_rdy),
            self.held.eq(fifo.level),
        ]
        head = Signal(self.entry)
        m.d.comb += head.eq(fifo.r_data)
        # every write issued before the item has been answered
        ripe = ~(answered - head.seq)[15]

        # failed writes: {key, number of the write}
        n = self.n_cam
        valid = Signal(n)
        keys = [Signal(self.key_bits, name=f"cam_key{k}") for k in range(n)]
        seqs = [Signal(16, name=f"cam_seq{k}") for k in range(n)]
        hit = Signal(n)
        for k in range(n):
            m.d.comb += hit[k].eq(valid[k] & (keys[k] == head.key)
                                  & ~(head.seq - seqs[k])[15])
        m.d.comb += [
            self.o.valid.eq(fifo.r_rdy & ripe),
            self.o.payload.item.eq(head.item),
            self.o.payload.key.eq(head.key),
            self.o.payload.err.eq(hit.any()),
            fifo.r_en.eq(self.o.valid & self.o.ready),
        ]
        clr = Signal(n)
        with m.If(self.o.valid & self.o.ready & self.clear):
            m.d.comb += clr.eq(hit)
        with m.If(self.forget):
            for k in range(n):
                with m.If(keys[k] == self.forget_key):
                    m.d.comb += clr[k].eq(1)
        # record a failure in the lowest free entry
        free = ~valid
        put = Signal(n)
        new = self.done.valid & self.done.payload.err
        first_free = lowest_one_hot(m, free, "free")
        with m.If(new):
            m.d.comb += put.eq(first_free)
        m.d.comb += self.stat_lost.eq(new & ~free.any())
        for k in range(n):
            with m.If(put[k]):
                m.d.sync += [keys[k].eq(self.done.payload.tag[:self.key_bits]),
                             seqs[k].eq(answered + 1)]
        m.d.sync += valid.eq((valid & ~clr) | put)
        return m
