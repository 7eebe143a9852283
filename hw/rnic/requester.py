"""Requester side of the RNIC's reliable-connection transport.

Models the send half of an RC queue pair (InfiniBand Architecture Specification vol. 1
rel. 1.4): work-request processing (11.4), request packet generation with segmentation by
the path MTU (9.7.1, 9.7.2), the requester's ACK/NAK and response handling (9.7.5.1), and
the send-queue completions (10.8, 11.4.2), including the flush of outstanding and posted
work requests when the QP enters the Error state (10.3.1, 11.6.3).

Structure
    * the per-QP state (hw/rnic/req_state.py: one table of fields) is kept here, each field
      a memory indexed by QP, and reached by the engines through typed ports;
    * the send engine (:class:`~hw.rnic.send_engine.SendEngine`, a component of its own;
      "the send FSM" below) serialises the send-side actions: apply a QP event, take a
      doorbell, flush one work request, or send a batch of messages of one QP. It names the
      QP it serves (``cur``), sees its fields (``view``) and writes through each field's "tx"
      port;
    * the response engine (:class:`~hw.rnic.response_engine.ResponseEngine`, a component of
      its own; "the response FSM" below) takes the packets of ``rx`` (ACK/NAK, READ
      responses, atomic acknowledges) one at a time: it writes READ data and atomic results
      to ``dma_wr``, completes the acknowledged messages (``cqe``) and raises ``set_err`` on
      a NAK. It sees the state of the QP it works on (``view``) and reports what happens to
      it (``ev``); this module owns the per-QP memories and applies those writes;
    * combinational blocks of their own: inside the send engine, the local checks of a WQE
      (:class:`~hw.rnic.wqe_check.WqeCheck`) and the header of each request packet
      (:class:`~hw.rnic.request_header.RequestHeader`); inside the response engine, the
      classification of a response (:class:`~hw.rnic.response_check.ResponseCheck`); the
      tracker entry and PSN arithmetic are in hw/rnic/tracker.py;
    * scheduling is event-driven (no logic per QP evaluated every cycle): a ready queue
      (:class:`~hw.lib.ready_queue.ReadyQueue`, each QP queued at most once) holds the QPs
      that may have work. A doorbell, an applied QP event or rewind, a finished batch and
      a completion that frees tracker room or READ/atomic budget *wake* their QP (push its
      number); the fetch issuer takes the oldest, checks that one QP (RTS, posted WQEs not
      yet fetched, room in its tracker, READ/atomic budget left, not waiting on a fence,
      an event, a rewind or an RNR wait, no batch in flight) and fetches it or drops it (a
      later write that lets it issue wakes it again). QP events wait in a second queue in
      the order they came, and the QPs that may need a rewind or a flush in a third (the
      service queue: woken by the writes that can start one, looked at by the send FSM in
      IDLE, queued again while they must wait);
    * a :class:`~hw.rnic.wqe_fetch.WqeFetch` reads up to :data:`WQE_BATCH` consecutive WQEs with one
      DMA read; the engine sends them back to back while the QP may still issue and drops
      (re-fetches later) the rest;
    * up to ``fetch_depth`` such batches (of different QPs, at most one per QP) are fetched
      at once: a fetch issuer takes the ready queue's oldest QP and issues its DMA read whenever the
      send engine is not using the QP lookup, so the fetch round trips of several QPs overlap
      (as in real NICs). The batches are queued in issue order (the DMA read responses come
      back in that order) and the engine takes them one at a time; a batch whose QP may no
      longer issue when its turn comes (ERR, QP event pending, local error, fence) is dropped.
      A QP with a batch in flight is not scheduled again, applies no QP event, and is not
      flushed until the batch is done; a flush fetches its WQEs by itself, when no batch is
      in flight;
    * for every request packet the engine queues its header and requests its payload from
      host memory; the packet emitter (:class:`~hw.rnic.packet_emitter.PacketEmitter`: a
      FIFO of ``desc_depth`` headers, a payload buffer of ``pay_buffers`` MTUs) sends each
      header followed by its payload. The buffer has room reserved for every requested
      byte, so DMA read data is never back-pressured and the payload reads of successive
      packets overlap; a header leaves only once its whole payload is in the buffer (store
      and forward), so a packet on ``tx`` never waits on host memory;
    * a memory of ``n_qps * max_outstanding`` entries holds each QP's in-order list of sent
      messages (:data:`TRACKER_ENTRY`);
    * the lkey of a WQE with a local buffer is looked up on ``mr`` (``CtxLookup``, request /
      response: the MR cache of :mod:`hw.ctx.mr_cache`): asked for in FETCH_WAIT as the WQE
      is taken (the WQE waits until the cache takes the request), awaited in MR_RESP before
      checking it; a lookup that fails (``err``) counts as an invalid key.

Parameters: ``cfg`` (:class:`~hw.config.NicConfig`), ``fetch_depth`` (WQE fetch DMA reads
in flight, of different QPs, in [1, 16]; default ``cfg.fetch_depth``). The batch size,
header FIFO depth and BlueFlame buffer come from ``cfg`` (``wqe_batch``, ``desc_depth``,
``bf_entries``).

Per-QP indices: ``pi`` (posted, from the doorbell), ``fi`` (next WQE to fetch and send) and
``ci`` (oldest not completed); the tracker holds the messages ``ci .. fi-1``. A message enters
the tracker when its WQE has passed the local checks, before its first packet is queued, so
that a response can never arrive for a message the response FSM does not know yet.

Deadlock freedom
----------------
The requester and responder of a node share its ``tx`` (PacketArbiter -> Packetizer -> link)
and its receive path (Depacketizer -> PacketDemux), and the DMA read responses of all clients
come back as one in-order stream. With traffic in both directions, a requester whose response
handling waits for its own ``tx`` closes a loop through the peer (our tx full -> the peer's
receive path full -> the peer's tx full -> our receive path full -> our responses not taken).
The requester breaks it with three rules:

1. **The response path never waits on tx or on the send path.** Responses are handled by
   their own FSM, which takes ``rx.meta`` / ``rx.payload`` whenever it can itself progress. It
   waits only on ``dma_wr`` (the host always drains writes), ``cqe`` (the completion engine
   drains to DMA) and ``set_err`` (the context drains it). It uses no send-side resource: it
   has its own tracker read port, its own CQE register, the completion queue number and
   READ/atomic limit of each QP are kept per QP (written when a message enters
   the tracker), and ``cqe`` / ``set_err`` are shared with the send FSM through sticky
   two-way arbiters (an offer, once made, is held until taken).
2. **The send path may wait on tx and on payload-buffer space freely** (it sits in its
   ``SEND_META`` state until the packet emitter has made room), because nothing in (1)
   waits for it. Payload DMA data always has reserved buffer room (see above), so the send
   path never back-pressures the shared DMA read-response stream; fetched WQEs likewise go
   into the reserved slots of :class:`~hw.rnic.wqe_fetch.WqeFetch` (``WQE_BATCH * fetch_depth``
   slots; a fetch is issued only when its slots are reserved).
3. **Shared per-QP state is updated consistently.** The send FSM owns ``pi``, ``fi``,
   ``tail``, ``npsn``, ``lerr`` and the tracker entries it appends; the response FSM pops
   ``head`` / ``ci`` of the QP it serves. The READ/atomic count ``rd_out`` (+1 when the send
   FSM commits a READ/atomic, -1 when the response FSM completes one) and the fence flag have
   one next-state expression per QP that merges both FSMs' requests of the same cycle. The
   tracker has one write port: the response FSM (status of a NAKed head message) has
   priority and the send FSM retries its write the next cycle. Two interlocks keep the FSMs
   off each other's QP where both would pop or reset: the send FSM neither flushes nor
   applies a QP event to the QP the response FSM is working on (it waits, which is bounded
   by (1)); and the response FSM drops the responses of a QP that is in ERR, has a pending
   QP event, or is about to be flushed (its failed WQE is the oldest), as the send FSM owns
   those QPs (a response for them has nothing left to complete).

A WQE that fails the local checks is put in the tracker with its status (so that
completions stay in order); the QP stops sending, the messages sent before it complete
normally, and when the failed WQE is the oldest the QP goes to ERR (``set_err``). A NAK
writes its status into the message it names and the QP goes to ERR at once. In ERR the
tracker entries, then the posted WQEs (fetched to learn their wr_id), complete one by one:
an entry that failed with its own status, every other with WR_FLUSH_ERR.

Host-interface errors (docs/errors.md)
--------------------------------------
The DMA engine reports a read the host failed (``err`` on the data) and answers every write
(``dma_wr.done``). A batch of WQEs the host could not read: its first WQE completes with
``LOC_QP_OP_ERR`` (its wr_id is unknown: 0) through the local-error path, the rest are
flushed. A payload read that failed: the packet is not sent; the emitter hands its QP,
tracker slot and PSN to the response FSM (``R_PERR``), which marks that message
``LOC_PROT_ERR`` and moves the QP to ERR at once (messages not yet acknowledged are flushed).
Every completion passes a :class:`~hw.lib.write_gate.WriteGate`: it leaves only once the host
has answered the writes the requester made before it (the READ data, the atomic result of
its WR), and if one of its QP's writes failed it leaves as ``LOC_PROT_ERR`` (an unsignaled
READ/atomic passes the gate as a silent completion for this) and the QP is asked to go to
ERR. This costs a completion one write round trip (as an AXI master waiting for its write
response before the completion write); docs/host-interface.md.

Retransmission (IBA 9.7.6, go-back-N)
-------------------------------------
A :class:`~hw.rnic.retry_timer.RetryTimer` keeps each QP's local ACK timer (4.096 us *
2**timeout since the last forward progress while requests are outstanding) and RNR timer.
A rewind of a QP is requested by a PSN sequence NAK (once per retransmission: further NAKs
are ignored until progress is made), by an ACK timeout, by the end of an RNR wait, or by a
READ response packet that skips one or an ACK at or beyond the oldest message when that is
a READ or atomic still waiting for its response (implied NAKs, 9.7.5.1.5). The send FSM applies it like a
QP event, when no batch of the QP is in flight and the response FSM is not working on it:
``fi = ci``, ``tail = head``, ``npsn`` = the oldest message's first PSN, the READ/atomic
count and fence are cleared, and the WQEs are fetched again from the send queue (the host may
not reuse a slot before its completion), so every message keeps its PSNs and the responder
sees what it already executed as duplicates. A rewound READ asks only for the response
packets it does not have yet (PSN, VA and length advanced); a rewound WRITE/SEND starts at
the PSN of the NAK that showed the responder inside it (MIDDLE/LAST packets, payload from
that offset: go-back-N (9.7.6.1.4) resends from the PSN the NAK carries, as Linux
rxe's ``retry_first_write_send`` does). Later NAKs of the same gap are ignored, but one
that shows the responder further inside the head message is taken even while a
retransmission is under way (it is about the retransmitted packets). ``retry_cnt`` counts timeouts and
sequence NAKs without progress, ``rnr_retry`` RNR NAKs (7 = infinite); both are reset by
progress (a completed message, an accepted READ response packet, a NAK that shows the
responder inside a WRITE/SEND). When one is exhausted the oldest message completes with
RETRY_EXC_ERR / RNR_RETRY_EXC_ERR and the QP goes to ERR (and is flushed).

An ACK or NAK whose PSN is beyond the highest PSN the QP has given a message since it got its
send PSN (``hi_psn``) answers nothing it sent (9.7.5.1): it is dropped and counted
(``stat_resp_drop``), so that it can neither complete a message the responder never
executed nor fail one.

A response *for* the oldest outstanding message (its PSN inside the message's) of the wrong
kind (a READ response for a WRITE/SEND or an atomic, an atomic acknowledge for a READ or a
WRITE/SEND), or the expected READ response packet out of sequence (MIDDLE/LAST as the
message's first packet, FIRST/MIDDLE as its last, LAST/ONLY before it) or of the wrong
length (not MTU bytes before the last packet, not the rest in the last) is a bad response
(9.7.5.1.3): the message completes with BAD_RESP_ERR, nothing of it is written, the QP goes
to ERR (counted in ``stat_resp_drop``).

Simplifications: responses that do not match the oldest outstanding message (a PSN outside
it, an earlier READ response packet of it: a duplicate) are dropped (``stat_resp_drop``), and so are
responses for a QP with a resetting or ERR event waiting to be applied (the
event resets or flushes the QP anyway); QP events are applied when the send engine is idle
(packets already queued still leave); an event to RESET, INIT or RTR resets the send
queue's state, one to RTS from RTR loads the send PSN, RTS -> RTS changes nothing and ERR
keeps the queues so that they can be flushed (IBA 10.3.1); the ``state`` field of the QP lookup is not used (the state comes from
the QP events); a fenced WQE that may not start yet is dropped and fetched again when the
QP's READ/atomic requests have completed.
"""

