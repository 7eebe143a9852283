"""``make bench``: simulated cycles per second of the two-node system, raw and under cocotb.

For one preset (``connectx6`` unless ``PRESET=...``) it measures, on the same design:

* ``raw``: the RTL-host system in a C++ main loop (sim/rawsim.py: no cocotb, no VPI, inputs
  held at 0, so the system idles): the ceiling; run before and after the others, the
  faster run counts (both are recorded, ``raw_runs_cycles_per_s``);
* ``idle``: the RTL-host system under cocotb with an in-simulation clock
  (``InternalClock(compat=False)``, sim/verilator.py: toggled by the build's C++ main loop,
  no ``--timing``), reset, then one Timer;
* ``loaded_python`` / ``loaded_rtl``: sim/tb_bench.py's steady load (4 QP pairs x 8 READs
  and WRITEs in flight) at 8-byte and at 4 KB operations, with the Python host (Python serves
  every TLP) and with the RTL host (Python posts work requests and waits on the CQE event
  line); both builds with the in-simulation clock.

Each is also given as a ratio to raw. Goals (issue 7): loaded with the RTL host >= 80 % of
raw, with the Python host >= 25 % of raw, at both sizes. The figures go to
``results/bench/summary.json`` (keys ``raw_cycles_per_s``, ``idle_cycles_per_s``,
``loaded_python_cycles_per_s``, ``loaded_rtl_cycles_per_s`` (the slower of the two sizes),
per size ``loaded_<host>_<size>_cycles_per_s``, the ratios, the commit, the preset and the
build options) and a row per run to docs/performance.md. ``CYCLES=n`` sets the measurement
window (default 200,000 cycles; raw runs 5x as long).

Issue 8 adds, with the RTL host: ``peak_read_mops`` / ``peak_write_mops``, the 8-byte
READ / WRITE rate on 48 QP pairs (up to 768 READs outstanding, the point of SMART's peak;
fewer pairs if the preset holds fewer; QPNs 0 and 1 reserved, all QPs of a node sharing one
MR), 64 work requests per QP posted at once (and ``closed_loop_<op>_mops``: 16 in flight
per QP; ``full_<op>_mops``: the burst on 64 pairs, 1,024 READs outstanding); and ``qps_<n>_cycles_per_s`` for n = 64, 1,024 and
4,096: the standard 8-byte load on the system built with ``n_qps = n`` (``QPS=64,1024,4096``
chooses the sizes; by default only the preset's own, as every other size is a build of its
own: at 4,096 QPs about half an hour here; a size not measured is
None in the summary, with the reason in ``qps_not_measured``). ``ONLY=qps`` runs the
scaling measurement alone (into ``results/bench/qps_summary.json``, no row in
docs/performance.md). ``ONLY=peak`` runs the peaks alone, on builds with ``n_pus`` = each of
``PUS=1,4`` (the requester's processing units; by default the preset's), into
``results/bench/peak_summary.json``.

The peak (``peak_<op>_mops``) is the NIC's processing rate with the host CPU out of the way
(sim/tb_bench.py ``burst``: work requests written before the clock starts, then the
doorbells); ``closed_loop_<op>_mops`` keeps 16 in flight per QP with the Python-driven CPU
posting each new one, which bounds it too.
"""

import datetime
import json
import os
import pathlib
import platform
import sys
import tempfile

from hw.config import MAX_QPS, preset
from hw.system import TwoNodeSystem
from sim.experiment import build_system, git_commit, results_dir
from sim.rawsim import build_raw, run_raw
from sim.verbs import FIRST_QPN
from sim.verilator import DEFAULT_ARGS, run

DOC = pathlib.Path(__file__).resolve().parent.parent / "docs" / "performance.md"
MARK = "<!-- bench rows: appended by make bench -->"
SIZES = (8, 4096)
GOALS = {"python": 0.25, "rtl": 0.80}


def _tb(info, cfg, test, cycles, tmp, **env):
    base = str(pathlib.Path(tmp) / f"{cfg.host.kind}_{test}_{env.get('BENCH_SIZE', 0)}")
    run(info, "sim.tb_bench", testcase=test,
        extra_env={"RNIC_PRESET": cfg.name, "RNIC_HOST": cfg.host.kind,
                   "BENCH_CYCLES": str(cycles), "RESULTS_FILE": base,
                   **{k: str(v) for k, v in env.items()}})
    return json.loads(pathlib.Path(f"{base}.{test}.json").read_text())


