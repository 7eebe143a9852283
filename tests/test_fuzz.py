"""Fuzzing the receive path of an RNIC (node b of the two-node system) on Verilator.

Random and mutated frames from :mod:`sim.fuzz` are injected into node b's receive path
(``inj_b`` of hw/system.py, driven by ``sim.faults.FrameInjector``) while a good QP pair
works across the link; tests/cocotb/tb_fuzz.py checks that nothing hangs, that no DMA write
leaves the registered regions and CQ rings, that the good pair still works afterwards, and that
every frame is accounted for: in node b's counters and, exactly per receive-path block, in the
pulse counters of :class:`FuzzTop`.

:class:`FuzzTop` is the two-node system with five 32-bit counters of node b's receive-path
outcome pulses as extra outputs (``probe_b_dpkt_ok``, ``probe_b_dpkt_icrc``,
``probe_b_dpkt_malformed``: the depacketizer; ``probe_b_demux_drop``: the demultiplexer;
``probe_b_resp_drop``: the responder's silent drop). The RX_DROP_QP counter adds the last two
kinds of drops, so the counters alone cannot tell a demultiplexer miscount from a responder
drop; the probes can. The probes only read existing signals (nothing in hw/ changes).

The default test injects 10,000 frames into the plain ``TwoNodeSystem`` (the Verilator build
of tests/test_system.py is reused; accounting from node b's counters: depacketizer outcomes
exact, responder drops bounded); the ``slow`` variant injects 100,000 into :class:`FuzzTop`
(a build of its own; depacketizer, demultiplexer and responder outcomes apart and exact except
the responder drops, which are measured and bounded) and runs with ``make test-slow``.
``test_stale_error_after_reset`` is the directed reproducer of the responder bug the 100k
run found (fixed since), kept as a regression test.
"""

import os

import pytest
from amaranth.hdl import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import Out

from hw.config import preset
from hw.system import TwoNodeSystem
from sim.experiment import build_system
from sim.verilator import build, run

PROBES = ("dpkt_ok", "dpkt_icrc", "dpkt_malformed", "demux_drop", "resp_drop")


class FuzzTop(wiring.Component):
    """:class:`hw.system.TwoNodeSystem` with counters of node b's receive-path pulses.

    Ports: every port of ``TwoNodeSystem`` (same names), plus ``probe_b_<name>: Out(32)`` for
    each name of :data:`PROBES`, counting the cycles in which that pulse was high.
    """

    def __init__(self, cfg):
        self.system = TwoNodeSystem(cfg)
        members = dict(self.system.signature.members.items())
        for p in PROBES:
            members[f"probe_b_{p}"] = Out(32)
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        sysm = self.system
        m.submodules.system = sysm
        mine = {path: value for path, _, value in self.signature.flatten(self)}
        for path, member, value in sysm.signature.flatten(sysm):
            if member.flow == wiring.In:
                m.d.comb += value.eq(mine[path])
            else:
                m.d.comb += mine[path].eq(value)

        pulses = {p: Signal(name=f"pulse_b_{p}") for p in PROBES}
        node = sysm.nodes["b"]
        node_elaborate = node.elaborate

        def elaborate_node(platform):
            mn = node_elaborate(platform)
            dp = mn.submodules["depacketizer"]
            dm = mn.submodules["demux"]
            rs = mn.submodules["responder"]
            mn.d.comb += [
                pulses["dpkt_ok"].eq(dp.stat_ok), pulses["dpkt_icrc"].eq(dp.stat_icrc),
                pulses["dpkt_malformed"].eq(dp.stat_malformed),
                pulses["demux_drop"].eq(dm.stat_drop), pulses["resp_drop"].eq(rs.stat_drop),
            ]
            return mn

        node.elaborate = elaborate_node
        for p in PROBES:
            count = getattr(self, f"probe_b_{p}")
            m.d.sync += count.eq(count + pulses[p])
        return m


def _run(n_frames, seed, name, probes, testcase="test_fuzz", **env):
    cfg = preset("small")
    if probes:
        info = build(FuzzTop(cfg), "fuzz_small")
    else:       # the build of tests/test_system.py, the demo and the reliability tests (clock
        info = build_system(cfg, fast=True)     # inside the simulation; cached by its hash)
    env = {"RNIC_PRESET": "small", "FUZZ_FRAMES": str(n_frames), "FUZZ_SEED": str(seed),
           **{k: str(v) for k, v in env.items()}}
    result = run(info, "tests.cocotb.tb_fuzz", testcase=testcase, extra_env=env, check=False,
                 test_dir=info.build_dir / "run" / f"{name}-{os.getpid()}")
    return result


def _check(result):
    assert result.tests, f"no cocotb test ran; log:\n{result.log()[-4000:]}"
    failed = [t for t in result.tests if not t.passed]
    assert not failed, "\n\n".join(f"{t.name}: {t.message[-6000:]}" for t in failed) + \
        f"\n--- log tail ---\n{result.log()[-3000:]}"


def test_fuzz_10k():
    """10,000 fuzz frames (seed 1) interleaved with good traffic, on the plain two-node
    system (receive accounting from node b's counters)."""
    _check(_run(int(os.environ.get("FUZZ_FRAMES", "10000")), int(os.environ.get("FUZZ_SEED", "1")),
                "fuzz10k", probes=False))


def test_stale_error_after_reset():
    """Regression test of the responder bug the 100k fuzz run (seed 2) found, fixed in 069356d:
    a request executing while its QP is reset raised set_err afterwards and forced the QP's
    next incarnation to ERR. See tb_fuzz.py."""
    _check(_run(0, 1, "stale_err", probes=False, testcase="test_stale_error_after_reset"))


@pytest.mark.slow
def test_fuzz_100k():
    """100,000 fuzz frames (seed 2) on :class:`FuzzTop` (exact per-block accounting), a good
    batch every 20 us of simulated time alongside (back to back they would triple the run time)."""
    _check(_run(100_000, 2, "fuzz100k", probes=True, FUZZ_GOOD_GAP_NS=20_000))