from types import SimpleNamespace

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import memory, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2, exact_log2

from .. import formats, regmap
from ..config import NicConfig
from ..interfaces import (CqeRequest, CtxLookup, DmaReadPort, DmaWritePort,
                         DoorbellEvent, PacketOut, QpErrRequest, QpEvent)
from ..lib.mem_array import MemArray
from .retry_timer import RetryTimer, TICK_NS
from ..lib.ready_queue import ReadyQueue
from .wqe_fetch import WqeFetch
from ..ctx.wqe_cache import WqeCache
from .packet_emitter import PacketEmitter
from .response_engine import ResponseEngine
from .tracker import TRACKER_ENTRY
from .req_state import CUR_FIELDS, TX_FIELDS, req_state_fields
from .send_engine import ISSUE_FIELDS, SendEngine, may_issue
from .completion_gate import CompletionGate
from .fetch_issuer import FetchIssuer
from .bf_buffer import SQ_BF

__all__ = ["Requester", "TRACKER_ENTRY", "WQE_BATCH", "DESC_DEPTH", "requester_ports"]

#: WQEs read from the send queue by one DMA read (and processed back to back): the default
#: of ``NicConfig.wqe_batch`` (the requester uses the configuration's value).
WQE_BATCH = NicConfig.wqe_batch
#: Request packets queued between the send engine and the packet emitter.
DESC_DEPTH = NicConfig.desc_depth
#: WQEs written by BlueFlame kept until they are sent (hw/rnic/bf_buffer.py).
BF_ENTRIES = NicConfig.bf_entries

