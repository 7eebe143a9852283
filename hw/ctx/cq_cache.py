"""The completion-queue context table in host memory (ICM) behind an on-NIC CQ cache.

Models where a ConnectX-style RNIC keeps its CQ contexts (the mlx5 PRM's CQC): in
Interconnect Context Memory (``MAP_ICM`` with table ``IcmTable.CQ``), the contexts in use
cached on chip, as for memory keys (:mod:`hw.ctx.mr_cache`). Entry ``k`` (CQ number ``k``)
sits at ``base + 32 * k``: the :data:`~hw.regmap.CQ_CTX` (ring base and log2 size)
zero-padded to 32 bytes. The CQ's producer and consumer indices and its error state stay
in the completion engine (:mod:`hw.rnic.completion`), which updates them on every CQE.

A :class:`~hw.ctx.ctx_cache.ContextCache` (sets, ways, policy and MSHRs from
:class:`~hw.config.NicConfig`: ``cq_cache_*``) with two clients:

* ``lk[0 .. cq_lookups-1]`` the completion engine: the context of the CQ of every completion
  it writes (its lookups in flight, one per port: hw/rnic/completion.py);
* ``wr`` the command interface (``SET_CQ``): the whole context, allocated dirty and written
  to ICM when evicted.

A lookup whose fill fails (a DMA error) answers ``err``: the completion engine puts that
CQ in error (docs/errors.md). Costs as for the MR cache: a miss is one 32-byte DMA read
(and a 32-byte write for a dirty victim), a hit four cycles (docs/caches.md).
"""

from ..config import NicConfig
from ..regmap import CQ_CTX, CQ_ICM_ENTRY_BYTES
from .ctx_cache import ContextCache

__all__ = ["CqCache", "CQ_ICM_ENTRY_BYTES"]


class CqCache(ContextCache):
    def __init__(self, cfg: NicConfig):
        super().__init__(cfg, layout=CQ_CTX, n_entries=getattr(cfg, "n_cqs", 2),
                         entry_bytes=CQ_ICM_ENTRY_BYTES, prefix="cq_cache",
                         n_lookups=cfg.cq_lookups)
