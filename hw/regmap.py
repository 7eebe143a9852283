"""The RNIC's MMIO register map and its command interface (the driver's view).

The NIC exposes 64-bit registers at byte addresses (see :class:`~hw.interfaces.MmioSignature`).
Configuration goes through a small command interface modelled on the mlx5 command queue:
the driver writes up to eight argument words, then writes ``CMD`` with an opcode and an
index; the command takes effect in one cycle and ``CMD`` reads back its status.

====================  =======  ==============================================================
address               access   meaning
====================  =======  ==============================================================
0x0000 ``ID``         R        ``0x52_4E_49_43_0001`` ("RNIC", version 1)
0x0008 ``NODE_ID``    R/W      this NIC's node number (MAC/IP in packets)
0x0010 ``CMD``        R/W      write: bits 7:0 opcode, bits 31:16 index; read: last status
0x0040 + 8*i          W        ``ARG[i]``, i = 0..7 (256 bits of arguments, ARG0 lowest)
0x0100 + 8*i          R        performance counter *i* (see :class:`Counter`)
0x1000 + 8*r          W        send doorbell register *r* (a :data:`~hw.formats.DOORBELL` word)
0x2000 ``RQ_DB``      W        receive doorbell: bits 23:0 QPN, bits 47:32 new RQ producer index
0x2008 ``CQ_DB``      W        CQ consumer index: bits 23:0 CQN, bits 47:32 consumer index
0x2010 ``ASYNC_EVENT`` R       oldest asynchronous event, removed by the read: bit 63 valid,
                               bits 27:24 type (:class:`~hw.interfaces.AsyncEventType`), bits
                               23:0 the CQN or QPN it concerns; 0 when there is none
0x8000 + 64*r         W (64 B) BlueFlame register *r*: a 64-byte write-combined write of a
                               whole WQE (mlx5 BlueFlame, docs/host-interface.md)
====================  =======  ==============================================================

Every MMIO write is 8 bytes except the 64-byte BlueFlame writes; reads are 8 bytes. The
host side of the MMIO path may be back-pressured by the NIC (``hw/rnic/mmio.py``).

The space is cut into the windows of :func:`register_map`, one per block; one decoder
(``hw/lib/csr.py``) gives each block its window with window-relative addresses. An access
outside every window is ignored (reads 0) and counted (``MMIO_UNMAPPED``).
"""

from amaranth.lib import data, enum

from .formats import MR_ENTRY

__all__ = ["Reg", "Cmd", "CmdStatus", "Counter", "QP_CTX", "CQ_CTX",
           "ID_VALUE", "ARG_WORDS", "DOORBELL_BASE", "COUNTER_BASE", "ARG_BASE",
           "BLUEFLAME_BASE", "BLUEFLAME_BYTES", "DMA_READ_CLIENTS", "DMA_WRITE_CLIENTS",
           "LEGAL_TRANSITIONS", "mkey_index", "IcmTable", "MR_ICM_ENTRY_BYTES",
           "CQ_ICM_ENTRY_BYTES", "QP_ICM_ENTRY_BYTES",
           "MMIO_ADDR_WIDTH", "CONTROL_BYTES", "register_map"]

ID_VALUE = 0x524E_4943_0001
ARG_BASE = 0x0040
ARG_WORDS = 8
COUNTER_BASE = 0x0100
DOORBELL_BASE = 0x1000
BLUEFLAME_BASE = 0x8000
BLUEFLAME_BYTES = 64
#: Address bits of the NIC's MMIO space (64 KB: the BlueFlame window ends at 0x10000 with the
#: most doorbell registers, 512)
MMIO_ADDR_WIDTH = 16
#: Bytes of the control window (ID, NODE_ID, CMD, ARG0..7)
CONTROL_BYTES = 0x100


class Reg(enum.IntEnum):
    ID = 0x0000
    NODE_ID = 0x0008
    CMD = 0x0010
    RQ_DB = 0x2000
    CQ_DB = 0x2008
    ASYNC_EVENT = 0x2010


