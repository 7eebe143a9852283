"""Every format the RNIC model exchanges, in one place.

Host-visible structures (WQE, receive WQE, CQE, doorbell word, memory-region entry) are
``amaranth.lib.data`` layouts whose fields are listed least-significant bit first; the host
stores them little-endian, so byte *n* of a structure in host memory is bits
``[8n+7 : 8n]`` of the layout. ``docs/formats.md`` documents each byte.

Wire formats follow RoCEv2 (InfiniBand Architecture Specification vol. 1 rel. 1.4,
chapter 9 "Transport layer" for BTH/RETH/AtomicETH/AETH/AtomicAckETH/ImmDt, and Annex A17
"RoCEv2" for the UDP/IPv4 encapsulation and the ICRC). On the wire every multi-byte field is
big-endian; inside the NIC a packet's headers travel as one :data:`PKT_META` struct next to
its payload stream, and only the packetizer and depacketizer deal with bytes.

The Python helpers at the bottom (``pack``/``unpack``) turn the same layouts into bytes for
the host-side models, so there is a single definition of each format.
"""

from amaranth.hdl import Shape
from amaranth.lib import data, enum

__all__ = [
    "WrOpcode", "WcOpcode", "WcStatus", "BthOpcode", "AethSyndrome", "Access", "QpState",
    "WQE", "RECV_WQE", "CQE", "DOORBELL", "MR_ENTRY", "PKT_META",
    "WQE_BYTES", "RECV_WQE_BYTES", "CQE_BYTES",
    "WQE_FLAG_SIGNALED", "WQE_FLAG_FENCE", "WQE_FLAG_SOLICITED",
    "CQE_FLAG_IMM", "CQE_FLAG_OWNER",
    "HEADER_BYTES", "ETH_IP_UDP_BYTES", "ROCE_UDP_PORT",
    "headers_of", "pack", "unpack",
    "TlpKind", "CplKind", "TlpStatus", "TLP_DOWN_HDR", "TLP_UP_HDR", "WRSP_SIDE", "tlp_words", "tlp_dwords", "tlp_cost",
]


class WrOpcode(enum.Enum, shape=8):
    """Work-request opcode in a send WQE (values of libibverbs ``ibv_wr_opcode``)."""
    RDMA_WRITE = 0
    RDMA_WRITE_WITH_IMM = 1
    SEND = 2
    SEND_WITH_IMM = 3
    RDMA_READ = 4
    ATOMIC_CMP_AND_SWP = 5
    ATOMIC_FETCH_AND_ADD = 6


class WcOpcode(enum.Enum, shape=8):
    """Completion opcode in a CQE (values of libibverbs ``ibv_wc_opcode``)."""
    SEND = 0
    RDMA_WRITE = 1
    RDMA_READ = 2
    COMP_SWAP = 3
    FETCH_ADD = 4
    RECV = 128
    RECV_RDMA_WITH_IMM = 129


class WcStatus(enum.Enum, shape=8):
    """Completion status (values of libibverbs ``ibv_wc_status``)."""
    SUCCESS = 0
    LOC_LEN_ERR = 1
    LOC_QP_OP_ERR = 2
    LOC_EEC_OP_ERR = 3
    LOC_PROT_ERR = 4
    WR_FLUSH_ERR = 5
    MW_BIND_ERR = 6
    BAD_RESP_ERR = 7
    LOC_ACCESS_ERR = 8
    REM_INV_REQ_ERR = 9
    REM_ACCESS_ERR = 10
    REM_OP_ERR = 11
    RETRY_EXC_ERR = 12
    RNR_RETRY_EXC_ERR = 13
    LOC_RDD_VIOL_ERR = 14
    REM_INV_RD_REQ_ERR = 15
    REM_ABORT_ERR = 16
    INV_EECN_ERR = 17
    INV_EEC_STATE_ERR = 18
    FATAL_ERR = 19
    RESP_TIMEOUT_ERR = 20
    GENERAL_ERR = 21


class BthOpcode(enum.Enum, shape=8):
    """Base Transport Header opcodes of the Reliable Connection service (IBA 9.2, table 38)."""
    SEND_FIRST = 0x00
    SEND_MIDDLE = 0x01
    SEND_LAST = 0x02
    SEND_LAST_IMM = 0x03
    SEND_ONLY = 0x04
    SEND_ONLY_IMM = 0x05
    WRITE_FIRST = 0x06
    WRITE_MIDDLE = 0x07
    WRITE_LAST = 0x08
    WRITE_LAST_IMM = 0x09
    WRITE_ONLY = 0x0A
    WRITE_ONLY_IMM = 0x0B
    READ_REQUEST = 0x0C
    READ_RESPONSE_FIRST = 0x0D
    READ_RESPONSE_MIDDLE = 0x0E
    READ_RESPONSE_LAST = 0x0F
    READ_RESPONSE_ONLY = 0x10
    ACKNOWLEDGE = 0x11
    ATOMIC_ACKNOWLEDGE = 0x12
    COMPARE_SWAP = 0x13
    FETCH_ADD = 0x14


