"""Integration tests: the two-node RTL system on Verilator, scored against the reference model.

The system is built once per session (cached by a hash of its Verilog), with the clock
inside the simulation: the same build as ``make sim`` (``sim.experiment.build_system(...,
fast=True)``), so that the tests and the experiments share it and no Python runs on a
clock edge. The cocotb module tests/cocotb/tb_system.py runs every test case in one
simulator process and each pytest test below reports one of them. The main run uses the Python host with completion
reordering (0.3) and random delays before it takes a request; a second build with the RTL
host (memory on chip) runs the opcode test and the 10,000-WR random test again, and checks
the RTL memory against what its write tap showed.
"""

import os

import pytest

from hw.config import preset
from sim.experiment import build_system
from sim.verilator import run

CASES = [
    "test_each_opcode",
    "test_mmio_register_map",
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
    "test_modify_keeps_transport_state",
    "test_shared_mr",
    "test_random_mixed",
    "test_wqe_cache_guard",
    "test_blueflame",
    "test_agreement_record",
    "test_pcap_capture",
]
DMA_ERROR_CASES = ["test_wqe_read_fails", "test_payload_read_fails", "test_responder_write_fails",
                   "test_read_source_fails", "test_cq_overrun"]


@pytest.fixture(scope="module")
def pcap_path(tmp_path_factory):
    return tmp_path_factory.mktemp("pcap") / "system.pcap"


@pytest.fixture(scope="module")
def agree_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("agree")


@pytest.fixture(scope="module")
def system_build():
    return build_system(preset("small"), fast=True)


@pytest.fixture(scope="module")
def system_run(system_build, pcap_path, agree_dir):
    env = {"RNIC_PRESET": "small", "TB_OPS": os.environ.get("TB_OPS", "10000"), "TB_SEED": "1",
           "PCAP_FILE": str(pcap_path), "RNIC_REORDER": "0.3",
           "AGREE_FILE": str(agree_dir / "python.json")}
    return run(system_build, "tests.cocotb.tb_system", testcase=CASES, extra_env=env,
               check=False)


@pytest.fixture(scope="module")
def dma_error_run(system_build):
    env = {"RNIC_PRESET": "small", "TB_SEED": "1"}
    return run(system_build, "tests.cocotb.tb_dma_errors", extra_env=env, check=False)


# test_random_within_caches (10,000 WRs whose working set fits the caches) runs on the RTL
# host only: the caches are the NIC's, and the RTL host is the faster of the two
RTL_CASES = ["test_each_opcode", "test_random_mixed", "test_random_within_caches",
             "test_agreement_record", "test_unmirrored_event_line"]


@pytest.fixture(scope="module")
def rtl_run(agree_dir):
    info = build_system(preset("small").replace(host__kind="rtl"), fast=True)
    env = {"RNIC_PRESET": "small", "RNIC_HOST": "rtl", "TB_SEED": "2",
           "TB_OPS": os.environ.get("TB_OPS", "10000"), "AGREE_FILE": str(agree_dir / "rtl.json")}
    return run(info, "tests.cocotb.tb_system", testcase=RTL_CASES, extra_env=env, check=False)


# two processing units in the requester (hw/rnic/requester_units.py): QPs of both units in
# the random test, completions and memory against the reference model
PU_CASES = ["test_each_opcode", "test_random_mixed", "test_wqe_cache_guard", "test_blueflame",
            "test_error_bad_lkey", "test_error_send_queue_overflow"]


@pytest.fixture(scope="module")
def pu_run():
    info = build_system(preset("small").replace(host__kind="rtl", nic__n_pus=2), fast=True)
    env = {"RNIC_PRESET": "small", "RNIC_HOST": "rtl", "RNIC_PUS": "2", "TB_SEED": "3",
           "TB_OPS": os.environ.get("TB_OPS", "4000")}
    return run(info, "tests.cocotb.tb_system", testcase=PU_CASES, extra_env=env, check=False)


@pytest.mark.parametrize("case", PU_CASES)
def test_system_two_units(pu_run, case):
    _check_case(pu_run, case)


