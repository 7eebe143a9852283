"""``make bench``: simulated cycles per second of the two-node system, idle and loaded.

Builds the two-node system (preset ``connectx6`` unless ``PRESET=...`` is given), runs
sim/tb_bench.py, prints the figures and records them in docs/performance.md (a table row per
run, with the commit and date). The goal: the loaded rate is at least 25 % of the idle rate,
which holds only if Python acts per transaction and never per clock cycle.
"""

import datetime
import json
import os
import pathlib
import platform
import sys
import tempfile

from hw.config import preset
from hw.system import TwoNodeSystem
from sim.experiment import git_commit
from sim.verilator import build, run

DOC = pathlib.Path(__file__).resolve().parent.parent / "docs" / "performance.md"
MARK = "<!-- bench rows: appended by make bench -->"


def main(argv):
    kv = dict(a.split("=", 1) for a in argv if "=" in a)
    name = kv.get("PRESET", os.environ.get("PRESET", "connectx6"))
    cycles = int(kv.get("CYCLES", "200000"))
    cfg = preset(name)
    info = build(TwoNodeSystem(cfg), f"system_{cfg.name}")
    with tempfile.TemporaryDirectory() as tmp:
        base = str(pathlib.Path(tmp) / "bench")
        run(info, "sim.tb_bench", extra_env={"RNIC_PRESET": cfg.name, "BENCH_CYCLES": str(cycles),
                                             "RESULTS_FILE": base})
        idle = json.loads(pathlib.Path(base + ".idle.json").read_text())
        loaded = json.loads(pathlib.Path(base + ".loaded.json").read_text())
    ratio = loaded["cycles_per_s"] / idle["cycles_per_s"]
    print(f"preset {cfg.name}: idle {idle['cycles_per_s']:,.0f} cycles/s, loaded "
          f"{loaded['cycles_per_s']:,.0f} cycles/s ({ratio:.0%} of idle; goal >= 25 %), "
          f"load {loaded['mops']:.2f} Mops simulated")
    row = (f"| {datetime.date.today()} | {git_commit()} | {cfg.name} | {idle['cycles_per_s']:,.0f} | "
           f"{loaded['cycles_per_s']:,.0f} | {ratio:.0%} | {'yes' if ratio >= 0.25 else 'NO'} | "
           f"{loaded['mops']:.2f} | {platform.machine()}, {os.cpu_count()} cores |")
    text = DOC.read_text()
    DOC.write_text(text.replace(MARK, row + "\n" + MARK) if MARK in text else text + "\n" + row + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
