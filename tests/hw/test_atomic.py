"""AtomicUnit: 8-byte CAS / FAA through DMA against a Python memory model."""

import random

import pytest
from amaranth.sim import Simulator

from hw.atomic import AtomicUnit, ATOMIC_CAS, ATOMIC_FAA

MASK64 = (1 << 64) - 1


def run_atomic(data_bytes, ops, mem, bp, seed=1):
    """Run ``ops`` (list of (op, addr, compare, swap_add)); return (answers, writes, cycles)."""
    rng = random.Random(seed)
    dut = AtomicUnit(data_bytes)
    W = data_bytes
    answers, writes = [], []
    reads = []            # pending response beats: [ready_cycle, data, nbytes, last]
    result = {}

    def p(x):
        return rng.random() < x if bp else True

    async def tb(ctx):
        cyc = 0
        todo = list(ops)
        wr_cur = None
        idle = 0
        while True:
            # drive
            ctx.set(dut.i.valid, bool(todo) and p(0.7))
            if todo:
                op, addr, cmp_, sa = todo[0]
                ctx.set(dut.i.payload, {"op": op, "addr": addr, "compare": cmp_, "swap_add": sa})
            ctx.set(dut.o.ready, p(0.6))
            ctx.set(dut.dma_rd.req.ready, p(0.6))
            ctx.set(dut.dma_wr.ready, p(0.6))
            have = bool(reads) and reads[0][0] <= cyc and p(0.7)
            ctx.set(dut.dma_rd.resp.valid, have)
            if reads:
                ctx.set(dut.dma_rd.resp.payload,
                        {"data": reads[0][1], "nbytes": reads[0][2], "last": reads[0][3], "tag": 3})
            # sample
            busy = False
            if ctx.get(dut.i.valid) and ctx.get(dut.i.ready):
                todo.pop(0)
                busy = True
            if ctx.get(dut.o.valid) and ctx.get(dut.o.ready):
                answers.append(ctx.get(dut.o.payload.orig))
                busy = True
            if ctx.get(dut.dma_rd.req.valid) and ctx.get(dut.dma_rd.req.ready):
                addr, ln = ctx.get(dut.dma_rd.req.payload.addr), ctx.get(dut.dma_rd.req.payload.len)
                assert ln == 8
                raw = bytes(mem[addr:addr + ln])     # snapshot at request time
                lat = cyc + rng.randint(1, 6)
                for off in range(0, ln, W):
                    chunk = raw[off:off + W]
                    reads.append([lat, int.from_bytes(chunk, "little"), len(chunk), off + W >= ln])
                busy = True
            if have and ctx.get(dut.dma_rd.resp.ready):
                reads.pop(0)
                busy = True
            if ctx.get(dut.dma_wr.valid) and ctx.get(dut.dma_wr.ready):
                pl = ctx.get(dut.dma_wr.payload)
                if wr_cur is None:
                    wr_cur = [pl.addr, pl.len, b""]
                wr_cur[2] += int(pl.data).to_bytes(W, "little")[:pl.nbytes]
                if pl.last:
                    assert len(wr_cur[2]) == wr_cur[1]
                    mem[wr_cur[0]:wr_cur[0] + wr_cur[1]] = wr_cur[2]
                    writes.append((wr_cur[0], wr_cur[2]))
                    wr_cur = None
                busy = True
            idle = 0 if busy else idle + 1
            if not todo and idle > 40:
                break
            await ctx.tick()
            cyc += 1
        result["cycles"] = cyc

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()
    return answers, writes, result["cycles"]


def model(ops, mem):
    answers, writes = [], []
    for op, addr, cmp_, sa in ops:
        orig = int.from_bytes(mem[addr:addr + 8], "little")
        answers.append(orig)
        if op == ATOMIC_FAA:
            new = (orig + sa) & MASK64
        elif orig == cmp_:
            new = sa
        else:
            continue
        mem[addr:addr + 8] = new.to_bytes(8, "little")
        writes.append((addr, new.to_bytes(8, "little")))
    return answers, writes


def make_ops(rng, n, mem):
    ops = []
    for _ in range(n):
        addr = rng.choice([0x40, 0x48, 0x80, 0x83])    # 0x83: unaligned is the responder's problem
        if rng.random() < 0.5:
            ops.append((ATOMIC_FAA, addr, rng.getrandbits(64), rng.choice([1, MASK64, rng.getrandbits(64)])))
        else:
            cur = int.from_bytes(mem[addr:addr + 8], "little")
            # compare sometimes equal to the current value (mostly right for the first ops)
            cmp_ = cur if rng.random() < 0.5 else rng.getrandbits(64)
            ops.append((ATOMIC_CAS, addr, cmp_, rng.getrandbits(64)))
    return ops


@pytest.mark.parametrize("bp", [False, True])
def test_atomic_directed(bp):
    mem = bytearray(random.Random(7).randbytes(256))
    mem[0x40:0x48] = (5).to_bytes(8, "little")
    mem[0x80:0x88] = MASK64.to_bytes(8, "little")
    ops = [
        (ATOMIC_CAS, 0x40, 5, 99),          # succeeds: 5 -> 99
        (ATOMIC_CAS, 0x40, 5, 7),           # fails: memory stays 99, nothing written
        (ATOMIC_FAA, 0x40, 0, 1),           # 99 -> 100
        (ATOMIC_FAA, 0x80, 0, 2),           # wraps: 2**64-1 + 2 -> 1
        (ATOMIC_FAA, 0x80, 0, 0),           # reads 1
    ]
    before = bytearray(mem)
    answers, writes, _ = run_atomic(8, ops, mem, bp)
    assert answers == [5, 99, 99, MASK64, 1]
    assert [a for a, _ in writes] == [0x40, 0x40, 0x80, 0x80]   # the failed CAS wrote nothing
    assert int.from_bytes(mem[0x40:0x48], "little") == 100
    assert int.from_bytes(mem[0x80:0x88], "little") == 1
    # nothing else changed
    for i in range(len(mem)):
        if not (0x40 <= i < 0x48 or 0x80 <= i < 0x88):
            assert mem[i] == before[i]


@pytest.mark.parametrize("data_bytes,bp,seed", [(8, True, 3), (64, True, 4), (8, False, 5)])
def test_atomic_random(data_bytes, bp, seed):
    rng = random.Random(seed)
    mem = bytearray(rng.randbytes(256))
    ops = make_ops(rng, 25, mem)
    exp_mem = bytearray(mem)
    exp_answers, exp_writes = model(ops, exp_mem)
    answers, writes, _ = run_atomic(data_bytes, ops, mem, bp, seed)
    assert answers == exp_answers
    assert writes == exp_writes
    assert mem == exp_mem


def test_atomic_is_serialized():
    """Back-to-back FAAs on one address each see the previous result (no lost update)."""
    mem = bytearray(64)
    ops = [(ATOMIC_FAA, 8, 0, 1)] * 10
    answers, _, _ = run_atomic(8, ops, mem, bp=True, seed=11)
    assert answers == list(range(10))
    assert int.from_bytes(mem[8:16], "little") == 10


@pytest.mark.parametrize("bad", [0, 4, 12, 128, 8.0, True])
def test_atomic_bad_data_bytes(bad):
    with pytest.raises(ValueError, match=r"data_bytes must be a power of two in \[8, 64\]"):
        AtomicUnit(bad)