def measure(name, cycles, qps=(64,)):
    base = preset(name)
    cfgs = {k: base.replace(host__kind=k) for k in ("python", "rtl")}
    exe = build_raw(TwoNodeSystem(cfgs["rtl"]), f"system_{name}_rtl")
    raws = [run_raw(exe, 5 * cycles).cycles_per_s]
    print(f"raw C++ loop (RTL host): {raws[0]:,.0f} cycles/s")
    s = {"preset": name, "commit": git_commit(), "date": str(datetime.date.today()),
         "machine": f"{platform.machine()}, {os.cpu_count()} cores",
         "build": {"verilator_args": list(DEFAULT_ARGS), "cxx_opt": "-Os (verilated.mk default)",
                   "threads": 1,
                   "clock": "in-simulation, plain, toggled by the C++ main loop (engine cxx)"},
         "cycles": cycles}
    with tempfile.TemporaryDirectory() as tmp:
        infos = {}
        for kind, cfg in cfgs.items():
            info = infos[kind] = build_system(cfg, fast=True)
            if kind == "rtl":
                idle = _tb(info, cfg, "idle", cycles, tmp)
                s["idle_cycles_per_s"] = idle["cycles_per_s"]
                print(f"cocotb idle, in-simulation clock: {idle['cycles_per_s']:,.0f} cycles/s")
            rates = []
            for size in SIZES:
                r = _tb(info, cfg, "loaded", cycles, tmp, BENCH_SIZE=size)
                s[f"loaded_{kind}_{size}_cycles_per_s"] = r["cycles_per_s"]
                s[f"loaded_{kind}_{size}_mops"] = r["mops"]
                s[f"loaded_{kind}_{size}_gbps"] = r["gbps"]
                rates.append(r["cycles_per_s"])
                print(f"loaded, {kind} host, {size}-byte ops: {r['cycles_per_s']:,.0f} cycles/s "
                      f"({r['mops']:.2f} Mops, {r['gbps']:.1f} Gb/s simulated)")
            s[f"loaded_{kind}_cycles_per_s"] = min(rates)
        _peaks(s, infos["rtl"], cfgs["rtl"], cycles, tmp)
    _qps(s, base, qps, cycles)
    # raw again at the end: the ceiling is the faster of the two runs, so that a burst of
    # load from elsewhere during one of them does not inflate the ratios
    raws.append(run_raw(exe, 5 * cycles).cycles_per_s)
    print(f"raw C++ loop again: {raws[1]:,.0f} cycles/s")
    s["raw_runs_cycles_per_s"] = raws
    s["raw_cycles_per_s"] = max(raws)
    for key in ("idle", "loaded_python", "loaded_rtl"):
        s[f"{key}_to_raw"] = s[f"{key}_cycles_per_s"] / s["raw_cycles_per_s"]
    for kind in ("python", "rtl"):
        for size in SIZES:
            print(f"loaded, {kind} host, {size}-byte ops: "
                  f"{s[f'loaded_{kind}_{size}_cycles_per_s'] / s['raw_cycles_per_s']:.0%} of raw")
    for kind, goal in GOALS.items():
        s[f"loaded_{kind}_goal"] = goal
        s[f"loaded_{kind}_goal_met"] = s[f"loaded_{kind}_to_raw"] >= goal
    return s


#: the engines whose occupancy counters (hw/regmap.py ``BUSY_*``, ``TX_BEATS``, ``RX_BEATS``)
#: locate a bound: each handles one item at a time, so the one near 1.0 limits the rate
OCCUPANCY = {"req_send": "BUSY_REQ_SEND", "req_resp": "BUSY_REQ_RESP", "responder": "BUSY_RSP",
             "completion": "BUSY_CQE", "qp_cache": "BUSY_QP_CACHE", "mr_cache": "BUSY_MR_CACHE",
             "cq_cache": "BUSY_CQ_CACHE", "tx_link": "TX_BEATS", "rx_link": "RX_BEATS"}
#: where the send engines' busy cycles go waiting (hw/regmap.py ``WAIT_SEND_*``), printed
#: beside the occupancy as shares of the measured cycles (per unit)
SEND_WAITS = {"req_send_wait_wqe": "WAIT_SEND_WQE", "req_send_wait_mr": "WAIT_SEND_MR",
              "req_send_wait_tx": "WAIT_SEND_TX", "req_send_wait_pay": "WAIT_SEND_PAY"}
