"""hw/ctx/rq_prefetch.py against a Python model of the receive queues.

A driver posts receive WQEs (new random contents written into the host ring, then the
producer index and a kick, as the responder's doorbell path does), consumes them in order per
QP through ``get`` as the responder does (random QP, random answer back-pressure), resets
QPs (the ring is rewritten at once: nothing posted survives a reset) and lets the host fail
the reads of some ring slots. Every answer must be the WQE that was posted at that index,
or an error for a failing slot; a consumed slot is reposted with new contents at once, so a
stale copy, a read of a slot not yet posted, or a fill that survived a reset is caught.
"""

import random

import pytest
from amaranth.hdl import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.sim import Simulator

from hw.config import NicConfig
from hw.ctx.rq_prefetch import RqPrefetch
from hw.formats import RECV_WQE_BYTES
from sim.host import HostMemory
from tests.hw.dma_models import PortMemorySim

LOG = 2                 # 4 receive WQEs per QP
BASE = 0x10000


class Harness(wiring.Component):
    """The prefetcher with the responder's producer-index memory beside it."""

    def __init__(self, cfg):
        self.dut = RqPrefetch(cfg)
        self.pi_we = Signal()
        self.pi_wq = Signal(self.dut.qpn_bits)
        self.pi_wd = Signal(16)
        self.n = cfg.n_qps
        super().__init__({})

    def elaborate(self, platform):
        m = Module()
        m.submodules.dut = dut = self.dut
        m.submodules.pi = pi = Memory(shape=16, depth=self.n, init=[])
        wp = pi.write_port()
        g = pi.read_port(domain="comb")
        k = pi.read_port(domain="comb")
        m.d.comb += [wp.en.eq(self.pi_we), wp.addr.eq(self.pi_wq), wp.data.eq(self.pi_wd),
                     g.addr.eq(dut.pi_g_addr), dut.pi_g.eq(g.data),
                     k.addr.eq(dut.pi_k_addr), dut.pi_k.eq(k.data)]
        return m


def base(q):
    return BASE + q * 0x1000


def run(*, W=64, n=4, cycles=3000, seed=0, p_post=0.3, p_get=0.5, p_reset=0.0,
        p_ready=0.7, lat=(4, 30), bad_slot=None, rq_prefetch=4, start_reset=False,
        reset_base=base):
    """``start_reset``: every QP gets a reset event (with its queue) in the first cycles, as
    the context module sends one at RESET / INIT / RTR; ``reset_base(q)``: the queue base a
    reset event names (a wrong one must never be answered from)."""
    cfg = NicConfig(data_bytes=W, n_qps=n, rq_prefetch=rq_prefetch)
    h = Harness(cfg)
    dut = h.dut
    rng = random.Random(seed)
    mem = HostMemory()
    bad = set()
    if bad_slot is not None:
        q, s = bad_slot
        bad.add(base(q) + s * RECV_WQE_BYTES)
    host = PortMemorySim(W, mem=mem, seed=seed + 1, lat=lat, p_ready=0.8,
                         fail=lambda a, ln, w: a in bad)
    pi = [0] * n
    ci = [0] * n
    posted = [dict() for _ in range(n)]     # idx -> contents posted at that index
    stats = {"gets": 0, "errs": 0, "prefetch": 0, "demand": 0, "wait": 0, "lost": 0}

    def new_wqe(q, idx):
        wr_id = rng.getrandbits(48) << 16 | idx
        data = (wr_id.to_bytes(8, "little") + rng.getrandbits(64).to_bytes(8, "little")
                + rng.getrandbits(32).to_bytes(4, "little") + rng.getrandbits(32).to_bytes(4, "little")
                + bytes(8))
        mem.write(base(q) + (idx % (1 << LOG)) * RECV_WQE_BYTES, data)
        posted[q][idx] = data

    async def tb(ctx):
        get = None              # (q, idx) in flight
        inflight = []           # QP of each read in flight, in order
        for cycle in range(cycles):
            draining = cycle > cycles - 400
            ctx.set(h.pi_we, 0)
            ctx.set(dut.kick.valid, 0)
            ctx.set(dut.reset, 0)
            if start_reset and cycle < n:
                ctx.set(dut.reset, 1)
                ctx.set(dut.reset_qpn, cycle)
                ctx.set(dut.reset_new, 1)
                ctx.set(dut.reset_base, reset_base(cycle))
                ctx.set(dut.reset_log, LOG)
            # a reset (not of the QP with a get in flight); the ring is rewritten at once
            if not draining and rng.random() < p_reset:
                q = rng.randrange(n)
                if get is None or get[0] != q:
                    ctx.set(dut.reset, 1)
                    ctx.set(dut.reset_qpn, q)
                    # a new QP names its queue, a modify keeps the one the row knows
                    ctx.set(dut.reset_new, rng.random() < 0.5)
                    ctx.set(dut.reset_base, reset_base(q))
                    ctx.set(dut.reset_log, LOG)
                    ctx.set(h.pi_we, 1)
                    ctx.set(h.pi_wq, q)
                    ctx.set(h.pi_wd, 0)
                    pi[q] = ci[q] = 0
                    posted[q].clear()
                    for s in range(1 << LOG):
                        mem.write(base(q) + s * RECV_WQE_BYTES, rng.randbytes(RECV_WQE_BYTES))
            elif not draining and rng.random() < p_post:
                q = rng.randrange(n)
                if pi[q] - ci[q] < (1 << LOG):
                    new_wqe(q, pi[q] & 0xFFFF)
                    pi[q] = (pi[q] + 1) & 0xFFFF
                    ctx.set(h.pi_we, 1)
                    ctx.set(h.pi_wq, q)
                    ctx.set(h.pi_wd, pi[q])
                    ctx.set(dut.kick.valid, 1)
                    ctx.set(dut.kick.payload.qpn, q)
            if get is None and not draining and rng.random() < p_get:
                ready = [q for q in range(n) if (pi[q] - ci[q]) & 0xFFFF]
                if ready:
                    q = rng.choice(ready)
                    get = (q, ci[q])
                    ctx.set(dut.get.valid, 1)
                    ctx.set(dut.get.payload, {"qpn": q, "idx": ci[q], "base": base(q), "log": LOG})
            ctx.set(dut.wqe.ready, rng.random() < p_ready)
            _, _, gr, wv, wr, w, sp, sd, sw, sl, qv, qr, qa, dv, dr, dl = await ctx.tick().sample(
                dut.get.ready, dut.wqe.valid, dut.wqe.ready, dut.wqe.payload,
                dut.stat_prefetch, dut.stat_demand, dut.stat_wait, dut.stat_kick_lost,
                dut.dma.req.valid, dut.dma.req.ready, dut.dma.req.payload.addr,
                dut.dma.rd.valid, dut.dma.rd.ready, dut.dma.rd.payload.last)
            # at most one read per QP in flight (its data carries no tag of its own)
            if qv and qr:
                qq = (qa - BASE) // 0x1000
                assert qq not in inflight, f"cycle {cycle}: a second read of QP {qq} in flight"
                inflight.append(qq)
            if dv and dr and dl:
                inflight.pop(0)
            stats["prefetch"] += sp
            stats["demand"] += sd
            stats["wait"] += sw
            stats["lost"] += sl
            if get is not None and gr:
                ctx.set(dut.get.valid, 0)
                get = get + ("answered",)
            if wv and wr:
                assert get is not None and len(get) == 3, f"cycle {cycle}: answer without a get"
                q, idx, _ = get
                slot = base(q) + (idx % (1 << LOG)) * RECV_WQE_BYTES
                if slot in bad:
                    assert w.err, f"cycle {cycle}: QP {q} WQE {idx}: failed read not flagged"
                    stats["errs"] += 1
                else:
                    got = w.wqe.as_value().value.to_bytes(RECV_WQE_BYTES, "little")
                    assert not w.err, f"cycle {cycle}: QP {q} WQE {idx}: unexpected err"
                    assert got == posted[q][idx], \
                        f"cycle {cycle}: QP {q} WQE {idx}: {got.hex()} != {posted[q][idx].hex()}"
                del posted[q][idx]
                ci[q] = (ci[q] + 1) & 0xFFFF
                # the slot may be reposted now: new contents the moment it is posted
                stats["gets"] += 1
                get = None
        assert get is None, "a get was never answered"

    sim = Simulator(h)
    sim.add_clock(1e-8)
    host.clock(sim)
    host.read_port(sim, dut.dma, "rq")
    sim.add_testbench(tb)
    sim.run()
    stats["reads"] = len(host.reads)
    return stats


