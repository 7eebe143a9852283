"""Tests of the driver model / verbs API (sim/verbs.py) against a fake MMIO bus and memory.

The expected bytes are built by hand from the byte offsets documented in hw/formats.py and
hw/regmap.py, not with formats.pack, so that a packing mistake cannot cancel out.
"""

import asyncio
import struct

import pytest

from hw.config import NicConfig
from hw.formats import Access, QpState, WcOpcode, WcStatus, WrOpcode
from hw.regmap import ARG_BASE, BLUEFLAME_BASE, DOORBELL_BASE, ID_VALUE, Cmd, CmdStatus, Reg
from sim.verbs import (ENOMEM, CommandError, Context, Memory, Mmio, RecvWR, SendFlags, SendWR,
                       VerbsError, WC, connect)

CMD, RQ_DB, CQ_DB = int(Reg.CMD), int(Reg.RQ_DB), int(Reg.CQ_DB)


class FakeMmio:
    """Records every access; CMD reads back `status[opcode]` (default OK), ID reads ID_VALUE."""

    def __init__(self):
        self.log = []
        self.status = {}
        self.busy = 0
        self.last_cmd = 0

    async def write(self, addr, value):
        assert 0 <= value < 1 << 64
        self.log.append(("w", addr, value))
        if addr == CMD:
            self.last_cmd = value

    async def read(self, addr):
        self.log.append(("r", addr))
        if addr == Reg.ID:
            return ID_VALUE
        if addr == CMD:
            if self.busy:
                self.busy -= 1
                return CmdStatus.BUSY
            return self.status.get(self.last_cmd & 0xFF, CmdStatus.OK)
        return 0

    def writes(self, lo=0, hi=1 << 64):
        return [(a, v) for k, a, *v in self.log if k == "w" and lo <= a < hi for v in v]

    def clear(self):
        self.log.clear()


class FakeMemory:
    def __init__(self):
        self.b = {}

    def read(self, addr, n):
        return bytes(self.b.get(addr + i, 0) for i in range(n))

    def write(self, addr, data):
        for i, x in enumerate(bytes(data)):
            self.b[addr + i] = x


def run(coro):
    return asyncio.run(coro)


def make(**kw):
    cfg = kw.pop("cfg", NicConfig(n_qps=8, n_cqs=4, n_mrs=4, n_doorbells=16))
    mmio, mem = FakeMmio(), FakeMemory()
    # first_qpn=0 keeps the byte-level expectations below simple; the default is tested apart.
    kw.setdefault("first_qpn", 0)
    ctx = Context(mmio, mem, cfg, node_id=kw.pop("node_id", 3), host_base=0x10_0000,
                  host_size=1 << 20, **kw)
    return ctx, mmio, mem


def cmd_seq(opcode, index, words):
    """The MMIO accesses of one command: ARG words, CMD, read CMD."""
    return ([("w", ARG_BASE + 8 * i, w) for i, w in enumerate(words)]
            + [("w", CMD, int(opcode) | index << 16), ("r", CMD)])


def words_of(value, n):
    return [(value >> (64 * i)) & ((1 << 64) - 1) for i in range(n)]


def test_protocols_and_open():
    ctx, mmio, mem = make()
    assert isinstance(mem, Memory) and isinstance(mmio, Mmio)
    run(ctx.open())
    # ICM: the MR table (4 slots of 32 bytes) at the top of the 1 MB region, then the CQ
    # context table (4 CQs of 32 bytes) below it, each 4 KB aligned, zeroed and mapped; the
    # allocator stops below them
    icm = 0x10_0000 + (1 << 20) - 4096
    icm_cq = icm - 4096
    icm_qp = icm_cq - 4096
    assert mmio.log == ([("r", int(Reg.ID)), ("w", int(Reg.NODE_ID), 3)]
                        + cmd_seq(Cmd.MAP_ICM, 0, [icm]) + cmd_seq(Cmd.MAP_ICM, 1, [icm_cq])
                        + cmd_seq(Cmd.MAP_ICM, 2, [icm_qp]))
    assert ctx.icm_mr_base == icm and mem.read(icm, 128) == bytes(128)
    assert ctx.icm_cq_base == icm_cq and mem.read(icm_cq, 128) == bytes(128)
    assert ctx.icm_qp_base == icm_qp and mem.read(icm_qp, 128) == bytes(128)
    with pytest.raises(VerbsError, match="host memory exhausted"):
        ctx.alloc(icm_qp - 0x10_0000 + 1)
    assert ctx.alloc(64) == 0x10_0000
    run(ctx.open(check_id=False))          # a second open writes NODE_ID, maps nothing again
    assert mmio.log[11:] == [("w", int(Reg.NODE_ID), 3)]


def test_open_rejects_wrong_id():
    ctx, mmio, _ = make()

    async def bad_read(addr):
        return 0
    mmio.read = bad_read
    with pytest.raises(VerbsError, match="ID register reads 0x0"):
        run(ctx.open())


def test_reg_mr_and_dereg_commands():
    ctx, mmio, _ = make()
    pd = ctx.alloc_pd()
    assert pd.pdn == 1 and ctx.alloc_pd().pdn == 2

    async def go():
        mr0 = await ctx.reg_mr(pd, 0x12345, 0x1000, Access.LOCAL_WRITE | Access.REMOTE_READ)
        mr1 = await pd.reg_mr(0x20000, 64, Access.REMOTE_ATOMIC)
        await mr0.dereg()
        mr2 = await ctx.reg_mr(pd, 0x30000, 8, 0)
        return mr0, mr1, mr2
    mr0, mr1, mr2 = run(go())
    assert (mr0.lkey, mr0.rkey, mr1.key, mr2.key) == (0x001, 0x001, 0x102, 0x003)
    assert not mr0.valid and mr2.slot == 0

    def entry(base, length, key, pdn, access, valid):
        # MR_ENTRY: base 63:0 | length 127:64 | key 159:128 | pd 175:160 | access 183:176 | valid 184
        v = base | length << 64 | key << 128 | pdn << 160 | access << 176 | valid << 184
        return words_of(v, 3)
    assert mmio.log == (cmd_seq(Cmd.SET_MR, 0, entry(0x12345, 0x1000, 0x001, 1, 5, 1))
                        + cmd_seq(Cmd.SET_MR, 1, entry(0x20000, 64, 0x102, 1, 8, 1))
                        + cmd_seq(Cmd.SET_MR, 0, entry(0x12345, 0x1000, 0x001, 1, 5, 0))
                        + cmd_seq(Cmd.SET_MR, 0, entry(0x30000, 8, 0x003, 1, 0, 1)))


