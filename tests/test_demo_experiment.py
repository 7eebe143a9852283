"""`make sim EXP=demo` end to end on a small workload, on both host models (``HOST=python``
and ``HOST=rtl``): files, targets, and the two hosts' agreement on the unloaded READ round
trip (their latency models are the same: docs/host-interface.md)."""

import json

import pytest

from sim.experiments import demo


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = {}
    for host in ("python", "rtl"):
        d = tmp_path_factory.mktemp(f"demo_{host}")
        mp = pytest.MonkeyPatch()
        mp.setattr(demo, "results_dir", lambda name, d=d: d)
        mp.setattr("sim.experiment.results_dir", lambda name, d=d: d)
        try:
            # 2 QPs: their two regions per node fit the small preset's 2-entry MR cache, so
            # the hosts are compared without MR misses (each a host round trip per WR)
            params = dict(demo.PARAMS, preset="small", ops=96, qps=2, depth=2, rtt_samples=10,
                          host=host, pcap=str(d / "demo.pcap"))
            out[host] = (demo.run(params), d)
        finally:
            mp.undo()
    return out


@pytest.mark.parametrize("host", ["python", "rtl"])
def test_demo_runs(runs, host):
    summary, d = runs[host]
    assert summary["config"]["host"] == host
    targets = {t["name"]: t for t in summary["targets"]}
    assert 0.5 < targets["unloaded_read_rtt_us"]["model"] < 5.0
    assert targets["unloaded_read_rtt_us"]["paper"] is None
    assert targets["mops"]["model"] > 0 and targets["mops"]["paper"] is None   # no paper figure
    # the loaded round trip is Little's law on the closed loop: 2 QPs x depth 2 / Mops, and
    # at least the unloaded one (requests of a batch wait for each other)
    loaded = targets["read_rtt_us"]["model"]
    assert loaded == pytest.approx(4 / targets["mops"]["model"], abs=0.002)
    assert loaded >= 0.95 * targets["unloaded_read_rtt_us"]["model"]
    assert {t["kind"] for t in summary["targets"]} == {"prediction"}     # small: nothing fitted
    assert (d / "demo.png").stat().st_size > 1000 and (d / "rtt.csv").exists()
    assert json.loads((d / "summary.json").read_text())["experiment"] == "demo"
    counters = summary["extra"]["counters"]
    assert counters["a"]["CQES"] > 0
    # the capture (sampled on the in-simulation clock) holds every frame both NICs sent
    sent = counters["a"]["TX_PACKETS"] + counters["b"]["TX_PACKETS"]
    assert summary["extra"]["pcap_frames"] == sent > 0


def test_demo_hosts_agree(runs):
    """Same preset, same workload: the median round trip (timed from the doorbell) of the two
    hosts is within 1 % plus 2 cycles: the Python host applies a CQE write when it gets the
    whole TLP through its mailbox, 2 cycles after the RTL host has stored its last word (the
    NIC sees the same timing; only when the waiting coroutine wakes differs). The
    closed-loop throughput also counts the host CPU's WQE writes, which take a few cycles
    each on the RTL host's CPU port and no time in the Python host, so it is only checked to
    10 %."""
    from hw.config import preset
    py = {t["name"]: t["model"] for t in runs["python"][0]["targets"]}
    rtl = {t["name"]: t["model"] for t in runs["rtl"][0]["targets"]}
    two_cycles_us = 2 / preset("small").nic.clock_mhz
    assert (abs(rtl["unloaded_read_rtt_us"] - py["unloaded_read_rtt_us"])
            <= 0.01 * py["unloaded_read_rtt_us"] + two_cycles_us)
    assert rtl["mops"] == pytest.approx(py["mops"], rel=0.10)
