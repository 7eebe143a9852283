"""What a response packet means for the oldest outstanding message of its QP.

The requester's response engine (hw/rnic/requester.py) takes one packet of ``rx`` at a time (an
ACK or NAK, a READ response packet, an atomic acknowledge) and compares it with the head of
its QP's tracker (hw/rnic/tracker.py): this block is that comparison, following IBA vol. 1
rel. 1.4, 9.7.5.1 (requester's response checks):

* the AETH syndrome: ACK, RNR NAK (9.7.5.2.8), PSN sequence NAK, fatal NAKs and the
  completion status each gives (``nak_status``, 9.7.5.2.4 .. 9.7.5.2.7; 11.6.2);
* an ACK covers the messages up to and including its PSN, a NAK or a response those
  strictly before it (9.7.5.1.2, coalesced acknowledges);
* a READ response packet must be the next one of the head READ (``rresp_at``; earlier ones
  are duplicates, a later one shows a lost packet: ``rresp_gap``, an implied NAK,
  9.7.5.1.5), of the right opcode for its place (FIRST / MIDDLE / LAST / ONLY) and of the
  right length (an MTU before the last packet, the rest in the last): ``rresp_match``, else
  a bad response (``bad_resp``, 9.7.5.1.3, C9-114), as is a response of the wrong kind for
  the head message;
* an ACK beyond the highest PSN the QP has sent answers nothing (``ack_ghost``, 9.7.5.1),
  and an ACK at or beyond a head READ / atomic whose response has not come is an implied
  NAK (``implied_nak``);
* a PSN sequence NAK inside the head WRITE / SEND tells how far the responder got
  (``nak_off``, ``nak_more``: go-back-N resends from there, 9.7.6.1.4).

It also says whether the engine needs the head message's WQE fields from the WQE cache
(``need_info``) and whether this response is their last use (``last_use``: it completes the
message, so the cache may free the entry).

Combinational. Parameters: ``mtu`` (the path MTU in bytes, 256 .. 4096).

Ports: ``rxm: In(PKT_META)`` (the response's headers), ``head: In(TRACKER_ENTRY)``,
``nonempty: In(1)`` (the QP has an outstanding message: ``head`` is valid), ``length: In(32)``
(the head message's length, from its WQE), ``hi_psn: In(24)``, ``o: Out(RESP_CLASS)``.
"""

from amaranth.hdl import Module, Mux
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from .. import formats
from ..formats import BthOpcode, WcStatus, WrOpcode
from ..lib.checks import check_mtu
from .tracker import TRACKER_ENTRY, psn_le

__all__ = ["ResponseCheck", "RESP_CLASS"]

#: The classification of one response against the head message of its QP.
RESP_CLASS = data.StructLayout({
    "is_ack": 1, "is_nak": 1, "is_seq_nak": 1, "is_rnr": 1, "nak_status": 5,
    "is_rresp": 1, "rresp_end": 1, "is_aack": 1,
    "head_ws": 1,         # the head message is a WRITE / SEND not failed
    "ack_covers": 1,      # the response acknowledges the whole head message
    "nak_off": 24,        # packets of the head message before the NAK's PSN
    "nak_more": 1,        # ... more of them than the tracker knows
    "rx_off": 64,         # byte offset of a READ response packet in its message
    "rresp_at": 1,        # the head READ's next response packet
    "at_last": 1,         # ... its last one
    "rresp_match": 1,     # ... well formed: taken
    "rresp_gap": 1,       # a later packet of the head READ: an earlier one was lost
    "bad_resp": 1,        # wrong kind for the head message, or its READ packet malformed
    "ack_ghost": 1,       # an ACK / NAK beyond every PSN the QP has sent
    "implied_nak": 1,     # an ACK at or beyond a head READ / atomic without its response
    "aack_match": 1,      # the head atomic's acknowledge
    "need_info": 1,       # the head message's WQE fields are needed
    "last_use": 1,        # the response completes the head message
})