class AethSyndrome(enum.Enum, shape=8):
    """AETH syndrome byte (IBA 9.7.5.1.1): bits 6:5 select ACK / RNR NAK / NAK."""
    ACK = 0x1F                 # ACK, credit field 0b11111 = "invalid / unlimited"
    RNR_NAK = 0x20             # | 5-bit RNR timer code
    NAK_PSN_SEQ_ERR = 0x60
    NAK_INV_REQ = 0x61
    NAK_REM_ACCESS_ERR = 0x62
    NAK_REM_OP_ERR = 0x63
    NAK_INV_RD_REQ = 0x64


class Access(enum.Flag, shape=8):
    """Memory-region access rights (values of libibverbs ``ibv_access_flags``)."""
    LOCAL_WRITE = 1
    REMOTE_WRITE = 2
    REMOTE_READ = 4
    REMOTE_ATOMIC = 8


class QpState(enum.Enum, shape=3):
    """Queue-pair states (IBA 10.3.1); SQD and SQE are not modelled."""
    RESET = 0
    INIT = 1
    RTR = 2
    RTS = 3
    ERR = 6


# ---------------------------------------------------------------------------------------
# Host-visible structures

WQE_FLAG_SIGNALED = 1 << 0
WQE_FLAG_FENCE = 1 << 1
WQE_FLAG_SOLICITED = 1 << 2

#: Send work-queue element, 64 bytes, in the host send queue.
WQE = data.StructLayout({
    "opcode": 8,          # byte 0: WrOpcode
    "flags": 8,           # byte 1: WQE_FLAG_*
    "index": 16,          # bytes 2-3: the WQE's index in the send queue (free running): a
                          # BlueFlame write names its slot (mlx5's wqe_index)
    "imm": 32,            # bytes 4-7: immediate data (host order)
    "wr_id": 64,          # bytes 8-15
    "local_addr": 64,     # bytes 16-23
    "length": 32,         # bytes 24-27
    "lkey": 32,           # bytes 28-31
    "remote_addr": 64,    # bytes 32-39
    "rkey": 32,           # bytes 40-43
    "qpn": 24,            # bytes 44-46: the QP (a BlueFlame write names its QP)
    "rsvd1": 8,           # byte 47
    "compare_add": 64,    # bytes 48-55: CAS compare value, or FAA addend
    "swap": 64,           # bytes 56-63: CAS swap value
})
WQE_BYTES = 64

#: Receive work-queue element, 32 bytes, in the host receive queue (one scatter entry).
RECV_WQE = data.StructLayout({
    "wr_id": 64,          # bytes 0-7
    "addr": 64,           # bytes 8-15
    "length": 32,         # bytes 16-19
    "lkey": 32,           # bytes 20-23
    "rsvd": 64,           # bytes 24-31
})
RECV_WQE_BYTES = 32

CQE_FLAG_IMM = 1 << 0
CQE_FLAG_OWNER = 1 << 7

#: Completion-queue entry, 32 bytes. The owner bit (byte 31, bit 7) equals the pass
#: number of the ring modulo 2 (first pass 1), so a consumer recognises new entries.
CQE = data.StructLayout({
    "wr_id": 64,          # bytes 0-7
    "status": 8,          # byte 8: WcStatus
    "opcode": 8,          # byte 9: WcOpcode
    "vendor_err": 8,      # byte 10: model-specific detail of an error
    "rsvd0": 8,           # byte 11
    "byte_len": 32,       # bytes 12-15
    "imm": 32,            # bytes 16-19
    "qpn": 24,            # bytes 20-22
    "rsvd1": 8,           # byte 23
    "src_qpn": 24,        # bytes 24-26
    "rsvd2": 32,          # bytes 27-30
    "flags": 8,           # byte 31: CQE_FLAG_*
})
CQE_BYTES = 32

#: The 64-bit word written to a doorbell register (MMIO).
DOORBELL = data.StructLayout({
    "qpn": 24,            # bits 23:0, queue pair
    "rsvd": 8,
    "pi": 16,             # bits 47:32, new send-queue producer index (free running)
    "rsvd1": 16,
})

