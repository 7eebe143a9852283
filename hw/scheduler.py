"""Round-robin send scheduler of the requester.

Models the arbitration step of the RNIC's send engine: among the queue pairs whose send
queue may issue a request now (state RTS, posted but not yet fetched work requests, room in
the outstanding-request tracker and in the READ/atomic budget; InfiniBand Architecture
Specification vol. 1 rel. 1.4, 9.7 "Reliable service" and 11.4 "Work request processing"),
one is granted at a time, in round-robin order starting after the last granted queue pair.

The eligibility vector is computed by the requester from its per-QP registers; this block
only arbitrates, so it can be tested alone.

Ports
    req    In(n)                        one bit per QP: may issue now
    grant  Out(stream {qpn: qpn_bits})  valid while any bit of req is set; the payload is
                                        the first requesting QP after the last granted one
"""

from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from .lib.encoder import round_robin_pick

__all__ = ["Scheduler"]


class Scheduler(wiring.Component):
    def __init__(self, n):
        if not isinstance(n, int) or isinstance(n, bool) or not 2 <= n <= 1024 or n & (n - 1):
            raise ValueError(f"n must be a power of two in [2, 1024], not {n!r}")
        self.n = n
        self.qpn_bits = ceil_log2(n)
        super().__init__({
            "req": In(n),
            "grant": Out(stream.Signature(data.StructLayout({"qpn": self.qpn_bits}))),
        })

    def elaborate(self, platform):
        m = Module()
        n = self.n
        last = Signal(self.qpn_bits, init=n - 1)

        # the lowest request above the last grant, else the lowest (hw/lib/encoder.py)
        anyr, pick = round_robin_pick(m, self.req, last, "sched")
        m.d.comb += [
            self.grant.valid.eq(anyr),
            self.grant.payload.qpn.eq(pick),
        ]
        with m.If(self.grant.valid & self.grant.ready):
            m.d.sync += last.eq(self.grant.payload.qpn)
        return m
