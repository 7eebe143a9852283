"""Priority merge of two streams whose offers are sticky.

Two state machines that share one output (the requester's response engine and send engine
share the completion path and the QP-error request, hw/rnic/requester.py) each *offer* an item and
hold it until it is taken. Input 0 wins when both offer in the same cycle; once an item is
presented on ``o`` and not taken, the grant stays with its input until it is, so the output
obeys the stream rule (a presented payload stays stable until accepted) and input 0 never
overtakes an item of input 1 that is already on the output. Combinational: no added
latency; a two-input :class:`~hw.lib.arbiter.StreamArbiter` grants round robin instead.

Parameters: ``layout`` (the payload's shape).

Ports: ``i: In(stream.Signature(layout)).array(2)`` (``i[0]`` has priority),
``o: Out(stream.Signature(layout))``, ``sel: Out(1)`` (the input granted this cycle is
``i[0]``: the owner of a shared register may steer other fields with it).
"""

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["PriorityMerge"]


class PriorityMerge(wiring.Component):
    def __init__(self, layout):
        self.layout = layout
        super().__init__({
            "i": In(stream.Signature(layout)).array(2),
            "o": Out(stream.Signature(layout)),
            "sel": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        hold = Signal()          # an offer is on the output, not yet taken
        hold_sel = Signal()      # ... and it came from i[0]
        a, b = self.i
        m.d.comb += [
            self.sel.eq(Mux(hold, hold_sel, a.valid)),
            self.o.valid.eq(Mux(self.sel, a.valid, b.valid)),
            self.o.payload.eq(Mux(self.sel, a.payload, b.payload)),
            a.ready.eq(self.sel & self.o.ready),
            b.ready.eq(~self.sel & self.o.ready),
        ]
        m.d.sync += [hold.eq(self.o.valid & ~self.o.ready), hold_sel.eq(self.sel)]
        return m
