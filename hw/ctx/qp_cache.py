"""The QP-context table in host memory (ICM) behind an on-NIC QP-context cache.

Models where a ConnectX-style RNIC keeps its queue-pair contexts (the QPC of the mlx5 PRM):
in Interconnect Context Memory, a region of host memory the driver hands to the NIC at
start-up (``MAP_ICM``, :mod:`hw.rnic.context`), with the contexts of the QPs in use cached on
chip. A NIC that serves more QPs than its cache holds reads contexts over PCIe: the
connection-scalability cliff that FaRM, eRPC and SMART (ASPLOS'24, section 3) describe.
Entry ``q`` (QP number ``q``) sits at ``base + 32 * q``: the 235-bit
:data:`~hw.regmap.QP_CTX` padded to 32 bytes.

Only the static context (queues, CQs, PD, destination, limits and timers: what ``SET_QP``
writes) is in ICM. The QP state (RESET .. ERR) stays on chip in the context block, and the
engines keep their per-QP dynamic state (indices, PSNs, retry state) in their own memories
(docs/architecture.md, "Where state lives").

A :class:`~hw.ctx.ctx_cache.ContextCache` (a :class:`~hw.lib.cache.SetAssocCache`; sets,
ways, policy and MSHRs from :class:`~hw.config.NicConfig`: ``qp_cache_*``). Its clients
share it through one round-robin arbiter (``n = n_pus``, the requester's processing units,
hw/rnic/requester_units.py; with one unit: ``lk[0]``, ``lk[1]``, ``lk[2 ..]``):

* ``lk[0 .. n-1]`` the send engine of each unit (a flush: the send queue and the send CQ),
* ``lk[n .. 2n-1]`` the WQE-fetch issue of each unit (every batch of send WQEs it fetches),
* ``lk[2n ..]`` the responder's request lookahead (every request packet; ``rsp_lookahead``
  ports used in turn, hw/rnic/request_lookup.py),
* ``wr`` the command interface (``SET_QP``): a WRITE of the whole context, which
  allocates the line dirty; the host copy is written when the line is evicted.

The cache takes one request at a time, so a lookup that follows a ``SET_QP`` into the cache
sees the new context. A lookup whose fill fails (a DMA error) answers ``err`` (the requester
puts the QP in ERR, the responder drops the packet). A miss costs one 32-byte DMA read over
the host interface (and a 32-byte write if the victim is dirty); a hit costs the cache's
pipeline, four cycles from request to response (docs/caches.md).
"""

from ..config import NicConfig
from ..regmap import QP_CTX, QP_ICM_ENTRY_BYTES
from .ctx_cache import ContextCache

__all__ = ["QpCache", "QP_ICM_ENTRY_BYTES"]


class QpCache(ContextCache):
    def __init__(self, cfg: NicConfig):
        super().__init__(cfg, layout=QP_CTX, n_entries=cfg.n_qps,
                         entry_bytes=QP_ICM_ENTRY_BYTES, prefix="qp_cache",
                         n_lookups=2 * cfg.n_pus + cfg.rsp_lookahead)
