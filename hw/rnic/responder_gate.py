"""The responder's write gate and what leaves it: receive completions and responses.

The responder (hw/rnic/responder.py) announces what it did, in order, as items: a receive CQE
(IBA vol. 1 rel. 1.4, 10.8) or a response descriptor for the ordered response queue (an ACK
or NAK, a READ, an atomic acknowledge: hw/rnic/response_queue.py). An item must not be
announced before the host has taken the payload the responder wrote before it: an ACK
never acknowledges data the host did not take (as an AXI master waits for its write
response). The items pass a :class:`~hw.lib.write_gate.WriteGate` that holds each until the
writes issued before it are answered. If a payload write of the QP failed, the QP's next
response leaves as a NAK (remote operational error, IBA 9.7.5.2.4; a pending atomic keeps its
kind, so that its result is still taken) followed by a request to move the QP to ERR, and a
receive completion as LOC_PROT_ERR (docs/errors.md).

Parameters: ``qpn_bits`` in [1, 16]; ``depth``: items the gate holds (``NicConfig``'s
``gate_depth``).

Ports: ``i: In(stream {item: RSP_ITEM, key})`` (``key``: the QP); ``wr_issued: In(1)`` (a
payload write handed to DMA: pulses once per write); ``done: In(stream DMA_WR_DONE)``;
``cqe: Out(CqeRequest())``; ``resp: Out(stream RESP_ENTRY)`` (to the response queue);
``err: Out(QpErrRequest())``; ``stat_err: Out(1)`` (a response turned into a NAK by a
failed write).
"""

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ..formats import CQE, AethSyndrome as Syn, WcStatus
from ..interfaces import DMA_WR_DONE, CqeRequest, QpErrRequest
from ..lib.checks import check_int
from ..lib.write_gate import WriteGate
from .response_queue import RESP_ACK, RESP_ATOMIC_PEND, RESP_ENTRY

__all__ = ["ResponderGate", "RSP_ITEM", "ITEM_CQE", "ITEM_RESP"]

#: What the responder announces, in order, through the write gate (a CQE or a response
#: descriptor): nothing leaves before the payload written before it is answered.
ITEM_CQE, ITEM_RESP = 0, 2
RSP_ITEM = data.StructLayout({"kind": 2, "cqn": 16, "cqe": CQE, "resp": RESP_ENTRY})


class ResponderGate(wiring.Component):
    def __init__(self, qpn_bits, depth):
        check_int("qpn_bits", qpn_bits, 1, 16)
        self.qpn_bits = qpn_bits
        self.depth = depth
        super().__init__({
            "i": In(stream.Signature(data.StructLayout({"item": RSP_ITEM, "key": qpn_bits}))),
            "wr_issued": In(1),
            "done": In(stream.Signature(DMA_WR_DONE, always_ready=True)),
            "cqe": Out(CqeRequest()),
            "resp": Out(stream.Signature(RESP_ENTRY)),
            "err": Out(QpErrRequest()),
            "stat_err": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.gate = gate = WriteGate(RSP_ITEM, self.qpn_bits, depth=self.depth)
        wiring.connect(m, wiring.flipped(self.done), gate.done)
        wiring.connect(m, wiring.flipped(self.i), gate.i)
        m.d.comb += gate.wr_issued.eq(self.wr_issued)

        g = gate.o.payload
        gitem = g.item
        q_entry = self.resp.payload
        d_nak_sent = Signal()          # a failed QP's NAK is queued, its ERR request waits
        g_cqe = Signal(CQE)
        m.d.comb += [
            g_cqe.eq(gitem.cqe),
            self.cqe.payload.cqn.eq(gitem.cqn),
            self.cqe.payload.cqe.eq(g_cqe),
            q_entry.eq(gitem.resp),
            self.err.payload.qpn.eq(g.key),
        ]
        with m.If(g.err & (gitem.cqe.status == 0)):
            m.d.comb += [g_cqe.status.eq(WcStatus.LOC_PROT_ERR.value), g_cqe.byte_len.eq(0)]
        with m.If(gate.o.valid):
            with m.Switch(gitem.kind):
                with m.Case(ITEM_CQE):
                    m.d.comb += [self.cqe.valid.eq(1), gate.o.ready.eq(self.cqe.ready)]
                with m.Default():
                    with m.If(g.err):
                        # a payload write of this QP failed: its response becomes a NAK
                        # (remote operational error, IBA 9.7.5.2.4) and the QP goes to ERR
                        # (a pending atomic keeps its kind: its result is still taken)
                        m.d.comb += [q_entry.kind.eq(Mux(gitem.resp.kind == RESP_ATOMIC_PEND,
                                                         RESP_ATOMIC_PEND, RESP_ACK)),
                                     q_entry.syn.eq(Syn.NAK_REM_OP_ERR.value)]
                        with m.If(~d_nak_sent):
                            m.d.comb += self.resp.valid.eq(1)
                            with m.If(self.resp.ready):
                                m.d.sync += d_nak_sent.eq(1)
                        with m.Else():
                            m.d.comb += [self.err.valid.eq(1),
                                         gate.o.ready.eq(self.err.ready),
                                         gate.clear.eq(1),
                                         self.stat_err.eq(self.err.ready)]
                            with m.If(self.err.ready):
                                m.d.sync += d_nak_sent.eq(0)
                    with m.Else():
                        # appended, or a coalesced ACK replacing the same QP's queued one
                        m.d.comb += [self.resp.valid.eq(1), gate.o.ready.eq(self.resp.ready)]
        return m
