"""In-simulation clock (sim/verilator.py ``clock=``, sim/simclock.py) and raw C++ speed runs
(sim/rawsim.py), on the Ticker design of tests/cocotb/tb_simclock.py.

The Ticker is built four ways: classic (cocotb ``Clock``), ``InternalClock(compat=True)``
and ``InternalClock(compat=False)`` with each engine (the C++ main loop toggling the clock,
the default, and Verilog delays under ``--timing``); the same cocotb tests run on each with
the expectations of its kind (both plain engines: the same). The idle rate each run measures is printed, not checked.

The host side's cocotb tests (tests/cocotb/tb_host.py) also run on the CopySystem design
(tests/cocotb/copy_system.py) built with a plain in-simulation clock, for both host kinds.
"""

import json
import re

import pytest

from sim.rawsim import build_raw, cxx_name, raw_cycles_per_s, run_raw
from sim.verilator import InternalClock, _prepare, build, build_hash, run
from tests.cocotb.copy_system import CopySystem, copy_config
from tests.cocotb.tb_simclock import PERIOD_PS, Ticker

TB = "tests.cocotb.tb_simclock"
TB_TESTS = {"test_start_and_reset", "test_counts_periods", "test_rising_edge",
            "test_write_between_edges", "test_timer_wakes_once", "test_clock_mhz_checked",
            "idle_rate"}
HOST_TESTS = {"test_random_copies", "test_read_after_write", "test_bandwidth", "test_latency",
              "test_idle_rate", "test_failed_read"}
NAME = "simclock_ticker"
CLOCKS = {"cocotb": None, "compat": InternalClock("clk", PERIOD_PS),
          "plain": InternalClock("clk", PERIOD_PS, compat=False),
          "plain_timing": InternalClock("clk", PERIOD_PS, compat=False, engine="timing")}


@pytest.mark.parametrize("mode", list(CLOCKS))
def test_simclock_on_verilator(mode, tmp_path):
    info = build(Ticker(), NAME, clock=CLOCKS[mode])
    assert info.clock == CLOCKS[mode]
    assert ("clk" in info.ports) == (mode == "cocotb")
    out = tmp_path / "idle.json"
    # the two engines of a plain clock must look the same to a testbench
    result = run(info, TB, extra_env={"SIMCLOCK_MODE": mode.split("_")[0],
                                      "RESULTS_FILE": str(out),
                                      "IDLE_CYCLES": "200000"})
    assert result.passed
    assert {t.name for t in result.tests} == TB_TESTS
    idle = json.loads(out.read_text())
    assert idle["internal"] == (mode != "cocotb")
    print(f"\n{mode}: idle {idle['cycles_per_s']:,.0f} cycles/s "
          f"(build {'reused' if info.skipped else f'{info.build_seconds:.0f} s'})")


@pytest.mark.parametrize("kind", ["python", "rtl"])
def test_host_side_on_internal_clock(kind):
    """sim/host.py's drivers, which talk to the design through counter-handshaken mailboxes
    (hw/lib/seq_port.py) and so work whatever side of a clock edge they read on, pass
    tests/cocotb/tb_host.py's tests (random copies, read after write, bandwidth, latency,
    idle rate, failed reads) on the CopySystem design (W = 8) with a plain
    InternalClock(compat=False), whose RisingEdge readers see the values from after the
    edge, and no cocotb Clock."""
    cfg = copy_config(kind, 8)
    clock = InternalClock.from_mhz(cfg.nic.clock_mhz, compat=False)
    assert clock.period_ps == PERIOD_PS
    info = build(CopySystem(cfg), f"copy_{'py' if kind == 'python' else kind}_w8", clock=clock)
    result = run(info, TB, seed=1, extra_env={"SIMCLOCK_HOST_TESTS": "1", "RNIC_HOST": kind},
                 testcase=sorted(HOST_TESTS))
    assert result.passed and {t.name for t in result.tests} == HOST_TESTS
    stats = json.loads((result.test_dir / "idle_rate.json").read_text())
    bw = json.loads((result.test_dir / "bandwidth.json").read_text())
    print(f"\nCopySystem, {kind} host, W=8, plain in-simulation clock: idle "
          f"{stats['idle_cycles_per_s']:,.0f} cycles/s; 16 KB copy "
          f"{bw['bytes_per_cycle']:.2f} B/cycle (build "
          f"{'reused' if info.skipped else f'{info.build_seconds:.0f} s'})")


def test_clock_option_changes_the_hash():
    hashes = {build_hash(Ticker(), NAME, clock=c)
              for c in (None, ("clk", 4000), ("clk", 4001), ("clk", 4000, False),
                        ("clk", 4000, False, "timing"))}
    assert len(hashes) == 5
    assert build_hash(Ticker(), NAME, clock=("clk", 4000)) == \
        build_hash(Ticker(), NAME, clock=InternalClock("clk", 4000))
    assert build_hash(Ticker(), NAME) == build_hash(Ticker(), NAME, clock=None)


