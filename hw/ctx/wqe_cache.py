"""The requester's WQE cache: the send WQEs of outstanding requests, held in a finite cache.

Models SMART's "NIC cache thrashing" (ASPLOS 2024, section 3.2): a ConnectX NIC keeps the
WQEs of the requests it has sent in an on-chip cache; once more requests are outstanding
than the cache holds, a WQE needed again (for its response: where a READ's data or an
atomic's result goes; for its completion: the ``wr_id``) has been evicted and is read again
from the host send queue over PCIe. The host-interface bytes per request then rise, and the
response path waits a host round trip per miss.

Entries are 64-byte WQEs keyed by ``(qpn, index)``, ``index`` the WQE's 16-bit send-queue
index; a :class:`~hw.lib.cache.SetAssocCache` with ``addressed=True`` holds them (sets,
ways, policy, MSHRs from ``NicConfig.wqe_cache_*``). The set of a WQE is
``Cat((index + qpn)[:lw], qpn)``, low bits first, where ``2**lw = min(max_rd_atomic, sets)``
(:func:`wqe_set`; the key is ``Cat((index + qpn)[:lw], qpn, index[lw:])``, one-to-one). The
WQEs a QP keeps outstanding are consecutive send-queue indices, at most ``max_rd_atomic``
READs / atomics: with ``lw`` index bits at the bottom of the set, those of one QP fall in
``2**lw`` different sets whatever the index, and the QPN bits above give the QPs of
different classes (QPN modulo ``sets / 2**lw``) sets of their own. So ``sets * ways /
max_rd_atomic`` QPs with full READ windows fit, however far apart their indices have
drifted: the cache thrashes when the outstanding WQEs outgrow its capacity, not earlier by
set conflicts (SMART section 3.2 sees 111 Mops at 768 READs outstanding). Adding the QPN to
the index bits spreads QPs posting in step (SMART's batch-synchronous threads, all at the
same index) over the sets when the QPN bits are few or none. Every entry is a read-only copy of what
the send queue holds (the driver writes every WQE there, also one it posts by BlueFlame, and
does not reuse a slot before its completion), so a miss may always re-read it and nothing is
ever written back.

* ``fill``: the requester installs every WQE it puts in its tracker (``FILL``: allocated
  clean, replacing whatever the key held, a stale copy from an earlier incarnation of the
  QP included). Fills are queued (``FILL_DEPTH``) and go before any lookup: a lookup waits
  while a fill is queued, so it never overtakes the install of its own WQE.
* ``lk[0]`` (response handling) and ``lk[1]`` (flush): ``{qpn, index, addr, last}`` where
  ``addr`` is the WQE's host address (for a miss), answered with the WQE's ``wr_id``,
  ``local_addr``, ``length`` and ``err`` (the re-read failed). At most one request per
  port in flight, and an answer register per port (hw/lib/answer_ports.py). ``last``: the message completes with this lookup (the last packet of
  its READ response, its atomic acknowledge, an ACK that covers it, its flush): the entry
  is freed (:class:`~hw.lib.cache.SetAssocCache`'s last use), so the WQE cache holds the
  WQEs of outstanding requests and a completed one is the next victim of its set, not an
  outstanding one that LRU would pick because its fill is the oldest use of its set. A
  wrong guess costs a re-read, never a wrong answer.

Counters (one-cycle increments): ``stat_hit`` / ``stat_miss`` (lookups, fills not
counted), ``stat_evict``.
"""

from amaranth.hdl import Cat, Module, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from ..lib.answer_ports import AnswerPorts
from ..lib.arbiter import StreamArbiter
from ..config import NicConfig
from ..formats import WQE, WQE_BYTES
from ..interfaces import DmaReadPort
from ..lib.cache import CacheOp, SetAssocCache

__all__ = ["WqeCache", "WqeLookup", "WQE_INFO", "FILL_DEPTH", "wqe_set"]

#: What a lookup answers: the fields of the WQE the response path and the flush need.
WQE_INFO = data.StructLayout({"wr_id": 64, "local_addr": 64, "length": 32})
FILL_DEPTH = 4


def WqeLookup(qpn_bits):
    """A lookup port of the WQE cache (the client's side): ``req`` {qpn, index, addr (of
    the send-queue slot, read on a miss), last (the WQE's last use: free it)}, ``resp``
    {info, err (the WQE could not be read again)}."""
    return wiring.Signature({
        "req": Out(stream.Signature(data.StructLayout(
            {"qpn": qpn_bits, "index": 16, "addr": 64, "last": 1}))),
        "resp": In(stream.Signature(data.StructLayout({"info": WQE_INFO, "err": 1}))),
    })


def wqe_set(qpn, index, sets, max_rd_atomic, qpn_bits):
    """The set (an int) of the WQE ``(qpn, index)`` in a WQE cache of ``sets`` sets: the
    RTL's mapping in Python, for tests and docs."""
    lw = min(max(max_rd_atomic - 1, 0).bit_length(), sets.bit_length() - 1)
    low = (index + qpn) % (1 << lw)
    return (low | (qpn << lw) | ((index >> lw) << (lw + qpn_bits))) % sets


