"""Tests of the RC reference model (sim/reference.py): every opcode and every error case."""

import random

import pytest

from hw import formats
from hw.formats import Access, QpState, WcOpcode, WcStatus, WrOpcode
from sim.reference import (Completion, ReferenceModel, RecvWR, SendFlags, SendWR,
                           compare_completions, split_completions)

LW, RW, RR, RA = Access.LOCAL_WRITE, Access.REMOTE_WRITE, Access.REMOTE_READ, Access.REMOTE_ATOMIC
S = WcStatus
SIG = SendFlags.SIGNALED

A_BUF, B_BUF = 0x1000, 0x8000


class Pair:
    """Node 0 (requester, buffer at 0x1000) connected to node 1 (buffer at 0x8000)."""

    def __init__(self, b_access=LW | RW | RR | RA, qp_access=RW | RR | RA, a_access=LW):
        self.m = ReferenceModel()
        self.a, self.b = self.m.add_node(0), self.m.add_node(1)
        self.pa, self.pb = self.a.alloc_pd(), self.b.alloc_pd()
        self.la = self.a.reg_mr(self.pa, A_BUF, 0x1000, a_access)
        self.rb = self.b.reg_mr(self.pb, B_BUF, 0x1000, b_access)
        self.qa = self.a.create_qp(self.pa)
        self.qb = self.b.create_qp(self.pb, access=qp_access)
        self.m.connect(self.qa, self.qb)
        self.a.write(A_BUF, bytes(range(256)) * 16)
        self.b.write(B_BUF, bytes(255 - (i & 0xFF) for i in range(0x1000)))
        self.a0, self.b0 = self.a.read(A_BUF, 0x1000), self.b.read(B_BUF, 0x1000)

    def send(self, **kw):
        self.m.post_send(self.qa, SendWR(**kw))

    def recv(self, wr_id=100, addr=B_BUF + 0x100, length=64, lkey=None):
        self.m.post_recv(self.qb, RecvWR(wr_id, addr, length, self.rb.key if lkey is None else lkey))

    def run(self):
        res = self.m.run()
        return res.completions.get((0, 0), []), res.completions.get((1, 0), [])


def C(wr_id, status, opcode, byte_len=0, imm=None, qpn=0):
    return Completion(wr_id, status, opcode, byte_len, imm, qpn)


# ---------------------------------------------------------------------------------------
# Successful operations

def test_write():
    p = Pair()
    p.send(wr_id=1, opcode=WrOpcode.RDMA_WRITE, sg=(A_BUF + 16, 100, p.la.key),
           remote_addr=B_BUF + 40, rkey=p.rb.key)
    ca, cb = p.run()
    assert ca == [C(1, S.SUCCESS, WcOpcode.RDMA_WRITE, 100)]
    assert cb == []
    mem = p.b.read(B_BUF, 0x1000)
    assert mem[40:140] == p.a0[16:116]
    assert mem[:40] == p.b0[:40] and mem[140:] == p.b0[140:]
    assert p.a.read(A_BUF, 0x1000) == p.a0
    assert p.qa.state == p.qb.state == QpState.RTS


def test_write_with_imm_consumes_a_receive():
    p = Pair()
    p.recv(wr_id=77, addr=B_BUF + 0x800, length=4)
    p.send(wr_id=2, opcode=WrOpcode.RDMA_WRITE_WITH_IMM, sg=(A_BUF, 32, p.la.key),
           remote_addr=B_BUF, rkey=p.rb.key, imm=0xDEADBEEF)
    ca, cb = p.run()
    assert ca == [C(2, S.SUCCESS, WcOpcode.RDMA_WRITE, 32)]
    assert cb == [C(77, S.SUCCESS, WcOpcode.RECV_RDMA_WITH_IMM, 32, 0xDEADBEEF)]
    assert p.b.read(B_BUF, 32) == p.a0[:32]
    assert p.b.read(B_BUF + 0x800, 4) == p.b0[0x800:0x804]      # receive buffer untouched