def test_wrapper_verilog():
    text, vlt, args, _ = _prepare(Ticker(), NAME, clock=InternalClock("clk", 4001),
                                  public=["count", "x.y"])
    top = re.search(rf"^module {NAME}\(([^)]*)\);", text, re.MULTILINE)
    core = re.search(rf"^module {NAME}_core\(([^)]*)\);", text, re.MULTILINE)
    assert top and core
    core_ports = [p.strip() for p in core.group(1).split(",")]
    assert [p.strip() for p in top.group(1).split(",")] == [p for p in core_ports if p != "clk"]
    assert "clk" in core_ports
    assert f"{NAME}_core core (" in text
    # compat: visible clk up after the low half (2001 ps), then every 4001 ps, for 1 ps;
    # the design's clock rises as it falls; inputs are delayed by 2 ps.
    assert "#2001ps clk = 1'b1;" in text
    assert "#1ps clk = 1'b0; simclock__clk = 1'b1;" in text
    assert "#4000ps clk = 1'b1; simclock__clk = 1'b0;" in text
    assert ".clk(simclock__clk)" in text
    assert "assign #2ps simclock__in__step = step;" in text
    assert "--timing" in args
    assert f'public_flat_rd -module "{NAME}" -var "clk"' in vlt
    assert f'public_flat_rd -module "{NAME}" -var "simclock_period_ps"' in vlt
    assert f'public_flat_rw -module "{NAME}" -var "step"' in vlt
    assert f'public_flat_rw -module "{NAME}_core" -var "count"' in vlt   # top's own signal
    assert 'public_flat_rw -module "x" -var "y"' in vlt
    plain, _, plain_args, _ = _prepare(Ticker(), NAME,
                                       clock=InternalClock("clk", 4001, compat=False,
                                                           engine="timing"))
    assert "simclock__" not in plain and ".clk(clk)" in plain
    assert "#2001ps clk = 1'b1;" in plain and "#2000ps clk = 1'b0;" in plain   # low, high
    assert "--timing" in plain_args
    # engine cxx: clk is an input of the wrapper (the C++ loop drives it), no delays
    cxx, cxx_vlt, cxx_args, _ = _prepare(Ticker(), NAME,
                                         clock=InternalClock("clk", 4001, compat=False))
    top = re.search(rf"^module {NAME}\(([^)]*)\);", cxx, re.MULTILINE)
    assert [p.strip() for p in top.group(1).split(",")] == core_ports
    assert "  input clk;" in cxx and "#" not in cxx.split(f"module {NAME}_core")[0]
    assert "--timing" not in cxx_args
    assert f'public_flat_rd -module "{NAME}" -var "clk"' in cxx_vlt
    assert f'public_flat_rw -module "{NAME}" -var "clk"' not in cxx_vlt
    classic, _, classic_args, _ = _prepare(Ticker(), NAME)
    assert "--timing" not in classic_args and "_core" not in classic


def test_clock_option_errors():
    with pytest.raises(ValueError, match="not a port"):
        _prepare(Ticker(), NAME, clock=("clock", 4000))
    with pytest.raises(ValueError, match="not an input"):
        _prepare(Ticker(), NAME, clock=("count", 4000))
    with pytest.raises(ValueError, match="integer"):
        InternalClock("clk", 4000.0)
    with pytest.raises(ValueError, match=">= 8"):
        InternalClock("clk", 4)
    with pytest.raises(TypeError):
        _prepare(Ticker(), NAME, clock=4000)
    with pytest.raises(ValueError, match="engine must be one of 'timing', 'cxx', not 'c'"):
        InternalClock("clk", 4000, compat=False, engine="c")
    with pytest.raises(ValueError, match="engine 'cxx' needs compat=False"):
        InternalClock("clk", 4000, engine="cxx")
    assert InternalClock("clk", 4000).engine == "timing"
    assert InternalClock("clk", 4000, compat=False).engine == "cxx"
    assert InternalClock.from_mhz(250) == InternalClock("clk", 4000)
    assert InternalClock.from_mhz(322.265625).period_ps == 3103


def test_cxx_names():
    assert cxx_name("a_mmio__we") == "a_mmio___05Fwe"
    assert cxx_name("clk") == "clk"
    assert cxx_name("a___b") == "a___05F_b"


def test_raw_loop():
    """The raw C++ loop runs exactly the cycles asked for, after the reset, with the
    constant inputs given: count == cycles, acc == step * cycles."""
    r = raw_cycles_per_s(Ticker(), NAME, 123_457, inputs={"step": 3})
    assert r.cycles == 123_457 and r.reset_cycles == 4
    assert r.outputs == {"count": 123_457, "acc": 3 * 123_457, "echo": 4}
    assert r.wall_s > 0 and r.cycles_per_s > 0
    print(f"\nraw C++ loop: {r.cycles_per_s:,.0f} cycles/s "
          f"(build {'reused' if r.build.skipped else f'{r.build.build_seconds:.0f} s'})")
    again = build_raw(Ticker(), NAME, inputs={"step": 3})
    assert again.skipped and again.build_dir == r.build.build_dir
    assert build_raw(Ticker(), NAME, inputs={"step": 3}).hash != build_hash(Ticker(), NAME)
    # Another run of the same executable: the counts are run-time arguments, and the
    # cycles of a longer reset are not counted.
    r2 = run_raw(again, 10, reset_cycles=10)
    assert r2.reset_cycles == 10 and r2.outputs == {"count": 10, "acc": 30, "echo": 4}


def test_raw_inputs_checked():
    with pytest.raises(ValueError, match="not an input"):
        build_raw(Ticker(), NAME, inputs={"count": 1})
    with pytest.raises(ValueError, match="driven by the main loop"):
        build_raw(Ticker(), NAME, inputs={"rst": 1})
    with pytest.raises(ValueError, match="no clock input"):
        build_raw(Ticker(), NAME, clk="clock")
