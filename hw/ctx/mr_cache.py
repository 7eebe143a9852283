"""The memory-region table in host memory (ICM) behind an on-NIC MR cache.

Models where a ConnectX-style RNIC keeps its memory-key contexts (the mlx5 PRM calls them
MKey contexts, the MPT of older Mellanox NICs): in Interconnect Context Memory, a region of
host memory the driver hands to the NIC at start-up (``MAP_ICM``, :mod:`hw.rnic.context`), with
the entries the NIC uses cached on chip. Entry ``k`` of the table (the MR slot of key
``k << 8 | tag``, IBA vol. 1 rel. 1.4, 10.6.3.1 "Keys") sits at ``base + 32 * k``: the
24-byte :data:`~hw.formats.MR_ENTRY` padded to 32 bytes.

A :class:`~hw.ctx.ctx_cache.ContextCache` (a :class:`~hw.lib.cache.SetAssocCache`; sets,
ways, policy and MSHRs from :class:`~hw.config.NicConfig`: ``mr_cache_*``). Its clients
share it through one round-robin arbiter (``n = n_pus``, the requester's processing units;
with one unit ``lk[0]`` and ``lk[1]``):

* ``lk[0 .. n-1]`` the requester's units (the lkey of every send WQE with a local buffer),
* ``lk[n]`` the responder's state machine (the lkey of a receive WQE),
* ``lk[n + 1 ..]`` the responder's request lookahead (the rkey of a WRITE / READ / atomic
  request; ``rsp_lookahead`` ports used in turn, hw/rnic/request_lookup.py),
* ``wr`` the command interface (``SET_MR``): a WRITE of the whole entry, which allocates the
  line dirty; the host copy is written when the line is evicted (write-back).

The cache takes one request at a time, so a lookup that follows a ``SET_MR`` into the cache
sees the new entry. A lookup whose fill fails (a DMA error) answers ``err``: the consumer
treats the key as invalid. A miss costs one 32-byte DMA read over the host interface (and a
32-byte write if the victim is dirty); a hit costs the cache's pipeline, four cycles from
request to response (docs/caches.md).

Ports: ``base: In(64)`` (the ICM base of the table), ``lk: In(CtxLookup(slot_bits,
MR_ENTRY)).array(n_pus + 1 + rsp_lookahead)``, ``wr: In(stream of {slot, entry})``, ``dma_rd: Out(DmaReadPort)``,
``dma_wr: Out(DmaWritePort)``, and one-cycle counter increments ``stat_hit``,
``stat_miss``, ``stat_evict``, ``stat_writeback``.
"""

from ..config import NicConfig
from ..formats import MR_ENTRY
from ..regmap import MR_ICM_ENTRY_BYTES
from .ctx_cache import ContextCache

__all__ = ["MrCache", "MR_ICM_ENTRY_BYTES"]


class MrCache(ContextCache):
    def __init__(self, cfg: NicConfig):
        super().__init__(cfg, layout=MR_ENTRY, n_entries=getattr(cfg, "n_mrs", 2),
                         entry_bytes=MR_ICM_ENTRY_BYTES, prefix="mr_cache",
                         n_lookups=cfg.n_pus + 1 + cfg.rsp_lookahead)