#: Memory-region table entry, as programmed by the driver.
MR_ENTRY = data.StructLayout({
    "base": 64,
    "length": 64,
    "key": 32,
    "pd": 16,
    "access": 8,          # Access
    "valid": 1,
    "rsvd": 7,
})

# ---------------------------------------------------------------------------------------
# Packets

ROCE_UDP_PORT = 4791
ETH_IP_UDP_BYTES = 14 + 20 + 8

#: Header fields of one RoCEv2 packet as they travel inside the NIC beside the payload.
#: The packetizer emits only the extension headers that the opcode carries (headers_of).
PKT_META = data.StructLayout({
    "opcode": 8,          # BthOpcode
    "src_node": 8,        # MAC 02:00:00:00:00:<node>, IPv4 192.0.2.<node+1>
    "dst_node": 8,
    "se": 1,
    "ackreq": 1,
    "dest_qpn": 24,
    "psn": 24,
    "udp_sport": 16,
    # RETH (16 B) or AtomicETH (28 B): virtual address and key are shared
    "va": 64,
    "rkey": 32,
    "dma_len": 32,        # RETH only
    "swap_add": 64,       # AtomicETH only
    "compare": 64,        # AtomicETH only
    # AETH (4 B)
    "syndrome": 8,
    "msn": 24,
    # AtomicAckETH (8 B)
    "orig": 64,
    # ImmDt (4 B)
    "imm": 32,
    # payload bytes that follow the headers (excluding pad and ICRC)
    "paylen": 16,
})

_RETH, _ATOMIC, _AETH, _ATOMICACK, _IMM = "reth", "atomiceth", "aeth", "atomicacketh", "immdt"
HEADER_BYTES = {"bth": 12, _RETH: 16, _ATOMIC: 28, _AETH: 4, _ATOMICACK: 8, _IMM: 4}

_EXT = {
    BthOpcode.SEND_FIRST: (), BthOpcode.SEND_MIDDLE: (), BthOpcode.SEND_LAST: (),
    BthOpcode.SEND_LAST_IMM: (_IMM,), BthOpcode.SEND_ONLY: (),
    BthOpcode.SEND_ONLY_IMM: (_IMM,),
    BthOpcode.WRITE_FIRST: (_RETH,), BthOpcode.WRITE_MIDDLE: (), BthOpcode.WRITE_LAST: (),
    BthOpcode.WRITE_LAST_IMM: (_IMM,), BthOpcode.WRITE_ONLY: (_RETH,),
    BthOpcode.WRITE_ONLY_IMM: (_RETH, _IMM),
    BthOpcode.READ_REQUEST: (_RETH,),
    BthOpcode.READ_RESPONSE_FIRST: (_AETH,), BthOpcode.READ_RESPONSE_MIDDLE: (),
    BthOpcode.READ_RESPONSE_LAST: (_AETH,), BthOpcode.READ_RESPONSE_ONLY: (_AETH,),
    BthOpcode.ACKNOWLEDGE: (_AETH,),
    BthOpcode.ATOMIC_ACKNOWLEDGE: (_AETH, _ATOMICACK),
    BthOpcode.COMPARE_SWAP: (_ATOMIC,), BthOpcode.FETCH_ADD: (_ATOMIC,),
}


def headers_of(opcode):
    """Extension headers, in wire order, that follow the BTH for a BTH opcode."""
    return _EXT[BthOpcode(opcode)]


def header_bytes(opcode):
    """Bytes from the start of the Ethernet frame to the first payload byte."""
    return ETH_IP_UDP_BYTES + HEADER_BYTES["bth"] + sum(HEADER_BYTES[h] for h in headers_of(opcode))


# ---------------------------------------------------------------------------------------
# Python helpers for host-side models: the same layouts as bytes.

_FIELDS = {}


