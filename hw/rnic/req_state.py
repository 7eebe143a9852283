"""The requester's per-QP state: one table of fields, each kept in a memory indexed by QP.

Every field of the requester that belongs to a QP (indices, PSNs, retransmission state, the
QP's limits captured when a message enters the tracker, QP-event bookkeeping) is one
:class:`~hw.lib.mem_array.MemArray` of ``n_qps`` elements, owned by the requester
(hw/rnic/requester.py), written through named ports and read at a few indices, never
scanned (issue 8 section 1; Corundum keeps per-queue state in RAM the same way). The
engines reach it through typed ports: the send engine (hw/rnic/send_engine.py) writes the
"tx" port of every field below that has one (except ``rd_out`` and ``fence_wait``, whose
"tx" writes merge the send engine's and the response engine's changes of one cycle) and
reads the fields at the QP it serves; the response engine (hw/rnic/response_engine.py)
reports its changes as events applied to the "rx" ports.

Write ports: "tx" the send engine, "rx" the response engine, "gq" the fetch issuer, "xq"
the retry timers, "evc" / "evs" / "evr" the QP-event bookkeeping (a later port wins).
"""

from amaranth.utils import exact_log2

from ..regmap import QP_CTX

__all__ = ["req_state_fields", "CUR_FIELDS", "TX_FIELDS"]


def req_state_fields(cfg):
    """``{name: (width, write ports, read ports, init)}`` of the requester's per-QP fields."""
    mo = exact_log2(cfg.max_outstanding) + 1
    return {
        # posted (doorbell), next to fetch and send, oldest not completed
        "pi": (16, ("tx",), 6, 0),
        "fi": (16, ("tx",), 5, 0),
        "ci": (16, ("tx", "rx"), 5, 0),
        "npsn": (24, ("tx",), 1, 0),          # the PSN of the next message
        # the highest PSN given to a message since the QP got its send PSN: an ACK or NAK
        # beyond it answers nothing this QP sent (IBA 9.7.5.1) and is dropped
        "hi_psn": (24, ("tx",), 2, 0),
        "head": (mo, ("tx", "rx"), 6, 0),     # tracker: oldest message
        "tail": (mo, ("tx",), 6, 0),          # tracker: next free slot
        # READ/atomic requests outstanding and the fence flag: the send engine (commit,
        # reset) wins over the response engine (completion), merged when both work on one
        # QP in the same cycle
        "rd_out": (5, ("rx", "tx"), 6, 0),
        "fence_wait": (1, ("rx", "tx"), 4, 0),
        # READ/atomic limit and send CQ, captured when a message enters the tracker
        "qlim": (5, ("tx",), 4, 16),
        "qcq": (QP_CTX["send_cq"].shape, ("tx",), 1, 0),
        "rts": (1, ("tx",), 7, 0),
        "err": (1, ("tx", "rx"), 9, 0),
        # a local error waits until the messages sent before the failed WQE have completed
        "lerr": (1, ("tx",), 7, 0),
        "lerr_idx": (16, ("tx",), 2, 0),
        # QP events waiting to be applied while the send engine is idle
        "ev_pend": (1, ("evc", "evs"), 8, 0),
        "ev_reset": (1, ("evs", "evr"), 4, 0),
        "ev_state": (3, ("evs",), 3, 0),
        "ev_psn": (24, ("evs",), 1, 0),
        # retransmission (IBA 9.7.6.1, go-back-N from the oldest outstanding message): a
        # rewind requested (PSN sequence NAK, ACK timeout, end of an RNR wait, lost READ
        # response) and applied by the send engine; whether it counts against retry_cnt;
        # rewound with no progress since (further NAKs ignored); the RNR wait
        "rwd_pend": (1, ("tx", "rx", "xq"), 5, 0),
        "rwd_cnt": (1, ("rx", "xq"), 1, 0),
        "rtx_started": (1, ("tx", "rx"), 1, 0),
        "rnr_wait": (1, ("tx", "rx", "xq"), 4, 0),
        "retry_used": (3, ("tx", "rx"), 1, 0),
        "rnr_used": (3, ("tx", "rx"), 1, 0),
        # the QP's timeout / retry_cnt / rnr_retry, captured when a message enters the tracker
        "q_to": (5, ("tx",), 1, 0),
        "q_retry": (3, ("tx",), 1, 0),
        "q_rnr": (3, ("tx",), 1, 0),
        # a rewound READ resumes after the response packets it already has (9.7.5.1.5)
        "rs_skip": (16, ("tx",), 1, 0),
        # the send queue: its base captured like q_to, its log2 size from the event of a new
        # QP; where a WQE the WQE cache no longer holds is read again
        "q_sqb": (64, ("tx",), 2, 0),
        "q_sqlog": (5, ("evs",), 3, 0),
        # a fetched batch of this QP is queued or being sent
        "inflight": (1, ("gq", "tx"), 3, 0),
    }


#: Fields the send engine reads at the QP it serves.
CUR_FIELDS = ("pi", "fi", "ci", "npsn", "hi_psn", "head", "tail", "rd_out", "fence_wait",
              "qlim", "rts", "err", "lerr", "ev_pend", "rwd_pend", "rwd_cnt", "rnr_wait",
              "retry_used", "q_retry", "rs_skip", "q_sqb", "q_sqlog")
#: Fields whose "tx" port the send engine drives.
TX_FIELDS = ("pi", "fi", "ci", "npsn", "hi_psn", "head", "tail", "qlim", "qcq", "rts", "err",
             "lerr", "lerr_idx", "rwd_pend", "rtx_started", "rnr_wait", "retry_used",
             "rnr_used", "q_to", "q_retry", "q_rnr", "rs_skip", "q_sqb", "inflight")