def test_mr_table_full_and_bad_arguments():
    ctx, _, _ = make()
    pd = ctx.alloc_pd()

    async def go():
        for i in range(4):
            await ctx.reg_mr(pd, i * 64, 64, Access.LOCAL_WRITE)
        await ctx.reg_mr(pd, 0, 64, Access.LOCAL_WRITE)
    with pytest.raises(ValueError, match=r"at most n_mrs=4 registered"):
        run(go())
    other, _, _ = make()
    with pytest.raises(ValueError, match=r"pd must be a ProtectionDomain of this context"):
        run(ctx.reg_mr(other.alloc_pd(), 0, 64, 0))
    with pytest.raises(ValueError, match=r"addr must be an integer in \[0, "):
        run(ctx.reg_mr(pd, -1, 64, 0))


def test_create_cq_command_and_zeroed_ring():
    ctx, mmio, mem = make()
    mem.write(0x10_0000, b"\xff" * 4096)          # garbage where the ring will live
    cq = run(ctx.create_cq(8))
    assert cq.cqn == 0 and cq.base == 0x10_0000 and cq.depth == 8
    assert mem.read(cq.base, 8 * 32) == bytes(256)
    # CQ_CTX: base 63:0 | log_size 68:64
    assert mmio.log == cmd_seq(Cmd.SET_CQ, 0, [0x10_0000, 3])


@pytest.mark.parametrize("depth", [0, 1, 3, 12, 65536])
def test_bad_cq_depth(depth):
    ctx, _, _ = make()
    with pytest.raises(ValueError, match=rf"depth must be (a power of two|an integer) in \[2, 32768\], not {depth}"):
        run(ctx.create_cq(depth))


def test_too_many_cqs():
    ctx, _, _ = make()

    async def go():
        for _ in range(5):
            await ctx.create_cq(2)
    with pytest.raises(ValueError, match=r"at most n_cqs=4 per context"):
        run(go())


def qp_ctx_words(sq_base, rq_base, sq_log, rq_log, scq, rcq, pd, dqpn, dnode, access, mra,
                 timeout=14, retry_cnt=7, rnr_retry=0, min_rnr_timer=1):
    # QP_CTX bit offsets: sq_base 0, rq_base 64, sq_log_size 128, rq_log_size 133, send_cq 138,
    # recv_cq 148, pd 158, dest_qpn 174, dest_node 198, access 206, max_rd_atomic 214,
    # timeout 219, retry_cnt 224, rnr_retry 227, min_rnr_timer 230 (235 bits)
    v = (sq_base | rq_base << 64 | sq_log << 128 | rq_log << 133 | scq << 138 | rcq << 148
         | pd << 158 | dqpn << 174 | dnode << 198 | access << 206 | mra << 214
         | timeout << 219 | retry_cnt << 224 | rnr_retry << 227 | min_rnr_timer << 230)
    return words_of(v, 4)


def test_create_qp_commands():
    ctx, mmio, _ = make()
    pd = ctx.alloc_pd()
    scq, rcq = run(ctx.create_cq(4)), run(ctx.create_cq(4))
    mmio.clear()
    qp = run(ctx.create_qp(pd, scq, rcq, sq_depth=16, rq_depth=8,
                           access=Access.REMOTE_WRITE, max_rd_atomic=5))
    assert (qp.qpn, qp.qp_num, qp.state, qp.db_reg) == (0, 0, QpState.RESET, 0)
    assert qp.sq_base % 4096 == 0 and qp.rq_base % 4096 == 0 and qp.rq_base >= qp.sq_base + 16 * 64
    assert mmio.log == (cmd_seq(Cmd.SET_QP, 0, qp_ctx_words(qp.sq_base, qp.rq_base, 4, 3, 0, 1,
                                                             1, 0, 0, 2, 5))
                        + cmd_seq(Cmd.BIND_DB, 0, [0]))


def test_create_qp_bad_arguments():
    ctx, _, _ = make()
    pd = ctx.alloc_pd()
    cq = run(ctx.create_cq(4))
    with pytest.raises(ValueError, match=r"sq_depth must be a power of two in \[2, 32768\], not 24"):
        run(ctx.create_qp(pd, cq, sq_depth=24))
    with pytest.raises(ValueError, match=r"rq_depth must be an integer in \[2, 32768\], not 1"):
        run(ctx.create_qp(pd, cq, rq_depth=1))
    with pytest.raises(ValueError, match=r"max_rd_atomic must be an integer in \[1, 16\], not 17"):
        run(ctx.create_qp(pd, cq, max_rd_atomic=17))
    with pytest.raises(ValueError, match=r"send_cq must be a CompletionQueue"):
        run(ctx.create_qp(pd, None))
    with pytest.raises(ValueError, match=r"doorbell must be an integer in \[0, 15\], not 16"):
        run(ctx.create_qp(pd, cq, doorbell=16))

    async def many():
        for _ in range(9):
            await ctx.create_qp(pd, cq, sq_depth=2, rq_depth=2)
    with pytest.raises(ValueError, match=r"queue pairs: at most n_qps=8 per context"):
        run(many())


def test_context_bad_arguments():
    with pytest.raises(ValueError, match=r"doorbell_policy must be one of \['mlx5', 'per_thread'\], not 'lifo'"):
        make(doorbell_policy="lifo")
    with pytest.raises(ValueError, match=r"node_id must be an integer in \[0, 255\], not 256"):
        make(node_id=256)
    ctx, _, _ = make()
    with pytest.raises(VerbsError, match="host memory exhausted") as e:
        ctx.alloc(1 << 20, align=4096)
        ctx.alloc(1)
    assert e.value.errno == ENOMEM
    with pytest.raises(ValueError, match=r"align must be a power of two"):
        ctx.alloc(8, align=3)


async def _make_qps(ctx, n, **kw):
    pd = ctx.alloc_pd()
    cq = await ctx.create_cq(4)
    return [await ctx.create_qp(pd, cq, sq_depth=2, rq_depth=2, **kw) for _ in range(n)]


