"""cocotb tests of the host model (sim/host.py) against the DmaCopy design (dma_copy.py).

Run through tests/test_host_cocotb.py (which builds the design with sim/verilator.py).
The design's W is taken from the DUT. ``TB_SEED`` (environment) seeds the test data.
"""

import json
import os
import random
import time

import cocotb
from cocotb.simtime import get_sim_time
from cocotb.triggers import RisingEdge, Timer

from hw.config import HostConfig, preset
from sim.host import DmaSlave, HostMemory, Mmio, start_clock_and_reset
from tests.cocotb.dma_copy import SRC, DST, LEN, GO, DONE

CLOCK_MHZ = 250.0
SEED = int(os.environ.get("TB_SEED", "1"))


async def setup(dut, host_cfg=None, backpressure=0.3, seed=SEED):
    """Clock + reset, then a HostMemory, a DmaSlave on the DMA ports and an Mmio master."""
    host_cfg = host_cfg or preset("small").host
    await start_clock_and_reset(dut, CLOCK_MHZ)
    mem = HostMemory()
    dma = DmaSlave(dut, "", mem, dut.clk, host_cfg, CLOCK_MHZ, backpressure=backpressure,
                   seed=seed)
    mmio = Mmio(dut, "mmio__", dut.clk, host_cfg.mmio_ns)
    return mem, dma, mmio


async def start_copy(mmio, src, dst, n):
    await mmio.write(SRC, src)
    await mmio.write(DST, dst)
    await mmio.write(LEN, n)
    await mmio.write(GO, 1)


async def wait_done(mmio, timeout_ns=1_000_000):
    t0 = get_sim_time("ns")
    while (await mmio.read(DONE)) != 1:
        assert get_sim_time("ns") - t0 < timeout_ns, "copy did not finish"
        await Timer(200, "ns")


