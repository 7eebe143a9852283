"""Round-robin arbiters that merge several streams or packet ports into one.

Plumbing of the RNIC data path: several transport blocks (requester, responder,
acknowledgement generator) send packets into one packetizer, as the single send path of a
port in the InfiniBand Architecture Specification vol. 1 rel. 1.4, chapter 9 ("Transport
layer"), where packets of different QPs share the link but each packet is sent whole.

* :class:`StreamArbiter` merges ``n`` single-beat streams; each transfer is one grant.
* :class:`PacketArbiter` merges ``n`` :func:`~hw.interfaces.PacketOut` ports; a grant lasts
  each packet's ``ceil(meta.paylen / W)`` payload beats (none if ``paylen == 0``) whole, in
  the order of the headers, so packets never interleave; the next header may be taken while
  the current payload flows.

Both grant in round-robin order (the input after the last granted one wins) and are
combinational (no added latency). Once an input has been offered on the output and not yet
taken, the grant stays with it, so the output obeys the stream rule that a presented
payload stays stable until it is accepted.
"""

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from ..interfaces import PacketOut
from .encoder import round_robin_pick

__all__ = ["StreamArbiter", "PacketArbiter", "round_robin_pick"]


def _check_n(n, lo=1, hi=64):
    if not isinstance(n, int) or isinstance(n, bool) or not lo <= n <= hi:
        raise ValueError(f"n must be an integer in [{lo}, {hi}], not {n!r}")


class StreamArbiter(wiring.Component):
    """Round-robin merge of ``n`` streams of ``layout``.

    Ports: ``i: In(stream.Signature(layout)).array(n)``, ``o: Out(stream.Signature(layout))``.
    """

    def __init__(self, layout, n):
        _check_n(n)
        self.n = n
        self.layout = layout
        super().__init__({
            "i": In(stream.Signature(layout)).array(n),
            "o": Out(stream.Signature(layout)),
        })

    def elaborate(self, platform):
        m = Module()
        n = self.n
        last = Signal(range(max(n, 2)), init=n - 1)
        locked = Signal()
        owner = Signal(range(max(n, 2)))
        any_req, pick = round_robin_pick(m, [s.valid for s in self.i], last)
        sel = Signal(range(max(n, 2)))
        m.d.comb += sel.eq(0)
        with m.If(locked):
            m.d.comb += sel.eq(owner)
        with m.Else():
            m.d.comb += sel.eq(pick)
        with m.Switch(sel):
            for k in range(n):
                with m.Case(k):
                    m.d.comb += [
                        self.o.valid.eq(self.i[k].valid),
                        self.o.payload.eq(self.i[k].payload),
                        self.i[k].ready.eq(self.o.ready),
                    ]
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += [last.eq(sel), locked.eq(0)]
        with m.Elif(self.o.valid):
            m.d.sync += [locked.eq(1), owner.eq(sel)]
        return m


class PacketArbiter(wiring.Component):
    """Round-robin merge of ``n`` packet ports; a packet (meta + payload) is never split.

    Ports: ``i: In(PacketOut(W)).array(n)`` (each with ``meta`` and ``payload`` streams),
    ``o: Out(PacketOut(W))``.

    The meta and the payload stream have separate grants, so that the next packet's header
    can be taken while the current packet's payload still flows (one packet ahead at most):
    a consumer such as the packetizer, which takes the next header in the cycle of a frame's
    last beat, then sends frames back to back. Payload beats leave in the order in which the
    headers were taken. (Before 2026-12-08 the next header was offered only in the cycle
    after the last payload beat: three cycles per two-beat 8-byte WRITE frame.)
    """

    def __init__(self, data_bytes, n):
        if (not isinstance(data_bytes, int) or isinstance(data_bytes, bool)
                or not 8 <= data_bytes <= 64 or data_bytes & (data_bytes - 1)):
            raise ValueError(f"data_bytes must be a power of two in [8, 64], not {data_bytes!r}")
        _check_n(n)
        self.data_bytes = data_bytes
        self.n = n
        super().__init__({
            "i": In(PacketOut(data_bytes)).array(n),
            "o": Out(PacketOut(data_bytes)),
        })

    def elaborate(self, platform):
        m = Module()
        n = self.n
        shift = exact_log2(self.data_bytes)
        nb = 16 - shift + 1
        last = Signal(range(max(n, 2)), init=n - 1)
        m_owner = Signal(range(max(n, 2)))
        locked = Signal()        # meta offered but not taken yet
        in_payload = Signal()    # the current packet's payload beats remain
        p_owner = Signal(range(max(n, 2)))
        remaining = Signal(nb)
        pend = Signal()          # a header taken whose payload follows the current one
        pend_owner = Signal(range(max(n, 2)))
        pend_beats = Signal(nb)
        any_req, pick = round_robin_pick(m, [p.meta.valid for p in self.i], last)

        sel = Signal(range(max(n, 2)))
        m.d.comb += sel.eq(Mux(locked, m_owner, pick))
        with m.Switch(sel):
            for k in range(n):
                with m.Case(k):
                    src = self.i[k]
                    m.d.comb += [
                        self.o.meta.payload.eq(src.meta.payload),
                        self.o.meta.valid.eq(src.meta.valid & ~pend),
                        src.meta.ready.eq(self.o.meta.ready & ~pend),
                    ]
        with m.Switch(p_owner):
            for k in range(n):
                with m.Case(k):
                    src = self.i[k]
                    m.d.comb += [
                        self.o.payload.payload.eq(src.payload.payload),
                        self.o.payload.valid.eq(src.payload.valid & in_payload),
                        src.payload.ready.eq(self.o.payload.ready & in_payload),
                    ]

        nbeats = Signal(nb)
        m.d.comb += nbeats.eq((self.o.meta.payload.paylen + (self.data_bytes - 1)) >> shift)
        pay_fire = self.o.payload.valid & self.o.payload.ready
        pay_done = Signal()
        m.d.comb += pay_done.eq(pay_fire & (remaining == 1))
        with m.If(pay_fire):
            m.d.sync += remaining.eq(remaining - 1)
        with m.If(pay_done):
            m.d.sync += [in_payload.eq(pend), p_owner.eq(pend_owner), remaining.eq(pend_beats),
                         pend.eq(0)]
        with m.If(self.o.meta.valid & self.o.meta.ready):
            m.d.sync += [last.eq(sel), locked.eq(0)]
            with m.If(nbeats != 0):
                with m.If(~in_payload | pay_done):
                    m.d.sync += [in_payload.eq(1), p_owner.eq(sel), remaining.eq(nbeats)]
                with m.Else():
                    m.d.sync += [pend.eq(1), pend_owner.eq(sel), pend_beats.eq(nbeats)]
        with m.Elif(self.o.meta.valid):
            m.d.sync += [locked.eq(1), m_owner.eq(sel)]
        return m
