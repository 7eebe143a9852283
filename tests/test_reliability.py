"""Integration tests of the reliable transport under faults: the two-node RTL system on
Verilator with lossy links, scored against the reference model (tests/cocotb/tb_reliability.py).

``make test`` runs a short variant (10,000 work requests at 1 % and at 5 % loss); the long
variants (100,000 work requests each) carry the ``slow`` marker: ``make test-slow``.
"""

import functools
import os

import pytest

from hw.config import preset
from sim.experiment import build_system
from sim.verilator import run

SHORT_OPS = os.environ.get("TB_OPS", "10000")


@functools.cache
def _build():
    # the build the experiments use (clock inside the simulation), converted once per session
    return build_system(preset("small"), fast=True)


def _run(testcase, **env):
    info = _build()
    env = {"RNIC_PRESET": "small", "TB_SEED": "1", **env}
    res = run(info, "tests.cocotb.tb_reliability", extra_env=env, testcase=testcase, check=False)
    results = {t.name.split(".")[-1]: t for t in res.tests}
    assert testcase in results, f"{testcase} did not run; log:\n{res.log()[-3000:]}"
    t = results[testcase]
    assert t.passed, f"{testcase} failed: {t.message}\n{res.log()[-3000:]}"


@pytest.mark.parametrize("loss", ["0.01", "0.05"])
def test_random_lossy(loss):
    _run("test_random_lossy", TB_OPS=SHORT_OPS, TB_LOSS=loss, TB_SEED="3" if loss == "0.05" else "1")


@pytest.mark.slow
@pytest.mark.parametrize("loss", ["0.01", "0.05"])
def test_random_lossy_long(loss):
    _run("test_random_lossy", TB_OPS="100000", TB_LOSS=loss, TB_SEED="7")


def test_rnr_retry():
    _run("test_rnr_retry")


def test_link_down():
    _run("test_link_down")
