"""One RNIC: requester, responder and the blocks around them.

::

              MMIO                                   DMA (to host memory)
               |                                        ^
   +-----------+-----------+                            |
   | context   doorbells   counters           DmaArbiter (3 read, 3 write clients)
   +-----+-----------+-----+                     ^   ^   ^        ^   ^   ^
         |           | sq_db                     |   |   |        |   |   |
         |           v                       wqe_rd pay_rd  resp_rd   |   |
         |      +-----------+   tx meta/payload       |             |   |
         +----->| requester |------+---> PacketArbiter --> Packetizer ---> tx frames
         |      +-----------+      |          ^
         |        ^   | cqe        |          | responses
         |  resp. |   v            |     +-----------+
         |        |  Completion ---+-----| responder |<--+
         |        |      (CQEs by DMA)   +-----------+   |
         |   PacketDemux <-------- Depacketizer <--------+---- rx frames
         +-- (requests -> responder, responses -> requester)

The same design plays both roles, as real RNICs do: a node issues requests from its send
queues and answers requests that arrive for its QPs. See docs/architecture.md.

``cfg.pipeline_ns`` adds the NIC's fixed processing latency as a delay line (no rate limit)
on the transmit and on the receive frame path; it is the one free parameter fitted when a
timing preset is calibrated (docs/timing.md).
"""

from amaranth import *
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from .arbiter import PacketArbiter, StreamArbiter
from .completion import Completion
from .config import NicConfig
from .context import Context
from .counters import Counters
from .depacketizer import Depacketizer
from .dispatch import PacketDemux
from .dma_arbiter import DmaArbiter
from .doorbell import Doorbells
from .interfaces import (MmioSignature, DmaReadReq, DmaReadData, DmaWrite, BeatStream)
from .link import Link
from .packetizer import Packetizer
from .regmap import Counter
from .requester import Requester
from .responder import Responder

__all__ = ["Rnic"]


class Rnic(wiring.Component):
    """One RNIC node.

    Ports
    -----
    mmio : In(MmioSignature)       registers, commands, doorbells, counters.
    dma_rd_req : Out(DmaReadReq)   DMA reads to host memory ...
    dma_rd_resp : In(DmaReadData)  ... answered in request order.
    dma_wr : Out(DmaWrite)         DMA writes to host memory.
    tx : Out(BeatStream)           Ethernet frames to the network.
    rx : In(BeatStream)            Ethernet frames from the network.
    """

    def __init__(self, cfg: NicConfig):
        if not isinstance(cfg, NicConfig):
            raise TypeError(f"cfg must be a NicConfig, not {cfg!r}")
        self.cfg = cfg
        W = cfg.data_bytes
        super().__init__({
            "mmio": In(MmioSignature()),
            "dma_rd_req": Out(DmaReadReq()),
            "dma_rd_resp": In(DmaReadData(W)),
            "dma_wr": Out(DmaWrite(W)),
            "tx": Out(BeatStream(W)),
            "rx": In(BeatStream(W)),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        W = cfg.data_bytes

        m.submodules.context = context = Context(cfg)
        m.submodules.doorbells = doorbells = Doorbells(cfg)
        m.submodules.counters = counters = Counters()
        m.submodules.requester = req = Requester(cfg)
        m.submodules.responder = resp = Responder(cfg)
        m.submodules.completion = comp = Completion(cfg)
        m.submodules.packetizer = pktz = Packetizer(W)
        m.submodules.depacketizer = dpkt = Depacketizer(W, max_frame_bytes=cfg.mtu + 128)
        m.submodules.demux = demux = PacketDemux(W, cfg.n_qps)
        m.submodules.tx_arb = tx_arb = PacketArbiter(W, 2)
        m.submodules.dma = dma = DmaArbiter(W, n_read=3, n_write=3)

        # MMIO: every block sees the bus; the one addressed answers, the others give 0.
        buses = (context.bus, doorbells.bus, counters.bus)
        for bus in buses:
            m.d.comb += [bus.addr.eq(self.mmio.addr), bus.wdata.eq(self.mmio.wdata),
                         bus.we.eq(self.mmio.we), bus.re.eq(self.mmio.re)]
        m.d.comb += [self.mmio.rdata.eq(context.bus.rdata | doorbells.bus.rdata | counters.bus.rdata),
                     self.mmio.rvalid.eq(context.bus.rvalid)]

        node_id = context.node_id
        m.d.comb += [req.node_id.eq(node_id), resp.node_id.eq(node_id), demux.node_id.eq(node_id)]

        # Tables.
        wiring.connect(m, req.qp, context.qp_req)
        wiring.connect(m, resp.qp, context.qp_resp)
        wiring.connect(m, req.mr, context.mr_req)
        wiring.connect(m, resp.mr, context.mr_resp)
        wiring.connect(m, comp.cq, context.cq)
        wiring.connect(m, doorbells.bind, context.bind)

        # Events: broadcast, the engines are always ready.
        for dst in (req.qp_event, resp.qp_event):
            m.d.comb += [dst.valid.eq(context.qp_event.valid), dst.payload.eq(context.qp_event.payload)]
        m.d.comb += context.qp_event.ready.eq(1)
        wiring.connect(m, context.cq_event, comp.cq_event)
        wiring.connect(m, req.set_err, context.err_req)
        wiring.connect(m, resp.set_err, context.err_resp)

        # Doorbells.
        wiring.connect(m, doorbells.sq_db, req.db)
        wiring.connect(m, doorbells.rq_db, resp.rq_db)
        wiring.connect(m, doorbells.cq_db, comp.cq_db)

        # Completions.
        wiring.connect(m, req.cqe, comp.i0)
        wiring.connect(m, resp.cqe, comp.i1)

        # DMA.
        wiring.connect(m, req.wqe_rd, dma.rd[0])
        wiring.connect(m, req.pay_rd, dma.rd[1])
        wiring.connect(m, resp.dma_rd, dma.rd[2])
        wiring.connect(m, req.dma_wr, dma.wr[0])
        wiring.connect(m, resp.dma_wr, dma.wr[1])
        wiring.connect(m, comp.dma_wr, dma.wr[2])
        wiring.connect(m, dma.rd_req, wiring.flipped(self.dma_rd_req))
        wiring.connect(m, wiring.flipped(self.dma_rd_resp), dma.rd_resp)
        wiring.connect(m, dma.wr_out, wiring.flipped(self.dma_wr))

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
        inc = {
            Counter.TX_PACKETS: tx_fire & self.tx.payload.last,
            Counter.TX_BYTES: Mux(tx_fire, self.tx.payload.nbytes, 0),
            Counter.RX_PACKETS: dpkt.stat_ok,
            Counter.RX_BYTES: Mux(dpkt.stat_ok, dpkt.stat_bytes, 0),
            Counter.DMA_READS: dma.stat_rd,
            Counter.DMA_READ_BYTES: Mux(dma.stat_rd, dma.stat_rd_bytes, 0),
            Counter.DMA_WRITES: dma.stat_wr,
            Counter.DMA_WRITE_BYTES: Mux(dma.stat_wr, dma.stat_wr_bytes, 0),
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
        }
        for counter, value in inc.items():
            m.d.comb += counters.inc[counter].eq(value)
        return m