@pytest.mark.parametrize("opcode, imm", [(WrOpcode.SEND, None), (WrOpcode.SEND_WITH_IMM, 0x1234)])
def test_send(opcode, imm):
    p = Pair()
    p.recv(wr_id=5, addr=B_BUF + 0x100, length=64)
    p.recv(wr_id=6, addr=B_BUF + 0x200, length=64)
    p.send(wr_id=3, opcode=opcode, sg=(A_BUF + 1, 50, p.la.key), imm=imm or 0)
    p.send(wr_id=4, opcode=opcode, sg=(A_BUF + 2, 64, p.la.key), imm=imm or 0)
    ca, cb = p.run()
    assert ca == [C(3, S.SUCCESS, WcOpcode.SEND, 50), C(4, S.SUCCESS, WcOpcode.SEND, 64)]
    assert cb == [C(5, S.SUCCESS, WcOpcode.RECV, 50, imm), C(6, S.SUCCESS, WcOpcode.RECV, 64, imm)]
    assert p.b.read(B_BUF + 0x100, 50) == p.a0[1:51]
    assert p.b.read(B_BUF + 0x100 + 50, 14) == p.b0[0x100 + 50:0x100 + 64]
    assert p.b.read(B_BUF + 0x200, 64) == p.a0[2:66]


def test_read():
    p = Pair()
    p.send(wr_id=9, opcode=WrOpcode.RDMA_READ, sg=(A_BUF + 0x200, 300, p.la.key),
           remote_addr=B_BUF + 0x10, rkey=p.rb.key)
    ca, cb = p.run()
    assert ca == [C(9, S.SUCCESS, WcOpcode.RDMA_READ, 300)] and cb == []
    assert p.a.read(A_BUF + 0x200, 300) == p.b0[0x10:0x10 + 300]
    assert p.b.read(B_BUF, 0x1000) == p.b0


def test_compare_and_swap_success_and_failure():
    p = Pair()
    p.b.write(B_BUF + 8, (0x1122334455667788).to_bytes(8, "little"))
    p.send(wr_id=1, opcode=WrOpcode.ATOMIC_CMP_AND_SWP, sg=(A_BUF, 8, p.la.key),
           remote_addr=B_BUF + 8, rkey=p.rb.key, compare_add=0x1122334455667788, swap=42)
    p.send(wr_id=2, opcode=WrOpcode.ATOMIC_CMP_AND_SWP, sg=(A_BUF + 8, 8, p.la.key),
           remote_addr=B_BUF + 8, rkey=p.rb.key, compare_add=0x1122334455667788, swap=7)
    ca, _ = p.run()
    assert ca == [C(1, S.SUCCESS, WcOpcode.COMP_SWAP, 8), C(2, S.SUCCESS, WcOpcode.COMP_SWAP, 8)]
    assert p.a.read(A_BUF, 8) == bytes.fromhex("8877665544332211")   # original, little-endian
    assert int.from_bytes(p.a.read(A_BUF + 8, 8), "little") == 42     # second saw the swap
    assert int.from_bytes(p.b.read(B_BUF + 8, 8), "little") == 42     # and failed


def test_fetch_and_add_wraps():
    p = Pair()
    p.b.write(B_BUF + 16, ((1 << 64) - 3).to_bytes(8, "little"))
    for i in range(2):
        p.send(wr_id=i, opcode=WrOpcode.ATOMIC_FETCH_AND_ADD, sg=(A_BUF + 8 * i, 8, p.la.key),
               remote_addr=B_BUF + 16, rkey=p.rb.key, compare_add=5)
    ca, _ = p.run()
    assert [c.opcode for c in ca] == [WcOpcode.FETCH_ADD] * 2
    assert int.from_bytes(p.a.read(A_BUF, 8), "little") == (1 << 64) - 3
    assert int.from_bytes(p.a.read(A_BUF + 8, 8), "little") == 2
    assert int.from_bytes(p.b.read(B_BUF + 16, 8), "little") == 7


def test_unsignaled_and_fence():
    p = Pair()
    p.send(wr_id=1, opcode=WrOpcode.RDMA_WRITE, sg=(A_BUF, 8, p.la.key), remote_addr=B_BUF,
           rkey=p.rb.key, send_flags=0)
    p.send(wr_id=2, opcode=WrOpcode.RDMA_READ, sg=(A_BUF + 64, 8, p.la.key), remote_addr=B_BUF,
           rkey=p.rb.key, send_flags=SIG | SendFlags.FENCE)
    p.send(wr_id=3, opcode=WrOpcode.RDMA_WRITE, sg=(A_BUF, 8, p.la.key), remote_addr=B_BUF,
           rkey=p.rb.key, send_flags=SendFlags.FENCE)
    ca, _ = p.run()
    assert ca == [C(2, S.SUCCESS, WcOpcode.RDMA_READ, 8)]
    assert p.a.read(A_BUF + 64, 8) == p.a0[:8]     # the READ saw the earlier WRITE