STATS = ["stat_write", "stat_read", "stat_send", "stat_cas", "stat_faa",
         "stat_nak_rx", "stat_wqe_fetch", "stat_db_reject",
         "stat_timeout", "stat_retransmit", "stat_rnr_rx", "stat_retry_exc", "stat_resp_drop",
         "stat_bf_hit"]
#: every counter output and its largest value in one cycle (None: ``bf_entries``): the
#: STATS, BlueFlame copies dropped, the WQE cache's hits, misses (a re-read) and evictions,
#: and the WRs ended by a host-interface error (a WQE, a payload read, a write, a WQE read
#: again), and the occupancy of the send and response engines (high while not idle), and
#: where the send engine waits (a WQE, an MR entry, room for a request header, its payload
#: read taken), and three occupancies (a value per cycle, its largest a function of the
#: configuration): QPs in the ready queue, WQE batches in flight, and the sum of the QPs'
#: READ/atomic counts
COUNTS = ([(s, 1) for s in STATS]
          + [("stat_bf_miss", None), ("stat_wqe_hit", 1), ("stat_wqe_miss", 1),
             ("stat_wqe_evict", 1), ("stat_dma_err", 4), ("stat_busy_send", 1),
             ("stat_busy_resp", 1), ("stat_wait_wqe", 1), ("stat_wait_mr", 1),
             ("stat_wait_tx", 1), ("stat_wait_pay", 1),
             ("stat_q_ready", lambda cfg: cfg.n_qps), ("stat_q_fetch", lambda cfg: cfg.fetch_depth),
             ("stat_q_rd_out", lambda cfg: cfg.n_qps * cfg.max_rd_atomic)])


def requester_ports(cfg, qpn_bits, mr_bits, units=None):
    """The ports of a requester; with ``units`` (a number) those of
    :class:`~hw.rnic.requester_units.RequesterUnits`, whose context lookups are arrays of one
    per unit and whose counter outputs are the units' sums."""
    W = cfg.data_bytes

    def lookup(width, shape):
        port = Out(CtxLookup(width, shape))
        return port if units is None else port.array(units)

    ports = {
        "db": In(DoorbellEvent()),
        "qp_event": In(QpEvent()),
        # the QP context (request / response): the send engine's (a flush) and the
        # WQE-fetch issue's
        "qpc_tx": lookup(qpn_bits, regmap.QP_CTX),
        "qpc_fetch": lookup(qpn_bits, regmap.QP_CTX),
        "mr": lookup(mr_bits, formats.MR_ENTRY),
        "node_id": In(8),
        "wqe_rd": Out(DmaReadPort(W)),
        "pay_rd": Out(DmaReadPort(W)),
        "reread_rd": Out(DmaReadPort(W)),
        "dma_wr": Out(DmaWritePort(W)),
        "tx": Out(PacketOut(W)),
        "rx": In(PacketOut(W)),
        "set_err": Out(QpErrRequest()),
        "cqe": Out(CqeRequest()),
        "bf": In(stream.Signature(SQ_BF, always_ready=True)),
    }
    for name, most in COUNTS:
        most = cfg.bf_entries if most is None else most(cfg) if callable(most) else most
        ports[name] = Out(range((units or 1) * most + 1))
    return ports


