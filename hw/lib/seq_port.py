"""Mailboxes between the simulation and a testbench, handshaken by counters instead of valid/ready.

A testbench (Python under cocotb) that hands transactions to the RTL or takes them from it
should act once per transaction and never care *when* within a clock period it reads: with a
cocotb ``Clock`` it reads the values from before an edge, with a clock inside the
simulation (sim/verilator.py, ``compat=False``) the values from after it. A valid/ready
handshake depends on that; counters do not:

* :class:`SeqIn` (testbench -> RTL): the testbench writes ``data`` and then increments
  ``seq``; the block offers ``data`` on ``o`` while ``seq != taken`` and counts ``taken`` up
  when ``o`` takes it. The testbench writes the next item once it sees ``taken == seq``
  (a value change to wait for).
* :class:`SeqOut` (RTL -> testbench): the block takes an item from ``i`` into ``data`` and
  counts ``seq`` up; the testbench reads ``data`` when ``seq`` changes and writes
  ``ack = seq``; the block takes the next item once it sees ``ack == seq``. ``ack_edge``
  pulses in the cycle the block sees an acknowledgement (``data`` then still holds the item
  acknowledged).

Both move one item per clock cycle when the testbench answers at every change. Counters are
16 bits, compared for equality (wrap-safe).

Parameters: ``layout`` of the item. Ports: SeqIn ``data: In(layout)``, ``seq: In(16)``,
``taken: Out(16)``, ``o: Out(stream(layout))``; SeqOut ``i: In(stream(layout))``, ``data:
Out(layout)``, ``seq: Out(16)``, ``ack: In(16)``, ``ack_edge: Out(1)``.
"""

from amaranth.hdl import Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["SeqIn", "SeqOut"]


class SeqIn(wiring.Component):
    def __init__(self, layout):
        super().__init__({
            "data": In(layout),
            "seq": In(16),
            "taken": Out(16),
            "o": Out(stream.Signature(layout)),
        })

    def elaborate(self, platform):
        m = Module()
        m.d.comb += [self.o.valid.eq(self.seq != self.taken), self.o.payload.eq(self.data)]
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += self.taken.eq(self.taken + 1)
        return m


class SeqOut(wiring.Component):
    def __init__(self, layout):
        super().__init__({
            "i": In(stream.Signature(layout)),
            "data": Out(layout),
            "seq": Out(16),
            "ack": In(16),
            "ack_edge": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        seen = Signal(16)            # acknowledgements seen
        m.d.comb += [self.i.ready.eq(self.seq == self.ack), self.ack_edge.eq(self.ack != seen)]
        with m.If(self.ack_edge):
            m.d.sync += seen.eq(self.ack)
        with m.If(self.i.valid & self.i.ready):
            m.d.sync += [self.data.eq(self.i.payload), self.seq.eq(self.seq + 1)]
        return m
