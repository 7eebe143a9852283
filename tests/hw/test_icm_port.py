"""IcmPort (hw/ctx/icm_port.py): several ICM clients share one DMA read and one DMA write port.

Every client issues random reads (32-byte entries and other lengths, its own 14-bit tags)
and random 32-byte writes with random back-pressure on every side; a host model behind
``dma_rd`` / ``dma_wr`` answers reads (data a function of the address, after a random
latency, some with ``err``) and every write with a ``done`` (some with ``err``). Checked:
each client gets exactly the answers to its own requests, in its own order, with its own tag
and the right data and error; the host sees each client's requests in the client's order
with the client number in tag bits 15:14; every write reaches the host whole (its beats
contiguous); outputs hold a presented payload until it is taken; grants are round robin:
the next valid client after the last grant, so no client gets two grants in a row while
another waits.
"""

import random
import re

import pytest
from amaranth.sim import Simulator

from hw.ctx.icm_port import CLIENT_TAG_BITS, IcmPort
from tests.hw.dma_models import tick_until

ENTRY = 32
TAG_MASK = (1 << CLIENT_TAG_BITS) - 1


def host_bytes(addr, n):
    """What host memory holds at ``[addr, addr + n)``: a function of the address."""
    return bytes((a * 37 + (a >> 8) * 11 + (a >> 16)) & 0xFF for a in range(addr, addr + n))


