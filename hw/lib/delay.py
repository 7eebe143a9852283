"""Delay line: every transfer leaves ``latency`` cycles after it entered, in order.

Models a fixed propagation delay (a cable, a switch hop, a PCIe link and root complex, the
NIC's own pipeline). Transfers wait in a FIFO (``lib.memory.Memory``) next to their due time
stamp, kept in a second memory. A "due pointer" walks the FIFO and checks one time stamp per
cycle with a wrap-safe (modular, signed) comparison; since the pending entry it looks at is
never more than ``latency`` cycles in the future, a stalled output cannot make a stamp wrap.
A transfer accepted at cycle ``t`` is visible on ``o`` at cycle ``t + latency`` at the
earliest (exactly then if ``o`` is not back-pressured and ``latency >= MIN_LATENCY``;
smaller values give ``MIN_LATENCY``). When the FIFO is full, ``i`` is back-pressured. The
output payload is the registered read port of the data memory (stable while offered).

Parameters: ``shape`` of the payload, ``latency`` in [0, 2**24] cycles, ``depth`` (FIFO
entries, a power of two in [2, 65536]).

Ports: ``i: In(stream(shape))``, ``o: Out(stream(shape))``.
"""

from amaranth.hdl import Module, Signal, unsigned
from amaranth.lib import stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import bits_for, ceil_log2

from .checks import check_int, check_pow2

__all__ = ["DelayLine", "MAX_LATENCY"]

MAX_LATENCY = 1 << 24


class DelayLine(wiring.Component):
    #: Smallest delay from input transfer to output valid (the pipeline of the delay line).
    MIN_LATENCY = 3

    def __init__(self, shape, latency, depth):
        check_int("latency", latency, 0, MAX_LATENCY)
        check_pow2("depth", depth, 2, 1 << 16)
        self.shape = shape
        self.latency = latency
        self.effective_latency = max(latency, self.MIN_LATENCY)
        self.depth = depth
        super().__init__({
            "i": In(stream.Signature(shape)),
            "o": Out(stream.Signature(shape)),
        })

    def elaborate(self, platform):
        m = Module()
        depth = self.depth
        abits = ceil_log2(depth)
        delay = max(self.effective_latency - 2, 1)    # due-time offset; +2 for the pipeline
        tbits = bits_for(delay) + 1
        now = Signal(tbits)
        m.d.sync += now.eq(now + 1)

        m.submodules.data_mem = data_mem = Memory(shape=self.shape, depth=depth, init=[])
        m.submodules.ts_mem = ts_mem = Memory(shape=unsigned(tbits), depth=depth, init=[])
        d_wr = data_mem.write_port()
        d_rd = data_mem.read_port(domain="sync", transparent_for=())
        t_wr = ts_mem.write_port()
        t_rd = ts_mem.read_port(domain="comb")

        wr_ptr = Signal(abits + 1)
        due_ptr = Signal(abits + 1)
        rd_ptr = Signal(abits + 1)
        used = Signal(abits + 1)
        m.d.comb += used.eq(wr_ptr - rd_ptr)

        push = Signal()
        m.d.comb += [
            self.i.ready.eq(used != depth),
            push.eq(self.i.valid & self.i.ready),
            d_wr.addr.eq(wr_ptr[:abits]), d_wr.data.eq(self.i.payload), d_wr.en.eq(push),
            t_wr.addr.eq(wr_ptr[:abits]), t_wr.data.eq(now + delay), t_wr.en.eq(push),
        ]
        with m.If(push):
            m.d.sync += wr_ptr.eq(wr_ptr + 1)

        # Due pointer: the oldest entry not yet due; its stamp is at most `delay` ahead of now.
        wait = Signal(tbits)
        m.d.comb += [t_rd.addr.eq(due_ptr[:abits]), wait.eq(now - t_rd.data)]
        with m.If((due_ptr != wr_ptr) & ~wait[-1]):
            m.d.sync += due_ptr.eq(due_ptr + 1)

        # Output register: the read port's data register is the payload of `o`.
        fetch = Signal()
        m.d.comb += [
            fetch.eq((rd_ptr != due_ptr) & (~self.o.valid | self.o.ready)),
            d_rd.addr.eq(rd_ptr[:abits]),
            d_rd.en.eq(fetch),
            self.o.payload.eq(d_rd.data),
        ]
        with m.If(fetch):
            m.d.sync += [rd_ptr.eq(rd_ptr + 1), self.o.valid.eq(1)]
        with m.Elif(self.o.ready):
            m.d.sync += self.o.valid.eq(0)
        return m
