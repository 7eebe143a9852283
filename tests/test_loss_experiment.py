"""`make sim EXP=loss` end to end on a tiny workload: files, targets, exactly-once."""

import csv
import json

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
    assert json.loads((tmp_path / "summary.json").read_text())["experiment"] == "loss"


def test_loss_experiment_bad_rates():
    with pytest.raises(ValueError, match=r"rates must be loss probabilities in \[0, 0.5\], not 0.7"):
        loss.run(dict(loss.PARAMS, rates="0,0.01,0.7"))
    with pytest.raises(ValueError, match="rates must include 0 and 0.01"):
        loss.run(dict(loss.PARAMS, rates="0,0.05"))