@pytest.mark.parametrize("n_db, expected", [
    (16, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 4, 5, 6, 7]),
    (6, [0, 1, 2, 3, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5]),
    (4, [0, 1, 2, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3]),   # 3 dedicated, 1 shared
    (1, [0] * 20),
])
def test_mlx5_doorbell_policy(n_db, expected):
    ctx, mmio, _ = make(cfg=NicConfig(n_qps=32, n_doorbells=n_db))
    qps = run(_make_qps(ctx, 20))
    assert [q.db_reg for q in qps] == expected
    binds = [(v >> 16, None) for a, v in mmio.writes(CMD, CMD + 1) if v & 0xFF == Cmd.BIND_DB]
    assert [q for q, _ in binds] == list(range(20))
    arg0 = [v for k, a, *v in mmio.log if k == "w" and a == ARG_BASE for v in v]
    # every BIND_DB carried the register in ARG0 (the ARG0 write just before each BIND_DB)
    log = [e for e in mmio.log if e[0] == "w"]
    bound = [log[i - 1][2] for i, e in enumerate(log) if e[1] == CMD and e[2] & 0xFF == Cmd.BIND_DB]
    assert bound == expected and arg0
    dedicated = min(4, n_db - 1)
    assert [ctx.doorbell_shared(r) for r in range(n_db)] == [r >= dedicated for r in range(n_db)]


def test_per_thread_doorbell_policy():
    ctx, _, _ = make(cfg=NicConfig(n_qps=32, n_doorbells=6), doorbell_policy="per_thread")
    qps = run(_make_qps(ctx, 6))
    assert [q.db_reg for q in qps] == list(range(6))
    assert not any(ctx.doorbell_shared(r) for r in range(6))
    with pytest.raises(ValueError, match=r"'per_thread' needs one doorbell register per QP: "
                                         r"all n_doorbells=6 registers are in use"):
        run(_make_qps(ctx, 1))
    ctx2, _, _ = make(cfg=NicConfig(n_qps=32, n_doorbells=6), doorbell_policy="per_thread")
    assert [q.db_reg for q in run(_make_qps(ctx2, 2, doorbell=5))] == [5, 5]


def test_connect_command_sequence():
    ca, ma, _ = make(node_id=1)
    cb, mb, _ = make(node_id=2)

    async def go():
        qa = (await _make_qps(ca, 2))[1]
        qb = (await _make_qps(cb, 1))[0]
        ma.clear()
        mb.clear()
        await connect(qa, qb, psn_a=0x123456, psn_b=0xABCDEF)
        return qa, qb
    qa, qb = run(go())
    assert qa.state == qb.state == QpState.RTS
    assert (qa.dest_node, qa.dest_qpn, qb.dest_node, qb.dest_qpn) == (2, 0, 1, 1)

    def expect(qp, dnode, dqpn, sq_psn, rq_psn):
        seq = cmd_seq(Cmd.SET_QP, qp.qpn, qp_ctx_words(qp.sq_base, qp.rq_base, 1, 1, 0, 0, 1,
                                                       dqpn, dnode, 14, 16))
        seq += cmd_seq(Cmd.BIND_DB, qp.qpn, [qp.db_reg])
        for state in (1, 2, 3):
            seq += cmd_seq(Cmd.MODIFY_QP, qp.qpn, [state, sq_psn | rq_psn << 24])
        return seq
    assert ma.log == expect(qa, 2, 0, 0x123456, 0xABCDEF)
    assert mb.log == expect(qb, 1, 1, 0xABCDEF, 0x123456)


def test_modify_refused_and_busy():
    ctx, mmio, _ = make()
    qp = run(_make_qps(ctx, 1))[0]
    mmio.status[Cmd.MODIFY_QP] = CmdStatus.BAD_TRANSITION
    with pytest.raises(CommandError, match=r"command MODIFY_QP \(index 0\) refused by the NIC: "
                                           r"status BAD_TRANSITION") as e:
        run(qp.modify_qp(QpState.INIT))
    assert e.value.status == CmdStatus.BAD_TRANSITION and qp.state == QpState.RESET
    del mmio.status[Cmd.MODIFY_QP]
    mmio.busy = 3
    mmio.clear()
    run(qp.modify_qp(QpState.INIT, sq_psn=7, rq_psn=9))
    assert qp.state == QpState.INIT
    assert mmio.log == cmd_seq(Cmd.MODIFY_QP, 0, [1, 7 | 9 << 24]) + [("r", CMD)] * 3
    with pytest.raises(ValueError, match=r"state: QP 0 cannot go from INIT to RTS"):
        run(qp.modify_qp(QpState.RTS))
    with pytest.raises(VerbsError, match="only be set in RESET"):
        run(qp.set_remote(1, 2))


def test_modify_unchecked_reaches_the_nic():
    """check=False sends a transition the driver would refuse, so that the NIC's own check
    can be tested; a refusal (either one) changes neither the state nor the PSNs."""
    ctx, mmio, _ = make()
    qp = run(_make_qps(ctx, 1))[0]
    run(qp.modify_qp(QpState.INIT, sq_psn=5, rq_psn=6))
    mmio.clear()
    with pytest.raises(ValueError, match=r"state: QP 0 cannot go from INIT to RTS"):
        run(qp.modify_qp(QpState.RTS, sq_psn=7, rq_psn=8))
    assert mmio.log == []                                   # the driver's check: NIC not asked
    assert (qp.state, qp.sq_psn, qp.rq_psn) == (QpState.INIT, 5, 6)
    mmio.status[Cmd.MODIFY_QP] = CmdStatus.BAD_TRANSITION
    with pytest.raises(CommandError, match="status BAD_TRANSITION") as e:
        run(qp.modify_qp(QpState.RTS, sq_psn=7, rq_psn=8, check=False))
    assert mmio.log == cmd_seq(Cmd.MODIFY_QP, 0, [3, 7 | 8 << 24])
    assert e.value.status == CmdStatus.BAD_TRANSITION
    assert (qp.state, qp.sq_psn, qp.rq_psn) == (QpState.INIT, 5, 6)
    # Accepted when the NIC accepts it (the fake NIC has no state machine).
    del mmio.status[Cmd.MODIFY_QP]
    run(qp.modify_qp(QpState.RTS, sq_psn=7, check=False))
    assert (qp.state, qp.sq_psn, qp.rq_psn) == (QpState.RTS, 7, 6)
    with pytest.raises(TypeError, match="check must be True or False, not 'no'"):
        run(qp.modify_qp(QpState.ERR, check="no"))


