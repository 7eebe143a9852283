"""Host model (sim/host.py) and Verilator flow (sim/verilator.py) tests.

Builds the DmaCopy test design (tests/cocotb/dma_copy.py) with Verilator (cached under
build/verilator) and runs the cocotb tests of tests/cocotb/tb_host.py on it, for W = 8
and W = 64. Also checks HostMemory against a flat bytearray, the build cache and the
failure report.
"""

import json
import random

import pytest

from sim.host import HostMemory
from sim.verilator import SimulationFailed, build, build_hash, run
from tests.cocotb.dma_copy import DmaCopy

TB = "tests.cocotb.tb_host"
TB_TESTS = {"test_random_copies", "test_read_after_write", "test_bandwidth", "test_idle_rate",
            "test_fail_demo"}


def _build(W):
    return build(DmaCopy(data_bytes=W), f"dma_copy_w{W}")


@pytest.mark.parametrize("W", [8, 64])
def test_host_model_on_verilator(W):
    info = _build(W)
    result = run(info, TB, seed=1)
    assert result.passed
    assert {t.name for t in result.tests} == TB_TESTS
    stats = json.loads((result.test_dir / "idle_rate.json").read_text())
    print(f"\nW={W}: build {'reused' if info.skipped else f'took {info.build_seconds:.1f} s'}; "
          f"idle simulation {stats['idle_cycles_per_s']:,.0f} cycles/s "
          f"(a Python coroutine on every clock edge: "
          f"{stats['per_clock_python_cycles_per_s']:,.0f} cycles/s)")
    for t in result.tests:
        print(f"  {t.name}: {t.sim_time_ns:,.0f} ns simulated in {t.real_time_s:.2f} s")


def test_build_is_cached():
    first = _build(8)
    second = _build(8)
    assert second.skipped and second.build_dir == first.build_dir
    assert second.hash == first.hash
    assert build_hash(DmaCopy(data_bytes=8), "dma_copy_w8") == first.hash
    # A different design or different options get a different build directory.
    assert build_hash(DmaCopy(data_bytes=8, chunk=128), "dma_copy_w8") != first.hash
    assert build_hash(DmaCopy(data_bytes=8), "dma_copy_w8", public=["busy"]) != first.hash
    assert build_hash(DmaCopy(data_bytes=8), "dma_copy_w8", extra_args=["-O3"]) != first.hash


def test_failure_is_reported():
    info = _build(8)
    with pytest.raises(SimulationFailed, match=r"FAILED test_fail_demo: .*deliberate"):
        run(info, TB, testcase="test_fail_demo", extra_env={"TB_FAIL_DEMO": "1"})
    result = run(info, TB, testcase="test_fail_demo", extra_env={"TB_FAIL_DEMO": "1"},
                 check=False)
    assert not result.passed and [t.name for t in result.tests] == ["test_fail_demo"]


def test_host_memory_against_bytearray():
    rng = random.Random(3)
    mem = HostMemory()
    base = 0xFFFF_F000          # crosses 4 KB pages and the 4 GB line
    model = bytearray(3 * 4096 + 100)
    for _ in range(300):
        a = rng.randrange(len(model))
        n = rng.randrange(0, min(5000, len(model) - a) + 1)
        if rng.random() < 0.5:
            d = bytes(rng.randrange(256) for _ in range(n))
            mem.write(base + a, d)
            model[a:a + n] = d
        elif rng.random() < 0.5:
            v = rng.randrange(256)
            mem.fill(base + a, n, v)
            model[a:a + n] = bytes([v]) * n
        else:
            assert mem.read(base + a, n) == bytes(model[a:a + n])
    assert mem.read(base, len(model)) == bytes(model)
    mem.write_int(0x10, 0x1122334455667788)
    assert mem.read(0x10, 2) == b"\x88\x77" and mem.read_int(0x10) == 0x1122334455667788
    with pytest.raises(ValueError, match=r"outside \[0, 2\*\*64\)"):
        mem.read(2**64 - 4, 8)
    with pytest.raises(ValueError, match=r"value must be a byte in \[0, 255\], not 256"):
        mem.fill(0, 4, 256)


def test_dma_copy_parameters():
    with pytest.raises(ValueError, match=r"data_bytes must be a power of two in \[8, 64\], not 12"):
        DmaCopy(data_bytes=12)
    with pytest.raises(ValueError, match=r"chunk must be a power of two in \[8, 4096\], not 100"):
        DmaCopy(data_bytes=8, chunk=100)
    with pytest.raises(ValueError, match=r"max_outstanding must be an integer in \[1, 16\], not 0"):
        DmaCopy(max_outstanding=0)
