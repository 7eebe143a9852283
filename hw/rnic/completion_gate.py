"""The requester's completion path: send completions and QP-error requests, behind a write
gate.

Both requester engines complete work requests (IBA vol. 1 rel. 1.4, 10.8 and 11.4.2): the
response engine those a response finishes, the send engine those that fail locally or are
flushed. Their completions meet here (``rx_cqe`` has priority over ``tx_cqe``; an offer on
the output is kept until taken: hw/lib/priority_merge.py) and pass a
:class:`~hw.lib.write_gate.WriteGate`: a completion leaves only once the host has answered
the writes the requester made before it for that QP (the READ data, the atomic result), so
a CQE is never visible before its data. If one of those writes failed, the completion leaves
as ``LOC_PROT_ERR`` (even an unsignaled READ / atomic, which otherwise passes silently) and
then its QP is asked to go to ERR (docs/errors.md). The engines' own QP-error requests
(``rx_err`` before ``tx_err``) and the gate's share ``set_err`` (round robin).

Parameters: ``qpn_bits`` in [1, 16]; ``depth``: completions held by the gate (``NicConfig``'s
``gate_depth``).

Ports: ``rx_cqe``, ``tx_cqe: In(stream {item: GATE_ITEM, key})`` (``key``: the QP);
``rx_err``, ``tx_err: In(QpErrRequest())``; ``wr_issued: In(1)`` (a requester write has
been handed to DMA: pulses once per write); ``done: In(stream DMA_WR_DONE)`` (the host's
answers, in order); ``forget: In(1)`` / ``forget_key: In(qpn_bits)`` (the QP was reset:
drop its failed-write records); ``cqe: Out(CqeRequest())``; ``set_err: Out(QpErrRequest())``;
``stat_err: Out(1)`` (a completion failed by its write).
"""

from amaranth.hdl import Module, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from .. import formats
from ..lib.arbiter import StreamArbiter
from ..formats import WcStatus
from ..interfaces import DMA_WR_DONE, CqeRequest, QpErrRequest
from ..lib.checks import check_int
from ..lib.priority_merge import PriorityMerge
from ..lib.write_gate import WriteGate
from .tracker import GATE_ITEM

__all__ = ["CompletionGate"]


class CompletionGate(wiring.Component):
    def __init__(self, qpn_bits, depth):
        check_int("qpn_bits", qpn_bits, 1, 16)
        self.qpn_bits = qpn_bits
        self.depth = depth
        offer = stream.Signature(data.StructLayout({"item": GATE_ITEM, "key": qpn_bits}))
        super().__init__({
            "rx_cqe": In(offer),
            "tx_cqe": In(offer),
            "rx_err": In(QpErrRequest()),
            "tx_err": In(QpErrRequest()),
            "wr_issued": In(1),
            "done": In(stream.Signature(DMA_WR_DONE, always_ready=True)),
            "forget": In(1),
            "forget_key": In(qpn_bits),
            "cqe": Out(CqeRequest()),
            "set_err": Out(QpErrRequest()),
            "stat_err": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.gate = gate = WriteGate(GATE_ITEM, self.qpn_bits, depth=self.depth)
        wiring.connect(m, wiring.flipped(self.done), gate.done)
        m.d.comb += [gate.wr_issued.eq(self.wr_issued), gate.forget.eq(self.forget),
                     gate.forget_key.eq(self.forget_key), gate.clear.eq(1)]
        m.submodules.cqe_merge = cqe_merge = PriorityMerge(gate.i.payload.shape())
        wiring.connect(m, cqe_merge.o, gate.i)
        wiring.connect(m, wiring.flipped(self.rx_cqe), cqe_merge.i[0])
        wiring.connect(m, wiring.flipped(self.tx_cqe), cqe_merge.i[1])

        qp_err = data.StructLayout({"qpn": 24})
        m.submodules.err_arb = err_arb = StreamArbiter(qp_err, 2)
        m.submodules.err_merge = err_merge = PriorityMerge(qp_err)
        wiring.connect(m, err_merge.o, err_arb.i[0])
        wiring.connect(m, wiring.flipped(self.rx_err), err_merge.i[0])
        wiring.connect(m, wiring.flipped(self.tx_err), err_merge.i[1])
        wiring.connect(m, err_arb.o, wiring.flipped(self.set_err))

        # the gate's output: a completion whose WR's data write failed becomes LOC_PROT_ERR
        # (even an unsignaled one) and then asks for its QP to go to ERR; a silent success
        # vanishes
        go = gate.o.payload
        g_cqe = Signal(formats.CQE)
        g_err_sent = Signal()          # the failed completion has left, the ERR request waits
        m.d.comb += g_cqe.eq(go.item.req.cqe)
        with m.If(go.err & (go.item.req.cqe.status == 0)):
            m.d.comb += [g_cqe.status.eq(WcStatus.LOC_PROT_ERR.value), g_cqe.byte_len.eq(0)]
        gate_err = err_arb.i[1]
        m.d.comb += [gate_err.payload.qpn.eq(go.key), self.cqe.payload.cqn.eq(go.item.req.cqn),
                     self.cqe.payload.cqe.eq(g_cqe)]
        with m.If(gate.o.valid):
            with m.If(go.err):
                m.d.comb += [self.cqe.valid.eq(~g_err_sent), gate_err.valid.eq(g_err_sent),
                             gate.o.ready.eq(g_err_sent & gate_err.ready)]
                with m.If(self.cqe.valid & self.cqe.ready):
                    m.d.sync += g_err_sent.eq(1)
                with m.If(gate.o.ready):
                    m.d.sync += g_err_sent.eq(0)
                m.d.comb += self.stat_err.eq(gate.o.ready)
            with m.Elif(go.item.silent):
                m.d.comb += gate.o.ready.eq(1)
            with m.Else():
                m.d.comb += [self.cqe.valid.eq(1), gate.o.ready.eq(self.cqe.ready)]
        return m