def test_zero_length_operations_check_no_key():
    p = Pair()
    p.recv(wr_id=50, length=0, lkey=0xBAD)
    p.send(wr_id=1, opcode=WrOpcode.RDMA_WRITE, sg=(0, 0, 0xBAD), remote_addr=0xFFFF0, rkey=0xBAD)
    p.send(wr_id=2, opcode=WrOpcode.RDMA_READ, sg=(0, 0, 0xBAD), remote_addr=0, rkey=0xBAD)
    p.send(wr_id=3, opcode=WrOpcode.SEND, sg=(0, 0, 0xBAD))
    ca, cb = p.run()
    assert ca == [C(1, S.SUCCESS, WcOpcode.RDMA_WRITE), C(2, S.SUCCESS, WcOpcode.RDMA_READ),
                  C(3, S.SUCCESS, WcOpcode.SEND)]
    assert cb == [C(50, S.SUCCESS, WcOpcode.RECV, 0)]
    assert p.b.read(B_BUF, 0x1000) == p.b0 and p.a.read(A_BUF, 0x1000) == p.a0


def test_loopback_and_two_qps_round_robin():
    m = ReferenceModel()
    n = m.add_node(3)
    pd = n.alloc_pd()
    mr = n.reg_mr(pd, 0, 256, LW | RW | RR | RA)
    q0, q1, q2, q3 = (n.create_qp(pd, send_cq=i % 2) for i in range(4))
    m.connect(q0, q1)
    m.connect(q2, q3)
    n.write(0, bytes(range(64)))
    m.post_send(q0, SendWR(1, WrOpcode.RDMA_WRITE, (0, 8, mr.key), 100, mr.key))
    m.post_send(q2, SendWR(2, WrOpcode.ATOMIC_FETCH_AND_ADD, (16, 8, mr.key), 200, mr.key,
                           compare_add=3))
    m.post_send(q0, SendWR(3, WrOpcode.RDMA_READ, (32, 8, mr.key), 100, mr.key))
    res = m.run()
    assert res.completions == {
        (3, 0): [C(1, S.SUCCESS, WcOpcode.RDMA_WRITE, 8), C(3, S.SUCCESS, WcOpcode.RDMA_READ, 8)],
        (3, 2): [C(2, S.SUCCESS, WcOpcode.FETCH_ADD, 8, qpn=2)]}
    assert n.read(100, 8) == bytes(range(8)) and n.read(32, 8) == bytes(range(8))
    assert n.read(200, 8) == (3).to_bytes(8, "little")
    # q0 and q2 share CQ 0; round-robin interleaves them: q0's WR 1, q2's WR 2, q0's WR 3
    assert [c.wr_id for c in n.cqs[0]] == [1, 2, 3] and n.cqs[1] == []
    assert m.run().completions == {}                                # nothing new


# ---------------------------------------------------------------------------------------
# Local errors (requester)

def _local_error_cases(p):
    k = p.la.key
    return {
        "bad_lkey": (SendWR(1, WrOpcode.RDMA_WRITE, (A_BUF, 8, k + 1), B_BUF, p.rb.key), S.LOC_PROT_ERR),
        "bounds": (SendWR(1, WrOpcode.RDMA_WRITE, (A_BUF + 0xFF9, 8, k), B_BUF, p.rb.key), S.LOC_PROT_ERR),
        "below_base": (SendWR(1, WrOpcode.SEND, (A_BUF - 1, 8, k)), S.LOC_PROT_ERR),
        "read_no_local_write": (SendWR(1, WrOpcode.RDMA_READ, (A_BUF + 0x10, 8, p.ro.key), B_BUF, p.rb.key), S.LOC_PROT_ERR),
        "atomic_no_local_write": (SendWR(1, WrOpcode.ATOMIC_FETCH_AND_ADD, (A_BUF + 0x10, 8, p.ro.key), B_BUF, p.rb.key), S.LOC_PROT_ERR),
        "pd_mismatch": (SendWR(1, WrOpcode.RDMA_WRITE, (0x9000, 8, p.other_pd.key), B_BUF, p.rb.key), S.LOC_PROT_ERR),
        "deregistered": (SendWR(1, WrOpcode.RDMA_WRITE, (0xA000, 8, p.gone.key), B_BUF, p.rb.key), S.LOC_PROT_ERR),
        "atomic_len_4": (SendWR(1, WrOpcode.ATOMIC_CMP_AND_SWP, (A_BUF, 4, k), B_BUF, p.rb.key), S.LOC_LEN_ERR),
        "atomic_len_16": (SendWR(1, WrOpcode.ATOMIC_FETCH_AND_ADD, (A_BUF, 16, k), B_BUF, p.rb.key), S.LOC_LEN_ERR),
        "unknown_opcode": (SendWR(1, 9, (A_BUF, 8, k), B_BUF, p.rb.key), S.LOC_QP_OP_ERR),
    }


