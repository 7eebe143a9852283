"""``make sim`` (EXP=demo): two nodes, unloaded READ latency and a short mixed workload.

Builds the two-node system of the chosen preset (default ``connectx6``), runs
sim/experiments/tb_demo.py under Verilator, and writes ``results/demo/``:

* ``rtt.csv``: every unloaded 8-byte READ round trip (post to completion);
* ``demo.png``: latency and throughput, the paper's value beside the model's;
* ``summary.json``: targets ``read_rtt_us`` (SMART, ASPLOS'24: about 2.35 us on
  ConnectX-6 behind one switch) and ``mops``: 8-byte READ throughput of 12 QPs at depth 1
  in a batch-synchronous closed loop, which the SMART artifact measured at 5.103 Mops
  (reference/smart-ae/fig4a.csv, 12 threads, depth 1). Other QPS/DEPTH values have no
  paper figure, and the target is then reported without one.

``PCAP=<file>`` also writes a capture of every frame on both links. ``HOST=python`` (default)
runs it on the Python host model (sim/host.py), ``HOST=rtl`` on the synthesizable host
(hw/host/); both model the same latency, bandwidth and TLP overhead (docs/host-interface.md).
"""

import csv
import json
import os
import pathlib
import statistics
import time

from sim.experiment import Target, build_system, results_dir, system_config, write_summary
from sim.verilator import run as run_cocotb

NAME = "demo"
PARAMS = {"preset": "connectx6", "ops": 2000, "qps": 12, "depth": 1, "rtt_samples": 100,
          "seed": 1, "pcap": "", "host": "python"}

PAPER_RTT_US = 2.35
#: SMART artifact, fig4a.csv (READ, one doorbell per thread): (threads, depth) -> Mops.
PAPER_MOPS = {(12, 1): 5.103, (12, 4): 13.591, (12, 8): 21.799}


def run(params):
    cfg = system_config(params["preset"], params["host"])
    out = results_dir(NAME)
    t0 = time.perf_counter()
    info = build_system(cfg, fast=True)
    results_file = out / "raw.json"
    env = {
        "RNIC_PRESET": cfg.name, "RNIC_HOST": cfg.host.kind,
        "DEMO_OPS": str(params["ops"]), "DEMO_QPS": str(params["qps"]),
        "DEMO_DEPTH": str(params["depth"]), "DEMO_RTT_SAMPLES": str(params["rtt_samples"]),
        "DEMO_SEED": str(params["seed"]), "RESULTS_FILE": str(results_file),
        "PCAP": str(pathlib.Path(params["pcap"]).resolve()) if params["pcap"] else "",
    }
    run_cocotb(info, "sim.experiments.tb_demo", extra_env=env)
    r = json.loads(results_file.read_text())
    wall = time.perf_counter() - t0

    rtt_us = [x / 1000 for x in r["rtt_ns"]]
    with open(out / "rtt.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["sample", "read_rtt_us"])
        w.writerows(enumerate(rtt_us))
    median = statistics.median(rtt_us)

    paper_mops = PAPER_MOPS.get((r["qps"], r["depth"]))
    targets = [
        Target("read_rtt_us", PAPER_RTT_US, round(median, 3), "us", 0.10,
               note="median unloaded 8-byte READ, post to CQE visible"),
        Target("mops", paper_mops, round(r["mops"], 3), "Mops", 0.10,
               note=f"8-byte READ, {r['qps']} QPs x depth {r['depth']}, batch-synchronous"),
    ]
    sim = {"cycles": r["cycles"], "wall_s": round(r["wall_s"], 2),
           "cycles_per_s": round(r["cycles"] / r["wall_s"], 1)}
    config = {"preset": cfg.name, **params, "build_skipped": info.skipped, "total_wall_s": round(wall, 1)}
    summary = write_summary(NAME, config, targets, sim, system=cfg,
                            extra={"mixed_mops": round(r["mixed_mops"], 3),
                                   "counters": r["counters"], "pcap_frames": r["pcap_frames"]})
    _plot(out / "demo.png", rtt_us, median, cfg.name, r["mops"], paper_mops, r["mixed_mops"])
    print(f"READ round trip: median {median:.3f} us, min {min(rtt_us):.3f}, max {max(rtt_us):.3f} "
          f"over {len(rtt_us)} samples")
    print(f"closed loop, 8-byte READ: {r['throughput_ops']} ops in "
          f"{r['throughput_ns'] / 1000:.1f} us = {r['mops']:.3f} Mops")
    print(f"closed loop, READ/WRITE/FAA mix: {r['mixed_ops']} ops, {r['mixed_mops']:.3f} Mops")
    if params["pcap"]:
        print(f"pcap: {r['pcap_frames']} frames written to {params['pcap']}")
    return summary


def _plot(path, rtt_us, median, name, mops, paper_mops, mixed_mops):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(8, 3.5))
    ax1.bar(["SMART (ConnectX-6)", "model"], [PAPER_RTT_US, median], color=["#cc3311", "#4477aa"])
    ax1.errorbar([1], [median], yerr=[[median - min(rtt_us)], [max(rtt_us) - median]],
                 color="black", capsize=4)
    ax1.set_ylabel("8-byte READ round trip (us)")
    ax1.set_title("Unloaded latency")
    labels = ["SMART", "model: READ", "model: mix"]
    values = [paper_mops or 0.0, mops, mixed_mops]
    ax2.bar(labels, values, color=["#cc3311", "#4477aa", "#88ccee"])
    ax2.set_ylabel("Mops")
    ax2.set_title("12 QPs x depth 1, closed loop")
    for ax in (ax1, ax2):
        for p in ax.patches:
            ax.annotate(f"{p.get_height():.2f}", (p.get_x() + p.get_width() / 2, p.get_height()),
                        ha="center", va="bottom", fontsize=8)
    fig.suptitle(f"make sim EXP=demo, preset {name}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
