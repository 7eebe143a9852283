"""The MR table in ICM behind the MR cache (hw/ctx/mr_cache.py), and the QP-context table
behind the QP-context cache (hw/ctx/qp_cache.py), against a Python model.

The clients (the lookup ports and the SET_MR / SET_QP write stream) drive the cache at random; the
host memory (tests.hw.dma_models.PortMemorySim) answers fills and write-backs with random
latency and back-pressure. Every lookup must return the entry of the last write accepted
before it (the cache takes one request per cycle, so acceptance cycles order them), whether
it hit, missed and was filled from ICM, or was written back and read again.
"""

import random

import pytest

from hw.config import NicConfig
from hw.ctx.mr_cache import MrCache
from hw.ctx.qp_cache import QpCache
from hw.formats import MR_ENTRY
from hw.regmap import MR_ICM_ENTRY_BYTES, QP_CTX, QP_ICM_ENTRY_BYTES
from tests.hw.dma_models import HostMemory, cache_sim

BASE = 0x40_0000


def entry(slot, gen):
    """A distinct, valid MR entry for (slot, generation) as an integer of MR_ENTRY."""
    fields = dict(base=0x1000_0000 + slot * 0x10000 + gen, length=0x1000 + gen,
                  key=(slot << 8) | (gen & 0xFF), pd=1 + slot, access=0xF, valid=1)
    v = 0
    for name, x in fields.items():
        v |= x << MR_ENTRY[name].offset
    return v


def qp_entry(slot, gen):
    """A distinct QP context for (slot, generation) as an integer of QP_CTX."""
    fields = dict(sq_base=0x2000_0000 + slot * 0x10000 + 64 * gen, rq_base=0x3000_0000 + gen,
                  sq_log_size=gen % 16, send_cq=slot, recv_cq=gen & 0x3FF, pd=slot + 1,
                  dest_qpn=(slot << 12) | gen, dest_node=gen & 0xFF, min_rnr_timer=31)
    v = 0
    for name, x in fields.items():
        v |= x << QP_CTX[name].offset
    return v


KINDS = {"mr": (MrCache, "n_mrs", entry, MR_ICM_ENTRY_BYTES),
         "qp": (QpCache, "n_qps", qp_entry, QP_ICM_ENTRY_BYTES)}


def run(cfg, n_ops, seed, fail=None, init=None, p_req=0.5, kind="mr"):
    cls, n_attr, entry_of, entry_bytes = KINDS[kind]
    dut = cls(cfg)
    nl = dut.n_lookups
    rng = random.Random(seed)
    mem = HostMemory()
    for slot, v in (init or {}).items():
        mem.write(BASE + MR_ICM_ENTRY_BYTES * slot, v.to_bytes(MR_ICM_ENTRY_BYTES, "little"))
    sim, dma = cache_sim(dut, cfg.data_bytes, mem=mem, seed=seed + 1, lat=(2, 12),
                         p_ready=0.6, p_gap=0.2, fail=fail)
    n = getattr(cfg, n_attr)
    cur = dict(init or {})          # the model: slot -> entry of the last accepted write
    gen = {}
    log = []                        # (port, slot, got, err, want)
    stats = dict(hit=0, miss=0, evict=0, writeback=0)

    async def tb(ctx):
        ctx.set(dut.base, BASE)
        pend = [None] * nl          # per lookup port: the slot asked for, its expected value
        offer = [None] * nl         # per lookup port: the slot offered on req
        w_offer = None
        done = 0
        cycle = 0
        while done < n_ops or any(p is not None for p in pend):
            for k in range(nl):
                if offer[k] is None and pend[k] is None and done < n_ops and rng.random() < p_req:
                    offer[k] = rng.randrange(n)
                lk = dut.lk[k]
                ctx.set(lk.req.valid, offer[k] is not None)
                ctx.set(lk.req.payload.index, offer[k] or 0)
                ctx.set(lk.resp.ready, rng.random() < 0.7)
            if w_offer is None and done < n_ops and rng.random() < p_req / 3:
                s = rng.randrange(n)
                gen[s] = gen.get(s, 0) + 1
                w_offer = (s, entry_of(s, gen[s]))
            ctx.set(dut.wr.valid, w_offer is not None)
            if w_offer is not None:
                ctx.set(dut.wr.payload.slot, w_offer[0])
                ctx.set(dut.wr.payload.entry.as_value(), w_offer[1])
            await ctx.delay(1e-9)
            # sample (the arbiter grants at most one request this cycle)
            for k in range(nl):
                lk = dut.lk[k]
                if pend[k] is not None and ctx.get(lk.resp.valid) and ctx.get(lk.resp.ready):
                    got = ctx.get(lk.resp.payload.data.as_value())
                    err = ctx.get(lk.resp.payload.err)
                    log.append((k, pend[k][0], got, err, pend[k][1]))
                    pend[k] = None
                    done += 1
                if offer[k] is not None and ctx.get(lk.req.ready):
                    pend[k] = (offer[k], cur.get(offer[k], 0))
                    offer[k] = None
            if w_offer is not None and ctx.get(dut.wr.ready):
                cur[w_offer[0]] = w_offer[1]
                w_offer = None
            for name in stats:
                stats[name] += ctx.get(getattr(dut, f"stat_{name}"))
            await ctx.tick()
            cycle += 1
            assert cycle < 50 * n_ops + 2000, "the cache stopped answering"
        ctx.set(dut.wr.valid, 0)
        for k in range(nl):
            ctx.set(dut.lk[k].req.valid, 0)
        for _ in range(300):        # let the last write-backs finish
            for name in stats:
                stats[name] += ctx.get(getattr(dut, f"stat_{name}"))
            await ctx.tick()

    sim.add_testbench(tb)
    sim.run()
    return log, stats, dma, cur, mem