def test_command_bad_state_is_not_polled():
    """BAD_STATE is a permanent refusal: CommandError after one read of CMD. BUSY is read
    again, and a command still BUSY after the last allowed read fails too."""
    ctx, mmio, _ = make()
    mmio.status[Cmd.SET_QP] = CmdStatus.BAD_STATE
    with pytest.raises(CommandError, match=r"command SET_QP \(index 2\) refused by the NIC: "
                                           r"status BAD_STATE") as e:
        run(ctx.command(Cmd.SET_QP, 2, bytes(8)))
    assert e.value.status == CmdStatus.BAD_STATE and e.value.cmd == Cmd.SET_QP
    assert mmio.log == cmd_seq(Cmd.SET_QP, 2, [0])           # one read of CMD, no polling
    # BUSY then BAD_STATE: polled while BUSY, then refused at once.
    mmio.clear()
    mmio.busy = 2
    with pytest.raises(CommandError, match="status BAD_STATE"):
        run(ctx.command(Cmd.SET_QP, 2, bytes(8)))
    assert mmio.log == cmd_seq(Cmd.SET_QP, 2, [0]) + [("r", CMD)] * 2
    # BUSY for ever: refused with BUSY after the poll limit.
    from sim import verbs
    mmio.clear()
    mmio.busy = 10 ** 6
    with pytest.raises(CommandError, match="status BUSY") as e:
        run(ctx.command(Cmd.NOP, 0))
    assert e.value.status == CmdStatus.BUSY
    assert sum(1 for x in mmio.log if x == ("r", CMD)) == verbs._CMD_BUSY_POLLS


def test_command_statuses_are_documented():
    """docs/formats.md lists every CmdStatus with its value, and the driver's poll limit."""
    import pathlib
    import re
    from sim import verbs
    doc = (pathlib.Path(__file__).resolve().parent.parent / "docs" / "formats.md").read_text()
    rows = dict(re.findall(r"^\| `(\w+)` \| (\d+) \|", doc, re.M))
    assert rows == {s.name: str(s.value) for s in CmdStatus}
    assert f"up to {verbs._CMD_BUSY_POLLS} times" in doc


async def _connected(ctx, sq_depth=4, rq_depth=4, **kw):
    pd = ctx.alloc_pd()
    cq = await ctx.create_cq(8)
    qps = [await ctx.create_qp(pd, cq, sq_depth=sq_depth, rq_depth=rq_depth, **kw)
           for _ in range(2)]
    await connect(qps[0], qps[1])
    return qps


def expected_wqe(opcode, flags, imm, wr_id, laddr, length, lkey, raddr, rkey, cmp_add, swap,
                 index=0, qpn=0):
    # WQE bytes: opcode 0, flags 1, index 2-3, imm 4-7, wr_id 8-15, local_addr 16-23,
    # length 24-27, lkey 28-31, remote_addr 32-39, rkey 40-43, qpn 44-46, rsvd 47,
    # compare_add 48-55, swap 56-63; all little-endian
    return struct.pack("<BBHIQQIIQIIQQ", opcode, flags, index, imm, wr_id, laddr, length, lkey,
                       raddr, rkey, qpn, cmp_add, swap)


def test_post_send_wqe_bytes_and_doorbell():
    ctx, mmio, mem = make()
    qa, qb = run(_connected(ctx))
    mmio.clear()
    wr1 = SendWR(wr_id=0x1122334455667788, opcode=WrOpcode.ATOMIC_CMP_AND_SWP,
                 sg=(0xAABBCCDD00, 8, 0x0102), remote_addr=0x7766554433221100, rkey=0x0305,
                 compare_add=0xFEDCBA9876543210, swap=0x0F0E0D0C0B0A0908,
                 send_flags=SendFlags.SIGNALED | SendFlags.FENCE)
    wr2 = SendWR(wr_id=2, opcode=WrOpcode.SEND_WITH_IMM, sg=(0x5000, 100, 7), imm=0xCAFEBABE,
                 send_flags=SendFlags.SOLICITED)
    run(qa.post_send([wr1, wr2]))
    assert mem.read(qa.sq_base, 64) == expected_wqe(5, 3, 0, 0x1122334455667788, 0xAABBCCDD00, 8,
                                                    0x0102, 0x7766554433221100, 0x0305,
                                                    0xFEDCBA9876543210, 0x0F0E0D0C0B0A0908)
    assert mem.read(qa.sq_base + 64, 64) == expected_wqe(3, 4, 0xCAFEBABE, 2, 0x5000, 100, 7,
                                                         0, 0, 0, 0, index=1, qpn=qa.qpn)
    # one doorbell for the batch: QPN in bits 23:0, producer index in bits 47:32
    assert mmio.log == [("w", DOORBELL_BASE + 8 * qa.db_reg, 0 | 2 << 32)]
    run(qa.post_send(SendWR(wr_id=3, opcode=WrOpcode.RDMA_WRITE)))
    assert mmio.log[-1] == ("w", DOORBELL_BASE + 8 * qa.db_reg, 3 << 32)
    assert mem.read(qa.sq_base + 128, 4) == bytes([0, 1, 2, 0])  # RDMA_WRITE, signaled, slot 2


class FakeBfMmio(FakeMmio):
    def write_bf(self, addr, data):
        self.log.append(("bf", addr, bytes(data)))


def _blueflame_qp():
    """A connected QP of a context with BlueFlame on, its MMIO log cleared."""
    cfg = NicConfig(n_qps=8, n_cqs=4, n_mrs=4, n_doorbells=16)
    mmio, mem = FakeBfMmio(), FakeMemory()
    ctx = Context(mmio, mem, cfg, node_id=3, host_base=0x10_0000, host_size=1 << 20,
                  first_qpn=2, blueflame=True)
    qa, _ = run(_connected(ctx))
    mmio.clear()
    return cfg, mmio, mem, qa


def test_post_send_blueflame():
    """With blueflame on, a single WR goes out as one 64-byte write of its WQE to the QP's
    BlueFlame register (no 8-byte doorbell); a batch still rings the 8-byte doorbell."""
    cfg, mmio, mem, qa = _blueflame_qp()
    run(qa.post_send(SendWR(wr_id=9, opcode=WrOpcode.RDMA_WRITE, sg=(0x5000, 8, 7),
                            remote_addr=0x100, rkey=5)))
    wqe = mem.read(qa.sq_base, 64)
    assert wqe == expected_wqe(0, 1, 0, 9, 0x5000, 8, 7, 0x100, 5, 0, 0, index=0, qpn=qa.qpn)
    assert mmio.log == [("bf", BLUEFLAME_BASE + 64 * qa.db_reg, wqe)]
    mmio.clear()
    run(qa.post_send([SendWR(wr_id=10, opcode=WrOpcode.RDMA_WRITE),
                      SendWR(wr_id=11, opcode=WrOpcode.RDMA_WRITE)]))
    assert mmio.log == [("w", DOORBELL_BASE + 8 * qa.db_reg, qa.qpn | 3 << 32)]
    with pytest.raises(ValueError, match=r"blueflame=True needs an MMIO driver with write_bf"):
        Context(FakeMmio(), mem, cfg, blueflame=True)
    with pytest.raises(ValueError, match=r"blueflame must be True or False, not 1"):
        Context(mmio, mem, cfg, blueflame=1)


