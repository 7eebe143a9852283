"""Test drivers shared by the unit tests: random writes for the per-element array tests
(tests/hw/test_reg_array.py, tests/hw/test_mem_array.py), and a wrapper that gives a block a
reset of its own (tests/hw/test_cache.py, tests/hw/test_ready_queue.py)."""

from amaranth.hdl import Module, ResetInserter, Signal
from amaranth.lib import wiring


def drive_random_writes(ctx, dut, ports, rng, n, p_write, width):
    """Drive every write port of ``dut`` for one cycle: enabled with probability ``p_write``,
    half the time at one of the first three elements (so that two ports often hit one
    element), data random over ``width`` bits. Returns the enabled ``(addr, value)`` pairs
    in port order (a later port wins)."""
    writes = []
    for p in ports:
        port = getattr(dut, p)
        en = rng.random() < p_write
        addr = rng.randrange(min(n, 3)) if rng.random() < 0.5 else rng.randrange(n)
        val = rng.randrange(1 << width)
        ctx.set(port.en, en)
        ctx.set(port.addr, addr)
        ctx.set(port.data, val)
        if en:
            writes.append((addr, val))
    return writes


class Resettable(wiring.Component):
    """A block behind a reset of its own (``rst``), with the same ports."""

    def __init__(self, block):
        self.block = block
        self.rst = Signal()
        super().__init__(block.signature)

    def elaborate(self, platform):
        m = Module()
        m.submodules.block = ResetInserter({"sync": self.rst})(self.block)
        for name, member in self.signature.members.items():
            outers, inners = getattr(self, name), getattr(self.block, name)
            if not member.dimensions:
                outers, inners = [outers], [inners]
            for outer, inner in zip(outers, inners):
                if member.is_port:
                    m.d.comb += (inner.eq(outer) if member.flow == wiring.In
                                 else outer.eq(inner))
                elif member.flow == wiring.In:
                    wiring.connect(m, wiring.flipped(outer), inner)
                else:
                    wiring.connect(m, inner, wiring.flipped(outer))
        return m