class WqeCache(wiring.Component):
    def __init__(self, cfg: NicConfig, qpn_bits):
        if not isinstance(cfg, NicConfig):
            raise TypeError(f"cfg must be a NicConfig, not {cfg!r}")
        self.cfg = cfg
        self.qpn_bits = qpn_bits
        W = cfg.data_bytes
        self.cache = SetAssocCache(
            entry_bytes=WQE_BYTES, key_bits=16 + qpn_bits, sets=cfg.wqe_cache_sets,
            ways=cfg.wqe_cache_ways, policy=cfg.wqe_cache_policy, mshrs=cfg.wqe_cache_mshrs,
            data_bytes=W, id_bits=2, addressed=True)
        self.fill_layout = data.StructLayout({"qpn": qpn_bits, "index": 16, "wqe": WQE})
        super().__init__({
            "fill": In(stream.Signature(self.fill_layout)),
            "lk": In(WqeLookup(qpn_bits)).array(2),
            "dma_rd": Out(DmaReadPort(W)),
            "stat_hit": Out(1),
            "stat_miss": Out(1),
            "stat_evict": Out(1),
        })

    def elaborate(self, platform):
        m = Module()

        # 2**lw = min(max_rd_atomic rounded up to a power of two, sets)
        lw = min(max(self.cfg.max_rd_atomic - 1, 0).bit_length(),
                 self.cache.set_bits)

        def key_of(qpn, index):
            if lw == 0:
                return Cat(qpn, index)
            return Cat((index + qpn)[:lw], qpn, index[lw:16])

        m.submodules.cache = cache = self.cache
        m.submodules.fills = fills = SyncFIFOBuffered(width=self.fill_layout.size,
                                                      depth=FILL_DEPTH)
        m.submodules.arb = arb = StreamArbiter(cache.req_layout, 2)
        m.submodules.answers = ans = AnswerPorts(
            data.StructLayout({"info": WQE_INFO, "err": 1}), 2, cache.id_bits)
        wiring.connect(m, cache.dma_rd, wiring.flipped(self.dma_rd))
        # never dirty: the write-back port stays idle
        m.d.comb += [cache.dma_wr.wr.ready.eq(1), cache.dma_wr.done.valid.eq(0)]

        m.d.comb += [fills.w_data.eq(self.fill.payload), fills.w_en.eq(self.fill.valid),
                     self.fill.ready.eq(fills.w_rdy)]
        f = self.fill_layout(fills.r_data)
        # fills first; the lookups only while no fill is queued or offered (the count covers
        # the FIFO's own latency from w_en to r_rdy)
        queued = Signal(range(FILL_DEPTH + 2))
        m.d.sync += queued.eq(queued + (self.fill.valid & self.fill.ready)
                              - (fills.r_rdy & fills.r_en))
        hold = Signal()
        m.d.comb += hold.eq((queued != 0) | self.fill.valid)
        with m.If(fills.r_rdy):
            m.d.comb += [
                cache.req.valid.eq(1),
                cache.req.payload.op.eq(CacheOp.FILL),
                cache.req.payload.key.eq(key_of(f.qpn, f.index)),
                cache.req.payload.id.eq(2),
                cache.req.payload.data.eq(f.wqe),
                fills.r_en.eq(cache.req.ready),
            ]
        with m.Elif(~hold):
            wiring.connect(m, arb.o, cache.req)
        for k, lk in enumerate(self.lk):
            m.d.comb += [
                arb.i[k].valid.eq(lk.req.valid & ans.free[k]),
                arb.i[k].payload.op.eq(CacheOp.READ),
                arb.i[k].payload.key.eq(key_of(lk.req.payload.qpn, lk.req.payload.index)),
                arb.i[k].payload.id.eq(k),
                arb.i[k].payload.addr.eq(lk.req.payload.addr),
                arb.i[k].payload.last.eq(lk.req.payload.last),
                lk.req.ready.eq(arb.i[k].ready & ~hold & ans.free[k]),
                ans.taken[k].eq(lk.req.valid & lk.req.ready),
            ]
            wiring.connect(m, ans.o[k], wiring.flipped(lk.resp))

        # answers by id (a FILL's, id 2, is dropped), through an answer register per port
        r = cache.resp
        w = WQE(r.payload.data)
        a = ans.i.payload.data
        m.d.comb += [ans.i.valid.eq(r.valid), r.ready.eq(ans.i.ready),
                     ans.i.payload.id.eq(r.payload.id),
                     a.info.wr_id.eq(w.wr_id), a.info.local_addr.eq(w.local_addr),
                     a.info.length.eq(w.length), a.err.eq(r.payload.err)]
        look = r.valid & r.ready & (r.payload.op == CacheOp.READ)
        m.d.comb += [self.stat_hit.eq(look & r.payload.hit),
                     self.stat_miss.eq(look & ~r.payload.hit)]
        prev = Signal(32)
        m.d.sync += prev.eq(cache.evictions)
        m.d.comb += self.stat_evict.eq(cache.evictions != prev)
        return m
