"""Request lookahead: the QP context and the rkey's MR entry of the next request packets,
looked up before the responder takes them.

A responder that asks for a packet's context only when it takes the packet waits the
context cache's latency (four cycles for a hit, hw/lib/cache.py) once per packet; a
ConnectX-class NIC answers 8-byte READs at more than one per three cycles, so the lookups of
the packets behind the one being executed must already be in flight. This block sits
between the receive dispatch (hw/rnic/dispatch.py) and the responder's state machine
(hw/rnic/responder.py). It takes up to ``n`` request packets ahead: for each it asks the
QP-context cache for the packet's QP (``qpc[k]``) and, for a request that names an rkey
(WRITE FIRST / ONLY, READ, atomics: IBA vol. 1 9.7.4.1.3 / 9.7.4.1.5), the MR cache for the
key's slot (``mr[k]``), packet ``j`` on port pair ``j mod n``, so each port has at most one
request outstanding (``hw.interfaces.CtxLookup``) and the ``n`` lookups overlap. The
packet's payload beats go into a FIFO of ``payload_beats`` beats (the next packet's meta is
only seen once the payload before it has been taken, hw/rnic/dispatch.py), so the block looks
past small packets (an 8-byte WRITE is one beat) and streams large ones.

The responder takes the packets in arrival order on ``o.meta``, each with its answers
(``ctx`` / ``ctx_err``, ``mr`` / ``mr_err``; ``mr`` is meaningless for a packet that names no
rkey), and their payload on ``o.payload``.

A QP reset between a packet's lookup and its take (``kill`` with ``kill_qpn``: a QP event
that restarts the receive side, hw/rnic/responder.py) marks the packet ``killed``: its context
may be the old one, so the responder drops it as it drops a packet whose QP was reset while it
executed (the packet counts as arrived before the event).

Parameters: ``data_bytes`` (W), ``qpn_bits`` and ``mr_bits`` (the lookup indices; the MR
slot is bits ``8 ..`` of the rkey, :func:`hw.regmap.mkey_index`), ``n`` in [1, 4] (packets
looked up ahead, lookup port pairs), ``payload_beats`` (a power of two in [2, 256]).

Ports: ``i: In(PacketOut(W))``; ``o``: ``meta: Out(stream of AHEAD_LAYOUT)``, ``payload:
Out(BeatStream(W))``; ``qpc: Out(CtxLookup(qpn_bits, QP_CTX)).array(n)``; ``mr:
Out(CtxLookup(mr_bits, MR_ENTRY)).array(n)``; ``kill: In(1)``, ``kill_qpn: In(qpn_bits)``.
"""

from amaranth.hdl import Array, Cat, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from ..formats import MR_ENTRY, PKT_META, BthOpcode as Op
from ..interfaces import BeatStream, CtxLookup, PacketOut, beat_layout
from ..lib.checks import check_int, check_pow2
from ..regmap import QP_CTX

__all__ = ["RequestLookup", "ahead_layout", "RKEY_OPCODES"]

#: the request opcodes that carry an rkey (RETH or AtomicETH) looked up in the MR cache
RKEY_OPCODES = (Op.WRITE_FIRST, Op.WRITE_ONLY, Op.WRITE_ONLY_IMM, Op.READ_REQUEST,
                Op.COMPARE_SWAP, Op.FETCH_ADD)


def ahead_layout():
    """What the responder takes with each packet."""
    return data.StructLayout({"pkt": PKT_META, "ctx": QP_CTX, "ctx_err": 1, "mr": MR_ENTRY,
                              "mr_err": 1, "killed": 1})


def names_rkey(opcode):
    """The packet's opcode is one of :data:`RKEY_OPCODES`."""
    return Cat(*[opcode == o.value for o in RKEY_OPCODES]).any()


