"""Shared host-side drivers for the Amaranth unit tests of blocks that do DMA.

* :class:`TlpHostSim` serves a block's TLP ports (``down``: ``TlpDown(W)`` out of the block,
  ``up``: ``TlpUp(W)`` into it) with :class:`sim.tlp_host.TlpHost`: random back-pressure on
  ``down``, a random latency per request (so completions of different reads come back in
  any order), completions of one read in address order, write responses in order.
* :class:`PortMemorySim` serves a client block's DMA ports directly (``DmaReadPort`` /
  ``DmaWritePort``): reads answered in request order after a random latency, writes applied
  and answered with ``done``; ``fail(addr, len, is_write)`` makes requests fail.

Both keep their counters and logs on the object; both act once per clock in an
``add_testbench`` process (the Amaranth simulator has no other way).
"""

import heapq
import random

from hw.formats import TlpKind
from sim.host import HostMemory
from sim.tlp_host import TlpHost

__all__ = ["TlpHostSim", "PortMemorySim", "PyPortSim", "ClientsSim", "tick_until"]


async def tick_until(ctx, signal):
    """Tick until ``signal`` is high at a clock edge (``ctx.tick().until()`` without its
    generator, which a background process may be torn down inside of at the end of a run)."""
    while True:
        _, _, v = await ctx.tick().sample(signal)
        if v:
            return


def _int(v):
    return v.value if hasattr(v, "value") else int(v)


class TlpHostSim:
    """Host behind the TLP ports ``down`` / ``up`` of a block (see module docstring).

    lat         (min, max) cycles from a request's arrival to its first response beat.
    p_ready     probability that ``down.ready`` is high in a cycle.
    p_gap       probability of an idle cycle between up beats.
    """

    def __init__(self, down, up, data_bytes, *, mem=None, seed=0, lat=(4, 40), p_ready=1.0,
                 p_gap=0.0, cpl_bytes=64, max_payload=256, fail=None):
        self.down, self.up = down, up
        self.W = data_bytes
        self.mem = HostMemory() if mem is None else mem
        self.host = TlpHost(self.mem, data_bytes, cpl_bytes=cpl_bytes, max_payload=max_payload,
                            fail=fail)
        self.rng = random.Random(seed)
        self.lat = lat
        self.p_ready = p_ready
        self.p_gap = p_gap
        self.now = 0
        self.mrd = []          # (cycle, tag, addr, len) of every MRd
        self.mwr = []          # (cycle, tag, addr, len) of every MWr
        self.outstanding = {}  # read tag -> (addr, len)
        self.protocol_errors = []
        self.sent = []         # index into mrd of each read completion, in the order sent
        self._q = []           # heap of (due, seq, Completion, mrd index)
        self._seq = 0
        self._wr_due = 0

    def _push(self, due, cpl, index=None):
        heapq.heappush(self._q, (due, self._seq, cpl, index))
        self._seq += 1

    async def run_down(self, ctx):
        W = self.W
        cur = None             # [hdr dict, bytearray of words, beats]
        while True:
            ctx.set(self.down.ready, self.rng.random() < self.p_ready)
            _, _, v, r, p = await ctx.tick().sample(self.down.valid, self.down.ready,
                                                    self.down.payload)
            self.now += 1
            if not (v and r):
                continue
            if cur is None:
                h = p.hdr
                cur = [{"kind": _int(h.kind), "tag": _int(h.tag), "addr": _int(h.addr),
                        "len": _int(h.len)}, bytearray()]
            cur[1] += _int(p.data).to_bytes(W, "little")
            if not p.last:
                continue
            h, words = cur
            cur = None
            a, n, tag = h["addr"], h["len"], h["tag"]
            nwords = (a % W + n + W - 1) // W
            if h["kind"] == TlpKind.MRD.value:
                self.mrd.append((self.now, tag, a, n))
                if len(words) != W:
                    self.protocol_errors.append(f"MRd with {len(words) // W} beats")
                if tag in self.outstanding:
                    self.protocol_errors.append(f"MRd tag {tag} reused while outstanding")
                self.outstanding[tag] = (a, n)
                due = self.now + self.rng.randint(*self.lat)
                for i, c in enumerate(self.host.read(tag, a, n)):
                    self._push(due + i, c, len(self.mrd) - 1)
            else:
                self.mwr.append((self.now, tag, a, n))
                if len(words) != nwords * W:
                    self.protocol_errors.append(f"MWr {a:#x}+{n}: {len(words) // W} beats, "
                                                f"expected {nwords}")
                rsp = self.host.write(tag, a, n, bytes(words))
                self._wr_due = max(self._wr_due, self.now + self.rng.randint(*self.lat))
                self._push(self._wr_due, rsp)

    async def run_up(self, ctx):
        W = self.W
        ctx.set(self.up.valid, 0)
        while True:
            if not self._q or self._q[0][0] > self.now or self.rng.random() < self.p_gap:
                ctx.set(self.up.valid, 0)
                await ctx.tick()
                continue
            _, _, c, index = heapq.heappop(self._q)
            if c.kind == "CPLD":
                self.sent.append(index)
                if c.last:
                    self.outstanding.pop(c.tag, None)
            words = c.words or bytes(W)
            nb = len(words) // W
            for b in range(nb):
                ctx.set(self.up.payload, {"hdr": c.hdr(),
                                          "data": int.from_bytes(words[b * W:(b + 1) * W], "little"),
                                          "last": int(b == nb - 1)})
                ctx.set(self.up.valid, 1)
                await tick_until(ctx, self.up.ready)
            ctx.set(self.up.valid, 0)

    def add_to(self, sim):
        sim.add_testbench(self.run_down, background=True)
        sim.add_testbench(self.run_up, background=True)


