"""The header of one request packet of the message the send engine is sending.

From the WQE and the segment being sent (its remaining bytes, PSN, whether it is the
message's first packet) this block gives the BTH opcode (IBA vol. 1 rel. 1.4, 9.2 table 35:
FIRST / MIDDLE / LAST / ONLY for WRITE and SEND, with immediate on the last packet; READ
request, compare-and-swap, fetch-and-add), the extension headers' fields (RETH on the first
packet of a WRITE and on a READ request, 9.3.3; AtomicETH, 9.3.4; ImmDt, 9.3.6) and the
payload length, as :data:`~hw.formats.PKT_META` for the packet emitter
(hw/rnic/packet_emitter.py). The solicited-event bit is set on the last packet of a SEND or
a WRITE with immediate whose WQE asks for it (9.2.2); every last packet asks for an
acknowledgement (9.7.2). A READ resumed after a retransmission asks only for what it does
not have (``skip_bytes`` of its data, 9.7.5.1.5).

Combinational; the send engine holds its inputs in registers (hw/rnic/requester.py).

Parameters: ``mtu`` (the path MTU in bytes, 256 .. 4096).

Ports: ``wqe: In(WQE)``, ``op: In(OP_CLASS)`` (hw/rnic/wqe_check.py), ``ctx: In(QP_CTX)``
(destination node and QP), ``qpn: In(24)``, ``node_id: In(8)``, ``seg_left: In(32)``
(bytes of the message still to send), ``seg_first: In(1)``, ``seg_psn: In(24)``,
``skip_bytes: In(32)``, ``meta: Out(PKT_META)``, ``seg_len: Out(16)`` (this packet's share
of the message), ``last: Out(1)`` (the message's last packet), ``paylen: Out(16)``.
"""

from amaranth.hdl import Module, Mux
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from .. import formats, regmap
from ..formats import BthOpcode, WrOpcode
from ..lib.checks import check_mtu
from .wqe_check import OP_CLASS

__all__ = ["RequestHeader"]


class RequestHeader(wiring.Component):
    def __init__(self, mtu):
        check_mtu(mtu)
        self.mtu = mtu
        super().__init__({
            "wqe": In(formats.WQE),
            "op": In(OP_CLASS),
            "ctx": In(regmap.QP_CTX),
            "qpn": In(24),
            "node_id": In(8),
            "seg_left": In(32),
            "seg_first": In(1),
            "seg_psn": In(24),
            "skip_bytes": In(32),
            "meta": Out(formats.PKT_META),
            "seg_len": Out(16),
            "last": Out(1),
            "paylen": Out(16),
        })

    def elaborate(self, platform):
        m = Module()
        wqe, c, meta = self.wqe, self.op, self.meta
        op = wqe.opcode
        seg_last = self.seg_left <= self.mtu
        first = self.seg_first
        m.d.comb += self.seg_len.eq(Mux(seg_last, self.seg_left, self.mtu))
        bth_op = meta.opcode
        with m.Switch(op):
            for ops, only_imm, only, fst, mid, last_imm, last in (
                    ((WrOpcode.RDMA_WRITE, WrOpcode.RDMA_WRITE_WITH_IMM),
                     BthOpcode.WRITE_ONLY_IMM, BthOpcode.WRITE_ONLY, BthOpcode.WRITE_FIRST,
                     BthOpcode.WRITE_MIDDLE, BthOpcode.WRITE_LAST_IMM, BthOpcode.WRITE_LAST),
                    ((WrOpcode.SEND, WrOpcode.SEND_WITH_IMM),
                     BthOpcode.SEND_ONLY_IMM, BthOpcode.SEND_ONLY, BthOpcode.SEND_FIRST,
                     BthOpcode.SEND_MIDDLE, BthOpcode.SEND_LAST_IMM, BthOpcode.SEND_LAST)):
                with m.Case(*(o.value for o in ops)):
                    with m.If(first & seg_last):
                        m.d.comb += bth_op.eq(Mux(c.imm, only_imm.value, only.value))
                    with m.Elif(first):
                        m.d.comb += bth_op.eq(fst.value)
                    with m.Elif(seg_last):
                        m.d.comb += bth_op.eq(Mux(c.imm, last_imm.value, last.value))
                    with m.Else():
                        m.d.comb += bth_op.eq(mid.value)
            with m.Case(WrOpcode.RDMA_READ.value):
                m.d.comb += bth_op.eq(BthOpcode.READ_REQUEST.value)
            with m.Case(WrOpcode.ATOMIC_CMP_AND_SWP.value):
                m.d.comb += bth_op.eq(BthOpcode.COMPARE_SWAP.value)
            with m.Default():
                m.d.comb += bth_op.eq(BthOpcode.FETCH_ADD.value)
        cas = op == WrOpcode.ATOMIC_CMP_AND_SWP.value
        m.d.comb += [
            self.last.eq(c.single | seg_last),
            self.paylen.eq(Mux(c.single, 0, self.seg_len)),
            meta.src_node.eq(self.node_id),
            meta.dst_node.eq(self.ctx.dest_node),
            # solicited event: last packet of a SEND or of a WRITE with immediate
            meta.se.eq(self.last & wqe.flags[2] & (c.imm | (op == WrOpcode.SEND.value))),
            meta.ackreq.eq(self.last),
            meta.dest_qpn.eq(self.ctx.dest_qpn),
            meta.psn.eq(self.seg_psn),
            meta.udp_sport.eq(0xC000 | self.qpn),
            meta.va.eq(wqe.remote_addr + self.skip_bytes),
            meta.rkey.eq(wqe.rkey),
            meta.dma_len.eq(wqe.length - self.skip_bytes),
            meta.swap_add.eq(Mux(cas, wqe.swap, wqe.compare_add)),
            meta.compare.eq(Mux(cas, wqe.compare_add, 0)),
            meta.imm.eq(wqe.imm),
            meta.paylen.eq(self.paylen),
        ]
        return m
