"""The memory-region table in host memory (ICM) behind an on-NIC MR cache.

Models where a ConnectX-style RNIC keeps its memory-key contexts (the mlx5 PRM calls them
MKey contexts, the MPT of older Mellanox NICs): in Interconnect Context Memory, a region of
host memory the driver hands to the NIC at start-up (``MAP_ICM``, :mod:`hw.context`), with
the entries the NIC uses cached on chip. Entry ``k`` of the table (the MR slot of key
``k << 8 | tag``, IBA vol. 1 rel. 1.4, 10.6.3.1 "Keys") sits at ``base + 32 * k``: the
24-byte :data:`~hw.formats.MR_ENTRY` padded to 32 bytes.

The cache is :class:`~hw.lib.cache.SetAssocCache` (sets, ways, policy and MSHRs from
:class:`~hw.config.NicConfig`: ``mr_cache_*``). Three clients share it through one
round-robin arbiter:

* ``lk[0]`` the requester (the lkey of every send WQE with a local buffer),
* ``lk[1]`` the responder (the rkey of a WRITE / READ / atomic request, the lkey of a
  receive WQE),
* ``wr`` the command interface (``SET_MR``): a WRITE of the whole entry, which allocates the
  line dirty; the host copy is written when the line is evicted (write-back).

The cache takes one request at a time, so a lookup that follows a ``SET_MR`` into the cache
sees the new entry. A lookup whose fill fails (a DMA error) answers ``err``: the consumer
treats the key as invalid. A miss costs one 32-byte DMA read over the host interface (and a
32-byte write if the victim is dirty); a hit costs the cache's pipeline, four cycles from
request to response (docs/caches.md).

Ports: ``base: In(64)`` (the ICM base of the table), ``lk: In(CtxLookup(slot_bits,
MR_ENTRY)).array(2)``, ``wr: In(stream of {slot, entry})``, ``dma_rd: Out(DmaReadPort)``,
``dma_wr: Out(DmaWritePort)``, and one-cycle counter increments ``stat_hit``,
``stat_miss``, ``stat_evict``, ``stat_writeback``.
"""

from amaranth.hdl import Module, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from ..arbiter import StreamArbiter
from ..config import NicConfig
from ..formats import MR_ENTRY
from ..interfaces import CtxLookup, DmaReadPort, DmaWritePort
from ..lib.cache import CacheOp, SetAssocCache
from ..regmap import MR_ICM_ENTRY_BYTES

__all__ = ["MrCache", "MR_ICM_ENTRY_BYTES"]

_STATS = (("stat_hit", "hits"), ("stat_miss", "misses"), ("stat_evict", "evictions"),
          ("stat_writeback", "writebacks"))


class MrCache(wiring.Component):
    def __init__(self, cfg: NicConfig):
        if not isinstance(cfg, NicConfig):
            raise TypeError(f"cfg must be a NicConfig, not {cfg!r}")
        assert MR_ENTRY.size <= 8 * MR_ICM_ENTRY_BYTES
        self.cfg = cfg
        self.slot_bits = max(1, ceil_log2(cfg.n_mrs))
        W = cfg.data_bytes
        self.cache = SetAssocCache(
            entry_bytes=MR_ICM_ENTRY_BYTES, key_bits=self.slot_bits, sets=cfg.mr_cache_sets,
            ways=cfg.mr_cache_ways, policy=cfg.mr_cache_policy, mshrs=cfg.mr_cache_mshrs,
            data_bytes=W, id_bits=2)
        super().__init__({
            "base": In(64),
            "lk": In(CtxLookup(self.slot_bits, MR_ENTRY)).array(2),
            "wr": In(stream.Signature(data.StructLayout({
                "slot": self.slot_bits, "entry": MR_ENTRY}))),
            "dma_rd": Out(DmaReadPort(W)),
            "dma_wr": Out(DmaWritePort(W)),
            **{name: Out(1) for name, _ in _STATS},
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.cache = cache = self.cache
        m.submodules.arb = arb = StreamArbiter(cache.req_layout, 3)
        m.d.comb += cache.base.eq(self.base)
        wiring.connect(m, arb.o, cache.req)
        wiring.connect(m, cache.dma_rd, wiring.flipped(self.dma_rd))
        wiring.connect(m, cache.dma_wr, wiring.flipped(self.dma_wr))

        # requests: the lookups (id = port) and the command interface's writes (id 2)
        for k, lk in enumerate(self.lk):
            m.d.comb += [
                arb.i[k].valid.eq(lk.req.valid),
                arb.i[k].payload.op.eq(CacheOp.READ),
                arb.i[k].payload.key.eq(lk.req.payload.index),
                arb.i[k].payload.id.eq(k),
                lk.req.ready.eq(arb.i[k].ready),
            ]
        m.d.comb += [
            arb.i[2].valid.eq(self.wr.valid),
            arb.i[2].payload.op.eq(CacheOp.WRITE),
            arb.i[2].payload.key.eq(self.wr.payload.slot),
            arb.i[2].payload.id.eq(2),
            arb.i[2].payload.data.eq(self.wr.payload.entry),
            self.wr.ready.eq(arb.i[2].ready),
        ]

        # responses by id; a WRITE's answer is dropped (the write is in order already)
        r = cache.resp
        m.d.comb += r.ready.eq(r.payload.id == 2)
        for k, lk in enumerate(self.lk):
            m.d.comb += [
                lk.resp.valid.eq(r.valid & (r.payload.id == k)),
                lk.resp.payload.data.eq(r.payload.data[:MR_ENTRY.size]),
                lk.resp.payload.err.eq(r.payload.err),
            ]
            with m.If(r.payload.id == k):
                m.d.comb += r.ready.eq(lk.resp.ready)

        # counters: the cache's totals, as one-cycle increments (each moves by at most 1)
        for name, total in _STATS:
            value = getattr(cache, total)
            prev = Signal(32, name=f"prev_{total}")
            m.d.sync += prev.eq(value)
            m.d.comb += getattr(self, name).eq(value != prev)
        return m
