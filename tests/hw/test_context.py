"""Unit tests of the context tables and the command interface (hw/rnic/context.py)."""

import itertools

import pytest
from amaranth.sim import Simulator

from hw.config import NicConfig
from hw.rnic.context import Context
from hw.formats import MR_ENTRY, QpState, Access
from hw.regmap import (Reg, Cmd, CmdStatus, QP_CTX, CQ_CTX, ARG_BASE, ID_VALUE,
                       LEGAL_TRANSITIONS, IcmTable)

from .mmio_bus import mmio_read, mmio_write

CFG = NicConfig(data_bytes=8, n_qps=4, n_cqs=4, n_mrs=4, n_doorbells=4)


def layout_int(layout, **fields):
    value = 0
    for name, v in fields.items():
        value |= int(v) << layout[name].offset
    return value


async def command(ctx, bus, op, index, arg_value=0):
    for i in range(8):
        await mmio_write(ctx, bus, ARG_BASE + 8 * i, (arg_value >> (64 * i)) & (2**64 - 1))
    await mmio_write(ctx, bus, Reg.CMD, int(op) | (index << 16))
    return await mmio_read(ctx, bus, Reg.CMD)


async def written_into_cache(ctx, bus, wr, op, index, value):
    """A SET_QP / SET_CQ that is accepted: CMD reads BUSY (a command meanwhile is ignored)
    while ``wr`` offers {index, value} to the cache, OK once the cache takes it."""
    assert await command(ctx, bus, op, index, value) == CmdStatus.BUSY
    assert ctx.get(wr.valid) == 1 and ctx.get(wr.payload.slot) == index
    assert ctx.get(wr.payload.entry.as_value()) == value
    assert await command(ctx, bus, Cmd.NOP, 0) == CmdStatus.BUSY      # ignored meanwhile
    ctx.set(wr.ready, 1)
    await ctx.tick()
    ctx.set(wr.ready, 0)
    assert ctx.get(wr.valid) == 0
    assert await mmio_read(ctx, bus, Reg.CMD) == CmdStatus.OK


def run(dut, tb):
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()


