"""cocotb tests of the host side (hw/host/, sim/host.py) on the CopySystem design.

Run through tests/test_host_cocotb.py (and tests/test_simclock.py), which build
:class:`~tests.cocotb.copy_system.CopySystem` of :func:`~tests.cocotb.copy_system.copy_config`
with sim/verilator.py. ``RNIC_HOST`` (environment, ``python`` or ``rtl``) names the host kind
of the build (checked against its ports); W is read from the design's ``data_bytes`` output.
``TB_SEED`` (environment) seeds the test data.

The copy engine's timing registers (``T_FIRST``, ``T_LAST``, ``T_END``, in cycles) and the
link byte totals (``link_down_bytes``, ``link_up_bytes``) are read over MMIO / VPI once a
copy has ended, so that no Python runs during the copy but the host drivers.

The clock and reset come from sim/simclock.py: a cocotb ``Clock`` on a classic build, or
the build's own clock (``InternalClock``, compat or plain). The drivers of sim/host.py are
constructed in the time step the reset is raised (they zero their mailbox inputs) and
started once it is released.
"""

import json
import os
import random
import time

import cocotb
from cocotb.simtime import get_sim_time
from cocotb.triggers import RisingEdge, Timer

from hw.config import HOST_KINDS
from hw.dma.read_engine import split_reads
from hw.dma.write_engine import split_writes
from hw.formats import TlpStatus, tlp_cost, tlp_dwords
from hw.host.host_side import pcie_params
from hw.host.py_port import py_req_layout
from sim.host import HostMemory, MmioDriver, PyHostDriver, RtlHostMemory
from sim.simclock import start_clock_and_reset, wait_cycles
from sim.tlp_host import split_completions
from tests.cocotb.copy_system import copy_config
from tests.cocotb.dma_copy import (ACKED, BADTAG, DONE, DST, ERR, ERR_THIS, GO, LEN, OVERLAP,
                                   SRC, T_END, T_FIRST, T_LAST)

SEED = int(os.environ.get("TB_SEED", "1"))
CHUNK = 256                     # CopySystem's default DmaCopy chunk
IDLE_CYCLES = int(os.environ.get("TB_IDLE_CYCLES", "100000"))
GUARD = 32                      # bytes checked untouched on each side of a destination


def build_kind(dut):
    """The host kind of the build: ``RNIC_HOST``, checked against the design's ports."""
    kind = os.environ.get("RNIC_HOST")
    if kind not in HOST_KINDS:
        raise AssertionError(f"RNIC_HOST must be one of {list(HOST_KINDS)} (the host kind of "
                             f"the build), not {kind!r}")
    has_py = hasattr(dut, "h_py_req")
    if has_py != (kind == "python"):
        raise AssertionError(f"RNIC_HOST={kind} but the build has "
                             f"{'a Python' if has_py else 'an RTL'} host")
    return kind


def build_config(dut):
    """(kind, cfg) of the build. W comes from the width of the host's TLP port (``h_py_req``
    or ``h_wtap``: a whole MWr of ``max_payload + W`` bytes), which is known before the
    simulation has evaluated anything (the ``data_bytes`` output is checked after the
    reset)."""
    kind = build_kind(dut)
    width = len(dut.h_py_req if kind == "python" else dut.h_wtap)
    for W in (8, 16, 32, 64):
        cfg = copy_config(kind, W)
        if py_req_layout(W, cfg.nic.max_payload).size == width:
            return kind, cfg
    raise AssertionError(f"no W in 8 .. 64 gives the {width}-bit host port of the build")


