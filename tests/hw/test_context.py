"""Unit tests of the context tables and the command interface (hw/context.py)."""

import itertools

import pytest
from amaranth.sim import Simulator

from hw.config import NicConfig
from hw.context import Context
from hw.formats import MR_ENTRY, QpState, Access
from hw.regmap import (Reg, Cmd, CmdStatus, QP_CTX, CQ_CTX, ARG_BASE, ID_VALUE,
                       LEGAL_TRANSITIONS)

CFG = NicConfig(data_bytes=8, n_qps=4, n_cqs=4, n_mrs=4, n_doorbells=4)


def layout_int(layout, **fields):
    value = 0
    for name, v in fields.items():
        value |= int(v) << layout[name].offset
    return value


async def mmio_write(ctx, bus, addr, value):
    ctx.set(bus.addr, addr)
    ctx.set(bus.wdata, value)
    ctx.set(bus.we, 1)
    await ctx.tick()
    ctx.set(bus.we, 0)


async def mmio_read(ctx, bus, addr):
    ctx.set(bus.addr, addr)
    ctx.set(bus.re, 1)
    await ctx.tick()
    ctx.set(bus.re, 0)
    assert ctx.get(bus.rvalid)
    return ctx.get(bus.rdata)


async def command(ctx, bus, op, index, arg_value=0):
    for i in range(8):
        await mmio_write(ctx, bus, ARG_BASE + 8 * i, (arg_value >> (64 * i)) & (2**64 - 1))
    await mmio_write(ctx, bus, Reg.CMD, int(op) | (index << 16))
    return await mmio_read(ctx, bus, Reg.CMD)


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
        assert await command(ctx, bus, Cmd.SET_QP, 2, qp) == CmdStatus.OK
        ctx.set(dut.qp_req.index, 2)
        ctx.set(dut.qp_resp.index, 1)
        data = ctx.get(dut.qp_req.data)
        assert data.ctx.sq_base == 0x1000 and data.ctx.pd == 7 and data.ctx.dest_qpn == 0x123
        assert data.state == QpState.RESET
        assert ctx.get(dut.qp_resp.data).ctx.sq_base == 0
        # Bad values are refused and change nothing.
        assert await command(ctx, bus, Cmd.SET_QP, 4, qp) == CmdStatus.BAD_INDEX
        bad = layout_int(QP_CTX, send_cq=CFG.n_cqs)
        assert await command(ctx, bus, Cmd.SET_QP, 1, bad) == CmdStatus.BAD_VALUE
        assert await command(ctx, bus, 0x77, 0) == CmdStatus.BAD_OPCODE
        # MR: the key must name the slot.
        mr = layout_int(MR_ENTRY, base=0x4000, length=0x100, key=(3 << 8) | 0x5A, pd=7,
                        access=15, valid=1)
        assert await command(ctx, bus, Cmd.SET_MR, 3, mr) == CmdStatus.OK
        assert await command(ctx, bus, Cmd.SET_MR, 2, mr) == CmdStatus.BAD_VALUE
        ctx.set(dut.mr_resp.index, 3)
        assert ctx.get(dut.mr_resp.data).key == 0x35A
        ctx.set(dut.mr_req.index, 2)
        assert ctx.get(dut.mr_req.data).valid == 0
        # CQ and its event.
        assert await command(ctx, bus, Cmd.SET_CQ, 1, layout_int(CQ_CTX, base=0x8000, log_size=5)) == CmdStatus.OK
        ctx.set(dut.cq.index, 1)
        assert ctx.get(dut.cq.data).base == 0x8000
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
        ctx.set(dut.qp_req.index, 2)
        data = ctx.get(dut.qp_req.data)
        assert data.ctx.sq_base == 0x1000 and data.ctx.pd == 7 and data.state == QpState.INIT
        # Once reset, the same SET_QP is accepted.
        assert await command(ctx, bus, Cmd.MODIFY_QP, 2, QpState.RESET.value) == CmdStatus.OK
        assert await command(ctx, bus, Cmd.SET_QP, 2, other) == CmdStatus.OK
        assert ctx.get(dut.qp_req.data).ctx.sq_base == 0x9000

    run(dut, tb)


def test_state_machine_every_transition():
    """Every (current, new) pair: legal ones change the state and emit an event."""
    dut = Context(CFG)
    names = [s.name for s in QpState]

    async def tb(ctx):
        bus = dut.bus
        seen = []
        for cur, new in itertools.product(names, names):
            # Bring QP 1 to `cur` along a legal path.
            path = {"RESET": [], "INIT": ["INIT"], "RTR": ["INIT", "RTR"],
                    "RTS": ["INIT", "RTR", "RTS"], "ERR": ["ERR"]}[cur]
            assert await command(ctx, bus, Cmd.MODIFY_QP, 1, QpState.RESET.value) == CmdStatus.OK
            for step in path:
                assert await command(ctx, bus, Cmd.MODIFY_QP, 1, QpState[step].value) == CmdStatus.OK
            psns = (0x123456 << 64) | (0xABCDEF << 88)
            ctx.set(bus.addr, ARG_BASE)
            status = await command(ctx, bus, Cmd.MODIFY_QP, 1, QpState[new].value | psns)
            ctx.set(dut.qp_req.index, 1)
            state = ctx.get(dut.qp_req.data).state
            if (cur, new) in LEGAL_TRANSITIONS:
                assert status == CmdStatus.OK, (cur, new)
                assert state == QpState[new]
            else:
                assert status == CmdStatus.BAD_TRANSITION, (cur, new)
                assert state == QpState[cur]
        # An undefined state value is a bad value.
        assert await command(ctx, bus, Cmd.MODIFY_QP, 1, 5) == CmdStatus.BAD_VALUE

    run(dut, tb)


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
        ctx.set(dut.qp_req.index, 3)
        assert ctx.get(dut.qp_req.data).state == QpState.ERR
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