LOCAL_CASES = ["bad_lkey", "bounds", "below_base", "read_no_local_write", "atomic_no_local_write",
               "pd_mismatch", "deregistered", "atomic_len_4", "atomic_len_16", "unknown_opcode"]


@pytest.mark.parametrize("case", LOCAL_CASES)
def test_local_errors(case):
    p = Pair()
    p.ro = p.a.reg_mr(p.pa, A_BUF, 0x100, Access(0))         # read-only view of the buffer
    p.other_pd = p.a.reg_mr(p.a.alloc_pd(), 0x9000, 0x100, LW)
    p.gone = p.a.reg_mr(p.pa, 0xA000, 0x100, LW)
    p.a.dereg_mr(p.gone)
    wr, status = _local_error_cases(p)[case]
    p.recv(wr_id=60)
    p.m.post_send(p.qa, wr)
    p.send(wr_id=2, opcode=WrOpcode.RDMA_WRITE, sg=(A_BUF, 8, p.la.key), remote_addr=B_BUF,
           rkey=p.rb.key, send_flags=0)
    ca, cb = p.run()
    opcode = None if case == "unknown_opcode" else formats_opcode(wr.opcode)
    assert ca == [C(1, status, opcode), C(2, S.WR_FLUSH_ERR, WcOpcode.RDMA_WRITE)]
    assert cb == []                                   # the responder never saw anything
    assert p.qa.state == QpState.ERR and p.qb.state == QpState.RTS
    assert p.b.read(B_BUF, 0x1000) == p.b0 and p.a.read(A_BUF, 0x1000) == p.a0


def formats_opcode(op):
    return {WrOpcode.RDMA_WRITE: WcOpcode.RDMA_WRITE, WrOpcode.SEND: WcOpcode.SEND,
            WrOpcode.RDMA_READ: WcOpcode.RDMA_READ,
            WrOpcode.ATOMIC_CMP_AND_SWP: WcOpcode.COMP_SWAP,
            WrOpcode.ATOMIC_FETCH_AND_ADD: WcOpcode.FETCH_ADD}[op]


# ---------------------------------------------------------------------------------------
# Remote errors (responder)

REMOTE_CASES = {
    # name: (Pair kwargs, opcode, remote offset, rkey delta, length, expected status)
    "write_bad_rkey": ({}, WrOpcode.RDMA_WRITE, 0, 0x100, 8, S.REM_ACCESS_ERR),
    "write_bounds": ({}, WrOpcode.RDMA_WRITE, 0xFFC, 0, 8, S.REM_ACCESS_ERR),
    "write_no_right": ({"b_access": LW | RR | RA}, WrOpcode.RDMA_WRITE, 0, 0, 8, S.REM_ACCESS_ERR),
    "write_qp_no_right": ({"qp_access": RR | RA}, WrOpcode.RDMA_WRITE, 0, 0, 8, S.REM_ACCESS_ERR),
    "write_imm_bad_rkey": ({}, WrOpcode.RDMA_WRITE_WITH_IMM, 0, 1, 8, S.REM_ACCESS_ERR),
    "read_bad_rkey": ({}, WrOpcode.RDMA_READ, 0, 1, 8, S.REM_ACCESS_ERR),
    "read_bounds": ({}, WrOpcode.RDMA_READ, -8, 0, 16, S.REM_ACCESS_ERR),
    "read_no_right": ({"b_access": LW | RW | RA}, WrOpcode.RDMA_READ, 0, 0, 8, S.REM_ACCESS_ERR),
    "read_qp_no_right": ({"qp_access": RW | RA}, WrOpcode.RDMA_READ, 0, 0, 8, S.REM_ACCESS_ERR),
    "cas_no_right": ({"b_access": LW | RW | RR}, WrOpcode.ATOMIC_CMP_AND_SWP, 0, 0, 8, S.REM_ACCESS_ERR),
    "faa_qp_no_right": ({"qp_access": RW | RR}, WrOpcode.ATOMIC_FETCH_AND_ADD, 0, 0, 8, S.REM_ACCESS_ERR),
    "faa_bounds": ({}, WrOpcode.ATOMIC_FETCH_AND_ADD, 0x1000, 0, 8, S.REM_ACCESS_ERR),
    "faa_misaligned": ({}, WrOpcode.ATOMIC_FETCH_AND_ADD, 4, 0, 8, S.REM_INV_REQ_ERR),
    "cas_misaligned": ({}, WrOpcode.ATOMIC_CMP_AND_SWP, 0x11, 0, 8, S.REM_INV_REQ_ERR),
}