class Cmd(enum.IntEnum):
    """Command opcodes; the arguments are the bits of the named layout, ARG0 lowest."""
    NOP = 0
    SET_QP = 1       # index QPN, args QP_CTX; only while the QP is in RESET (else BAD_STATE)
    MODIFY_QP = 2    # index QPN, ARG0 bits 2:0 new QpState, ARG1 bits 23:0 sq_psn, 47:24 rq_psn
    SET_CQ = 3       # index CQN, args CQ_CTX; into the CQ-context cache (BUSY until taken)
    SET_MR = 4       # index MR slot, args MR_ENTRY (the key's bits 15:8 must equal the slot)
    BIND_DB = 5      # index QPN, ARG0 doorbell register number
    MAP_ICM = 6      # index IcmTable, ARG0 host address of the table (4 KB aligned); once


#: Bytes per MR entry in ICM (MR_ENTRY, 24 bytes, zero-padded to a power of two).
MR_ICM_ENTRY_BYTES = 32
#: Bytes per CQ context in ICM (CQ_CTX, 9 bytes, zero-padded).
CQ_ICM_ENTRY_BYTES = 32
#: Bytes per QP context in ICM (QP_CTX, 235 bits, zero-padded).
QP_ICM_ENTRY_BYTES = 32


class IcmTable(enum.IntEnum):
    """Context tables the NIC keeps in host memory (ICM), the index of ``MAP_ICM``."""
    MR = 0           # n_mrs entries of MR_ICM_ENTRY_BYTES (32): MR_ENTRY, zero-padded
    CQ = 1           # n_cqs entries of CQ_ICM_ENTRY_BYTES (32): CQ_CTX, zero-padded
    QP = 2           # n_qps entries of QP_ICM_ENTRY_BYTES (32): QP_CTX, zero-padded


class CmdStatus(enum.IntEnum):
    """What ``CMD`` reads back after a command (docs/formats.md, "Command interface and status").

    ``BUSY`` is the only transient status: the command is still in progress and the driver
    reads ``CMD`` again (``SET_MR`` / ``SET_CQ`` until the MR / CQ-context cache has taken
    the entry; the other
    commands take effect in one cycle). Every other non-OK
    status is a permanent refusal that changed nothing: the driver raises at once. The split
    follows mlx5's command statuses, where "resource busy" (``MLX5_CMD_STAT_RES_BUSY``) and
    "bad resource state" (``MLX5_CMD_STAT_BAD_RES_STATE_ERR``) are distinct
    (include/linux/mlx5/device.h).
    """
    OK = 0
    BAD_INDEX = 1        # index out of range (QPN >= n_qps, CQN >= n_cqs, slot >= n_mrs)
    BAD_TRANSITION = 2   # MODIFY_QP: (current, new) state pair not in LEGAL_TRANSITIONS
    BAD_VALUE = 3        # an argument out of range (sizes, CQ numbers, key bits, state value)
    BAD_OPCODE = 4       # no such command
    BUSY = 5             # command in progress: read CMD again (SET_MR / SET_CQ until the
                         # MR / CQ-context cache has taken the entry)
    BAD_STATE = 6        # the object is not in a state that allows this command (SET_QP
                         # on a QP that is not in RESET)


#: Legal modify-QP transitions (IBA 10.3.1, figure 125, RC without SQD/SQE):
#: RESET->INIT, INIT->INIT, INIT->RTR, RTR->RTS, RTS->RTS, any->ERR, any->RESET.
#: The RTL is generated from this table; tests/hw/test_context.py checks the RTL against
#: an oracle of its own (and compares that with Linux's qp_state_table).
LEGAL_TRANSITIONS = {
    ("RESET", "INIT"), ("INIT", "INIT"), ("INIT", "RTR"), ("RTR", "RTS"), ("RTS", "RTS"),
    *((s, "ERR") for s in ("RESET", "INIT", "RTR", "RTS", "ERR")),
    *((s, "RESET") for s in ("RESET", "INIT", "RTR", "RTS", "ERR")),
}


