"""Shared MMIO drivers for unit tests: 8-byte register writes and reads on an
:class:`~hw.interfaces.MmioSignature` bus, and a block placed behind the NIC's bus decoder so
that a test drives the addresses of the register map (``hw.regmap.register_map``), as the
driver does, rather than the block's window-relative ones."""

from amaranth.hdl import Elaboratable, Module
from amaranth.lib import wiring

from hw.lib.csr import BusDecoder
from hw.regmap import register_map

__all__ = ["mmio_write", "mmio_read", "BehindDecoder"]


async def mmio_write(ctx, bus, addr, value):
    ctx.set(bus.addr, addr)
    ctx.set(bus.wdata, value)
    ctx.set(bus.we, 1)
    await ctx.tick()
    ctx.set(bus.we, 0)


async def mmio_read(ctx, bus, addr):
    ctx.set(bus.addr, addr)
    ctx.set(bus.re, 1)
    await ctx.tick()
    ctx.set(bus.re, 0)
    assert ctx.get(bus.rvalid)
    return ctx.get(bus.rdata)


class BehindDecoder(Elaboratable):
    """``block`` behind ``BusDecoder(register_map(n_doorbells))``; ``windows`` maps window
    names to the block's bus ports. Drive ``self.bus``; the block's other ports are used
    directly (``self.block``); ``self.decoder.unmapped`` counts accesses outside every
    window."""

    def __init__(self, block, n_doorbells, windows):
        self.block = block
        self.decoder = BusDecoder(register_map(n_doorbells))
        self.bus = self.decoder.bus
        self.windows = windows

    def elaborate(self, platform):
        m = Module()
        m.submodules.block = self.block
        m.submodules.decoder = self.decoder
        for name, port in self.windows.items():
            wiring.connect(m, getattr(self.decoder, name), port)
        return m