@cocotb.test()
async def test_random_copies(dut):
    """Copies of random length (0..5000) and alignment with back-pressure; memory checked."""
    mem, dma, mmio = await setup(dut, backpressure=0.3)
    W = dma.W
    rng = random.Random(SEED * 1000 + W)
    lengths = [0, 1, W - 1, W, W + 1, 255, 256, 257, 5000]
    lengths += [rng.randrange(0, 5001) for _ in range(6 if W == 8 else 10)]
    total = 0
    for i, n in enumerate(lengths):
        src = 0x1000_0000 + i * 0x10000 + rng.randrange(0, 64)
        dst = 0x8000_0000_0000 + i * 0x10000 + rng.randrange(0, 64)
        data = bytes(rng.randrange(256) for _ in range(n))
        mem.write(src, data)
        mem.fill(dst - 32, n + 64, 0xEE)
        await start_copy(mmio, src, dst, n)
        await wait_done(mmio)
        await dma.wait_writes()
        got = mem.read(dst, n)
        assert got == data, (f"copy {i}: {n} bytes {src:#x} -> {dst:#x}: first difference at "
                             f"byte {next(k for k in range(n) if got[k] != data[k])}")
        assert mem.read(dst - 32, 32) == b"\xee" * 32, f"copy {i}: bytes before dst written"
        assert mem.read(dst + n, 32) == b"\xee" * 32, f"copy {i}: bytes after dst written"
        total += n
    assert dma.read_bytes == total and dma.write_bytes == total
    assert dma.reads == dma.writes == sum((n + 255) // 256 for n in lengths)
    assert not dma.errors
    dut._log.info("%d copies, %d bytes, %d read beats, %d write beats", len(lengths), total,
                  dma.read_beats, dma.write_beats)


@cocotb.test()
async def test_read_after_write(dut):
    """A read accepted after a write returns the written data before dma_write_ns elapsed."""
    cfg = HostConfig(dma_read_ns=100.0, dma_write_ns=5000.0, pcie_gbps=64.0, mmio_ns=20.0)
    mem, dma, mmio = await setup(dut, host_cfg=cfg, backpressure=0.2)
    rng = random.Random(SEED + 7)
    a, b, c = 0x10_0003, 0x20_0005, 0x30_0001
    n = 3000
    data = bytes(rng.randrange(256) for _ in range(n))
    mem.write(a, data)
    await start_copy(mmio, a, b, n)
    await wait_done(mmio)
    # Every write to B has been accepted, but the last ones are not visible yet (earlier
    # chunks were made visible by the copy's own later reads, which may not pass them).
    assert dma._pending and dma._pending[-1].addr + len(dma._pending[-1].data) == b + n
    assert mem.read(b, n) != data
    await start_copy(mmio, b, c, n)          # its reads are accepted after the writes to B
    await wait_done(mmio)
    await dma.wait_writes()
    assert mem.read(b, n) == data
    assert mem.read(c, n) == data, "a read passed an earlier write"


@cocotb.test()
async def test_bandwidth(dut):
    """Without back-pressure a 16 KB copy takes dma_read_ns + bytes / min(bus, PCIe) rate."""
    cfg = preset("small").host                 # 64 Gb/s = 8 bytes/ns
    mem, dma, mmio = await setup(dut, host_cfg=cfg, backpressure=None)
    W = dma.W
    n = 16384
    mem.write(0x1000, bytes(range(256)) * (n // 256))
    await start_copy(mmio, 0x1000, 0x100000, n)
    t0 = get_sim_time("ns")
    t_first = {}

    async def first_beat():
        await RisingEdge(dut.rd_resp__valid)
        t_first["t"] = get_sim_time("ns")
    task = cocotb.start_soon(first_beat())
    await wait_done(mmio)
    await dma.wait_writes()
    assert mem.read(0x100000, n) == mem.read(0x1000, n)
    rate = min(W * CLOCK_MHZ / 1000.0, cfg.pcie_gbps / 8.0)      # bytes per ns
    latency = t_first["t"] - t0
    assert cfg.dma_read_ns <= latency <= cfg.dma_read_ns + 3 * 1000 / CLOCK_MHZ, latency
    transfer = dma.last_read_beat_ns - t_first["t"]
    ideal = n / rate
    dut._log.info("W=%d: first beat after %.0f ns, %d bytes in %.0f ns (ideal %.0f ns)",
                  W, latency, n, transfer, ideal)
    assert 0.97 * ideal <= transfer <= 1.05 * ideal + 20, (transfer, ideal)
    task.cancel()


@cocotb.test()
async def test_idle_rate(dut):
    """Simulated cycles per second with the host models attached but idle (clock only)."""
    mem, dma, mmio = await setup(dut, backpressure=0.3)
    period_ns = 1000.0 / CLOCK_MHZ
    idle_cycles = 1_000_000
    await Timer(10 * period_ns, "ns")
    wakeups = dma.wakeups
    t0 = time.perf_counter()
    await Timer(idle_cycles * period_ns, "ns")
    idle_rate = idle_cycles / (time.perf_counter() - t0)
    assert dma.wakeups == wakeups, "the DMA model ran Python while its ports were idle"

    # For comparison: a Python coroutine that wakes on every clock edge.
    py_cycles = 50_000
    t0 = time.perf_counter()
    for _ in range(py_cycles):
        await RisingEdge(dut.clk)
    py_rate = py_cycles / (time.perf_counter() - t0)
    dut._log.info("idle: %.0f cycles/s; Python awaiting every edge: %.0f cycles/s",
                  idle_rate, py_rate)
    with open("idle_rate.json", "w") as f:
        json.dump({"idle_cycles_per_s": idle_rate, "per_clock_python_cycles_per_s": py_rate,
                   "W": dma.W}, f)
    assert dma.reads == dma.writes == 0


@cocotb.test(skip=os.environ.get("TB_FAIL_DEMO") != "1")
async def test_fail_demo(dut):
    """Fails on purpose (only when TB_FAIL_DEMO=1): checks that failures reach pytest."""
    await start_clock_and_reset(dut, CLOCK_MHZ)
    assert 1 == 2, "deliberate failure"