@pytest.mark.parametrize("case", sorted(REMOTE_CASES))
def test_remote_errors(case):
    kw, op, off, dkey, length, status = REMOTE_CASES[case]
    p = Pair(**kw)
    p.recv(wr_id=70)
    p.recv(wr_id=71)
    p.send(wr_id=1, opcode=op, sg=(A_BUF + 0x100, length, p.la.key), remote_addr=B_BUF + off,
           rkey=p.rb.key + dkey, compare_add=1, swap=2, send_flags=0)   # unsignaled: still a CQE
    p.send(wr_id=2, opcode=WrOpcode.RDMA_WRITE, sg=(A_BUF, 8, p.la.key), remote_addr=B_BUF,
           rkey=p.rb.key)
    ca, cb = p.run()
    assert ca == [C(1, status, formats_opcode(op) if op != WrOpcode.RDMA_WRITE_WITH_IMM
                    else WcOpcode.RDMA_WRITE), C(2, S.WR_FLUSH_ERR, WcOpcode.RDMA_WRITE)]
    # the responder moved to ERR and flushed its receive queue
    assert cb == [C(70, S.WR_FLUSH_ERR, WcOpcode.RECV), C(71, S.WR_FLUSH_ERR, WcOpcode.RECV)]
    assert p.qa.state == p.qb.state == QpState.ERR
    assert p.b.read(B_BUF, 0x1000) == p.b0 and p.a.read(A_BUF, 0x1000) == p.a0
    assert p.b.undefined == []


def test_remote_pd_mismatch():
    p = Pair()
    other = p.b.reg_mr(p.b.alloc_pd(), 0xC000, 0x100, LW | RW | RR | RA)
    p.send(wr_id=1, opcode=WrOpcode.RDMA_READ, sg=(A_BUF, 8, p.la.key), remote_addr=0xC000,
           rkey=other.key)
    ca, _ = p.run()
    assert ca == [C(1, S.REM_ACCESS_ERR, WcOpcode.RDMA_READ)]
    assert p.qb.state == QpState.ERR


def test_remote_deregistered_key():
    p = Pair()
    p.b.dereg_mr(p.rb)
    p.send(wr_id=1, opcode=WrOpcode.RDMA_WRITE, sg=(A_BUF, 8, p.la.key), remote_addr=B_BUF,
           rkey=p.rb.key)
    assert p.run()[0] == [C(1, S.REM_ACCESS_ERR, WcOpcode.RDMA_WRITE)]


