"""One direction of the PCIe link between a NIC and its host: bandwidth with TLP overhead, latency.

Models the serialisation and the latency of a PCIe link plus the root complex (PCI Express
Base Specification 4.0, 2.2 and 4.2): every TLP occupies the link for its header and framing
(``overhead`` bytes, default 24: a 3- or 4-DW header, sequence number, LCRC and framing
tokens) plus its payload in double words, at ``bytes_per_cycle``; then it takes
``latency_cycles`` to reach the other side. The cost of a TLP is computed once, by
:mod:`hw.dma.tlp` (the same function the NIC's counters use), and charged beat by beat as
the beats enter a :class:`~hw.lib.shaper.Shaper` (the first beat the overhead and its
word, each later one its word, the last one what is left), so that an idle link saves no
more than one beat of credit; the beats then wait in a :class:`~hw.lib.delay.DelayLine`. Both hosts (``hw/host/rtl_host.py`` and the Python host's
adapter ``hw/host/py_port.py``) sit behind the same two links, so they see the same timing.

Parameters: ``data_bytes``; ``direction`` ``"down"`` (NIC -> host: MRd, MWr) or ``"up"``
(host -> NIC: completions, write responses); ``latency_cycles``; ``bytes_per_cycle``;
``overhead`` (bytes per TLP, [0, 256]); ``depth`` (beats the delay line holds; default:
the bandwidth-delay product rounded up to a power of two).

Ports: ``i``, ``o``: ``TlpDown(W)`` or ``TlpUp(W)``; ``stat_bytes: Out(16)`` the link bytes
charged this cycle.
"""

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from ..dma.tlp import down_cost, up_cost
from ..interfaces import TlpDown, TlpUp, tlp_down_layout, tlp_up_layout
from ..lib.checks import check_int
from ..lib.delay import MAX_LATENCY, DelayLine
from ..lib.shaper import Shaper

__all__ = ["PcieLink"]


class PcieLink(wiring.Component):
    def __init__(self, data_bytes, direction, latency_cycles, bytes_per_cycle, overhead=24,
                 depth=None):
        if direction not in ("down", "up"):
            raise ValueError(f"direction must be 'down' or 'up', not {direction!r}")
        check_int("latency_cycles", latency_cycles, 0, MAX_LATENCY)
        check_int("overhead", overhead, 0, 256)
        if depth is None:
            depth = 1 << ceil_log2(max(8, latency_cycles + 8))
        self.direction = direction
        self.overhead = overhead
        sig, layout = ((TlpDown, tlp_down_layout) if direction == "down" else (TlpUp, tlp_up_layout))
        self.data_bytes = data_bytes
        self.shaper = Shaper(layout(data_bytes), bytes_per_cycle, overhead + 2 * data_bytes + 8)
        self.delay = DelayLine(layout(data_bytes), latency_cycles, depth)
        super().__init__({
            "i": In(sig(data_bytes)),
            "o": Out(sig(data_bytes)),
            "stat_bytes": Out(16),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.shaper = sh = self.shaper
        m.submodules.delay = dl = self.delay
        W = self.data_bytes
        first = Signal(init=1)
        hdr = self.i.payload.hdr
        last = self.i.payload.last
        total = Signal(16)
        m.d.comb += total.eq(down_cost(hdr, self.overhead) if self.direction == "down"
                             else up_cost(hdr, self.overhead))
        left = Signal(16)           # cost of this TLP not yet charged
        have = Mux(first, total, left)
        step = Mux(first, self.overhead + W, W)
        charge = Signal(16)
        m.d.comb += [charge.eq(Mux(last | (have < step), have, step)), sh.cost.eq(charge)]
        wiring.connect(m, wiring.flipped(self.i), sh.i)
        wiring.connect(m, sh.o, dl.i)
        wiring.connect(m, dl.o, wiring.flipped(self.o))
        fire = self.i.valid & self.i.ready
        with m.If(fire):
            m.d.sync += [first.eq(last), left.eq(have - charge)]
        m.d.comb += self.stat_bytes.eq(Mux(fire, sh.cost, 0))
        return m