@pytest.mark.parametrize("sets,ways,policy", [(1, 1, "lru"), (2, 2, "lru"), (2, 2, "plru"),
                                              (4, 2, "lru")])
def test_lookups_see_the_last_write(sets, ways, policy):
    """Small caches (every entry misses and is written back over and over) and one that holds
    the whole table: every lookup answers the last accepted write; ICM holds every entry
    written back; the counters add up."""
    cfg = NicConfig(data_bytes=8, n_mrs=8, mr_cache_sets=sets, mr_cache_ways=ways,
                    mr_cache_policy=policy)
    log, stats, dma, cur, mem = run(cfg, 300, seed=sets * 10 + ways)
    assert len(log) >= 300
    bad = [(k, s, hex(g), hex(w)) for k, s, g, e, w in log if e or g != w]
    assert not bad, bad[:5]
    fills = [r for r in dma.reads if r[0] == "fill"]
    assert all(a == BASE + MR_ICM_ENTRY_BYTES * ((a - BASE) // MR_ICM_ENTRY_BYTES)
               and n == MR_ICM_ENTRY_BYTES for _, a, n, _ in fills)
    assert stats["miss"] >= len(fills)
    assert stats["writeback"] == len([w for w in dma.writes if w[0] == "wb"])
    if sets * ways >= cfg.n_mrs:
        assert stats["evict"] == 0 and stats["writeback"] == 0
    else:
        assert stats["evict"] > 0 and stats["writeback"] > 0
        # an entry written back is in ICM as the cache had it
        for _, a, n, _, ok, data in dma.writes:
            slot = (a - BASE) // MR_ICM_ENTRY_BYTES
            assert ok and n == MR_ICM_ENTRY_BYTES and 0 <= slot < cfg.n_mrs
            assert int.from_bytes(data, "little") >> MR_ENTRY.size == 0     # zero padding


def test_icm_fill_and_failed_fill():
    """Lookups only (no SET_MR): every entry comes from ICM; a failed fill answers err."""
    cfg = NicConfig(data_bytes=8, n_mrs=8, mr_cache_sets=2, mr_cache_ways=1)
    init = {s: entry(s, 0) for s in range(8)}
    dut = MrCache(cfg)
    mem = HostMemory()
    for slot, v in init.items():
        mem.write(BASE + MR_ICM_ENTRY_BYTES * slot, v.to_bytes(MR_ICM_ENTRY_BYTES, "little"))
    failed = []

    def fail(a, n, is_write):
        if not is_write and a == BASE + MR_ICM_ENTRY_BYTES * 5 and not failed:
            failed.append(a)
            return True
        return False

    sim, dma = cache_sim(dut, 8, mem=mem, seed=4, lat=(2, 12), p_ready=0.6, fail=fail)
    got = []

    async def tb(ctx):
        ctx.set(dut.base, BASE)
        lk = dut.lk[1]
        for slot in [0, 1, 0, 5, 5, 2, 3, 2, 7]:
            ctx.set(lk.req.valid, 1)
            ctx.set(lk.req.payload.index, slot)
            while True:
                await ctx.delay(1e-9)
                r = ctx.get(lk.req.ready)
                await ctx.tick()
                if r:
                    break
            ctx.set(lk.req.valid, 0)
            ctx.set(lk.resp.ready, 1)
            while True:
                await ctx.delay(1e-9)
                if ctx.get(lk.resp.valid):
                    got.append((slot, ctx.get(lk.resp.payload.data.as_value()),
                                ctx.get(lk.resp.payload.err)))
                    await ctx.tick()
                    break
                await ctx.tick()
            ctx.set(lk.resp.ready, 0)

    sim.add_testbench(tb)
    sim.run()
    assert [(s, e) for s, _, e in got] == [(0, 0), (1, 0), (0, 0), (5, 1), (5, 0), (2, 0),
                                           (3, 0), (2, 0), (7, 0)]
    assert all(v == init[s] for s, v, e in got if not e)
    assert not [w for w in dma.writes]          # nothing dirty: nothing written back
    # slot 0 hits the second time (sets 2, ways 1: 0 and 1 in different sets)
    assert len([r for r in dma.reads if r[1] == BASE]) == 1


@pytest.mark.parametrize("sets,ways,policy", [(1, 2, "lru"), (2, 2, "plru"), (4, 2, "lru")])
def test_qp_cache_lookups_see_the_last_write(sets, ways, policy):
    """The QP-context cache (four lookup ports: the requester's flush and fetch issue, the
    responder's two lookahead ports; SET_QP writes): every lookup answers the context of the
    last accepted SET_QP, through misses, evictions and write-backs of 32-byte contexts to
    ICM."""
    cfg = NicConfig(data_bytes=8, n_qps=16, qp_cache_sets=sets, qp_cache_ways=ways,
                    qp_cache_policy=policy)
    log, stats, dma, cur, mem = run(cfg, 300, seed=sets * 7 + ways, kind="qp")
    assert len(log) >= 300 and {k for k, *_ in log} == set(range(2 + cfg.rsp_lookahead))
    bad = [(k, s, hex(g), hex(w)) for k, s, g, e, w in log if e or g != w]
    assert not bad, bad[:5]
    assert stats["evict"] > 0 and stats["writeback"] > 0
    for _, a, n, _, ok, data in dma.writes:
        slot = (a - BASE) // QP_ICM_ENTRY_BYTES
        assert ok and n == QP_ICM_ENTRY_BYTES and 0 <= slot < cfg.n_qps
        assert int.from_bytes(data, "little") >> QP_CTX.size == 0      # zero padding
        assert cur.get(slot) is not None