#: back-pressure along the frame path (hw/regmap.py ``STALL_*``): shares of the measured
#: cycles in which a beat was offered and not taken
STALLS = {"req_tx": "STALL_REQ_TX", "rsp_tx": "STALL_RSP_TX", "tx": "STALL_TX",
          "rx": "STALL_RX", "req_rx": "STALL_REQ_RX", "rsp_rx": "STALL_RSP_RX"}
#: queues (hw/regmap.py ``Q_*``: occupancy added every cycle) and what passes through each:
#: name -> (counter, the counter of items through it or None for the operations). Node a's
#: requester (all units): QPs in the ready queues and WQE batches in flight (fetch issued,
#: not yet sent), per WQE-fetch DMA read; READ / atomic requests outstanding, per
#: operation; both nodes' DMA reads in flight (tags in use) and writes waiting for their
#: response, per TLP; the responder's response queue, per operation
QUEUES = {"ready_qps": ("Q_REQ_READY", "RD_WQE_REQS"),
          "fetch_batches": ("Q_REQ_FETCH", "RD_WQE_REQS"),
          "rd_outstanding": ("Q_REQ_RD_OUT", None),
          "dma_reads": ("Q_HIF_READS", "HIF_READ_REQS"),
          "dma_writes": ("Q_HIF_WRITES", "HIF_WRITE_TLPS"),
          "rsp_queue": ("Q_RSP_QUEUE", None)}


def queues(counters, cycles, ops):
    """Per node, each queue's mean length over ``cycles`` and, by Little's law, the mean
    time (cycles) an item spends in it: the sum of the lengths over the items through it
    (:data:`QUEUES`; ``ops`` operations for those counted per operation). Queues that stayed
    empty are left out."""
    out = {}
    for node, c in counters.items():
        d = {}
        for name, (counter, through) in QUEUES.items():
            if not c.get(counter):
                continue
            n = ops if through is None else c[through]
            d[name] = {"mean": round(c[counter] / cycles, 2),
                       "cycles_each": round(c[counter] / n, 1) if n else None}
        out[node] = d
    return out


#: the peak's QP pairs: 48 x max_rd_atomic (16) = 768 READs outstanding at most, the point
#: of SMART's peak (96 threads x depth 8, Fig. 4: 111 Mops); ``full_<op>_mops`` is measured
#: with 64 pairs (1,024 outstanding: every entry of connectx6's WQE cache)
PEAK_PAIRS = 48
FULL_PAIRS = 64


def occupancy(counters, cycles, n_pus=1, which=OCCUPANCY):
    """Per node, each engine's busy cycles over ``cycles`` (the requester's engines over
    ``cycles * n_pus``: the units' sum); ``which`` maps names to counters (default
    :data:`OCCUPANCY`). The counters span the measured rounds and the few register reads
    around them, so a share may exceed the rounds' time slightly."""
    out = {}
    for node, c in counters.items():
        out[node] = {e: round(c[name] / (cycles * (n_pus if e.startswith("req_") else 1)), 3)
                     for e, name in which.items()}
    return out


