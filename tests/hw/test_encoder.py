"""hw/lib/encoder.py against Python: the lowest set bit of random and corner-case
vectors, for widths from 1 to 300 bits, and the round-robin pick after a random last
grant."""

import random

import pytest
from amaranth.hdl import Module, Signal
from amaranth.sim import Simulator

from hw.lib.encoder import first_set, lowest_one_hot


@pytest.mark.parametrize("n", [1, 2, 3, 7, 64, 65, 300])
def test_first_set_against_python(n):
    m = Module()
    bits = Signal(n)
    anyb, idx = first_set(m, bits, "t")
    low = lowest_one_hot(m, bits, "u")
    rng = random.Random(n)
    vectors = [0, 1, 1 << (n - 1), (1 << n) - 1]
    vectors += [1 << rng.randrange(n) for _ in range(40)]
    vectors += [rng.getrandbits(n) for _ in range(40)]
    vectors += [rng.getrandbits(n) & rng.getrandbits(n) & rng.getrandbits(n) for _ in range(40)]
    sim = Simulator(m)

    async def tb(ctx):
        for v in vectors:
            ctx.set(bits, v)
            want = (v & -v).bit_length() - 1 if v else 0
            assert ctx.get(anyb) == (v != 0), hex(v)
            assert ctx.get(idx) == want, hex(v)
            assert ctx.get(low) == (v & -v), hex(v)

    sim.add_testbench(tb)
    sim.run()


def test_width_checked():
    with pytest.raises(ValueError, match="bits must be 1 to 65536 bits wide, not 0"):
        first_set(Module(), Signal(0), "t")


@pytest.mark.parametrize("n", [1, 2, 3, 5, 64])
def test_round_robin_pick_against_python(n):
    from hw.lib.encoder import round_robin_pick
    m = Module()
    req = Signal(n)
    last = Signal(range(max(n, 2)))
    anyb, pick = round_robin_pick(m, req, last)
    rng = random.Random(7 * n)
    sim = Simulator(m)

    async def tb(ctx):
        for _ in range(300):
            v = rng.getrandbits(n) & (rng.getrandbits(n) if rng.random() < 0.5 else -1)
            lst = rng.randrange(n)
            ctx.set(req, v)
            ctx.set(last, lst)
            order = [(lst + 1 + k) % n for k in range(n)]
            want = next((i for i in order if v >> i & 1), None)
            assert ctx.get(anyb) == (want is not None)
            if want is not None:
                assert ctx.get(pick) == want, (hex(v), lst)

    sim.add_testbench(tb)
    sim.run()
