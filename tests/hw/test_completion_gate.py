"""The requester's completion path (hw/rnic/completion_gate.py) against a Python model:
completions of both engines leave in the order they entered, never before the writes
issued before them are answered; the first completion of a QP after a failed write of that
QP leaves as LOC_PROT_ERR (a silent one too) and is followed by an ERR request for the QP;
a silent success leaves nothing; the engines' own ERR requests pass through."""

import random

import pytest
from amaranth.sim import Simulator

from hw.formats import WcStatus
from hw.rnic.completion_gate import CompletionGate

from .port_drivers import WriteHost, offer

LOC_PROT = WcStatus.LOC_PROT_ERR.value


def run(events, *, seed, p_ready=0.6, n_cycles=6000):
    """``events``: ("w", qp, fail) a requester write; ("c", src, qp, n, status, silent) a
    completion offered on rx_cqe (src 0) or tx_cqe (src 1), ``n`` in its wr_id; ("e", src,
    qp) an engine's ERR request. Offered one at a time, each held until taken. Returns the
    CQEs [(wr_id, qpn, status, cycle)], the ERR requests [(qpn, cycle)] and the cycle each
    write was answered."""
    dut = CompletionGate(4, 16)
    rng = random.Random(seed)
    cqes, errs = [], []
    host = WriteHost(dut.done, rng)

    async def drive(ctx):
        for ev in events:
            if ev[0] == "w":
                await host.write(ctx, dut.wr_issued, ev[1], ev[2])
            elif ev[0] == "c":
                _, src, qp, n, status, silent = ev
                await offer(ctx, (dut.rx_cqe, dut.tx_cqe)[src], {
                    "item": {"req": {"cqn": 3, "cqe": {"wr_id": n, "status": status, "qpn": qp,
                                                       "byte_len": 8}},
                             "silent": silent}, "key": qp})
            else:
                await offer(ctx, (dut.rx_err, dut.tx_err)[ev[1]], {"qpn": ev[2]})
            for _ in range(rng.randint(0, 2)):
                await ctx.tick()

    async def sink(ctx):
        for _ in range(n_cycles):
            rc, re = rng.random() < p_ready, rng.random() < p_ready
            ctx.set(dut.cqe.ready, rc)
            ctx.set(dut.set_err.ready, re)
            _, _, cv, cp, ev, ep = await ctx.tick().sample(
                dut.cqe.valid, dut.cqe.payload, dut.set_err.valid, dut.set_err.payload)
            if cv and rc:
                assert cp.cqn == 3
                cqes.append((int(cp.cqe.wr_id), int(cp.cqe.qpn), int(cp.cqe.status),
                             host.cycle))
            if ev and re:
                errs.append((int(ep.qpn), host.cycle))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(drive, background=True)
    sim.add_testbench(host.run, background=True)
    sim.add_testbench(sink)
    sim.run()
    return cqes, errs, host.answered


def model(events):
    """Expected CQEs [(wr_id, qpn, status, writes it waits for)] and ERR requests (qpns)."""
    issued, failed, cqes, errs = 0, [], [], []
    for ev in events:
        if ev[0] == "w":
            issued += 1
            if ev[2]:
                failed.append(ev[1])
        elif ev[0] == "e":
            errs.append(ev[2])
        else:
            _, _, qp, n, status, silent = ev
            if qp in failed:
                # the first completion of the QP takes every failure recorded before it
                failed = [f for f in failed if f != qp]
                cqes.append((n, qp, status or LOC_PROT, issued))
                errs.append(qp)
            elif not silent:
                cqes.append((n, qp, status, issued))
    return cqes, errs


@pytest.mark.parametrize("seed", range(3))
def test_completion_gate_against_model(seed):
    rng = random.Random(seed)
    events = []
    for n in range(150):
        r = rng.random()
        if r < 0.4:
            events.append(("w", rng.randrange(3), rng.random() < 0.12))
        elif r < 0.93:
            events.append(("c", rng.randrange(2), rng.randrange(3), n,
                           rng.choice([0, 0, 0, 5]), int(rng.random() < 0.3)))
        else:
            events.append(("e", rng.randrange(2), rng.randrange(3)))
    cqes, errs, answered = run(events, seed=seed)
    want_cqes, want_errs = model(events)
    assert [c[:3] for c in cqes] == [w[:3] for w in want_cqes]
    for (n, _, _, cyc), (_, _, _, need) in zip(cqes, want_cqes):
        if need:
            assert cyc > answered[need - 1], f"completion {n} left before write {need}"
    # the ERR requests: engines' and the gate's share one output (round robin), so only
    # their multiset is fixed; each of the gate's follows its failed completion
    assert sorted(q for q, _ in errs) == sorted(want_errs)
    assert any(s == LOC_PROT for _, _, s, _ in cqes)
