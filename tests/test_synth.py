"""fpga.synth: a small block goes through Yosys synth_ecp5 and its cells are counted."""

import dataclasses
import json
import re

import pytest

from fpga import synth
from hw.config import preset
from hw.net.link import Link


def test_synthesize_small_link(tmp_path):
    res = synth.synthesize(Link(8, 4, 2.0, fifo_beats=4), "link_small", tmp_path)
    assert set(res) == {"luts", "ffs", "brams"}
    assert res["luts"] > 0 and res["ffs"] > 0
    assert res["brams"] == 0          # a 4-deep FIFO is distributed RAM, not DP16KD
    cells = json.loads((tmp_path / "link_small_cells.json").read_text())
    assert cells["LUT4"] == res["luts"] and cells["TRELLIS_FF"] == res["ffs"]


def test_cli_writes_resources_json(tmp_path, capsys):
    """The NIC's host interface (hw/dma/host_if.py) of the small preset, with the node's 5
    read and 4 write clients, through the command line (about half a minute)."""
    assert synth.main(["--top", "host_if", "--preset", "small", "--out", str(tmp_path)]) == 0
    rec = json.loads((tmp_path / "resources.json").read_text())
    assert rec["top"] == "host_if" and rec["preset"] == "small"
    assert rec["luts"] > 1000 and rec["ffs"] > 1000
    # Block RAM: the read engine keeps each read client's data in a ring of two banks (even
    # and odd words, synchronous read, whole-word writes). With W = 8 the WQE client's
    # ring is 128 words (four 256-byte WQE batches), so each bank is 64 x 64 bits, which
    # Yosys puts in two DP16KD (36 bits wide each): 4 in all. The other rings (64, 64, 8
    # and 4 words), the tag table, the FIFOs and the write engine's response queue are
    # small enough for LUT RAM (TRELLIS_DPR16X4). A count of 0 would mean the rings were
    # not inferred as memories; more, that a small memory went to block RAM.
    assert rec["brams"] == 4
    out = capsys.readouterr().out
    assert "LUT4" in out and re.search(r"DP16KD\s+4\n", out), out


def test_registry_factories_build():
    cfg = preset("small")
    assert {"link", "host_if", "rnic", "system"} <= set(synth.TOPS)
    assert "dma_arbiter" not in synth.TOPS
    for name in ("link", "host_if"):
        synth.TOPS[name](cfg)


def test_bad_name(tmp_path):
    with pytest.raises(ValueError, match="name must be a Verilog identifier"):
        synth.synthesize(Link(8, 4, 2.0), "not a name", tmp_path)


def test_small_rnic_node_synthesizes(tmp_path):
    """One RNIC node goes through synth_ecp5: the small preset cut to 2 QPs, 2 CQs and 2 MRs
    (every block is there; the per-QP logic that dominates Yosys's time is a quarter of the
    preset's). The full preset's counts are `make synth` (docs/architecture.md), not a test:
    its node took 24 minutes of the suite on a busy machine."""
    from hw.rnic import Rnic
    nic = dataclasses.replace(preset("small").nic, n_qps=2, n_cqs=2, n_mrs=2,
                              mr_cache_sets=1, wqe_cache_sets=2)
    res = synth.synthesize(Rnic(nic), "rnic_small", tmp_path)
    assert res["luts"] > 5000 and res["ffs"] > 2000
    # A node is known to use block RAM (its synchronous-read buffers and queues; the
    # two-node system takes 12 DP16KD, docs/architecture.md): a BRAM count of 0 means the
    # memories were not inferred or not counted.
    assert res["brams"] > 0


@pytest.mark.slow
def test_two_node_system_synthesizes(tmp_path):
    """make synth: the two-node system of the small preset (about 5 minutes)."""
    assert synth.main(["--top", "system", "--preset", "small", "--out", str(tmp_path)]) == 0
    rec = json.loads((tmp_path / "resources.json").read_text())
    assert rec["top"] == "system" and rec["luts"] > 10000 and rec["ffs"] > 5000