def _peaks(s, info, cfg, cycles, tmp, prefix=""):
    """The 8-byte READ and WRITE peaks on ``PEAK_PAIRS`` QP pairs (fewer if the node holds
    fewer; QPNs 0 and 1 are reserved), all QPs of a node sharing one MR:

    * ``peak_<op>_mops``: the NIC's processing rate (sim/tb_bench.py ``burst``): 64 work
      requests per QP written before the clock starts, every doorbell rung, the time until
      the NIC has written the last CQE (the host CPU reads them afterwards); three rounds,
      the first (caches cold) not counted;
    * ``closed_loop_<op>_mops``: ``max_rd_atomic`` (16) in flight per QP, the Python-driven
      CPU posting a new one as each completes (sim/tb_bench.py ``loaded``): bounded by that
      host's posting rate as much as by the NIC;
    * ``full_<op>_mops``: the burst on ``FULL_PAIRS`` pairs (1,024 READs outstanding with
      ``connectx6``, as many as its WQE cache holds).
    """
    # QPNs 0 and 1 are reserved (the special QP0 and QP1 of InfiniBand; sim/verbs.py)
    avail = min(cfg.nic.n_qps - FIRST_QPN, cfg.nic.n_cqs)
    pairs, full = min(PEAK_PAIRS, avail), min(FULL_PAIRS, avail)
    window = 16
    s[f"{prefix}peak_pairs"], s[f"{prefix}peak_window"] = pairs, window
    s[f"{prefix}n_pus"] = cfg.nic.n_pus
    pus = {"BENCH_PUS": cfg.nic.n_pus}
    for op in ("read", "write"):
        for n, key in ((pairs, f"peak_{op}"), (full, f"full_{op}")):
            if key.startswith("full") and n == pairs:
                continue
            r = _tb(info, cfg, "burst", cycles, tmp, BENCH_SIZE=8, BENCH_OP=op, BENCH_PAIRS=n,
                    **pus)
            s[f"{prefix}{key}_mops"] = r["mops"]
            s[f"{prefix}{key}_pairs"] = n
            s[f"{prefix}{key}_cycles_per_s"] = r["cycles_per_s"]
            s[f"{prefix}{key}_counters"] = r["counters"]
            c = r["counters"]["a"]
            print(f"{key.replace('_', ' ')}, 8-byte {op.upper()}s, {n} QP pairs x {r['burst']} "
                  + (f"posted (up to {n * cfg.nic.max_rd_atomic} READs outstanding), "
                     if op == "read" else "posted, ")
                  + f"{cfg.nic.n_pus} processing unit(s): {r['mops']:.2f} Mops "
                  f"({r['ops'] / r['cycles']:.3f} per cycle; WQE cache misses "
                  f"{c['WQE_CACHE_MISSES']}, WQE fetches {c['WQE_FETCHES']} for {r['ops']} WRs)")
            occ = occupancy(r["counters"], r["cycles"], cfg.nic.n_pus)
            s[f"{prefix}{key}_occupancy"] = occ
            top = sorted(((v, f"{k}.{e}") for k, d in occ.items() for e, v in d.items()),
                         reverse=True)
            print("  occupancy (busy cycles / measured cycles), highest first: "
                  + ", ".join(f"{name} {v:.2f}" for v, name in top[:6]))
            waits = occupancy(r["counters"], r["cycles"], cfg.nic.n_pus, SEND_WAITS)
            s[f"{prefix}{key}_send_waits"] = waits["a"]
            print("  node a's send engines wait (share of the measured cycles, per unit): "
                  + ", ".join(f"{e[9:]} {v:.2f}" for e, v in waits["a"].items()))
            q = queues(r["counters"], r["cycles"], r["ops"])
            s[f"{prefix}{key}_queues"] = q
            print("  queues (mean length / cycles each, by Little's law): "
                  + "; ".join(f"node {k}: " + ", ".join(
                      f"{e} {v['mean']} / {v['cycles_each']}" for e, v in d.items())
                      for k, d in q.items()))
            stalls = occupancy(r["counters"], r["cycles"], 1, STALLS)
            s[f"{prefix}{key}_stalls"] = stalls
            print("  back-pressure (share of the measured cycles a beat waited): "
                  + "; ".join(f"node {k}: " + ", ".join(f"{e} {v:.2f}" for e, v in d.items())
                              for k, d in stalls.items()))
        r = _tb(info, cfg, "loaded", cycles, tmp, BENCH_SIZE=8, BENCH_OP=op, BENCH_SHARED=1,
                BENCH_PAIRS=pairs, BENCH_WINDOW=window, **pus)
        s[f"{prefix}closed_loop_{op}_mops"] = r["mops"]
        print(f"closed loop, 8-byte {op.upper()}s, {pairs} QP pairs x {window} in flight, "
              f"posted by the Python-driven CPU: {r['mops']:.2f} Mops")


def _peaks_by_pus(name, pus, cycles):
    """``ONLY=peak``: the peaks on builds of the preset with ``n_pus`` = each of ``pus``
    (everything else the preset's; ``fetch_depth`` recorded)."""
    s = {"preset": name, "commit": git_commit(), "date": str(datetime.date.today()),
         "machine": f"{platform.machine()}, {os.cpu_count()} cores", "cycles": cycles,
         "by_pus": {}}
    for n in pus:
        cfg = preset(name).replace(host__kind="rtl", nic__n_pus=n)
        r = {"fetch_depth": cfg.nic.fetch_depth}
        with tempfile.TemporaryDirectory() as tmp:
            _peaks(r, build_system(cfg, fast=True), cfg, cycles, tmp)
        s["by_pus"][n] = r
    return s


