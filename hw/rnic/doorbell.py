"""Doorbell registers on the MMIO bus.

Models the doorbell part of an RNIC's UAR pages (the "bfregs" of mlx5, see SMART,
ASPLOS 2024, section 3.1): ``n_doorbells`` 64-bit registers at ``DOORBELL_BASE + 8 * r``.
Writing a :data:`~hw.formats.DOORBELL` word to register *r* announces that QP ``qpn`` has
posted send WQEs up to producer index ``pi``. The driver binds every QP to one register
(``Cmd.BIND_DB``); a ring on a register the QP is not bound to is rejected and counted,
as a real NIC ignores a doorbell written to another process's UAR page.

Doorbell contention in the SMART sense is a property of the *host*: threads whose QPs share
a register serialise on the driver's spinlock around the register write. The register file
here provides what the host model needs for that: one register per binding, its last
value readable, and the count of rings.

Send doorbells are **coalesced per QP**, never dropped: the producer index in a ring is
absolute (free running), so a newer ring for a QP supersedes one not yet taken, as the
doorbell record of a real RNIC does. A valid ring writes the QP's latest ``pi`` (a memory of
``n_qps`` entries) and pushes its QPN on a ready queue of pending QPs
(:class:`~hw.lib.ready_queue.ReadyQueue`: each QP is in it at most once, so it never
overflows); the oldest is moved, with the QP's latest ``pi``, into the output register that
drives ``sq_db``. The consumer (the requester's send engine) takes doorbells only between
batches, so with many QPs ringing a queue of individual rings could fill up and lose the
last ring of a QP, whose posted work requests would then never be sent. QPs are served in
the order of their first pending ring; the events of one QP carry the ``pi`` of its rings in
ring order (rings that arrived while an earlier one was pending are skipped).

Also decoded here: the receive-queue doorbell (``RQ_DB``) and the CQ consumer-index
doorbell (``CQ_DB``), each queued in a 16-entry FIFO so that an MMIO write is never stalled
(their consumers, the responder and the completion engine, are always ready); a ring that
finds its FIFO full anyway is dropped and counted as rejected.

A send ring for a QP number >= ``n_qps`` or on a register the QP is not bound to is
rejected (``stat_reject``).

**BlueFlame** (mlx5; SMART section 3.1): a 64-byte write-combined write of a whole WQE to
BlueFlame register *r* (``bf``, from the MMIO front end) is a ring of register *r* for the
QP the WQE names (``qpn``) with producer index ``index + 1``, checked like an 8-byte ring;
if it is good, the WQE itself goes to the requester on ``sq_bf`` as well, so that the
requester can send it without fetching it (it still is in the host's send queue, and the
requester fetches it by DMA if it cannot use the copy).

The block sits behind two windows of the register map (``hw.regmap.register_map``):
``bus`` is the ``doorbells`` window (register *r* at relative address ``8 * r``), ``qbus``
the ``queue_doorbells`` window (``RQ_DB`` at 0, ``CQ_DB`` at 8).
"""

from amaranth import *
from amaranth.lib import wiring, stream, data, fifo, memory
from amaranth.lib.wiring import In, Out

from ..config import NicConfig
from .context import DB_INDEX_BITS
from .bf_buffer import SQ_BF
from ..formats import DOORBELL, WQE
from .mmio import BF_WRITE
from ..interfaces import MmioSignature, Lookup, DoorbellEvent
from ..lib.csr import window_addr_width
from ..lib.ready_queue import ReadyQueue
from ..regmap import BLUEFLAME_BASE, Reg
from amaranth.utils import ceil_log2

__all__ = ["Doorbells", "CQ_DB_LAYOUT"]

CQ_DB_LAYOUT = data.StructLayout({"cqn": 16, "ci": 16})
FIFO_DEPTH = NicConfig.doorbell_fifo_depth


