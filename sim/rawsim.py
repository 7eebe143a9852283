"""Raw Verilator speed of an Amaranth design: a C++ main loop, no cocotb, no VPI.

:func:`raw_cycles_per_s` converts the design to Verilog exactly as ``sim.verilator.build``
does (same code: the same Verilog, the same ``.vlt`` file making the ports public, the same
``DEFAULT_ARGS`` and extra arguments, the C++ compiler's default ``-Os`` from verilated.mk,
the same ``MAKEFLAGS`` workaround and ``-j2``), builds it as a plain C++ executable with a
generated ``main.cpp`` and runs it. The main loop is::

    rst = 1; reset_cycles x { clk = 0; eval(); clk = 1; eval(); }
    rst = 0; t0 = now;
    cycles x { clk = 0; eval(); clk = 1; eval(); }
    wall = now - t0

with every other input held at 0 or at the constant given in ``inputs``; nothing is printed
inside the loop. The executable then prints one JSON line: ``cycles``, ``reset_cycles``,
``wall_s``, ``cycles_per_s`` and ``outputs`` (the final value of every output port:
an integer up to 64 bits, a ``"0x..."`` string above), which :func:`run_raw` parses into a
:class:`RawResult`.

Usage::

    from sim.rawsim import raw_cycles_per_s
    r = raw_cycles_per_s(TwoNodeSystem(preset("small")), "system_small", 200_000)
    print(r.cycles_per_s, r.outputs["a_mmio__rvalid"])

    exe = build_raw(top, "name", extra_args=["--threads", "2"],
                    make_vars={"OPT_FAST": "-O2"})   # Verilator and make options
    r = run_raw(exe, 1_000_000)                     # one build, any number of runs

Builds are cached like sim/verilator.py's, under ``<cache_root>/<name>-raw-<hash>``; the
hash covers the cocotb build's hash (Verilog, ``.vlt``, arguments, tool versions), the
generated ``main.cpp`` and ``make_vars``, so a raw build never reuses a cocotb build's
directory and vice versa. The cycle and reset counts are command-line arguments of the
executable, not part of the build.

Port names: Verilator encodes a double underscore in a C++ name (``a_mmio__we`` becomes
``a_mmio___05Fwe``); :func:`cxx_name` does the same and the build checks every name it uses
against the generated ``Vtop.h``.

Measured on f23febc (2 cores shared with other jobs, load about 1.8; cycles/s, median of
3 runs of 200,000 cycles, 50 M for the Ticker; all inputs 0, so the system is idle):

============================  =========  ==================  ========================
design                        default    ``OPT_FAST=-O2``    ``--threads 2``
                              (``-Os``)
============================  =========  ==================  ========================
Ticker (tests/test_simclock)  16.5 M     26.5 M              2.8 M
two-node system, ``small``    262 k      264 k (no gain)     18-166 k (erratic)
============================  =========  ==================  ========================

At 4ecc05b (before the CRC ROM of b468a0d) the small system ran at 79-85 k (``-Os``),
47-81 k (``-O2``, no gain) and 0.7-11 k cycles/s (``--threads 2``). So, confirming the
earlier notes: ``-O2`` gains nothing on the real design (it helps only a trivial one) and
``--threads 2`` on this 2-core machine is much slower (the threads spin-wait against the
other jobs); keep the defaults. For the same system under cocotb see sim/simclock.py:
145 k cycles/s with a cocotb ``Clock``, 232 k with a plain in-simulation clock.
A small system build takes about 1 minute (66 s raw, 47 s cocotb, 88 s with ``--timing``)
since b468a0d, 2.5-3 minutes before.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from sim import verilator as _v

__all__ = ["raw_cycles_per_s", "build_raw", "run_raw", "RawBuild", "RawResult", "cxx_name"]


@dataclass
class RawBuild:
    name: str
    build_dir: Path
    executable: Path
    hash: str
    skipped: bool                                   # an existing build was reused
    build_seconds: float = 0.0
    outputs: list = field(default_factory=list)     # output ports the executable prints


@dataclass
class RawResult:
    cycles: int
    reset_cycles: int
    wall_s: float
    cycles_per_s: float
    outputs: dict                                   # final output values by port name
    build: RawBuild


def cxx_name(port):
    """The C++ member name Verilator gives the Verilog identifier ``port``."""
    out, i = [], 0
    while i < len(port):
        ch = port[i]
        if ch.isalnum() and ch.isascii() and (i > 0 or ch.isalpha()):
            out.append(ch)
        elif ch == "_":
            if port[i + 1:i + 2] == "_":
                out.append("___05F")
                i += 1
            else:
                out.append("_")
        else:
            out.append(f"__0{ord(ch):02X}")
        i += 1
    return "".join(out)


def _width(rng):
    if not rng:
        return 1
    m = re.fullmatch(r"\[\s*(\d+)\s*:\s*(\d+)\s*\]", rng)
    if m is None:
        raise ValueError(f"cannot read the width of the port range {rng!r}")
    return abs(int(m.group(1)) - int(m.group(2))) + 1


def _main_cpp(decls, clk, rst, inputs):
    inputs = dict(inputs or {})
    by_name = {p: (d, _width(r)) for d, r, _, p in decls}
    if clk not in by_name or by_name[clk][0] != "input":
        raise ValueError(f"no clock input {clk!r} (ports: {', '.join(by_name)})")
    has_rst = rst is not None and rst in by_name
    for k in inputs:
        if k in (clk, rst):
            raise ValueError(f"{k!r} is driven by the main loop; it cannot be in `inputs`")
        if k not in by_name or by_name[k][0] != "input":
            raise ValueError(f"{k!r} is not an input port of the design")
    set_lines = []
    for port, (direction, width) in by_name.items():
        if direction != "input" or port in (clk, rst):
            continue
        value = int(inputs.get(port, 0)) & ((1 << width) - 1)
        n = cxx_name(port)
        if width <= 64:
            set_lines.append(f"    top->{n} = 0x{value:x}ULL;")
        else:
            for w in range((width + 31) // 32):
                set_lines.append(f"    top->{n}[{w}] = 0x{(value >> (32 * w)) & 0xFFFFFFFF:x}u;")
    out_lines, outputs = [], []
    for port, (direction, width) in by_name.items():
        if direction != "output":
            continue
        outputs.append(port)
        n = cxx_name(port)
        sep = ", " if len(outputs) > 1 else ""
        if width <= 64:
            out_lines.append(f'    std::printf("{sep}\\"{port}\\": %llu", '
                             f"(unsigned long long)top->{n});")
        else:
            words = (width + 31) // 32
            out_lines.append(f'    std::printf("{sep}\\"{port}\\": \\"0x");')
            out_lines.append(f"    for (int w = {words - 1}; w >= 0; --w) "
                             f'std::printf("%08x", (unsigned)top->{n}[w]);')
            out_lines.append('    std::printf("\\"");')
    rst_on = f"    top->{cxx_name(rst)} = 1;" if has_rst else ""
    rst_off = f"    top->{cxx_name(rst)} = 0;" if has_rst else ""
    c = cxx_name(clk)
    text = f"""// generated by sim/rawsim.py: a C++ main loop around the Verilated model, no VPI
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "Vtop.h"
#include "verilated.h"

