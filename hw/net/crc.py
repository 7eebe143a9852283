"""Parallel CRC-32 over one beat of a byte stream.

Models the CRC engine of the RoCEv2 invariant CRC (ICRC, InfiniBand Architecture
Specification vol. 1 rel. 1.4, Annex A17.3.3 "ICRC"), which is the Ethernet CRC-32
(polynomial 0x04C11DB7, reflected, initial value and final XOR 0xFFFFFFFF: the same
result as ``zlib.crc32``).

The CRC register update without initial value or final XOR ("raw" update) is linear over
GF(2) in the pair (state, data), so the update over ``k`` bytes is one XOR matrix; the
matrices are computed here in Python at elaboration by feeding unit vectors to
``zlib.crc32``. A beat with a variable number of valid bytes ``n`` (1..W, packed from
byte 0) is handled with log2(W)+1 networks instead of W: a full-W stage used when
``n == W``, then stages of W/2, W/4, ..., 1 bytes, each applied when the corresponding
bit of ``n`` is set, on the bytes that follow those of the larger stages already applied
(offset = the higher bits of ``n``).

Formulation, for simulation speed: output bit ``i`` of a stage is
``(Cat(state, data) & row_i).xor()`` with ``row_i`` read at a constant address from a ROM
(``lib.memory``, :class:`_MatrixRows`), not given as a ``Const``. With a ``Const`` operand the
``opt_expr`` that Amaranth's Verilog back end runs (inside Yosys ``proc``) folds the AND bit by
bit, so that each output bit becomes a concatenation of a few hundred single bits (W=64:
28,783 bit selects in 440 k characters of Verilog) which Verilator assembles bit by bit, for
every stage of every instance whenever an input changes. A memory hides the constant from
Yosys, and Verilator evaluates each row as 32-bit word ANDs folded by XOR. Synthesis is
unchanged: ``synth_ecp5`` turns the ROMs into constants and gives the same cells as before
(W=8: 1827 LUT4, W=64: 9562 LUT4, no FF, no block RAM); the Amaranth simulator is as fast.

Measured at b468a0d against 7f6ee46, on a CRC-only top (``Crc32Update(W)`` between registers
fed by a 64-bit xorshift and by its own output, ``nbytes`` cycling 0..W; Verilator 5.048 with
``sim.verilator.DEFAULT_ARGS`` and ``-Os``, a C++ loop, 2 shared cores, best of 7 runs):
W=8 1.05 M -> 12.2 M cycles/s, W=64 0.24 M -> 5.1 M; under callgrind 9.3 k -> 1.25 k and
39.3 k -> 3.34 k instructions per cycle, of which the top without the CRC takes 0.5 k and
1.1 k (literal masks written into the Verilog by hand: 3.09 k); both versions end in the same
CRC state after the same number of cycles.
Verilog of ``Crc32Update(64)``: 440 k -> 104 k characters, 2,109 -> 3,044 lines (more, shorter
lines: the ROM contents and the ports of the row modules).
"""

import functools
import zlib

from amaranth.hdl import Cat, Const, Elaboratable, Module, Mux, Signal
from amaranth.lib import memory, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import bits_for, exact_log2

__all__ = ["raw_update", "update_matrix", "Crc32Update", "CRC32_RESIDUE", "solve_state",
           "check_data_bytes"]

_M32 = 0xFFFFFFFF

#: Raw CRC register after a message followed by its CRC (little-endian) has been processed
#: from the initial value 0xFFFFFFFF: the classic CRC-32 residue 0x2144DF1C, complemented.
CRC32_RESIDUE = ~0x2144DF1C & _M32


def check_data_bytes(data_bytes, lo=8, hi=64):
    if (not isinstance(data_bytes, int) or isinstance(data_bytes, bool)
            or not lo <= data_bytes <= hi or data_bytes & (data_bytes - 1)):
        raise ValueError(f"data_bytes must be a power of two in [{lo}, {hi}], not {data_bytes!r}")


def raw_update(state, data):
    """CRC-32 register after ``data`` from register value ``state`` (no init, no final XOR)."""
    return ~zlib.crc32(bytes(data), ~state & _M32) & _M32


@functools.lru_cache(maxsize=None)
def update_matrix(nbytes):
    """Per output bit, the mask over ``Cat(state[32], data[8*nbytes])`` whose XOR gives it."""
    cols = []
    for j in range(32 + 8 * nbytes):
        vec = 1 << j
        cols.append(raw_update(vec & _M32, (vec >> 32).to_bytes(nbytes, "little")))
    return tuple(sum(((col >> i) & 1) << j for j, col in enumerate(cols)) for i in range(32))


