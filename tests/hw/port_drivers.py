"""Test drivers shared by the unit tests: random writes for the per-element array tests
(tests/hw/test_reg_array.py, tests/hw/test_mem_array.py), a wrapper that gives a block a
reset of its own (tests/hw/test_cache.py, tests/hw/test_ready_queue.py), a stream offer held
until taken, a host that answers DMA writes late and in order (the write-gate tests), and
cases applied to a combinational block (the requester's and responder's check blocks)."""

from amaranth.hdl import Module, ResetInserter, Signal
from amaranth.lib import wiring
from amaranth.sim import Simulator


async def offer(ctx, port, payload):
    """Offer ``payload`` on the stream ``port`` and hold it until it is taken."""
    ctx.set(port.payload, payload)
    ctx.set(port.valid, 1)
    while True:
        _, _, ready = await ctx.tick().sample(port.ready)
        if ready:
            break
    ctx.set(port.valid, 0)


class WriteHost:
    """The host side of a DMA write port's ``done`` stream: each write the test issues
    (:meth:`issue`) is answered in order, 2 to ``max_delay`` cycles later, with its key as
    the tag and ``err`` if it is to fail. ``answered[k]`` is the cycle write ``k`` was
    answered; ``cycle`` counts the clock (run :meth:`run` as a background testbench)."""

    def __init__(self, done, rng, max_delay=40):
        self.done, self.rng, self.max_delay = done, rng, max_delay
        self.pending, self.answered, self.cycle = [], [], 0

    def issue(self, key, fail):
        self.pending.append((self.cycle + self.rng.randint(2, self.max_delay), key, fail))

    async def write(self, ctx, wr_issued, key, fail):
        """One client write: pulse ``wr_issued`` for a cycle and answer it later."""
        ctx.set(wr_issued, 1)
        self.issue(key, fail)
        await ctx.tick()
        ctx.set(wr_issued, 0)

    async def run(self, ctx):
        while True:
            if self.pending and self.pending[0][0] <= self.cycle:
                _, key, fail = self.pending.pop(0)
                ctx.set(self.done.payload, {"tag": key, "err": int(fail)})
                ctx.set(self.done.valid, 1)
                self.answered.append(self.cycle)
            else:
                ctx.set(self.done.valid, 0)
            await ctx.tick()
            self.cycle += 1


def comb_cases(dut, cases, check):
    """Apply each case (a dict port name -> value) to the combinational ``dut`` and call
    ``check(case, get)`` with a getter of its settled outputs."""
    async def tb(ctx):
        for case in cases:
            for port, value in case.items():
                ctx.set(getattr(dut, port), value)
            check(case, lambda port: ctx.get(port))

    sim = Simulator(dut)
    sim.add_testbench(tb)
    sim.run()


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