@pytest.mark.parametrize("op", [WrOpcode.SEND, WrOpcode.SEND_WITH_IMM, WrOpcode.RDMA_WRITE_WITH_IMM])
def test_rnr_without_receive(op):
    p = Pair()
    p.send(wr_id=1, opcode=op, sg=(A_BUF, 16, p.la.key), remote_addr=B_BUF + 0x40, rkey=p.rb.key)
    p.send(wr_id=2, opcode=WrOpcode.RDMA_READ, sg=(A_BUF, 8, p.la.key), remote_addr=B_BUF,
           rkey=p.rb.key, send_flags=0)
    ca, cb = p.run()
    wc = WcOpcode.SEND if op != WrOpcode.RDMA_WRITE_WITH_IMM else WcOpcode.RDMA_WRITE
    assert ca == [C(1, S.RNR_RETRY_EXC_ERR, wc), C(2, S.WR_FLUSH_ERR, WcOpcode.RDMA_READ)]
    assert cb == []
    assert p.qa.state == QpState.ERR and p.qb.state == QpState.RTS   # an RNR NAK is no error
    # a WRITE with immediate may have landed before the last packet met the RNR
    expected_undef = [(B_BUF + 0x40, 16)] if op == WrOpcode.RDMA_WRITE_WITH_IMM else []
    assert p.b.undefined == expected_undef
    assert p.a.read(A_BUF, 0x1000) == p.a0


def test_receive_buffer_too_small():
    p = Pair()
    p.recv(wr_id=80, addr=B_BUF + 0x100, length=16)
    p.recv(wr_id=81, addr=B_BUF + 0x200, length=64)
    p.send(wr_id=1, opcode=WrOpcode.SEND, sg=(A_BUF, 17, p.la.key))
    ca, cb = p.run()
    assert ca == [C(1, S.REM_INV_REQ_ERR, WcOpcode.SEND)]
    assert cb == [C(80, S.LOC_LEN_ERR, WcOpcode.RECV), C(81, S.WR_FLUSH_ERR, WcOpcode.RECV)]
    assert p.qa.state == p.qb.state == QpState.ERR
    assert p.b.undefined == [(B_BUF + 0x100, 16)]


@pytest.mark.parametrize("case, msg_len", [
    ("bad_key", 32), ("bounds", 32), ("no_local_write", 32), ("pd", 32),
    ("bounds", 8),        # the message fits in the region, the posted buffer does not
    ("bad_key", 0),       # a zero-length SEND still validates a non-empty receive WQE
    ("bad_key", 100),     # also too long: the protection check comes first
])
def test_receive_buffer_bad_lkey(case, msg_len):
    p = Pair()
    ro = p.b.reg_mr(p.pb, B_BUF, 0x1000, RW)
    other = p.b.reg_mr(p.b.alloc_pd(), B_BUF, 0x1000, LW)
    addr, lkey = {"bad_key": (B_BUF, 0x7777), "bounds": (B_BUF + 0xFF0, p.rb.key),
                  "no_local_write": (B_BUF, ro.key), "pd": (B_BUF, other.key)}[case]
    p.recv(wr_id=90, addr=addr, length=64, lkey=lkey)
    p.send(wr_id=1, opcode=WrOpcode.SEND_WITH_IMM, sg=(A_BUF, msg_len, p.la.key), imm=5)
    ca, cb = p.run()
    assert ca == [C(1, S.REM_OP_ERR, WcOpcode.SEND)]
    assert cb == [C(90, S.LOC_PROT_ERR, WcOpcode.RECV)]
    assert p.qa.state == p.qb.state == QpState.ERR
    assert p.b.undefined == [] and p.b.read(B_BUF, 0x1000) == p.b0    # nothing placed


def test_responder_not_ready_gives_retry_exceeded():
    m = ReferenceModel()
    a, b = m.add_node(0), m.add_node(1)
    pa, pb = a.alloc_pd(), b.alloc_pd()
    la = a.reg_mr(pa, 0, 64, LW)
    qa, qb = a.create_qp(pa), b.create_qp(pb)
    qa.remote, qb.remote = (1, 0), (0, 0)
    for s in (QpState.INIT, QpState.RTR, QpState.RTS):
        qa.modify(s)
    qb.modify(QpState.INIT)
    qa.post_send(SendWR(1, WrOpcode.RDMA_WRITE, (0, 8, la.key), 0, 0))
    assert m.run().completions == {(0, 0): [C(1, S.RETRY_EXC_ERR, WcOpcode.RDMA_WRITE)]}
    assert qb.state == QpState.INIT


