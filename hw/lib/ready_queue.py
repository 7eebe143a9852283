"""Ready queue: a FIFO of indices (QPNs) in which each index is queued at most once.

Event-driven scheduling (issue 8; Corundum's transmit scheduler keeps the same kind of
queue): a doorbell, a completion or a released credit *pushes* the QP's number; the send
engine *pops* the oldest one, serves it, and pushes it again if it still has work. Nothing
is evaluated per QP per cycle: the cost is one FIFO slot and one ``queued`` bit per index,
both in memories, so the queue scales to thousands of QPs.

* A push of an index that is already queued is absorbed (the queued entry will be served;
  the work it signals is found then). Pushes are counted in ``pushes`` and absorbed ones in
  ``merged``.
* A push and a pop of the same index in the same cycle queue it again: the pop takes the
  entry away, the push is new work that the consumer may not have seen.
* Since each index is queued at most once, ``n`` slots always suffice: ``push`` is always
  ready and nothing is ever lost.

The queued bits are a ``lib.memory.Memory`` with an asynchronous read port (one bit per
index: distributed RAM on an FPGA); the FIFO is a memory of ``n`` indices whose output is
registered. Order: first pushed, first popped.

Parameters: ``n`` (number of indices) in [2, 65536].

Ports: ``push: In(stream of {index}, always ready)``, ``pop: Out(stream of {index})``,
``count: Out(range(n + 1))`` (indices queued), ``pushes``, ``merged``: ``Out(32)``.
"""

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from .checks import check_int

__all__ = ["ReadyQueue"]


class ReadyQueue(wiring.Component):
    def __init__(self, n):
        check_int("n", n, 2, 1 << 16)
        self.n = n
        self.index_bits = ceil_log2(n)
        self.layout = data.StructLayout({"index": self.index_bits})
        super().__init__({
            "push": In(stream.Signature(self.layout, always_ready=True)),
            "pop": Out(stream.Signature(self.layout)),
            "count": Out(range(n + 1)),
            "pushes": Out(32),
            "merged": Out(32),
        })

    def elaborate(self, platform):
        m = Module()
        n, ib = self.n, self.index_bits
        m.submodules.queued = queued = Memory(shape=1, depth=n, init=[])
        q_rd = queued.read_port(domain="comb")
        q_set = queued.write_port()
        q_clr = queued.write_port()
        m.submodules.fifo = fifo = Memory(shape=ib, depth=n, init=[])
        f_wr = fifo.write_port()
        f_rd = fifo.read_port(transparent_for=())

        def succ(slot):
            return Mux(slot == n - 1, 0, slot + 1)

        wr_slot = Signal(range(n))
        rd_slot = Signal(range(n))
        used = Signal(range(n + 1))         # entries in the FIFO memory (not the output)

        # Output register: pop.payload is the FIFO's registered read port. A slot being
        # read is never the one being written (the FIFO holds each index at most once and
        # nothing is written when it is full), so the read port needs no transparency.
        take = Signal()
        load = Signal()
        m.d.comb += [
            take.eq(self.pop.valid & self.pop.ready),
            load.eq((used != 0) & (~self.pop.valid | take)),
            f_rd.addr.eq(rd_slot), f_rd.en.eq(load),
            self.pop.payload.index.eq(f_rd.data),
        ]
        with m.If(load):
            m.d.sync += [rd_slot.eq(succ(rd_slot)), self.pop.valid.eq(1)]
        with m.Elif(take):
            m.d.sync += self.pop.valid.eq(0)

        # A push enqueues an index that is not queued, or the one being taken this cycle
        # (then its queued bit stays set: the two write ports never write the same bit).
        idx = self.push.payload.index
        again = take & (self.pop.payload.index == idx)
        enq = Signal()
        m.d.comb += [
            q_rd.addr.eq(idx),
            enq.eq(self.push.valid & (~q_rd.data | again)),
            q_set.addr.eq(idx), q_set.data.eq(1), q_set.en.eq(enq),
            q_clr.addr.eq(self.pop.payload.index), q_clr.data.eq(0),
            q_clr.en.eq(take & ~(enq & again)),
            f_wr.addr.eq(wr_slot), f_wr.data.eq(idx), f_wr.en.eq(enq),
        ]
        with m.If(enq):
            m.d.sync += wr_slot.eq(succ(wr_slot))
        m.d.sync += used.eq(used + enq - load)
        with m.If(self.push.valid):
            m.d.sync += self.pushes.eq(self.pushes + 1)
            with m.If(~enq):
                m.d.sync += self.merged.eq(self.merged + 1)
        m.d.comb += self.count.eq(used + self.pop.valid)
        return m