class PortMemorySim:
    """Serves a client's ``DmaReadPort`` s and ``DmaWritePort`` s directly (no TLPs).

    Reads of one port are answered in request order, ``lat`` cycles (random in the range)
    after the request at the earliest, one beat per cycle (``p_gap``: chance of an idle
    cycle). Writes are applied when their last beat is taken and answered on ``done``
    ``lat`` cycles later, in order. ``fail(addr, length, is_write)`` returning true makes a
    request fail as a one-TLP request would in the DMA engine: a read's data is zero and
    ``err`` set on every beat, a write changes nothing and its ``done`` has ``err``.
    """

    def __init__(self, data_bytes, *, mem=None, seed=0, lat=(2, 10), p_ready=1.0, p_gap=0.0,
                 fail=None):
        self.W = data_bytes
        self.mem = HostMemory() if mem is None else mem
        self.rng = random.Random(seed)
        self.lat, self.p_ready, self.p_gap = lat, p_ready, p_gap
        self.fail = fail
        self.reads = []        # (port name, addr, len, tag)
        self.writes = []       # (port name, addr, len, tag, ok, data)
        self.now = 0

    def read_port(self, sim, port, name=""):
        queue = []

        async def req(ctx):
            while True:
                ctx.set(port.req.ready, self.rng.random() < self.p_ready)
                _, _, v, r, p = await ctx.tick().sample(port.req.valid, port.req.ready,
                                                        port.req.payload)
                if v and r:
                    a, n, t = _int(p.addr), _int(p.len), _int(p.tag)
                    self.reads.append((name, a, n, t))
                    bad = bool(self.fail and self.fail(a, n, False))
                    data = bytes(n) if bad else self.mem.read(a, n)
                    queue.append((self._clock + self.rng.randint(*self.lat), data, t, bad))

        async def resp(ctx):
            W = self.W
            while True:
                if not queue or queue[0][0] > self._clock:
                    ctx.set(port.rd.valid, 0)
                    await ctx.tick()
                    continue
                _, data, t, bad = queue.pop(0)
                nb = (len(data) + W - 1) // W
                for b in range(nb):
                    while self.rng.random() < self.p_gap:
                        ctx.set(port.rd.valid, 0)
                        await ctx.tick()
                    chunk = data[b * W:(b + 1) * W]
                    ctx.set(port.rd.payload, {"data": int.from_bytes(chunk, "little"),
                                              "nbytes": len(chunk), "last": int(b == nb - 1),
                                              "tag": t, "err": int(bad)})
                    ctx.set(port.rd.valid, 1)
                    await tick_until(ctx, port.rd.ready)
                ctx.set(port.rd.valid, 0)

        sim.add_testbench(req, background=True)
        sim.add_testbench(resp, background=True)

    def write_port(self, sim, port, name=""):
        done_q = []

        async def wr(ctx):
            W = self.W
            cur = None
            while True:
                ctx.set(port.wr.ready, self.rng.random() < self.p_ready)
                _, _, v, r, p = await ctx.tick().sample(port.wr.valid, port.wr.ready,
                                                        port.wr.payload)
                if not (v and r):
                    continue
                if cur is None:
                    cur = [_int(p.addr), _int(p.len), _int(p.tag), bytearray()]
                nb = _int(p.nbytes)
                cur[3] += _int(p.data).to_bytes(W, "little")[:nb]
                if p.last:
                    a, n, t, data = cur
                    cur = None
                    bad = bool(self.fail and self.fail(a, n, True)) or len(data) != n
                    if not bad:
                        self.mem.write(a, bytes(data))
                    self.writes.append((name, a, n, t, not bad, bytes(data)))
                    done_q.append((self._clock + self.rng.randint(*self.lat), t, bad))

        async def done(ctx):
            while True:
                if done_q and done_q[0][0] <= self._clock:
                    _, t, bad = done_q.pop(0)
                    ctx.set(port.done.payload, {"tag": t, "err": int(bad)})
                    ctx.set(port.done.valid, 1)
                else:
                    ctx.set(port.done.valid, 0)
                await ctx.tick()

        sim.add_testbench(wr, background=True)
        sim.add_testbench(done, background=True)

    _clock = 0

    def clock(self, sim):
        async def tick(ctx):
            while True:
                await ctx.tick()
                self._clock += 1
        sim.add_testbench(tick, background=True)


