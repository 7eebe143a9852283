"""One RNIC: requester, responder and the blocks around them.

::

              MMIO (host.req / rdata)                 host port: TLPs (down / up)
               |                                        ^   |
         MmioFrontend -- bf -->                    HostInterface (DMA engines)
               | register bus                       7 read clients, 5 write clients
   +-----------+-----------+----------+             ^   ^   ^   ^   ^  ^   ^ ^ ^ ^ ^
   | context   doorbells   counters  events        wqe pay rdata rwqe at icm ...
   +-----+-----------+-----+                         |   |     |   |   |  |
         |  SET_MR   | sq_db                     requester  responder  |  (+ atomic unit)
         +--> MR cache (ICM) <-- lkey / rkey lookups -------+----------+  completion (CQEs)
         |  SET_CQ       |                                              |
         +--> CQ cache (ICM) <-- CQ context of every CQE ---------------+
         |    (both caches share the icm clients: hw/ctx/icm_port.py)
         |           v
         |      +-----------+   tx meta/payload
         +----->| requester |------+---> PacketArbiter --> Packetizer ---> tx frames
         |      +-----------+      |          ^
         |        ^   | cqe        |          | responses
         |  resp. |   v            |     +-----------+
         |        |  Completion ---+-----| responder |<--+
         |        |      (CQEs by DMA)   +-----------+   |
         |   PacketDemux <-------- Depacketizer <--------+---- rx frames
         +-- (requests -> responder, responses -> requester)

The same design plays both roles, as real RNICs do: a node issues requests from its send
queues and answers requests that arrive for its QPs. See docs/architecture.md; the host port
(DMA, MMIO, BlueFlame) is described in docs/host-interface.md.

``cfg.pipeline_ns`` adds the NIC's fixed processing latency as a delay line (no rate limit)
on the transmit and on the receive frame path; it is the one free parameter fitted when a
timing preset is calibrated (docs/timing.md).
"""

from amaranth import *
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ..lib.arbiter import PacketArbiter
from .completion import Completion
from ..config import NicConfig
from .context import Context
from .counters import Counters
from ..ctx.cq_cache import CqCache
from ..ctx.icm_port import IcmPort
from ..ctx.mr_cache import MR_ICM_ENTRY_BYTES, MrCache
from ..ctx.qp_cache import QpCache
from ..net.depacketizer import Depacketizer
from .dispatch import PacketDemux
from ..dma.host_if import HostInterface
from ..dma.read_engine import ring_words_for
from .doorbell import Doorbells
from .events import AsyncEvents
from ..formats import RECV_WQE_BYTES, WQE_BYTES
from ..interfaces import BeatStream, MmioPort, TlpDown, TlpUp
from ..lib.csr import BusDecoder
from .mmio import MmioFrontend
from ..net.link import Link
from ..net.packetizer import Packetizer
from ..regmap import DMA_READ_CLIENTS, DMA_WRITE_CLIENTS, Counter, register_map
from .requester_units import RequesterUnits
from .responder import Responder

__all__ = ["Rnic"]


def _stalled(port):
    """A packet port (``PacketOut``) offers its meta or a payload beat that is not taken."""
    return ((port.meta.valid & ~port.meta.ready)
            | (port.payload.valid & ~port.payload.ready))


