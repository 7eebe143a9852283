"""A table behind a request/response port (``hw.interfaces.CtxLookup``), for unit benches.

Stands in for a context cache: it takes one request at a time, answers ``latency`` cycles
later (or after a pseudo-random 1 .. 8 cycles from an LFSR when ``latency`` is None) with the
entry of ``init``, and never answers ``err`` unless the index is in ``bad``. It takes a
request in about half the cycles it could (pseudo-random), or in every one with
``always_ready``.
"""

from amaranth import Cat, Module, Signal
from amaranth.lib import memory, wiring
from amaranth.lib.wiring import In

from hw.interfaces import CtxLookup


class TableLookup(wiring.Component):
    def __init__(self, index_bits, shape, init, latency=None, bad=(), always_ready=False):
        self.shape, self.init, self.latency, self.bad = shape, list(init), latency, set(bad)
        self.always_ready = always_ready
        self.table = memory.Memory(shape=shape, depth=len(self.init), init=self.init)
        super().__init__({"port": In(CtxLookup(index_bits, shape))})

    def elaborate(self, platform):
        m = Module()
        m.submodules.table = self.table
        rd = self.table.read_port(domain="comb")
        port = self.port
        busy = Signal()
        index = Signal.like(port.req.payload.index)
        wait = Signal(4)
        lfsr = Signal(8, init=0xA5)
        m.d.sync += lfsr.eq(Cat(lfsr[1:], lfsr[0] ^ lfsr[2] ^ lfsr[3] ^ lfsr[4]))
        m.d.comb += [rd.addr.eq(index), port.req.ready.eq(~busy & (1 if self.always_ready else lfsr[5])),
                     port.resp.valid.eq(busy & (wait == 0)),
                     port.resp.payload.data.eq(rd.data)]
        bad = 0
        for b in self.bad:
            bad = bad | (index == b)
        m.d.comb += port.resp.payload.err.eq(bad)
        with m.If(port.req.valid & port.req.ready):
            # the answer is offered `wait` cycles after the next one
            first = lfsr[:3] if self.latency is None else max(self.latency - 1, 0)
            m.d.sync += [busy.eq(1), index.eq(port.req.payload.index), wait.eq(first)]
        with m.Elif(busy & (wait != 0)):
            m.d.sync += wait.eq(wait - 1)
        with m.If(port.resp.valid & port.resp.ready):
            m.d.sync += busy.eq(0)
        return m