def test_registers_and_tables():
    dut = Context(CFG)
    events = []

    async def tb(ctx):
        bus = dut.bus
        assert await mmio_read(ctx, bus, Reg.ID) == ID_VALUE
        await mmio_write(ctx, bus, Reg.NODE_ID, 5)
        assert ctx.get(dut.node_id) == 5
        qp = layout_int(QP_CTX, sq_base=0x1000, rq_base=0x2000, sq_log_size=4, rq_log_size=3,
                        send_cq=1, recv_cq=2, pd=7, dest_qpn=0x123, dest_node=1,
                        access=int(Access.REMOTE_READ.value), max_rd_atomic=16)
        # QP contexts live in ICM: SET_QP needs the table mapped, then reads BUSY until the
        # QP-context cache takes the context (a command meanwhile is ignored)
        assert await command(ctx, bus, Cmd.SET_QP, 2, qp) == CmdStatus.BAD_STATE
        assert ctx.get(dut.qp_wr.valid) == 0
        assert await command(ctx, bus, Cmd.MAP_ICM, IcmTable.QP, 0x50_0000) == CmdStatus.OK
        assert ctx.get(dut.icm_qp_base) == 0x50_0000
        assert await command(ctx, bus, Cmd.MAP_ICM, IcmTable.QP, 0x60_0000) == CmdStatus.BAD_STATE
        await written_into_cache(ctx, bus, dut.qp_wr, Cmd.SET_QP, 2, qp)
        ctx.set(dut.qp_resp.index, 2)
        ctx.set(dut.qp_resp.index, 1)
        assert ctx.get(dut.qp_resp.data).state == QpState.RESET
        assert ctx.get(dut.qp_resp.data).state == QpState.RESET
        # Bad values are refused and change nothing.
        assert await command(ctx, bus, Cmd.SET_QP, 4, qp) == CmdStatus.BAD_INDEX
        bad = layout_int(QP_CTX, send_cq=CFG.n_cqs)
        assert await command(ctx, bus, Cmd.SET_QP, 1, bad) == CmdStatus.BAD_VALUE
        assert ctx.get(dut.qp_wr.valid) == 0
        assert await command(ctx, bus, 0x77, 0) == CmdStatus.BAD_OPCODE
        # MR: the table lives in ICM, mapped once; the key must name the slot.
        mr = layout_int(MR_ENTRY, base=0x4000, length=0x100, key=(3 << 8) | 0x5A, pd=7,
                        access=15, valid=1)
        assert await command(ctx, bus, Cmd.SET_MR, 3, mr) == CmdStatus.BAD_STATE
        assert ctx.get(dut.mr_wr.valid) == 0
        assert await command(ctx, bus, Cmd.MAP_ICM, 3, 0x10_0000) == CmdStatus.BAD_INDEX
        assert await command(ctx, bus, Cmd.MAP_ICM, IcmTable.MR, 0x10_0800) == CmdStatus.BAD_VALUE
        assert await command(ctx, bus, Cmd.MAP_ICM, IcmTable.MR, 0x10_0000) == CmdStatus.OK
        assert ctx.get(dut.icm_mr_base) == 0x10_0000
        assert await command(ctx, bus, Cmd.MAP_ICM, IcmTable.MR, 0x20_0000) == CmdStatus.BAD_STATE
        assert ctx.get(dut.icm_mr_base) == 0x10_0000
        # SET_MR reads BUSY until the MR cache takes the entry; a command meanwhile is ignored
        assert await command(ctx, bus, Cmd.SET_MR, 3, mr) == CmdStatus.BUSY
        assert ctx.get(dut.mr_wr.valid) == 1
        assert ctx.get(dut.mr_wr.payload.slot) == 3
        assert ctx.get(dut.mr_wr.payload.entry.as_value()) == mr
        assert await command(ctx, bus, Cmd.BIND_DB, 1, 2) == CmdStatus.BUSY
        ctx.set(dut.bind.index, 1)
        assert ctx.get(dut.bind.data) == 0
        ctx.set(dut.mr_wr.ready, 1)
        await ctx.tick()
        ctx.set(dut.mr_wr.ready, 0)
        assert ctx.get(dut.mr_wr.valid) == 0
        assert await mmio_read(ctx, bus, Reg.CMD) == CmdStatus.OK
        assert await command(ctx, bus, Cmd.SET_MR, 2, mr) == CmdStatus.BAD_VALUE
        assert await command(ctx, bus, Cmd.SET_MR, 4, mr) == CmdStatus.BAD_INDEX
        assert ctx.get(dut.mr_wr.valid) == 0
        # CQ: its context table lives in ICM too (mapped once, apart from the MR table);
        # SET_CQ reads BUSY until the CQ-context cache takes the context, and restarts the
        # CQ's indices (cq_event) at once.
        cq = layout_int(CQ_CTX, base=0x8000, log_size=5)
        assert await command(ctx, bus, Cmd.SET_CQ, 1, cq) == CmdStatus.BAD_STATE
        assert ctx.get(dut.cq_wr.valid) == 0
        assert await command(ctx, bus, Cmd.MAP_ICM, IcmTable.CQ, 0x30_0000) == CmdStatus.OK
        assert ctx.get(dut.icm_cq_base) == 0x30_0000 and ctx.get(dut.icm_mr_base) == 0x10_0000
        assert await command(ctx, bus, Cmd.MAP_ICM, IcmTable.CQ, 0x40_0000) == CmdStatus.BAD_STATE
        assert await command(ctx, bus, Cmd.SET_CQ, 4, cq) == CmdStatus.BAD_INDEX
        assert await command(ctx, bus, Cmd.SET_CQ, 1, layout_int(CQ_CTX, log_size=17)) == CmdStatus.BAD_VALUE
        ctx.set(dut.cq_event.ready, 1)
        await written_into_cache(ctx, bus, dut.cq_wr, Cmd.SET_CQ, 1, cq)
        # Doorbell binding.
        assert await command(ctx, bus, Cmd.BIND_DB, 2, 3) == CmdStatus.OK
        assert await command(ctx, bus, Cmd.BIND_DB, 2, CFG.n_doorbells) == CmdStatus.BAD_VALUE
        ctx.set(dut.bind.index, 2)
        assert ctx.get(dut.bind.data) == 3
        # SET_QP is refused once the QP left RESET: a permanent BAD_STATE (not BUSY, which
        # would tell the driver to poll again), and the context is unchanged.
        assert await command(ctx, bus, Cmd.MODIFY_QP, 2, QpState.INIT.value) == CmdStatus.OK
        other = layout_int(QP_CTX, sq_base=0x9000, pd=3, send_cq=1, recv_cq=1)
        assert await command(ctx, bus, Cmd.SET_QP, 2, other) == CmdStatus.BAD_STATE
        assert ctx.get(dut.qp_wr.valid) == 0
        ctx.set(dut.qp_resp.index, 2)
        assert ctx.get(dut.qp_resp.data).state == QpState.INIT
        # Once reset, the same SET_QP is accepted: the new context goes to the cache.
        assert await command(ctx, bus, Cmd.MODIFY_QP, 2, QpState.RESET.value) == CmdStatus.OK
        await written_into_cache(ctx, bus, dut.qp_wr, Cmd.SET_QP, 2, other)

    run(dut, tb)


# ---------------------------------------------------------------------------------------
# The modify-QP state machine against oracles written here, not taken from hw/regmap.py.

