"""Signatures of the streams and ports that connect the RNIC blocks.

All streams are ``amaranth.lib.stream`` streams (valid/ready, payload moves when both are
high). Conventions that every block follows:

* **Beat streams** carry bytes packed from byte 0: ``data`` holds up to ``W`` bytes
  (byte *i* in bits ``[8i+7:8i]``), ``nbytes`` says how many are valid (``W`` on every beat
  but the last), ``last`` marks the final beat. A zero-length transfer has no beats.
* **DMA** is byte-addressed and unaligned: a read request ``(addr, len, tag)`` is answered
  by ``ceil(len / W)`` data beats packed from the byte at ``addr``, in request order, each
  carrying the request's ``tag``. A write is one stream of beats; ``addr`` and ``len`` are
  taken from the first beat of each write. ``len`` is at most 65535 bytes; a zero-length
  request is never issued. The host model (``sim/host.py``) or an on-chip memory answers.
* **Packets inside the NIC** travel as a :data:`~hw.formats.PKT_META` struct on a ``meta``
  stream, followed by exactly ``ceil(paylen / W)`` beats on the ``payload`` stream of the
  same direction (none when ``paylen == 0``).
* **Lookups** into context tables are combinational: drive ``index``, read ``data`` in the
  same cycle (asynchronous read port of a ``lib.memory.Memory``).
* **Frames** on the network (``tx``/``rx`` of a node, the link) are beat streams holding a
  whole Ethernet frame, RoCEv2 headers through ICRC.
"""

from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import bits_for

from . import formats

__all__ = [
    "beat_layout", "BeatStream", "MmioSignature", "Lookup", "CtxLookup",
    "DoorbellEvent", "QpEvent", "CqeRequest", "PacketOut",
    "QP_LOOKUP", "QP_EVENT", "CQ_EVENT", "CqEvent", "QpErrRequest",
    "DMA_USER_TAG_BITS", "DMA_MAX_LEN", "dma_rd_req_layout", "dma_rd_data_layout", "DmaReadPort",
    "dma_wr_layout", "DMA_WR_DONE", "DmaWritePort", "tlp_down_layout", "tlp_up_layout",
    "TlpDown", "TlpUp", "MMIO_REQ", "MMIO_RDATA", "MmioPort",
    "AsyncEventType", "ASYNC_EVENT", "AsyncEventStream",
]


def beat_layout(data_bytes):
    return data.StructLayout({
        "data": 8 * data_bytes,
        "nbytes": bits_for(data_bytes),
        "last": 1,
    })


def BeatStream(data_bytes):
    return stream.Signature(beat_layout(data_bytes))


class MmioSignature(wiring.Signature):
    """Host-to-NIC register bus, 64-bit registers at byte addresses (bits 2:0 ignored).

    A write takes effect in the cycle ``we`` is high. A read: ``re`` high for one cycle,
    ``rdata`` valid (``rvalid`` high) in the next cycle. ``MmioSignature()`` is the host
    side (drives addr/wdata/we/re); a NIC block takes ``In(MmioSignature())``.
    """

    def __init__(self, addr_width=16):
        super().__init__({
            "addr": Out(addr_width),
            "wdata": Out(64),
            "we": Out(1),
            "re": Out(1),
            "rdata": In(64),
            "rvalid": In(1),
        })


def Lookup(index_width, data_shape):
    """Combinational table read: the client drives ``index`` and reads ``data``."""
    return wiring.Signature({
        "index": Out(index_width),
        "data": In(data_shape),
    })


def CtxLookup(index_width, data_shape):
    """Request/response table read (a context behind a cache): the client offers ``index`` on
    ``req`` and takes ``{data, err}`` on ``resp``, however many cycles later. ``err``: the
    entry could not be read (a DMA error on its fill); ``data`` is then meaningless. A
    client has at most one request outstanding per port."""
    return wiring.Signature({
        "req": Out(stream.Signature(data.StructLayout({"index": index_width}))),
        "resp": In(stream.Signature(data.StructLayout({"data": data_shape, "err": 1}))),
    })


def DoorbellEvent():
    """A validated doorbell ring: QP ``qpn`` has posted WQEs up to producer index ``pi``."""
    return stream.Signature(data.StructLayout({"qpn": 24, "pi": 16}))


#: What a QP lookup returns: the static context and the current state.
#: a QP's state (on chip, in the context block; the context itself is looked up in the
#: QP-context cache, hw/ctx/qp_cache.py)
QP_LOOKUP = data.StructLayout({"state": formats.QpState})

QP_EVENT = data.StructLayout({
    "qpn": 24,
    "state": formats.QpState,
    "sq_psn": 24,
    "rq_psn": 24,
    # the QP's receive queue (from its context), so that the responder's receive-WQE
    # prefetch can read ahead from the first WQE on (hw/ctx/rq_prefetch.py)
    "rq_base": 64,
    "rq_log": 5,
    # a new QP (SET_QP): the event carries the size of its send queue, which the requester
    # keeps for its doorbell check (the rest of the context it looks up, hw/rnic/requester.py)
    "new": 1,
    "sq_log": 5,
})


def QpEvent():
    """Broadcast after every accepted modify-QP: the new state, the PSNs to start from and
    the QP's receive queue (base address and log2 size)."""
    return stream.Signature(QP_EVENT)


def CqEvent():
    """Broadcast after SET_CQ: the CQ's producer index restarts at 0."""
    return stream.Signature(CQ_EVENT)


