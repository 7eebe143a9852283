"""The experiment convention (sim/experiment.py)."""

import pytest

from sim.experiment import Target, parse_params, format_table


def test_target_met():
    assert Target("rtt", 2.35, 2.4, "us", 0.1).met
    assert not Target("rtt", 2.35, 3.0, "us", 0.1).met
    assert Target("exactly_once", True, True).met
    assert not Target("exactly_once", True, False).met
    assert not Target("x", 1.0, None).met
    assert Target("no paper figure", None, 3.0).met is None      # reported, not judged
    d = Target("mops", 5.1, 4.0, "Mops", 0.1).as_dict()
    assert set(d) == {"name", "paper", "model", "unit", "tolerance", "met", "kind"}
    assert d["met"] is False and d["kind"] == "prediction"
    assert Target("rtt", 2.35, 2.4, kind="calibration").as_dict()["kind"] == "calibration"
    with pytest.raises(ValueError, match=r"kind must be one of \('prediction', 'calibration'\), not 'fit'"):
        Target("rtt", 2.35, 2.4, kind="fit")


def test_parse_params():
    defaults = {"ops": 100, "rate": 0.5, "name": "x", "pcap": "", "quick": False}
    p = parse_params(defaults, ["OPS=0x10", "rate=1.5", "QUICK=yes", "PCAP=a.pcap"])
    assert p == {"ops": 16, "rate": 1.5, "name": "x", "pcap": "a.pcap", "quick": True}
    with pytest.raises(ValueError, match="unknown parameter 'FOO'"):
        parse_params(defaults, ["FOO=1"])
    with pytest.raises(ValueError, match="parameters are KEY=value"):
        parse_params(defaults, ["OPS"])


def test_table_marks_missed_targets():
    summary = {"targets": [Target("a", 1.0, 1.0).as_dict(), Target("b", 1.0, 2.0).as_dict()],
               "sim": {"cycles": 10, "wall_s": 1.0, "cycles_per_s": 10.0}, "commit": "abc"}
    text = format_table(summary)
    assert "yes" in text and "NO" in text
    summary["targets"].append(Target("c", 2.0, 2.0, kind="calibration").as_dict())
    assert format_table(summary).splitlines()[4].split()[-1] == "calibration"


def test_system_config_host():
    from sim.experiment import system_config
    assert system_config("small", "rtl").host.kind == "rtl"
    assert system_config("connectx6", "python").host.kind == "python"
    with pytest.raises(ValueError, match=r"host must be one of python, rtl, not 'fpga'"):
        system_config("small", "fpga")
