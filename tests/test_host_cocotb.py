"""Host side (hw/host/, sim/host.py) and Verilator flow (sim/verilator.py) tests.

Builds the CopySystem test design (tests/cocotb/copy_system.py: the DmaCopy engine on the
NIC's host interface, the PCIe link model and a host) with Verilator (cached under
build/verilator) and runs the cocotb tests of tests/cocotb/tb_host.py on it: the Python host
for W = 8 and W = 64, the RTL host for W = 8 (64 KB of memory, to keep the build small).
Also checks HostMemory against a flat bytearray, the build cache, the failure report and
the copy engine's parameter checks.
"""

import json
import random

import pytest

from sim.host import HostMemory
from sim.verilator import SimulationFailed, build, build_hash, run
from tests.cocotb.copy_system import CopySystem, copy_config
from tests.cocotb.dma_copy import DmaCopy

TB = "tests.cocotb.tb_host"
TB_TESTS = {"test_random_copies", "test_read_after_write", "test_bandwidth", "test_latency",
            "test_idle_rate", "test_failed_read", "test_fail_demo"}
BUILDS = [("python", 8), ("python", 64), ("rtl", 8)]


def _name(kind, W):
    return f"copy_{'py' if kind == 'python' else kind}_w{W}"


def _build(kind, W, **kw):
    return build(CopySystem(copy_config(kind, W), **kw), _name(kind, W))


@pytest.mark.parametrize("kind,W", BUILDS, ids=[_name(k, w) for k, w in BUILDS])
def test_host_side_on_verilator(kind, W):
    info = _build(kind, W)
    result = run(info, TB, seed=1, extra_env={"RNIC_HOST": kind})
    assert result.passed
    assert {t.name for t in result.tests} == TB_TESTS
    assert [t.name for t in result.tests if t.skipped] == ["test_fail_demo"]
    stats = json.loads((result.test_dir / "idle_rate.json").read_text())
    bw = json.loads((result.test_dir / "bandwidth.json").read_text())
    lat = json.loads((result.test_dir / "latency.json").read_text())
    assert stats["kind"] == bw["kind"] == kind and stats["W"] == bw["W"] == W
    print(f"\n{kind} host, W={W}: build "
          f"{'reused' if info.skipped else f'took {info.build_seconds:.1f} s'}; "
          f"idle simulation {stats['idle_cycles_per_s']:,.0f} cycles/s "
          f"(a Python coroutine on every clock edge: "
          f"{stats['per_clock_python_cycles_per_s']:,.0f} cycles/s); "
          f"16 KB copy {bw['bytes_per_cycle']:.2f} B/cycle = {bw['data_gbps']:.1f} Gb/s "
          f"(model {bw['model_bytes_per_cycle']:.2f} B/cycle); one-word copy: data after "
          f"{lat['t_first_cycles']} cycles, ended after {lat['t_end_cycles']} cycles")
    for t in result.tests:
        print(f"  {t.name}: {t.sim_time_ns:,.0f} ns simulated in {t.real_time_s:.2f} s")


def test_build_is_cached():
    first = _build("python", 8)
    second = _build("python", 8)
    assert second.skipped and second.build_dir == first.build_dir
    assert second.hash == first.hash
    cfg = copy_config("python", 8)
    assert build_hash(CopySystem(cfg), "copy_py_w8") == first.hash
    # A different design or different options get a different build directory.
    assert build_hash(CopySystem(cfg, chunk=128), "copy_py_w8") != first.hash
    assert build_hash(CopySystem(cfg.replace(host__pcie_ns=80.0)), "copy_py_w8") != first.hash
    assert build_hash(CopySystem(cfg), "copy_py_w8", public=["busy"]) != first.hash
    assert build_hash(CopySystem(cfg), "copy_py_w8", extra_args=["-O3"]) != first.hash


def test_failure_is_reported():
    info = _build("python", 8)
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
    with pytest.raises(ValueError, match=r"chunk must be a power of two in \[64, 4096\], not 32"):
        DmaCopy(data_bytes=64, chunk=32)
    with pytest.raises(ValueError, match=r"max_outstanding must be an integer in \[1, 16\], not 0"):
        DmaCopy(max_outstanding=0)
    with pytest.raises(ValueError, match=r"max_outstanding must be an integer in \[1, 16\], not True"):
        DmaCopy(max_outstanding=True)
    cfg = copy_config("python", 8)
    with pytest.raises(ValueError, match=r"chunk must be a power of two in \[8, 4096\], not 8192"):
        CopySystem(cfg, chunk=8192)
    with pytest.raises(ValueError, match=r"max_outstanding must be an integer in \[1, 16\], not 17"):
        CopySystem(cfg, max_outstanding=17)
    with pytest.raises(TypeError, match=r"cfg must be a SystemConfig"):
        CopySystem(cfg.nic)
    # the configurations the tests build
    assert copy_config("rtl", 8).host.rtl_mem_bytes == 1 << 16
    assert copy_config("python", 64).nic.data_bytes == 64
    with pytest.raises(ValueError, match=r"kind must be one of"):
        copy_config("fpga", 8)


def test_unoptflat_fails_the_build(tmp_path):
    """A build whose log has a Verilator UNOPTFLAT warning (a combinational loop) fails with
    the warning's text; a clean log passes."""
    from sim.verilator import _check_no_unoptflat
    log = tmp_path / "build.log"
    log.write_text("%Warning-ALWNEVER: x.v:1:1: never\n")
    _check_no_unoptflat(log, "x")
    log.write_text("%Warning-UNOPTFLAT: x.v:3:7: Signal unoptimizable: Circular combinational "
                   "logic: 'x.a'\n")
    with pytest.raises(RuntimeError, match=r"(?s)1 UNOPTFLAT warning.*'x.a'"):
        _check_no_unoptflat(log, "x")
