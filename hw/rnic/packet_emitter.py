"""The requester's packet emitter: request headers and their payloads, store and forward.

Models the last stage of the RNIC's send engine (InfiniBand Architecture Specification vol. 1
rel. 1.4, 9.7.1 / 9.7.2: a request packet is its headers followed by at most one path MTU
of payload). The send FSM of :class:`~hw.rnic.requester.Requester` queues one descriptor per
request packet (``desc``: the packet's :data:`~hw.formats.PKT_META`, its QP and the tracker
slot of its message; a FIFO of ``cfg.desc_depth``) and asks the host for the packet's
payload with a DMA read whose data arrives on ``pay``. The emitter sends each header on
``tx.meta`` followed by its payload beats on ``tx.payload``.

Rules (the requester's "Deadlock freedom", rule 2):

* **Payload data always has a place.** The buffer holds ``cfg.pay_buffers`` MTUs of
  beats; the send FSM may issue a payload read only while ``res_fits`` says the buffer
  has room for the beats of ``res_len`` bytes besides what is already reserved, and says
  it issued it with ``res_take``; the room is freed as beats leave. So ``pay`` is never
  back-pressured.
* **Store and forward.** A header leaves only when its whole payload is in the buffer, so
  whoever takes it never waits on host memory in the middle of a packet.
* **One header ahead.** While a packet's payload leaves, the next packet's header (if its
  payload is stored and was read) is offered too, so that the packetizer, through the
  :class:`~hw.lib.arbiter.PacketArbiter`, takes it with the frame's last beat and frames
  follow back to back (before 2026-12-08 the header waited for the cycle after the last
  beat: three cycles per two-beat 8-byte WRITE frame). Payload beats leave in header order.
* **A payload the host failed to read is not sent.** The packet is dropped, its payload
  skipped, and its QP, tracker slot and PSN are offered on ``perr`` (held until taken; one
  at a time: a second failure waits) so that the response FSM fails the message with
  LOC_PROT_ERR and moves the QP to ERR (docs/errors.md).

Ports: ``desc`` ``In(stream(desc_layout))``, ``pay`` ``In(stream(dma_rd_data_layout(W)))``,
``res_len`` ``In(16)``, ``res_take`` ``In(1)``, ``res_fits`` ``Out(1)``, ``perr``
``Out(stream({qpn, slot, psn}))``, ``tx`` ``Out(PacketOut(W))``.
"""

from amaranth.hdl import Module, Signal, Cat, Mux
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2, exact_log2

from .. import formats
from ..config import NicConfig
from ..interfaces import PacketOut, beat_layout, dma_rd_data_layout

__all__ = ["PacketEmitter", "desc_layout", "perr_layout"]


def desc_layout(n_qps, max_outstanding):
    """One queued request packet: its header, its QP and its message's tracker slot."""
    return data.StructLayout({"meta": formats.PKT_META, "qpn": max(1, ceil_log2(n_qps)),
                              "slot": exact_log2(max_outstanding)})


def perr_layout(n_qps, max_outstanding):
    """A packet whose payload the host failed to read: its QP, message slot and PSN."""
    d = desc_layout(n_qps, max_outstanding)
    return data.StructLayout({"qpn": d["qpn"].shape, "slot": d["slot"].shape, "psn": 24})


