"""BlueFlame buffer: WQEs the host wrote into the NIC by MMIO, kept until the requester sends them.

Models the on-NIC copy of a BlueFlame write (mlx5 "BlueFlame": the driver writes a whole
64-byte WQE into a write-combining UAR page as well as into the send queue, so that the NIC
can start the send without reading the WQE by DMA; SMART, ASPLOS 2024, section 3.1). A few
entries are kept; each holds the WQE, its QP and its send-queue index (the WQE's ``index``
field). The requester asks, when it is about to fetch WQE ``index`` of a QP, whether a copy
is here (``hit``); it takes the copy (``take``) instead of reading the send queue. Copies
that cannot be used any more are dropped:

* when the requester fetches a batch of a QP by DMA, the entries of that QP whose index is
  in the batch or behind it (already fetched) are dropped (``inval``: ``qpn``, ``first``,
  ``count``);
* a QP reset drops every entry of the QP (``inval`` with ``all``);
* a new BlueFlame write takes the next entry round-robin, dropping the copy there.

Every copy dropped without being used counts once on ``stat_miss``; every copy used on
``stat_hit``. The host's send queue always holds the WQE too: a miss costs only the fetch.

A lookup and a write of the same cycle: the lookup sees the entries before the write; a
write and a take or drop of the same entry: the write wins.

Parameters: ``qpn_bits``, ``entries`` (1..16).

Ports
    i        In(stream SQ_BF)  always ready: a WQE from a good BlueFlame write
    qpn, index  In             the lookup: QP and send-queue index about to be fetched
    hit      Out(1)            combinational: an entry holds that WQE ...
    wqe      Out(WQE)          ... this one
    take     In(1)             use the hit entry (drop it)
    inval    In(stream {qpn, first: 16, count: 16, all: 1})  always ready
    stat_hit   Out(1)            a copy used this cycle
    stat_miss  Out(range(entries + 1))  copies dropped unused this cycle
"""

from amaranth.hdl import Array, Const, Module, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from .. import formats
from ..lib.checks import check_int

__all__ = ["BlueFlameBuffer", "SQ_BF"]

#: A WQE that arrived by BlueFlame, for the requester.
SQ_BF = data.StructLayout({"qpn": 24, "wqe": formats.WQE})


class BlueFlameBuffer(wiring.Component):
    def __init__(self, qpn_bits, entries=4):
        check_int("qpn_bits", qpn_bits, 1, 24)
        check_int("entries", entries, 1, 16)
        self.qpn_bits = qpn_bits
        self.entries = entries
        super().__init__({
            "i": In(stream.Signature(SQ_BF, always_ready=True)),
            "qpn": In(qpn_bits),
            "index": In(16),
            "hit": Out(1),
            "wqe": Out(formats.WQE),
            "take": In(1),
            "inval": In(stream.Signature(data.StructLayout(
                {"qpn": qpn_bits, "first": 16, "count": 16, "all": 1}), always_ready=True)),
            "stat_hit": Out(1),
            "stat_miss": Out(range(entries + 1)),
        })

    def elaborate(self, platform):
        m = Module()
        n = self.entries
        qb = self.qpn_bits
        valid = Signal(n)
        qpns = Array(Signal(qb, name=f"qpn{e}") for e in range(n))
        idxs = Array(Signal(16, name=f"idx{e}") for e in range(n))
        wqes = Array(Signal(formats.WQE, name=f"wqe{e}") for e in range(n))
        ptr = Signal(range(n))

        # lookup: the lowest matching entry (at most one matches in normal use)
        sel = Signal(range(n))
        for e in reversed(range(n)):
            with m.If(valid[e] & (qpns[e] == self.qpn) & (idxs[e] == self.index)):
                m.d.comb += [self.hit.eq(1), sel.eq(e)]
        m.d.comb += self.wqe.eq(wqes[sel])

        drop = Signal(n)            # entries dropped (unused) this cycle
        used = Signal(n)
        iv = self.inval.payload
        for e in range(n):
            ahead = (idxs[e] - iv.first)[:16]
            with m.If(self.inval.valid & valid[e] & (qpns[e] == iv.qpn)
                      & (iv.all | (ahead < iv.count) | ahead[15])):
                m.d.comb += drop[e].eq(1)
        with m.If(self.take & self.hit):
            m.d.comb += [used.eq(Const(1, n) << sel), self.stat_hit.eq(1)]
        wr = Signal(n)
        with m.If(self.i.valid):
            m.d.comb += wr.eq(Const(1, n) << ptr)
            m.d.sync += [qpns[ptr].eq(self.i.payload.qpn[:qb]), idxs[ptr].eq(self.i.payload.wqe.index),
                         wqes[ptr].eq(self.i.payload.wqe), ptr.eq(ptr + 1 if n > 1 else 0)]
            if n > 1 and n & (n - 1):
                with m.If(ptr == n - 1):
                    m.d.sync += ptr.eq(0)
        # copies dropped unused: replaced or invalidated, and not taken in the same cycle
        lost = Signal(n)
        m.d.comb += [lost.eq(valid & ~used & (wr | drop)),
                     self.stat_miss.eq(sum(lost[e] for e in range(n)))]
        m.d.sync += valid.eq((valid & ~drop & ~used) | wr)
        return m