#: Oracle: the modify-QP arcs of the QP state diagram of IBA vol. 1 rel. 1.4, section 10.3.1,
#: restricted to the states the model has (RESET, INIT, RTR, RTS, ERR; no SQD, no SQE).
#: Each entry names where it comes from. Arcs of the diagram that need SQD or SQE are left
#: out with the states (IBA_LEFT_OUT below).
IBA_10_3_1 = {
    ("RESET", "INIT"): "Reset -> Init by Modify QP (the only way out of Reset but Error)",
    ("INIT", "INIT"): "Init -> Init: Modify QP in Init changes attributes, stays in Init",
    ("INIT", "RTR"): "Init -> RTR by Modify QP",
    ("RTR", "RTS"): "RTR -> RTS by Modify QP",
    ("RTS", "RTS"): "RTS -> RTS: Modify QP in RTS changes attributes, stays in RTS",
    **{(s, "RESET"): "diagram note: any state -> Reset by Modify QP"
       for s in ("RESET", "INIT", "RTR", "RTS", "ERR")},
    **{(s, "ERR"): "diagram note: any state -> Error by Modify QP"
       for s in ("RESET", "INIT", "RTR", "RTS", "ERR")},
}

#: Modify-QP arcs of the 10.3.1 diagram that the model leaves out with SQD and SQE.
IBA_LEFT_OUT = {("RTS", "SQD"), ("SQD", "SQD"), ("SQD", "RTS"), ("SQE", "RTS"),
                ("SQD", "RESET"), ("SQD", "ERR"), ("SQE", "RESET"), ("SQE", "ERR")}

#: For comparison: the transitions Linux's ib_modify_qp_is_ok() marks ``.valid``
#: (drivers/infiniband/core/verbs.c, ``qp_state_table``, read at torvalds/linux commit
#: f4d8f354d753), all seven states.
LINUX_QP_STATE_TABLE = {
    "RESET": {"RESET", "INIT"},
    "INIT": {"RESET", "ERR", "INIT", "RTR"},
    "RTR": {"RESET", "ERR", "RTS"},
    "RTS": {"RESET", "ERR", "RTS", "SQD"},
    "SQD": {"RESET", "ERR", "RTS", "SQD"},
    "SQE": {"RESET", "ERR", "RTS"},
    "ERR": {"RESET", "ERR"},
}

#: Where the model (= IBA oracle) and Linux differ, with the reason. Linux's other extra
#: entries all involve SQD or SQE, which the model does not have (their QpState values 4
#: and 5 are refused as BAD_VALUE).
#: * RESET -> ERR: IBA allows Error from any state (the diagram note; the Linux commit
#:   "IB/mlx4: Fix RESET to RESET and RESET to ERROR transitions" gives the same reading of
#:   the spec, and older kernels, whose ib_modify_qp_is_ok() still took a link-layer
#:   argument, listed it in qp_state_table); current Linux no longer does. The model
#:   follows IBA: a QP in RESET has no work requests, so the move only changes the state,
#:   and the QP leaves ERR again through RESET.
IBA_NOT_LINUX = {("RESET", "ERR")}

MODEL_STATES = ("RESET", "INIT", "RTR", "RTS", "ERR")


def test_oracles_agree_except_where_documented():
    linux = {(c, n) for c, ns in LINUX_QP_STATE_TABLE.items() for n in ns}
    linux_model = {(c, n) for c, n in linux if c in MODEL_STATES and n in MODEL_STATES}
    assert set(IBA_10_3_1) - linux_model == IBA_NOT_LINUX
    assert linux_model - set(IBA_10_3_1) == set()
    assert linux - linux_model == IBA_LEFT_OUT
    # The states the oracle names are the model's states, with their ibv_qp_state values.
    assert {s.name: s.value for s in QpState} == {"RESET": 0, "INIT": 1, "RTR": 2, "RTS": 3,
                                                 "ERR": 6}


#: A legal path from RESET to each state that uses only arcs of IBA_10_3_1.
PATHS = {"RESET": [], "INIT": ["INIT"], "RTR": ["INIT", "RTR"],
         "RTS": ["INIT", "RTR", "RTS"], "ERR": ["INIT", "ERR"]}