class PyPortSim:
    """The Python host's side of a :class:`~hw.host.py_port.PyHostPort` (``py_*`` ports of a
    HostSide), in the Amaranth simulator: the same mailbox protocol as ``sim/host.py`` (take
    a whole TLP per edge from ``req``, answer it through :class:`sim.tlp_host.PyHost`, push
    responses into ``cpl``)."""

    def __init__(self, dut, data_bytes, pyhost, *, max_payload=256, p_ready=1.0, seed=0,
                 prefix="py_"):
        self.dut, self.W, self.py = dut, data_bytes, pyhost
        self.req_bytes = max_payload + data_bytes
        self.p = lambda name: getattr(dut, prefix + name)
        self.rng = random.Random(seed)
        self.p_ready = p_ready
        self.taken = 0

    async def run(self, ctx):
        p = self.p
        pushes = []
        ack = cseq = 0
        idle = 0
        while True:
            await ctx.tick()
            seq, taken = ctx.get(p("req_seq")), ctx.get(p("cpl_taken"))
            if seq != ack and self.rng.random() < self.p_ready:
                req = ctx.get(p("req"))
                self.taken += 1
                idle = 0
                h = req.hdr
                hdr = {"kind": _int(h.kind), "tag": _int(h.tag), "addr": _int(h.addr),
                       "len": _int(h.len)}
                words = _int(req.data).to_bytes(self.req_bytes, "little")
                st, out = self.py.request(hdr, _int(req.time), words)
                pushes += out
                ack = (ack + 1) & 0xFFFF
                ctx.set(p("req_status"), st)
                ctx.set(p("req_ack"), ack)
            else:
                idle += 1
                if idle == 64:
                    pushes += self.py.flush()
            if pushes and taken == cseq:
                q = pushes.pop(0)
                ctx.set(p("cpl"), {"tag": q["tag"], "status": q["status"], "addr": q["addr"],
                                   "len": q["len"], "due": q["due"],
                                   "data": int.from_bytes(q["data"], "little")})
                cseq = (cseq + 1) & 0xFFFF
                ctx.set(p("cpl_seq"), cseq)