class Doorbells(wiring.Component):
    """Ports: ``bus``, ``qbus`` (MMIO windows), ``bind`` (lookup of a QP's register), ``sq_db``, ``rq_db``,
    ``cq_db`` (event streams) and one-cycle pulses ``stat_ring`` / ``stat_reject``."""

    def __init__(self, cfg: NicConfig):
        self.cfg = cfg
        self.qpn_bits = max(1, ceil_log2(cfg.n_qps))
        super().__init__({
            "bus": In(MmioSignature(window_addr_width(8 * cfg.n_doorbells))),
            "qbus": In(MmioSignature(window_addr_width(16))),
            "bf": In(stream.Signature(BF_WRITE)),
            "sq_bf": Out(stream.Signature(SQ_BF, always_ready=True)),
            "bind": Out(Lookup(self.qpn_bits, DB_INDEX_BITS)),
            "sq_db": Out(DoorbellEvent()),
            "rq_db": Out(DoorbellEvent()),
            "cq_db": Out(stream.Signature(CQ_DB_LAYOUT)),
            "stat_ring": Out(1),
            "stat_reject": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        bus, qbus = self.bus, self.qbus
        addr = bus.addr & ~7
        word = DOORBELL(bus.wdata)
        qword = DOORBELL(qbus.wdata)

        regs = Array(Signal(64, name=f"db{r}") for r in range(cfg.n_doorbells))
        reg_index = Signal(range(max(2, cfg.n_doorbells)))
        in_db_range = Signal()
        # a BlueFlame write: the WQE names its QP and index
        bfw = WQE(self.bf.payload.data)
        bf_reg = Signal(range(max(2, cfg.n_doorbells)))
        bf_in_range = Signal()
        m.d.comb += [
            bf_in_range.eq(self.bf.payload.addr < BLUEFLAME_BASE + 64 * cfg.n_doorbells),
            bf_reg.eq((self.bf.payload.addr - BLUEFLAME_BASE) >> 6),
            self.bf.ready.eq(1),
        ]
        ring_qpn = Signal(24)
        ring_pi = Signal(16)
        ring_reg = Signal.like(reg_index)
        ring = Signal()                  # a send ring (8-byte doorbell or BlueFlame) this cycle
        m.d.comb += [
            in_db_range.eq(addr < 8 * cfg.n_doorbells),
            reg_index.eq(addr >> 3),
        ]
        with m.If(self.bf.valid):
            m.d.comb += [ring.eq(bf_in_range), ring_qpn.eq(bfw.qpn), ring_pi.eq(bfw.index + 1),
                         ring_reg.eq(bf_reg)]
        with m.Else():
            m.d.comb += [ring.eq(bus.we & in_db_range), ring_qpn.eq(word.qpn), ring_pi.eq(word.pi),
                         ring_reg.eq(reg_index)]
        m.d.comb += self.bind.index.eq(ring_qpn)

        fifos = {}
        for name, layout in (("rq", self.rq_db.payload.shape()), ("cq", CQ_DB_LAYOUT)):
            f = fifos[name] = fifo.SyncFIFOBuffered(width=Shape.cast(layout).width, depth=cfg.doorbell_fifo_depth)
            m.submodules[f"{name}_fifo"] = f
            out = getattr(self, f"{name}_db")
            m.d.comb += [out.valid.eq(f.r_rdy), out.payload.eq(f.r_data), f.r_en.eq(out.ready)]

        # ---- send doorbells: the latest pi of each QP, a queue of QPs with a ring pending,
        # and the output register (stable while offered)
        nq = cfg.n_qps
        qb = self.qpn_bits
        m.submodules.sq_pi = sq_pi = memory.Memory(shape=16, depth=nq, init=[])
        pi_wr = sq_pi.write_port()
        pi_rd = sq_pi.read_port(domain="comb")
        m.submodules.sq_queue = sq_q = ReadyQueue(nq)
        out_v = Signal()
        out_q = Signal(qb)
        out_pi = Signal(16)
        m.d.comb += [
            self.sq_db.valid.eq(out_v),
            self.sq_db.payload.qpn.eq(out_q),
            self.sq_db.payload.pi.eq(out_pi),
        ]
        # a ring of the QP being loaded this cycle queues it again (its pi is newer)
        load = Signal()
        head = sq_q.pop.payload.index
        m.d.comb += [
            load.eq(sq_q.pop.valid & (~out_v | self.sq_db.ready)),
            sq_q.pop.ready.eq(load),
            pi_rd.addr.eq(head),
        ]
        with m.If(load):
            m.d.sync += [out_v.eq(1), out_q.eq(head), out_pi.eq(pi_rd.data)]
        with m.Elif(self.sq_db.ready):
            m.d.sync += out_v.eq(0)

        push_ok = Signal()
        reject = Signal()
        m.d.comb += [self.stat_ring.eq(push_ok), self.stat_reject.eq(reject)]

        with m.If(ring):
            q = ring_qpn[:qb]
            good = (ring_qpn < nq) & (self.bind.data == ring_reg)
            with m.If(good):
                # the QP enters the queue unless it is there already
                m.d.comb += [pi_wr.addr.eq(q), pi_wr.data.eq(ring_pi), pi_wr.en.eq(1),
                             push_ok.eq(1), sq_q.push[0].valid.eq(1),
                             sq_q.push[0].payload.index.eq(q)]
                # the WQE of a good BlueFlame write goes to the requester too
                m.d.comb += [self.sq_bf.valid.eq(self.bf.valid),
                             self.sq_bf.payload.qpn.eq(ring_qpn),
                             self.sq_bf.payload.wqe.eq(bfw)]
            with m.Else():
                m.d.comb += reject.eq(1)
        with m.Elif(self.bf.valid):
            m.d.comb += reject.eq(1)          # outside the BlueFlame registers
        with m.If(bus.we & in_db_range):
            m.d.sync += regs[reg_index].eq(bus.wdata)
        qaddr = qbus.addr & ~7
        with m.If(qbus.we):
            with m.If(qaddr == Reg.RQ_DB - Reg.RQ_DB):
                with m.If((qword.qpn < cfg.n_qps) & fifos["rq"].w_rdy):
                    m.d.comb += [fifos["rq"].w_en.eq(1), fifos["rq"].w_data.eq(Cat(qword.qpn, qword.pi))]
                with m.Else():
                    m.d.comb += reject.eq(1)
            with m.Elif(qaddr == Reg.CQ_DB - Reg.RQ_DB):
                with m.If((qword.qpn < cfg.n_cqs) & fifos["cq"].w_rdy):
                    m.d.comb += [fifos["cq"].w_en.eq(1), fifos["cq"].w_data.eq(Cat(qbus.wdata[0:16], qword.pi))]
                with m.Else():
                    m.d.comb += reject.eq(1)

        m.d.sync += [qbus.rvalid.eq(qbus.re), qbus.rdata.eq(0)]
        m.d.sync += [bus.rvalid.eq(bus.re), bus.rdata.eq(0)]
        with m.If(bus.re & in_db_range):
            m.d.sync += bus.rdata.eq(regs[reg_index])
        return m
