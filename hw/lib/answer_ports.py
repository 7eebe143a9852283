"""Answers of a shared request / response block handed back to its clients, one answer
register per client.

A block that serves several clients through one arbiter (a cache behind its lookup ports,
hw/ctx/ctx_cache.py and hw/ctx/wqe_cache.py) sends its answers on one stream, each naming
the client (``id``). Routed straight to the clients, an answer whose client is not ready
holds the stream, and every answer behind it waits (head-of-line blocking: a client that
asked early and takes its answer late stops the block for everyone). Here each client has
at most one request outstanding (``free[k]`` is low from the cycle its request is taken,
``taken[k]``, until it has taken the answer) and an answer register of its own: an answer
goes to the client in the cycle it arrives if the client is ready, else into the
register, and the shared stream is always ready. Answers naming no client (``id >= n``,
for example a write's acknowledgement that nobody waits for) are dropped.

Parameters: ``layout`` (the answer, a ``data.Layout``), ``n`` in [1, 64] clients,
``id_bits`` in [1, 16] (at least enough for ``n``).

Ports: ``i: In(stream of {id, data: layout})`` (always ready); ``o: Out(stream of
layout).array(n)``; ``taken: In(n)`` (client ``k``'s request is taken this cycle);
``free: Out(n)`` (client ``k`` may send a request).
"""

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from .checks import check_int

__all__ = ["AnswerPorts"]


class AnswerPorts(wiring.Component):
    def __init__(self, layout, n, id_bits):
        check_int("n", n, 1, 64)
        check_int("id_bits", id_bits, max(1, (n - 1).bit_length()), 16)
        self.layout = data.Layout.cast(layout)
        self.n = n
        super().__init__({
            "i": In(stream.Signature(data.StructLayout({"id": id_bits, "data": layout}))),
            "o": Out(stream.Signature(layout)).array(n),
            "taken": In(n),
            "free": Out(n),
        })

    def elaborate(self, platform):
        m = Module()
        m.d.comb += self.i.ready.eq(1)
        for k, o in enumerate(self.o):
            busy = Signal(name=f"busy{k}")
            held = Signal(name=f"held{k}")
            reg = Signal(self.layout, name=f"answer{k}")
            mine = self.i.valid & (self.i.payload.id == k)
            m.d.comb += [self.free[k].eq(~busy),
                         o.valid.eq(held | mine),
                         o.payload.eq(Mux(held, reg, self.i.payload.data))]
            with m.If(self.taken[k]):
                m.d.sync += busy.eq(1)
            with m.If(mine & ~o.ready):
                m.d.sync += [held.eq(1), reg.eq(self.i.payload.data)]
            with m.If(o.valid & o.ready):
                m.d.sync += [held.eq(0), busy.eq(0)]
        return m