def observed_transitions(dut):
    """Try every (current, new) pair on QP 1 of ``dut``: the set of accepted pairs.

    An accepted command must answer OK, move the QP and emit a QP event with the new state
    and the PSNs; a refused one must answer BAD_TRANSITION, leave the state and emit nothing.
    """
    accepted = set()

    async def tb(ctx):
        bus = dut.bus

        async def modify(state_value, psns=0):
            for i in range(2):
                await mmio_write(ctx, bus, ARG_BASE + 8 * i,
                                 ((state_value | psns) >> (64 * i)) & (2**64 - 1))
            await mmio_write(ctx, bus, Reg.CMD, int(Cmd.MODIFY_QP) | (1 << 16))
            event = ctx.get(dut.qp_event.valid), ctx.get(dut.qp_event.payload)
            return await mmio_read(ctx, bus, Reg.CMD), event

        for cur, new in itertools.product(MODEL_STATES, MODEL_STATES):
            for step in ["RESET"] + PATHS[cur]:
                status, _ = await modify(QpState[step].value)
                assert status == CmdStatus.OK, f"path to {cur}: {step} refused ({status})"
            status, (ev_valid, ev) = await modify(QpState[new].value,
                                                  (0x123456 << 64) | (0xABCDEF << 88))
            ctx.set(dut.qp_resp.index, 1)
            state = ctx.get(dut.qp_resp.data).state
            if status == CmdStatus.OK:
                accepted.add((cur, new))
                assert state == QpState[new], (cur, new)
                assert ev_valid and ev.qpn == 1 and ev.state == QpState[new], (cur, new)
                assert ev.sq_psn == 0x123456 and ev.rq_psn == 0xABCDEF
            else:
                assert status == CmdStatus.BAD_TRANSITION, (cur, new, status)
                assert state == QpState[cur], (cur, new)
                assert not ev_valid, (cur, new)
        # Undefined state values (4 = SQD, 5 = SQE in ibv_qp_state, 7) are bad values and
        # change nothing.
        for value in (4, 5, 7):
            status, (ev_valid, _) = await modify(value)
            assert status == CmdStatus.BAD_VALUE and not ev_valid, value
        assert ctx.get(dut.qp_resp.data).state == QpState[MODEL_STATES[-1]]

    run(dut, tb)
    return accepted


def test_state_machine_every_transition():
    """The RTL accepts exactly the transitions of IBA 10.3.1 (the oracle above)."""
    accepted = observed_transitions(Context(CFG))
    assert accepted == set(IBA_10_3_1), (
        f"accepted but not in IBA 10.3.1: {sorted(accepted - set(IBA_10_3_1))}; "
        f"in IBA 10.3.1 but refused: {sorted(set(IBA_10_3_1) - accepted)}")
    # The driver's own check uses the same table as the RTL: it must match too.
    assert LEGAL_TRANSITIONS == set(IBA_10_3_1)


def test_state_machine_follows_a_changed_table(monkeypatch):
    """Mutation check of the test above: the RTL is generated from LEGAL_TRANSITIONS, so a
    wrongly changed table changes what the RTL accepts, and the oracle comparison fails."""
    import hw.rnic.context
    wrong = (set(LEGAL_TRANSITIONS) - {("INIT", "INIT"), ("RESET", "ERR")}
             | {("RTR", "INIT"), ("RTS", "RTR")})
    monkeypatch.setattr(hw.rnic.context, "LEGAL_TRANSITIONS", wrong)
    accepted = observed_transitions(Context(CFG))
    assert accepted == wrong and accepted != set(IBA_10_3_1)


def test_events_and_error_requests():
    dut = Context(CFG)

    async def tb(ctx):
        bus = dut.bus
        events = []

        async def cmd_and_watch(op, index, arg):
            for i in range(8):
                await mmio_write(ctx, bus, ARG_BASE + 8 * i, (arg >> (64 * i)) & (2**64 - 1))
            await mmio_write(ctx, bus, Reg.CMD, int(op) | (index << 16))
            if ctx.get(dut.qp_event.valid):
                events.append(ctx.get(dut.qp_event.payload))

        await cmd_and_watch(Cmd.MODIFY_QP, 3, QpState.INIT.value | (0x111 << 64) | (0x222 << 88))
        assert len(events) == 1
        assert events[0].qpn == 3 and events[0].state == QpState.INIT
        assert events[0].sq_psn == 0x111 and events[0].rq_psn == 0x222
        # An engine forces QP 3 to ERR.
        ctx.set(dut.err_resp.valid, 1)
        ctx.set(dut.err_resp.payload.qpn, 3)
        assert ctx.get(dut.err_resp.ready)
        await ctx.tick()
        ctx.set(dut.err_resp.valid, 0)
        assert ctx.get(dut.qp_event.valid)
        assert ctx.get(dut.qp_event.payload.state) == QpState.ERR
        ctx.set(dut.qp_resp.index, 3)
        assert ctx.get(dut.qp_resp.data).state == QpState.ERR
        # A second request for the same QP is accepted without a second event.
        ctx.set(dut.err_req.valid, 1)
        ctx.set(dut.err_req.payload.qpn, 3)
        await ctx.tick()
        ctx.set(dut.err_req.valid, 0)
        assert not ctx.get(dut.qp_event.valid)

    run(dut, tb)


def test_bad_configuration():
    with pytest.raises(TypeError, match="cfg must be a NicConfig"):
        Context({"n_qps": 4})