def copy_tlps(cfg, src, dst, n, chunk=CHUNK):
    """Python model of a copy's TLPs: counts and link bytes (TLP overhead included)."""
    nic, host = cfg.nic, cfg.host
    ov = nic.tlp_overhead
    out = {"mrd": 0, "mwr": 0, "cpld": 0, "down": 0, "up": 0}
    for off in range(0, n, chunk):
        k = min(chunk, n - off)
        for a, ln in split_reads(src + off, k, nic.max_read_request):
            out["mrd"] += 1
            out["down"] += tlp_cost(0, ov)
            for lo, cl in split_completions(a, ln, host.cpl_bytes):
                out["cpld"] += 1
                out["up"] += tlp_cost(tlp_dwords(a + lo, cl), ov)
        for a, ln in split_writes(dst + off, k, nic.max_payload):
            out["mwr"] += 1
            out["down"] += tlp_cost(tlp_dwords(a, ln), ov)
    return out


class Bench:
    """One test's host side: memory, DMA server, MMIO, helpers for copies."""

    def __init__(self, dut, cfg, kind, mem, dma, mmio):
        self.dut, self.cfg, self.kind = dut, cfg, kind
        self.mem, self.dma, self.mmio = mem, dma, mmio
        self.W = cfg.nic.data_bytes
        self.period_ns = cfg.nic.period_ns
        if kind == "rtl":
            self.base, self.size = cfg.host.rtl_mem_base, cfg.host.rtl_mem_bytes
        else:
            self.base, self.size = 0x1000_0000, 1 << 16

    @classmethod
    async def start(cls, dut, *, backpressure=None, reorder=0.0, fail=None, seed=SEED):
        kind, cfg = build_config(dut)
        # the mailbox ports are zeroed in the time step the reset is raised
        if kind == "python":
            mem = HostMemory()
            dma = PyHostDriver(dut, "h_py_", mem, cfg.replace(host__reorder=reorder),
                               backpressure=backpressure, seed=seed, fail=fail)
        else:
            assert backpressure is None and fail is None and not reorder, \
                "the RTL host has no back-pressure, reordering or failure options"
            mem = dma = RtlHostMemory(dut, "h_", cfg)
        mmio = MmioDriver(dut, "h_mmio_")
        await start_clock_and_reset(dut, cfg.nic.clock_mhz)
        assert int(dut.data_bytes.value) == cfg.nic.data_bytes, int(dut.data_bytes.value)
        dma.start()
        return cls(dut, cfg, kind, mem, dma, mmio)

    # -- host memory as the CPU sees it
    async def write(self, addr, data):
        if self.kind == "python":
            self.mem.write(addr, data)
        else:
            await self.mem.write(addr, data)

    async def read(self, addr, n):
        """The real memory (RTL host: read back through the CPU port)."""
        if self.kind == "python":
            return self.mem.read(addr, n)
        return await self.mem.readback(addr, n)

    # -- the copy engine
    async def program(self, src, dst, n):
        await self.mmio.write(SRC, src)
        await self.mmio.write(DST, dst)
        await self.mmio.write(LEN, n)

    async def copy(self, src, dst, n):
        await self.program(src, dst, n)
        await self.mmio.write(GO, 1)

    async def wait_done(self, *, acked=True, timeout_ns=2_000_000, poll_ns=100):
        """Poll until DONE (and ACKED) read 1."""
        t0 = get_sim_time("ns")
        while True:
            if await self.mmio.read(DONE) == 1 and (not acked or await self.mmio.read(ACKED) == 1):
                return
            assert get_sim_time("ns") - t0 < timeout_ns, "copy did not finish"
            if poll_ns:
                await Timer(poll_ns, "ns")

    async def regs(self):
        out = {}
        for name, a in (("err", ERR), ("badtag", BADTAG), ("overlap", OVERLAP),
                        ("t_first", T_FIRST), ("t_last", T_LAST), ("t_end", T_END)):
            out[name] = await self.mmio.read(a)
        return out

    def link_bytes(self):
        return int(self.dut.link_down_bytes.value), int(self.dut.link_up_bytes.value)

    def fmt(self, n):
        return f"{n} B ({n * self.period_ns:.0f} ns)"


def diff_at(got, want):
    return next((k for k in range(len(want)) if got[k] != want[k]), None)


