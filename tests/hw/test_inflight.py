"""hw/lib/inflight.py against a Python model, every cycle: a claim is taken exactly when its
key is not held (after this cycle's release) and a slot is free; slots are never shared."""

import random

import pytest
from amaranth.sim import Simulator

from hw.lib.inflight import InflightTable


@pytest.mark.parametrize("entries,nkeys,hold", [(1, 3, (1, 4)), (4, 3, (1, 20)),
                                                (4, 40, (5, 30)), (8, 12, (0, 10))])
def test_against_model(entries, nkeys, hold):
    dut = InflightTable(16, entries)
    rng = random.Random(entries * 100 + nkeys)
    held = {}                          # slot -> (key, release cycle)
    stats = {"taken": 0, "conflict": 0, "full": 0}
    out = {}

    async def tb(ctx):
        key = None
        for cycle in range(3000):
            if key is None and rng.random() < 0.8:
                key = 1000 + rng.randrange(nkeys)
            due = [s for s, (_, t) in held.items() if t <= cycle]
            rel = rng.choice(due) if due else None
            ctx.set(dut.claim.valid, key is not None)
            ctx.set(dut.claim.payload.key, key or 0)
            ctx.set(dut.release.valid, rel is not None)
            ctx.set(dut.release.payload.slot, rel or 0)
            _, _, r, slot, used = await ctx.tick().sample(dut.claim.ready, dut.claim_slot,
                                                          dut.used)
            assert used == len(held)
            if rel is not None:
                del held[rel]
            if key is not None:
                keys = {k for k, _ in held.values()}
                want = key not in keys and len(held) < entries
                assert bool(r) == want, f"cycle {cycle}: ready {r}, model {want}"
                if key in keys:
                    stats["conflict"] += 1
                elif len(held) >= entries:
                    stats["full"] += 1
                if r:
                    assert slot not in held and slot == min(set(range(entries)) - set(held))
                    held[slot] = (key, cycle + 1 + rng.randint(*hold))
                    stats["taken"] += 1
                    key = None
        out["conflict"] = ctx.get(dut.conflict_waits)
        out["full"] = ctx.get(dut.full_waits)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()
    assert (out["conflict"], out["full"]) == (stats["conflict"], stats["full"])
    assert stats["taken"] > 100 and stats["conflict"] > 0


def test_parameters_checked():
    for kw, msg in [(dict(key_bits=0, entries=4), "key_bits must be an integer in [1, 64], not 0"),
                    (dict(key_bits=8, entries=65), "entries must be an integer in [1, 64], not 65")]:
        with pytest.raises(ValueError) as e:
            InflightTable(**kw)
        assert str(e.value) == msg
