"""Performance counters readable over MMIO.

Models the hardware counters of an RNIC (mlx5 exposes similar ones through
``ethtool -S`` / ``/sys/class/infiniband/*/ports/*/hw_counters``): 64-bit registers at
``COUNTER_BASE + 8 * i`` (names in :class:`hw.regmap.Counter`), each adding its ``inc[i]``
input every cycle. Reading never clears. The block sits behind the ``counters`` window of
the register map (``hw.regmap.register_map``): its bus addresses are relative to
``COUNTER_BASE``.
"""

from amaranth import *
from amaranth.lib import wiring
from amaranth.lib.wiring import In

from ..interfaces import MmioSignature
from ..lib.csr import window_addr_width
from ..regmap import Counter

__all__ = ["Counters"]


class Counters(wiring.Component):
    """Ports: ``bus`` (MMIO reads), ``inc`` (one 32-bit increment per counter, every cycle)."""

    def __init__(self, n=len(Counter)):
        if not isinstance(n, int) or not 1 <= n <= 256:
            raise ValueError(f"n must be an integer in [1, 256], not {n!r}")
        self.n = n
        super().__init__({
            "bus": In(MmioSignature(window_addr_width(8 * n))),
            "inc": In(32).array(n),
        })

    def elaborate(self, platform):
        m = Module()
        counts = Array(Signal(64, name=f"count{i}") for i in range(self.n))
        for i in range(self.n):
            m.d.sync += counts[i].eq(counts[i] + self.inc[i])
        addr = self.bus.addr & ~7
        index = addr >> 3
        m.d.sync += [self.bus.rvalid.eq(self.bus.re), self.bus.rdata.eq(0)]
        with m.If(self.bus.re & (addr < 8 * self.n)):
            m.d.sync += self.bus.rdata.eq(counts[index])
        return m
