"""The requester's per-QP list of outstanding messages: entry layout and PSN arithmetic.

Each QP has ``max_outstanding`` tracker slots in one memory of the requester
(hw/rnic/requester.py): the messages between the oldest not completed (``ci``, the list's head)
and the next to send (``fi``, its tail), in send order. An entry holds what the response
engine needs to match responses to the message (IBA vol. 1 rel. 1.4, 9.7.5.1) and to
complete it in order (10.8); the WQE's own fields are in the WQE cache (hw/ctx/wqe_cache.py).
"""

from amaranth.hdl import Const, Mux
from amaranth.lib import data

from ..formats import WcOpcode, WrOpcode
from ..interfaces import CQE_REQUEST

__all__ = ["TRACKER_ENTRY", "GATE_ITEM", "psn_le", "wc_opcode", "set_cqe", "sq_slot_addr"]

#: One outstanding message of a QP (``status`` non-zero: failed locally or NAKed).
TRACKER_ENTRY = data.StructLayout({
    # the WQE's fields (wr_id, local_addr, length) are in the WQE cache (hw/ctx/wqe_cache.py),
    # keyed by (QPN, index): a miss reads the WQE again from the send queue
    "index": 16,          # the WQE's send-queue index
    "noinfo": 1,          # the WQE could not be read: no cached copy, wr_id 0
    "first_psn": 24,
    "last_psn": 24,
    "opcode": 3,          # WrOpcode, 7 = unknown
    "signaled": 1,
    "status": 5,          # WcStatus
    "rcv": 16,            # READ: response packets received so far (they must come in order);
                          # WRITE/SEND: packets a PSN sequence NAK showed the responder to have
})

#: A send completion on its way out, through the requester's write gate
#: (hw/lib/write_gate.py): ``silent`` an unsignaled READ / atomic that is announced only if
#: the write of its data failed.
GATE_ITEM = data.StructLayout({"req": CQE_REQUEST, "silent": 1})


def psn_le(a, b):
    """a <= b in 24-bit serial arithmetic (PSNs, IBA 9.7.1): true when b is at most 2**23 - 1
    ahead of a."""
    return ((b - a) & 0xFFFFFF) < (1 << 23)


def wc_opcode(op):
    """The completion opcode (IBA 11.4.2.1) of a message of work-request opcode ``op``."""
    return Mux(op <= WrOpcode.RDMA_WRITE_WITH_IMM.value, WcOpcode.RDMA_WRITE.value,
           Mux(op == WrOpcode.RDMA_READ.value, WcOpcode.RDMA_READ.value,
           Mux(op == WrOpcode.ATOMIC_CMP_AND_SWP.value, WcOpcode.COMP_SWAP.value,
           Mux(op == WrOpcode.ATOMIC_FETCH_AND_ADD.value, WcOpcode.FETCH_ADD.value,
               WcOpcode.SEND.value))))


def set_cqe(reg, q, wr_id, status, opcode, byte_len):
    """Statements that fill the CQE register ``reg`` (``byte_len`` only on success)."""
    return [
        reg.eq(0),
        reg.wr_id.eq(wr_id),
        reg.status.eq(status),
        reg.opcode.eq(wc_opcode(opcode)),
        reg.byte_len.eq(Mux(status == 0, byte_len, 0)),
        reg.qpn.eq(q),
    ]


def sq_slot_addr(base, log_size, index):
    """Host address of entry ``index`` (free running) of a send queue of ``2**log_size``
    64-byte WQEs at ``base``."""
    mask = ((Const(1, 33) << log_size) - 1)[:16]
    return base + ((index & mask) << 6)
