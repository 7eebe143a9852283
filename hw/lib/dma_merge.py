"""Merge several DMA client ports into one client port of the host interface.

Several copies of one block (the requester's processing units, hw/rnic/requester_units.py)
each have their own DMA read and write ports; the host interface serves each *client* with
the ordering rules of :func:`~hw.interfaces.DmaReadPort` and
:func:`~hw.interfaces.DmaWritePort`: read data comes back in request order, one ``done`` per
write in write order. A merge relies on exactly that: it grants the shared port round robin
and remembers, in a FIFO, which input each request (or write) came from; read data and
write answers go back to the input at the head of that FIFO. The inputs' own tags pass
through unchanged, so a client sees the port it would have had alone, only shared.

* :class:`DmaReadMerge`: a request is granted whole (one beat); its data beats, up to the
  beat with ``last``, go to the input that asked. An input that does not take its data
  stops the data of the inputs behind it: clients that merge must accept their read data
  without waiting for anything else (the requester's do: they reserve room before they ask).
* :class:`DmaWriteMerge`: a write (its beats up to ``last``) is granted whole, never
  interleaved with another input's; ``done`` (always accepted) goes to the input whose write
  it answers.

``depth`` bounds the requests (writes) granted and not yet answered; when it is reached the
merge grants nothing more until an answer comes. No latency is added: grants and routing are
combinational (the arbiter is :class:`~hw.lib.arbiter.StreamArbiter`'s round robin).

Parameters: ``data_bytes`` (a power of two in [8, 64]), ``n`` inputs in [1, 16], ``depth``
in [2, 256] (a power of two).

Ports: ``i: In(DmaReadPort(W)).array(n)`` or ``In(DmaWritePort(W)).array(n)``, ``o``: the
merged port (``Out``), ``outstanding: Out(range(depth + 1))``.
"""

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.wiring import In, Out

from ..interfaces import DmaReadPort, DmaWritePort
from .checks import check_int, check_pow2
from .encoder import round_robin_pick

__all__ = ["DmaReadMerge", "DmaWriteMerge"]


class _Merge(wiring.Component):
    def __init__(self, port, data_bytes, n, depth):
        check_pow2("data_bytes", data_bytes, 8, 64)
        check_int("n", n, 1, 16)
        check_pow2("depth", depth, 2, 256)
        self.data_bytes, self.n, self.depth = data_bytes, n, depth
        super().__init__({
            "i": In(port(data_bytes)).array(n),
            "o": Out(port(data_bytes)),
            "outstanding": Out(range(depth + 1)),
        })

    def _grant(self, m, valids, hold):
        """Round-robin choice among ``valids``, kept while ``hold`` (an offer not yet taken
        or a write between its first and last beat). Returns (sel, fifo, granted): ``granted``
        is to be driven with the cycles in which a request or write starts."""
        n = self.n
        m.submodules.ids = fifo = SyncFIFO(width=max(1, (n - 1).bit_length()),
                                                   depth=self.depth)
        m.d.comb += self.outstanding.eq(fifo.level)
        last = Signal(range(max(n, 2)), init=n - 1)
        owner = Signal(range(max(n, 2)))
        _, pick = round_robin_pick(m, valids, last, name="merge")
        sel = Signal(range(max(n, 2)))
        m.d.comb += sel.eq(Mux(hold, owner, pick))
        granted = Signal()
        m.d.comb += [fifo.w_en.eq(granted), fifo.w_data.eq(sel)]
        with m.If(granted):
            m.d.sync += last.eq(sel)
        m.d.sync += owner.eq(sel)
        return sel, fifo, granted


class DmaReadMerge(_Merge):
    def __init__(self, data_bytes, n, depth=32):
        super().__init__(DmaReadPort, data_bytes, n, depth)

    def elaborate(self, platform):
        m = Module()
        n = self.n
        offered = Signal()          # a request was offered last cycle and not taken
        sel, fifo, granted = self._grant(m, [p.req.valid for p in self.i], offered)
        o = self.o
        with m.Switch(sel):
            for k in range(n):
                with m.Case(k):
                    m.d.comb += [
                        o.req.valid.eq(self.i[k].req.valid & fifo.w_rdy),
                        o.req.payload.eq(self.i[k].req.payload),
                        self.i[k].req.ready.eq(o.req.ready & fifo.w_rdy),
                    ]
        m.d.comb += granted.eq(o.req.valid & o.req.ready)
        m.d.sync += offered.eq(o.req.valid & ~o.req.ready)

        # read data: to the input at the head of the FIFO, until its last beat
        head = fifo.r_data
        for k in range(n):
            m.d.comb += [self.i[k].rd.payload.eq(o.rd.payload),
                         self.i[k].rd.valid.eq(o.rd.valid & fifo.r_rdy & (head == k))]
        with m.Switch(head):
            for k in range(n):
                with m.Case(k):
                    m.d.comb += o.rd.ready.eq(self.i[k].rd.ready & fifo.r_rdy)
        m.d.comb += fifo.r_en.eq(o.rd.valid & o.rd.ready & o.rd.payload.last)
        return m


class DmaWriteMerge(_Merge):
    def __init__(self, data_bytes, n, depth=32):
        super().__init__(DmaWritePort, data_bytes, n, depth)

    def elaborate(self, platform):
        m = Module()
        n = self.n
        offered = Signal()          # a first beat was offered last cycle and not taken
        busy = Signal()             # between a write's first and last beat
        sel, fifo, granted = self._grant(m, [p.wr.valid for p in self.i], offered | busy)
        o = self.o
        room = Signal()             # a new write may start (its answer has a FIFO slot)
        m.d.comb += room.eq(busy | fifo.w_rdy)
        with m.Switch(sel):
            for k in range(n):
                with m.Case(k):
                    m.d.comb += [
                        o.wr.valid.eq(self.i[k].wr.valid & room),
                        o.wr.payload.eq(self.i[k].wr.payload),
                        self.i[k].wr.ready.eq(o.wr.ready & room),
                    ]
        fire = Signal()
        m.d.comb += [fire.eq(o.wr.valid & o.wr.ready), granted.eq(fire & ~busy)]
        with m.If(fire):
            m.d.sync += busy.eq(~o.wr.payload.last)
        m.d.sync += offered.eq(o.wr.valid & ~o.wr.ready & ~busy)

        # answers (always accepted): to the input whose write is the oldest unanswered
        head = fifo.r_data
        for k in range(n):
            m.d.comb += [self.i[k].done.payload.eq(o.done.payload),
                         self.i[k].done.valid.eq(o.done.valid & (head == k))]
        m.d.comb += fifo.r_en.eq(o.done.valid)
        return m