def _qps(s, base, qps, cycles):
    """``qps_<n>_cycles_per_s``: the loaded two-node system (RTL host, the standard 8-byte
    load) built with ``n_qps = n``; sizes not measured are None, with the reason."""
    s["qps_not_measured"] = {}
    for n in (64, 1024, 4096):
        key = f"qps_{n}_cycles_per_s"
        if n > MAX_QPS:
            s[key] = None
            s["qps_not_measured"][n] = f"n_qps is limited to {MAX_QPS} (hw/config.py)"
        elif n not in qps:
            s[key] = None
            s["qps_not_measured"][n] = "not asked for (QPS=64,1024 measures it)"
        elif n == base.nic.n_qps and "loaded_rtl_8_cycles_per_s" in s:
            s[key] = s["loaded_rtl_8_cycles_per_s"]
        else:
            cfg = base.replace(host__kind="rtl", nic__n_qps=n)
            with tempfile.TemporaryDirectory() as tmp:
                r = _tb(build_system(cfg, fast=True), cfg, "loaded", cycles, tmp, BENCH_SIZE=8,
                        BENCH_N_QPS=n)
            s[key] = r["cycles_per_s"]
        if s[key] is not None:
            print(f"loaded, RTL host, 8-byte ops, n_qps = {n}: {s[key]:,.0f} cycles/s")
    a, b = s["qps_64_cycles_per_s"], s["qps_4096_cycles_per_s"]
    s["qps_4096_to_64"] = b / a if a and b else None


def _row(s):
    def k(v):
        return f"{v / 1000:,.0f} k"
    cells = [s["date"], s["commit"], s["preset"], k(s["raw_cycles_per_s"]),
             f"{k(s['idle_cycles_per_s'])} ({s['idle_to_raw']:.0%})"]
    for kind in ("python", "rtl"):
        cells += [f"{k(s[f'loaded_{kind}_{n}_cycles_per_s'])} "
                  f"({s[f'loaded_{kind}_{n}_cycles_per_s'] / s['raw_cycles_per_s']:.0%})"
                  for n in SIZES]
        cells.append("yes" if s[f"loaded_{kind}_goal_met"] else "NO")
    cells.append(s["machine"])
    return "| " + " | ".join(cells) + " |"


def main(argv):
    kv = dict(a.split("=", 1) for a in argv if "=" in a)
    name = kv.get("PRESET", os.environ.get("PRESET", "connectx6"))
    cycles = int(kv.get("CYCLES", "200000"))
    own = preset(name).nic.n_qps           # measured anyway: the preset's own build
    qps = tuple(int(q) for q in kv.get("QPS", str(own if own in (64, 1024, 4096) else 64))
                .split(","))
    for q in qps:
        if q not in (64, 1024, 4096):
            raise ValueError(f"QPS must list values of 64, 1024, 4096, not {q}")
    if kv.get("ONLY") not in (None, "qps", "peak"):
        raise ValueError(f"ONLY must be 'qps' (the scaling measurement alone) or 'peak' (the "
                         f"peaks alone), not {kv['ONLY']!r}")
    if kv.get("ONLY") == "peak":
        pus = tuple(int(p) for p in kv.get("PUS", str(preset(name).nic.n_pus)).split(","))
        for p in pus:
            if p not in (1, 2, 4, 8):
                raise ValueError(f"PUS must list values of 1, 2, 4, 8, not {p}")
        s = _peaks_by_pus(name, pus, cycles)
        out = results_dir("bench")
        (out / "peak_summary.json").write_text(json.dumps(s, indent=2) + "\n")
        print(f"written {out / 'peak_summary.json'}")
        return 0
    if kv.get("ONLY") == "qps":
        s = {"preset": name, "commit": git_commit(), "date": str(datetime.date.today()),
             "machine": f"{platform.machine()}, {os.cpu_count()} cores", "cycles": cycles}
        _qps(s, preset(name), qps, cycles)
        out = results_dir("bench")
        (out / "qps_summary.json").write_text(json.dumps(s, indent=2) + "\n")
        print(f"written {out / 'qps_summary.json'}")
        return 0
    s = measure(name, cycles, qps)
    out = results_dir("bench")
    (out / "summary.json").write_text(json.dumps(s, indent=2) + "\n")
    print(f"written {out / 'summary.json'}")
    row = _row(s)
    print(row)
    text = DOC.read_text()
    DOC.write_text(text.replace(MARK, row + "\n" + MARK) if MARK in text else text + "\n" + row + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