class PacketEmitter(wiring.Component):
    """Header FIFO and payload buffer of the requester; sends each packet store and forward."""

    def __init__(self, cfg):
        if not isinstance(cfg, NicConfig):
            raise ValueError(f"cfg must be a hw.config.NicConfig, not {cfg!r}")
        self.cfg = cfg
        W = cfg.data_bytes
        #: payload buffer, beats: ``cfg.pay_buffers`` full packets
        self.pay_beats = cfg.pay_buffers * cfg.mtu // W
        self.desc_layout = desc_layout(cfg.n_qps, cfg.max_outstanding)
        perr = perr_layout(cfg.n_qps, cfg.max_outstanding)
        super().__init__({
            "desc": In(stream.Signature(self.desc_layout)),
            "pay": In(stream.Signature(dma_rd_data_layout(W))),
            "res_len": In(16),
            "res_take": In(1),
            "res_fits": Out(1),
            "perr": Out(stream.Signature(perr)),
            "tx": Out(PacketOut(W)),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        W = cfg.data_bytes
        pay_beats = self.pay_beats
        DESC = self.desc_layout

        m.submodules.desc = desc = SyncFIFOBuffered(width=DESC.size, depth=cfg.desc_depth)
        m.submodules.payf = payf = SyncFIFOBuffered(width=beat_layout(W).size, depth=pay_beats)
        # per packet in payf: did the host fail its payload read
        m.submodules.pay_err = pay_err = SyncFIFOBuffered(width=1, depth=pay_beats)
        m.d.comb += [desc.w_data.eq(self.desc.payload), desc.w_en.eq(self.desc.valid),
                     self.desc.ready.eq(desc.w_rdy)]

        # room reserved for every requested beat
        pay_res = Signal(range(pay_beats + 1))   # payload buffer beats requested, not yet sent
        seg_beats = Signal(range(pay_beats + 1))
        m.d.comb += seg_beats.eq((self.res_len + (W - 1)) >> exact_log2(W))
        m.d.comb += self.res_fits.eq(pay_res + seg_beats <= pay_beats)
        # the DMA data always has a reserved place: taken at once
        prd = self.pay
        m.d.comb += [
            payf.w_data.eq(Cat(prd.payload.data, prd.payload.nbytes, prd.payload.last)),
            payf.w_en.eq(prd.valid),
            prd.ready.eq(1),
            pay_err.w_data.eq(prd.payload.err),
            pay_err.w_en.eq(prd.valid & prd.payload.last),
        ]
        pay_pop = Signal()
        out = Signal(DESC)
        m.d.comb += out.eq(desc.r_data)
        out_meta = out.meta
        # store and forward: a header leaves only when its whole payload is in the buffer
        pkts_in = Signal(range(pay_beats + 1))
        pkt_done = Signal()
        m.d.sync += pkts_in.eq(pkts_in + (prd.valid & prd.payload.last) - pkt_done)
        out_ok = Signal()
        m.d.comb += out_ok.eq(desc.r_rdy & ((out_meta.paylen == 0) | ((pkts_in != 0) & pay_err.r_rdy)))
        # a packet whose payload the host failed to read is not sent: offered on perr
        perr_v = Signal()
        m.d.comb += self.perr.valid.eq(perr_v)
        with m.If(self.perr.valid & self.perr.ready):
            m.d.sync += perr_v.eq(0)
        bad_pay = (out_meta.paylen != 0) & pay_err.r_data
        ahead = Signal()     # in DATA: the next packet's header has gone, its payload follows
        with m.FSM(name="emit"):
            with m.State("META"):
                with m.If(out_ok & bad_pay):
                    with m.If(~perr_v):
                        m.d.comb += [desc.r_en.eq(1), pay_err.r_en.eq(1)]
                        m.d.sync += [perr_v.eq(1), self.perr.payload.qpn.eq(out.qpn),
                                     self.perr.payload.slot.eq(out.slot),
                                     self.perr.payload.psn.eq(out_meta.psn)]
                        m.next = "SKIP"
                with m.Else():
                    m.d.comb += [
                        self.tx.meta.valid.eq(out_ok),
                        self.tx.meta.payload.eq(out_meta),
                        desc.r_en.eq(self.tx.meta.ready & out_ok),
                        pay_err.r_en.eq(self.tx.meta.ready & out_ok & (out_meta.paylen != 0)),
                    ]
                    with m.If(out_ok & self.tx.meta.ready & (out_meta.paylen != 0)):
                        m.next = "DATA"
            with m.State("SKIP"):
                m.d.comb += [payf.r_en.eq(1), pay_pop.eq(payf.r_rdy)]
                with m.If(payf.r_rdy & payf.r_data[-1]):        # the beat with last
                    m.d.comb += pkt_done.eq(1)
                    m.next = "META"
            with m.State("DATA"):
                m.d.comb += [
                    self.tx.payload.valid.eq(payf.r_rdy),
                    self.tx.payload.payload.eq(payf.r_data),
                    payf.r_en.eq(self.tx.payload.ready),
                    pay_pop.eq(payf.r_rdy & self.tx.payload.ready),
                ]
                # the next header goes while this payload flows (one packet ahead), so that
                # the packetizer can take it with this frame's last beat; a failed one waits
                # for META (its payload is skipped there)
                offer = Signal()
                m.d.comb += [
                    offer.eq(~ahead & out_ok & ~bad_pay),
                    self.tx.meta.valid.eq(offer),
                    self.tx.meta.payload.eq(out_meta),
                    desc.r_en.eq(self.tx.meta.ready & offer),
                    pay_err.r_en.eq(self.tx.meta.ready & offer & (out_meta.paylen != 0)),
                ]
                took = offer & self.tx.meta.ready & (out_meta.paylen != 0)
                with m.If(pay_pop & self.tx.payload.payload.last):
                    m.d.comb += pkt_done.eq(1)
                    m.d.sync += ahead.eq(0)
                    with m.If(~ahead & ~took):
                        m.next = "META"
                with m.Elif(took):
                    m.d.sync += ahead.eq(1)
        m.d.sync += pay_res.eq(pay_res + Mux(self.res_take, seg_beats, 0) - pay_pop)
        return m
