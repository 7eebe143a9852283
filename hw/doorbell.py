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
``n_qps`` entries) and, if the QP has no ring pending yet, appends its QPN to a queue of
pending QPs (each QP is in it at most once, so ``n_qps + 1`` entries never overflow); the
head of that queue is moved, with the QP's latest ``pi``, into the output register that
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
"""

from amaranth import *
from amaranth.lib import wiring, stream, data, fifo, memory
from amaranth.lib.wiring import In, Out

from .config import NicConfig
from .context import DB_INDEX_BITS
from .formats import DOORBELL
from .interfaces import MmioSignature, Lookup, DoorbellEvent
from .regmap import Reg, DOORBELL_BASE
from amaranth.utils import ceil_log2

__all__ = ["Doorbells", "CQ_DB_LAYOUT"]

CQ_DB_LAYOUT = data.StructLayout({"cqn": 16, "ci": 16})
FIFO_DEPTH = 16


class Doorbells(wiring.Component):
    """Ports: ``bus`` (MMIO), ``bind`` (lookup of a QP's register), ``sq_db``, ``rq_db``,
    ``cq_db`` (event streams) and one-cycle pulses ``stat_ring`` / ``stat_reject``."""

    def __init__(self, cfg: NicConfig):
        self.cfg = cfg
        self.qpn_bits = max(1, ceil_log2(cfg.n_qps))
        super().__init__({
            "bus": In(MmioSignature()),
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
        bus = self.bus
        addr = bus.addr & ~7
        word = DOORBELL(bus.wdata)

        regs = Array(Signal(64, name=f"db{r}") for r in range(cfg.n_doorbells))
        reg_index = Signal(range(max(2, cfg.n_doorbells)))
        in_db_range = Signal()
        m.d.comb += [
            in_db_range.eq((addr >= DOORBELL_BASE) & (addr < DOORBELL_BASE + 8 * cfg.n_doorbells)),
            reg_index.eq((addr - DOORBELL_BASE) >> 3),
            self.bind.index.eq(word.qpn),
        ]

        fifos = {}
        for name, layout in (("rq", self.rq_db.payload.shape()), ("cq", CQ_DB_LAYOUT)):
            f = fifos[name] = fifo.SyncFIFOBuffered(width=Shape.cast(layout).width, depth=FIFO_DEPTH)
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
        m.submodules.sq_fifo = sq_q = fifo.SyncFIFO(width=qb, depth=nq + 1)
        pend = Signal(nq)                   # QP is in sq_q
        out_v = Signal()
        out_q = Signal(qb)
        out_pi = Signal(16)
        m.d.comb += [
            self.sq_db.valid.eq(out_v),
            self.sq_db.payload.qpn.eq(out_q),
            self.sq_db.payload.pi.eq(out_pi),
        ]
        load = Signal()
        m.d.comb += [
            load.eq(sq_q.r_rdy & (~out_v | self.sq_db.ready)),
            sq_q.r_en.eq(load),
            pi_rd.addr.eq(sq_q.r_data),
        ]
        pend_clr = Signal(nq)
        pend_set = Signal(nq)
        with m.If(load):
            m.d.comb += pend_clr.eq(Const(1, nq) << sq_q.r_data)
            m.d.sync += [out_v.eq(1), out_q.eq(sq_q.r_data), out_pi.eq(pi_rd.data)]
        with m.Elif(self.sq_db.ready):
            m.d.sync += out_v.eq(0)
        m.d.sync += pend.eq((pend & ~pend_clr) | pend_set)

        push_ok = Signal()
        reject = Signal()
        m.d.comb += [self.stat_ring.eq(push_ok), self.stat_reject.eq(reject)]

        with m.If(bus.we):
            with m.If(in_db_range):
                m.d.sync += regs[reg_index].eq(bus.wdata)
                q = word.qpn[:qb]
                good = (word.qpn < nq) & (self.bind.data == reg_index)
                with m.If(good):
                    # the QP enters the queue unless it is there already (and not leaving it
                    # this very cycle); the queue has room for every QP, so sq_q.w_rdy holds
                    m.d.comb += [pi_wr.addr.eq(q), pi_wr.data.eq(word.pi), pi_wr.en.eq(1),
                                 push_ok.eq(1), pend_set.eq(Const(1, nq) << q)]
                    with m.If(~pend.bit_select(q, 1) | (load & (sq_q.r_data == q))):
                        m.d.comb += [sq_q.w_en.eq(1), sq_q.w_data.eq(q)]
                with m.Else():
                    m.d.comb += reject.eq(1)
            with m.Elif(addr == Reg.RQ_DB):
                with m.If((word.qpn < cfg.n_qps) & fifos["rq"].w_rdy):
                    m.d.comb += [fifos["rq"].w_en.eq(1), fifos["rq"].w_data.eq(Cat(word.qpn, word.pi))]
                with m.Else():
                    m.d.comb += reject.eq(1)
            with m.Elif(addr == Reg.CQ_DB):
                with m.If((word.qpn < cfg.n_cqs) & fifos["cq"].w_rdy):
                    m.d.comb += [fifos["cq"].w_en.eq(1), fifos["cq"].w_data.eq(Cat(bus.wdata[0:16], word.pi))]
                with m.Else():
                    m.d.comb += reject.eq(1)

        m.d.sync += [bus.rvalid.eq(bus.re), bus.rdata.eq(0)]
        with m.If(bus.re & in_db_range):
            m.d.sync += bus.rdata.eq(regs[reg_index])
        return m
