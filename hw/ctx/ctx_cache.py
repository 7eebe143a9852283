"""A context table in host memory (ICM) behind an on-NIC cache, with lookup and write ports.

Models how a ConnectX-style RNIC keeps its contexts (memory keys, completion queues, ...):
in Interconnect Context Memory, a region of host memory the driver hands to the NIC at
start-up (``MAP_ICM``, :mod:`hw.rnic.context`), with the entries in use cached on chip. Entry
``k`` of a table sits at ``base + entry_bytes * k`` (the context layout zero-padded to
``entry_bytes``). :class:`~hw.ctx.mr_cache.MrCache` and :class:`~hw.ctx.cq_cache.CqCache`
are the two instances.

The cache is :class:`~hw.lib.cache.SetAssocCache` (sets, ways, policy, MSHRs). The clients
share it through one round-robin arbiter:

* ``lk[0 .. n_lookups-1]``: request / response lookups (``CtxLookup``): the entry, or
  ``err`` if its fill failed (a DMA error: the consumer treats the context as invalid);
* ``wr``: the command interface writes a whole entry (``SET_MR``, ``SET_CQ``): it allocates
  the line dirty, and the host copy is written when the line is evicted (write-back).

The cache takes one request at a time, so a lookup that follows a write into the cache
sees the new entry. Each lookup port has one request outstanding at most and an answer
register of its own (hw/lib/answer_ports.py): a client that takes its answer late holds
no one else's. A miss costs one ``entry_bytes`` DMA read over the host interface (and
a write of as many bytes if the victim is dirty); a hit costs the cache's pipeline, four
cycles from request to response (docs/caches.md).

Ports: ``base: In(64)`` (the ICM address of the table), ``lk: In(CtxLookup(slot_bits,
layout)).array(n_lookups)``, ``wr: In(stream of {slot, entry})``, ``dma_rd:
Out(DmaReadPort)``, ``dma_wr: Out(DmaWritePort)``, and one-cycle counter increments
``stat_hit``, ``stat_miss``, ``stat_evict``, ``stat_writeback``; ``stat_busy``, high while
the cache's state machine is not idle (its occupancy).
"""

from amaranth.hdl import Module, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from ..lib.answer_ports import AnswerPorts
from ..lib.arbiter import StreamArbiter
from ..config import NicConfig
from ..interfaces import CtxLookup, DmaReadPort, DmaWritePort
from ..lib.cache import CacheOp, SetAssocCache
from ..lib.checks import check_int

__all__ = ["ContextCache"]

_STATS = (("stat_hit", "hits"), ("stat_miss", "misses"), ("stat_evict", "evictions"),
          ("stat_writeback", "writebacks"))


class ContextCache(wiring.Component):
    """``n_entries`` contexts of ``layout`` in ICM behind a cache configured by the
    ``<prefix>_sets``, ``_ways``, ``_policy`` and ``_mshrs`` fields of ``cfg``."""

    def __init__(self, cfg, *, layout, n_entries, entry_bytes, prefix, n_lookups):
        if not isinstance(cfg, NicConfig):
            raise TypeError(f"cfg must be a NicConfig, not {cfg!r}")
        check_int("n_lookups", n_lookups, 1, 20)
        if layout.size > 8 * entry_bytes:
            raise ValueError(f"entry_bytes must hold the {layout.size}-bit context, "
                             f"not {entry_bytes!r}")
        self.cfg = cfg
        self.layout = layout
        self.n_lookups = n_lookups
        self.slot_bits = max(1, ceil_log2(n_entries))
        W = cfg.data_bytes
        self.cache = SetAssocCache(
            entry_bytes=entry_bytes, key_bits=self.slot_bits,
            sets=getattr(cfg, f"{prefix}_sets"), ways=getattr(cfg, f"{prefix}_ways"),
            policy=getattr(cfg, f"{prefix}_policy"), mshrs=getattr(cfg, f"{prefix}_mshrs"),
            data_bytes=W, id_bits=max(2, n_lookups.bit_length()))
        super().__init__({
            "base": In(64),
            "lk": In(CtxLookup(self.slot_bits, layout)).array(n_lookups),
            "wr": In(stream.Signature(data.StructLayout({
                "slot": self.slot_bits, "entry": layout}))),
            "dma_rd": Out(DmaReadPort(W)),
            "dma_wr": Out(DmaWritePort(W)),
            **{name: Out(1) for name, _ in _STATS},
            "stat_busy": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        nl = self.n_lookups
        m.submodules.cache = cache = self.cache
        m.submodules.arb = arb = StreamArbiter(cache.req_layout, nl + 1)
        m.d.comb += [cache.base.eq(self.base), self.stat_busy.eq(cache.stat_busy)]
        wiring.connect(m, arb.o, cache.req)
        wiring.connect(m, cache.dma_rd, wiring.flipped(self.dma_rd))
        wiring.connect(m, cache.dma_wr, wiring.flipped(self.dma_wr))

        # answers: one register per lookup port, one request outstanding per port
        # (hw/lib/answer_ports.py); a WRITE's answer (id nl) is dropped
        resp_layout = data.StructLayout({"data": self.layout, "err": 1})
        m.submodules.answers = ans = AnswerPorts(resp_layout, nl, cache.id_bits)

        # requests: the lookups (id = port) and the command interface's writes (id nl)
        for k, lk in enumerate(self.lk):
            m.d.comb += [
                arb.i[k].valid.eq(lk.req.valid & ans.free[k]),
                arb.i[k].payload.op.eq(CacheOp.READ),
                arb.i[k].payload.key.eq(lk.req.payload.index),
                arb.i[k].payload.id.eq(k),
                lk.req.ready.eq(arb.i[k].ready & ans.free[k]),
                ans.taken[k].eq(lk.req.valid & lk.req.ready),
            ]
            wiring.connect(m, ans.o[k], wiring.flipped(lk.resp))
        m.d.comb += [
            arb.i[nl].valid.eq(self.wr.valid),
            arb.i[nl].payload.op.eq(CacheOp.WRITE),
            arb.i[nl].payload.key.eq(self.wr.payload.slot),
            arb.i[nl].payload.id.eq(nl),
            arb.i[nl].payload.data.eq(self.wr.payload.entry),
            self.wr.ready.eq(arb.i[nl].ready),
        ]

        r = cache.resp
        m.d.comb += [ans.i.valid.eq(r.valid), r.ready.eq(ans.i.ready),
                     ans.i.payload.id.eq(r.payload.id),
                     ans.i.payload.data.data.eq(r.payload.data[:self.layout.size]),
                     ans.i.payload.data.err.eq(r.payload.err)]

        # counters: the cache's totals, as one-cycle increments (each moves by at most 1)
        for name, total in _STATS:
            value = getattr(cache, total)
            prev = Signal(32, name=f"prev_{total}")
            m.d.sync += prev.eq(value)
            m.d.comb += getattr(self, name).eq(value != prev)
        return m