def test_flush_after_error_and_posting_to_err():
    p = Pair()
    p.m.post_recv(p.qa, RecvWR(200, A_BUF, 8, p.la.key))     # requester's own receive queue
    p.send(wr_id=1, opcode=WrOpcode.RDMA_WRITE, sg=(A_BUF, 8, p.la.key), remote_addr=B_BUF,
           rkey=p.rb.key, send_flags=0)                       # succeeds silently
    p.send(wr_id=2, opcode=WrOpcode.RDMA_WRITE, sg=(A_BUF, 8, 0xBAD), send_flags=0)
    for i in range(3, 6):
        p.send(wr_id=i, opcode=WrOpcode.SEND, sg=(A_BUF, 8, p.la.key), send_flags=i % 2)
    ca, _ = p.run()
    assert ca == [C(2, S.LOC_PROT_ERR, WcOpcode.RDMA_WRITE),
                  C(3, S.WR_FLUSH_ERR, WcOpcode.SEND), C(4, S.WR_FLUSH_ERR, WcOpcode.SEND),
                  C(5, S.WR_FLUSH_ERR, WcOpcode.SEND), C(200, S.WR_FLUSH_ERR, WcOpcode.RECV)]
    assert p.b.read(B_BUF, 8) == p.a0[:8]                     # WR 1 did execute
    p.send(wr_id=6, opcode=WrOpcode.RDMA_READ, send_flags=0)
    p.m.post_recv(p.qa, RecvWR(201))
    ca, _ = p.run()
    assert ca == [C(6, S.WR_FLUSH_ERR, WcOpcode.RDMA_READ), C(201, S.WR_FLUSH_ERR, WcOpcode.RECV)]
    send, recv = split_completions(p.qa.completions)
    assert [c.wr_id for c in send] == [2, 3, 4, 5, 6] and [c.wr_id for c in recv] == [200, 201]


def test_modify_to_err_flushes_and_reset_drops():
    p = Pair()
    p.recv(wr_id=1)
    p.qb.modify(QpState.ERR)
    assert p.qb.completions == [C(1, S.WR_FLUSH_ERR, WcOpcode.RECV)]
    p.qb.modify(QpState.RESET)
    p.qb.modify(QpState.INIT)
    p.recv(wr_id=2)
    p.qb.modify(QpState.RESET)
    assert p.qb.rq == type(p.qb.rq)() and len(p.qb.completions) == 1


def test_illegal_transition_and_posting_state():
    p = Pair()
    with pytest.raises(ValueError, match=r"state: QP 0 cannot go from RTS to INIT"):
        p.qa.modify(QpState.INIT)
    q = p.a.create_qp(p.pa)
    with pytest.raises(ValueError, match=r"RESET: receive work requests can be posted from INIT"):
        q.post_recv(RecvWR(1))
    q.modify(QpState.INIT)
    q.post_recv(RecvWR(1))
    with pytest.raises(ValueError, match=r"is in INIT: the send queue accepts work requests in RTS or ERR"):
        q.post_send(SendWR(1))
    with pytest.raises(ValueError, match="already registered"):
        p.a.reg_mr(p.pa, 0, 1, LW, key=p.la.key)


# ---------------------------------------------------------------------------------------
# Comparison helpers

def test_compare_helpers():
    p = Pair()
    p.recv(wr_id=7)
    p.send(wr_id=1, opcode=WrOpcode.SEND_WITH_IMM, sg=(A_BUF, 8, p.la.key), imm=0xAB)
    p.send(wr_id=2, opcode=WrOpcode.RDMA_WRITE, sg=(A_BUF, 8, p.la.key), remote_addr=0, rkey=1)
    p.run()
    exp = p.qb.completions
    raw = formats.pack(formats.CQE, wr_id=7, status=0, opcode=WcOpcode.RECV, byte_len=8,
                       imm=0xAB, qpn=0, flags=formats.CQE_FLAG_IMM | formats.CQE_FLAG_OWNER)
    got = Completion.from_cqe(formats.unpack(formats.CQE, raw))
    assert exp == [got]
    # an error completion matches whatever the hardware put in the undefined fields
    hw = [C(1, S.SUCCESS, WcOpcode.SEND, 8), C(2, S.REM_ACCESS_ERR, WcOpcode.SEND, 99, 3)]
    assert compare_completions(p.qa.completions, hw) == []
    assert compare_completions(p.qa.completions, hw, strict=True) != []
    bad = compare_completions(p.qa.completions, hw[:1])
    assert bad == ["send completion 1: expected Completion(wr_id=2, status=<WcStatus.REM_ACCESS_ERR: 10>, "
                   "opcode=None, byte_len=0, imm=None, qpn=0), got None"]
    # memory comparison skips undefined bytes and reports runs of differences
    real = bytearray(p.b.read(B_BUF, 0x1000))
    real[5:7] = b"\0\0"
    p.b.undefined.append((B_BUF + 0x20, 4))
    real[0x20:0x24] = b"zzzz"
    probs = p.b.compare_memory(lambda a, n: bytes(real[a - B_BUF:a - B_BUF + n]))
    assert probs == [(B_BUF + 5, p.b.read(B_BUF + 5, 2), b"\0\0")]