class Counter(enum.IntEnum):
    """Performance counters, each 64 bits at COUNTER_BASE + 8 * value."""
    TX_PACKETS = 0
    RX_PACKETS = 1
    TX_BYTES = 2
    RX_BYTES = 3
    DMA_READS = 4
    DMA_READ_BYTES = 5
    DMA_WRITES = 6
    DMA_WRITE_BYTES = 7
    OPS_WRITE = 8          # request messages sent, by kind
    OPS_READ = 9
    OPS_SEND = 10
    OPS_CAS = 11
    OPS_FAA = 12
    NAKS_SENT = 13
    NAKS_RECEIVED = 14
    RX_DROP_ICRC = 15      # frames dropped because the ICRC did not match
    RX_DROP_MALFORMED = 16 # frames the depacketizer dropped as malformed (bad length, ...)
    DOORBELLS = 17
    DOORBELL_REJECTS = 18  # doorbell rings for a QP not bound to that register, and send
                           # doorbells beyond the ring (overflow: the QP goes to ERR)
    CQES = 19
    WQE_FETCHES = 20       # WQEs taken for sending: read by DMA or from BlueFlame
    RESP_QUEUE_FULL = 21   # cycles the responder waited for room in its response queue
    DUPLICATES = 22        # duplicate request packets answered without a second effect
    SEQ_DROPS = 23         # out-of-sequence requests dropped silently (NAK already sent)
    ATOMIC_REPLAYS = 24    # duplicate atomics answered from the replay cache
    ACKS_COALESCED = 25    # queued ACKs replaced by a newer ACK of the same QP
    ACK_TIMEOUTS = 26      # requester local ACK timer expirations
    RETRANSMITS = 27       # go-back-N rewinds (timeout, PSN sequence NAK, RNR, lost response)
    RNR_NAKS_RECEIVED = 28
    RETRY_EXCEEDED = 29    # QPs moved to ERR by retry_cnt / rnr_retry exhaustion
    RESP_DROPS = 30        # responses the requester dropped (no matching outstanding request)
    RX_DROP_QP = 31        # request packets for an unknown QP or a QP not in RTR/RTS, dropped
    # host interface (docs/host-interface.md); bytes include each TLP's header and framing
    HIF_DOWN_BYTES = 32    # NIC -> host: read requests and writes
    HIF_UP_BYTES = 33      # host -> NIC: read completions
    HIF_READ_REQS = 34     # MRd TLPs
    HIF_WRITE_TLPS = 35    # MWr TLPs
    HIF_COMPLETIONS = 36   # CplD TLPs
    HIF_ERRORS = 37        # completions / write responses with an error status
    HIF_BAD = 38           # up TLPs that matched nothing (dropped)
    MMIO_WRITES = 39
    MMIO_WRITE_BYTES = 40  # with TLP overhead (64 + overhead for a BlueFlame write)
    MMIO_READS = 41
    BLUEFLAME_WQES = 42    # WQEs taken from a BlueFlame write (no WQE fetch)
    BLUEFLAME_MISSES = 43  # BlueFlame WQEs not used (the QP was behind): fetched by DMA
    DMA_ERRORS = 44        # host-interface errors that ended a work request or a response
    CQE_DROPS = 45         # completions dropped: their CQ was full or in error
    ASYNC_EVENTS = 46      # asynchronous events raised
    # per DMA client (DMA_READ_CLIENTS, DMA_WRITE_CLIENTS): requests and bytes asked for
    RD_WQE_REQS = 47
    RD_WQE_BYTES = 48
    RD_PAYLOAD_REQS = 49
    RD_PAYLOAD_BYTES = 50
    RD_RESP_DATA_REQS = 51
    RD_RESP_DATA_BYTES = 52
    RD_RECV_WQE_REQS = 53
    RD_RECV_WQE_BYTES = 54
    RD_ATOMIC_REQS = 55
    RD_ATOMIC_BYTES = 56
    WR_REQ_DATA_REQS = 57
    WR_REQ_DATA_BYTES = 58
    WR_RESP_DATA_REQS = 59
    WR_RESP_DATA_BYTES = 60
    WR_ATOMIC_REQS = 61
    WR_ATOMIC_BYTES = 62
    WR_CQE_REQS = 63
    WR_CQE_BYTES = 64
    RD_ICM_REQS = 65       # context tables in host memory: cache fills ...
    RD_ICM_BYTES = 66
    WR_ICM_REQS = 67       # ... and write-backs
    WR_ICM_BYTES = 68
    MR_CACHE_HITS = 69     # MR cache (hw/ctx/mr_cache.py): lookups and SET_MR writes that hit
    MR_CACHE_MISSES = 70
    MR_CACHE_EVICTIONS = 71
    MR_CACHE_WRITEBACKS = 72
    RD_WQE_REREAD_REQS = 73   # the WQE cache reading a WQE again (a lookup missed) ...
    RD_WQE_REREAD_BYTES = 74
    WQE_CACHE_HITS = 75       # ... its lookups (response handling, flush): hits, misses
    WQE_CACHE_MISSES = 76
    WQE_CACHE_EVICTIONS = 77
    MMIO_UNMAPPED = 78        # register accesses outside every window (ignored, read 0)
    RQ_WQE_PREFETCHES = 79    # receive WQEs read ahead of use (hw/ctx/rq_prefetch.py) ...
    RQ_WQE_DEMAND_READS = 80  # ... read when the responder asked for them (not held)
    RQ_WQE_WAIT_CYCLES = 81   # cycles the responder waited for a receive WQE
    CQ_CACHE_HITS = 82        # CQ-context cache (hw/ctx/cq_cache.py): lookups and SET_CQ
    CQ_CACHE_MISSES = 83      # writes that hit, missed; evictions, write-backs of dirty
    CQ_CACHE_EVICTIONS = 84   # entries (the ICM traffic is in RD_ICM_* / WR_ICM_*, shared
    CQ_CACHE_WRITEBACKS = 85  # with the MR cache)
    QP_CACHE_HITS = 86        # QP-context cache (hw/ctx/qp_cache.py): lookups (requester's
    QP_CACHE_MISSES = 87      # fetch issue and flushes, responder) and SET_QP writes that
    QP_CACHE_EVICTIONS = 88   # hit, missed; evictions, write-backs of dirty entries
    QP_CACHE_WRITEBACKS = 89
    # occupancy: cycles a serial engine was not idle (processing, or waiting for a lookup,
    # a DMA or room downstream); with n_pus units the requester's are the units' sum. The
    # engine whose count nears the measured cycles is the bound (docs/performance.md)
    BUSY_REQ_SEND = 90        # requester send engine (hw/rnic/requester.py FSM "send")
    BUSY_REQ_RESP = 91        # requester response engine (FSM "resp")
    BUSY_RSP = 92             # responder (hw/rnic/responder.py FSM "rsp")
    BUSY_CQE = 93             # completion engine (hw/rnic/completion.py)
    BUSY_QP_CACHE = 94        # the context caches' state machines (hw/lib/cache.py)
    BUSY_MR_CACHE = 95
    BUSY_CQ_CACHE = 96
    TX_BEATS = 97             # cycles a data beat left / entered the node on the link port
    RX_BEATS = 98
    # where the requester's send engines wait (part of BUSY_REQ_SEND; the units' sum)
    WAIT_SEND_WQE = 99        # for the next WQE of the batch being sent (its fetch)
    WAIT_SEND_MR = 100        # for the MR entry of the WQE's lkey (the MR cache)
    WAIT_SEND_TX = 101        # to hand a request header on (the packet emitter is full)
    # back-pressure on the frame path: cycles a beat was offered and not taken, at the
    # requester's and the responder's transmit ports (the arbiter in front of the
    # packetizer), the node's link ports, and the receive demultiplexer's two outputs
    STALL_REQ_TX = 102
    STALL_RSP_TX = 103
    STALL_TX = 104
    STALL_RX = 105
    STALL_REQ_RX = 106
    STALL_RSP_RX = 107
    WAIT_SEND_PAY = 108       # send engines: to have a payload read taken (buffer room, DMA port)
    # queue occupancy, added every cycle (over the cycles counted, the average length; with
    # the rate through it, Little's law gives the average wait): QPs in the requester's ready
    # queues, WQE batches in flight (fetch issued, batch not yet sent) and READ / atomic
    # requests outstanding (the sum of every QP's count), over all processing units
    Q_REQ_READY = 109
    Q_REQ_FETCH = 110
    Q_REQ_RD_OUT = 111
    # DMA reads in flight (PCIe tags in use), DMA writes waiting for their response, and
    # the responder's response queue (responses queued in request order, not yet sent)
    Q_HIF_READS = 112
    Q_HIF_WRITES = 113
    Q_RSP_QUEUE = 114