class ClientsSim:
    """DMA clients: issue ``reads[c]`` = [(addr, len, tag)] on ``rd_ports[c]`` and
    ``writes[c]`` = [(addr, data, tag)] on ``wr_ports[c]``, with random back-pressure
    (``p_client``: chance per cycle that a client is willing), and collect what comes back:
    ``got_rd[c]`` = [(tag, data, err)], ``got_wr[c]`` = [(tag, err)], ``cycles_rd[c]`` /
    ``cycles_wr[c]``: the cycle each finished. ``before_read(ctx, c, i)`` (async) and
    ``after_write(c, i)`` hook into the order of requests. The writes of the clients in
    ``hint`` carry the ``hint`` flag (the host signals them on its event line)."""

    def __init__(self, rd_ports, wr_ports, data_bytes, *, reads=None, writes=None, seed=0,
                 p_client=1.0, before_read=None, after_write=None, hint=()):
        self.hint = set(hint)
        self.rd_ports, self.wr_ports, self.W = list(rd_ports), list(wr_ports), data_bytes
        self.reads = reads or [[] for _ in self.rd_ports]
        self.writes = writes or [[] for _ in self.wr_ports]
        self.rng = random.Random(seed)
        self.p_client = p_client
        self.before_read, self.after_write = before_read, after_write
        self.got_rd = [[] for _ in self.rd_ports]
        self.got_wr = [[] for _ in self.wr_ports]
        self.cycles_rd = [[] for _ in self.rd_ports]
        self.beat_errs = [[] for _ in self.rd_ports]   # per read: the err flag of each beat
        self.cycles_wr = [[] for _ in self.wr_ports]
        self.events = []
        self.cycle = 0
        self.go = True             # the clients start once this is true

    async def _wait_go(self, ctx):
        while not self.go:
            await ctx.tick()

    def finished(self):
        return (all(len(g) == len(r) for g, r in zip(self.got_rd, self.reads))
                and all(len(g) == len(w) for g, w in zip(self.got_wr, self.writes)))

    def _reader(self, c):
        port, W, rng = self.rd_ports[c], self.W, self.rng

        async def req(ctx):
            await self._wait_go(ctx)
            for i, (a, n, t) in enumerate(self.reads[c]):
                if self.before_read is not None:
                    await self.before_read(ctx, c, i)
                while rng.random() > self.p_client:
                    await ctx.tick()
                ctx.set(port.req.payload, {"addr": a, "len": n, "tag": t})
                ctx.set(port.req.valid, 1)
                await tick_until(ctx, port.req.ready)
                self.events.append((self.cycle, "rd_req", c, a))
                ctx.set(port.req.valid, 0)

        async def resp(ctx):
            cur = bytearray()
            errs = []
            while True:
                ctx.set(port.rd.ready, rng.random() < self.p_client)
                _, _, v, r, p = await ctx.tick().sample(port.rd.valid, port.rd.ready, port.rd.payload)
                if v and r:
                    nb = int(p.nbytes)
                    assert p.last or nb == W, "a beat before the last is not full"
                    cur += int(p.data).to_bytes(W, "little")[:nb]
                    errs.append(int(p.err))
                    if p.last:
                        self.got_rd[c].append((int(p.tag), bytes(cur), int(p.err)))
                        self.cycles_rd[c].append(self.cycle)
                        self.beat_errs[c].append(errs)
                        cur = bytearray()
                        errs = []
        return req, resp

    def _writer(self, c):
        port, W, rng = self.wr_ports[c], self.W, self.rng

        async def wr(ctx):
            await self._wait_go(ctx)
            for i, (a, data, t) in enumerate(self.writes[c]):
                nb = (len(data) + W - 1) // W
                for b in range(nb):
                    while rng.random() > self.p_client:
                        ctx.set(port.wr.valid, 0)
                        await ctx.tick()
                    chunk = data[b * W:(b + 1) * W]
                    ctx.set(port.wr.payload, {"addr": a, "len": len(data), "tag": t,
                                              "data": int.from_bytes(chunk, "little"),
                                              "nbytes": len(chunk), "last": b == nb - 1,
                                              "hint": c in self.hint})
                    ctx.set(port.wr.valid, 1)
                    await tick_until(ctx, port.wr.ready)
                self.events.append((self.cycle, "wr_handed", c, a))
                ctx.set(port.wr.valid, 0)
                if self.after_write is not None:
                    self.after_write(c, i)

        async def done(ctx):
            while True:
                _, _, v, p = await ctx.tick().sample(port.done.valid, port.done.payload)
                if v:
                    self.got_wr[c].append((int(p.tag), int(p.err)))
                    self.cycles_wr[c].append(self.cycle)
        return wr, done

    def run(self, sim, *, max_cycles=200_000, then=None):
        """Add the client processes to ``sim``, run until every request is answered (then
        ``await then(ctx)``), failing after ``max_cycles``."""
        async def clock(ctx):
            while True:
                await ctx.tick()
                self.cycle += 1

        sim.add_testbench(clock, background=True)
        for c in range(len(self.rd_ports)):
            for proc in self._reader(c):
                sim.add_testbench(proc, background=True)
        for c in range(len(self.wr_ports)):
            for proc in self._writer(c):
                sim.add_testbench(proc, background=True)

        async def main(ctx):
            while not self.finished():
                await ctx.tick()
            if then is not None:
                await then(ctx)

        async def watchdog(ctx):
            for _ in range(max_cycles):
                await ctx.tick()
            raise AssertionError(
                f"no progress after {max_cycles} cycles: reads {[len(g) for g in self.got_rd]} "
                f"of {[len(r) for r in self.reads]}, writes {[len(g) for g in self.got_wr]} of "
                f"{[len(w) for w in self.writes]}")

        sim.add_testbench(watchdog, background=True)
        sim.add_testbench(main)
        sim.run()


def cache_sim(dut, data_bytes, **kw):
    """A Simulator (10 ns clock) for a block with a cache's host ports ``dma_rd`` (fills) and
    ``dma_wr`` (write-backs), served by a :class:`PortMemorySim` built with ``kw``; returns
    ``(sim, dma)``."""
    from amaranth.sim import Simulator
    dma = PortMemorySim(data_bytes, **kw)
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    dma.clock(sim)
    dma.read_port(sim, dut.dma_rd, "fill")
    dma.write_port(sim, dut.dma_wr, "wb")
    return sim, dma