int main(int argc, char** argv) {{
    const unsigned long long cycles = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 0;
    const unsigned long long reset_cycles = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 4;
    const std::unique_ptr<VerilatedContext> ctx{{new VerilatedContext}};
    const std::unique_ptr<Vtop> top{{new Vtop{{ctx.get(), "TOP"}}}};
{chr(10).join(set_lines)}
    top->{c} = 0;
{rst_on}
    top->eval();
    for (unsigned long long i = 0; i < reset_cycles; ++i) {{
        top->{c} = 0; top->eval();
        top->{c} = 1; top->eval();
    }}
{rst_off}
    const auto t0 = std::chrono::steady_clock::now();
    for (unsigned long long i = 0; i < cycles; ++i) {{
        top->{c} = 0; top->eval();
        top->{c} = 1; top->eval();
    }}
    const auto t1 = std::chrono::steady_clock::now();
    const double wall = std::chrono::duration<double>(t1 - t0).count();
    std::printf("{{\\"cycles\\": %llu, \\"reset_cycles\\": %llu, \\"wall_s\\": %.9f, "
                "\\"cycles_per_s\\": %.3f, \\"outputs\\": {{",
                cycles, reset_cycles, wall, wall > 0 ? cycles / wall : 0.0);
{chr(10).join(out_lines)}
    std::printf("}}}}\\n");
    top->final();
    return 0;
}}
"""
    return text, outputs


def build_raw(top, name, *, ports=None, clk="clk", rst="rst", inputs=None, extra_args=(),
              make_vars=None, cache_root="build/verilator"):
    """Build (or reuse) the raw C++ executable of ``top``; returns a :class:`RawBuild`.

    ports       as for ``sim.verilator.build`` (a plain Elaboratable's ports).
    clk, rst    the clock and reset inputs the main loop drives (``rst=None``: no reset).
    inputs      ``{port: constant}`` for other inputs (default 0).
    extra_args  more Verilator arguments (``["--threads", "2"]``, ...).
    make_vars   make variables for the C++ build (``{"OPT_FAST": "-O2"}``, ...).
    """
    _v.verilator_env()
    text, vlt, args, digest = _v._prepare(top, name, ports=ports, extra_args=extra_args)
    decls = _v._port_decls(text, name)
    main_cpp, outputs = _main_cpp(decls, clk, rst, inputs)
    make_vars = dict(make_vars or {})
    h = hashlib.sha256()
    for part in ("rawsim-1", digest, main_cpp, repr(sorted(make_vars.items()))):
        h.update(part.encode())
        h.update(b"\0")
    key = h.hexdigest()[:16]
    cache_root = _v._resolve(cache_root)
    build_dir = cache_root / f"{name}-raw-{key}"
    exe = build_dir / name
    info = RawBuild(name=name, build_dir=build_dir, executable=exe, hash=key, skipped=True,
                    outputs=outputs)
    with _v._file_lock(cache_root / f".{name}-raw-{key}.lock"):
        if (build_dir / _v._BUILD_OK).is_file() and exe.is_file():
            return info
        t0 = time.monotonic()
        if build_dir.exists():
            shutil.rmtree(build_dir)
        build_dir.mkdir(parents=True)
        vfile, vltfile = build_dir / f"{name}.v", build_dir / f"{name}.vlt"
        cpp = build_dir / "main.cpp"
        vfile.write_text(text)
        vltfile.write_text(vlt)
        cpp.write_text(main_cpp)
        log_file = build_dir / "build.log"
        env = dict(os.environ)
        env["MAKEFLAGS"] = f"{env.get('MAKEFLAGS', '')} {_v._MAKEFLAGS}".strip()
        cmds = [
            ["verilator", "--cc", "--exe", "-Mdir", str(build_dir), "--top-module", name,
             "--prefix", "Vtop", "-o", name] + list(args)
            + ["--timescale", "1ns/1ps", str(cpp), str(vltfile), str(vfile)],
            ["make", "-C", str(build_dir), "-f", "Vtop.mk"]
            + [f"{k}={v}" for k, v in sorted(make_vars.items())],
        ]
        with open(log_file, "w") as log:
            for i, cmd in enumerate(cmds):
                log.write("$ " + " ".join(cmd) + "\n")
                log.flush()
                rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env).returncode
                if rc != 0:
                    raise RuntimeError(f"raw Verilator build of {name!r} failed (exit {rc}); "
                                       f"log {log_file}:\n{_v._tail(log_file)}")
                if i == 0:
                    _check_names(build_dir / "Vtop.h", decls, clk, rst)
        (build_dir / _v._BUILD_OK).write_text(key + "\n")
        info.skipped = False
        info.build_seconds = time.monotonic() - t0
    return info


def _check_names(header, decls, clk, rst):
    text = header.read_text()
    have = set(re.findall(r"VL_(?:IN|OUT|INOUT)(?:8|16|64|W)?\(&(\w+)", text))
    missing = [p for _, _, _, p in decls if cxx_name(p) not in have]
    if missing:
        raise RuntimeError(f"ports not found in {header} under their expected C++ names: "
                           + ", ".join(f"{p} ({cxx_name(p)})" for p in missing))


def run_raw(build, cycles, *, reset_cycles=4, timeout=None):
    """Run a :class:`RawBuild` for ``cycles`` cycles after ``reset_cycles`` of reset."""
    if cycles < 0 or reset_cycles < 0:
        raise ValueError("cycles and reset_cycles must be >= 0")
    proc = subprocess.run([str(build.executable), str(int(cycles)), str(int(reset_cycles))],
                          capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{build.executable} exited with {proc.returncode}:\n"
                           f"{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    line = proc.stdout.strip().splitlines()[-1]
    d = json.loads(line)
    return RawResult(cycles=d["cycles"], reset_cycles=d["reset_cycles"], wall_s=d["wall_s"],
                     cycles_per_s=d["cycles_per_s"], outputs=d["outputs"], build=build)


def raw_cycles_per_s(top, name, cycles, *, reset_cycles=4, inputs=None, extra_args=(),
                     ports=None, clk="clk", rst="rst", make_vars=None,
                     cache_root="build/verilator"):
    """Build (cached) and run the raw C++ loop of ``top``; returns a :class:`RawResult`
    (``cycles``, ``wall_s``, ``cycles_per_s``, final ``outputs``)."""
    exe = build_raw(top, name, ports=ports, clk=clk, rst=rst, inputs=inputs,
                    extra_args=extra_args, make_vars=make_vars, cache_root=cache_root)
    return run_raw(exe, cycles, reset_cycles=reset_cycles)