def register_map(n_doorbells):
    """The NIC's MMIO register map (hw/lib/csr.py): one window per block behind the bus
    decoder of hw/rnic/node.py. Windows may not overlap (``RegisterMap.add`` raises
    ``ValueError``); ``n_doorbells`` sizes the doorbell and BlueFlame windows."""
    from .lib.csr import RegisterMap      # here: hw.lib.csr imports hw.interfaces, which imports this
    rm = RegisterMap(MMIO_ADDR_WIDTH)
    rm.add("control", Reg.ID, CONTROL_BYTES,
           "`ID`, `NODE_ID`, `CMD`, `ARG0..7` (the command interface, `hw/rnic/context.py`)")
    rm.add("counters", COUNTER_BASE, 8 * len(Counter),
           "performance counters, read only (`hw/rnic/counters.py`, `Counter`)")
    rm.add("doorbells", DOORBELL_BASE, 8 * n_doorbells,
           "send doorbell register *r* at `0x1000 + 8 r` (`hw/rnic/doorbell.py`)")
    rm.add("queue_doorbells", Reg.RQ_DB, 16,
           "`RQ_DB` (receive doorbell) and `CQ_DB` (CQ consumer index) (`hw/rnic/doorbell.py`)")
    rm.add("events", Reg.ASYNC_EVENT, 8,
           "`ASYNC_EVENT`: the oldest asynchronous event, removed by the read (`hw/rnic/events.py`)")
    rm.add("blueflame", BLUEFLAME_BASE, BLUEFLAME_BYTES * n_doorbells,
           "BlueFlame registers, 64-byte writes of a whole WQE; taken by the MMIO front end "
           "before the bus (`hw/rnic/mmio.py`)", external=True)
    return rm