@pytest.mark.parametrize("W", [8, 64])
def test_against_model(W):
    s = run(W=W, seed=W, cycles=4000)
    assert s["gets"] > 250
    # consumption is slower than posting: most WQEs were read ahead of their get
    assert s["prefetch"] > s["demand"] > 0, s
    assert s["reads"] == s["prefetch"] + s["demand"]


def test_resets_and_failed_reads():
    s = run(seed=3, p_reset=0.01, bad_slot=(1, 2), cycles=5000)
    assert s["gets"] > 300 and s["errs"] > 0, s
    # frequent resets of few QPs against a slow host: reads in flight across a reset
    s = run(n=2, seed=4, p_reset=0.05, lat=(30, 60), p_post=0.6, p_get=0.8)
    assert s["gets"] > 30, s


def test_fast_consumer_and_slow_host():
    """Gets as fast as possible against a slow host: the responder asks for WQEs whose
    prefetch is still in flight (a lookup racing its own fill) and for WQEs not read yet."""
    s = run(seed=5, p_get=1.0, p_ready=1.0, lat=(40, 80), p_post=0.5, rq_prefetch=2)
    assert s["gets"] > 50 and s["wait"] > s["gets"], s


def test_one_qp_in_order():
    s = run(n=2, seed=7, p_post=0.6, p_get=0.2, cycles=4000)
    assert s["gets"] > 200 and s["prefetch"] > 4 * s["demand"], s


def test_bad_config():
    with pytest.raises(TypeError, match="cfg must be a NicConfig"):
        RqPrefetch(4)


def test_reset_event_names_the_queue():
    """A reset event carries the receive queue: the first WQE of a QP is read ahead too."""
    s = run(n=4, seed=8, p_post=0.6, p_get=0.2, cycles=4000, start_reset=True)
    # demand reads left: a get that follows its WQE's doorbell within a few cycles, before
    # the kick was served (gets go before kicks)
    assert s["gets"] > 200 and s["demand"] * 50 < s["gets"], s
    # without the reset events every QP's first WQE is a demand read
    base_line = run(n=4, seed=8, p_post=0.6, p_get=0.2, cycles=4000)
    assert base_line["demand"] >= 4 > s["demand"], (base_line, s)


def test_wrong_queue_is_never_answered():
    """Reset events naming the wrong queue (16 slots off): what the prefetcher reads from
    there is never given to a get (the model checks every answer); each get of a new
    queue position is a demand read of the right slot."""
    s = run(n=4, seed=9, p_post=0.6, p_get=0.2, cycles=3000, start_reset=True,
            reset_base=lambda q: base(q) + 16 * RECV_WQE_BYTES)
    assert s["gets"] > 150 and s["demand"] > 0, s
