"""The requester's WQE fetch issuer (hw/rnic/fetch_issuer.py) against a Python model, with
random lookup latency and back-pressure: every offered QP that may issue is reserved, in
offer order; its context is looked up and its batch planned; a read request per good batch
leaves in that order (none for a context that could not be read) and the batches queue in
issue order; never more than ``fetch_depth`` are in flight; a BlueFlame copy of the QP's
next WQE replaces the DMA read."""

import random

import pytest
from amaranth.sim import Simulator

from hw.config import preset
from hw.rnic.fetch_issuer import FetchIssuer


def plan_of(q):
    return {"addr": 0x10000 + q * 0x1000, "first": 100 + q, "count": 1 + q % 4}


@pytest.mark.parametrize("seed", range(3))
def test_fetch_issuer_against_model(seed):
    cfg = preset("small").nic
    KF = 3
    dut = FetchIssuer(cfg, 4, KF)
    rng = random.Random(seed)
    offers = [rng.randrange(16) for _ in range(60)]
    ok = {q: q % 5 != 0 for q in range(16)}          # QPs that may issue
    bad = {q: q == 7 for q in range(16)}              # a context that cannot be read
    bf_qp = 3                                         # its next WQE arrives by BlueFlame
    reqs, batches, reserved, seen_nfl = [], [], [], []

    async def offer(ctx):
        for q in offers:
            ctx.set(dut.offer.payload.index, q)
            ctx.set(dut.take_ok, ok[q])
            ctx.set(dut.offer.valid, 1)
            while True:
                _, _, r, res = await ctx.tick().sample(dut.offer.ready, dut.reserve)
                if res:
                    reserved.append(q)
                if r:
                    break
            ctx.set(dut.offer.valid, 0)
            for _ in range(rng.randint(0, 3)):
                await ctx.tick()

    async def lookup(ctx):
        # the context table: answers each request after 1 .. 8 cycles
        while True:
            ctx.set(dut.qpc.req.ready, 1)
            _, _, v, idx = await ctx.tick().sample(dut.qpc.req.valid, dut.qpc.req.payload.index)
            if not v:
                continue
            ctx.set(dut.qpc.req.ready, 0)
            for _ in range(rng.randint(1, 8)):
                await ctx.tick()
            ctx.set(dut.qpc.resp.payload, {"data": {"sq_base": idx}, "err": int(bad[idx])})
            ctx.set(dut.qpc.resp.valid, 1)
            while True:
                _, _, r = await ctx.tick().sample(dut.qpc.resp.ready)
                if r:
                    break
            ctx.set(dut.qpc.resp.valid, 0)

    async def planner(ctx):
        # the requester's batch plan for the QP the issuer names, every cycle
        async for _, _, sel in ctx.tick().sample(dut.sel):
            ctx.set(dut.plan, plan_of(sel))

    async def bluefame(ctx):
        await ctx.tick()
        ctx.set(dut.bf.payload, {"qpn": bf_qp, "wqe": {"index": plan_of(bf_qp)["first"],
                                                       "wr_id": 99}})
        ctx.set(dut.bf.valid, 1)
        await ctx.tick()
        ctx.set(dut.bf.valid, 0)

    async def sinks(ctx):
        taken = False
        for _ in range(4000):
            rr, rb = rng.random() < 0.5, rng.random() < 0.4
            ctx.set(dut.req.ready, rr)
            ctx.set(dut.batch.ready, rb)
            ctx.set(dut.done, taken)        # the send engine is done with a batch at once
            _, _, qv, qp, bv, bp, nfl = await ctx.tick().sample(
                dut.req.valid, dut.req.payload, dut.batch.valid, dut.batch.payload, dut.n_fl)
            seen_nfl.append(nfl)
            if qv and rr:
                reqs.append((int(qp.addr), int(qp.count), int(qp.bf), int(qp.wqe.wr_id)))
            taken = bool(bv and rb)
            if taken:
                batches.append((int(bp.qpn), int(bp.count), int(bp.bad), int(bp.ctx.sq_base)))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    for tb in (offer, lookup, planner, bluefame):
        sim.add_testbench(tb, background=True)
    sim.add_testbench(sinks)
    sim.run()

    want = [q for q in offers if ok[q]]
    assert reserved == want
    assert [b[0] for b in batches] == want
    bf_used = False
    want_reqs = []
    for q, (bq, cnt, b, base) in zip(want, batches):
        assert base == q and b == int(bad[q])
        if bad[q]:
            assert cnt == 0
            continue
        if q == bf_qp and not bf_used:
            bf_used = True
            assert cnt == 1
            want_reqs.append((plan_of(q)["addr"], 1, 1, 99))
        else:
            assert cnt == plan_of(q)["count"]
            want_reqs.append((plan_of(q)["addr"], cnt, 0, None))
    assert [(a, c, b) for a, c, b, _ in reqs] == [(a, c, b) for a, c, b, _ in want_reqs]
    assert all(w[3] is None or r[3] == w[3] for r, w in zip(reqs, want_reqs))
    assert bf_used == (bf_qp in want)
    assert max(seen_nfl) <= KF and max(seen_nfl) >= 2
