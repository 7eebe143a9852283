"""Test drivers shared by the unit tests: random writes for the per-element array tests
(tests/hw/test_reg_array.py, tests/hw/test_mem_array.py), a wrapper that gives a block a
reset of its own (tests/hw/test_cache.py, tests/hw/test_ready_queue.py), a stream offer held
until taken, a host that answers DMA writes late and in order (the write-gate tests), and
cases applied to a combinational block (the requester's and responder's check blocks), and
streams driven and sampled in lockstep with random valid / ready, with random packets to
drive them (the arbiters' and the packet FIFO's tests)."""

import random

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


def _int(v):
    """A sampled field as an integer (a struct or array field: its bits)."""
    return int(v.as_bits()) if hasattr(v, "as_bits") else int(v)


def run_lockstep(dut, sources, sinks, *, p_valid, p_ready, seed, max_cycles, done, after=None):
    """Drive ``sources`` [(stream, [payload dict])] and sample ``sinks`` [(stream, fields)]
    cycle by cycle with random valid/ready. A source keeps an offered payload until taken.
    ``after``: an async function of the testbench context, run in the same simulation once
    ``done(got)`` is true or ``max_cycles`` have passed (to read counters, say).

    Returns (per-sink list of (cycle, dict), per-source list of accept cycles)."""
    rng = random.Random(seed)
    got = [[] for _ in sinks]
    accepted = [[] for _ in sources]
    stable = []

    async def tb(ctx):
        pos = [0] * len(sources)
        offering = [False] * len(sources)
        last_offer = [None] * len(sinks)
        for cycle in range(max_cycles):
            for k, (s, items) in enumerate(sources):
                if not offering[k] and pos[k] < len(items) and rng.random() < p_valid:
                    offering[k] = True
                ctx.set(s.valid, offering[k])
                if offering[k]:
                    ctx.set(s.payload, items[pos[k]])
            for s, _ in sinks:
                ctx.set(s.ready, rng.random() < p_ready)
            exprs = []
            for s, _ in sources:
                exprs += [s.valid, s.ready]
            for s, _ in sinks:
                exprs += [s.valid, s.ready, s.payload]
            _, _, *v = await ctx.tick().sample(*exprs)
            for k in range(len(sources)):
                if v[2 * k] and v[2 * k + 1]:
                    accepted[k].append(cycle)
                    pos[k] += 1
                    offering[k] = False
            base = 2 * len(sources)
            for j, (s, fields) in enumerate(sinks):
                valid, ready, p = v[base + 3 * j: base + 3 * j + 3]
                rec = {f: _int(getattr(p, f)) for f in fields}
                if valid and last_offer[j] is not None:
                    # a presented payload must not change until it is taken
                    stable.append(rec == last_offer[j])
                last_offer[j] = rec if valid and not ready else None
                if valid and ready:
                    got[j].append((cycle, rec))
            if done(got):
                break
        if after is not None:
            await after(ctx)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()
    assert all(stable)
    return got, accepted


def make_packets(rng, n, count, W):
    """Per input, a list of (meta dict, [payload beats])."""
    out = []
    for k in range(n):
        pkts = []
        for s in range(count):
            paylen = rng.choice([0, 0, 1, W - 1, W, W + 1, 3 * W, rng.randint(1, 6 * W)])
            meta = {"src_node": k, "psn": s, "paylen": paylen, "dest_qpn": rng.randrange(1 << 24)}
            beats = []
            for off in range(0, paylen, W):
                nb = min(W, paylen - off)
                beats.append({"data": (k << 56) | (s << 40) | off, "nbytes": nb,
                              "last": int(off + W >= paylen)})
            pkts.append((meta, beats))
        out.append(pkts)
    return out


def check_packets(dut, pkts, got, W):
    metas, beats = got
    n = len(pkts)
    # per input: metas in order
    for k in range(n):
        assert [(m["psn"], m["paylen"]) for _, m in metas if m["src_node"] == k] == \
            [(m["psn"], m["paylen"]) for m, _ in pkts[k]]
    # the payloads leave whole in the order of the metas, each after its meta; a meta may
    # be taken while the previous packet's payload flows, but not before the payload of
    # the packet two ahead of it has ended (one packet with payload ahead at most)
    bi = 0
    ends = []        # (meta cycle, cycle of the last beat) of the packets with payload
    for idx, (mc, m) in enumerate(metas):
        k, s = m["src_node"], m["psn"]
        exp = pkts[k][s][1]
        mine = beats[bi:bi + len(exp)]
        assert [b for _, b in mine] == exp
        if mine:
            assert mine[0][0] > mc
            if len(ends) >= 2:
                assert mc > ends[-2][1], f"meta {idx} two packets ahead of the payload"
            ends.append((mc, mine[-1][0]))
        bi += len(exp)
    assert bi == len(beats)


def frame_beats(frame, W):
    """A frame (bytes) as the beats of a ``BeatStream(W)``: data little-endian, the last
    beat's ``nbytes`` what is left."""
    return [{"data": int.from_bytes(frame[o:o + W], "little"), "nbytes": len(frame[o:o + W]),
             "last": int(o + W >= len(frame))} for o in range(0, len(frame), W)]


def beats_to_frames(out, W):
    """Frames (bytes) from sampled beats ``[(cycle, beat dict)]``; output must not end inside
    a frame."""
    frames, cur = [], b""
    for _, b in out:
        cur += b["data"].to_bytes(W, "little")[:b["nbytes"]]
        if b["last"]:
            frames.append(cur)
            cur = b""
    assert cur == b"", "output ends inside a frame"
    return frames