def test_post_send_deferred_ring():
    """ring=False writes the WQEs and rings nothing; ring_sq rings once for all of them (by
    BlueFlame when there is exactly one)."""
    cfg, mmio, mem, qa = _blueflame_qp()
    run(qa.post_send(SendWR(wr_id=1, opcode=WrOpcode.RDMA_WRITE), ring=False))
    assert mmio.log == [] and qa.sq_pi == 1
    run(qa.ring_sq())
    assert mmio.log == [("bf", BLUEFLAME_BASE + 64 * qa.db_reg, mem.read(qa.sq_base, 64))]
    mmio.clear()
    for i in range(2):
        run(qa.post_send(SendWR(wr_id=2 + i, opcode=WrOpcode.RDMA_WRITE), ring=False))
    run(qa.post_send(SendWR(wr_id=4, opcode=WrOpcode.RDMA_WRITE)))   # rings for all three
    assert mmio.log == [("w", DOORBELL_BASE + 8 * qa.db_reg, qa.qpn | 4 << 32)]


def test_post_send_ring_wrap_overflow_and_reclaim():
    ctx, mmio, mem = make()
    qa, qb = run(_connected(ctx, sq_depth=4))
    cq = qa.send_cq

    async def go():
        await qa.post_send([SendWR(wr_id=i, opcode=WrOpcode.RDMA_WRITE, send_flags=0)
                            for i in range(3)])
        await qa.post_send(SendWR(wr_id=3, opcode=WrOpcode.RDMA_WRITE))
        with pytest.raises(VerbsError, match=r"send queue full \(4 of 4 outstanding, 1 more") as e:
            await qa.post_send(SendWR(wr_id=4))
        assert e.value.errno == ENOMEM
        # the NIC completes WR 3 (signaled): it frees WRs 0..3
        mem.write(cq.base, cqe_bytes(3, 0, 1, 8, 0, qa.qpn, 0x80))
        assert [w.wr_id for w in await cq.poll_cq(4)] == [3]
        assert (qa.sq_ci, qa.sq_pi) == (4, 4)
        mmio.clear()
        await qa.post_send([SendWR(wr_id=10 + i) for i in range(4)])
        assert mmio.log == [("w", DOORBELL_BASE + 8 * qa.db_reg, 8 << 32)]
        for i in range(4):                      # slots wrapped: WQE 4+i sits in slot i
            assert mem.read(qa.sq_base + 64 * i + 8, 8) == (10 + i).to_bytes(8, "little")
        await qa.post_send(SendWR(wr_id=99), allow_overflow=True)    # on purpose
        assert mem.read(qa.sq_base + 8, 8) == (99).to_bytes(8, "little")
        assert mmio.log[-1] == ("w", DOORBELL_BASE + 8 * qa.db_reg, 9 << 32)
    run(go())


def test_post_send_state_and_type_checks():
    ctx, _, _ = make()
    qp = run(_make_qps(ctx, 1))[0]
    with pytest.raises(VerbsError, match=r"QP 0 is in RESET: the send queue accepts work requests in RTS or ERR"):
        run(qp.post_send(SendWR()))
    with pytest.raises(TypeError, match="post_send takes SendWR"):
        run(qp.post_send([RecvWR()]))
    with pytest.raises(ValueError, match=r"imm must be an integer in \[0, 4294967295\], not -1"):
        SendWR(imm=-1)
    with pytest.raises(ValueError, match=r"opcode must be an integer in \[0, 255\], not 256"):
        SendWR(opcode=256)
    assert SendWR(opcode=9).opcode == 9 and SendWR(opcode=2).opcode == WrOpcode.SEND


def test_post_recv_bytes_doorbell_and_full():
    ctx, mmio, mem = make()
    qa, qb = run(_connected(ctx, rq_depth=2))
    mmio.clear()
    run(qb.post_recv([RecvWR(0xABCDEF, 0x123456789, 4096, 0x0201), RecvWR(2, 0x10, 1, 3)]))
    # RECV_WQE: wr_id 0-7, addr 8-15, length 16-19, lkey 20-23, rsvd 24-31
    assert mem.read(qb.rq_base, 32) == struct.pack("<QQIIQ", 0xABCDEF, 0x123456789, 4096, 0x0201, 0)
    assert mem.read(qb.rq_base + 32, 32) == struct.pack("<QQIIQ", 2, 0x10, 1, 3, 0)
    assert mmio.log == [("w", RQ_DB, qb.qpn | 2 << 32)]
    with pytest.raises(VerbsError, match=r"receive queue full \(2 of 2 outstanding") as e:
        run(qb.post_recv(RecvWR(3)))
    assert e.value.errno == ENOMEM
    # a receive completion frees one slot
    mem.write(qb.recv_cq.base, cqe_bytes(0xABCDEF, 0, 128, 10, 0, qb.qpn, 0x80))
    assert len(run(qb.recv_cq.poll_cq())) == 1 and qb.rq_ci == 1
    mmio.clear()
    run(qb.post_recv(RecvWR(3)))
    assert mem.read(qb.rq_base, 8) == (3).to_bytes(8, "little")
    assert mmio.log == [("w", RQ_DB, qb.qpn | 3 << 32)]


def cqe_bytes(wr_id, status, opcode, byte_len, imm, qpn, flags, src_qpn=0, vendor_err=0):
    # CQE: wr_id 0-7, status 8, opcode 9, vendor_err 10, rsvd 11, byte_len 12-15, imm 16-19,
    # qpn 20-22, rsvd 23, src_qpn 24-26, rsvd 27-30, flags 31
    return (struct.pack("<QBBBBII", wr_id, status, opcode, vendor_err, 0, byte_len, imm)
            + qpn.to_bytes(3, "little") + b"\0" + src_qpn.to_bytes(3, "little") + bytes(4)
            + bytes([flags]))


