"""Receive-side dispatch: request packets to the responder, responses to the requester.

IBA vol. 1 rel. 1.4, section 9.2: the BTH opcode of a Reliable Connection packet says
whether it is a request (SEND, RDMA WRITE, RDMA READ request, atomics: handled by the
responder of the destination QP) or a response (READ responses, ACKNOWLEDGE, ATOMIC
ACKNOWLEDGE: handled by the requester that sent the request). Packets addressed to another
node or to a QP number this NIC does not have are dropped and counted (``stat_drop``).
"""

from amaranth import *
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ..formats import BthOpcode
from ..interfaces import PacketOut

__all__ = ["PacketDemux", "RESPONSE_OPCODES"]

RESPONSE_OPCODES = (
    BthOpcode.READ_RESPONSE_FIRST, BthOpcode.READ_RESPONSE_MIDDLE, BthOpcode.READ_RESPONSE_LAST,
    BthOpcode.READ_RESPONSE_ONLY, BthOpcode.ACKNOWLEDGE, BthOpcode.ATOMIC_ACKNOWLEDGE,
)


class PacketDemux(wiring.Component):
    """Ports: ``i`` (packets from the depacketizer), ``req`` (to the requester: responses),
    ``resp`` (to the responder: requests), ``node_id``, pulse ``stat_drop``."""

    def __init__(self, data_bytes, n_qps):
        self.data_bytes = data_bytes
        self.n_qps = n_qps
        super().__init__({
            "i": In(PacketOut(data_bytes)),
            "req": Out(PacketOut(data_bytes)),
            "resp": Out(PacketOut(data_bytes)),
            "node_id": In(8),
            "stat_drop": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        W = self.data_bytes
        meta = self.i.meta.payload
        is_resp = Signal()
        m.d.comb += is_resp.eq(Cat(*[meta.opcode == op.value for op in RESPONSE_OPCODES]).any())
        bad = Signal()
        m.d.comb += bad.eq((meta.dst_node != self.node_id) | (meta.dest_qpn >= self.n_qps))

        # 0: to the responder, 1: to the requester, 2: dropped.
        route = Signal(2)
        beats_left = Signal(16)

        with m.FSM():
            with m.State("META"):
                with m.If(self.i.meta.valid):
                    with m.If(bad):
                        m.d.comb += [self.i.meta.ready.eq(1), self.stat_drop.eq(1)]
                        m.d.sync += route.eq(2)
                    with m.Elif(is_resp):
                        m.d.comb += [self.req.meta.valid.eq(1), self.i.meta.ready.eq(self.req.meta.ready)]
                        m.d.sync += route.eq(1)
                    with m.Else():
                        m.d.comb += [self.resp.meta.valid.eq(1), self.i.meta.ready.eq(self.resp.meta.ready)]
                        m.d.sync += route.eq(0)
                    with m.If(self.i.meta.ready):
                        m.d.sync += beats_left.eq((meta.paylen + W - 1) // W)
                        with m.If(meta.paylen != 0):
                            m.next = "PAYLOAD"
            with m.State("PAYLOAD"):
                with m.Switch(route):
                    with m.Case(0):
                        wiring.connect(m, wiring.flipped(self.i.payload), wiring.flipped(self.resp.payload))
                    with m.Case(1):
                        wiring.connect(m, wiring.flipped(self.i.payload), wiring.flipped(self.req.payload))
                    with m.Default():
                        m.d.comb += self.i.payload.ready.eq(1)
                with m.If(self.i.payload.valid & self.i.payload.ready):
                    m.d.sync += beats_left.eq(beats_left - 1)
                    with m.If(beats_left == 1):
                        m.next = "META"
        m.d.comb += [self.req.meta.payload.eq(meta), self.resp.meta.payload.eq(meta)]
        return m