CQ_EVENT = data.StructLayout({"cqn": 16})


def QpErrRequest():
    """A block asks the context table to move QP ``qpn`` to the ERR state."""
    return stream.Signature(data.StructLayout({"qpn": 24}))


CQE_REQUEST = data.StructLayout({
    "cqn": 16,
    "cqe": formats.CQE,
})


def CqeRequest():
    """A completion to be written to completion queue ``cqn``; owner bit is set by the engine."""
    return stream.Signature(CQE_REQUEST)


def PacketOut(data_bytes):
    """A packet leaving a block: header fields then payload beats (``In(PacketOut(W))`` to receive)."""
    return wiring.Signature({
        "meta": Out(stream.Signature(formats.PKT_META)),
        "payload": Out(BeatStream(data_bytes)),
    })


# ---------------------------------------------------------------------------------------
# DMA client ports of the host interface (hw/dma/): tagged, with error status

#: Bits of the client's own tag on DMA reads and writes (echoed on data and done).
DMA_USER_TAG_BITS = 16
#: Largest DMA transfer a client may ask for, bytes (64 KiB).
DMA_MAX_LEN = 1 << 16


def dma_rd_req_layout():
    return data.StructLayout({"addr": 64, "len": bits_for(DMA_MAX_LEN), "tag": DMA_USER_TAG_BITS})


def dma_rd_data_layout(data_bytes):
    return data.StructLayout({
        "data": 8 * data_bytes,
        "nbytes": bits_for(data_bytes),
        "last": 1,
        "tag": DMA_USER_TAG_BITS,
        "err": 1,          # the host failed this beat's part of the read or an earlier one
    })


def DmaReadPort(data_bytes):
    """A DMA read port as seen by a client of the NIC's DMA engine.

    ``req`` (client -> engine): read ``len`` (1..65536) bytes at ``addr``; ``rd`` (engine ->
    client): the bytes packed from byte 0, ``ceil(len / W)`` beats, in request order, each
    with the request's ``tag``; ``err`` on a beat says the host answered its part of the read
    or an earlier one with an error status (that data is not valid): on the last beat,
    whether any part failed.
    """
    return wiring.Signature({
        "req": Out(stream.Signature(dma_rd_req_layout())),
        "rd": In(stream.Signature(dma_rd_data_layout(data_bytes))),
    })


def dma_wr_layout(data_bytes):
    return data.StructLayout({
        "addr": 64,
        "len": bits_for(DMA_MAX_LEN),
        "tag": DMA_USER_TAG_BITS,
        "data": 8 * data_bytes,
        "nbytes": bits_for(data_bytes),
        "last": 1,
        "hint": 1,
    })


DMA_WR_DONE = data.StructLayout({"tag": DMA_USER_TAG_BITS, "err": 1})


def DmaWritePort(data_bytes):
    """A DMA write port as seen by a client of the NIC's DMA engine.

    ``wr`` (client -> engine): one write is a run of beats packed from byte 0; ``addr``,
    ``len`` (1..65536), ``tag`` and ``hint`` are taken from its first beat (``hint``: the
    host signals the write when it is in memory, its ``th`` header bit: CQE writes). ``done`` (engine ->
    client, always accepted): one entry per write, in write order, once the host has
    answered every part of it; ``err`` says it failed.
    """
    return wiring.Signature({
        "wr": Out(stream.Signature(dma_wr_layout(data_bytes))),
        "done": In(stream.Signature(DMA_WR_DONE, always_ready=True)),
    })


def tlp_down_layout(data_bytes):
    return data.StructLayout({"hdr": formats.TLP_DOWN_HDR, "data": 8 * data_bytes, "last": 1})


def tlp_up_layout(data_bytes):
    return data.StructLayout({"hdr": formats.TLP_UP_HDR, "data": 8 * data_bytes, "last": 1,
                              "wrsp": formats.WRSP_SIDE})


def TlpDown(data_bytes):
    """Down TLP beats (NIC -> host); the header is valid on the first beat of each TLP."""
    return stream.Signature(tlp_down_layout(data_bytes))


def TlpUp(data_bytes):
    """Up TLP beats (host -> NIC); the header is valid on the first beat of each TLP."""
    return stream.Signature(tlp_up_layout(data_bytes))


#: An MMIO request from the host: a write of ``len`` bytes (8, or 64 for a write-combined
#: BlueFlame write) at ``addr``, ``data`` packed from byte 0; or a read (``we`` = 0) of the
#: 64-bit register at ``addr``.
MMIO_REQ = data.StructLayout({"we": 1, "addr": 16, "len": 7, "data": 512})
MMIO_RDATA = data.StructLayout({"data": 64})


def MmioPort():
    """The host's MMIO path into a NIC (host side): requests with back-pressure, read data."""
    return wiring.Signature({
        "req": Out(stream.Signature(MMIO_REQ)),
        "rdata": In(stream.Signature(MMIO_RDATA)),
    })


class AsyncEventType:
    """Affiliated asynchronous events (IBA vol. 1 11.6.3; libibverbs ``ibv_event_type``)."""
    CQ_ERR = 1        # IBV_EVENT_CQ_ERR: the CQ overran or a CQE write failed (C11-37)


ASYNC_EVENT = data.StructLayout({"type": 4, "index": 24})


def AsyncEventStream():
    return stream.Signature(ASYNC_EVENT)