def rd_fails(addr, n):
    return (addr // 8 * 7 + n) % 5 == 0


def wr_fails(addr):
    return (addr // ENTRY) % 5 == 0


def _f(p, *names):
    return tuple(int(getattr(p, name)) for name in names)


class Bench:
    """The DUT, its clients (requests per client: ``reads``, ``writes``) and the host."""

    def __init__(self, n, W, *, seed, n_rd=40, n_wr=30, p_client=0.6, p_host=0.6,
                 lat=(1, 12), reorder=False):
        self.n, self.W = n, W
        self.dut = IcmPort(n, W)
        self.rng = rng = random.Random(seed)
        self.p_client, self.p_host, self.lat, self.reorder = p_client, p_host, lat, reorder

        def tag():
            return rng.choice([rng.randrange(16), rng.randrange(16), TAG_MASK,
                               rng.randrange(1 << CLIENT_TAG_BITS)])

        def addr(aligned):
            a = 0x10_0000 + rng.randrange(1 << 16) * ENTRY
            return a if aligned else a + rng.randrange(ENTRY)

        self.reads = [[(addr(True), ENTRY, tag()) if rng.random() < 0.6
                       else (addr(False), rng.randint(1, 3 * ENTRY), tag())
                       for _ in range(n_rd)] for _ in range(n)]
        self.writes = [[(addr(True), rng.randbytes(ENTRY), tag()) for _ in range(n_wr)]
                       for _ in range(n)]
        self.got_rd = [[] for _ in range(n)]      # (tag, data, err) per client
        self.got_wr = [[] for _ in range(n)]      # (tag, err) per client
        self.host_rd = [[] for _ in range(n)]     # (addr, len, tag) the host saw, per client
        self.host_wr = [[] for _ in range(n)]     # (addr, data, tag)
        self.rd_grants = []                       # (client, clients valid when first offered)
        self.wr_grants = []
        self.errors = []
        self.now = 0
        self.reordered = 0                        # answers sent before an older one
        self._rd_q = []                           # (due, client, addr, len, full tag)
        self._done_q = []                         # (due, full tag, err)

    # ---- clients
    async def _wait(self, ctx):
        while self.rng.random() > self.p_client:
            await ctx.tick()

    def _client(self, c):
        port_rd, port_wr, W = self.dut.rd[c], self.dut.wr[c], self.W

        async def rd_req(ctx):
            for a, n, t in self.reads[c]:
                ctx.set(port_rd.req.valid, 0)
                await self._wait(ctx)
                ctx.set(port_rd.req.payload, {"addr": a, "len": n, "tag": t})
                ctx.set(port_rd.req.valid, 1)
                await tick_until(ctx, port_rd.req.ready)
            ctx.set(port_rd.req.valid, 0)

        async def rd_resp(ctx):
            cur, tags, errs, held = bytearray(), set(), set(), None
            while True:
                ctx.set(port_rd.rd.ready, self.rng.random() < self.p_client)
                _, _, v, r, p = await ctx.tick().sample(port_rd.rd.valid, port_rd.rd.ready,
                                                        port_rd.rd.payload)
                f = _f(p, "data", "nbytes", "last", "tag", "err") if v else None
                if held is not None and f != held:
                    self.errors.append(f"client {c}: read data changed before it was taken")
                held = f if v and not r else None
                if not (v and r):
                    continue
                data, nb, last, t, err = f
                if not last and nb != W:
                    self.errors.append(f"client {c}: beat of {nb} bytes before the last")
                cur += data.to_bytes(W, "little")[:nb]
                tags.add(t)
                errs.add(err)
                if last:
                    if len(tags) != 1 or len(errs) != 1:
                        self.errors.append(f"client {c}: tags {tags} errs {errs} in one answer")
                    self.got_rd[c].append((t, bytes(cur), err))
                    cur, tags, errs = bytearray(), set(), set()

        async def wr(ctx):
            for a, data, t in self.writes[c]:
                nb = -(-len(data) // W)
                for b in range(nb):
                    ctx.set(port_wr.wr.valid, 0)
                    await self._wait(ctx)
                    chunk = data[b * W:(b + 1) * W]
                    ctx.set(port_wr.wr.payload, {
                        "addr": a, "len": len(data), "tag": t, "hint": 0,
                        "data": int.from_bytes(chunk, "little"), "nbytes": len(chunk),
                        "last": b == nb - 1})
                    ctx.set(port_wr.wr.valid, 1)
                    await tick_until(ctx, port_wr.wr.ready)
            ctx.set(port_wr.wr.valid, 0)

        async def done(ctx):
            while True:
                _, _, v, p = await ctx.tick().sample(port_wr.done.valid, port_wr.done.payload)
                if v:
                    self.got_wr[c].append(_f(p, "tag", "err"))

        return rd_req, rd_resp, wr, done

    # ---- host
    async def serve_front(self, ctx):
        """Takes read requests and write beats (random ready), checks them, records grants."""
        dut, W, n, rng = self.dut, self.W, self.n, self.rng
        req, wr = dut.dma_rd.req, dut.dma_wr.wr
        rd_held = wr_held = None       # payload offered and not taken
        rd_new = wr_new = True         # the next offer on the output is a new grant
        cur = None                     # write being received: [client, addr, len, tag, data, beats]
        while True:
            ctx.set(req.ready, rng.random() < self.p_host)
            ctx.set(wr.ready, rng.random() < self.p_host)
            _, _, *s = await ctx.tick().sample(
                req.valid, req.ready, req.payload, wr.valid, wr.ready, wr.payload,
                *[p.req.valid for p in dut.rd], *[p.wr.valid for p in dut.wr])
            self.now += 1
            rv, rr, rp, wv, wrd, wp = s[:6]
            rd_valid, wr_valid = s[6:6 + n], s[6 + n:]

            # read requests
            f = _f(rp, "addr", "len", "tag") if rv else None
            if rd_held is not None and f != rd_held:
                self.errors.append("dma_rd.req changed before it was taken")
            rd_held = f if rv and not rr else None
            if rv and rd_new:
                self.rd_grants.append((f[2] >> CLIENT_TAG_BITS,
                                       {k for k in range(n) if rd_valid[k]}))
            rd_new = not rv or rr
            if rv and rr:
                a, ln, t = f
                c = t >> CLIENT_TAG_BITS
                self.host_rd[c].append((a, ln, t & TAG_MASK))
                self._rd_q.append((self.now + rng.randint(*self.lat), c, a, ln, t))

            # write beats
            f = _f(wp, "addr", "len", "tag", "data", "nbytes", "last") if wv else None
            if wr_held is not None and f != wr_held:
                self.errors.append("dma_wr.wr changed before it was taken")
            wr_held = f if wv and not wrd else None
            if wv and wr_new and cur is None:
                self.wr_grants.append((f[2] >> CLIENT_TAG_BITS,
                                       {k for k in range(n) if wr_valid[k]}))
            wr_new = not wv or wrd
            if not (wv and wrd):
                continue
            a, ln, t, data, nb, last = f
            if cur is None:
                cur = [t >> CLIENT_TAG_BITS, a, ln, t, bytearray(), 0]
            elif (a, ln, t) != tuple(cur[1:4]):
                self.errors.append(f"write of client {cur[0]} interleaved with {(a, ln, t)}")
            cur[4] += data.to_bytes(W, "little")[:nb]
            cur[5] += 1
            expect = -(-cur[2] // W)
            if bool(last) != (cur[5] == expect) or (not last and nb != W):
                self.errors.append(f"write beat {cur[5]} of {expect}: last={last} nbytes={nb}")
            if last:
                c, a, ln, t, data, _ = cur
                self.host_wr[c].append((a, bytes(data), t & TAG_MASK))
                due = max([self.now + rng.randint(*self.lat)] + [d for d, *_ in self._done_q])
                self._done_q.append((due, t, int(wr_fails(a))))
                cur = None

    async def serve_rd(self, ctx):
        """Answers reads after their latency: in request order, or (``reorder``) in order per
        client but in any order between clients."""
        rd, W, rng = self.dut.dma_rd.rd, self.W, self.rng
        while True:
            ready = [i for i, q in enumerate(self._rd_q) if q[0] <= self.now
                     and all(p[1] != q[1] for p in self._rd_q[:i])]
            if not self.reorder:
                ready = [0] if ready[:1] == [0] else []
            if not ready:
                ctx.set(rd.valid, 0)
                await ctx.tick()
                continue
            pick = rng.choice(ready)
            self.reordered += pick != 0
            _, c, a, ln, t = self._rd_q.pop(pick)
            data, err = host_bytes(a, ln), int(rd_fails(a, ln))
            nb = -(-ln // W)
            for b in range(nb):
                while rng.random() < 0.2:
                    ctx.set(rd.valid, 0)
                    await ctx.tick()
                chunk = data[b * W:(b + 1) * W]
                ctx.set(rd.payload, {"data": int.from_bytes(chunk, "little"), "nbytes": len(chunk),
                                     "last": b == nb - 1, "tag": t, "err": err})
                ctx.set(rd.valid, 1)
                await tick_until(ctx, rd.ready)
            ctx.set(rd.valid, 0)

    async def serve_done(self, ctx):
        done = self.dut.dma_wr.done
        while True:
            if self._done_q and self._done_q[0][0] <= self.now:
                _, t, err = self._done_q.pop(0)
                ctx.set(done.payload, {"tag": t, "err": err})
                ctx.set(done.valid, 1)
            else:
                ctx.set(done.valid, 0)
            await ctx.tick()

    # ---- run and check
    def run(self, max_cycles=10_000):
        sim = Simulator(self.dut)
        sim.add_clock(1e-8)
        for c in range(self.n):
            for proc in self._client(c):
                sim.add_testbench(proc, background=True)
        for proc in (self.serve_front, self.serve_rd, self.serve_done):
            sim.add_testbench(proc, background=True)

        def finished():
            return all(len(self.got_rd[c]) == len(self.reads[c])
                       and len(self.got_wr[c]) == len(self.writes[c]) for c in range(self.n))

        async def main(ctx):
            for _ in range(max_cycles):
                if finished():
                    break
                await ctx.tick()
            assert finished(), (f"stuck: reads {[len(g) for g in self.got_rd]}, writes "
                                f"{[len(g) for g in self.got_wr]} answered")
            await ctx.tick().repeat(50)         # nothing more may arrive
        sim.add_testbench(main)
        sim.run()
        self.check()

    def check(self):
        assert self.errors == []
        for c in range(self.n):
            assert self.host_rd[c] == self.reads[c], f"reads of client {c} at the host"
            assert self.got_rd[c] == [(t, host_bytes(a, ln), int(rd_fails(a, ln)))
                                      for a, ln, t in self.reads[c]], f"answers to client {c}"
            assert self.host_wr[c] == self.writes[c], f"writes of client {c} at the host"
            assert self.got_wr[c] == [(t, int(wr_fails(a))) for a, _, t in self.writes[c]]
        assert any(e for _, _, e in sum(self.got_rd, [])), "no read failed: test too weak"
        assert any(e for _, e in sum(self.got_wr, [])), "no write failed: test too weak"
        for grants in (self.rd_grants, self.wr_grants):
            assert self.n == 1 or any(len(w) > 1 for _, w in grants), "no contention"
            last = self.n - 1
            for g, (c, waiting) in enumerate(grants):
                # round robin: the first client after the last grant that was asking
                want = next(k % self.n for k in range(last + 1, last + 1 + self.n)
                            if k % self.n in waiting)
                assert c == want, f"grant {g} went to {c}, not {want} (asking: {waiting})"
                if g and grants[g - 1][0] == c:
                    assert waiting == {c}, f"grant {g}: {c} twice while {waiting} waited"
                last = c


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("W", [8, 64])
def test_random_traffic(n, W):
    Bench(n, W, seed=100 * n + W).run()


def test_answers_out_of_order_between_clients():
    """Answers to different clients come back in any order: routed by tag alone."""
    b = Bench(3, 8, seed=7, reorder=True, lat=(1, 30))
    b.run()
    assert b.reordered > 10


def test_single_client():
    Bench(1, 8, seed=3, n_rd=30, n_wr=30).run()


@pytest.mark.parametrize("n, W", [(2, 8), (3, 8), (3, 64)])
def test_round_robin_when_all_ask(n, W):
    """Every client always has a request: grants go 0, 1, .., n-1, 0, 1, .."""
    b = Bench(n, W, seed=11 * n + W, p_client=1.0, p_host=0.5, n_rd=24, n_wr=16)
    b.run()
    for grants, count in ((b.rd_grants, 24), (b.wr_grants, 16)):
        clients = [c for c, _ in grants]
        assert clients[:n * count] == list(range(n)) * count


@pytest.mark.parametrize("kw, msg", [
    (dict(n=5, data_bytes=8), "n must be an integer in [1, 4], not 5"),
    (dict(n=0, data_bytes=8), "n must be an integer in [1, 4], not 0"),
    (dict(n=True, data_bytes=8), "n must be an integer in [1, 4], not True"),
    (dict(n=2, data_bytes=48), "data_bytes must be a power of two in [8, 64], not 48"),
    (dict(n=2, data_bytes=4), "data_bytes must be a power of two in [8, 64], not 4"),
    (dict(n=2, data_bytes=128), "data_bytes must be a power of two in [8, 64], not 128"),
])
def test_bad_parameters(kw, msg):
    with pytest.raises(ValueError, match=re.escape(msg)):
        IcmPort(**kw)
