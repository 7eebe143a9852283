"""Shared pytest set-up.

``make test`` runs the suite on two pytest-xdist workers, a file at a time per worker
(``--dist loadfile --no-loadscope-reorder``: module fixtures such as a Verilator build or a
demo run stay in one process). :func:`pytest_collection_modifyitems` puts the files that
hold a long Verilator build, Yosys synthesis or system run first, so that the two workers
start on them while the short unit tests fill the gaps at the end. Builds shared between
files (the small two-node system) are taken under a file lock (sim/verilator.py), so a
second worker waits for the first one's build and reuses it.

Amaranth warns (UnusedElaboratable) when an Elaboratable is created but never elaborated,
which is exactly what a constructor that rejects a bad parameter does. Those tests are meant
to create unused objects, so the warning is silenced for the test session.
"""

from amaranth.hdl import Elaboratable

Elaboratable._MustUse__silence = True


# Longest first (docs/verification.md, "Test time"): the node synthesis (Yosys, one core),
# the demo's two system builds and runs, the system tests, then the other cocotb files.
HEAVY_FIRST = ("test_synth.py", "test_demo_experiment.py", "test_system.py", "test_fuzz.py",
               "test_reliability.py", "test_loss_experiment.py", "test_host_cocotb.py",
               "test_simclock.py", "test_requester.py", "test_requester_retry.py",
               "test_hosts.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(HEAVY_FIRST)}
    # stable: the order inside a file and among the other files is kept
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
