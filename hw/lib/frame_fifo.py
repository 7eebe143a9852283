"""A store-and-forward frame FIFO: the reader sees a frame only once all of it is written,
and the writer may abandon the frame it is writing.

Models the packet buffer of a store-and-forward switch port (one queue of an output, fed
by one input: hw/net/switch.py). Beats are written in order; the beat marked ``last``
commits its frame, which becomes visible on ``o`` as a whole. ``abort`` (in a cycle in which
no beat is written) discards the beats of the frame being written: the write pointer goes
back to the last committed beat. The read side sees committed beats only, so a frame never
leaves before its last beat has arrived and an abandoned frame never leaves at all.

The memory has a combinational read port (as a LUT RAM); ``o.payload`` is the beat at the
read pointer.

Parameters: ``data_bytes`` (a power of two in [1, 512]), ``depth`` (beats, a power of two in
[2, 65536]).

Ports: ``i: In(BeatStream(W))`` (``ready`` while there is room), ``abort: In(1)``,
``o: Out(BeatStream(W))``, ``level: Out(range(depth + 1))`` (beats held, committed or not),
``frames: Out(range(depth + 1))`` (committed frames held).
"""

from amaranth.hdl import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from ..interfaces import BeatStream, beat_layout
from .checks import check_pow2

__all__ = ["FrameFifo"]


class FrameFifo(wiring.Component):
    def __init__(self, data_bytes, depth):
        check_pow2("data_bytes", data_bytes, 1, 512)
        check_pow2("depth", depth, 2, 65536)
        self.data_bytes = data_bytes
        self.depth = depth
        super().__init__({
            "i": In(BeatStream(data_bytes)),
            "abort": In(1),
            "o": Out(BeatStream(data_bytes)),
            "level": Out(range(depth + 1)),
            "frames": Out(range(depth + 1)),
        })

    def elaborate(self, platform):
        m = Module()
        k = exact_log2(self.depth)
        m.submodules.mem = mem = Memory(shape=beat_layout(self.data_bytes), depth=self.depth,
                                        init=[])
        wp = mem.write_port()
        rp = mem.read_port(domain="comb")
        w = Signal(k + 1)          # next beat written (free running, one extra bit)
        c = Signal(k + 1)          # end of the committed beats
        r = Signal(k + 1)          # next beat read
        frames = Signal(range(self.depth + 1))
        level = Signal(k + 1)      # (w - r) modulo 2 ** (k + 1): the beats held
        m.d.comb += [
            level.eq(w - r),
            self.level.eq(level),
            self.frames.eq(frames),
            self.i.ready.eq(level != self.depth),
            wp.addr.eq(w[:k]), wp.data.eq(self.i.payload),
            wp.en.eq(self.i.valid & self.i.ready),
            rp.addr.eq(r[:k]),
            self.o.payload.eq(rp.data),
            self.o.valid.eq(r != c),
        ]
        put = self.i.valid & self.i.ready
        take = self.o.valid & self.o.ready
        commit = put & self.i.payload.last
        with m.If(put):
            m.d.sync += w.eq(w + 1)
        with m.Elif(self.abort):
            m.d.sync += w.eq(c)
        with m.If(commit):
            m.d.sync += c.eq(w + 1)
        with m.If(take):
            m.d.sync += r.eq(r + 1)
        m.d.sync += frames.eq(frames + commit - (take & self.o.payload.last))
        return m
