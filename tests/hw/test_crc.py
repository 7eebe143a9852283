"""Parallel CRC-32 (hw/net/crc.py) against zlib.crc32."""

import random
import re
import zlib

import pytest
from amaranth.back import verilog
from amaranth.sim import Simulator

from hw.net.crc import Crc32Update, raw_update, solve_state, CRC32_RESIDUE, check_data_bytes


def test_python_helpers():
    rng = random.Random(1)
    for _ in range(20):
        msg = rng.randbytes(rng.randrange(1, 100))
        assert ~raw_update(0xFFFFFFFF, msg) & 0xFFFFFFFF == zlib.crc32(msg)
        full = msg + zlib.crc32(msg).to_bytes(4, "little")
        assert raw_update(0xFFFFFFFF, full) == CRC32_RESIDUE
    s = solve_state(bytes(6), 0xFFFFFFFF)
    assert raw_update(s, bytes(6)) == 0xFFFFFFFF


def _run(w, n_single, n_msgs, seed):
    dut = Crc32Update(w)
    rng = random.Random(seed)

    async def tb(ctx):
        # single beats from random states
        for _ in range(n_single):
            n = rng.randrange(1, w + 1)
            data = rng.randbytes(w)
            state = rng.getrandbits(32)
            ctx.set(dut.state_in, state)
            ctx.set(dut.data, int.from_bytes(data, "little"))
            ctx.set(dut.nbytes, n)
            await ctx.delay(1e-9)
            assert ctx.get(dut.state_out) == raw_update(state, data[:n]), (n, data.hex())
        # nbytes = 0 leaves the state alone
        ctx.set(dut.nbytes, 0)
        await ctx.delay(1e-9)
        assert ctx.get(dut.state_out) == ctx.get(dut.state_in)
        # whole messages split into beats, compared with zlib.crc32
        for _ in range(n_msgs):
            msg = rng.randbytes(rng.randrange(1, 5 * w))
            state = 0xFFFFFFFF
            for off in range(0, len(msg), w):
                beat = msg[off:off + w]
                ctx.set(dut.state_in, state)
                ctx.set(dut.data, int.from_bytes(beat + rng.randbytes(w - len(beat)), "little"))
                ctx.set(dut.nbytes, len(beat))
                await ctx.delay(1e-9)
                state = ctx.get(dut.state_out)
            assert ~state & 0xFFFFFFFF == zlib.crc32(msg)

    sim = Simulator(dut)
    sim.add_testbench(tb)
    sim.run()


def test_crc_w8():
    _run(8, 300, 40, 8)


def test_crc_w64():
    _run(64, 150, 20, 64)


def test_crc_w16_w32():
    _run(16, 60, 5, 16)
    _run(32, 60, 5, 32)


def _sweep(w, seed, per_n=3):
    """Every ``nbytes`` in 0..W, random states and data, against ``zlib.crc32`` directly."""
    dut = Crc32Update(w)
    rng = random.Random(seed)

    async def tb(ctx):
        for n in range(w + 1):
            for k in range(per_n):
                data = rng.randbytes(w)
                state = 0xFFFFFFFF if k == 0 else rng.getrandbits(32)
                ctx.set(dut.state_in, state)
                ctx.set(dut.data, int.from_bytes(data, "little"))
                ctx.set(dut.nbytes, n)
                await ctx.delay(1e-9)
                out = ctx.get(dut.state_out)
                assert out == ~zlib.crc32(data[:n], ~state & 0xFFFFFFFF) & 0xFFFFFFFF, \
                    (w, n, hex(state), data.hex())
                if k == 0:
                    assert ~out & 0xFFFFFFFF == zlib.crc32(data[:n])

    sim = Simulator(dut)
    sim.add_testbench(tb)
    sim.run()


@pytest.mark.parametrize("w", [1, 2, 4, 8, 16, 32, 64])
def test_crc_every_nbytes(w):
    _sweep(w, 100 + w)


def test_verilog_not_bit_blasted():
    # The matrix rows come from a ROM so that the Verilog evaluates each output bit as one
    # wide AND and a reduction XOR (hw/net/crc.py docstring). With the rows as Const operands the
    # Verilog back end folds the AND bit by bit: at W=64, 28,783 bit/part selects in the
    # assignments and lines of up to 3.9 k characters, against 903 and 298 now.
    text = verilog.convert(Crc32Update(64), name="crc", emit_src=False)
    assigns = [line for line in text.splitlines() if line.lstrip().startswith("assign ")]
    selects = sum(len(re.findall(r"\[\d+(?::\d+)?\]", line)) for line in assigns)
    assert selects < 5000, selects
    assert max(map(len, assigns)) < 1000


def test_bad_width():
    with pytest.raises(ValueError, match=r"data_bytes must be a power of two in \[1, 64\], not 12"):
        Crc32Update(12)
    with pytest.raises(ValueError, match=r"data_bytes must be a power of two in \[8, 64\], not 4"):
        check_data_bytes(4)
