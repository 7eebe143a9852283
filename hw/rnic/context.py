"""Context tables and the command interface of the RNIC (the driver's control path).

Models the part of an RNIC that the driver programs through its command queue (mlx5's
``CREATE_QP`` / ``MODIFY_QP`` / ``CREATE_CQ`` / ``CREATE_MKEY`` commands, here reduced to one
command register and eight argument words, see :mod:`hw.regmap`):

* the QP context table (static part, :data:`~hw.regmap.QP_CTX`): in host memory (ICM),
  behind the QP-context cache (:mod:`hw.ctx.qp_cache`); ``SET_QP`` writes the context into
  that cache (``qp_wr``); and the state of every QP (on chip), with the modify-QP state machine of the InfiniBand Architecture Specification vol. 1
  rel. 1.4, section 10.3.1 (RESET, INIT, RTR, RTS, ERR; SQD/SQE not modelled): an illegal
  transition is refused with ``CmdStatus.BAD_TRANSITION`` and changes nothing, and
  ``SET_QP`` on a QP that is not in RESET with ``CmdStatus.BAD_STATE`` (a permanent refusal;
  ``BUSY`` means "in progress, poll again" and is never returned, every command taking
  effect in one cycle);
* the CQ context table (:data:`~hw.regmap.CQ_CTX`): in host memory (ICM) too, behind the
  CQ-context cache (:mod:`hw.ctx.cq_cache`); ``SET_CQ`` writes the context into that cache
  (``cq_wr``) and restarts the CQ's indices (``cq_event``);
* the memory-region table (:data:`~hw.formats.MR_ENTRY`, IBA 10.6): base, length, key,
  protection domain and access rights, checked by requester and responder on every access.
  It lives in host memory (ICM), mapped by ``MAP_ICM``, behind the MR cache
  (:mod:`hw.ctx.mr_cache`): ``SET_MR`` writes the entry into the cache (``mr_wr``), which
  writes it back to ICM when it evicts it. ``SET_MR`` (``SET_CQ``) before the ``MAP_ICM`` of
  its table is refused with ``BAD_STATE``, and so is a second ``MAP_ICM`` of a table (it does
  not move under a live cache);
* the QP-to-doorbell-register binding used by :mod:`hw.rnic.doorbell`.

The QP states and the doorbell-binding table are memories with combinational read ports,
one per consumer. A command takes effect in the cycle the ``CMD`` register is
written, except ``SET_QP``, ``SET_MR`` and ``SET_CQ``: ``CMD`` reads ``BUSY`` until the
QP-context (MR, CQ-context) cache has taken the entry (the driver polls, as for mlx5's
command ownership bit). Each of the three needs its table mapped first (``MAP_ICM``, else
``BAD_STATE``). A command written while
``CMD`` reads ``BUSY`` is ignored (the driver must wait for the previous one). Accepted
modify-QP commands, and QPs forced to ERR by the requester or responder, are broadcast on
``qp_event`` so that both engines reset their per-QP state; the event of ``SET_QP``
(``new``) carries the QP's receive queue (base, log2 size) for the responder's receive-WQE
prefetch and the size of its send queue for the requester's doorbell check.
"""

from amaranth import *
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from ..config import NicConfig
from ..formats import MR_ENTRY, QpState
from ..lib.mem_array import MemArray
from ..interfaces import (MmioSignature, Lookup, QP_LOOKUP, QpEvent, CqEvent, QpErrRequest)
from ..lib.csr import window_addr_width
from ..regmap import (CONTROL_BYTES, Reg, Cmd, CmdStatus, IcmTable, QP_CTX, CQ_CTX, ARG_BASE,
                     ARG_WORDS, ID_VALUE, LEGAL_TRANSITIONS)

__all__ = ["Context", "DB_INDEX_BITS"]

DB_INDEX_BITS = 10


def _bits(n):
    return max(1, ceil_log2(n))