class RequestLookup(wiring.Component):
    def __init__(self, data_bytes, qpn_bits, mr_bits, n=2, payload_beats=8):
        check_int("n", n, 1, 4)
        check_pow2("payload_beats", payload_beats, 2, 256)
        self.data_bytes, self.qpn_bits, self.mr_bits = data_bytes, qpn_bits, mr_bits
        self.n, self.payload_beats = n, payload_beats
        super().__init__({
            "i": In(PacketOut(data_bytes)),
            "o": Out(wiring.Signature({"meta": Out(stream.Signature(ahead_layout())),
                                       "payload": Out(BeatStream(data_bytes))})),
            "qpc": Out(CtxLookup(qpn_bits, QP_CTX)).array(n),
            "mr": Out(CtxLookup(mr_bits, MR_ENTRY)).array(n),
            "kill": In(1),
            "kill_qpn": In(qpn_bits),
        })

    def elaborate(self, platform):
        m = Module()
        n, qb = self.n, self.qpn_bits
        inm = self.i.meta.payload

        # the packets taken and not yet handed on, a ring of n slots; slot k's lookups on
        # port pair k
        metas = Array(Signal(PKT_META, name=f"meta{k}") for k in range(n))
        rkeys = Array(Signal(name=f"rkey{k}") for k in range(n))
        killed = Array(Signal(name=f"killed{k}") for k in range(n))
        held = Array(Signal(name=f"held{k}") for k in range(n))
        wp = Signal(range(n))
        rp = Signal(range(n))

        def step(p):
            return 0 if n == 1 else Mux(p == n - 1, 0, p + 1)

        # ---- taking a packet: both lookups asked for (each once), then the meta ----------
        q_asked = Signal()
        m_asked = Signal()
        in_kill = Signal()       # the QP was reset after a lookup was asked for, before the take
        in_rkey = Signal()
        m.d.comb += in_rkey.eq(names_rkey(inm.opcode))
        free = ~held[wp]
        in_payload = Signal()
        for k in range(n):
            mine = free & (wp == k) & self.i.meta.valid & ~in_payload
            m.d.comb += [
                self.qpc[k].req.valid.eq(mine & ~q_asked),
                self.qpc[k].req.payload.index.eq(inm.dest_qpn[:qb]),
                self.mr[k].req.valid.eq(mine & in_rkey & ~m_asked),
                self.mr[k].req.payload.index.eq(inm.rkey[8:8 + self.mr_bits]),
            ]
        q_ok = q_asked | Array(p.req.ready for p in self.qpc)[wp]
        m_ok = ~in_rkey | m_asked | Array(p.req.ready for p in self.mr)[wp]
        kill_in = self.kill & (self.kill_qpn == inm.dest_qpn[:qb])
        take = Signal()
        m.d.comb += [take.eq(free & self.i.meta.valid & ~in_payload & q_ok & m_ok),
                     self.i.meta.ready.eq(take)]
        with m.If(take):
            m.d.sync += [metas[wp].eq(inm), rkeys[wp].eq(in_rkey), held[wp].eq(1),
                         killed[wp].eq(in_kill | ((q_asked | m_asked) & kill_in)),
                         q_asked.eq(0), m_asked.eq(0), in_kill.eq(0), wp.eq(step(wp)),
                         in_payload.eq(inm.paylen != 0)]
        with m.Elif(free & self.i.meta.valid & ~in_payload):
            m.d.sync += [q_asked.eq(q_ok), m_asked.eq(m_asked | (in_rkey & m_ok)),
                         in_kill.eq(in_kill | ((q_asked | m_asked) & kill_in))]

        # ---- the payload, through a FIFO (the next meta comes after the payload's last beat)
        m.submodules.pay = pay = SyncFIFOBuffered(width=beat_layout(self.data_bytes).size,
                                                  depth=self.payload_beats)
        m.d.comb += [pay.w_data.eq(self.i.payload.payload), pay.w_en.eq(self.i.payload.valid & in_payload),
                     self.i.payload.ready.eq(pay.w_rdy & in_payload),
                     self.o.payload.valid.eq(pay.r_rdy), self.o.payload.payload.eq(pay.r_data),
                     pay.r_en.eq(self.o.payload.ready)]
        with m.If(self.i.payload.valid & self.i.payload.ready & self.i.payload.payload.last):
            m.d.sync += in_payload.eq(0)

        # ---- handing on: the oldest packet once its answers are there ---------------------
        o = self.o.meta
        qr = Array(p.resp for p in self.qpc)[rp]
        mr = Array(p.resp for p in self.mr)[rp]
        head_rkey = rkeys[rp]
        head_meta = metas[rp]
        m.d.comb += [
            o.valid.eq(held[rp] & qr.valid & (~head_rkey | mr.valid)),
            o.payload.pkt.eq(head_meta),
            o.payload.ctx.eq(qr.payload.data), o.payload.ctx_err.eq(qr.payload.err),
            o.payload.mr.eq(mr.payload.data), o.payload.mr_err.eq(mr.payload.err),
            o.payload.killed.eq(killed[rp] | (self.kill & (self.kill_qpn == head_meta.dest_qpn[:qb]))),
        ]
        for k in range(n):
            m.d.comb += [self.qpc[k].resp.ready.eq(o.ready & held[k] & (rp == k) & o.valid),
                         self.mr[k].resp.ready.eq(o.ready & held[k] & (rp == k) & o.valid & rkeys[k])]
        with m.If(o.valid & o.ready):
            m.d.sync += [held[rp].eq(0), rp.eq(step(rp))]

        # ---- a QP reset kills the packets of that QP that wait here ------------------------
        with m.If(self.kill):
            for k in range(n):
                with m.If(held[k] & (metas[k].dest_qpn[:qb] == self.kill_qpn)):
                    m.d.sync += killed[k].eq(1)
        return m
