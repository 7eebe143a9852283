"""Merges a host's read completions and write responses into its up TLP stream.

Both hosts (``rtl_host.py``, ``py_port.py``) answer reads with completion TLPs (one or more
beats each, from a :class:`~hw.host.cpl_emitter.CplEmitter`) and writes with one-beat write
responses; this puts them on one stream, switching only between TLPs, and keeping an offered
beat stable until taken (the stream rule). A write response rides beside a completion beat
(the beat's ``wrsp`` field, :data:`~hw.formats.WRSP_SIDE`) when one is offered, so that write
responses take no beat of the stream while completions flow (they stand for AXI's B
channel, a channel of their own; with a beat each, a NIC writing about as many TLPs as it
reads beats left the up stream nearly full and its reads waiting: docs/performance.md);
with no completion offered, a write response is a beat of its own.

Ports: ``cpl: In(TlpUp(W))``, ``wrsp: In(stream {tag: 8, status: 2})``, ``up: Out(TlpUp(W))``.
"""

from amaranth.hdl import Module, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ..formats import CplKind, TlpStatus
from ..interfaces import TlpUp

__all__ = ["UpMux", "WRSP", "WR_TURNAROUND"]

#: Cycles from a write's last beat at the host to its write response leaving: the time the
#: Python host's adapter needs to ask Python for the status; the RTL host waits as long, so
#: both answer at the same cycle.
WR_TURNAROUND = 5

WRSP = data.StructLayout({"tag": 8, "status": TlpStatus})


class UpMux(wiring.Component):
    def __init__(self, data_bytes):
        super().__init__({
            "cpl": In(TlpUp(data_bytes)),
            "wrsp": In(stream.Signature(WRSP)),
            "up": Out(TlpUp(data_bytes)),
        })

    def elaborate(self, platform):
        m = Module()
        up, cpl, wrsp = self.up, self.cpl, self.wrsp
        in_tlp = Signal()          # inside a multi-beat completion
        hold_w = Signal()          # a write response is offered and not yet taken
        hold_c = Signal()          # a completion beat is offered and not yet taken
        hold_s = Signal()          # ... with a write response beside it
        side = Signal()            # a write response rides on the offered completion beat
        sel_w = Signal()
        m.d.comb += sel_w.eq(hold_w | (~in_tlp & ~hold_c & wrsp.valid & ~cpl.valid))
        with m.If(sel_w):
            m.d.comb += [
                up.valid.eq(wrsp.valid),
                up.payload.hdr.kind.eq(CplKind.WRRSP),
                up.payload.hdr.tag.eq(wrsp.payload.tag),
                up.payload.hdr.status.eq(wrsp.payload.status),
                up.payload.hdr.last.eq(1),
                up.payload.last.eq(1),
                wrsp.ready.eq(up.ready),
            ]
        with m.Else():
            wiring.connect(m, wiring.flipped(cpl), wiring.flipped(up))
            # a waiting write response rides on the completion beat (taken with it); not
            # added to a beat already offered without one (an offer does not change)
            m.d.comb += [side.eq(cpl.valid & wrsp.valid & (~hold_c | hold_s)),
                         up.payload.wrsp.valid.eq(side),
                         up.payload.wrsp.tag.eq(wrsp.payload.tag),
                         up.payload.wrsp.status.eq(wrsp.payload.status),
                         wrsp.ready.eq(side & up.ready)]
        fire = up.valid & up.ready
        m.d.sync += [hold_w.eq(sel_w & up.valid & ~up.ready),
                     hold_c.eq(~sel_w & up.valid & ~up.ready),
                     hold_s.eq(side & ~up.ready)]
        with m.If(fire & ~sel_w):
            m.d.sync += in_tlp.eq(~up.payload.last)
        return m
