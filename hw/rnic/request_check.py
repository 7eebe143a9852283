"""The responder's checks of one request packet against its QP and memory region.

The responder (hw/rnic/responder.py) takes one request packet at a time; this block is what it
decides from the packet's headers, the QP's responder state and context and the memory
region the key names (IBA vol. 1 rel. 1.4, 9.7.5.1 responder checks; the order in which the
responder applies them is in hw/rnic/responder.py):

* the opcode's class (SEND / WRITE first or continuing, last packet, full packet, with
  immediate, READ, atomic) and whether the NIC knows it (``known``);
* the opcode sequence (9.7.5.1.3: a continuing packet only inside a message of its kind, a
  new message only outside one: ``seq_ok``) and the payload length (at most an MTU, exactly
  an MTU in a FIRST / MIDDLE packet, none in a READ or atomic request: ``len_ok``);
* a duplicate: the PSN lies in the half of the PSN space behind the expected one
  (``psn_behind``, 9.7.5.1.2);
* the memory-region checks (9.7.5.1.4, 10.6.3.3): the region valid, of the key and of the
  QP's protection domain, granting the right, the range inside it, and for remote access
  the QP granting the right too: a WRITE's RETH (``w_acc_bad``) and its length so far
  (``w_len_bad``), a READ's RETH (``r_acc_bad``), an atomic's address (``a_acc_bad``, and
  ``a_align_bad``: not 8-byte aligned); a SEND's payload against the receive buffer left
  (``s_len_bad``), a receive WQE's buffer against its lkey (``q_prot_bad``: local write) and
  its length (``q_len_bad``);
* the receive queue is empty (``rq_empty``), where a WRITE's data goes next (``w_va``,
  ``w_rem``) and how many response packets a READ takes (``n_resp``).

Combinational. Parameters: ``mtu`` (the path MTU in bytes, 256 .. 4096).

Ports: ``pk: In(PKT_META)``, ``state: In(RSP_STATE)`` (the QP's responder state),
``ctx: In(QP_CTX)``, ``mr: In(MR_ENTRY)`` (the entry of ``key``), ``key: In(32)``,
``wqe: In(RECV_WQE)``, ``pi: In(16)`` (the receive queue's producer index),
``o: Out(REQ_CLASS)``.
"""

from amaranth.hdl import Const, Module, Mux
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from ..formats import MR_ENTRY, PKT_META, RECV_WQE, Access, BthOpcode as Op
from ..regmap import QP_CTX
from ..lib.checks import check_mtu

__all__ = ["RequestCheck", "REQ_CLASS", "RSP_STATE", "MSG_NONE", "MSG_SEND", "MSG_WRITE"]

MSG_NONE, MSG_SEND, MSG_WRITE = 0, 1, 2

#: Per-QP responder state (one memory row per QP).
RSP_STATE = data.StructLayout({
    "epsn": 24,     # expected PSN of the next request packet
    "msn": 24,      # messages completed
    "ci": 16,       # receive-queue consumer index (free running)
    "inprog": 2,    # MSG_NONE / MSG_SEND / MSG_WRITE: multi-packet message in progress
    "va": 64,       # next address to write (WRITE: remote VA; SEND: receive buffer)
    "rem": 32,      # WRITE: DMA length left; SEND: receive buffer space left
    "count": 32,    # WRITE: total DMA length (byte_len of WRITE_IMM); SEND: bytes so far
    "wr_id": 64,    # SEND: wr_id of the receive WQE being filled
    "nak_sent": 1,  # a PSN sequence / RNR NAK was sent; later out-of-sequence packets are
                    # dropped silently until the expected PSN arrives (IBA 9.7.5.2.2)
    "rp": 4,        # atomic replay cache: next slot of this QP's ring
    "rfull": 1,     # the ring has wrapped (every slot holds a result)
})

#: What the responder's checks find (every field combinational, valid with the inputs).
REQ_CLASS = data.StructLayout({
    "send_first": 1, "send_cont": 1, "write_first": 1, "write_cont": 1,
    "last": 1, "full": 1, "imm": 1, "wimm": 1, "read": 1, "atomic": 1,
    "known": 1, "seq_ok": 1, "len_ok": 1, "psn_behind": 1, "rq_empty": 1,
    "w_acc_bad": 1, "w_len_bad": 1, "r_acc_bad": 1, "a_align_bad": 1, "a_acc_bad": 1,
    "s_len_bad": 1, "q_prot_bad": 1, "q_len_bad": 1,
    "w_va": 64, "w_rem": 32, "n_resp": 24,
})