class Requester(wiring.Component):
    def __init__(self, cfg, fetch_depth=None):
        if not isinstance(cfg, NicConfig):
            raise ValueError(f"cfg must be a NicConfig, not {type(cfg).__name__}")
        if fetch_depth is None:
            fetch_depth = cfg.fetch_depth
        if (not isinstance(fetch_depth, int) or isinstance(fetch_depth, bool)
                or not 1 <= fetch_depth <= 16):
            raise ValueError(f"fetch_depth must be an integer in [1, 16], not {fetch_depth!r}")
        self.cfg = cfg
        self.fetch_depth = fetch_depth
        self.qpn_bits = ceil_log2(cfg.n_qps)
        self.mr_bits = ceil_log2(cfg.n_mrs)
        ports = requester_ports(cfg, max(1, self.qpn_bits), max(1, self.mr_bits))
        super().__init__(ports)

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        W = cfg.data_bytes
        nq = cfg.n_qps
        MO = cfg.max_outstanding
        mo_bits = exact_log2(MO)
        K = cfg.wqe_batch

        # ready queue of QPs that may have work (event-driven scheduling): push[0] the
        # response FSM (a completion freed tracker room or READ/atomic budget), push[1] a
        # batch done, push[2] the send FSM (doorbell, QP event applied, rewind applied)
        m.submodules.rdy = rdy = ReadyQueue(nq, ports=3)
        wk_rx, wk_done, wk_tx = rdy.push
        KF = self.fetch_depth
        m.submodules.fetch = fetch = WqeFetch(W, K * KF)
        # the fetch issuer (hw/rnic/fetch_issuer.py): up to fetch_depth WQE fetches of
        # different QPs in flight, queued in issue order for the send FSM
        m.submodules.issuer = iss = FetchIssuer(cfg, self.qpn_bits, KF)
        wiring.connect(m, rdy.pop, iss.offer)
        wiring.connect(m, wiring.flipped(self.bf), iss.bf)
        m.d.comb += [self.stat_bf_hit.eq(iss.stat_bf_hit), self.stat_bf_miss.eq(iss.stat_bf_miss)]
        wiring.connect(m, iss.qpc, wiring.flipped(self.qpc_fetch))
        wiring.connect(m, fetch.dma, wiring.flipped(self.wqe_rd))
        # send engine -> packet emitter (hw/rnic/packet_emitter.py): header descriptors,
        # payload beats, store and forward
        m.submodules.emit = emit = PacketEmitter(cfg)

        wiring.connect(m, emit.tx, wiring.flipped(self.tx))
        wiring.connect(m, wiring.flipped(self.pay_rd.rd), emit.pay)

        m.submodules.trk = trk = memory.Memory(shape=TRACKER_ENTRY, depth=nq * MO, init=[])
        trk_rd = trk.read_port(domain="comb")      # send FSM: head of cur (flush)
        trk_rrd = trk.read_port(domain="comb")     # response FSM: head of rcur
        trk_wr = trk.write_port()

        # ---------------- per-QP state: memories, read at the QPs being served
        mems = []

        def mregs(width, name, ports, reads=1, init=0):
            """Per-QP state in a memory (hw/lib/mem_array.py, valid bits reset it), written
            through ports ("tx" the send FSM, "rx" the response FSM, "gq" the fetch issue,
            "xq" the timers, "evc" / "evs" / "evr" the QP-event bookkeeping; a later port
            wins) and read at ``reads`` distinct indices (``cur``, ``rcur``, the ready
            queue's and the service queue's oldest QP, ...). Nothing is scanned."""
            r = MemArray(nq, width, ports, [f"r{k}" for k in range(reads)], init=init)
            m.submodules[f"m_{name}"] = r
            mems.append(r)
            return r

        fields = req_state_fields(cfg)
        st = {name: mregs(w, name, ports, reads=reads, init=init)
              for name, (w, ports, reads, init) in fields.items()}
        (pi, fi, ci, npsn, hi_psn, head, tail, rd_out, fence_wait, qlim, qcq, rts, err, lerr,
         lerr_idx, ev_pend, ev_reset, ev_state, ev_psn, rwd_pend, rwd_cnt, rtx_started,
         rnr_wait, retry_used, rnr_used, q_to, q_retry, q_rnr, rs_skip, q_sqb, q_sqlog,
         inflight) = st.values()

        # ---------------- the WQE cache: lk[0] the response FSM, lk[1] the flush
        m.submodules.wqec = wqec = WqeCache(cfg, max(1, self.qpn_bits))
        wiring.connect(m, wqec.dma_rd, wiring.flipped(self.reread_rd))
        m.d.comb += [self.stat_wqe_hit.eq(wqec.stat_hit), self.stat_wqe_miss.eq(wqec.stat_miss),
                     self.stat_wqe_evict.eq(wqec.stat_evict)]

        def count(q):
            return (tail[q] - head[q])[:mo_bits + 1]

        # ---------------- response FSM registers (declared early: the interlocks use them)
        # the response engine (hw/rnic/response_engine.py): the QP it works on, and whether
        # it is working on that QP's state (the send FSM keeps off it)
        m.submodules.resp = resp = ResponseEngine(cfg, self.qpn_bits)
        rcur = resp.qpn
        rx_busy = resp.busy


        def flush_cond(q, name):
            """QP q has work requests to flush: in ERR, or its failed WQE is the oldest, and
            no QP event waits (evaluated at the one QP q)."""
            f = Signal(name=f"flush_{name}")
            m.d.comb += f.eq((err[q] | (lerr[q] & (ci[q] == lerr_idx[q]))) & ~ev_pend[q]
                             & (ci[q] != pi[q]))
            return f

        def eligible(q, name):
            """QP q may issue a request now (hw/rnic/send_engine.py may_issue): evaluated at
            the one QP q, never for all QPs."""
            e = Signal(name=f"elig_{name}")
            m.d.comb += e.eq(may_issue(SimpleNamespace(**{f: st[f][q] for f in ISSUE_FIELDS}),
                                       MO))
            return e

        # ---------------- the send engine (hw/rnic/send_engine.py)
        m.submodules.send = se = SendEngine(cfg, self.qpn_bits, max(1, self.mr_bits), KF)
        cur = se.cur
        for f in TX_FIELDS:
            wiring.connect(m, getattr(se, f"w_{f}"), st[f].tx)
        m.d.comb += [getattr(se.view, f).eq(st[f][cur]) for f in CUR_FIELDS]
        wiring.connect(m, wiring.flipped(self.mr), se.mr)
        wiring.connect(m, wiring.flipped(self.qpc_tx), se.qpc)
        wiring.connect(m, se.desc, emit.desc)
        wiring.connect(m, se.pay_req, wiring.flipped(self.pay_rd.req))
        m.d.comb += [emit.res_len.eq(se.res_len), emit.res_take.eq(se.res_take),
                     se.res_fits.eq(emit.res_fits), se.node_id.eq(self.node_id)]
        for name in ("stat_write", "stat_read", "stat_send", "stat_cas", "stat_faa",
                     "stat_wqe_fetch", "stat_db_reject", "stat_retransmit"):
            m.d.comb += getattr(self, name).eq(getattr(se, name))
        flushing, fetching = se.flushing, se.fetching
        ctx = se.ctx
        db_q = self.db.payload.qpn[:self.qpn_bits]
        wiring.connect(m, wiring.flipped(self.db), se.db)
        m.d.comb += [se.db_view.ci.eq(ci[db_q]), se.db_view.fi.eq(fi[db_q]),
                     se.db_view.q_sqlog.eq(q_sqlog[db_q])]
        m.d.comb += [trk_rd.addr.eq(se.trk_raddr), se.ent.eq(trk_rd.data)]

        wiring.connect(m, emit.perr, resp.perr)
        wiring.connect(m, wiring.flipped(self.rx), resp.rx)
        m.d.comb += [trk_rrd.addr.eq(resp.trk_addr), resp.trk_data.eq(trk_rrd.data)]

        def pop_head(q):
            """The response engine removes the head message of QP q (it is completed) and
            wakes the QP: it may have tracker room or READ budget now."""
            return (head.write("rx", q, head[q] + 1) + ci.write("rx", q, ci[q] + 1)
                    + [wk_rx.valid.eq(1), wk_rx.payload.index.eq(q)])

        # ---------------- transport timers (local ACK timeout, RNR wait)
        m.submodules.timer = timer = RetryTimer(nq, max(1, cfg.cycles(TICK_NS)))
        tx_kick = se.kick             # the send FSM restarts the ACK timer of cur
        rx_kick = Signal()            # the response FSM made progress on rcur
        # the ACK timer of the QP it scans runs while requests are outstanding; not while a
        # rewind waits to be applied (it restarts the timer). Evaluated at that one QP.
        armed = Signal()
        ts = timer.to_index
        m.d.comb += [
            armed.eq((count(ts) != 0) & rts[ts] & ~err[ts] & ~ev_pend[ts] & ~rwd_pend[ts]),
            timer.armed.eq(armed),
            timer.kick[0].valid.eq(tx_kick), timer.kick[0].payload.qpn.eq(cur),
            timer.kick[1].valid.eq(rx_kick), timer.kick[1].payload.qpn.eq(rcur),
            timer.to_value.eq(q_to[timer.to_index]),
        ]

        def progress():
            """The response FSM completed the head message of rcur: forward progress resets
            the retry counters and restarts the ACK timer (IBA 9.7.6.1.3)."""
            m.d.comb += rx_kick.eq(1)
            m.d.comb += (retry_used.write("rx", rcur, 0) + rnr_used.write("rx", rcur, 0)
                         + rtx_started.write("rx", rcur, 0))

        # READ/atomic count and fence flag: one next-state expression per QP, merging the
        # send FSM's commit (+1, fence set), the response FSM's completion (-1) and a reset
        tx_rd_inc, tx_fence_set = se.rd_inc, se.fence_set
        rx_rd_dec = resp.ev.rd_dec
        ev_rst_rd = se.ev_rst_rd
        rw_rst_rd = se.rw_rst_rd      # a rewind of cur: its READ/atomic requests are gone
        ev_sel = Signal(self.qpn_bits)
        same = Signal()                 # both FSMs on one QP
        m.d.comb += same.eq(cur == rcur)
        nxt_tx = Signal(5)
        nxt_rx = Signal(5)
        m.d.comb += [nxt_tx.eq(rd_out[cur] + tx_rd_inc - (rx_rd_dec & same)),
                     nxt_rx.eq(rd_out[rcur] + (tx_rd_inc & same) - rx_rd_dec)]
        with m.If(rx_rd_dec):
            m.d.comb += (rd_out.write("rx", rcur, nxt_rx)
                         + fence_wait.write("rx", rcur, fence_wait[rcur] & (nxt_rx != 0)))
        with m.If(ev_rst_rd):
            m.d.comb += rd_out.write("tx", ev_sel, 0) + fence_wait.write("tx", ev_sel, 0)
        with m.Elif(rw_rst_rd):
            m.d.comb += rd_out.write("tx", cur, 0) + fence_wait.write("tx", cur, 0)
        with m.Elif(tx_rd_inc | tx_fence_set):
            m.d.comb += (rd_out.write("tx", cur, nxt_tx)
                         + fence_wait.write("tx", cur, (fence_wait[cur] | tx_fence_set)
                                            & (nxt_tx != 0)))
        # the sum of every QP's READ/atomic count (a counter's occupancy, stat_q_rd_out),
        # changed as the writes above change one QP's: a reset's write wins over a commit and
        # over a completion on the same QP (it takes the count it clears)
        rd_sum = Signal(range(nq * cfg.max_rd_atomic + 1))
        rst_q = Mux(ev_rst_rd, ev_sel, cur)
        rst = ev_rst_rd | rw_rst_rd
        rd_add = Signal(2)
        rd_sub = Signal(6)
        m.d.comb += [rd_add.eq(tx_rd_inc & ~rst),
                     rd_sub.eq(Mux(rx_rd_dec & ~(rst & (rst_q == rcur)), 1, 0)
                               + Mux(ev_rst_rd, rd_out[ev_sel], Mux(rw_rst_rd, rd_out[cur], 0)))]
        m.d.sync += rd_sum.eq(rd_sum + rd_add - rd_sub)
        m.d.comb += self.stat_q_rd_out.eq(rd_sum)

        # ---------------- completions and QP errors of both FSMs, behind the write gate
        # (hw/rnic/completion_gate.py): a CQE leaves only once the data the requester wrote
        # for its WR (READ data, atomic result) is answered by the host, and a failed write
        # turns it into LOC_PROT_ERR and its QP to ERR.
        m.submodules.cpl = cpl = CompletionGate(self.qpn_bits, cfg.gate_depth)
        wr = self.dma_wr.wr
        wiring.connect(m, resp.wr, wiring.flipped(wr))     # only the response engine writes
        wiring.connect(m, wiring.flipped(self.dma_wr.done), cpl.done)
        m.d.comb += cpl.wr_issued.eq(wr.valid & wr.ready & wr.payload.last)
        wiring.connect(m, resp.cqe, cpl.rx_cqe)
        wiring.connect(m, resp.err, cpl.rx_err)
        wiring.connect(m, cpl.cqe, wiring.flipped(self.cqe))
        wiring.connect(m, cpl.set_err, wiring.flipped(self.set_err))
        wiring.connect(m, se.cqe, cpl.tx_cqe)
        wiring.connect(m, se.err, cpl.tx_err)
        m.d.comb += [cpl.forget.eq(se.forget), cpl.forget_key.eq(se.forget_key)]
        m.d.comb += self.stat_dma_err.eq(resp.stat_pay_err + cpl.stat_err + se.stat_wqe_err
                                         + resp.stat_reread_err)

        # ---------------- tracker write port: the response engine (NAK status) has priority
        rx_trk_we, rx_trk_data = resp.trk_we, resp.trk_wdata
        m.d.comb += [
            trk_wr.en.eq(rx_trk_we | se.trk_we),
            trk_wr.addr.eq(Mux(rx_trk_we, resp.trk_addr, se.trk_waddr)),
            trk_wr.data.eq(Mux(rx_trk_we, rx_trk_data, se.trk_wdata)),
            se.rx_trk_we.eq(rx_trk_we),
        ]
        wiring.connect(m, se.fill, wqec.fill)

        # ---------------- the batch plan (for the issuer's QP, or for cur's flush)
        # ---------------- send FSM
        sq_mask = Signal(32)
        fsel = Signal(self.qpn_bits)         # QP of the fetch request (cur or the issuer's)
        fctx = Signal(regmap.QP_CTX)         # and its context
        m.d.comb += sq_mask.eq((Const(1, 33) << fctx.sq_log_size) - 1)
        f_addr = Signal(64)
        m.d.comb += f_addr.eq(fctx.sq_base + ((fi[fsel] & sq_mask) << 6))
        # batch: what is posted, up to the end of the ring, the tracker room, WQE_BATCH and,
        # for a QP with READs or atomics outstanding, its READ/atomic budget left (at least
        # one): the send engine drops the WQEs of a batch it may not send (the budget is
        # spent), so a QP that a completion wakes with one READ of budget left would read
        # wqe_batch WQEs by DMA to send one of them
        n_posted = Signal(16)
        n_to_end = Signal(33)
        n_room = Signal(mo_bits + 1)
        n_rd = Signal(5)
        n_batch = Signal(range(K + 1))
        f_rd_out, f_qlim = rd_out[fsel], qlim[fsel]
        m.d.comb += [
            n_posted.eq(pi[fsel] - fi[fsel]),
            n_to_end.eq(sq_mask + 1 - (fi[fsel] & sq_mask)),
            n_room.eq(MO - count(fsel)),
            n_rd.eq(Mux(f_rd_out == 0, K, Mux(f_rd_out >= f_qlim, 1, f_qlim - f_rd_out))),
        ]
        prev = Const(K, range(K + 1))
        for i, lim in enumerate((n_posted, n_to_end, n_room, n_rd)):
            nxt = Signal(range(K + 1), name=f"n_batch{i}")
            m.d.comb += nxt.eq(Mux(lim < prev, lim, prev))
            prev = nxt
        m.d.comb += n_batch.eq(Mux(flushing, 1, prev))

        n_fl = iss.n_fl                 # batches fetched and not yet done

        # QP events, in the order they came (each QP at most once: a later event of a QP
        # still queued replaces its state, ev_state / ev_psn). ev_any also covers an event
        # pushed last cycle that is not yet at the queue's output, so that a doorbell
        # arriving after an event is never applied before it.
        m.submodules.evq = evq = ReadyQueue(nq)
        ev_any = Signal()
        m.d.comb += [ev_any.eq(evq.count != 0), ev_sel.eq(evq.pop.payload.index)]
        ev_clear = se.ev_clear
        m.d.comb += [se.ev_any.eq(ev_any), se.ev_valid.eq(evq.pop.valid), se.ev_sel.eq(ev_sel),
                     se.ev_view.inflight.eq(inflight[ev_sel]),
                     se.ev_view.ev_reset.eq(ev_reset[ev_sel]),
                     se.ev_view.ev_state.eq(ev_state[ev_sel]),
                     se.ev_view.ev_psn.eq(ev_psn[ev_sel]), se.ev_view.rts.eq(rts[ev_sel])]

        # QPs that may need a rewind or a flush (the service queue), woken by the writes
        # that can make them need one: a rewind requested (response FSM, timers), ERR or a
        # local error set, the head popped while a local error waits, a WQE posted or
        # flushed on a QP in error. The send FSM looks at the oldest in IDLE: applies it,
        # queues it again if it must wait (a batch or the response FSM on the QP, an event
        # pending, batches in flight for a flush), else drops it. push[3]: queued again.
        m.submodules.svc = svc = ReadyQueue(nq, ports=4)
        sq = svc.pop.payload.index
        sv = svc.pop.valid
        s_busy = Signal()             # the response FSM works on the QP
        m.d.comb += s_busy.eq(rx_busy & (rcur == sq))
        s_rw = Signal()               # a rewind waits
        m.d.comb += s_rw.eq(rwd_pend[sq] & ~err[sq])
        s_rw_go = Signal()
        m.d.comb += s_rw_go.eq(sv & s_rw & ~ev_pend[sq] & ~inflight[sq] & ~s_busy)
        s_fl = flush_cond(sq, "svc")
        s_fl_go = Signal()
        m.d.comb += s_fl_go.eq(sv & s_fl & ~s_busy & (n_fl == 0))
        # the send engine takes it, queues it again or drops it (and keeps a flush waiting
        # for the batches in flight: fl_wait)
        m.d.comb += [se.svc_valid.eq(sv), se.svc_qpn.eq(sq), se.svc_rw.eq(s_rw),
                     se.svc_fl.eq(s_fl), se.svc_rw_go.eq(s_rw_go), se.svc_fl_go.eq(s_fl_go),
                     svc.pop.ready.eq(se.svc_take), se.n_fl.eq(n_fl), se.rx_busy.eq(rx_busy),
                     se.rcur.eq(rcur)]
        fl_wait = se.fl_wait
        sw_rx, sw_xq, sw_tx, sw_again = svc.push
        m.d.comb += [sw_again.valid.eq(se.svc_again), sw_again.payload.index.eq(sq)]
        tx_waddr = Signal(self.qpn_bits)
        m.d.comb += [
            sw_rx.valid.eq(err.rx.en | rwd_pend.rx.en | (head.rx.en & lerr[rcur])),
            sw_rx.payload.index.eq(rcur),
            sw_xq.valid.eq(rwd_pend.xq.en),
            sw_xq.payload.index.eq(rwd_pend.xq.addr),
            tx_waddr.eq(Mux(err.tx.en, err.tx.addr, Mux(lerr.tx.en, lerr.tx.addr,
                        Mux(ci.tx.en, ci.tx.addr, pi.tx.addr)))),
            sw_tx.valid.eq(err.tx.en | lerr.tx.en | ci.tx.en
                           | (pi.tx.en & (err[pi.tx.addr] | lerr[pi.tx.addr]))),
            sw_tx.payload.index.eq(tx_waddr),
        ]

        # a doorbell that was already waiting when a QP event arrived is taken before the
        # event, so that doorbells and events take effect in the order they came
        db_early = Signal()
        with m.If(self.db.valid & self.db.ready):
            m.d.sync += db_early.eq(0)
        with m.Elif(self.db.valid & self.qp_event.valid):
            m.d.sync += db_early.eq(1)
        m.d.comb += se.db_early.eq(db_early)

        # ---------------- fetch issue (hw/rnic/fetch_issuer.py): the ready queue's oldest QP is
        # fetched while the send FSM works on earlier batches; the batch is planned here (for
        # the issuer's QP, or for cur when the send FSM fetches a flush by itself)
        m.d.comb += [iss.done.eq(se.done), se.n_batch.eq(n_batch),
                     se.fetch_ready.eq(fetch.req.ready)]
        wiring.connect(m, fetch.wqe, se.wqe_in)
        gq = rdy.pop.payload.index
        g_elig = eligible(gq, "gq")
        m.d.comb += [
            iss.hold.eq(fetching | fl_wait | flushing | ev_any),
            iss.take_ok.eq(g_elig & ~inflight[gq]),
            iss.fetching.eq(fetching),
            iss.plan.addr.eq(f_addr), iss.plan.first.eq(fi[fsel]), iss.plan.count.eq(n_batch),
            fsel.eq(Mux(fetching, cur, iss.sel)),
            fctx.eq(Mux(fetching, ctx, iss.ctx)),
            fetch.req.valid.eq(iss.req.valid | fetching),
            fetch.req.payload.addr.eq(Mux(fetching, f_addr, iss.req.payload.addr)),
            fetch.req.payload.count.eq(Mux(fetching, n_batch, iss.req.payload.count)),
            fetch.req.payload.bf.eq(~fetching & iss.req.payload.bf),
            fetch.req.payload.wqe.eq(iss.req.payload.wqe),
            iss.req.ready.eq(fetch.req.ready),
        ]
        with m.If(iss.reserve):
            m.d.comb += inflight.write("gq", gq, 1)
        fq_q = Signal(self.qpn_bits)
        fq_n = Signal(range(K + 1))
        fq_bad = Signal()
        fq_ctx = Signal(regmap.QP_CTX)
        m.d.comb += Cat(fq_q, fq_n, fq_bad, fq_ctx).eq(iss.batch.payload)
        e_fq = eligible(fq_q, "fq")         # the oldest fetched batch's QP
        wiring.connect(m, iss.batch, se.batch)
        m.d.comb += se.batch_ok.eq(e_fq)
        m.d.comb += [iss.bf_reset.eq(se.bf_reset), iss.bf_reset_qpn.eq(se.bf_reset_qpn)]
        m.d.comb += [wk_tx.valid.eq(se.wake.valid), wk_tx.payload.index.eq(se.wake.payload.index),
                     wk_done.valid.eq(se.wake_done.valid),
                     wk_done.payload.index.eq(se.wake_done.payload.index)]

        # WQE cache lookups: the response engine's (lk[0], head of rcur) and the flush's
        # (lk[1], head of cur) for the head message's WQE fields (wr_id, local_addr, length)
        wiring.connect(m, resp.info, wqec.lk[0])
        wiring.connect(m, se.wqe_lk, wqec.lk[1])

        # ---------------- the response engine: its QP's state, and what it does to it
        rqi = self.rx.meta.payload.dest_qpn[:self.qpn_bits]
        rx_ev_kills = ev_pend[rqi] & (ev_reset[rqi] | (ev_state[rqi] == formats.QpState.ERR.value))
        m.d.comb += resp.rx_ok.eq((self.rx.meta.payload.dest_qpn < nq) & rts[rqi] & ~err[rqi]
                                  & ~rx_ev_kills & ~flush_cond(rqi, "rx"))
        rv = resp.view
        m.d.comb += [
            rv.head.eq(head[rcur]), rv.count.eq(count(rcur)), rv.hi_psn.eq(hi_psn[rcur]),
            rv.rtx_started.eq(rtx_started[rcur]), rv.rnr_wait.eq(rnr_wait[rcur]),
            rv.rnr_used.eq(rnr_used[rcur]), rv.rnr_retry.eq(q_rnr[rcur]),
            rv.send_cq.eq(qcq[rcur]), rv.sq_base.eq(q_sqb[rcur]), rv.sq_log.eq(q_sqlog[rcur]),
            rv.rts.eq(rts[rcur]), rv.err.eq(err[rcur]),
            rv.kills.eq(ev_pend[rcur] & (ev_reset[rcur]
                                         | (ev_state[rcur] == formats.QpState.ERR.value))),
        ]
        rev = resp.ev
        with m.If(rev.pop):
            m.d.comb += pop_head(rcur)
        with m.If(rev.progress):
            progress()
        with m.If(rev.retry_clear):
            m.d.comb += retry_used.write("rx", rcur, 0)
        with m.If(rev.set_err):
            m.d.comb += err.write("rx", rcur, 1)
        with m.If(rev.rewind):
            m.d.comb += (rwd_pend.write("rx", rcur, 1)
                         + rwd_cnt.write("rx", rcur, rev.rewind_counts))
        with m.If(rev.rnr):
            # RNR NAK (IBA 9.7.5.2.8): the timer waits the coded time, then a rewind
            m.d.comb += (rnr_wait.write("rx", rcur, 1)
                         + rnr_used.write("rx", rcur, rnr_used[rcur] + 1))
        m.d.comb += [timer.rnr.valid.eq(rev.rnr), timer.rnr.payload.qpn.eq(rcur),
                     timer.rnr.payload.code.eq(resp.rnr_code)]
        for name in ("stat_resp_drop", "stat_nak_rx", "stat_rnr_rx"):
            m.d.comb += getattr(self, name).eq(getattr(resp, name))

        # ---------------- timer expirations (after the FSMs: a request set here wins)
        with m.If(timer.expire_valid):
            xq = timer.expire_qpn
            with m.If(timer.expire_rnr):
                # the RNR wait is over: send again from the RNR NAKed message
                m.d.comb += (rnr_wait.write("xq", xq, 0) + rwd_pend.write("xq", xq, 1)
                             + rwd_cnt.write("xq", xq, 0))
            with m.Elif(armed):             # xq is the scanned QP, timer.to_index
                # local ACK timeout: counts against retry_cnt
                m.d.comb += self.stat_timeout.eq(1)
                m.d.comb += rwd_pend.write("xq", xq, 1) + rwd_cnt.write("xq", xq, 1)

        # ---------------- QP events: always accepted, applied from IDLE
        m.d.comb += self.qp_event.ready.eq(1)
        with m.If(ev_clear):
            m.d.comb += ev_pend.write("evc", ev_sel, 0)
            m.d.comb += evq.pop.ready.eq(1)
        with m.If(self.qp_event.valid):
            e = self.qp_event.payload
            eq = e.qpn[:self.qpn_bits]
            with m.If(e.qpn < nq):
                m.d.comb += [
                    evq.push[0].valid.eq(1), evq.push[0].payload.index.eq(eq),
                    *ev_pend.write("evs", eq, 1),
                    *ev_state.write("evs", eq, e.state),
                    *ev_psn.write("evs", eq, e.sq_psn),
                    # RESET, INIT and RTR start the send queue afresh; RTS (from RTR: the
                    # send PSN is loaded; RTS -> RTS: an attribute change) and ERR keep it
                    # (IBA 10.3.1). A reset requested by any event since the last
                    # application sticks.
                    *ev_reset.write("evs", eq, ((e.state != formats.QpState.ERR)
                                                & (e.state != formats.QpState.RTS))
                                    | (ev_reset[eq] & ~(ev_clear & (ev_sel == eq)))),
                ]
            with m.If((e.qpn < nq) & e.new):
                m.d.comb += q_sqlog.write("evs", eq, e.sq_log)
        with m.If(ev_clear & ~(self.qp_event.valid & (self.qp_event.payload.qpn == ev_sel))):
            m.d.comb += ev_reset.write("evr", ev_sel, 0)
        # the per-QP memories' read ports, at the indices read above
        for r in mems:
            m.d.comb += r.read_addrs()
        m.d.comb += [self.stat_wait_wqe.eq(se.wait_wqe), self.stat_wait_mr.eq(se.wait_mr),
                     self.stat_wait_tx.eq(se.wait_tx), self.stat_wait_pay.eq(se.wait_pay)]
        m.d.comb += [self.stat_q_ready.eq(rdy.count), self.stat_q_fetch.eq(iss.n_fl)]
        m.d.comb += [self.stat_busy_send.eq(se.active),
                     self.stat_busy_resp.eq(resp.active),
                     self.stat_retry_exc.eq(se.stat_retry_exc | resp.stat_retry_exc)]
        return m