def test_random_faa_and_write_read_consistency():
    """Many random WRITE/READ/FAA on two QPs; check against a directly computed result."""
    rng = random.Random(1)
    p = Pair()
    shadow_b = bytearray(p.b0)
    shadow_a = bytearray(p.a0)
    counter = 0
    p.b.write(B_BUF + 0xF00, bytes(8))
    shadow_b[0xF00:0xF08] = bytes(8)
    for i in range(200):
        kind = rng.choice(["w", "r", "f"])
        if kind == "w":
            lo, n, ro = rng.randrange(0, 0x800), rng.randrange(0, 64), rng.randrange(0, 0xE00)
            p.send(wr_id=i, opcode=WrOpcode.RDMA_WRITE, sg=(A_BUF + lo, n, p.la.key),
                   remote_addr=B_BUF + ro, rkey=p.rb.key)
            shadow_b[ro:ro + n] = shadow_a[lo:lo + n]
        elif kind == "r":
            lo, n, ro = rng.randrange(0x800, 0xF00), rng.randrange(0, 64), rng.randrange(0, 0xE00)
            p.send(wr_id=i, opcode=WrOpcode.RDMA_READ, sg=(A_BUF + lo, n, p.la.key),
                   remote_addr=B_BUF + ro, rkey=p.rb.key)
            shadow_a[lo:lo + n] = shadow_b[ro:ro + n]
        else:
            add = rng.randrange(1 << 64)
            p.send(wr_id=i, opcode=WrOpcode.ATOMIC_FETCH_AND_ADD, sg=(A_BUF + 0xF00, 8, p.la.key),
                   remote_addr=B_BUF + 0xF00, rkey=p.rb.key, compare_add=add)
            shadow_a[0xF00:0xF08] = counter.to_bytes(8, "little")
            counter = (counter + add) % (1 << 64)
            shadow_b[0xF00:0xF08] = counter.to_bytes(8, "little")
    ca, _ = p.run()
    assert [c.wr_id for c in ca] == list(range(200))
    assert all(c.status == S.SUCCESS for c in ca)
    assert p.a.read(A_BUF, 0x1000) == bytes(shadow_a)
    assert p.b.read(B_BUF, 0x1000) == bytes(shadow_b)


def _naive_compare(exp_mem, act, base, n, undefined):
    """compare_memory's rule written byte by byte: runs of differing defined bytes."""
    skip = {a for lo, ln in undefined for a in range(lo, lo + ln)}
    out, i = [], 0
    while i < n:
        if exp_mem[i] != act[i] and base + i not in skip:
            j = i
            while j < n and exp_mem[j] != act[j] and base + j not in skip:
                j += 1
            out.append((base + i, bytes(exp_mem[i:j]), bytes(act[i:j])))
            i = j
        else:
            i += 1
    return out


def test_compare_memory_against_a_byte_by_byte_rule():
    """Random differences and overlapping undefined ranges (runs cut by undefined bytes,
    ranges touching the region's ends): the same problems as a byte-by-byte comparison."""
    rng = random.Random(5)
    for trial in range(40):
        p = Pair()
        n = 0x1000
        exp = p.b.read(B_BUF, n)
        real = bytearray(exp)
        for _ in range(rng.randrange(0, 12)):
            a = rng.randrange(n)
            for k in range(a, min(n, a + rng.randrange(1, 40))):
                real[k] = (real[k] + rng.randrange(1, 256)) % 256
        undef = [(B_BUF + rng.randrange(-16, n), rng.randrange(1, 64))
                 for _ in range(rng.randrange(0, 6))]
        p.b.undefined.extend(undef)
        probs = p.b.compare_memory(lambda a, m: bytes(real[a - B_BUF:a - B_BUF + m]),
                                   ranges=[(B_BUF, n)])
        assert probs == _naive_compare(exp, real, B_BUF, n, undef), trial
