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

__all__ = ["NicConfig", "LinkConfig", "HostConfig", "SystemConfig", "PRESETS", "preset"]


def _check_range(name, value, lo, hi):
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise ValueError(f"{name} must be an integer in [{lo}, {hi}], not {value!r}")


def _check_pow2(name, value, lo, hi):
    _check_range(name, value, lo, hi)
    if value & (value - 1):
        raise ValueError(f"{name} must be a power of two in [{lo}, {hi}], not {value!r}")


def _check_float(name, value, lo, hi):
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not lo <= value <= hi:
        raise ValueError(f"{name} must be a number in [{lo}, {hi}], not {value!r}")


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

    def __post_init__(self):
        _check_pow2("data_bytes", self.data_bytes, 8, 64)
        _check_float("clock_mhz", self.clock_mhz, 1.0, 1000.0)
        _check_pow2("n_qps", self.n_qps, 2, 1024)
        _check_pow2("n_cqs", self.n_cqs, 2, 1024)
        _check_pow2("n_mrs", self.n_mrs, 2, 256)
        _check_range("n_doorbells", self.n_doorbells, 1, 512)
        if self.mtu not in (256, 512, 1024, 2048, 4096):
            raise ValueError(f"mtu must be one of 256, 512, 1024, 2048, 4096, not {self.mtu!r}")
        _check_range("max_rd_atomic", self.max_rd_atomic, 1, 16)
        _check_pow2("max_outstanding", self.max_outstanding, 2, 256)
        _check_float("pipeline_ns", self.pipeline_ns, 0.0, 100_000.0)

    @property
    def period_ns(self):
        return 1000.0 / self.clock_mhz

    def cycles(self, ns):
        """Nanoseconds to whole NIC cycles (rounded to nearest, at least 0)."""
        return max(0, int(round(ns * self.clock_mhz / 1000.0)))


@dataclass(frozen=True)
class LinkConfig:
    """A point-to-point link between two NIC ports (cable plus switch, one direction).

    latency_ns   propagation plus switching delay, first bit out to first bit in.
    gbps         serialisation rate in Gb/s.
    """

    latency_ns: float = 500.0
    gbps: float = 200.0

    def __post_init__(self):
        _check_float("latency_ns", self.latency_ns, 0.0, 10_000_000.0)
        _check_float("gbps", self.gbps, 0.1, 1600.0)


@dataclass(frozen=True)
class HostConfig:
    """Host memory seen from the NIC over PCIe.

    dma_read_ns    round trip of a DMA read, request to first data beat.
    dma_write_ns   posted write until the data is visible in host memory.
    pcie_gbps      bandwidth of the host interface in each direction.
    mmio_ns        latency of a doorbell MMIO write reaching the NIC.
    """

    dma_read_ns: float = 500.0
    dma_write_ns: float = 200.0
    pcie_gbps: float = 128.0
    mmio_ns: float = 100.0

    def __post_init__(self):
        _check_float("dma_read_ns", self.dma_read_ns, 0.0, 1_000_000.0)
        _check_float("dma_write_ns", self.dma_write_ns, 0.0, 1_000_000.0)
        _check_float("pcie_gbps", self.pcie_gbps, 0.1, 2000.0)
        _check_float("mmio_ns", self.mmio_ns, 0.0, 1_000_000.0)


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
        return replace(self, **top)


# ConnectX-6 at 200 Gb/s behind one switch, as in the SMART testbed. The latencies are
# split so that an unloaded 8-byte READ round trip comes to about 2.35 us (SMART: 12
# threads at depth 1 give 5.1 Mops); see docs/timing.md for the derivation.
_CONNECTX6 = SystemConfig(
    name="connectx6",
    nic=NicConfig(data_bytes=64, clock_mhz=250.0, n_qps=64, n_cqs=64, n_mrs=16,
                  n_doorbells=16, mtu=4096, max_rd_atomic=16, max_outstanding=32,
                  pipeline_ns=100.0),
    host=HostConfig(dma_read_ns=400.0, dma_write_ns=200.0, pcie_gbps=128.0, mmio_ns=150.0),
    link=LinkConfig(latency_ns=300.0, gbps=200.0),
    calibration="unloaded 8-byte READ round trip 2.35 us (SMART, ASPLOS'24, Fig. 4 at 1 depth)",
)

# Small and fast: for unit and integration tests and for FPGA synthesis checks.
_SMALL = SystemConfig(
    name="small",
    nic=NicConfig(data_bytes=8, clock_mhz=250.0, n_qps=8, n_cqs=8, n_mrs=8,
                  n_doorbells=4, mtu=256, max_rd_atomic=16, max_outstanding=16,
                  pipeline_ns=0.0),
    host=HostConfig(dma_read_ns=100.0, dma_write_ns=50.0, pcie_gbps=64.0, mmio_ns=20.0),
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
