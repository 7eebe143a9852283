"""BlueFlame buffer (hw/rnic/bf_buffer.py) against a Python model: random writes, lookups, takes
and invalidations; every copy counted once as used or as dropped."""

import random

import pytest
from amaranth.sim import Simulator

from hw import formats
from hw.rnic.bf_buffer import BlueFlameBuffer


class Model:
    def __init__(self, n):
        self.n = n
        self.ent = [None] * n          # (qpn, index, wr_id)
        self.ptr = 0
        self.hits = self.misses = 0

    def lookup(self, qpn, index):
        for e in self.ent:
            if e is not None and e[0] == qpn and e[1] == index:
                return e
        return None

    def step(self, write, take, inval, qpn, index):
        hit = self.lookup(qpn, index)
        new = list(self.ent)
        used = set()
        if take and hit is not None:
            k = self.ent.index(hit)
            used.add(k)
            new[k] = None
            self.hits += 1
        if inval is not None:
            iq, first, count, all_ = inval
            for k, e in enumerate(self.ent):
                if e is None or k in used or e[0] != iq:
                    continue
                ahead = (e[1] - first) % 65536
                if all_ or ahead < count or ahead >= 32768:
                    new[k] = None
                    if not (write is not None and k == self.ptr):
                        self.misses += 1
        if write is not None:
            if self.ent[self.ptr] is not None and self.ptr not in used:
                self.misses += 1
            new[self.ptr] = write
            self.ptr = (self.ptr + 1) % self.n
        self.ent = new
        return hit


@pytest.mark.parametrize("entries,seed", [(4, 1), (1, 2), (3, 3), (16, 4)])
def test_against_model(entries, seed):
    rng = random.Random(seed)
    dut = BlueFlameBuffer(3, entries)
    model = Model(entries)
    stats = {"hit": 0, "miss": 0}

    async def tb(ctx):
        for _ in range(3000):
            qpn, index = rng.randrange(8), rng.randrange(6)
            write = None
            if rng.random() < 0.4:
                write = (rng.randrange(8), rng.randrange(6), rng.getrandbits(64))
                ctx.set(dut.i.payload, {"qpn": write[0], "wqe": formats.unpack(
                    formats.WQE, formats.pack(formats.WQE, index=write[1], qpn=write[0],
                                              wr_id=write[2]))})
            ctx.set(dut.i.valid, write is not None)
            take = rng.random() < 0.5
            inval = None
            if rng.random() < 0.2:
                inval = (rng.randrange(8), rng.randrange(6), rng.randrange(1, 5),
                         rng.random() < 0.2)
                ctx.set(dut.inval.payload, dict(zip(("qpn", "first", "count", "all"), inval)))
            ctx.set(dut.inval.valid, inval is not None)
            ctx.set(dut.qpn, qpn)
            ctx.set(dut.index, index)
            ctx.set(dut.take, take)
            exp = model.step(write, take, inval, qpn, index)
            assert ctx.get(dut.hit) == (exp is not None)
            if exp is not None:
                assert ctx.get(dut.wqe.wr_id) == exp[2]
            stats["hit"] += ctx.get(dut.stat_hit)
            stats["miss"] += ctx.get(dut.stat_miss)
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()
    assert stats == {"hit": model.hits, "miss": model.misses}
    assert model.hits > 30 and model.misses > 30


def test_bad_params():
    with pytest.raises(ValueError, match=r"entries must be an integer in \[1, 16\], not 0"):
        BlueFlameBuffer(3, 0)
    with pytest.raises(ValueError, match=r"qpn_bits must be an integer in \[1, 24\], not 25"):
        BlueFlameBuffer(25)
