"""AtomicUnit: 8-byte CAS / FAA through DMA against a Python memory model."""

import random

import pytest
from amaranth.sim import Simulator

from hw.rnic.atomic import AtomicUnit, ATOMIC_CAS, ATOMIC_FAA
from sim.host import HostMemory
from tests.hw.dma_models import PortMemorySim, tick_until

MASK64 = (1 << 64) - 1


def run_atomic(data_bytes, ops, mem, bp, seed=1, fail=None, errs=None, inflight=1, lat=None,
               stats=None):
    """Run ``ops`` (list of (op, addr, compare, swap_add)) against ``mem`` (a bytearray)
    through the shared DMA port model; return (answers, writes, cycles). ``fail`` makes DMA
    requests fail (see PortMemorySim); ``errs`` (a list) receives each answer's err. Each
    operation carries its index as ``ctx``; the answers must come back with it, in order.
    ``stats`` (a dict) receives the DMA reads issued and ``claim_waits``. Every cycle a
    monitor asks ``owner_busy`` about a random owner (the low 3 bits of ``ctx``) and checks
    it against the operations taken and not yet answered."""
    rng = random.Random(seed)
    dut = AtomicUnit(data_bytes, inflight=inflight, ctx_bits=8, owner_bits=3)
    host = HostMemory()
    host.write(0, bytes(mem))
    if lat is None:
        lat = (1, 6) if bp else (1, 1)
    dma = PortMemorySim(data_bytes, mem=host, seed=seed, lat=lat,
                        p_ready=0.6 if bp else 1.0, p_gap=0.3 if bp else 0.0, fail=fail)
    answers = []
    result = {}

    def p(x):
        return rng.random() < x if bp else True

    issued = []

    async def drive(ctx):
        for op, addr, cmp_, sa in ops:
            while not p(0.7):
                await ctx.tick()
            ctx.set(dut.i.payload, {"op": op, "addr": addr, "compare": cmp_, "swap_add": sa,
                                    "ctx": len(issued) & 0xFF})
            issued.append(1)
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
                assert int(pl.ctx) == len(answers) & 0xFF       # in request order, ctx kept
                answers.append(int(pl.orig))
                if errs is not None:
                    errs.append(int(pl.err))
        result["cycles"] = cyc
        if stats is not None:
            stats["claim_waits"] = ctx.get(dut.claim_waits)
        for _ in range(3):
            await ctx.tick()
        assert not ctx.get(dut.busy)

    async def owners(ctx):
        live = []               # ctx of the operations taken and not yet answered, in order
        mrng = random.Random(seed + 100)
        checked = 0
        while True:
            ctx.set(dut.owner, mrng.randrange(8))
            _, _, iv, ir, ictx, ov, orr, octx, own, busy = await ctx.tick().sample(
                dut.i.valid, dut.i.ready, dut.i.payload.ctx, dut.o.valid, dut.o.ready,
                dut.o.payload.ctx, dut.owner, dut.owner_busy)
            assert busy == any(c & 7 == own for c in live), (own, live)
            checked += busy
            if ov and orr:
                assert live.pop(0) == octx
            if iv and ir:
                live.append(int(ictx))
            result["owner_busy_seen"] = checked

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    dma.clock(sim)
    dma.read_port(sim, dut.dma_rd)
    dma.write_port(sim, dut.dma_wr)
    sim.add_testbench(drive, background=True)
    sim.add_testbench(owners, background=True)
    sim.add_testbench(sink)
    sim.run()
    assert result.get("owner_busy_seen", 0) > 0 or len(ops) == 0
    mem[:] = host.read(0, len(mem))
    writes = [(a, data) for _, a, n, _, ok, data in dma.writes if ok]
    if stats is not None:
        stats["reads"] = len(dma.reads)
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


@pytest.mark.parametrize("data_bytes,bp,seed,inflight", [
    (8, True, 3, 1), (64, True, 4, 1), (8, False, 5, 1),
    (8, True, 6, 4), (64, True, 7, 16), (8, False, 8, 3)])
def test_atomic_random(data_bytes, bp, seed, inflight):
    """Random CAS / FAA on four addresses (two in one quadword) against a sequential model:
    with several operations in flight the answers, the writes (in order) and the memory are
    those of executing them one at a time."""
    rng = random.Random(seed)
    mem = bytearray(rng.randbytes(256))
    ops = make_ops(rng, 40, mem)
    exp_mem = bytearray(mem)
    exp_answers, exp_writes = model(ops, exp_mem)
    answers, writes, _ = run_atomic(data_bytes, ops, mem, bp, seed, inflight=inflight,
                                    lat=(1, 30) if inflight > 1 else None)
    assert answers == exp_answers
    assert writes == exp_writes
    assert mem == exp_mem


@pytest.mark.parametrize("inflight", [1, 4])
def test_atomic_is_serialized(inflight):
    """Back-to-back FAAs on one address each see the previous result (no lost update), also
    with several operations allowed in flight: each waits for the one before (counted)."""
    mem = bytearray(64)
    ops = [(ATOMIC_FAA, 8, 0, 1)] * 10
    stats = {}
    answers, _, _ = run_atomic(8, ops, mem, bp=True, seed=11, inflight=inflight, stats=stats)
    assert answers == list(range(10))
    assert int.from_bytes(mem[8:16], "little") == 10
    if inflight > 1:
        assert stats["claim_waits"] > 0


def test_atomics_on_different_addresses_overlap():
    """With a 40-cycle host round trip, 16 FAAs on 16 addresses take about one round trip
    per operation with one in flight, and a fraction of that with eight in flight; the
    results are the same."""
    cycles = {}
    for inflight in (1, 8):
        mem = bytearray(256)
        ops = [(ATOMIC_FAA, 8 * k, 0, k + 1) for k in range(16)]
        answers, writes, cycles[inflight] = run_atomic(8, ops, mem, bp=False, inflight=inflight,
                                                       lat=(40, 40))
        assert answers == [0] * 16
        assert [int.from_bytes(mem[8 * k:8 * k + 8], "little") for k in range(16)] == \
            list(range(1, 17))
    assert cycles[1] >= 16 * 80            # a read and a write round trip each
    assert cycles[8] * 4 < cycles[1], cycles


@pytest.mark.parametrize("name,kw,msg", [
    ("inflight", {"inflight": 0}, r"inflight must be an integer in \[1, 16\], not 0"),
    ("inflight", {"inflight": 17}, r"inflight must be an integer in \[1, 16\], not 17"),
    ("ctx_bits", {"ctx_bits": 0}, r"ctx_bits must be an integer in \[1, 64\], not 0"),
    ("owner_bits", {"ctx_bits": 4, "owner_bits": 5},
     r"owner_bits must be an integer in \[0, 4\], not 5"),
    ("owner_bits", {"owner_bits": -1}, r"owner_bits must be an integer in \[0, 1\], not -1"),
])
def test_atomic_bad_parameters(name, kw, msg):
    with pytest.raises(ValueError, match=msg):
        AtomicUnit(8, **kw)


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
