"""Clock and reset for cocotb tests, with the clock inside the simulation when the build has one.

Two kinds of Verilator build (sim/verilator.py):

* classic, ``build(top, name)``: the testbench drives ``clk``; :func:`start_clock_and_reset`
  starts a cocotb ``Clock`` on it, as ``sim.host.start_clock_and_reset`` does;
* in-simulation clock, ``build(top, name, clock=InternalClock("clk", period_ps))`` (or
  ``clock=("clk", period_ps)``): a generated Verilog wrapper toggles ``clk`` with
  ``#``-delays (Verilator ``--timing``), or, for a plain clock (``compat=False``), the
  build's own C++ main loop toggles it (``engine="cxx"``, the default there:
  sim/simclock_main.py), so no Python runs per cycle. The wrapper holds the VPI-visible
  constants ``simclock_period_ps`` and ``simclock_compat``; :func:`start_clock_and_reset`
  finds them and only pulses the reset.

Usage inside a cocotb test::

    from sim.simclock import start_clock_and_reset, wait_cycles

    clock = await start_clock_and_reset(dut, 250)   # 250 MHz; returns a ClockInfo
    await wait_cycles(dut, 200_000)                 # one Timer, one Python wake-up
    await RisingEdge(dut.clk)                       # still works on either kind of build
    await clock.wait(1000, edge=True)               # = 1000 x RisingEdge, two wake-ups

:func:`start_clock_and_reset` returns right after the rising edge that follows the reset's
release (``cycles`` edges with ``rst`` high), as the sim/host.py version does. For a build
with an in-simulation clock, ``clock_mhz`` may be ``None`` (the build's period is used);
given, it must round to the build's period (``ValueError`` otherwise), so that a testbench's
idea of the clock cannot silently differ from the design's.

Sampling (checked by tests/cocotb/tb_simclock.py): what a coroutine reads, and from which
edge on what it writes counts, depending on how it woke up:

* ``RisingEdge(clk)``, cocotb ``Clock``: reads the values from before the edge; writes
  count from the next edge. (sim/host.py's models rely on this.)
* ``RisingEdge(clk)``, in-simulation clock with ``compat=True``: the same.
* ``RisingEdge(clk)``, in-simulation clock with ``compat=False``: reads the values from
  *after* the edge (the registers' new values); writes count from the next edge.
* a ``Timer`` ending on an edge time (``wait_cycles``): reads the values from before the
  edge; writes count from that edge with a cocotb ``Clock`` (the Timer's callback runs
  before the clock's), from the next edge with an in-simulation clock.

``compat=True`` (the default of ``InternalClock``) gets the cocotb-``Clock`` behaviour,
which the host models of sim/host.py rely on, inside the wrapper: the VPI-visible ``clk``
rises at the edge time ``t`` and falls at ``t + 1 ps``, when the design's own clock rises,
and every input reaches the design 2 ps after it is written. So registered outputs change
1 ps after the visible edge, the visible clock is high for 1 ps only (``FallingEdge(clk)``
comes 1 ps after the rising edge; nothing in this project uses it), and a write at exactly
``t - 1 ps`` would race the design's edge. With a plain in-simulation clock
(``compat=False``) the clock edge and the registers' update happen in one Verilator
evaluation, before cocotb's value-change callback on ``clk`` runs, so a testbench woken by
``RisingEdge`` reads the new register values, while one woken by a ``Timer`` at the same
instant reads the old ones.

A ``Timer`` ending on an edge time runs before the simulator evaluates that edge; a
following ``await RisingEdge(clk)`` returns at that same instant (the pending edge), so
``await wait_cycles(dut, n, edge=True)`` (a Timer of ``n`` periods, then that RisingEdge:
two wake-ups) leaves the coroutine exactly as ``n`` ``RisingEdge`` awaits would, on every
kind of clock. Plain ``wait_cycles(dut, n)`` is one wake-up; use ``edge=True`` before
driving inputs if the build may use a cocotb ``Clock``.

Speed, idle (the clock running, one ``wait_cycles`` Timer, no host models), cycles/s, median
of 3, measured on f23febc (2 cores shared with other jobs, load 0.3-2; the raw C++ loop of
sim/rawsim.py for comparison):

==============================  ===========  ===========  ============  ==========
design                          cocotb       in-sim,      in-sim,       raw C++
                                ``Clock``    compat       plain         loop
==============================  ===========  ===========  ============  ==========
Ticker (32-bit counters)        0.94 M       1.87 M       2.12 M        16.5 M
DmaCopy W=8 + sim/host.py       0.59-0.85 M  1.32-1.42 M  1.87-1.90 M   -
models (tb_host test_idle_rate)
two-node system, ``small``      145 k        132 k        232 k         262 k
==============================  ===========  ===========  ============  ==========

The plain clock's C++ engine (``engine="cxx"``, the default since d30b089; the table's
"in-sim, plain" column is the ``--timing`` engine) on the Ticker at d30b089
(tests/test_simclock.py, one other job on the 2 cores): 2.42-2.64 M cycles/s against
1.71-2.22 M for the ``--timing`` engine; on the ``connectx6`` system about 10 % faster, and
cocotb's idle rate with it within a few per cent of the raw loop (docs/performance.md).

Before b468a0d (CRC from a ROM), at 4ecc05b, the small system ran at 48-50 k (cocotb
``Clock``), 37-42 k (compat), 80 k (plain) and 85 k cycles/s (raw).

So on a small design the in-simulation clock doubles cocotb's idle rate whichever kind, and
a plain in-simulation clock brings the real system to 89 % of the raw C++ loop (cocotb's
``Clock`` reaches 55 %). ``compat`` on the real system is *slower* than a cocotb ``Clock``
(0.9x): Verilator puts the logic fed by the 2-ps-delayed inputs into combinational blocks it
re-runs on every resumption of a timed process (two per cycle), where the classic build
folds it into the clocked blocks. Copying the inputs at the visible edge instead (an
``always @(posedge clk)`` register per input, no delays) passes the Ticker tests but breaks
sim/host.py's DMA model (tb_host: "beat ... is not marked last"), so compat keeps the delays.
A testbench written for the plain clock's sampling (read after ``RisingEdge`` +
``ReadOnly``, or only at Timer-aligned edges) gets the fast case; sim/host.py's models
need compat or a cocotb ``Clock``.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.verilator import CLOCK_MARKER, COMPAT_MARKER

__all__ = ["ClockInfo", "start_clock_and_reset", "wait_cycles", "internal_clock",
           "clock_period_ps"]


@dataclass
class ClockInfo:
    """What :func:`start_clock_and_reset` set up."""
    period_ps: int
    internal: bool          # True: the clock runs inside the simulation (no cocotb Clock)
    compat: bool            # reads after RisingEdge(clk) see the values before the edge
    clk: object = None      # the clock's handle
    clock: object = None    # the cocotb Clock started (classic builds), else None

    async def wait(self, n, *, edge=False):
        """:func:`wait_cycles` on this clock."""
        await _wait(n, self.period_ps, self.clk if edge else None)


# Handles' paths -> ClockInfo of the clocks started in this simulation.
_started = {}


def _key(dut):
    return getattr(dut, "_path", None) or id(dut)


def internal_clock(dut):
    """``(period_ps, compat)`` of the in-simulation clock of ``dut``, or ``None``.

    Reads the constants the clock wrapper of sim/verilator.py adds; a classic build has
    none of them, so ``None`` means the testbench has to drive the clock.
    """
    try:
        marker = getattr(dut, CLOCK_MARKER)
    except AttributeError:
        return None
    period = int(marker.value)
    if period <= 0:
        raise RuntimeError(f"{CLOCK_MARKER} of {dut._path} reads {period}: not a clock wrapper "
                           f"of sim/verilator.py")
    try:
        compat = bool(int(getattr(dut, COMPAT_MARKER).value))
    except AttributeError:
        compat = False
    return period, compat


def clock_period_ps(dut):
    """Clock period of ``dut``: of the clock started by :func:`start_clock_and_reset`, or of
    the in-simulation clock; ``RuntimeError`` when neither is known."""
    info = _started.get(_key(dut))
    if info is not None:
        return info.period_ps
    internal = internal_clock(dut)
    if internal is None:
        raise RuntimeError("no clock period known for this design: call "
                           "start_clock_and_reset first or pass period_ps")
    return internal[0]


async def start_clock_and_reset(dut, clock_mhz, *, clk="clk", rst="rst", cycles=4, settle=0):
    """Get ``dut.<clk>`` running and pulse ``dut.<rst>`` for ``cycles`` rising edges.

    ``settle``: rising edges more to wait after the release, for a design that registers its
    reset (``hw.system.TwoNodeSystem.RESET_LATENCY``).

    In-simulation clock (see the module docstring): nothing is started, the reset is pulsed
    by counting ``RisingEdge(dut.<clk>)``. Otherwise a cocotb ``Clock`` of ``clock_mhz`` is
    started (low first). Returns a :class:`ClockInfo`; on return the reset is released and
    the coroutine stands right after a rising edge.
    """
    from cocotb.triggers import RisingEdge
    clk_handle = getattr(dut, clk)
    internal = internal_clock(dut)
    if internal is not None:
        period_ps, compat = internal
        if clock_mhz is not None and int(round(1e6 / clock_mhz)) != period_ps:
            raise ValueError(f"clock_mhz={clock_mhz} (period {int(round(1e6 / clock_mhz))} ps) "
                             f"differs from the in-simulation clock of the build "
                             f"({period_ps} ps)")
        info = ClockInfo(period_ps=period_ps, internal=True, compat=compat, clk=clk_handle)
    else:
        from cocotb.clock import Clock
        if clock_mhz is None:
            raise ValueError("clock_mhz is required: the build has no in-simulation clock")
        period_ps = int(round(1e6 / clock_mhz))
        clock = Clock(clk_handle, period_ps, unit="ps")
        clock.start(start_high=False)
        info = ClockInfo(period_ps=period_ps, internal=False, compat=True, clk=clk_handle,
                         clock=clock)
    _started[_key(dut)] = info
    reset = getattr(dut, rst, None) if rst else None
    if reset is not None:
        reset.value = 1
        for _ in range(cycles):
            await RisingEdge(clk_handle)
        reset.value = 0
    for _ in range(1 + settle):
        await RisingEdge(clk_handle)
    return info


async def _wait(n, period_ps, clk_handle):
    from cocotb.triggers import RisingEdge, Timer
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise ValueError(f"n must be a non-negative integer number of cycles, not {n!r}")
    if n == 0:
        return
    await Timer(n * period_ps, "ps")
    if clk_handle is not None:
        await RisingEdge(clk_handle)


async def wait_cycles(dut, n, *, edge=False, clk="clk", period_ps=None):
    """Wait ``n`` clock periods of ``dut`` with one ``Timer`` (Python wakes up once).

    Started right after a rising edge, the Timer ends at the instant of the ``n``-th edge
    after it, before the simulator has evaluated that edge (see "Sampling" in the module
    docstring); a following ``await RisingEdge(dut.clk)`` returns at that same instant.
    edge=True does that await too (a second wake-up): the coroutine then stands right
    after the ``n``-th edge exactly as after ``RisingEdge``, on every kind of clock.
    ``n == 0`` returns at once.

    period_ps  default: the period of the clock :func:`start_clock_and_reset` set up, or of
               the build's in-simulation clock.
    """
    await _wait(n, period_ps if period_ps is not None else clock_period_ps(dut),
                getattr(dut, clk) if edge else None)