def _check_case(result, case):
    results = {t.name.split(".")[-1]: t for t in result.tests}
    assert case in results, f"{case} did not run; log:\n{result.log()[-3000:]}"
    assert results[case].passed, f"{case} failed: {results[case].message}"


@pytest.mark.parametrize("case", RTL_CASES)
def test_system_rtl_host(rtl_run, case):
    _check_case(rtl_run, case)


@pytest.mark.parametrize("case", CASES)
def test_system(system_run, case):
    _check_case(system_run, case)


@pytest.mark.parametrize("case", DMA_ERROR_CASES)
def test_system_dma_errors(dma_error_run, case):
    _check_case(dma_error_run, case)


def test_hosts_agree(system_run, rtl_run, agree_dir):
    """The same workload on the Python and on the RTL host (no back-pressure, no reordering):
    the same completions and memory, and every batch within 1 % or 32 cycles (128 ns), as
    issue 7 asks; in fact within 4 cycles: each batch starts from an idle NIC (its doorbells
    are rung 2 us after its WQEs are written, tests/cocotb/tb_system.py ``run_random``), the
    hosts see the same link timing, and the two runs differ only in when the testbench
    learns of the batch's last CQE (measured on 06df650: every batch 4 ns,
    one cycle, shorter on the RTL host). Before that settle time the Python host, whose WQE
    writes take no simulated time, rang a batch's doorbells while the previous batch's tail
    was still in flight, so the batches started from different NIC states and one of them
    (13 of 16) ran 84 cycles longer on the RTL host (docs/verification.md)."""
    import json
    _check_case(system_run, "test_agreement_record")
    _check_case(rtl_run, "test_agreement_record")
    py = json.loads((agree_dir / "python.json").read_text())
    rtl = json.loads((agree_dir / "rtl.json").read_text())
    assert py["host"] == "python" and rtl["host"] == "rtl"
    assert py["completions"] == rtl["completions"]
    assert py["memory"] == rtl["memory"]
    assert len(py["batch_ns"]) == len(rtl["batch_ns"]) > 10
    for a, b in zip(py["batch_ns"], rtl["batch_ns"]):
        assert abs(a - b) <= max(0.01 * max(a, b), 128), (py["batch_ns"], rtl["batch_ns"])
        assert abs(a - b) <= 16, (py["batch_ns"], rtl["batch_ns"])


def test_pcap_decodes_as_rocev2(system_run, pcap_path):
    """Each captured frame parses as RoCEv2 in Scapy, which recomputes the same ICRC, and
    decodes to the fields the model meant (sim/roce.py)."""
    from scapy.all import rdpcap, raw
    from scapy.contrib.roce import BTH
    from scapy.layers.inet import IP, UDP
    from hw.formats import BthOpcode
    from sim import roce

    assert pcap_path.exists(), "the pcap test case did not write a capture"
    packets = rdpcap(str(pcap_path))
    assert len(packets) >= 14
    opcodes = set()
    for p in packets:
        assert p.haslayer(IP) and p[UDP].dport == 4791 and p.haslayer(BTH), p.summary()
        frame = raw(p)
        meta, payload, icrc_ok = roce.decode(frame)
        assert icrc_ok
        assert p[BTH].opcode == meta["opcode"] and p[BTH].psn == meta["psn"]
        assert p[BTH].dqpn == meta["dest_qpn"]
        # Scapy recomputes the ICRC from scratch (independent of the model's CRC code).
        rebuilt = p.copy()
        rebuilt[BTH].icrc = None
        assert raw(rebuilt)[-4:] == frame[-4:], f"ICRC mismatch in {p.summary()}"
        # The IPv4 header checksum is right too.
        ip = p[IP].copy()
        ip.chksum = None
        assert raw(ip)[10:12] == raw(p[IP])[10:12]
        opcodes.add(BthOpcode(meta["opcode"]).name)
    assert {"WRITE_FIRST", "READ_REQUEST", "READ_RESPONSE_FIRST", "SEND_ONLY_IMM",
            "WRITE_ONLY_IMM", "COMPARE_SWAP", "FETCH_ADD", "ATOMIC_ACKNOWLEDGE",
            "ACKNOWLEDGE"} <= opcodes, opcodes
