"""The NIC's one pair of ICM DMA ports, shared by the context caches.

Models the single path between a ConnectX-style RNIC's context caches and Interconnect
Context Memory (the region of host memory that holds the context tables, :mod:`hw.ctx.mr_cache`):
the host interface gives the ICM one read client and one write client, and every cache
(MR, CQ context, ...) fills and writes back through them. ``IcmPort(n, data_bytes)``
merges ``n`` caches' :func:`~hw.interfaces.DmaReadPort` / :func:`~hw.interfaces.DmaWritePort`
into one of each.

Rules:

* **Tags.** A client's tag must fit in :data:`CLIENT_TAG_BITS` (14) bits: the port puts the
  client number into bits 15:14 of the 16-bit DMA tag of every request and every write beat
  (higher bits of a client's tag are dropped), and restores the client's own tag (bits 13:0,
  upper bits zero) on what comes back.
* **Reads.** Requests are granted round robin among the clients (the one after the last
  grant wins, :class:`~hw.lib.arbiter.StreamArbiter`). Read data and its ready are routed by tag
  bits 15:14, beat by beat, so data of different clients may come back in any order and even
  interleaved (the DMA read engine delivers one port's data in request order, so each client
  sees its answers in its own order). A beat whose tag names no client is dropped.
* **Writes.** A write is a run of beats up to ``last`` (a 32-byte entry: 4 beats at W = 8,
  1 at W = 64). The grant goes round robin between writes and is kept from a write's first
  beat to its ``last`` beat, so the host sees each write whole, never interleaved with
  another client's beats (a client that pauses inside a write stalls the port). ``done``
  (always accepted) goes to the client named by its tag bits 15:14, tag restored.
* **Timing.** No added latency and no register on the data path: a client's ready is
  combinational from the valids of all clients (the arbiter's pick) and from the host's
  ready; as every stream requires, a client's valid must not depend on its ready, so there
  is no loop. A granted request stays on the output until the host takes it.

Parameters: ``n`` (clients, integer in [1, 4]), ``data_bytes`` (W, a power of two in
[8, 64]). Ports: ``rd: In(DmaReadPort(W)).array(n)`` and ``wr: In(DmaWritePort(W)).array(n)``
(the caches' ``dma_rd`` / ``dma_wr`` connect here), ``dma_rd: Out(DmaReadPort(W))`` and
``dma_wr: Out(DmaWritePort(W))`` (to the host interface).
"""

from amaranth.hdl import Cat, Const, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ..lib.arbiter import StreamArbiter
from ..interfaces import (DMA_USER_TAG_BITS, DmaReadPort, DmaWritePort, dma_rd_req_layout,
                          dma_wr_layout)
from ..lib.checks import check_int, check_pow2

__all__ = ["IcmPort", "CLIENT_TAG_BITS"]

#: Tag bits left to a client (the top two carry the client number).
CLIENT_TAG_BITS = DMA_USER_TAG_BITS - 2


class IcmPort(wiring.Component):
    def __init__(self, n, data_bytes):
        check_int("n", n, 1, 4)
        check_pow2("data_bytes", data_bytes, 8, 64)
        self.n, self.data_bytes = n, data_bytes
        super().__init__({
            "rd": In(DmaReadPort(data_bytes)).array(n),
            "wr": In(DmaWritePort(data_bytes)).array(n),
            "dma_rd": Out(DmaReadPort(data_bytes)),
            "dma_wr": Out(DmaWritePort(data_bytes)),
        })

    @staticmethod
    def _client(tag):
        return tag[CLIENT_TAG_BITS:DMA_USER_TAG_BITS]

    @staticmethod
    def _tagged(m, dst, src, k):
        """Pass the payload of ``src`` to ``dst`` with client number ``k`` in the tag's top bits."""
        m.d.comb += [
            dst.payload.eq(src.payload),
            dst.payload.tag.eq(Cat(src.payload.tag[:CLIENT_TAG_BITS], Const(k, 2))),
        ]

    def elaborate(self, platform):
        m = Module()
        n = self.n
        m.submodules.rd_arb = rd_arb = StreamArbiter(dma_rd_req_layout(), n)
        m.submodules.wr_arb = wr_arb = StreamArbiter(dma_wr_layout(self.data_bytes), n)
        wiring.connect(m, rd_arb.o, wiring.flipped(self.dma_rd.req))
        wiring.connect(m, wr_arb.o, wiring.flipped(self.dma_wr.wr))

        # Read requests: plain round robin, one request per grant.
        for k, c in enumerate(self.rd):
            self._tagged(m, rd_arb.i[k], c.req, k)
            m.d.comb += [rd_arb.i[k].valid.eq(c.req.valid), c.req.ready.eq(rd_arb.i[k].ready)]

        # Write beats: while a write is under way (first beat taken, not its last), only its
        # client is offered to the arbiter, which then picks it alone; its last beat frees
        # the grant and the arbiter goes on from the client after it.
        busy = Signal()
        owner = Signal(2)
        o = self.dma_wr.wr
        for k, c in enumerate(self.wr):
            allowed = ~busy | (owner == k)
            self._tagged(m, wr_arb.i[k], c.wr, k)
            m.d.comb += [
                wr_arb.i[k].valid.eq(c.wr.valid & allowed),
                c.wr.ready.eq(wr_arb.i[k].ready & allowed),
            ]
        with m.If(o.valid & o.ready):
            m.d.sync += [busy.eq(~o.payload.last), owner.eq(self._client(o.payload.tag))]

        # Answers: to the client named by the tag, with the client's own tag.
        def route(src, dsts, has_ready):
            sel = self._client(src.payload.tag)
            for k, dst in enumerate(dsts):
                m.d.comb += [
                    dst.valid.eq(src.valid & (sel == k)),
                    dst.payload.eq(src.payload),
                    dst.payload.tag.eq(src.payload.tag[:CLIENT_TAG_BITS]),
                ]
                if has_ready:
                    with m.If(sel == k):
                        m.d.comb += src.ready.eq(dst.ready)

        rd = self.dma_rd.rd
        m.d.comb += rd.ready.eq(1)          # a beat for no client is dropped
        route(rd, [c.rd for c in self.rd], True)
        route(self.dma_wr.done, [c.done for c in self.wr], False)   # done: always ready
        return m