class RequestCheck(wiring.Component):
    def __init__(self, mtu):
        check_mtu(mtu)
        self.mtu = mtu
        super().__init__({
            "pk": In(PKT_META),
            "state": In(RSP_STATE),
            "ctx": In(QP_CTX),
            "mr": In(MR_ENTRY),
            "key": In(32),
            "wqe": In(RECV_WQE),
            "pi": In(16),
            "o": Out(REQ_CLASS),
        })

    def elaborate(self, platform):
        m = Module()
        pk, s, e, ctx, wqe, o = self.pk, self.state, self.mr, self.ctx, self.wqe, self.o
        mtu = self.mtu
        op = pk.opcode

        def op_in(*ops):
            r = Const(0, 1)
            for x in ops:
                r = r | (op == x.value)
            return r

        m.d.comb += [
            o.send_first.eq(op_in(Op.SEND_FIRST, Op.SEND_ONLY, Op.SEND_ONLY_IMM)),
            o.send_cont.eq(op_in(Op.SEND_MIDDLE, Op.SEND_LAST, Op.SEND_LAST_IMM)),
            o.write_first.eq(op_in(Op.WRITE_FIRST, Op.WRITE_ONLY, Op.WRITE_ONLY_IMM)),
            o.write_cont.eq(op_in(Op.WRITE_MIDDLE, Op.WRITE_LAST, Op.WRITE_LAST_IMM)),
            o.last.eq(op_in(Op.SEND_LAST, Op.SEND_LAST_IMM, Op.SEND_ONLY, Op.SEND_ONLY_IMM,
                            Op.WRITE_LAST, Op.WRITE_LAST_IMM, Op.WRITE_ONLY, Op.WRITE_ONLY_IMM)),
            o.full.eq(op_in(Op.SEND_FIRST, Op.SEND_MIDDLE, Op.WRITE_FIRST, Op.WRITE_MIDDLE)),
            o.imm.eq(op_in(Op.SEND_LAST_IMM, Op.SEND_ONLY_IMM, Op.WRITE_LAST_IMM,
                           Op.WRITE_ONLY_IMM)),
            o.wimm.eq(op_in(Op.WRITE_LAST_IMM, Op.WRITE_ONLY_IMM)),
            o.read.eq(op_in(Op.READ_REQUEST)),
            o.atomic.eq(op_in(Op.COMPARE_SWAP, Op.FETCH_ADD)),
        ]
        m.d.comb += [
            o.known.eq(o.send_first | o.send_cont | o.write_first | o.write_cont | o.read
                       | o.atomic),
            o.seq_ok.eq(Mux(s.inprog == MSG_SEND, o.send_cont,
                            Mux(s.inprog == MSG_WRITE, o.write_cont,
                                ~o.send_cont & ~o.write_cont))),
            o.len_ok.eq((pk.paylen <= mtu) & (~o.full | (pk.paylen == mtu))
                        & (~(o.read | o.atomic) | (pk.paylen == 0))),
            o.rq_empty.eq(s.ci == self.pi),
        ]
        # a PSN in the half of the PSN space behind the expected PSN is a duplicate
        behind = (s.epsn - pk.psn)[:24]
        m.d.comb += o.psn_behind.eq((behind != 0) & (behind <= (1 << 23)))

        def mr_ok(right, va, length, remote):
            right = Access(right).value
            ok = (e.valid & (e.key == self.key) & (e.pd == ctx.pd) & ((e.access & right) != 0)
                  & (va >= e.base) & ((va + length) <= (e.base + e.length)))
            if remote:
                ok = ok & ((ctx.access & right) != 0)
            return ok

        m.d.comb += [
            o.w_va.eq(Mux(o.write_first, pk.va, s.va)),
            o.w_rem.eq(Mux(o.write_first, pk.dma_len, s.rem)),
        ]
        m.d.comb += [
            o.w_acc_bad.eq(o.write_first & (pk.dma_len != 0)
                           & ~mr_ok(Access.REMOTE_WRITE, pk.va, pk.dma_len, True)),
            o.w_len_bad.eq((pk.paylen > o.w_rem) | (o.last & (pk.paylen != o.w_rem))),
            o.r_acc_bad.eq((pk.dma_len != 0)
                           & ~mr_ok(Access.REMOTE_READ, pk.va, pk.dma_len, True)),
            o.a_align_bad.eq(pk.va[:3] != 0),
            o.a_acc_bad.eq(~mr_ok(Access.REMOTE_ATOMIC, pk.va, 8, True)),
            o.s_len_bad.eq(pk.paylen > s.rem),
            o.q_prot_bad.eq((wqe.length != 0)
                            & ~mr_ok(Access.LOCAL_WRITE, wqe.addr, wqe.length, False)),
            o.q_len_bad.eq(pk.paylen > wqe.length),
            o.n_resp.eq(Mux(pk.dma_len == 0, 1, (pk.dma_len + (mtu - 1)) >> exact_log2(mtu))),
        ]
        return m