class Rnic(wiring.Component):
    """One RNIC node.

    Ports
    -----
    mmio : In(MmioPort)            host register accesses (registers, commands, doorbells,
                                   BlueFlame, counters), back-pressured.
    down : Out(TlpDown)            TLPs to the host (DMA reads and writes) ...
    up : In(TlpUp)                 ... and from it (completions, write responses).
    tx : Out(BeatStream)           Ethernet frames to the network.
    rx : In(BeatStream)            Ethernet frames from the network.
    """

    def __init__(self, cfg: NicConfig):
        if not isinstance(cfg, NicConfig):
            raise TypeError(f"cfg must be a NicConfig, not {cfg!r}")
        self.cfg = cfg
        W = cfg.data_bytes
        mrrs = cfg.max_read_request
        # DMA read clients (regmap.DMA_READ_CLIENTS): largest request and ring of each
        fetch_depth = cfg.fetch_depth
        batch = cfg.wqe_batch
        self.rd_max_len = [batch * WQE_BYTES, cfg.mtu, cfg.mtu, RECV_WQE_BYTES, 8,
                           MR_ICM_ENTRY_BYTES, WQE_BYTES]
        # the WQE-fetch ring holds every batch the processing units may have in flight
        # (fetch_depth per unit), so that the units do not wait for each other's room
        self.rings = [ring_words_for(W, batch * WQE_BYTES, mrrs,
                                     batch * WQE_BYTES * fetch_depth * cfg.n_pus),
                      ring_words_for(W, cfg.mtu, mrrs, 2 * cfg.mtu),
                      ring_words_for(W, cfg.mtu, mrrs, 2 * cfg.mtu),
                      ring_words_for(W, RECV_WQE_BYTES, mrrs, RECV_WQE_BYTES * cfg.rq_prefetch),
                      ring_words_for(W, 8, mrrs),
                      ring_words_for(W, MR_ICM_ENTRY_BYTES, mrrs),
                      ring_words_for(W, WQE_BYTES, mrrs)]
        assert len(self.rings) == len(DMA_READ_CLIENTS)
        super().__init__({
            "mmio": In(MmioPort()),
            "down": Out(TlpDown(W)),
            "up": In(TlpUp(W)),
            "tx": Out(BeatStream(W)),
            "rx": In(BeatStream(W)),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        W = cfg.data_bytes

        m.submodules.context = context = Context(cfg)
        m.submodules.mr_cache = mr_cache = MrCache(cfg)
        m.submodules.cq_cache = cq_cache = CqCache(cfg)
        m.submodules.qp_cache = qp_cache = QpCache(cfg)
        m.submodules.icm = icm = IcmPort(3, W)
        m.submodules.doorbells = doorbells = Doorbells(cfg)
        m.submodules.counters = counters = Counters()
        m.submodules.events = events = AsyncEvents()
        m.submodules.mmio = front = MmioFrontend()
        m.submodules.requester = req = RequesterUnits(cfg)
        m.submodules.responder = resp = Responder(cfg)
        m.submodules.completion = comp = Completion(cfg)
        m.submodules.packetizer = pktz = Packetizer(W)
        m.submodules.depacketizer = dpkt = Depacketizer(W, max_frame_bytes=cfg.mtu + 128)
        m.submodules.demux = demux = PacketDemux(W, cfg.n_qps)
        m.submodules.tx_arb = tx_arb = PacketArbiter(W, 2)
        m.submodules.hif = hif = HostInterface(
            W, self.rings, len(DMA_WRITE_CLIENTS), n_tags=cfg.dma_tags,
            max_read_request=cfg.max_read_request, max_payload=cfg.max_payload,
            write_outstanding=cfg.dma_write_outstanding, tlp_overhead=cfg.tlp_overhead,
            rd_max_len=self.rd_max_len)

        # MMIO: the front end drives the register bus; one decoder (hw/lib/csr.py) gives each
        # block the window of the register map that is its own (hw/regmap.py, register_map)
        wiring.connect(m, wiring.flipped(self.mmio), front.host)
        m.submodules.decoder = decoder = BusDecoder(register_map(cfg.n_doorbells))
        wiring.connect(m, front.bus, decoder.bus)
        wiring.connect(m, decoder.control, context.bus)
        wiring.connect(m, decoder.counters, counters.bus)
        wiring.connect(m, decoder.doorbells, doorbells.bus)
        wiring.connect(m, decoder.queue_doorbells, doorbells.qbus)
        wiring.connect(m, decoder.events, events.bus)
        # BlueFlame writes ring the doorbell and hand their WQE to the requester
        wiring.connect(m, front.bf, doorbells.bf)
        wiring.connect(m, doorbells.sq_bf, req.bf)

        node_id = context.node_id
        m.d.comb += [req.node_id.eq(node_id), resp.node_id.eq(node_id), demux.node_id.eq(node_id)]

        # Tables.
        # QP contexts: in host memory (ICM) behind the QP-context cache; the QP states on chip
        # (one lookup port each per processing unit: hw/rnic/requester_units.py)
        npu = cfg.n_pus
        for k in range(npu):
            wiring.connect(m, req.qpc_tx[k], qp_cache.lk[k])
            wiring.connect(m, req.qpc_fetch[k], qp_cache.lk[npu + k])
            wiring.connect(m, req.mr[k], mr_cache.lk[k])
        for k in range(cfg.rsp_lookahead):
            wiring.connect(m, resp.qpc[k], qp_cache.lk[2 * npu + k])
            wiring.connect(m, resp.rkey[k], mr_cache.lk[npu + 1 + k])
        wiring.connect(m, context.qp_wr, qp_cache.wr)
        m.d.comb += qp_cache.base.eq(context.icm_qp_base)
        wiring.connect(m, resp.qp, context.qp_resp)
        # memory regions: in host memory (ICM) behind the MR cache
        wiring.connect(m, resp.mr, mr_cache.lk[npu])
        wiring.connect(m, context.mr_wr, mr_cache.wr)
        m.d.comb += mr_cache.base.eq(context.icm_mr_base)
        # CQ contexts: in ICM too, behind the CQ-context cache
        for k in range(cfg.cq_lookups):
            wiring.connect(m, comp.cq[k], cq_cache.lk[k])
        wiring.connect(m, context.cq_wr, cq_cache.wr)
        m.d.comb += cq_cache.base.eq(context.icm_cq_base)
        # the caches share the host interface's ICM read and write clients
        wiring.connect(m, mr_cache.dma_rd, icm.rd[0])
        wiring.connect(m, mr_cache.dma_wr, icm.wr[0])
        wiring.connect(m, cq_cache.dma_rd, icm.rd[1])
        wiring.connect(m, cq_cache.dma_wr, icm.wr[1])
        wiring.connect(m, qp_cache.dma_rd, icm.rd[2])
        wiring.connect(m, qp_cache.dma_wr, icm.wr[2])
        wiring.connect(m, doorbells.bind, context.bind)

        # Events: broadcast, the engines are always ready.
        for dst in (req.qp_event, resp.qp_event):
            m.d.comb += [dst.valid.eq(context.qp_event.valid), dst.payload.eq(context.qp_event.payload)]
        m.d.comb += context.qp_event.ready.eq(1)
        wiring.connect(m, context.cq_event, comp.cq_event)
        wiring.connect(m, req.set_err, context.err_req)
        wiring.connect(m, resp.set_err, context.err_resp)
        wiring.connect(m, comp.err_qp, context.err_cq)
        wiring.connect(m, comp.event, events.i)

        # Doorbells.
        wiring.connect(m, doorbells.sq_db, req.db)
        wiring.connect(m, doorbells.rq_db, resp.rq_db)
        wiring.connect(m, doorbells.cq_db, comp.cq_db)

        # Completions.
        wiring.connect(m, req.cqe, comp.i0)
        wiring.connect(m, resp.cqe, comp.i1)

        # DMA: every user has a port of its own on the host interface.
        rd_clients = (req.wqe_rd, req.pay_rd, resp.rd_data, resp.rd_wqe, resp.at_rd,
                      icm.dma_rd, req.reread_rd)
        wr_clients = (req.dma_wr, resp.wr, resp.at_wr, comp.dma_wr, icm.dma_wr)
        for c, port in enumerate(rd_clients):
            wiring.connect(m, port, hif.rd[c])
        for c, port in enumerate(wr_clients):
            wiring.connect(m, port, hif.wr[c])
        wiring.connect(m, hif.down, wiring.flipped(self.down))
        wiring.connect(m, wiring.flipped(self.up), hif.up)

        # Transmit: requests and responses share the packetizer.
        wiring.connect(m, req.tx, tx_arb.i[0])
        wiring.connect(m, resp.tx, tx_arb.i[1])
        wiring.connect(m, tx_arb.o, pktz.i)

        # The NIC's own processing latency (cfg.pipeline_ns, each way): a delay line with no
        # rate limit on the transmit and on the receive frame path.
        delay = cfg.cycles(cfg.pipeline_ns)
        if delay:
            m.submodules.tx_pipe = tx_pipe = Link(W, latency_cycles=delay, bytes_per_cycle=W)
            m.submodules.rx_pipe = rx_pipe = Link(W, latency_cycles=delay, bytes_per_cycle=W)
            wiring.connect(m, pktz.o, tx_pipe.i)
            wiring.connect(m, tx_pipe.o, wiring.flipped(self.tx))
            wiring.connect(m, wiring.flipped(self.rx), rx_pipe.i)
            wiring.connect(m, rx_pipe.o, dpkt.i)
        else:
            wiring.connect(m, pktz.o, wiring.flipped(self.tx))
            wiring.connect(m, wiring.flipped(self.rx), dpkt.i)

        # Receive.
        wiring.connect(m, dpkt.o, demux.i)
        wiring.connect(m, demux.req, req.rx)
        wiring.connect(m, demux.resp, resp.rx)

        # Counters.
        tx_fire = self.tx.valid & self.tx.ready
        rx_fire = self.rx.valid & self.rx.ready
        inc = {
            Counter.TX_PACKETS: tx_fire & self.tx.payload.last,
            Counter.TX_BYTES: Mux(tx_fire, self.tx.payload.nbytes, 0),
            Counter.RX_PACKETS: dpkt.stat_ok,
            Counter.RX_BYTES: Mux(dpkt.stat_ok, dpkt.stat_bytes, 0),
            Counter.HIF_DOWN_BYTES: hif.stat_down_bytes,
            Counter.HIF_UP_BYTES: hif.stat_up_bytes,
            Counter.HIF_READ_REQS: hif.stat_mrd,
            Counter.HIF_WRITE_TLPS: hif.stat_mwr,
            Counter.HIF_COMPLETIONS: hif.stat_cpld,
            Counter.HIF_ERRORS: hif.stat_err,
            Counter.HIF_BAD: hif.stat_bad,
            Counter.MMIO_WRITES: front.stat_write,
            Counter.MMIO_WRITE_BYTES: Mux(front.stat_write, front.stat_write_len + cfg.tlp_overhead, 0),
            Counter.MMIO_READS: front.stat_read,
            Counter.MMIO_UNMAPPED: decoder.stat_unmapped,
            Counter.BLUEFLAME_WQES: req.stat_bf_hit,
            Counter.BLUEFLAME_MISSES: req.stat_bf_miss,
            Counter.DMA_ERRORS: req.stat_dma_err + resp.stat_dma_err,
            Counter.CQE_DROPS: comp.stat_overflow,
            Counter.ASYNC_EVENTS: events.stat_event,
            Counter.OPS_WRITE: req.stat_write,
            Counter.OPS_READ: req.stat_read,
            Counter.OPS_SEND: req.stat_send,
            Counter.OPS_CAS: req.stat_cas,
            Counter.OPS_FAA: req.stat_faa,
            Counter.NAKS_SENT: resp.stat_nak,
            Counter.NAKS_RECEIVED: req.stat_nak_rx,
            Counter.RX_DROP_ICRC: dpkt.stat_icrc,
            # frames reaching the node = RX_PACKETS + RX_DROP_ICRC + RX_DROP_MALFORMED
            Counter.RX_DROP_MALFORMED: dpkt.stat_malformed,
            Counter.RX_DROP_QP: demux.stat_drop + resp.stat_drop,
            Counter.DOORBELLS: doorbells.stat_ring,
            Counter.DOORBELL_REJECTS: doorbells.stat_reject + req.stat_db_reject,
            Counter.CQES: comp.stat_cqe,
            Counter.WQE_FETCHES: req.stat_wqe_fetch,
            Counter.RESP_QUEUE_FULL: resp.stat_resp_full,
            Counter.DUPLICATES: resp.stat_dup,
            Counter.SEQ_DROPS: resp.stat_seq_drop,
            Counter.ATOMIC_REPLAYS: resp.stat_replay,
            Counter.ACKS_COALESCED: resp.stat_coalesce,
            Counter.ACK_TIMEOUTS: req.stat_timeout,
            Counter.RETRANSMITS: req.stat_retransmit,
            Counter.RNR_NAKS_RECEIVED: req.stat_rnr_rx,
            Counter.RETRY_EXCEEDED: req.stat_retry_exc,
            Counter.RESP_DROPS: req.stat_resp_drop,
            Counter.MR_CACHE_HITS: mr_cache.stat_hit,
            Counter.MR_CACHE_MISSES: mr_cache.stat_miss,
            Counter.MR_CACHE_EVICTIONS: mr_cache.stat_evict,
            Counter.MR_CACHE_WRITEBACKS: mr_cache.stat_writeback,
            Counter.CQ_CACHE_HITS: cq_cache.stat_hit,
            Counter.CQ_CACHE_MISSES: cq_cache.stat_miss,
            Counter.CQ_CACHE_EVICTIONS: cq_cache.stat_evict,
            Counter.CQ_CACHE_WRITEBACKS: cq_cache.stat_writeback,
            Counter.QP_CACHE_HITS: qp_cache.stat_hit,
            Counter.QP_CACHE_MISSES: qp_cache.stat_miss,
            Counter.QP_CACHE_EVICTIONS: qp_cache.stat_evict,
            Counter.QP_CACHE_WRITEBACKS: qp_cache.stat_writeback,
            Counter.WQE_CACHE_HITS: req.stat_wqe_hit,
            Counter.WQE_CACHE_MISSES: req.stat_wqe_miss,
            Counter.WQE_CACHE_EVICTIONS: req.stat_wqe_evict,
            Counter.RQ_WQE_PREFETCHES: resp.stat_rq_prefetch,
            Counter.RQ_WQE_DEMAND_READS: resp.stat_rq_demand,
            Counter.RQ_WQE_WAIT_CYCLES: resp.stat_rq_wait,
            Counter.BUSY_REQ_SEND: req.stat_busy_send,
            Counter.BUSY_REQ_RESP: req.stat_busy_resp,
            Counter.WAIT_SEND_WQE: req.stat_wait_wqe,
            Counter.WAIT_SEND_MR: req.stat_wait_mr,
            Counter.WAIT_SEND_TX: req.stat_wait_tx,
            Counter.WAIT_SEND_PAY: req.stat_wait_pay,
            Counter.Q_REQ_READY: req.stat_q_ready,
            Counter.Q_REQ_FETCH: req.stat_q_fetch,
            Counter.Q_REQ_RD_OUT: req.stat_q_rd_out,
            Counter.Q_HIF_READS: hif.q_reads,
            Counter.Q_HIF_WRITES: hif.q_writes,
            Counter.Q_RSP_QUEUE: resp.stat_q_resp,
            Counter.BUSY_RSP: resp.stat_busy,
            Counter.BUSY_CQE: comp.stat_busy,
            Counter.BUSY_QP_CACHE: qp_cache.stat_busy,
            Counter.BUSY_MR_CACHE: mr_cache.stat_busy,
            Counter.BUSY_CQ_CACHE: cq_cache.stat_busy,
            Counter.TX_BEATS: tx_fire,
            Counter.RX_BEATS: rx_fire,
            Counter.STALL_REQ_TX: _stalled(req.tx),
            Counter.STALL_RSP_TX: _stalled(resp.tx),
            Counter.STALL_TX: self.tx.valid & ~self.tx.ready,
            Counter.STALL_RX: self.rx.valid & ~self.rx.ready,
            Counter.STALL_REQ_RX: _stalled(demux.req),
            Counter.STALL_RSP_RX: _stalled(demux.resp),
        }
        # per DMA client, and their totals: requests asked for and bytes
        rd_req = [p.req.valid & p.req.ready for p in rd_clients]
        rd_bytes = [Mux(f, p.req.payload.len, 0) for f, p in zip(rd_req, rd_clients)]
        wr_first = []
        for k, p in enumerate(wr_clients):
            first = Signal(init=1, name=f"wr_first{k}")
            fire = p.wr.valid & p.wr.ready
            with m.If(fire):
                m.d.sync += first.eq(p.wr.payload.last)
            wr_first.append(fire & first)
        wr_bytes = [Mux(f, p.wr.payload.len, 0) for f, p in zip(wr_first, wr_clients)]
        for name, f, b in zip(DMA_READ_CLIENTS, rd_req, rd_bytes):
            inc[Counter[f"RD_{name}_REQS"]] = f
            inc[Counter[f"RD_{name}_BYTES"]] = b
        for name, f, b in zip(DMA_WRITE_CLIENTS, wr_first, wr_bytes):
            inc[Counter[f"WR_{name}_REQS"]] = f
            inc[Counter[f"WR_{name}_BYTES"]] = b
        inc[Counter.DMA_READS] = sum(rd_req)
        inc[Counter.DMA_READ_BYTES] = sum(rd_bytes)
        inc[Counter.DMA_WRITES] = sum(wr_first)
        inc[Counter.DMA_WRITE_BYTES] = sum(wr_bytes)
        for counter, value in inc.items():
            m.d.comb += counters.inc[counter].eq(value)
        return m
