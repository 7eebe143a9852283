"""Integration tests: the two-node RTL system on Verilator, scored against the reference model.

The system is built once per session (cached by a hash of its Verilog); the cocotb module
tests/cocotb/tb_system.py runs every test case in one simulator process and each pytest
test below reports one of them.
"""

import os

import pytest

from hw.config import preset
from hw.system import TwoNodeSystem
from sim.verilator import build, run

CASES = [
    "test_each_opcode",
    "test_error_wrong_rkey",
    "test_error_out_of_bounds",
    "test_error_missing_right",
    "test_error_pd_mismatch",
    "test_error_misaligned_atomic",
    "test_error_unknown_opcode",
    "test_error_bad_lkey",
    "test_error_send_without_receive",
    "test_error_send_too_long",
    "test_error_send_queue_overflow",
    "test_error_illegal_transition",
    "test_random_mixed",
]


@pytest.fixture(scope="module")
def system_run():
    info = build(TwoNodeSystem(preset("small")), "system_small")
    env = {"RNIC_PRESET": "small", "TB_OPS": os.environ.get("TB_OPS", "10000"), "TB_SEED": "1"}
    return run(info, "tests.cocotb.tb_system", extra_env=env, check=False)


@pytest.mark.parametrize("case", CASES)
def test_system(system_run, case):
    results = {t.name.split(".")[-1]: t for t in system_run.tests}
    assert case in results, f"{case} did not run; log:\n{system_run.log()[-3000:]}"
    t = results[case]
    assert t.passed, f"{case} failed: {t.message}"
