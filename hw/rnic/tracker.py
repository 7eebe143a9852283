"""The requester's per-QP list of outstanding messages: entry layout and PSN arithmetic.

Each QP has ``max_outstanding`` tracker slots in one memory of the requester
(hw/requester.py): the messages between the oldest not completed (``ci``, the list's head)
and the next to send (``fi``, its tail), in send order. An entry holds what the response
engine needs to match responses to the message (IBA vol. 1 rel. 1.4, 9.7.5.1) and to
complete it in order (10.8); the WQE's own fields are in the WQE cache (hw/ctx/wqe_cache.py).
"""

from amaranth.lib import data

__all__ = ["TRACKER_ENTRY", "psn_le"]

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


def psn_le(a, b):
    """a <= b in 24-bit serial arithmetic (PSNs, IBA 9.7.1): true when b is at most 2**23 - 1
    ahead of a."""
    return ((b - a) & 0xFFFFFF) < (1 << 23)