class Context(wiring.Component):
    """QP / CQ / MR / doorbell-binding tables behind the MMIO command interface.

    Ports
    -----
    bus : In(MmioSignature(8))     ID, NODE_ID, CMD, ARG registers (the ``control`` window of
                                   ``hw.regmap.register_map``, at address 0).
    node_id : Out(8)
    qp_resp : In(Lookup)           QP state (combinational): the responder's.
    qp_wr : Out(stream)            SET_QP: {slot, entry} into the QP-context cache.
    icm_qp_base : Out(64)          host address of the QP context table (MAP_ICM).
    mr_wr : Out(stream)            SET_MR: {slot, entry} into the MR cache.
    icm_mr_base : Out(64)          host address of the MR table (MAP_ICM).
    cq_wr : Out(stream)            SET_CQ: {slot, entry} into the CQ-context cache.
    icm_cq_base : Out(64)          host address of the CQ context table (MAP_ICM).
    bind : In(Lookup)              doorbell register bound to a QP.
    qp_event : Out(QpEvent)        consumers must always be ready.
    cq_event : Out(CqEvent)        consumers must always be ready.
    err_req, err_resp, err_cq : In(QpErrRequest)  move a QP to ERR (requester, responder,
                                   completion engine: its CQ is in error).
    """

    def __init__(self, cfg: NicConfig):
        if not isinstance(cfg, NicConfig):
            raise TypeError(f"cfg must be a NicConfig, not {cfg!r}")
        self.cfg = cfg
        self.qpn_bits = _bits(cfg.n_qps)
        self.cqn_bits = _bits(cfg.n_cqs)
        self.mr_bits = _bits(cfg.n_mrs)
        super().__init__({
            "bus": In(MmioSignature(window_addr_width(CONTROL_BYTES))),
            "node_id": Out(8),
            "qp_resp": In(Lookup(self.qpn_bits, QP_LOOKUP)),
            "qp_wr": Out(stream.Signature(data.StructLayout({
                "slot": self.qpn_bits, "entry": QP_CTX}))),
            "icm_qp_base": Out(64),
            "mr_wr": Out(stream.Signature(data.StructLayout({
                "slot": self.mr_bits, "entry": MR_ENTRY}))),
            "icm_mr_base": Out(64),
            "cq_wr": Out(stream.Signature(data.StructLayout({
                "slot": self.cqn_bits, "entry": CQ_CTX}))),
            "icm_cq_base": Out(64),
            "bind": In(Lookup(self.qpn_bits, DB_INDEX_BITS)),
            "qp_event": Out(QpEvent()),
            "cq_event": Out(CqEvent()),
            "err_req": In(QpErrRequest()),
            "err_resp": In(QpErrRequest()),
            "err_cq": In(QpErrRequest()),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg

        m.submodules.bind_mem = bind_mem = memory.Memory(
            shape=DB_INDEX_BITS, depth=cfg.n_qps, init=[])
        bind_wr = bind_mem.write_port()

        # QP states: a memory whose valid bits a reset clears (every QP back to RESET) with
        # one write port (a command or an error request, never both in one cycle) and a read
        # port per index read below (hw/lib/mem_array.py)
        m.submodules.states = states = MemArray(cfg.n_qps, QpState, ("w",),
                                                ("resp", "cmd", "err"))
        st_wr = states.w

        # Combinational lookups.
        m.d.comb += self.qp_resp.data.state.eq(states[self.qp_resp.index])
        # request / response: the index is latched, the answer is the table's entry there
        # while it is offered (so a SET_QP between request and answer is seen)
        rp = bind_mem.read_port(domain="comb")
        m.d.comb += [rp.addr.eq(self.bind.index), self.bind.data.eq(rp.data)]

        # MMIO registers.
        node_id = Signal(8)
        args = Signal(64 * ARG_WORDS)
        status = Signal(8)
        m.d.comb += self.node_id.eq(node_id)
        addr = self.bus.addr & ~7
        m.d.sync += [self.bus.rvalid.eq(self.bus.re), self.bus.rdata.eq(0)]
        with m.If(self.bus.re):
            with m.Switch(addr):
                with m.Case(Reg.ID):
                    m.d.sync += self.bus.rdata.eq(ID_VALUE)
                with m.Case(Reg.NODE_ID):
                    m.d.sync += self.bus.rdata.eq(node_id)
                with m.Case(Reg.CMD):
                    m.d.sync += self.bus.rdata.eq(status)
                for i in range(ARG_WORDS):
                    with m.Case(ARG_BASE + 8 * i):
                        m.d.sync += self.bus.rdata.eq(args.word_select(i, 64))

        cmd_go = Signal()
        def table_writer(name, wr, icm_base, slot_bits, layout):
            """A context table in ICM behind a cache (MR, CQ): whether it is mapped, its
            ICM address, and the entry a SET_MR / SET_CQ offers on ``wr`` (``pend``) while
            CMD reads BUSY, until the cache takes it."""
            pend, mapped = Signal(name=f"{name}_pend"), Signal(name=f"{name}_mapped")
            base, slot = Signal(64, name=f"{name}_base"), Signal(slot_bits, name=f"{name}_slot")
            entry = Signal(layout, name=f"{name}_entry")
            m.d.comb += [wr.valid.eq(pend), wr.payload.slot.eq(slot),
                         wr.payload.entry.eq(entry), icm_base.eq(base)]
            with m.If(wr.valid & wr.ready):
                m.d.sync += [pend.eq(0), status.eq(CmdStatus.OK)]
            return pend, mapped, base, slot, entry

        mr_pend, mr_mapped, mr_base, mr_slot, mr_entry = table_writer(
            "mr", self.mr_wr, self.icm_mr_base, self.mr_bits, MR_ENTRY)
        cq_pend, cq_mapped, cq_base, cq_slot, cq_entry = table_writer(
            "cq", self.cq_wr, self.icm_cq_base, self.cqn_bits, CQ_CTX)
        qp_pend, qp_mapped, qp_base, qp_slot, qp_entry = table_writer(
            "qp", self.qp_wr, self.icm_qp_base, self.qpn_bits, QP_CTX)
        with m.If(self.bus.we):
            with m.Switch(addr):
                with m.Case(Reg.NODE_ID):
                    m.d.sync += node_id.eq(self.bus.wdata)
                with m.Case(Reg.CMD):
                    m.d.comb += cmd_go.eq(~mr_pend & ~cq_pend & ~qp_pend)
                for i in range(ARG_WORDS):
                    with m.Case(ARG_BASE + 8 * i):
                        m.d.sync += args.word_select(i, 64).eq(self.bus.wdata)

        # Command decode.
        opcode = self.bus.wdata[0:8]
        index = self.bus.wdata[16:32]
        qp_args = QP_CTX(args[:QP_CTX.size])
        cq_args = CQ_CTX(args[:CQ_CTX.size])
        mr_args = MR_ENTRY(args[:MR_ENTRY.size])
        new_state = Signal(3)
        m.d.comb += new_state.eq(args[0:3])
        cur_state = Signal(QpState)
        m.d.comb += cur_state.eq(states[index[:self.qpn_bits]])

        legal = Signal()
        valid_state = Signal()
        m.d.comb += valid_state.eq(Cat(*[new_state == s.value for s in QpState]).any())
        with m.Switch(Cat(new_state, cur_state.as_value())):
            for cur, new in sorted(LEGAL_TRANSITIONS):
                with m.Case(QpState[new].value | (QpState[cur].value << 3)):
                    m.d.comb += legal.eq(1)

        m.d.comb += [bind_wr.addr.eq(index), bind_wr.data.eq(args[:DB_INDEX_BITS])]

        # One event source per cycle: a command wins, then the error requests.
        ev = self.qp_event
        m.d.sync += [ev.valid.eq(0), self.cq_event.valid.eq(0)]
        cmd_event = Signal()

        with m.If(cmd_go):
            m.d.sync += status.eq(CmdStatus.OK)
            with m.Switch(opcode):
                with m.Case(Cmd.NOP):
                    pass
                with m.Case(Cmd.SET_QP):
                    with m.If(index >= cfg.n_qps):
                        m.d.sync += status.eq(CmdStatus.BAD_INDEX)
                    with m.Elif((cur_state != QpState.RESET) | ~qp_mapped):
                        # a permanent refusal, not "try again": the QP must be reset first
                        # (and its table mapped)
                        m.d.sync += status.eq(CmdStatus.BAD_STATE)
                    with m.Elif((qp_args.sq_log_size > 15) | (qp_args.rq_log_size > 15) |
                                (qp_args.send_cq >= cfg.n_cqs) | (qp_args.recv_cq >= cfg.n_cqs) |
                                (qp_args.max_rd_atomic > 16)):
                        m.d.sync += status.eq(CmdStatus.BAD_VALUE)
                    with m.Else():
                        # A (re)created QP: the engines forget everything about its number.
                        # The context goes into the QP-context cache (BUSY until taken);
                        # the QP is in RESET meanwhile, so no engine uses it.
                        m.d.comb += cmd_event.eq(1)
                        m.d.sync += [qp_pend.eq(1), qp_slot.eq(index), qp_entry.eq(qp_args),
                                     status.eq(CmdStatus.BUSY),
                                     ev.valid.eq(1), ev.payload.qpn.eq(index),
                                     ev.payload.state.eq(QpState.RESET),
                                     ev.payload.sq_psn.eq(0), ev.payload.rq_psn.eq(0),
                                     ev.payload.rq_base.eq(qp_args.rq_base),
                                     ev.payload.rq_log.eq(qp_args.rq_log_size),
                                     ev.payload.new.eq(1),
                                     ev.payload.sq_log.eq(qp_args.sq_log_size)]
                with m.Case(Cmd.MODIFY_QP):
                    with m.If(index >= cfg.n_qps):
                        m.d.sync += status.eq(CmdStatus.BAD_INDEX)
                    with m.Elif(~valid_state):
                        m.d.sync += status.eq(CmdStatus.BAD_VALUE)
                    with m.Elif(~legal):
                        m.d.sync += status.eq(CmdStatus.BAD_TRANSITION)
                    with m.Else():
                        m.d.comb += [st_wr.en.eq(1), st_wr.addr.eq(index[:self.qpn_bits]),
                                     st_wr.data.eq(new_state)]
                        m.d.sync += [
                            ev.valid.eq(1),
                            ev.payload.new.eq(0),
                            ev.payload.qpn.eq(index),
                            ev.payload.state.eq(new_state),
                            ev.payload.sq_psn.eq(args[64:88]),
                            ev.payload.rq_psn.eq(args[88:112]),
                            # the receive queue is not named: the prefetch keeps its own
                            ev.payload.rq_base.eq(0), ev.payload.rq_log.eq(0),
                        ]
                        m.d.comb += cmd_event.eq(1)
                with m.Case(Cmd.SET_CQ):
                    with m.If(index >= cfg.n_cqs):
                        m.d.sync += status.eq(CmdStatus.BAD_INDEX)
                    with m.Elif(cq_args.log_size > 16):
                        m.d.sync += status.eq(CmdStatus.BAD_VALUE)
                    with m.Elif(~cq_mapped):
                        m.d.sync += status.eq(CmdStatus.BAD_STATE)
                    with m.Else():
                        m.d.sync += [cq_pend.eq(1), cq_slot.eq(index), cq_entry.eq(cq_args),
                                     status.eq(CmdStatus.BUSY),
                                     self.cq_event.valid.eq(1), self.cq_event.payload.cqn.eq(index)]
                with m.Case(Cmd.SET_MR):
                    with m.If(index >= cfg.n_mrs):
                        m.d.sync += status.eq(CmdStatus.BAD_INDEX)
                    with m.Elif(((mr_args.key >> 8) & (cfg.n_mrs - 1)) != index):
                        m.d.sync += status.eq(CmdStatus.BAD_VALUE)
                    with m.Elif(~mr_mapped):
                        m.d.sync += status.eq(CmdStatus.BAD_STATE)
                    with m.Else():
                        m.d.sync += [mr_pend.eq(1), mr_slot.eq(index), mr_entry.eq(mr_args),
                                     status.eq(CmdStatus.BUSY)]
                with m.Case(Cmd.MAP_ICM):
                    with m.If((index != IcmTable.MR) & (index != IcmTable.CQ)
                              & (index != IcmTable.QP)):
                        m.d.sync += status.eq(CmdStatus.BAD_INDEX)
                    with m.Elif(args[:12] != 0):
                        m.d.sync += status.eq(CmdStatus.BAD_VALUE)
                    with m.Elif(Mux(index == IcmTable.MR, mr_mapped,
                                    Mux(index == IcmTable.CQ, cq_mapped, qp_mapped))):
                        m.d.sync += status.eq(CmdStatus.BAD_STATE)
                    with m.Elif(index == IcmTable.MR):
                        m.d.sync += [mr_mapped.eq(1), mr_base.eq(args[:64])]
                    with m.Elif(index == IcmTable.CQ):
                        m.d.sync += [cq_mapped.eq(1), cq_base.eq(args[:64])]
                    with m.Else():
                        m.d.sync += [qp_mapped.eq(1), qp_base.eq(args[:64])]
                with m.Case(Cmd.BIND_DB):
                    with m.If(index >= cfg.n_qps):
                        m.d.sync += status.eq(CmdStatus.BAD_INDEX)
                    with m.Elif(args[:64] >= cfg.n_doorbells):
                        m.d.sync += status.eq(CmdStatus.BAD_VALUE)
                    with m.Else():
                        m.d.comb += bind_wr.en.eq(1)
                with m.Default():
                    m.d.sync += status.eq(CmdStatus.BAD_OPCODE)

        # Error requests from the engines: QP to ERR, broadcast the event.
        # A QP already in ERR (or RESET) takes no event: its engines have been told.
        err_qpn = Signal(24)
        m.d.comb += err_qpn.eq(Mux(self.err_req.valid, self.err_req.payload.qpn,
                                   Mux(self.err_resp.valid, self.err_resp.payload.qpn,
                                       self.err_cq.payload.qpn)))
        with m.If(~cmd_event):
            with m.If(self.err_req.valid):
                m.d.comb += self.err_req.ready.eq(1)
            with m.Elif(self.err_resp.valid):
                m.d.comb += self.err_resp.ready.eq(1)
            with m.Elif(self.err_cq.valid):
                m.d.comb += self.err_cq.ready.eq(1)
            any_err = self.err_req.valid | self.err_resp.valid | self.err_cq.valid
            state = states[err_qpn[:self.qpn_bits]]
            with m.If(any_err & (err_qpn < cfg.n_qps) & (state != QpState.ERR)
                      & (state != QpState.RESET)):
                m.d.comb += [st_wr.en.eq(1), st_wr.addr.eq(err_qpn[:self.qpn_bits]),
                             st_wr.data.eq(QpState.ERR)]
                m.d.sync += [ev.valid.eq(1), ev.payload.qpn.eq(err_qpn),
                             ev.payload.state.eq(QpState.ERR), ev.payload.new.eq(0)]
        m.d.comb += states.read_addrs()
        return m