def _fields(layout):
    """``{name: (offset, width)}`` of a layout (computed once per layout object)."""
    hit = _FIELDS.get(id(layout))
    if hit is None or hit[0] is not layout:
        hit = (layout, {name: (f.offset, Shape.cast(f.shape).width) for name, f in layout},
               (layout.size + 7) // 8)
        _FIELDS[id(layout)] = hit
    return hit[1], hit[2]


def pack(layout, **fields):
    """Bytes (little-endian, as stored in host memory) of a layout with the given fields.

    Unknown field names and values that do not fit raise ``ValueError``.
    """
    known, nbytes = _fields(layout)
    value = 0
    for name, val in fields.items():
        try:
            offset, width = known[name]
        except KeyError:
            raise ValueError(f"{name!r} is not a field; fields are {list(known)}") from None
        val = int(val.value if hasattr(val, "value") else val)
        if not 0 <= val < (1 << width):
            raise ValueError(f"{name} must be in [0, {(1 << width) - 1}], not {val}")
        value |= val << offset
    return value.to_bytes(nbytes, "little")


def unpack(layout, raw):
    """Dict of field name to integer from the bytes of a layout."""
    value = int.from_bytes(bytes(raw), "little")
    return {name: (value >> off) & ((1 << width) - 1)
            for name, (off, width) in _fields(layout)[0].items()}


# ---------------------------------------------------------------------------------------
# Host interface: transaction-layer packets between the NIC and host memory (PCIe-like)
#
# The NIC's host port carries two ordered streams of TLPs (docs/host-interface.md), modelled
# on PCIe (PCI Express Base Specification 4.0, chapter 2 "Transaction Layer"): *down*
# (NIC -> host: memory reads MRd and memory writes MWr) and *up* (host -> NIC: read
# completions CplD, and write responses, which PCIe has not but AXI's B channel has, so that
# a failed write can reach the engine that issued it). Each TLP is a run of beats of W
# bytes; the header travels on the first beat. Data words are whole, aligned host words:
# word i of a TLP covering [a, a + n) holds host bytes [(a & ~(W-1)) + i*W, ... + W).

class TlpKind(enum.Enum, shape=1):
    """Kind of a down TLP (NIC -> host)."""
    MRD = 0           # memory read request, header only
    MWR = 1           # memory write, header + data words


class CplKind(enum.Enum, shape=1):
    """Kind of an up TLP (host -> NIC)."""
    CPLD = 0          # read completion (data words, or none with an error status)
    WRRSP = 1         # write response, header only


class TlpStatus(enum.Enum, shape=2):
    """Completion / write-response status (PCIe completion status codes)."""
    SC = 0            # successful completion
    UR = 1            # unsupported request: no memory at that address
    CA = 2            # completer abort: the host refused the request (e.g. a fault)


#: Header of a down TLP. ``len`` is the byte count (1..4096); for MWr the data words cover
#: [addr, addr + len), bytes outside it are not written (byte enables, derived from addr
#: and len as PCIe's first/last DW byte enables are). ``tag`` names a read (its completions
#: carry it) or numbers a write (its response carries it).
TLP_DOWN_HDR = data.StructLayout({
    "kind": TlpKind,
    "tag": 8,
    "addr": 64,
    "len": 13,
    "th": 1,      # an MWr the host signals when it is in memory (the CQE writes: the host's
                  # event line; in the spirit of PCIe's TLP processing hint, TH)
})

#: Header of an up TLP. A read's completions come in address order and together carry its
#: ``len`` bytes: each one the bytes [lo, lo + len) of the request (``lo`` like PCIe's lower
#: address, relative to the request's address), ending on a read-completion-boundary
#: aligned host address unless it is the last (``last``). An error status ends the request
#: (``last`` set, no data). A write response names the write's ``tag``. ``dw`` is the
#: payload in double words that a PCIe completion would carry for those bytes.
TLP_UP_HDR = data.StructLayout({
    "kind": CplKind,
    "tag": 8,
    "status": TlpStatus,
    "lo": 12,
    "len": 13,
    "dw": 11,          # payload length in double words (PCIe's Length field): the link cost
    "last": 1,
})

#: A write response riding beside a completion beat (the model's write responses stand for
#: AXI's B channel, a channel of their own: PCIe's posted writes have none). Valid only on a
#: completion's beats; a write response with no completion to ride on is a beat of its own
#: (``kind`` WRRSP). Either way it costs no link time (:func:`hw.dma.tlp.up_cost`) and, since
#: this field, no beat of the up stream while completions flow.
WRSP_SIDE = data.StructLayout({"valid": 1, "tag": 8, "status": TlpStatus})


def tlp_words(addr, length, data_bytes):
    """Aligned data words that cover the host bytes [addr, addr + length)."""
    if length <= 0:
        return 0
    return ((addr % data_bytes) + length + data_bytes - 1) // data_bytes


def tlp_dwords(addr, length):
    """Double words a PCIe TLP carries for the bytes [addr, addr + length)."""
    return 0 if length <= 0 else ((addr % 4) + length + 3) // 4


def tlp_cost(dwords, overhead):
    """Bytes a TLP occupies on the link: header and framing (``overhead``) plus its payload
    in double words (a read request and a write response carry none)."""
    return overhead + 4 * dwords