def solve_state(data, target):
    """The register value ``s`` with ``raw_update(s, data) == target`` (Gaussian elimination)."""
    const = raw_update(0, data)
    # rows: (mask over the 32 unknown bits, right-hand side bit)
    rows = []
    for i in range(32):
        mask = sum(((raw_update(1 << j, bytes(len(data))) >> i) & 1) << j for j in range(32))
        rows.append([mask, ((target ^ const) >> i) & 1])
    sol = 0
    pivots = []
    for col in range(32):
        piv = next((r for r in rows if (r[0] >> col) & 1 and r not in pivots), None)
        if piv is None:
            raise ValueError("singular CRC system")
        pivots.append(piv)
        for r in rows:
            if r is not piv and (r[0] >> col) & 1:
                r[0] ^= piv[0]
                r[1] ^= piv[1]
    for r in pivots:
        col = (r[0] & -r[0]).bit_length() - 1
        sol |= r[1] << col
    assert raw_update(sol, data) == target
    return sol


class _MatrixRows(Elaboratable):
    """The 32 rows of :func:`update_matrix` ``(nbytes)`` as signals ``rows[i]``, read at
    constant addresses from a ROM (``lib.memory``).

    Several rows share a ROM word (words of at most :attr:`WORD_BITS` bits), each at a multiple
    of 32 bits so that the slices stay aligned on Verilator's 32-bit words: one read port per
    row (224 at W=64) made elaboration and simulator set-up 2-3 times slower, and one word per
    matrix is too wide for the Amaranth simulator at W=64 (it writes the masks of its signals in
    decimal, which Python refuses beyond 4300 digits, about 14 kbit).
    A module of its own: the Amaranth simulator compiles the combinational statements of a
    module into one process that runs again whenever one of its inputs changes, so the
    constant address assignments would run again at every change in the CRC module.
    """

    WORD_BITS = 4096

    def __init__(self, nbytes):
        self._nbytes = nbytes
        self.rows = [Signal(32 + 8 * nbytes, name=f"row_{i}") for i in range(32)]

    def elaborate(self, platform):
        m = Module()
        width = 32 + 8 * self._nbytes
        stride = -(-width // 32) * 32
        per_word = 32
        while per_word > 1 and per_word * stride > self.WORD_BITS:
            per_word //= 2
        rows = update_matrix(self._nbytes)
        words = [sum(rows[a * per_word + j] << (j * stride) for j in range(per_word))
                 for a in range(32 // per_word)]
        m.submodules.rom = rom = memory.Memory(shape=per_word * stride, depth=len(words),
                                               init=words)
        for a in range(len(words)):
            port = rom.read_port(domain="comb")
            m.d.comb += port.addr.eq(a)
            for j in range(per_word):
                m.d.comb += self.rows[a * per_word + j].eq(
                    port.data[j * stride:j * stride + width])
        return m


def _apply(m, state, data, nbytes):
    """Raw update of ``state`` over the ``nbytes`` bytes of ``data`` (combinational).

    Output bit ``i`` is ``(Cat(state, data) & row[i]).xor()`` with the rows of
    :func:`update_matrix` coming from a ROM (:class:`_MatrixRows`), not from ``Const``
    operands, which the Verilog back end would bit-blast (see the module docstring).
    """
    m.submodules[f"matrix_{nbytes}"] = mat = _MatrixRows(nbytes)
    # Not a named signal: in the Amaranth simulator it would add one settling step per stage
    # (40 % more time); Verilator and Yosys merge the copies of the operand of every row.
    vec = Cat(state, data)
    return Cat(*[(vec & row).xor() for row in mat.rows])


class Crc32Update(wiring.Component):
    """Combinational raw CRC-32 update over the first ``nbytes`` bytes of a beat.

    Ports: ``state_in: In(32)``, ``data: In(8*W)``, ``nbytes: In(bits_for(W))`` (1..W;
    0 leaves the state unchanged), ``state_out: Out(32)``.
    ``zlib.crc32(msg) == ~state_out`` after all beats of ``msg`` starting from 0xFFFFFFFF.
    """

    def __init__(self, data_bytes):
        check_data_bytes(data_bytes, 1, 64)
        self._w = data_bytes
        super().__init__({
            "state_in": In(32),
            "data": In(8 * data_bytes),
            "nbytes": In(bits_for(data_bytes)),
            "state_out": Out(32),
        })

    def elaborate(self, platform):
        m = Module()
        w = self._w
        lw = exact_log2(w)
        s = Signal(32, name="s_full")
        m.d.comb += s.eq(Mux(self.nbytes[lw], _apply(m, self.state_in, self.data, w),
                             self.state_in))
        k = w // 2
        while k >= 1:
            lk = exact_log2(k)
            # the 2k-byte word whose low half holds this stage's bytes
            idx = (self.nbytes[:lw] >> (lk + 1)) if lw > lk + 1 else Const(0, 1)
            chunk = self.data.word_select(idx, 16 * k)[:8 * k]
            nxt = Signal(32, name=f"s_{k}")
            m.d.comb += nxt.eq(Mux(self.nbytes[lk], _apply(m, s, chunk, k), s))
            s = nxt
            k //= 2
        m.d.comb += self.state_out.eq(s)
        return m