@cocotb.test()
async def test_random_copies(dut):
    """Copies of random length (1 B .. 16 KB) and alignment, checked byte for byte with the
    bytes around the destination; Python host: with back-pressure and completion
    reordering. The link bytes of every copy equal the model's (TLP overhead included)."""
    kind = build_kind(dut)
    if kind == "python":
        b = await Bench.start(dut, backpressure=0.3, reorder=0.3)
    else:
        b = await Bench.start(dut)
    W = b.W
    rng = random.Random(SEED * 1000 + W)
    lengths = [1, W - 1, W, W + 1, 255, 256, 257, 511, 512, 513, 4096, 16384]
    lengths += [rng.randrange(1, 16385) for _ in range(10)]
    lengths += [rng.randrange(1, 600) for _ in range(10)]
    half = b.size // 2
    total = {"mrd": 0, "mwr": 0}
    for i, n in enumerate(lengths):
        if kind == "rtl":
            src = b.base + rng.randrange(GUARD, half - n - GUARD)
            dst = b.base + half + rng.randrange(GUARD, half - n - GUARD)
        else:
            src = 0x1000_0000 + i * 0x10_0000 + rng.randrange(0, 4096)
            dst = 0x7FFF_0000_0000 + i * 0x10_0000 + rng.randrange(0, 4096)
        data = bytes(rng.getrandbits(8) for _ in range(n))
        await b.write(src, data)
        await b.write(dst - GUARD, b"\xee" * (n + 2 * GUARD))
        d0, u0 = b.link_bytes()
        await b.copy(src, dst, n)
        await b.wait_done()
        d1, u1 = b.link_bytes()
        got = await b.read(dst - GUARD, n + 2 * GUARD)
        assert got[GUARD:GUARD + n] == data, (
            f"copy {i}: {n} bytes {src:#x} -> {dst:#x}: first difference at byte "
            f"{diff_at(got[GUARD:GUARD + n], data)}")
        assert got[:GUARD] == b"\xee" * GUARD, f"copy {i}: bytes before dst written"
        assert got[GUARD + n:] == b"\xee" * GUARD, f"copy {i}: bytes after dst written"
        if kind == "rtl":            # the CPU's shadow, kept by the write tap, agrees
            assert b.mem.read(dst - GUARD, n + 2 * GUARD) == got, f"copy {i}: shadow differs"
        r = await b.regs()
        assert r["err"] == 0 and r["badtag"] == 0, (i, r)
        model = copy_tlps(b.cfg, src, dst, n)
        assert ((d1 - d0) & 0xFFFF_FFFF, (u1 - u0) & 0xFFFF_FFFF) == (model["down"], model["up"]), \
            (i, n, src, dst, d1 - d0, u1 - u0, model)
        total["mrd"] += model["mrd"]
        total["mwr"] += model["mwr"]
    if kind == "python":
        assert (b.dma.reads, b.dma.writes) == (total["mrd"], total["mwr"])
        assert b.dma.py.reordered > 0, "no completion was reordered"
        dut._log.info("%d copies, %d bytes, %d MRd, %d MWr, %d reads reordered", len(lengths),
                      sum(lengths), b.dma.reads, b.dma.writes, b.dma.py.reordered)
    else:
        assert b.dma.writes == total["mwr"], (b.dma.writes, total)
        dut._log.info("%d copies, %d bytes, %d MWr seen by the write tap", len(lengths),
                      sum(lengths), b.dma.writes)


