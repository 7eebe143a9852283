"""The responder's atomic replay cache (hw/rnic/replay_cache.py) against a Python model:
random invalidations, results and scans, with a result racing its slot's invalidation."""

import random

import pytest
from amaranth.sim import Simulator

from hw.rnic.replay_cache import ReplayCache

QB = 2
SLOTS = 16


def test_parameters():
    with pytest.raises(ValueError, match=r"^qpn_bits must be an integer in \[1, 14\], not 0$"):
        ReplayCache(0)
    with pytest.raises(ValueError, match=r"^slots must be 16 \(the responder's replay pointer "
                                         r"is 4 bits\), not 8$"):
        ReplayCache(2, 8)


def model_scan(mem, qpn, psn, rp, rfull):
    """(cycles until the answer, hit, orig): one slot per cycle from slot 0."""
    for k in range(SLOTS):
        e = mem.get((qpn, k))
        if e is not None and e[2] and e[0] == psn and (rfull or k < rp):
            return k, True, e[1]
    return SLOTS - 1, False, None


@pytest.mark.parametrize("seed", range(3))
def test_against_model(seed):
    rng = random.Random(seed)
    dut = ReplayCache(QB, SLOTS)
    mem = {}                      # (qpn, slot) -> (psn, orig, valid)
    rp = {q: 0 for q in range(1 << QB)}
    rfull = {q: False for q in range(1 << QB)}
    checked = {"hit": 0, "miss": 0, "race": 0}

    async def bench(ctx):
        known = []                # (qpn, psn) of results written
        for _ in range(400):
            r = rng.random()
            if r < 0.55:
                # an atomic takes its QP's next slot; maybe a result lands in the same cycle,
                # sometimes in that very slot (then it is not written)
                q = rng.randrange(1 << QB)
                slot = rp[q]
                ctx.set(dut.inv_en, 1)
                ctx.set(dut.inv_qpn, q)
                ctx.set(dut.inv_slot, slot)
                race = rng.random() < 0.2
                put = (q, slot) if race else (rng.randrange(1 << QB), rng.randrange(SLOTS))
                psn, orig = rng.getrandbits(24), rng.getrandbits(64)
                if race or rng.random() < 0.5:
                    ctx.set(dut.put_en, 1)
                    ctx.set(dut.put_qpn, put[0])
                    ctx.set(dut.put_slot, put[1])
                    ctx.set(dut.put_psn, psn)
                    ctx.set(dut.put_orig, orig)
                    if put == (q, slot):
                        checked["race"] += 1
                    else:
                        mem[put] = (psn, orig, True)
                        known.append((put[0], psn))
                mem[(q, slot)] = (0, 0, False)
                rp[q] = (slot + 1) % SLOTS
                rfull[q] = rfull[q] or slot == SLOTS - 1
                await ctx.tick()
                ctx.set(dut.inv_en, 0)
                ctx.set(dut.put_en, 0)
            elif r < 0.75:
                q, slot = rng.randrange(1 << QB), rng.randrange(SLOTS)
                psn, orig = rng.getrandbits(24), rng.getrandbits(64)
                ctx.set(dut.put_en, 1)
                ctx.set(dut.put_qpn, q)
                ctx.set(dut.put_slot, slot)
                ctx.set(dut.put_psn, psn)
                ctx.set(dut.put_orig, orig)
                mem[(q, slot)] = (psn, orig, True)
                known.append((q, psn))
                await ctx.tick()
                ctx.set(dut.put_en, 0)
            else:
                # a scan for a PSN that was written (a hit unless overwritten or outside the
                # window), or a random one (a miss, almost surely)
                if known and rng.random() < 0.7:
                    q, psn = rng.choice(known)
                else:
                    q, psn = rng.randrange(1 << QB), rng.getrandbits(24)
                want_k, want_hit, want_orig = model_scan(mem, q, psn, rp[q], rfull[q])
                ctx.set(dut.qpn, q)
                ctx.set(dut.psn, psn)
                ctx.set(dut.rp, rp[q])
                ctx.set(dut.rfull, rfull[q])
                ctx.set(dut.start, 1)
                await ctx.tick()
                ctx.set(dut.start, 0)
                k = 0
                while True:
                    hit, last = ctx.get(dut.hit), ctx.get(dut.last)
                    if hit or last:
                        break
                    ctx.set(dut.step, 1)
                    await ctx.tick()
                    ctx.set(dut.step, 0)
                    k += 1
                assert (k, bool(hit)) == (want_k, want_hit), (q, psn, k, hit)
                if hit:
                    assert ctx.get(dut.orig) == want_orig
                checked["hit" if hit else "miss"] += 1

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert checked["hit"] > 5 and checked["miss"] > 5 and checked["race"] > 3, checked