#: The NIC's DMA clients, in port order (hw/rnic/node.py), with their counter names.
DMA_READ_CLIENTS = ("WQE", "PAYLOAD", "RESP_DATA", "RECV_WQE", "ATOMIC", "ICM", "WQE_REREAD")
DMA_WRITE_CLIENTS = ("REQ_DATA", "RESP_DATA", "ATOMIC", "CQE", "ICM")


#: Static part of a queue pair's context, set by SET_QP (ARG0 holds bits 63:0).
QP_CTX = data.StructLayout({
    "sq_base": 64,         # host address of the send queue (WQE_BYTES per entry)
    "rq_base": 64,         # host address of the receive queue (RECV_WQE_BYTES per entry)
    "sq_log_size": 5,      # send queue holds 2**sq_log_size WQEs
    "rq_log_size": 5,
    "send_cq": 10,         # CQ for send-side completions
    "recv_cq": 10,         # CQ for receive-side completions
    "pd": 16,              # protection domain
    "dest_qpn": 24,        # remote QP
    "dest_node": 8,        # remote node
    "access": 8,           # remote access this QP grants (Access flags)
    "max_rd_atomic": 5,    # outstanding READ/atomic limit, 1..16
    "timeout": 5,          # local ACK timeout 4.096 us * 2**timeout (0: infinite), IBA 9.7.6.1.3
    "retry_cnt": 3,        # retransmissions after timeout / PSN sequence NAK, 0..7
    "rnr_retry": 3,        # retransmissions after RNR NAK, 0..6, 7 = infinite
    "min_rnr_timer": 5,    # RNR NAK timer code this QP's responder sends (IBA table 45)
})

#: Completion queue context, set by SET_CQ.
CQ_CTX = data.StructLayout({
    "base": 64,            # host address of the CQE ring (CQE_BYTES per entry)
    "log_size": 5,
})

assert MR_ENTRY.size <= 64 * ARG_WORDS and QP_CTX.size <= 64 * ARG_WORDS


def mkey_index(key, n_mrs):
    """MR table slot named by an lkey/rkey: bits 15:8 of the key (bits 7:0 are a tag)."""
    return (key >> 8) & (n_mrs - 1)
