"""cocotb tests of sim/simclock.py on the Ticker design, on each kind of build.

Run through tests/test_simclock.py. ``SIMCLOCK_MODE`` (environment) says what the build is:
``cocotb`` (classic build, the testbench starts a cocotb Clock), ``compat``
(``InternalClock(compat=True)``) or ``plain`` (``InternalClock(compat=False)``).

``idle_rate`` is a measurement, not a check: it waits ``IDLE_CYCLES`` cycles with one Timer
and writes the wall time to ``$RESULTS_FILE`` (JSON) when that is set. It uses only ``clk``
and ``rst``, so it runs on any design (the two-node system too).
"""

import collections.abc
import json
import os
import time

import cocotb
from amaranth import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from cocotb.simtime import get_sim_time
from cocotb.triggers import RisingEdge, Timer

import sim.simclock as simclock
from sim.simclock import start_clock_and_reset, wait_cycles

CLOCK_MHZ = 250.0
PERIOD_PS = 4000
RESET_CYCLES = 4


class Ticker(wiring.Component):
    """``count``: rising edges since reset; ``acc``: sum of ``step`` over those edges;
    ``echo``: ``step`` + 1, combinationally."""
    step: In(8)
    count: Out(32)
    acc: Out(32)
    echo: Out(8)

    def elaborate(self, platform):
        m = Module()
        m.d.sync += [self.count.eq(self.count + 1), self.acc.eq(self.acc + self.step)]
        m.d.comb += self.echo.eq(self.step + 1)
        return m


def _mode():
    mode = os.environ.get("SIMCLOCK_MODE", "")
    assert mode in ("cocotb", "compat", "plain"), f"SIMCLOCK_MODE={mode!r}"
    return mode


class _NoClock:
    """Stands in for cocotb.clock.Clock while an in-simulation clock is checked: any attempt
    to create a cocotb Clock fails the test."""

    def __init__(self, *args, **kwargs):
        raise AssertionError("a cocotb Clock was created for a build with its own clock")


async def _start(dut):
    mode = _mode()
    import cocotb.clock
    saved = cocotb.clock.Clock
    if mode != "cocotb":
        cocotb.clock.Clock = _NoClock
    try:
        info = await start_clock_and_reset(dut, CLOCK_MHZ, cycles=RESET_CYCLES)
    finally:
        cocotb.clock.Clock = saved
    return info


class _Counted:
    """A coroutine wrapper that counts how often the scheduler resumes it."""

    def __init__(self, coro):
        self.coro = coro
        self.resumes = 0

    def send(self, value):
        self.resumes += 1
        return self.coro.send(value)

    def throw(self, *args):
        self.resumes += 1
        return self.coro.throw(*args)

    def close(self):
        return self.coro.close()

    def __await__(self):
        return self


# A collections.abc.Coroutine, so that cocotb schedules it as one.
collections.abc.Coroutine.register(_Counted)


@cocotb.test()
async def test_start_and_reset(dut):
    """(The first test of the module: it checks absolute simulation times.)"""
    mode = _mode()
    assert get_sim_time("ps") == 0
    info = await _start(dut)
    assert info.period_ps == PERIOD_PS
    assert info.internal == (mode != "cocotb")
    assert (info.clock is None) == (mode != "cocotb")
    assert info.compat == (mode != "plain")
    # Clock low first, first rising edge half a period in; the helper returns right after
    # the edge that follows RESET_CYCLES edges with rst high.
    assert get_sim_time("ps") == PERIOD_PS // 2 + RESET_CYCLES * PERIOD_PS
    # rst held count at 0 through those edges (without it count would read RESET_CYCLES);
    # the plain clock's reader sees the edge just taken, the others the value before it.
    assert int(dut.count.value) == (1 if mode == "plain" else 0)
    assert simclock.clock_period_ps(dut) == PERIOD_PS


@cocotb.test()
async def test_counts_periods(dut):
    """The counter advances by exactly the number of periods elapsed in simulation time.

    wait_cycles ends on an edge before it is evaluated: what a reader sees there is what a
    RisingEdge reader sees (cocotb Clock, compat), or one edge less than that (plain clock,
    whose RisingEdge readers see the edge taken). With edge=True it is a RisingEdge reader.
    """
    mode = _mode()
    await _start(dut)
    t0, c0 = get_sim_time("ps"), int(dut.count.value)
    lag = 1 if mode == "plain" else 0
    total = 0
    for n in (1, 7, 1000, 12345):
        await wait_cycles(dut, n)
        total += n
        assert get_sim_time("ps") - t0 == total * PERIOD_PS
        assert int(dut.count.value) - c0 == total - lag, (n, int(dut.count.value), c0)
        await wait_cycles(dut, n, edge=True)
        total += n
        assert get_sim_time("ps") - t0 == total * PERIOD_PS
        assert int(dut.count.value) - c0 == total, (n, int(dut.count.value), c0)


