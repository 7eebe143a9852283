"""Configuration of the RNIC model: a few frozen dataclasses with named presets.

Every latency is given in nanoseconds and converted to NIC clock cycles with
:meth:`NicConfig.cycles`, so that a preset reads like a datasheet. Structural
parameters (queue counts, data-path width) size the RTL; timing parameters only
change delays.

Every constructor checks its values and raises :class:`ValueError` naming the
parameter and its allowed range, so that a bad experiment setting fails before
any Verilog is generated.
"""

from dataclasses import dataclass, field, replace
import math

__all__ = ["NicConfig", "LinkConfig", "HostConfig", "SystemConfig", "PRESETS", "preset", "HOST_KINDS", "MAX_QPS"]


from .lib.checks import check_int as _check_range, check_number as _check_float, check_pow2 as _check_pow2, check_mtu  # noqa: E402


# the largest n_qps (a power of two) the NIC accepts
MAX_QPS = 16384


@dataclass(frozen=True)
class NicConfig:
    """One RNIC: sizes of its tables and its internal latencies.

    data_bytes      width of every internal stream (packets, DMA), bytes per beat.
    clock_mhz       NIC core clock.
    n_qps           queue pairs (QPN 0 .. n_qps-1 are local QP numbers).
    n_cqs           completion queues.
    n_mrs           memory-region table entries.
    n_doorbells     doorbell registers on the MMIO bus (mlx5: 16 by default, at most 512).
    mtu             RoCE path MTU in bytes (256 .. 4096).
    max_rd_atomic   outstanding READ / atomic requests per QP (ConnectX: 16).
    max_outstanding outstanding packets tracked per QP by the requester.
    pipeline_ns     fixed processing latency added by the NIC per packet in each direction.
    dma_tags        PCIe read tags: read requests of the DMA engine in flight (PCIe: 32, or
                    256 with extended tags).
    max_read_request  PCIe Max_Read_Request_Size: DMA reads are split into requests of at
                    most this many bytes (a power of two in [128, 4096]).
    max_payload     PCIe Max_Payload_Size: DMA writes are split into TLPs of at most this
                    many bytes (a power of two in [128, 4096]).
    tlp_overhead    bytes of header and framing per TLP on the host link, counted in the
                    host-interface counters and charged by the link model (PCIe: 20-28).
    dma_write_outstanding  write TLPs whose response the DMA engine may wait for at once
                    (PCIe posted writes wait for no completion: the bound stands for the
                    posted-credit pool).

    Structural constants of the pipeline (they shape throughput and latency under load, so
    they are fields, recorded in every summary.json with the rest of the configuration):

    n_pus           the requester's processing units (a power of two in [1, 8], at most
                    ``n_qps / 2`` and ``wqe_cache_sets``): copies of the requester, each
                    serving the QPs with ``qpn % n_pus`` equal to its index, with its own send
                    and response engines and its share of the WQE cache
                    (hw/rnic/requester_units.py). The fields below are per unit.
    pu_rx_headers   response-packet headers queued in front of each unit when ``n_pus`` > 1
                    (hw/lib/packet_fifo.py: the router hands a packet on without waiting for
                    the unit's response engine to be idle).
    pu_rx_beats     response payload beats queued in front of each unit (with the headers).
    wqe_batch       WQEs read by one WQE-fetch DMA read (consecutive WQEs of one QP).
    fetch_depth     WQE fetches (of different QPs) in flight at once.
    desc_depth      request-packet headers queued between the send engine and the emitter.
    bf_entries      BlueFlame WQEs held until the send engine takes them.
    read_buffers    the responder's READ payload ring, in MTUs.
    pay_buffers     the requester's payload buffer (hw/rnic/packet_emitter.py), in MTUs:
                    payload reads of that many packets may be in flight or buffered.
    gate_depth      completions and responses each write gate holds while the host answers
                    the writes before them (hw/lib/write_gate.py; requester and responder).
    replay_slots    the responder's atomic replay cache, results kept per QP: 16, at least
                    ``max_rd_atomic`` (a retransmitted atomic must still be in it); other
                    values need a wider replay pointer in the responder's QP state.
    doorbell_fifo_depth  receive and CQ doorbells queued in the doorbell block.
    cq_lookups      the completion engine's CQ-context lookup ports (1 .. 4), used in turn:
                    that many CQ lookups in flight at once (hw/rnic/completion.py), so a CQE
                    does not wait for its context's lookup latency after the one before.
    rsp_lookahead   request packets the responder looks up ahead (1 .. 4): their QP-context and
                    rkey lookups in flight while it executes the packet before them, on as
                    many lookup port pairs (hw/rnic/request_lookup.py).
    atomic_inflight the responder's atomic unit: operations in flight at once (1 .. 16),
                    serialised per 8-byte address (hw/rnic/atomic.py); 1 executes one atomic at a
                    time for the whole NIC.
    rq_prefetch     the responder's receive-WQE prefetch (hw/ctx/rq_prefetch.py): receive
                    WQE reads in flight at once (1 .. 16), of different QPs.

    The memory-region cache (MR contexts live in host memory, ICM; docs/caches.md):

    mr_cache_sets   sets of the MR cache (a power of two, at most ``n_mrs``).
    mr_cache_ways   ways per set (1 .. 16; a power of two for ``"plru"``).
    mr_cache_policy replacement policy, ``"lru"`` or ``"plru"`` (tree pseudo-LRU).
    mr_cache_mshrs  misses of the MR cache in flight at once (1 .. 16).

    The completion-queue context cache (CQ contexts live in ICM too; docs/caches.md):

    cq_cache_sets, cq_cache_ways, cq_cache_policy, cq_cache_mshrs  as for the MR cache
                    (sets at most ``n_cqs``).

    The QP-context cache (QP contexts live in ICM; docs/caches.md):

    qp_cache_sets, qp_cache_ways, qp_cache_policy, qp_cache_mshrs  as for the MR cache
                    (sets at most ``n_qps``).

    The requester's WQE cache (the send WQEs of outstanding requests; docs/caches.md):

    wqe_cache_sets, wqe_cache_ways, wqe_cache_policy, wqe_cache_mshrs  as for the MR cache
                    (sets a power of two in [1, 65536]).
    """

    data_bytes: int = 64
    clock_mhz: float = 250.0
    n_qps: int = 16
    n_cqs: int = 16
    n_mrs: int = 16
    n_doorbells: int = 16
    mtu: int = 4096
    max_rd_atomic: int = 16
    max_outstanding: int = 32
    pipeline_ns: float = 0.0
    dma_tags: int = 32
    max_read_request: int = 512
    max_payload: int = 256
    tlp_overhead: int = 24
    dma_write_outstanding: int = 32
    n_pus: int = 1
    pu_rx_headers: int = 4
    pu_rx_beats: int = 16
    wqe_batch: int = 4
    fetch_depth: int = 4
    desc_depth: int = 8
    bf_entries: int = 4
    read_buffers: int = 4
    pay_buffers: int = 4
    gate_depth: int = 64
    replay_slots: int = 16
    atomic_inflight: int = 4
    rq_prefetch: int = 4
    doorbell_fifo_depth: int = 16
    cq_lookups: int = 2
    rsp_lookahead: int = 2
    mr_cache_sets: int = 2
    mr_cache_ways: int = 2
    mr_cache_policy: str = "lru"
    mr_cache_mshrs: int = 2
    cq_cache_sets: int = 2
    cq_cache_ways: int = 2
    cq_cache_policy: str = "lru"
    cq_cache_mshrs: int = 2
    qp_cache_sets: int = 2
    qp_cache_ways: int = 2
    qp_cache_policy: str = "lru"
    qp_cache_mshrs: int = 2
    wqe_cache_sets: int = 16
    wqe_cache_ways: int = 4
    wqe_cache_policy: str = "lru"
    wqe_cache_mshrs: int = 2

    def __post_init__(self):
        _check_pow2("data_bytes", self.data_bytes, 8, 64)
        _check_float("clock_mhz", self.clock_mhz, 1.0, 1000.0)
        _check_pow2("n_qps", self.n_qps, 2, MAX_QPS)
        _check_pow2("n_cqs", self.n_cqs, 2, 1024)
        _check_pow2("n_mrs", self.n_mrs, 2, 256)
        _check_range("n_doorbells", self.n_doorbells, 1, 512)
        check_mtu(self.mtu)
        _check_range("max_rd_atomic", self.max_rd_atomic, 1, 16)
        _check_pow2("max_outstanding", self.max_outstanding, 2, 256)
        _check_float("pipeline_ns", self.pipeline_ns, 0.0, 100_000.0)
        _check_range("dma_tags", self.dma_tags, 1, 256)
        _check_pow2("max_read_request", self.max_read_request, 128, 4096)
        _check_pow2("max_payload", self.max_payload, 128, 4096)
        _check_range("tlp_overhead", self.tlp_overhead, 0, 256)
        _check_pow2("dma_write_outstanding", self.dma_write_outstanding, 2, 256)
        _check_pow2("pu_rx_headers", self.pu_rx_headers, 2, 256)
        _check_pow2("pu_rx_beats", self.pu_rx_beats, 2, 1024)
        _check_pow2("wqe_batch", self.wqe_batch, 1, 4)
        _check_range("fetch_depth", self.fetch_depth, 1, 16)
        _check_pow2("desc_depth", self.desc_depth, 2, 64)
        _check_range("bf_entries", self.bf_entries, 1, 16)
        _check_pow2("read_buffers", self.read_buffers, 2, 16)
        _check_range("pay_buffers", self.pay_buffers, 1, 16)
        _check_pow2("gate_depth", self.gate_depth, 2, 1024)
        _check_range("atomic_inflight", self.atomic_inflight, 1, 16)
        _check_range("rq_prefetch", self.rq_prefetch, 1, 16)
        if self.replay_slots != 16:
            # the responder's per-QP replay pointer is 4 bits; 16 >= max_rd_atomic (<= 16)
            raise ValueError(f"replay_slots must be 16 (the responder's replay pointer is 4 bits), "
                             f"not {self.replay_slots!r}")
        _check_pow2("doorbell_fifo_depth", self.doorbell_fifo_depth, 2, 256)
        _check_range("cq_lookups", self.cq_lookups, 1, 4)
        _check_range("rsp_lookahead", self.rsp_lookahead, 1, 4)
        self._check_cache("mr_cache", self.n_mrs)
        self._check_cache("cq_cache", self.n_cqs)
        self._check_cache("qp_cache", self.n_qps)
        self._check_cache("wqe_cache", 1 << 16)
        _check_pow2("n_pus", self.n_pus, 1, max(1, min(8, self.n_qps // 2, self.wqe_cache_sets)))

    def _check_cache(self, prefix, max_sets):
        """The four fields ``<prefix>_sets``, ``_ways``, ``_policy``, ``_mshrs`` of a cache."""
        sets, ways, policy, mshrs = (getattr(self, f"{prefix}_{f}")
                                     for f in ("sets", "ways", "policy", "mshrs"))
        _check_pow2(f"{prefix}_sets", sets, 1, max_sets)
        _check_range(f"{prefix}_ways", ways, 1, 16)
        if policy not in ("lru", "plru"):
            raise ValueError(f"{prefix}_policy must be one of ('lru', 'plru'), not {policy!r}")
        if policy == "plru":
            _check_pow2(f"{prefix}_ways", ways, 1, 16)
        _check_range(f"{prefix}_mshrs", mshrs, 1, 16)

    @property
    def period_ns(self):
        return 1000.0 / self.clock_mhz

    def cycles(self, ns):
        """Nanoseconds to whole NIC cycles (rounded to nearest, at least 0)."""
        return max(0, int(round(ns * self.clock_mhz / 1000.0)))


@dataclass(frozen=True)
class LinkConfig:
    """A point-to-point link between two NIC ports, one direction: a fixed delay (standing in
    for cable and switch latency; no switch queueing or congestion is modelled) and a
    serialisation rate.

    latency_ns   propagation plus switching delay, first bit out to first bit in.
    gbps         serialisation rate in Gb/s.
    """

    latency_ns: float = 500.0
    gbps: float = 200.0

    def __post_init__(self):
        _check_float("latency_ns", self.latency_ns, 0.0, 10_000_000.0)
        _check_float("gbps", self.gbps, 0.1, 1600.0)


HOST_KINDS = ("python", "rtl")


@dataclass(frozen=True)
class HostConfig:
    """The host behind a NIC's PCIe port (docs/host-interface.md).

    kind           ``"python"``: host memory and behaviour in Python (sim/host.py) behind an
                   RTL adapter; ``"rtl"``: host memory in on-chip RAM (hw/host/rtl_host.py),
                   Python only as the host CPU. Both sit behind the same link model.
    pcie_ns        one-way latency of the PCIe link and root complex, NIC to host memory
                   (and back): a write is in host memory this long after it left the NIC.
    host_mem_ns    from a read request's arrival at the host to its first completion
                   (the memory access); a DMA read's round trip is 2 * pcie_ns + host_mem_ns.
    pcie_gbps      bandwidth of the link in each direction, TLP overhead included.
    mmio_ns        latency of an MMIO access (CPU store or load) reaching the NIC.
    cpl_bytes      the host answers reads in completions of this size, aligned (a multiple
                   of the 64-byte read completion boundary, at most max_payload).
    rtl_mem_bytes  size of the RTL host's memory (power of two); it starts at rtl_mem_base.
                   Default 1 MB: Amaranth emits a memory's initial contents word by word,
                   and converting 4 MB (two nodes) to Verilog took over 8 minutes.
    rtl_mem_base   byte address of the RTL host's memory window (a multiple of its size).
    reorder        Python host only: probability that a read's completions are sent after
                   the next read's (seeded completion reordering); 0 keeps arrival order.
    blueflame      the driver posts a single work request by BlueFlame (the WQE in one
                   64-byte MMIO write that is also the doorbell; as mlx5 with
                   MLX5_PREFER_BF or an inline WQE), else by an 8-byte doorbell only.
    """

    kind: str = "python"
    pcie_ns: float = 150.0
    host_mem_ns: float = 100.0
    pcie_gbps: float = 128.0
    mmio_ns: float = 100.0
    cpl_bytes: int = 64
    rtl_mem_bytes: int = 1 << 20
    rtl_mem_base: int = 0x1000_0000
    reorder: float = 0.0
    blueflame: bool = True

    def __post_init__(self):
        if self.kind not in HOST_KINDS:
            raise ValueError(f"kind must be one of {list(HOST_KINDS)}, not {self.kind!r}")
        _check_float("pcie_ns", self.pcie_ns, 0.0, 1_000_000.0)
        _check_float("host_mem_ns", self.host_mem_ns, 0.0, 1_000_000.0)
        _check_float("pcie_gbps", self.pcie_gbps, 0.1, 2000.0)
        _check_float("mmio_ns", self.mmio_ns, 0.0, 1_000_000.0)
        _check_pow2("cpl_bytes", self.cpl_bytes, 64, 4096)
        _check_pow2("rtl_mem_bytes", self.rtl_mem_bytes, 1 << 12, 1 << 30)
        if (not isinstance(self.rtl_mem_base, int) or isinstance(self.rtl_mem_base, bool)
                or self.rtl_mem_base < 0 or self.rtl_mem_base % self.rtl_mem_bytes):
            raise ValueError(f"rtl_mem_base must be a non-negative multiple of rtl_mem_bytes "
                             f"({self.rtl_mem_bytes}), not {self.rtl_mem_base!r}")
        _check_float("reorder", self.reorder, 0.0, 0.99)
        if not isinstance(self.blueflame, bool):
            raise ValueError(f"blueflame must be True or False, not {self.blueflame!r}")

    @property
    def dma_read_ns(self):
        """Round trip of a one-word DMA read on an idle link, request out to data in."""
        return 2 * self.pcie_ns + self.host_mem_ns

    @property
    def dma_write_ns(self):
        """A DMA write is in host memory this long after it left the NIC."""
        return self.pcie_ns


@dataclass(frozen=True)
class SystemConfig:
    """Everything one simulation needs: the NIC design, its host and the link."""

    name: str = "default"
    nic: NicConfig = field(default_factory=NicConfig)
    host: HostConfig = field(default_factory=HostConfig)
    link: LinkConfig = field(default_factory=LinkConfig)
    calibration: str = "not calibrated"

    def replace(self, **kw):
        """Copy with top-level fields or dotted sub-fields replaced: ``nic__n_qps=32``."""
        top = {}
        subs = {"nic": {}, "host": {}, "link": {}}
        for key, value in kw.items():
            if "__" in key:
                part, name = key.split("__", 1)
                if part not in subs:
                    raise ValueError(f"unknown configuration part {part!r}; use nic, host or link")
                subs[part][name] = value
            else:
                top[key] = value
        for part, changes in subs.items():
            if changes:
                top[part] = replace(getattr(self, part), **changes)
        new = replace(self, **top)
        if new.host.cpl_bytes > new.nic.max_payload:
            raise ValueError(f"host.cpl_bytes must be at most nic.max_payload "
                             f"({new.nic.max_payload}), not {new.host.cpl_bytes!r}")
        return new

    def __post_init__(self):
        if self.host.cpl_bytes > self.nic.max_payload:
            raise ValueError(f"host.cpl_bytes must be at most nic.max_payload "
                             f"({self.nic.max_payload}), not {self.host.cpl_bytes!r}")


# ConnectX-6 at 200 Gb/s behind one switch, as in the SMART testbed. The latencies are
# split so that an 8-byte READ round trip comes to about 2.35 us (SMART: 12
# threads at depth 1 give 5.1 Mops); see docs/timing.md for the derivation. desc_depth 32:
# a request header waits in that queue while its payload is
# read from host memory (about 100 cycles here), so the queue's depth over that latency
# caps the WRITE rate (Little's law: 8 headers gave 0.073 WRITEs per cycle; 32 cover the
# latency at up to 0.32 per cycle). Chosen from the mechanism, not fitted to a figure.
# dma_tags 256 (PCIe's 8-bit extended Tag field; a ConnectX-6 is a PCIe 4.0 device, which may
# use 10-bit tags) and dma_write_outstanding 256: with 32 of either, Little's law over a PCIe
# round trip of about 100 cycles caps the 8-byte READs a responder reads (one tag each) and
# the writes a requester waits for (data and CQE, a response each) at about 0.3 per cycle,
# 80 Mops, below the card's 111. Chosen from the mechanism, not fitted to a figure.
# cq_lookups 4: a CQ-context lookup takes about five cycles from request to the next request
# on its port, so a CQE every 2.25 cycles (111 Mops, one completion each) needs more than two
# in flight (Little's law); with 2 the completion engine capped both peaks at about 59 Mops.
# Chosen from the mechanism, not fitted to a figure.
# n_pus 4 (since 152833b; one before): the card's 8-byte peaks are those of
# several processing units (SMART, ASPLOS'24, section 2.2). One unit's send engine costs
# four cycles per one-packet WQE and its response engine four per response (553dff1), so
# one unit reaches about 40 Mops (37 / 39 on 1cb29f9); four reach 98.79 READ and 77.19
# WRITE Mops on 553dff1 (docs/performance.md). Chosen from the mechanism (the units' cycles
# per operation against the card's 111 / 92 Mops), not fitted per point.
# fetch_depth 16 per unit: a batch of four WQEs is in flight about 140 cycles (a PCIe round
# trip plus queueing), so 4 batches in flight cap a unit at about 0.11 WQEs per cycle (28
# Mops: one unit's READ and WRITE peaks were both 27.12 Mops on 1cb29f9 with 4) and a unit's
# share of 111 Mops needs more than five (Little's law). With the slower response engines
# before 1cb29f9, 16 let one unit's send engine outrun its response engine: WRITEs piled up
# beyond the WQE cache and the one-unit WRITE peak fell to 4 Mops (80a41a5); on 1cb29f9 one
# unit with 16 gives 37.16 / 38.57 Mops and no WQE-cache miss. Chosen from the mechanism.
_CONNECTX6 = SystemConfig(
    name="connectx6",
    nic=NicConfig(data_bytes=64, clock_mhz=250.0, n_qps=1024, n_cqs=64, n_mrs=16,
                  n_doorbells=16, mtu=4096, max_rd_atomic=16, max_outstanding=32,
                  pipeline_ns=123.5, mr_cache_sets=8, mr_cache_ways=2,
                  cq_cache_sets=32, cq_cache_ways=2, qp_cache_sets=64, qp_cache_ways=4,
                  wqe_cache_sets=256, wqe_cache_ways=4, desc_depth=32, dma_tags=256,
                  dma_write_outstanding=256, cq_lookups=4, n_pus=4, fetch_depth=16),
    host=HostConfig(pcie_ns=150.0, host_mem_ns=100.0, pcie_gbps=128.0, mmio_ns=150.0),
    link=LinkConfig(latency_ns=300.0, gbps=200.0),
    calibration=("pipeline_ns: 8-byte READ, 12 QPs x depth 1 closed loop at 5.103 Mops, i.e. a "
                 "loaded round trip of 2.35 us (SMART, ASPLOS'24, artifact fig4a); re-fitted "
                 "once the engines' four-cycle responses and WQEs, the caches' two-cycle "
                 "answers and the four processing units shortened a READ (the RTL of this "
                 "fit, 553dff1 with 152833b's preset, with 114.75 ns: 2.317 us), a READ "
                 "crosses the pipeline 4 times, 114.75 + (2.352 - 2.317) / 4 us = 123.5 ns "
                 "(31 cycles)"),
)

# Small and fast: for unit and integration tests and for FPGA synthesis checks. Its MR cache
# (2 entries for 8 MRs), CQ-context cache (2 entries for 8 CQs) and QP-context cache (2
# entries for 8 QPs) are smaller than their tables on purpose: every system test with more
# than two memory regions, CQs or QPs per node misses, evicts and writes back
# (docs/caches.md).
_SMALL = SystemConfig(
    name="small",
    nic=NicConfig(data_bytes=8, clock_mhz=250.0, n_qps=8, n_cqs=8, n_mrs=8,
                  n_doorbells=4, mtu=256, max_rd_atomic=16, max_outstanding=16,
                  pipeline_ns=0.0, mr_cache_sets=2, mr_cache_ways=1,
                  cq_cache_sets=2, cq_cache_ways=1, qp_cache_sets=2, qp_cache_ways=1,
                  wqe_cache_sets=4, wqe_cache_ways=2),
    host=HostConfig(pcie_ns=40.0, host_mem_ns=20.0, pcie_gbps=64.0, mmio_ns=20.0),
    link=LinkConfig(latency_ns=100.0, gbps=100.0),
    calibration="none: a test configuration",
)

PRESETS = {c.name: c for c in (_CONNECTX6, _SMALL)}


def preset(name):
    """Return the named :class:`SystemConfig`; ``ValueError`` lists the known names."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"preset must be one of {sorted(PRESETS)}, not {name!r}") from None


def clog2(n):
    return max(1, math.ceil(math.log2(n))) if n > 1 else 1
