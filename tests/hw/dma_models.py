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

from hw.formats import CplKind, TlpKind, TlpStatus
from sim.host import HostMemory
from sim.tlp_host import TlpHost

__all__ = ["TlpHostSim", "PortMemorySim"]


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
                await ctx.tick().until(self.up.ready)
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
    request fail: a read's data is zero and ``err`` set on its last beat, a write changes
    nothing and its ``done`` has ``err``.
    """

    def __init__(self, data_bytes, *, mem=None, seed=0, lat=(2, 10), p_ready=1.0, p_gap=0.0,
                 fail=None):
        self.W = data_bytes
        self.mem = HostMemory() if mem is None else mem
        self.rng = random.Random(seed)
        self.lat, self.p_ready, self.p_gap = lat, p_ready, p_gap
        self.fail = fail
        self.reads = []        # (port name, addr, len, tag)
        self.writes = []       # (port name, addr, len, tag, ok)
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
                                              "tag": t, "err": int(bad and b == nb - 1)})
                    ctx.set(port.rd.valid, 1)
                    await ctx.tick().until(port.rd.ready)
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
                    self.writes.append((name, a, n, t, not bad))
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