class ResponseCheck(wiring.Component):
    def __init__(self, mtu):
        check_mtu(mtu)
        self.mtu = mtu
        super().__init__({
            "rxm": In(formats.PKT_META),
            "head": In(TRACKER_ENTRY),
            "nonempty": In(1),
            "length": In(32),
            "hi_psn": In(24),
            "o": Out(RESP_CLASS),
        })

    def elaborate(self, platform):
        m = Module()
        rxm, rent, o = self.rxm, self.head, self.o
        rx_op = rxm.opcode
        syn = rxm.syndrome
        ok = self.nonempty & (rent.status == 0)
        m.d.comb += [
            o.is_ack.eq(rx_op == BthOpcode.ACKNOWLEDGE.value),
            o.is_nak.eq(o.is_ack & (syn[5:7] != 0)),
            o.is_rresp.eq((rx_op >= BthOpcode.READ_RESPONSE_FIRST.value)
                          & (rx_op <= BthOpcode.READ_RESPONSE_ONLY.value)),
            o.rresp_end.eq((rx_op == BthOpcode.READ_RESPONSE_LAST.value)
                           | (rx_op == BthOpcode.READ_RESPONSE_ONLY.value)),
            o.is_aack.eq(rx_op == BthOpcode.ATOMIC_ACKNOWLEDGE.value),
            o.is_seq_nak.eq(o.is_nak & (syn == formats.AethSyndrome.NAK_PSN_SEQ_ERR.value)),
            o.is_rnr.eq(o.is_ack & (syn[5:7] == 0b01)),
        ]
        with m.Switch(syn):
            for code, status in ((formats.AethSyndrome.NAK_INV_REQ, WcStatus.REM_INV_REQ_ERR),
                                 (formats.AethSyndrome.NAK_REM_ACCESS_ERR, WcStatus.REM_ACCESS_ERR),
                                 (formats.AethSyndrome.NAK_REM_OP_ERR, WcStatus.REM_OP_ERR),
                                 (formats.AethSyndrome.NAK_PSN_SEQ_ERR, WcStatus.RETRY_EXC_ERR),
                                 (formats.AethSyndrome.NAK_INV_RD_REQ, WcStatus.REM_INV_RD_REQ_ERR)):
                with m.Case(code.value):
                    m.d.comb += o.nak_status.eq(status.value)
            with m.Case("-01-----"):
                m.d.comb += o.nak_status.eq(WcStatus.RNR_RETRY_EXC_ERR.value)
            with m.Default():
                m.d.comb += o.nak_status.eq(WcStatus.REM_OP_ERR.value)
        m.d.comb += o.head_ws.eq(self.nonempty & (rent.opcode <= WrOpcode.SEND_WITH_IMM.value)
                                 & (rent.status == 0))
        # ACK: everything up to and including P; NAK / responses: strictly before P
        m.d.comb += o.ack_covers.eq(Mux(o.is_ack & ~o.is_nak, psn_le(rent.last_psn, rxm.psn),
                                        psn_le(rent.last_psn, rxm.psn)
                                        & (rent.last_psn != rxm.psn)))
        in_head = ok & psn_le(rent.first_psn, rxm.psn) & psn_le(rxm.psn, rent.last_psn)
        m.d.comb += [
            o.nak_off.eq(rxm.psn - rent.first_psn),
            o.nak_more.eq(o.head_ws & psn_le(rent.first_psn, rxm.psn)
                          & psn_le(rxm.psn, rent.last_psn)
                          & (o.nak_off > rent.rcv) & (o.nak_off < (1 << 16))),
            o.rx_off.eq(((rxm.psn - rent.first_psn)[:24]) << exact_log2(self.mtu)),
        ]
        head_read = rent.opcode == WrOpcode.RDMA_READ.value
        head_atomic = ((rent.opcode == WrOpcode.ATOMIC_CMP_AND_SWP.value)
                       | (rent.opcode == WrOpcode.ATOMIC_FETCH_AND_ADD.value))
        rresp_in = in_head & head_read           # a response packet of the head READ
        rresp_next = (rent.first_psn + rent.rcv)[:24]   # the one expected next
        op_first = rx_op == BthOpcode.READ_RESPONSE_FIRST.value
        op_mid = rx_op == BthOpcode.READ_RESPONSE_MIDDLE.value
        m.d.comb += [
            o.rresp_at.eq(rresp_in & (rxm.psn == rresp_next)),
            o.at_last.eq(rxm.psn == rent.last_psn),
        ]
        # the expected packet: the opcode must fit its place (the message's first packet
        # FIRST/ONLY, one before the last FIRST (a resumed READ starts again with FIRST) or
        # MIDDLE, the last LAST/ONLY) and its length the request's
        rresp_form = (Mux(o.at_last, o.rresp_end, op_first | op_mid)
                      & ~((rent.rcv == 0) & ~op_first
                          & ~(rx_op == BthOpcode.READ_RESPONSE_ONLY.value))
                      & Mux(o.at_last, o.rx_off + rxm.paylen == self.length,
                            rxm.paylen == self.mtu))
        m.d.comb += [
            o.rresp_match.eq(o.rresp_at & rresp_form),
            o.bad_resp.eq((o.rresp_at & ~rresp_form)
                          | (in_head & ((o.is_rresp & ~head_read) | (o.is_aack & ~head_atomic)))),
            o.rresp_gap.eq(rresp_in & (rxm.psn != rresp_next) & psn_le(rresp_next, rxm.psn)),
            o.ack_ghost.eq(o.is_ack & ~psn_le(rxm.psn, self.hi_psn)),
            o.implied_nak.eq(o.is_ack & ~o.is_nak & ok
                             & (rent.opcode >= WrOpcode.RDMA_READ.value)
                             & (rent.opcode <= WrOpcode.ATOMIC_FETCH_AND_ADD.value)
                             & psn_le(rent.first_psn, rxm.psn)),
            o.aack_match.eq(ok & head_atomic & (rent.first_psn == rxm.psn)),
            o.need_info.eq(ok & ~rent.noinfo
                           & (rent.signaled | (rent.opcode >= WrOpcode.RDMA_READ.value))),
            o.last_use.eq((o.rresp_at & o.rresp_end & o.at_last)
                          | (o.is_aack & o.aack_match)
                          | (o.head_ws & o.ack_covers & ~o.is_nak)),
        ]
        return m