@cocotb.test()
async def test_rising_edge(dut):
    """RisingEdge(dut.clk) works on every build, one edge per period; and what a write
    after an edge changes, per kind of clock (see sim/simclock.py)."""
    mode = _mode()
    await _start(dut)
    times, counts, accs = [], [], []
    for i in range(6):
        await RisingEdge(dut.clk)
        times.append(get_sim_time("ps"))
        counts.append(int(dut.count.value))
        accs.append(int(dut.acc.value))
        dut.step.value = 3 if i >= 2 else 0
    assert [b - a for a, b in zip(times, times[1:])] == [PERIOD_PS] * 5
    assert [b - a for a, b in zip(counts, counts[1:])] == [1] * 5
    # step becomes 3 after the edge of i=2; that edge's increment is read at i=3 by a
    # before-the-edge reader (cocotb Clock, compat) and at i=2's successor edge by the
    # plain clock's after-the-edge reader, one read earlier.
    deltas = [b - a for a, b in zip(accs, accs[1:])]
    assert deltas == ([0, 0, 0, 3, 3] if mode != "plain" else [0, 0, 3, 3, 3]), deltas


@cocotb.test()
async def test_write_between_edges(dut):
    """A write between two edges reaches the design's combinational logic at once (a few ps
    later with compat) and its registers at the next edge, as with a cocotb Clock."""
    await _start(dut)
    dut.step.value = 0
    await RisingEdge(dut.clk)
    await Timer(PERIOD_PS // 2, "ps")
    a0 = int(dut.acc.value)
    dut.step.value = 5
    await Timer(3, "ps")
    assert int(dut.echo.value) == 6
    assert int(dut.acc.value) == a0
    await RisingEdge(dut.clk)
    await Timer(3, "ps")
    assert int(dut.acc.value) == a0 + 5
    dut.step.value = 0


@cocotb.test()
async def test_timer_wakes_once(dut):
    """A coroutine waiting 5,000 cycles with wait_cycles is resumed once (plus its start),
    twice with edge=True; the same wait as 5,000 RisingEdge awaits resumes it 5,000 times."""
    mode = _mode()
    await _start(dut)
    t0, c0 = get_sim_time("ps"), int(dut.count.value)

    async def by_edges():
        for _ in range(5000):
            await RisingEdge(dut.clk)

    waiter = _Counted(wait_cycles(dut, 5000))
    await cocotb.start_soon(waiter)
    assert waiter.resumes == 2, waiter.resumes
    assert get_sim_time("ps") - t0 == 5000 * PERIOD_PS
    assert int(dut.count.value) - c0 == (4999 if mode == "plain" else 5000)
    await RisingEdge(dut.clk)          # the edge the Timer ended on: no time passes
    assert get_sim_time("ps") - t0 == 5000 * PERIOD_PS
    assert int(dut.count.value) - c0 == 5000

    waiter = _Counted(wait_cycles(dut, 5000, edge=True))
    await cocotb.start_soon(waiter)
    assert waiter.resumes == 3, waiter.resumes
    assert get_sim_time("ps") - t0 == 10000 * PERIOD_PS
    assert int(dut.count.value) - c0 == 10000

    edges = _Counted(by_edges())
    await cocotb.start_soon(edges)
    assert edges.resumes == 5001, edges.resumes
    assert get_sim_time("ps") - t0 == 15000 * PERIOD_PS
    assert int(dut.count.value) - c0 == 15000
    await wait_cycles(dut, 0, edge=True)     # zero cycles: returns at once
    assert get_sim_time("ps") - t0 == 15000 * PERIOD_PS


@cocotb.test()
async def test_clock_mhz_checked(dut):
    """An in-simulation clock refuses a different clock_mhz; None takes the build's."""
    mode = _mode()
    if mode == "cocotb":
        try:
            await start_clock_and_reset(dut, None)
        except ValueError:
            return
        raise AssertionError("clock_mhz=None accepted without an in-simulation clock")
    try:
        await start_clock_and_reset(dut, 100.0)
    except ValueError as e:
        assert "4000 ps" in str(e)
    else:
        raise AssertionError("a 100 MHz clock_mhz was accepted for a 4000 ps clock")
    info = await start_clock_and_reset(dut, None)
    assert info.period_ps == PERIOD_PS and info.internal


@cocotb.test()
async def idle_rate(dut):
    cycles = int(os.environ.get("IDLE_CYCLES", "20000"))
    mhz = os.environ.get("CLOCK_MHZ")
    info = await start_clock_and_reset(dut, float(mhz) if mhz else CLOCK_MHZ)
    t0 = time.perf_counter()
    await wait_cycles(dut, cycles)
    wall = time.perf_counter() - t0
    if os.environ.get("RESULTS_FILE"):
        with open(os.environ["RESULTS_FILE"], "w") as f:
            json.dump({"cycles": cycles, "wall_s": wall, "cycles_per_s": cycles / wall,
                       "internal": info.internal, "compat": info.compat}, f)


# SIMCLOCK_HOST_TESTS=1: the tests of tests/cocotb/tb_host.py (sim/host.py's drivers on the
# CopySystem design; RNIC_HOST names the build's host kind), unchanged: their clock and
# reset come from sim/simclock.py, so on a build with an in-simulation clock they run with
# no cocotb Clock.
if os.environ.get("SIMCLOCK_HOST_TESTS") == "1":
    from tests.cocotb.tb_host import (test_bandwidth, test_failed_read,  # noqa: F401
                                      test_idle_rate, test_latency, test_random_copies,
                                      test_read_after_write)
