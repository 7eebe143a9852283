"""The responder's per-QP memories (hw/rnic/responder_state.py) against a Python model:
random QP events, receive doorbells and write-backs in the same cycles; every QP's state row
and producer index read back after each cycle. (The receive-WQE prefetch inside it has its
own test, tests/hw/test_rq_prefetch.py.)"""

import random

import pytest
from amaranth.sim import Simulator

from hw.config import preset
from hw.formats import QpState
from hw.rnic.responder_state import ResponderState

CFG = preset("small").nic
N = CFG.n_qps


def test_parameters():
    with pytest.raises(ValueError, match=r"^cfg must be a hw.config.NicConfig, not 3$"):
        ResponderState(3)


@pytest.mark.parametrize("seed", range(3))
def test_against_model(seed):
    rng = random.Random(seed)
    dut = ResponderState(CFG)
    rows = {q: {"epsn": 0, "msn": 0} for q in range(N)}
    pis = {q: 0 for q in range(N)}
    seen = {"ev_reset": 0, "wb_blocked": 0, "db_blocked": 0, "rts": 0}

    async def bench(ctx):
        ctx.set(dut.dma.req.ready, 0)
        for _ in range(600):
            ev = db = wb = None
            if rng.random() < 0.3:
                ev = (rng.randrange(N + 2), rng.choice(list(QpState)), rng.getrandbits(24))
            if rng.random() < 0.4:
                db = (rng.randrange(N + 2), rng.getrandbits(16))
            if rng.random() < 0.4:
                wb = (rng.randrange(N), rng.getrandbits(24), rng.getrandbits(24))
            ctx.set(dut.qp_event.valid, ev is not None)
            if ev:
                ctx.set(dut.qp_event.payload.qpn, ev[0])
                ctx.set(dut.qp_event.payload.state, ev[1])
                ctx.set(dut.qp_event.payload.rq_psn, ev[2])
            ctx.set(dut.rq_db.valid, db is not None)
            if db:
                ctx.set(dut.rq_db.payload.qpn, db[0])
                ctx.set(dut.rq_db.payload.pi, db[1])
            ctx.set(dut.wb_en, wb is not None)
            if wb:
                ctx.set(dut.wb_qpn, wb[0])
                ctx.set(dut.wb_row.epsn, wb[1])
                ctx.set(dut.wb_row.msn, wb[2])
            # the model: an event to RESET / INIT / RTR of a local QP restarts its row and
            # takes the write port (a write-back waits); to RESET it also clears the
            # producer index (a doorbell waits); RTS and ERR change nothing
            resets = ev is not None and ev[0] < N and ev[1] not in (QpState.RTS, QpState.ERR)
            to_reset = ev is not None and ev[0] < N and ev[1] == QpState.RESET
            assert ctx.get(dut.qp_event.ready) == 1
            assert ctx.get(dut.ev_reset) == resets
            assert ctx.get(dut.wb_free) == (not resets)
            assert ctx.get(dut.rq_db.ready) == (not to_reset)
            if ev is not None and ev[0] < N and ev[1] in (QpState.RTS, QpState.ERR):
                seen["rts"] += 1
            if resets:
                seen["ev_reset"] += 1
                assert ctx.get(dut.ev_qpn) == ev[0]
                rows[ev[0]] = {"epsn": ev[2], "msn": 0}
                seen["wb_blocked"] += wb is not None
            elif wb:
                rows[wb[0]] = {"epsn": wb[1], "msn": wb[2]}
            if to_reset:
                pis[ev[0]] = 0
                seen["db_blocked"] += db is not None
            elif db and db[0] < N:
                pis[db[0]] = db[1]
            await ctx.tick()
            ctx.set(dut.qp_event.valid, 0)
            ctx.set(dut.rq_db.valid, 0)
            ctx.set(dut.wb_en, 0)
            for q in range(N):
                ctx.set(dut.rd_qpn, q)
                assert ctx.get(dut.row.epsn) == rows[q]["epsn"], q
                assert ctx.get(dut.row.msn) == rows[q]["msn"], q
                assert ctx.get(dut.pi) == pis[q], q

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert all(v > 3 for v in seen.values()), seen
