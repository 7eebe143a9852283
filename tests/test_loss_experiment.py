"""`make sim EXP=loss` end to end on a tiny workload: files, targets, exactly-once."""

import csv
import json
import pathlib
import re

import pytest

from sim.experiments import loss


def test_loss_experiment_small(tmp_path, monkeypatch):
    monkeypatch.setattr(loss, "results_dir", lambda name: tmp_path)
    monkeypatch.setattr("sim.experiment.results_dir", lambda name: tmp_path)
    params = dict(loss.PARAMS, rates="0,0.01,0.05", ops=48, qps=2, depth=2, size=1024)
    summary = loss.run(params)
    targets = {t["name"]: t for t in summary["targets"]}
    assert targets["exactly_once"]["met"] is True
    assert targets["goodput_at_1pct_loss"]["met"] is None           # reported, not judged
    assert 0.0 < targets["goodput_at_1pct_loss"]["model"] <= 1.2
    with open(tmp_path / "loss.csv") as f:
        rows = list(csv.DictReader(f))
    assert [float(r["loss"]) for r in rows] == [0.0, 0.01, 0.05]
    assert all(r["exactly_once"] == "True" and int(r["ops"]) == 48 for r in rows)
    assert int(rows[0]["frames_lost"]) == 0 and int(rows[2]["frames_lost"]) > 0
    assert int(rows[2]["retransmits"]) > 0
    assert (tmp_path / "loss.png").stat().st_size > 1000
    written = json.loads((tmp_path / "summary.json").read_text())
    assert written["experiment"] == "loss"
    # every field of the configuration is recorded, structural constants included
    nic = written["system"]["nic"]
    assert nic["wqe_batch"] == 4 and nic["replay_slots"] == 16 and nic["n_qps"] == 8
    assert written["system"]["link"]["latency_ns"] == 100.0
    # The testbench ran with the experiment's local ACK timeout.
    assert json.loads((tmp_path / "raw.json").read_text())["timeout"] == params["timeout"]


def test_loss_experiment_timeout_is_the_lossy_tests():
    """The experiment's default local ACK timeout is the one the lossy tests use (33 us:
    shorter ones fire spuriously while long messages queue, docs/reliability.md)."""
    src = (pathlib.Path(__file__).resolve().parent / "cocotb" / "tb_reliability.py").read_text()
    (tests_timeout,) = re.findall(r'timeout=int\(os\.environ\.get\("TB_TIMEOUT", "(\d+)"\)\)', src)
    tb_src = pathlib.Path(loss.__file__).with_name("tb_loss.py").read_text()
    (tb_default,) = re.findall(r'os\.environ\.get\("LOSS_TIMEOUT", "(\d+)"\)', tb_src)
    assert loss.PARAMS["timeout"] == int(tests_timeout) == int(tb_default) == 3


def test_loss_experiment_bad_rates():
    with pytest.raises(ValueError, match=r"rates must be loss probabilities in \[0, 0.5\], not 0.7"):
        loss.run(dict(loss.PARAMS, rates="0,0.01,0.7"))
    with pytest.raises(ValueError, match="rates must include 0 and 0.01"):
        loss.run(dict(loss.PARAMS, rates="0,0.05"))