def test_poll_cq_owner_bit_across_wrap():
    ctx, mmio, mem = make()
    cq = run(ctx.create_cq(4))
    mmio.clear()
    assert run(cq.poll_cq(4)) == [] and mmio.log == []               # empty ring: no CQ_DB
    for i in range(4):                                                # pass 0: owner 1
        mem.write(cq.base + 32 * i, cqe_bytes(i, 0, 0, 8, 0, 1, 0x80))
    got = run(cq.poll_cq(3))
    assert [w.wr_id for w in got] == [0, 1, 2]
    assert mmio.log == [("r", CMD)] * 0 + [("w", CQ_DB, 0 | 3 << 32)]
    # pass 1 writes owner 0 into slots 0 and 1; slot 2 still holds a pass-0 entry (owner 1)
    mem.write(cq.base + 0, cqe_bytes(4, 0, 0, 8, 0, 1, 0x00))
    mem.write(cq.base + 32, cqe_bytes(5, 5, 2, 0, 0, 1, 0x00))
    got = run(cq.poll_cq(10))
    assert [w.wr_id for w in got] == [3, 4, 5]
    assert got[2].status == WcStatus.WR_FLUSH_ERR and got[2].opcode == WcOpcode.RDMA_READ
    assert mmio.log[-1] == ("w", CQ_DB, 6 << 32) and cq.ci == 6
    assert run(cq.poll_cq(10)) == []
    for i in (2, 3):                                                  # finish pass 1
        mem.write(cq.base + 32 * i, cqe_bytes(i + 4, 0, 0, 8, 0, 1, 0x00))
    mem.write(cq.base, cqe_bytes(8, 0, 0, 8, 0, 1, 0x80))             # pass 2: owner 1 again
    assert [w.wr_id for w in run(cq.poll_cq(10))] == [6, 7, 8]
    assert mmio.log[-1] == ("w", CQ_DB, 9 << 32)


def test_cq_doorbell_index_is_16_bit():
    ctx, mmio, mem = make()
    run(ctx.create_cq(4))
    cq = run(ctx.create_cq(4))
    cq.ci = 0xFFFF                           # pass 16383 (odd): owner 0, slot 3
    mem.write(cq.base + 96, cqe_bytes(1, 0, 0, 0, 0, 0, 0x00))
    run(cq.poll_cq())
    assert mmio.log[-1] == ("w", CQ_DB, 1 | 0 << 32)


def test_wc_decoding():
    raw = cqe_bytes(0x55, 9, 129, 1000, 0x12345678, 0x0ABCDE, 0x81, src_qpn=0x111111,
                    vendor_err=0x42)
    assert WC.from_bytes(raw) == WC(0x55, WcStatus.REM_INV_REQ_ERR, WcOpcode.RECV_RDMA_WITH_IMM,
                                    1000, 0x12345678, 0x0ABCDE, 0x111111, 0x01, 0x42)
    assert WC.from_bytes(raw).with_imm
    odd = WC.from_bytes(cqe_bytes(1, 200, 77, 0, 0, 0, 0x80))
    assert (odd.status, odd.opcode, odd.flags, odd.with_imm) == (200, 77, 0, False)


def test_read_counter():
    ctx, mmio, _ = make()
    from hw.regmap import Counter
    run(ctx.read_counter(Counter.CQES))
    assert mmio.log == [("r", 0x100 + 8 * 19)]


def test_doorbell_producer_index_wraps_at_16_bits():
    ctx, mmio, mem = make()
    qa, _ = run(_connected(ctx, sq_depth=4))
    qa.sq_pi = qa.sq_ci = 0xFFFE                  # as after 65534 completed WQEs
    mmio.clear()
    run(qa.post_send([SendWR(wr_id=1), SendWR(wr_id=2), SendWR(wr_id=3)]))
    assert mmio.log == [("w", DOORBELL_BASE + 8 * qa.db_reg, qa.qpn | 0x0001 << 32)]
    assert mem.read(qa.sq_base + 64 * 2 + 8, 8) == (1).to_bytes(8, "little")   # 0xFFFE % 4 == 2
    assert mem.read(qa.sq_base + 64 * 0 + 8, 8) == (3).to_bytes(8, "little")
    qa.sq_pi = qa.sq_ci = 0x1233
    run(qa.post_send(SendWR(wr_id=4)))
    assert mmio.log[-1] == ("w", DOORBELL_BASE + 8 * qa.db_reg, qa.qpn | 0x1234 << 32)


def test_send_slots_reclaimed_in_order_with_errors():
    ctx, mmio, mem = make()
    qa, _ = run(_connected(ctx, sq_depth=8))
    cq = qa.send_cq

    async def go():
        await qa.post_send([SendWR(wr_id=i, send_flags=0 if i % 3 else SendFlags.SIGNALED)
                            for i in range(6)])             # signaled: 0 and 3
        mem.write(cq.base, cqe_bytes(0, 0, 0, 0, 0, qa.qpn, 0x80))
        mem.write(cq.base + 32, cqe_bytes(3, 0, 0, 0, 0, qa.qpn, 0x80))
        await cq.poll_cq(8)
        assert (qa.sq_ci, [w for w, _ in qa._sq_outstanding]) == (4, [4, 5])
        # WR 4 fails although unsignaled, WR 5 is flushed: both report
        mem.write(cq.base + 64, cqe_bytes(4, 4, 0, 0, 0, qa.qpn, 0x80))
        mem.write(cq.base + 96, cqe_bytes(5, 5, 0, 0, 0, qa.qpn, 0x80))
        await cq.poll_cq(8)
        assert (qa.sq_ci, qa._sq_outstanding) == (6, [])
    run(go())


# ---------------------------------------------------------------------------------------
# End to end: the verbs layer driving a software NIC built on the reference model