@cocotb.test()
async def test_read_after_write(dut):
    """A copy whose source is the previous copy's destination sees the new data, though its
    reads leave right behind the previous copy's writes.

    Copy 1 (A -> B) runs; copy 2 (the last bytes of B -> C) is programmed and its GO given
    while copy 1 runs, so it starts in the cycle after copy 1 is DONE (its last write just
    handed to the DMA engine) and its reads follow copy 1's last writes on the link
    (OVERLAP: copy 2's reads issued while a write of copy 1 was not yet answered): the host
    must apply them in link order. A host that answers a read before applying the write
    ahead of it fails here with "B's old bytes".

    (With one client a write is on the link once its last beat is handed over: the write
    engine cuts through. So this checks the link and the host, not the host interface's
    rule that a read waits for the writes accepted before it, which needs two clients:
    tests/hw/test_host_if.py::test_read_does_not_pass_earlier_write.)"""
    kind = build_kind(dut)
    b = await (Bench.start(dut, backpressure=0.2) if kind == "python" else Bench.start(dut))
    rng = random.Random(SEED + 7)
    quarter = b.size // 4
    A, B, C = b.base + 3, b.base + quarter + 5, b.base + 2 * quarter + 1
    n, tail = 3000, 700
    data = bytes(rng.getrandbits(8) for _ in range(n))
    old = bytes(rng.getrandbits(8) for _ in range(n))
    await b.write(A, data)
    await b.write(B, old)                    # what a read that passed the writes would see
    await b.write(C, bytes(tail))
    await b.copy(A, B, n)
    await b.program(B + n - tail, C, tail)    # copy 1 uses the values it started with
    await b.mmio.write(GO, 1)                 # remembered: starts when copy 1 is DONE
    await b.wait_done()
    r = await b.regs()
    assert r["err"] == 0 and r["badtag"] == 0, r
    assert await b.read(B, n) == data
    got = await b.read(C, tail)
    want, was = data[n - tail:], old[n - tail:]
    bad = [k for k in range(tail) if got[k] != want[k]]
    stale = [k for k in bad if got[k] == was[k]]
    assert not bad, (f"copy 2: {len(bad)} bytes wrong (first at {bad[0]}), {len(stale)} of them "
                     f"B's old bytes (a read passed an earlier write)")
    dut._log.info("copy 2: %d of its %d reads issued while copy 1's writes were unanswered",
                  r["overlap"], -(-tail // CHUNK))
    assert r["overlap"] > 0, "copy 2's reads did not overlap copy 1's writes: no test"


@cocotb.test()
async def test_bandwidth(dut):
    """A 16 KB copy runs at the rate the PCIe link model allows with its TLP overhead (or
    the data path's W bytes per cycle, if lower)."""
    b = await Bench.start(dut)
    W, cfg = b.W, b.cfg
    n = 16384
    src, dst = b.base, b.base + b.size // 2
    await b.write(src, bytes(range(256)) * (n // 256))
    d0, u0 = b.link_bytes()
    await b.copy(src, dst, n)
    await b.wait_done()
    d1, u1 = b.link_bytes()
    assert await b.read(dst, n) == await b.read(src, n)
    r = await b.regs()
    assert r["err"] == 0
    model = copy_tlps(cfg, src, dst, n)
    down, up = (d1 - d0) & 0xFFFF_FFFF, (u1 - u0) & 0xFFFF_FFFF
    assert (down, up) == (model["down"], model["up"]), (down, up, model)
    _, link = pcie_params(cfg)                           # link bytes per cycle, each way
    # the busier direction sets the rate; neither may go faster than the data path
    expect = min(W, link * n / max(up, down))            # data bytes per cycle
    cycles = r["t_last"] - r["t_first"]                  # first to last read beat
    rate = (n - W) / cycles
    end_to_end = n / r["t_end"]
    gbps = rate * 8 * cfg.nic.clock_mhz / 1000
    dut._log.info(
        "W=%d: %d B in %d cycles (first to last read beat): %.2f B/cycle = %.1f Gb/s of data; "
        "model %.2f B/cycle (PCIe %.0f Gb/s = %.1f B/cycle each way, link bytes down %d, up %d "
        "for %d data bytes: %d MRd, %d MWr, %d CplD); %.0f %% of the model; link busy "
        "down %.0f %%, up %.0f %%; GO to end %d cycles (%.2f B/cycle)", W, n, cycles, rate,
        gbps, expect, cfg.host.pcie_gbps, link, down, up, n, model["mrd"], model["mwr"],
        model["cpld"], 100 * rate / expect, 100 * down / link / cycles,
        100 * up / link / cycles, r["t_end"], end_to_end)
    with open("bandwidth.json", "w") as f:
        json.dump({"W": W, "kind": b.kind, "bytes": n, "cycles": cycles,
                   "bytes_per_cycle": rate, "data_gbps": gbps, "model_bytes_per_cycle": expect,
                   "link_down_bytes": down, "link_up_bytes": up, "t_end": r["t_end"]}, f)
    # The shaper may run ahead by one TLP's credit (an idle link saves that much), nothing
    # more; the pipeline (tags, rings, store and forward) must keep the link at 90 %.
    assert 0.90 * expect <= rate <= 1.03 * expect, (rate, expect)


@cocotb.test()
async def test_latency(dut):
    """A one-word copy: its read data arrives one DMA read round trip (2 * pcie_ns +
    host_mem_ns) after GO, plus a few cycles of the engines; it ends one write round trip
    (2 * pcie_ns and the host's write turnaround) after that."""
    from hw.host.up_mux import WR_TURNAROUND
    b = await Bench.start(dut)
    cfg, W, p = b.cfg, b.W, b.period_ns
    src, dst = b.base + 0x100, b.base + b.size // 2 + 0x100
    await b.write(src, bytes(range(1, W + 1)))
    await b.copy(src, dst, W)
    await b.wait_done()
    assert await b.read(dst, W) == bytes(range(1, W + 1))
    r = await b.regs()
    read_ns = r["t_first"] * p
    end_ns = r["t_end"] * p
    rtt = cfg.host.dma_read_ns
    wr_rtt = 2 * cfg.host.pcie_ns + WR_TURNAROUND * p
    dut._log.info("W=%d: read data %.0f ns after GO (2*pcie_ns+host_mem_ns = %.0f ns, +%d "
                  "cycles); copy ended %.0f ns after GO (read + write round trips %.0f ns, "
                  "+%d cycles)", W, read_ns, rtt, r["t_first"] - round(rtt / p), end_ns,
                  rtt + wr_rtt, r["t_end"] - round((rtt + wr_rtt) / p))
    with open("latency.json", "w") as f:
        json.dump({"W": W, "kind": b.kind, "t_first_cycles": r["t_first"],
                   "t_end_cycles": r["t_end"], "read_rtt_ns": rtt, "period_ns": p}, f)
    # No faster than the link model and the host allow; on top, the engines' pipeline: the
    # copy engine's request, the read engine's tag and MRd register, the shaper of each
    # link, the host adapter, the ring write and read (9 cycles measured to the read data,
    # 12 allowed), then the store and forward and the write engine (13 measured in all).
    assert rtt <= read_ns <= rtt + 12 * p, (read_ns, rtt)
    assert rtt + wr_rtt <= end_ns <= rtt + wr_rtt + 20 * p, (end_ns, rtt + wr_rtt)


@cocotb.test()
async def test_idle_rate(dut):
    """Simulated cycles per second with the host drivers attached but idle: their
    coroutines must not wake up."""
    b = await Bench.start(dut, **({"backpressure": 0.3} if build_kind(dut) == "python" else {}))
    await wait_cycles(dut, 10)
    wakeups = b.dma.wakeups
    t0 = time.perf_counter()
    await wait_cycles(dut, IDLE_CYCLES)
    idle_rate = IDLE_CYCLES / (time.perf_counter() - t0)
    assert b.dma.wakeups == wakeups, (f"the host driver woke {b.dma.wakeups - wakeups} times "
                                      f"in {IDLE_CYCLES} idle cycles")

    # For comparison: a Python coroutine that wakes on every clock edge.
    py_cycles = 20_000
    t0 = time.perf_counter()
    for _ in range(py_cycles):
        await RisingEdge(dut.clk)
    py_rate = py_cycles / (time.perf_counter() - t0)
    dut._log.info("idle (%s host, W=%d): %.0f cycles/s; Python awaiting every edge: %.0f "
                  "cycles/s", b.kind, b.W, idle_rate, py_rate)
    with open("idle_rate.json", "w") as f:
        json.dump({"idle_cycles_per_s": idle_rate, "per_clock_python_cycles_per_s": py_rate,
                   "idle_cycles": IDLE_CYCLES, "W": b.W, "kind": b.kind}, f)
    if b.kind == "python":
        assert b.dma.reads == b.dma.writes == 0
    else:
        assert b.dma.writes == 0


@cocotb.test()
async def test_failed_read(dut):
    """A read the host fails (Python host: ``fail=``; RTL host: an address outside its
    memory) ends the copy with ERR = 1 and the destination untouched; a chunk whose read
    failed in part is dropped, the others are written; a failed write sets ERR too; the next
    copy is clean."""
    kind = build_kind(dut)
    bad = []                           # (lo, hi, is_write) ranges the Python host fails

    def fail(addr, n, is_write):
        for lo, hi, w in bad:
            if w == is_write and addr < hi and lo < addr + n:
                return TlpStatus.UR
        return None

    b = await (Bench.start(dut, fail=fail) if kind == "python" else Bench.start(dut))
    rng = random.Random(SEED + 11)
    n = 1000
    dst = b.base + b.size // 2 + 7
    data = bytes(rng.getrandbits(8) for _ in range(n))

    async def run(src, n, dst):
        await b.write(dst - GUARD, b"\xee" * (n + 2 * GUARD))
        await b.copy(src, dst, n)
        await b.wait_done()
        return await b.regs(), await b.read(dst - GUARD, n + 2 * GUARD)

    # 1. every read fails: nothing is written
    if kind == "python":
        src = b.base + 0x100 + 3
        await b.write(src, data)
        bad[:] = [(src, src + n, False)]
        writes = b.dma.writes
    else:
        src = b.base + b.size + 0x100 + 3            # outside the RTL host's memory
    r, got = await run(src, n, dst)
    assert r["err"] == ERR_THIS, r
    assert got == b"\xee" * (n + 2 * GUARD), "a failed copy wrote its destination"
    if kind == "python":
        assert b.dma.writes == writes, "a failed copy issued writes"

    # 2. a read that fails in part: the chunk with the failed TLP is dropped
    if kind == "python":
        src = b.base + 0x2000 + 5
        await b.write(src, data)
        bad[:] = [(src + 300, src + 310, False)]   # in chunk 1 (bytes 256 .. 511)
        keep = [(0, 256), (512, n)]
        sdata = data
    else:
        # the window ends 300 bytes in: chunk 0 reads inside, chunk 1 straddles the end
        src = b.base + b.size - 300
        sdata = data[:300]
        await b.write(src, sdata)
        keep = [(0, 256)]
    r, got = await run(src, n, dst)
    assert r["err"] == ERR_THIS, r
    want = bytearray(b"\xee" * (n + 2 * GUARD))
    for lo, hi in keep:
        want[GUARD + lo:GUARD + hi] = sdata[lo:hi]
    assert got == bytes(want), (f"partly failed copy: first difference at byte "
                                f"{diff_at(got, want) - GUARD}")

    # 3. a failed write sets ERR as well
    src = b.base + 0x4000 + 1
    await b.write(src, data)
    if kind == "python":
        bad[:] = [(dst, dst + n, True)]
        r, _ = await run(src, n, dst)
    else:
        await b.copy(src, b.base + b.size + 0x40, n)         # outside the memory
        await b.wait_done()
        r = await b.regs()
    assert r["err"] == ERR_THIS, r

    # 4. and a good copy after them is clean
    bad[:] = []
    r, got = await run(src, n, dst)
    assert r["err"] == 0 and r["badtag"] == 0, r
    assert got[GUARD:GUARD + n] == data


@cocotb.test(skip=os.environ.get("TB_FAIL_DEMO") != "1")
async def test_fail_demo(dut):
    """Fails on purpose (only when TB_FAIL_DEMO=1): checks that failures reach pytest."""
    await start_clock_and_reset(dut, 250.0)
    assert 1 == 2, "deliberate failure"
