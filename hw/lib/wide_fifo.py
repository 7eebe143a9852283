"""A first-word-fall-through FIFO for wide entries (thousands of bits).

The same interface as ``amaranth.lib.fifo.SyncFIFOBuffered`` (``w_data``, ``w_en``,
``w_rdy``, ``r_data``, ``r_en``, ``r_rdy``, ``level``), built on a ``lib.memory.Memory``
written with a 32-bit granularity: Amaranth's Python simulator cannot compile the write of
a memory row much wider than about 4000 bits without a granularity, nor a SyncFIFO that
wide. The head entry is a combinational read of the memory. Used where whole bursts move
in one transfer (the Python host's adapter).

Parameters: ``width`` (bits, any positive integer), ``depth`` (power of two in [2, 4096]).
"""

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from .checks import check_int, check_pow2

__all__ = ["WideFifo"]


class WideFifo(wiring.Component):
    def __init__(self, width, depth):
        check_int("width", width, 1, 1 << 20)
        check_pow2("depth", depth, 2, 4096)
        self.width = width
        self.depth = depth
        super().__init__({
            "w_data": In(width),
            "w_en": In(1),
            "w_rdy": Out(1),
            "r_data": Out(width),
            "r_en": In(1),
            "r_rdy": Out(1),
            "level": Out(range(depth + 1)),
        })

    def elaborate(self, platform):
        m = Module()
        padded = -(-self.width // 32) * 32
        ab = exact_log2(self.depth)
        m.submodules.mem = mem = Memory(shape=padded, depth=self.depth, init=[])
        wp = mem.write_port(granularity=32)
        rp = mem.read_port(domain="comb")
        wr = Signal(ab + 1)
        rd = Signal(ab + 1)
        m.d.comb += [
            self.level.eq(wr - rd),
            self.w_rdy.eq(self.level != self.depth),
            self.r_rdy.eq(self.level != 0),
            wp.addr.eq(wr[:ab]), wp.data.eq(self.w_data),
            wp.en.eq(Mux(self.w_en & self.w_rdy, (1 << (padded // 32)) - 1, 0)),
            rp.addr.eq(rd[:ab]),
            self.r_data.eq(rp.data),
        ]
        with m.If(self.w_en & self.w_rdy):
            m.d.sync += wr.eq(wr + 1)
        with m.If(self.r_en & self.r_rdy):
            m.d.sync += rd.eq(rd + 1)
        return m
