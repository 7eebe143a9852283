"""One register map and one decoder for a bus of 64-bit MMIO registers.

amaranth-soc's ``csr`` package (a memory map with named, non-overlapping windows and one
decoder in front of the register files) is the model; its PyPI release is an empty package,
so this is the small part the NIC needs:

* :class:`RegisterMap` (Python, at elaboration time): named windows ``(base, size)`` of
  8-byte registers in a ``2**addr_width``-byte space. ``add`` checks that a window is
  8-byte aligned, a whole number of registers, inside the space and overlaps no other
  window, and raises ``ValueError`` naming both windows if it does.
* :class:`BusDecoder` (RTL): one :class:`~hw.interfaces.MmioSignature` bus in, one bus per
  window out (except *external* windows: decoded before the bus, for example the NIC's
  BlueFlame window, which the MMIO front end takes whole; they are in the map for the overlap
  check and the documentation, and an access to one that reaches the bus counts as unmapped).
  A window's bus sees ``we`` / ``re`` only for addresses inside it, with the
  address relative to its base; read data comes from the window that was read (selected
  by a register, since ``rdata`` follows ``re`` by one cycle), 0 for an address outside
  every window. Every block answers a read in the cycle after ``re``, as
  :class:`~hw.interfaces.MmioSignature` requires; the decoder drives ``rvalid`` itself.
  Accesses outside every window are counted (``unmapped``).

Parameters: ``RegisterMap(addr_width)`` with ``addr_width`` in [4, 32]; ``BusDecoder(map)``.
A block behind a window declares its bus as ``In(MmioSignature(window_addr_width(size)))``
(the same width the decoder gives the window), so that connecting it to the wrong window
fails at elaboration.

Ports of the decoder: ``bus: In(MmioSignature(addr_width))``, one ``Out(MmioSignature(w))``
per window named as the window (``w`` the window's address bits), ``unmapped: Out(32)`` (the
count) and ``stat_unmapped: Out(1)`` (a pulse per unmapped access, for a counter block).
"""

from dataclasses import dataclass

from amaranth.hdl import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from ..interfaces import MmioSignature
from .checks import check_int

__all__ = ["Window", "RegisterMap", "BusDecoder", "window_addr_width"]


def window_addr_width(size):
    """Address bits of a window of ``size`` bytes, as its bus has them (at least 3)."""
    return max(ceil_log2(size), 3)


@dataclass(frozen=True)
class Window:
    name: str
    base: int
    size: int          # bytes, a multiple of 8
    doc: str = ""
    external: bool = False   # decoded before the bus: no port on the decoder

    @property
    def end(self):
        return self.base + self.size

    @property
    def addr_width(self):
        return window_addr_width(self.size)


class RegisterMap:
    def __init__(self, addr_width):
        check_int("addr_width", addr_width, 4, 32)
        self.addr_width = addr_width
        self._windows = []

    def add(self, name, base, size=8, doc="", external=False):
        if not name.isidentifier() or any(w.name == name for w in self._windows):
            raise ValueError(f"window name {name!r} is not a new Python identifier")
        space = 1 << self.addr_width
        if not isinstance(base, int) or base % 8 or not 0 <= base < space:
            raise ValueError(f"window {name!r}: base must be a multiple of 8 in "
                             f"[0, 0x{space - 8:x}], not {base!r}")
        if not isinstance(size, int) or size % 8 or not 8 <= size <= space - base:
            raise ValueError(f"window {name!r}: size must be a multiple of 8 in "
                             f"[8, 0x{space - base:x}], not {size!r}")
        new = Window(name, base, size, doc, bool(external))
        for w in self._windows:
            if new.base < w.end and w.base < new.end:
                raise ValueError(f"window {name!r} at 0x{new.base:x}..0x{new.end - 1:x} overlaps "
                                 f"{w.name!r} at 0x{w.base:x}..0x{w.end - 1:x}")
        self._windows.append(new)
        return new

    def __iter__(self):
        return iter(sorted(self._windows, key=lambda w: w.base))

    def __getitem__(self, name):
        for w in self._windows:
            if w.name == name:
                return w
        raise KeyError(name)

    def lookup(self, addr):
        """The window holding byte address ``addr``, or None."""
        for w in self._windows:
            if w.base <= addr < w.end:
                return w
        return None

    def table(self):
        """The map as Markdown table rows (for docs)."""
        rows = ["| window | bytes | 8-byte words | meaning |", "| --- | --- | --- | --- |"]
        for w in self:
            rows.append(f"| `{w.name}` | 0x{w.base:04x}..0x{w.end - 1:04x} | {w.size // 8} | {w.doc} |")
        return "\n".join(rows)


class BusDecoder(wiring.Component):
    def __init__(self, regmap):
        if not isinstance(regmap, RegisterMap) or not list(regmap):
            raise ValueError("regmap must be a RegisterMap with at least one window")
        self.regmap = regmap
        ports = {"bus": In(MmioSignature(regmap.addr_width)), "unmapped": Out(32),
                 "stat_unmapped": Out(1)}
        for w in regmap:
            if not w.external:
                ports[w.name] = Out(MmioSignature(w.addr_width))
        super().__init__(ports)

    def elaborate(self, platform):
        m = Module()
        bus = self.bus
        windows = [w for w in self.regmap if not w.external]
        sel = Signal(range(len(windows) + 1))      # the window read last cycle (len: none)
        hit_any = 0
        m.d.sync += sel.eq(len(windows))
        for i, w in enumerate(windows):
            sub = getattr(self, w.name)
            hit = Signal(name=f"hit_{w.name}")
            m.d.comb += [
                hit.eq((bus.addr >= w.base) & (bus.addr < w.end)),
                sub.addr.eq((bus.addr - w.base)[:w.addr_width]),
                sub.wdata.eq(bus.wdata),
                sub.we.eq(bus.we & hit),
                sub.re.eq(bus.re & hit),
            ]
            hit_any = hit_any | hit
            with m.If(bus.re & hit):
                m.d.sync += sel.eq(i)
        rvalid = Signal()
        m.d.sync += rvalid.eq(bus.re)
        m.d.comb += bus.rvalid.eq(rvalid)
        with m.Switch(sel):
            for i, w in enumerate(windows):
                with m.Case(i):
                    m.d.comb += bus.rdata.eq(getattr(self, w.name).rdata)
        m.d.comb += self.stat_unmapped.eq((bus.we | bus.re) & ~hit_any)
        with m.If(self.stat_unmapped):
            m.d.sync += self.unmapped.eq(self.unmapped + 1)
        return m