class RefNic:
    """A fake NIC on the MMIO bus that decodes commands, WQEs and doorbells exactly as the
    contracts say, executes them with sim.reference and writes CQEs with owner bits."""

    def __init__(self, fabric, node_id, mem):
        from hw import formats
        self.f, self.fmt = fabric, formats
        self.node = fabric.model.add_node(node_id)
        self.node.memory = mem                       # the NIC works on host memory itself
        self.mem = mem
        self.args = [0] * 8
        self.status = 0
        self.cqs, self.qps, self.binding, self.slots = {}, {}, {}, {}
        fabric.nics[node_id] = self

    async def read(self, addr):
        return {int(Reg.ID): ID_VALUE, CMD: self.status}.get(addr, 0)

    async def write(self, addr, value):
        from hw.regmap import CQ_CTX, QP_CTX, LEGAL_TRANSITIONS
        from hw.formats import MR_ENTRY, DOORBELL, unpack
        from sim.reference import RecvWR as RRecv
        if ARG_BASE <= addr < ARG_BASE + 64:
            self.args[(addr - ARG_BASE) // 8] = value
            return
        raw = b"".join(a.to_bytes(8, "little") for a in self.args)
        self.status = 0
        if addr == CMD:
            op, index = value & 0xFF, value >> 16
            if op == Cmd.SET_MR:
                e = unpack(MR_ENTRY, raw[:24])
                old = self.slots.pop(index, None)
                if old is not None:
                    self.node.dereg_mr(old)
                if e["valid"]:
                    self.slots[index] = self.node.reg_mr(e["pd"], e["base"], e["length"],
                                                         e["access"], key=e["key"])
            elif op == Cmd.SET_CQ:
                c = unpack(CQ_CTX, raw[:16])
                self.cqs[index] = [c["base"], 1 << c["log_size"], 0]
            elif op == Cmd.SET_QP:
                c = unpack(QP_CTX, raw[:32])
                qp = self.node.qps.get(index) or self.node.create_qp(
                    c["pd"], c["send_cq"], c["recv_cq"], c["access"], qpn=index)
                qp.pd, qp.access, qp.remote = c["pd"], c["access"], (c["dest_node"], c["dest_qpn"])
                self.qps[index] = [c, 0, 0]           # ctx, sq ci, rq ci
            elif op == Cmd.BIND_DB:
                self.binding[index] = self.args[0]
            elif op == Cmd.MODIFY_QP:
                qp = self.node.qps[index]
                state = QpState(self.args[0] & 7)
                if (qp.state.name, state.name) not in LEGAL_TRANSITIONS:
                    self.status = CmdStatus.BAD_TRANSITION
                else:
                    self.f.model.modify_qp(qp, state)
        elif DOORBELL_BASE <= addr < DOORBELL_BASE + 8 * 512:
            d = unpack(DOORBELL, value.to_bytes(8, "little"))
            qpn, pi = d["qpn"], d["pi"]
            assert self.binding[qpn] == (addr - DOORBELL_BASE) // 8
            c, ci, _ = self.qps[qpn]
            while ci != pi:
                w = unpack(self.fmt.WQE, self.mem.read(c["sq_base"] + (ci % (1 << c["sq_log_size"])) * 64, 64))
                self.f.model.post_send(self.node.qps[qpn], SendWR(
                    w["wr_id"], w["opcode"], (w["local_addr"], w["length"], w["lkey"]),
                    w["remote_addr"], w["rkey"], w["compare_add"], w["swap"], w["imm"], w["flags"]))
                ci = (ci + 1) & 0xFFFF
            self.qps[qpn][1] = ci
            self.f.run()
        elif addr == RQ_DB:
            qpn, pi = value & 0xFFFFFF, value >> 32
            c, _, ci = self.qps[qpn]
            while ci != pi:
                w = unpack(self.fmt.RECV_WQE, self.mem.read(c["rq_base"] + (ci % (1 << c["rq_log_size"])) * 32, 32))
                self.f.model.post_recv(self.node.qps[qpn], RRecv(w["wr_id"], w["addr"], w["length"], w["lkey"]))
                ci = (ci + 1) & 0xFFFF
            self.qps[qpn][2] = ci

    def write_cqe(self, comp):
        qp = self.node.qps[comp.qpn]
        cq = self.cqs[qp.recv_cq if comp.is_recv else qp.send_cq]
        base, depth, pi = cq
        owner = 0x80 if (pi // depth) % 2 == 0 else 0
        flags = owner | (1 if comp.imm is not None else 0)
        self.mem.write(base + (pi % depth) * 32, self.fmt.pack(
            self.fmt.CQE, wr_id=comp.wr_id, status=comp.status,
            opcode=comp.opcode if comp.opcode is not None else 0, byte_len=comp.byte_len,
            imm=comp.imm or 0, qpn=comp.qpn, flags=flags))
        cq[2] = pi + 1


class RefFabric:
    def __init__(self):
        from sim.reference import ReferenceModel
        self.model = ReferenceModel()
        self.nics = {}

    def run(self):
        for (node, _), comps in self.model.run().completions.items():
            for comp in comps:
                self.nics[node].write_cqe(comp)


def test_end_to_end_against_reference_nic():
    from sim.reference import SparseMemory
    fab = RefFabric()
    cfg = NicConfig(n_qps=4, n_cqs=4, n_mrs=4, n_doorbells=4)
    mems = [SparseMemory(), SparseMemory()]
    ctxs = [Context(RefNic(fab, i, mems[i]), mems[i], cfg, node_id=i, host_base=0x100000,
                    host_size=1 << 20, first_qpn=0) for i in range(2)]

    async def go():
        for c in ctxs:
            await c.open()
        pds = [c.alloc_pd() for c in ctxs]
        bufs = [c.alloc(4096) for c in ctxs]
        mrs = [await c.reg_mr(pd, b, 4096, Access.LOCAL_WRITE | Access.REMOTE_WRITE
                              | Access.REMOTE_READ | Access.REMOTE_ATOMIC)
               for c, pd, b in zip(ctxs, pds, bufs)]
        cqs = [await c.create_cq(4) for c in ctxs]
        qa = await ctxs[0].create_qp(pds[0], cqs[0], sq_depth=4, rq_depth=4)
        qb = await ctxs[1].create_qp(pds[1], cqs[1], sq_depth=4, rq_depth=4)
        await connect(qa, qb, psn_a=100, psn_b=200)
        mems[0].write(bufs[0], bytes(range(64)))
        mems[1].write(bufs[1] + 512, (40).to_bytes(8, "little"))
        await qb.post_recv(RecvWR(500, bufs[1] + 1024, 64, mrs[1].lkey))
        await qa.post_send([
            SendWR(1, WrOpcode.RDMA_WRITE, (bufs[0], 16, mrs[0].lkey), bufs[1], mrs[1].rkey),
            SendWR(2, WrOpcode.SEND_WITH_IMM, (bufs[0] + 16, 8, mrs[0].lkey), imm=0xAB),
            SendWR(3, WrOpcode.ATOMIC_FETCH_AND_ADD, (bufs[0] + 128, 8, mrs[0].lkey),
                   bufs[1] + 512, mrs[1].rkey, compare_add=2, send_flags=0),
            SendWR(4, WrOpcode.RDMA_READ, (bufs[0] + 256, 8, mrs[0].lkey), bufs[1] + 512,
                   mrs[1].rkey)])
        got_a = await cqs[0].poll_cq(8)
        got_b = await cqs[1].poll_cq(8)
        assert [(w.wr_id, w.status, w.opcode, w.byte_len) for w in got_a] == [
            (1, WcStatus.SUCCESS, WcOpcode.RDMA_WRITE, 16), (2, WcStatus.SUCCESS, WcOpcode.SEND, 8),
            (4, WcStatus.SUCCESS, WcOpcode.RDMA_READ, 8)]
        assert got_b == [WC(500, WcStatus.SUCCESS, WcOpcode.RECV, 8, 0xAB, qb.qpn, 0, 1)]
        assert mems[1].read(bufs[1], 16) == bytes(range(16))
        assert mems[1].read(bufs[1] + 1024, 8) == bytes(range(16, 24))
        assert mems[0].read(bufs[0] + 128, 8) == (40).to_bytes(8, "little")
        assert mems[0].read(bufs[0] + 256, 8) == (42).to_bytes(8, "little")
        assert qa.sq_ci == 4 and qb.rq_ci == 1
        # the ring wraps (owner bit 0 on the second pass), and an error flushes the rest
        await qa.post_send([SendWR(5, WrOpcode.RDMA_WRITE, (bufs[0], 8, mrs[0].lkey), 0, 0x999),
                            SendWR(6, WrOpcode.RDMA_WRITE, (bufs[0], 8, mrs[0].lkey),
                                   bufs[1], mrs[1].rkey, send_flags=0)])
        got = await cqs[0].poll_cq(8)
        assert [(w.wr_id, w.status) for w in got] == [(5, WcStatus.REM_ACCESS_ERR),
                                                      (6, WcStatus.WR_FLUSH_ERR)]
        assert cqs[0].ci == 5 and qa.sq_ci == 6
        assert qa.state == QpState.ERR           # learnt from the error completion
        with pytest.raises(ValueError, match="cannot go from ERR to RTS"):
            await qa.modify_qp(QpState.RTS)
        qb.state = QpState.RTS                   # pretend the driver missed the NIC's ERR
        with pytest.raises(CommandError, match=r"MODIFY_QP \(index 0\) refused by the NIC: "
                                               r"status BAD_TRANSITION"):
            await qb.modify_qp(QpState.RTS)      # the NIC knows better (qb is ERR there)
        await qa.modify_qp(QpState.RESET)
        assert (qa.sq_pi, qa.sq_ci) == (0, 0)
    run(go())


def test_mirror_into_reference_model():
    from sim.reference import Completion, ReferenceModel
    ctxs = [make(node_id=i)[0] for i in range(2)]

    async def go():
        pds = [c.alloc_pd() for c in ctxs]
        gone = await ctxs[1].reg_mr(pds[1], 0x50000, 64, Access.LOCAL_WRITE)
        mrs = [await c.reg_mr(pd, 0x40000, 256, Access.LOCAL_WRITE | Access.REMOTE_WRITE)
               for c, pd in zip(ctxs, pds)]
        cqs = [await c.create_cq(4) for c in ctxs]
        qps = [await c.create_qp(pd, cq, access=Access.REMOTE_WRITE)
               for c, pd, cq in zip(ctxs, pds, cqs)]
        await connect(qps[0], qps[1])
        return gone, mrs, qps
    gone, mrs, qps = run(go())
    ctxs[0].mem.write(0x40000, b"mirror me")
    ref = ReferenceModel()
    n0, n1 = ref.mirror(ctxs[0]), ref.mirror(ctxs[1])
    assert n1.mrs[gone.key].valid
    run(ctxs[1].dereg_mr(gone))
    ref.mirror(ctxs[1])
    assert not n1.mrs[gone.key].valid and n1.mrs[mrs[1].key].valid
    q0 = ref.qp(0, qps[0].qpn)
    assert (q0.state, q0.remote, q0.access, q0.pd) == (QpState.RTS, (1, 0), 2, 1)
    wr = SendWR(7, WrOpcode.RDMA_WRITE, (0x40000, 9, mrs[0].lkey), 0x40010, mrs[1].rkey)
    ref.post_send(q0, wr)
    assert ref.run().completions == {(0, 0): [Completion(7, WcStatus.SUCCESS,
                                                         WcOpcode.RDMA_WRITE, 9, None, 0)]}
    assert n1.read(0x40010, 9) == b"mirror me"


def test_default_qpns_skip_the_special_qps():
    """QP 0 and 1 are SMI/GSI (IBA 3.9.3): the driver's first RC QP is number 2."""
    from sim.verbs import FIRST_QPN
    ctx, mmio, mem = make(first_qpn=FIRST_QPN)
    pd = ctx.alloc_pd()
    cq = run(ctx.create_cq(4))
    qps = [run(ctx.create_qp(pd, cq)) for _ in range(NicConfig(n_qps=8).n_qps - 2)]
    assert [q.qpn for q in qps] == list(range(2, 8))
    assert qps[0].db_reg == 0                     # doorbells still go by creation order
    with pytest.raises(ValueError, match="at most n_qps=8 per context, QPNs from first_qpn=2"):
        run(ctx.create_qp(pd, cq))


def test_create_qp_transport_attributes():
    ctx, mmio, _ = make()
    pd = ctx.alloc_pd()
    cq = run(ctx.create_cq(4))
    for name, bad, rng in (("timeout", 32, r"\[0, 31\]"), ("retry_cnt", 8, r"\[0, 7\]"),
                           ("rnr_retry", -1, r"\[0, 7\]"), ("min_rnr_timer", 40, r"\[0, 31\]")):
        with pytest.raises(ValueError, match=rf"{name} must be an integer in {rng}, not {bad}"):
            run(ctx.create_qp(pd, cq, **{name: bad}))
    mmio.clear()
    qp = run(ctx.create_qp(pd, cq, sq_depth=16, rq_depth=8, timeout=3, retry_cnt=5, rnr_retry=7,
                           min_rnr_timer=2))
    assert mmio.log == (cmd_seq(Cmd.SET_QP, qp.qpn,
                                qp_ctx_words(qp.sq_base, qp.rq_base, 4, 3, 0, 0, pd.pdn, 0, 0,
                                             int(qp.access.value), qp.max_rd_atomic, 3, 5, 7, 2))
                        + cmd_seq(Cmd.BIND_DB, qp.qpn, [qp.db_reg]))
