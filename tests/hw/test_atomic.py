"""AtomicUnit: 8-byte CAS / FAA through DMA against a Python memory model."""

import random

import pytest
from amaranth.sim import Simulator

from hw.atomic import AtomicUnit, ATOMIC_CAS, ATOMIC_FAA
from sim.host import HostMemory
from tests.hw.dma_models import PortMemorySim, tick_until

MASK64 = (1 << 64) - 1


def run_atomic(data_bytes, ops, mem, bp, seed=1, fail=None, errs=None):
    """Run ``ops`` (list of (op, addr, compare, swap_add)) against ``mem`` (a bytearray)
    through the shared DMA port model; return (answers, writes, cycles). ``fail`` makes DMA
    requests fail (see PortMemorySim); ``errs`` (a list) receives each answer's err."""
    rng = random.Random(seed)
    dut = AtomicUnit(data_bytes)
    host = HostMemory()
    host.write(0, bytes(mem))
    dma = PortMemorySim(data_bytes, mem=host, seed=seed, lat=(1, 6) if bp else (1, 1),
                        p_ready=0.6 if bp else 1.0, p_gap=0.3 if bp else 0.0, fail=fail)
    answers = []
    result = {}

    def p(x):
        return rng.random() < x if bp else True

    async def drive(ctx):
        for op, addr, cmp_, sa in ops:
            while not p(0.7):
                await ctx.tick()
            ctx.set(dut.i.payload, {"op": op, "addr": addr, "compare": cmp_, "swap_add": sa})
            ctx.set(dut.i.valid, 1)
            await tick_until(ctx, dut.i.ready)
            ctx.set(dut.i.valid, 0)

    async def sink(ctx):
        cyc = 0
        while len(answers) < len(ops):
            r = p(0.6)
            ctx.set(dut.o.ready, r)
            _, _, v, pl = await ctx.tick().sample(dut.o.valid, dut.o.payload)
            cyc += 1
            if v and r:
                answers.append(int(pl.orig))
                if errs is not None:
                    errs.append(int(pl.err))
        result["cycles"] = cyc

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    dma.clock(sim)
    dma.read_port(sim, dut.dma_rd)
    dma.write_port(sim, dut.dma_wr)
    sim.add_testbench(drive, background=True)
    sim.add_testbench(sink)
    sim.run()
    mem[:] = host.read(0, len(mem))
    writes = [(a, data) for _, a, n, _, ok, data in dma.writes if ok]
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


def test_atomic_errors():
    """A failed read: err, nothing written; a failed write: err (the host kept the old value);
    the unit goes on with the next operation."""
    mem = bytearray(256)
    mem[0x40:0x48] = (5).to_bytes(8, "little")
    mem[0x80:0x88] = (9).to_bytes(8, "little")

    def fail(a, n, is_write):
        return (a == 0x40 and not is_write) or (a == 0x80 and is_write)

    ops = [(ATOMIC_FAA, 0x40, 0, 1), (ATOMIC_FAA, 0x80, 0, 1), (ATOMIC_FAA, 0x48, 0, 3)]
    errs = []
    answers, writes, _ = run_atomic(8, ops, mem, bp=True, fail=fail, errs=errs)
    assert errs == [1, 1, 0]
    assert answers[1:] == [9, 0]
    assert int.from_bytes(mem[0x40:0x48], "little") == 5      # not written after a failed read
    assert int.from_bytes(mem[0x80:0x88], "little") == 9      # the failed write changed nothing
    assert int.from_bytes(mem[0x48:0x50], "little") == 3
