"""Ready queue: a FIFO of indices (QPNs) in which each index is queued at most once.

Event-driven scheduling (issue 8; Corundum's transmit scheduler keeps the same kind of
queue): a doorbell, a completion or a released credit *pushes* the QP's number (a *wake*);
the consumer *pops* the oldest one, checks that QP alone, serves it or drops it, and a later
wake queues it again. Nothing is evaluated per QP per cycle: the cost is one FIFO slot and
one ``queued`` bit per index, so the queue scales to thousands of QPs.

* A push of an index that is already queued is absorbed (the queued entry will be served;
  the work it signals is found then). Pushes are counted in ``pushes`` and absorbed ones in
  ``merged``.
* A push and a pop of the same index in the same cycle queue it again: the pop takes the
  entry away, the push is new work that the consumer may not have seen.
* ``ports`` push ports take one wake each per cycle (several blocks wake QPs in the same
  cycle: the send engine, the response engine, ...); pushes of one index on several ports
  in one cycle are one wake (the lower port's; the others count as merged). Order: first
  pushed, first popped; in one cycle the lower port first.
* Since each index is queued at most once, ``n`` slots always suffice: every push port is
  always ready and nothing is ever lost.

The queued bits are a :class:`~hw.lib.mem_array.MemArray` of one bit per index (a reset
clears them all at once, so that nothing queued before a reset survives it; read and written
at the pushed and popped indices only, so no logic is replicated per index); the FIFO is a
memory of ``n`` indices with one write port per push port and a registered output.

Parameters: ``n`` (number of indices) in [2, 65536], ``ports`` (push ports) in [1, 4].

Ports: ``push: In(stream of {index}, always ready).array(ports)``,
``pop: Out(stream of {index})``, ``count: Out(range(n + 1))`` (indices queued),
``pushes``, ``merged``: ``Out(32)``.
"""

from amaranth.hdl import Module, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from .checks import check_int
from .mem_array import MemArray

__all__ = ["ReadyQueue"]


class ReadyQueue(wiring.Component):
    def __init__(self, n, ports=1):
        check_int("n", n, 2, 1 << 16)
        check_int("ports", ports, 1, 4)
        self.n = n
        self.ports = ports
        self.index_bits = ceil_log2(n)
        self.layout = data.StructLayout({"index": self.index_bits})
        super().__init__({
            "push": In(stream.Signature(self.layout, always_ready=True)).array(ports),
            "pop": Out(stream.Signature(self.layout)),
            "count": Out(range(n + 1)),
            "pushes": Out(32),
            "merged": Out(32),
        })

    def elaborate(self, platform):
        m = Module()
        n, ib, P = self.n, self.index_bits, self.ports
        m.submodules.queued = queued = MemArray(
            n, 1, ("clr",) + tuple(f"set{p}" for p in range(P)),
            tuple(f"q{p}" for p in range(P)))
        m.submodules.fifo = fifo = Memory(shape=ib, depth=n, init=[])
        f_wr = [fifo.write_port() for _ in range(P)]
        f_rd = fifo.read_port(transparent_for=())

        def add(slot, k):
            s = Signal(range(2 * n), name="slot_sum")
            m.d.comb += s.eq(slot + k)
            r = Signal(range(n), name="slot_mod")
            m.d.comb += r.eq(s)
            with m.If(s >= n):
                m.d.comb += r.eq(s - n)
            return r

        wr_slot = Signal(range(n))
        rd_slot = Signal(range(n))
        used = Signal(range(n + 1))         # entries in the FIFO memory (not the output)

        # Output register: pop.payload is the FIFO's registered read port. A slot being
        # read is never one being written (the FIFO holds each index at most once and
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
            m.d.sync += [rd_slot.eq(add(rd_slot, 1)), self.pop.valid.eq(1)]
        with m.Elif(take):
            m.d.sync += self.pop.valid.eq(0)

        # A push enqueues an index that is not queued, or the one being taken this cycle,
        # unless a lower port pushes the same index this cycle.
        popped = self.pop.payload.index
        enq = []
        n_enq = 0
        n_valid = 0
        again_any = 0
        for p in range(P):
            v, idx = self.push[p].valid, self.push[p].payload.index
            again = take & (popped == idx)
            dup = 0
            for j in range(p):
                dup = dup | (self.push[j].valid & (self.push[j].payload.index == idx))
            e = Signal(name=f"enq{p}")
            rd_q, is_queued = queued.read(f"q{p}", idx)
            m.d.comb += rd_q
            m.d.comb += e.eq(v & ~dup & (~is_queued | again))
            m.d.comb += [f_wr[p].addr.eq(add(wr_slot, n_enq)), f_wr[p].data.eq(idx),
                         f_wr[p].en.eq(e)]
            enq.append(e)
            again_any = again_any | (e & again)
            n_enq = n_enq + e
            n_valid = n_valid + v
        # the popped bit is cleared unless pushed again; pushed bits set (a later port wins)
        m.d.comb += [queued.clr.en.eq(take & ~again_any), queued.clr.addr.eq(popped),
                     queued.clr.data.eq(0)]
        for p in range(P):
            setp = getattr(queued, f"set{p}")
            m.d.comb += [setp.en.eq(enq[p]), setp.addr.eq(self.push[p].payload.index),
                         setp.data.eq(1)]
        m.d.sync += [
            wr_slot.eq(add(wr_slot, n_enq)),
            used.eq(used + n_enq - load),
            self.pushes.eq(self.pushes + n_valid),
            self.merged.eq(self.merged + n_valid - n_enq),
        ]
        m.d.comb += self.count.eq(used + self.pop.valid)
        return m
