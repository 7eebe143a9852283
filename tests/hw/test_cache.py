"""hw/lib/cache.py: the set-associative write-back cache, against Python models.

* A sequential client (one request at a time) against a Python model of the same cache:
  every hit and miss, eviction and write-back as the model predicts, for LRU and PLRU.
* A concurrent client with random back-pressure and DMA latency (hit under miss, responses
  out of order): every READ returns the last value written before it, in request order, and
  after invalidating everything host memory holds the final values.
* Directed cases: a lookup racing its own fill, hit under miss, hits back to back (two
  cycles each), capacity (a working set that
  fits hits, a cyclic one larger than a set thrashes LRU), invalidation, DMA errors, a reset
  (the cache is empty after it).
"""

import random

import pytest

from hw.lib.cache import CacheOp, SetAssocCache
from sim.host import HostMemory
from tests.hw.dma_models import cache_sim, tick_until
from tests.hw.port_drivers import Resettable

BASE = 0x10000


class ModelCache:
    """What the cache decides for a sequence of requests taken one at a time."""

    def __init__(self, sets, ways, policy):
        self.sets, self.ways, self.policy = sets, ways, policy
        self.lines = [[None] * ways for _ in range(sets)]       # [key, dirty] or None
        self.ages = [list(range(ways)) for _ in range(sets)]
        self.tree = [[0] * max(ways - 1, 1) for _ in range(sets)]
        self.hits = self.misses = self.evictions = self.writebacks = 0

    def _touch(self, s, w):
        if self.policy == "lru":
            a = self.ages[s]
            mine = a[w]
            for i in range(self.ways):
                if a[i] < mine:
                    a[i] += 1
            a[w] = 0
        elif self.ways > 1:
            levels = self.ways.bit_length() - 1
            node = 1
            for lvl in range(levels):
                right = (w >> (levels - lvl - 1)) & 1
                self.tree[s][node - 1] = 1 - right
                node = 2 * node + right

    def _victim(self, s):
        for i, line in enumerate(self.lines[s]):
            if line is None:
                return i
        if self.ways == 1:
            return 0
        if self.policy == "lru":
            return max(range(self.ways), key=lambda i: (self.ages[s][i], -i))
        node = 1
        while node < self.ways:
            node = 2 * node + self.tree[s][node - 1]
        return node - self.ways

    def access(self, op, key):
        """Returns (hit, wrote_back)."""
        s = key % self.sets
        lines = self.lines[s]
        w = next((i for i, l in enumerate(lines) if l is not None and l[0] == key), None)
        if op == CacheOp.INVAL:
            if w is None:
                return False, False
            dirty = lines[w][1]
            lines[w] = None
            self.writebacks += dirty
            return True, dirty
        if w is not None:
            self.hits += 1
            if op == CacheOp.WRITE:
                lines[w][1] = True
            self._touch(s, w)
            return True, False
        self.misses += 1
        v = self._victim(s)
        wrote = False
        if lines[v] is not None:
            self.evictions += 1
            wrote = lines[v][1]
            self.writebacks += wrote
        lines[v] = [key, op == CacheOp.WRITE]
        self._touch(s, v)
        return False, wrote


def run_cache(ops, *, sets=4, ways=2, policy="lru", mshrs=2, entry_bytes=16, data_bytes=8,
              key_bits=8, seed=0, sequential=False, lat=(3, 30), p_ready=0.7, p_req=0.7,
              fail=None, mem=None, max_cycles=40000, addr_of=None):
    """Run ``ops`` [(op, key, value)] through a cache; returns (responses in arrival order
    [(id, op, hit, err, value, cycle)], counters, the PortMemorySim)."""
    dut = SetAssocCache(entry_bytes=entry_bytes, key_bits=key_bits, sets=sets, ways=ways,
                        policy=policy, mshrs=mshrs, data_bytes=data_bytes, id_bits=12,
                        addressed=addr_of is not None)
    rng = random.Random(seed)
    mem = HostMemory() if mem is None else mem
    sim, dma = cache_sim(dut, data_bytes, mem=mem, seed=seed + 1, lat=lat, p_ready=p_ready,
                         p_gap=0.2, fail=fail)
    got = []
    counters = {}

    async def client(ctx):
        ctx.set(dut.base, BASE)
        for i, (op, key, value, *last) in enumerate(ops):
            while rng.random() > p_req:
                await ctx.tick()
            ctx.set(dut.req.payload, {"op": op, "key": key, "id": i, "data": value,
                                      "last": last[0] if last else 0,
                                      **({"addr": addr_of(key)} if addr_of else {})})
            ctx.set(dut.req.valid, 1)
            while True:
                _, _, r = await ctx.tick().sample(dut.req.ready)
                if r:
                    break
            ctx.set(dut.req.valid, 0)
            if sequential:
                while len(got) <= i:
                    await ctx.tick()

    async def sink(ctx):
        cycle = 0
        while len(got) < len(ops) and cycle < max_cycles:
            r = sequential or rng.random() < p_ready
            ctx.set(dut.resp.ready, r)
            _, _, v, p = await ctx.tick().sample(dut.resp.valid, dut.resp.payload)
            cycle += 1
            if v and r:
                got.append((p.id, CacheOp(p.op), int(p.hit), int(p.err), int(p.data), cycle))
        for _ in range(200):            # let the last write-backs finish
            await ctx.tick()
        for name in ("hits", "misses", "evictions", "writebacks", "stalls", "fill_errors",
                     "wb_errors", "rd_bytes", "wr_bytes"):
            counters[name] = ctx.get(getattr(dut, name))

    sim.add_testbench(client, background=True)
    sim.add_testbench(sink)
    sim.run()
    assert len(got) == len(ops), f"only {len(got)} of {len(ops)} requests answered"
    return got, counters, dma


def expected_values(ops, mem_init):
    """Per request index: the value a READ must return (the last WRITE before it in request
    order, else host memory); and the final value of every key."""
    cur = dict(mem_init)
    want = {}
    for i, (op, key, value) in enumerate(ops):
        if op == CacheOp.READ:
            want[i] = cur.get(key, 0)
        elif op == CacheOp.WRITE:
            cur[key] = value
    return want, cur


def fill_memory(mem, keys, entry_bytes, rng):
    init = {}
    for k in keys:
        init[k] = rng.getrandbits(8 * entry_bytes)
        mem.write(BASE + k * entry_bytes, init[k].to_bytes(entry_bytes, "little"))
    return init


def random_ops(rng, n, keys, entry_bytes, p_write=0.35):
    ops = []
    for _ in range(n):
        op = CacheOp.WRITE if rng.random() < p_write else CacheOp.READ
        ops.append((op, rng.choice(keys), rng.getrandbits(8 * entry_bytes)))
    return ops


def test_parameters_are_checked():
    ok = dict(entry_bytes=16, key_bits=8, sets=4, ways=2)
    cases = [
        (dict(entry_bytes=24), "entry_bytes must be a power of two in [1, 4096], not 24"),
        (dict(sets=3), "sets must be a power of two in [1, 256], not 3"),
        (dict(sets=512), "sets must be a power of two in [1, 256], not 512"),
        (dict(ways=0), "ways must be an integer in [1, 16], not 0"),
        (dict(ways=3, policy="plru"), "ways must be a power of two in [1, 16], not 3"),
        (dict(policy="fifo"), "policy must be one of ('lru', 'plru'), not 'fifo'"),
        (dict(mshrs=17), "mshrs must be an integer in [1, 16], not 17"),
        (dict(data_bytes=12), "data_bytes must be a power of two in [1, 256], not 12"),
    ]
    for bad, msg in cases:
        with pytest.raises(ValueError) as e:
            SetAssocCache(**{**ok, **bad})
        assert str(e.value) == msg


@pytest.mark.parametrize("policy,ways,sets", [
    ("lru", 1, 4), ("lru", 2, 2), ("lru", 3, 2), ("lru", 4, 1),
    ("plru", 2, 2), ("plru", 4, 2),
])
def test_sequential_matches_policy_model(policy, ways, sets):
    """One request at a time: each hit / miss and the counters as the model predicts, data
    as written."""
    rng = random.Random(ways * 10 + sets)
    keys = list(range(3 * sets * ways))
    mem = HostMemory()
    init = fill_memory(mem, keys, 16, rng)
    ops = random_ops(rng, 120, keys, 16)
    ops += [(CacheOp.INVAL, k, 0) for k in keys]
    got, c, dma = run_cache(ops, sets=sets, ways=ways, policy=policy, sequential=True,
                            seed=ways, mem=mem)
    model = ModelCache(sets, ways, policy)
    want, final = expected_values(ops, init)
    wrote = 0
    for (i, op, hit, err, value, _), (mop, key, _) in zip(got, ops):
        assert op == mop and err == 0
        mhit, mwrote = model.access(mop, key)
        wrote += mwrote
        assert hit == mhit, f"request {i} ({mop.name} {key}): hit {hit}, model {mhit}"
        if op == CacheOp.READ:
            assert value == want[i]
    assert (c["hits"], c["misses"], c["evictions"], c["writebacks"]) == \
        (model.hits, model.misses, model.evictions, model.writebacks)
    assert c["rd_bytes"] == 16 * sum(1 for g in got if g[1] == CacheOp.READ and not g[2])
    assert c["wr_bytes"] == 16 * c["writebacks"] == 16 * wrote
    for k in keys:
        assert mem.read_int(BASE + 16 * k, 16) == final[k]
    assert model.evictions > 10 and model.hits > 10


@pytest.mark.parametrize("policy,ways,mshrs,entry_bytes,data_bytes", [
    ("lru", 2, 4, 16, 8), ("plru", 4, 2, 64, 16), ("lru", 1, 1, 8, 32), ("lru", 3, 3, 32, 8),
])
def test_concurrent_out_of_order_against_memory_model(policy, ways, mshrs, entry_bytes,
                                                      data_bytes):
    """Requests back to back under random back-pressure and latency: every READ returns the
    last value written before it; afterwards host memory holds every final value."""
    rng = random.Random(mshrs * 7 + ways)
    keys = list(range(24))
    mem = HostMemory()
    init = fill_memory(mem, keys, entry_bytes, rng)
    ops = random_ops(rng, 300, keys, entry_bytes)
    ops += [(CacheOp.INVAL, k, 0) for k in keys]
    got, c, dma = run_cache(ops, sets=4, ways=ways, policy=policy, mshrs=mshrs,
                            entry_bytes=entry_bytes, data_bytes=data_bytes, seed=mshrs,
                            mem=mem, lat=(2, 40))
    want, final = expected_values(ops, init)
    assert sorted(g[0] for g in got) == list(range(len(ops)))
    for i, op, hit, err, value, _ in got:
        assert op == ops[i][0] and err == 0
        if op == CacheOp.READ:
            assert value == want[i], f"request {i}: READ {ops[i][1]}"
    for k in keys:
        assert mem.read_int(BASE + entry_bytes * k, entry_bytes) == final[k]
    rw = sum(1 for o in ops if o[0] != CacheOp.INVAL)
    assert c["hits"] + c["misses"] == rw
    fills = sum(1 for g in got if g[1] == CacheOp.READ and not g[2])
    assert c["rd_bytes"] == entry_bytes * fills == entry_bytes * len(dma.reads)
    assert c["wr_bytes"] == entry_bytes * c["writebacks"] == entry_bytes * len(dma.writes)
    order = [g[0] for g in got]
    if mshrs > 1:
        assert order != sorted(order), "hit under miss: some response overtakes another"


def test_lookup_racing_its_own_fill():
    """A second READ of a key whose fill is on its way waits for it and hits; one DMA read."""
    mem = HostMemory()
    mem.write(BASE + 5 * 16, (1234).to_bytes(16, "little"))
    ops = [(CacheOp.READ, 5, 0), (CacheOp.READ, 5, 0), (CacheOp.WRITE, 5, 77),
           (CacheOp.READ, 5, 0)]
    got, c, dma = run_cache(ops, mem=mem, lat=(60, 60), p_req=1.0, p_ready=1.0)
    assert [(g[0], g[2], g[4]) for g in got] == [(0, 0, 1234), (1, 1, 1234), (2, 1, 0),
                                                  (3, 1, 77)]
    assert len(dma.reads) == 1 and c["stalls"] > 0


def test_hit_under_miss():
    """While a fill takes 200 cycles, a READ of a cached key is answered first."""
    mem = HostMemory()
    for k in (1, 2):
        mem.write(BASE + 16 * k, (100 + k).to_bytes(16, "little"))
    ops = [(CacheOp.WRITE, 1, 11), (CacheOp.READ, 2, 0), (CacheOp.READ, 1, 0)]
    got, c, dma = run_cache(ops, mem=mem, lat=(200, 200), p_req=1.0, p_ready=1.0)
    assert [g[0] for g in got] == [0, 2, 1]
    assert got[1][4] == 11 and got[2][4] == 102
    assert got[2][5] > got[1][5] + 150


def test_hits_back_to_back():
    """READ hits and WRITEs, the client always ready: one answer every two cycles (the next
    request's tag row is read while the answer leaves)."""
    ops = [(CacheOp.WRITE, k, 100 + k) for k in range(8)] + \
          [(CacheOp.READ, k, 0) for k in range(8)] * 2
    got, c, _ = run_cache(ops, sets=4, ways=2, p_req=1.0, p_ready=1.0)
    reads = [g for g in got if g[1] == CacheOp.READ]
    assert [g[4] for g in reads] == [100 + k for k in range(8)] * 2 and c["hits"] == 16
    cycles = [g[5] for g in reads]
    assert [b - a for a, b in zip(cycles, cycles[1:])] == [2] * 15
    # the WRITEs before them too (the answer leaves as the next request is taken)
    cycles = [g[5] for g in got if g[1] == CacheOp.WRITE]
    assert [b - a for a, b in zip(cycles, cycles[1:])] == [2] * 7


def test_hit_answers_two_cycles_after_it_was_taken():
    """A READ hit reaches a ready client in the data read's cycle, two cycles after the
    request was taken (no cycle in the answer FIFO); an answer the client does not take
    waits in the FIFO, unchanged, and the next one follows it."""
    dut = SetAssocCache(entry_bytes=16, key_bits=8, sets=4, ways=2, data_bytes=8, id_bits=4)
    sim, _ = cache_sim(dut, 8)
    seen = []

    async def bench(ctx):
        ctx.set(dut.base, BASE)

        async def request(op, key, value, rid):
            ctx.set(dut.req.payload, {"op": op, "key": key, "id": rid, "data": value})
            ctx.set(dut.req.valid, 1)
            await tick_until(ctx, dut.req.ready)
            ctx.set(dut.req.valid, 0)

        ctx.set(dut.resp.ready, 1)
        await request(CacheOp.WRITE, 5, 0x1234, 1)
        await tick_until(ctx, dut.resp.valid)
        await request(CacheOp.READ, 5, 0, 2)
        for n in range(1, 6):
            _, _, v, p = await ctx.tick().sample(dut.resp.valid, dut.resp.payload)
            if v:
                seen.append((n, int(p.id), int(p.data), int(p.hit)))
                break
        # the client holds off: two hits wait in the FIFO and leave in order, unchanged
        ctx.set(dut.resp.ready, 0)
        await request(CacheOp.READ, 5, 0, 3)
        await request(CacheOp.READ, 5, 0, 4)
        for _ in range(6):
            await ctx.tick()
        ctx.set(dut.resp.ready, 1)
        for _ in range(4):
            _, _, v, p = await ctx.tick().sample(dut.resp.valid, dut.resp.payload)
            if v:
                seen.append((None, int(p.id), int(p.data), int(p.hit)))

    sim.add_testbench(bench)
    sim.run()
    assert seen == [(2, 2, 0x1234, 1), (None, 3, 0x1234, 1), (None, 4, 0x1234, 1)]


def test_capacity_fit_and_lru_thrash():
    """A working set that fits (sets x ways keys) misses once per key; a cyclic sweep one
    key larger than a set, with LRU, misses every time (SMART's cache thrashing)."""
    ops = [(CacheOp.READ, k, 0) for k in range(8)] * 4
    got, c, _ = run_cache(ops, sets=4, ways=2, mshrs=1, sequential=True)
    assert c["misses"] == 8 and c["hits"] == 24 and c["evictions"] == 0
    ops = [(CacheOp.READ, 4 * k, 0) for k in range(3)] * 5     # three keys, one 2-way set
    got, c, _ = run_cache(ops, sets=4, ways=2, mshrs=1, sequential=True)
    assert c["hits"] == 0 and c["misses"] == 15 and c["evictions"] == 13


def test_last_use_frees_the_way():
    """A READ marked ``last`` (the entry's last use) frees its way: the next key of the set
    takes it instead of evicting the least recently used live entry. Keys 0 and 4 share a
    2-way set; 0 is read, 4 read last; 8 then misses into 4's way, and 0, the LRU entry,
    still hits. A last READ that misses (12: it evicts 8, the LRU entry) answers with the
    data and leaves the way free, so the next miss of the set evicts nothing and 0 stays;
    a last READ of a dirty entry keeps it."""
    R, W = CacheOp.READ, CacheOp.WRITE
    mem = HostMemory()
    fill_memory(mem, range(16), 16, random.Random(3))
    want = {k: int.from_bytes(mem.read(BASE + 16 * k, 16), "little") for k in range(16)}
    ops = [(R, 0, 0), (R, 4, 0), (R, 4, 0, 1), (R, 8, 0), (R, 0, 0),
           (R, 12, 0, 1), (R, 12, 0), (R, 0, 0), (W, 1, 5), (R, 1, 0, 1), (R, 1, 0)]
    got, c, dma = run_cache(ops, sets=4, ways=2, mshrs=1, sequential=True, mem=mem)
    hits = [g[2] for g in sorted(got)]
    assert hits == [0, 0, 1, 0, 1, 0, 0, 1, 0, 1, 1]
    assert [g[4] for g in sorted(got)][:8] == [want[k] for k in (0, 4, 4, 8, 0, 12, 12, 0)]
    # 8 took the freed way of 4; 12 evicted 8 and left its way free; the second 12 took it
    assert c["evictions"] == 1 and c["misses"] == 6
    assert [g[4] for g in sorted(got)][9:] == [5, 5]


def test_invalidate_writes_back_and_answers_after_the_host_has_it():
    mem = HostMemory()
    ops = [(CacheOp.WRITE, 3, 0xABCD), (CacheOp.INVAL, 3, 0), (CacheOp.INVAL, 3, 0),
           (CacheOp.READ, 3, 0)]
    got, c, dma = run_cache(ops, mem=mem, lat=(50, 50), sequential=True)
    assert [(g[2], g[4]) for g in got] == [(0, 0), (1, 0), (0, 0), (0, 0xABCD)]
    assert c["writebacks"] == 1 and len(dma.reads) == 1
    # the INVAL is answered only after the write-back's done (50 cycles later)
    assert got[1][5] - got[0][5] >= 50


def test_dma_errors():
    """A failed fill answers err and caches nothing (the next READ tries again); a failed
    write-back is counted."""
    bad_read = BASE + 16 * 2
    bad_write = BASE + 16 * 6

    def fail(addr, n, is_write):
        return addr == (bad_write if is_write else bad_read)

    ops = [(CacheOp.READ, 2, 0), (CacheOp.READ, 2, 0), (CacheOp.WRITE, 6, 9),
           (CacheOp.READ, 1, 0), (CacheOp.INVAL, 6, 0), (CacheOp.READ, 6, 0)]
    got, c, dma = run_cache(ops, sets=1, ways=2, sequential=True, fail=fail)
    assert [g[3] for g in got] == [1, 1, 0, 0, 0, 0]
    assert c["fill_errors"] == 2 and c["wb_errors"] == 1
    assert got[5][4] == 0          # the write-back was refused: the host still has 0


@pytest.mark.parametrize("sequential", [True, False])
def test_addressed_fill_cache(sequential):
    """A cache of read-only copies (the WQE cache): FILL installs an entry clean, a miss
    reads it from the address the request names (not base + key * size), nothing is ever
    written back. Hits and misses as the policy model predicts (sequentially); every READ
    returns the host's value."""
    rng = random.Random(5 + sequential)
    keys = list(range(20))
    where = {k: 0x9000_0000 + 0x1000 * rng.randrange(64) + 16 * k for k in keys}
    mem = HostMemory()
    value = {}
    for k in keys:
        value[k] = rng.getrandbits(128)
        mem.write(where[k], value[k].to_bytes(16, "little"))
    ops = [(rng.choice([CacheOp.READ, CacheOp.READ, CacheOp.FILL]), k, 0)
           for k in (rng.choice(keys) for _ in range(200))]
    ops = [(op, k, value[k] if op == CacheOp.FILL else 0) for op, k, _ in ops]
    got, c, dma = run_cache(ops, sets=2, ways=2, seed=3, sequential=sequential, mem=mem,
                            addr_of=lambda k: where[k])
    assert sorted(g[0] for g in got) == list(range(len(ops)))
    for i, op, hit, err, v, _ in got:
        assert op == ops[i][0] and err == 0
        if op == CacheOp.READ:
            assert v == value[ops[i][1]], f"request {i}"
    assert dma.writes == [] and c["writebacks"] == 0 and c["wr_bytes"] == 0
    assert {a for _, a, _, _ in dma.reads} <= set(where.values()) and dma.reads
    assert c["evictions"] > 10
    if sequential:
        model = ModelCache(2, 2, "lru")
        for (i, op, hit, *_), (mop, key, _) in zip(got, ops):
            assert hit == model.access(mop, key)[0], f"request {i}"
        assert (c["hits"], c["misses"], c["evictions"]) == \
            (model.hits, model.misses, model.evictions) and model.writebacks == 0


def test_reset_empties_the_cache():
    """A reset empties the cache although its tag and line memories keep their contents: a
    dirty entry written before the reset is neither hit nor written back after it (the NIC's
    context caches after a system reset: the driver maps ICM again and rewrites its
    contexts), and a read of its key fills from host memory."""
    cache = SetAssocCache(entry_bytes=16, key_bits=8, sets=4, ways=2, policy="lru", mshrs=2,
                          data_bytes=8, id_bits=4)
    dut = Resettable(cache)
    mem = HostMemory()
    mem.write(BASE + 16 * 3, (555).to_bytes(16, "little"))
    sim, dma = cache_sim(dut, 8, mem=mem, seed=3, lat=(5, 10), p_ready=1.0, p_gap=0.0)
    got = []

    async def request(ctx, op, key, value=0):
        ctx.set(dut.req.payload, {"op": op, "key": key, "id": len(got), "data": value})
        ctx.set(dut.req.valid, 1)
        await tick_until(ctx, dut.req.ready)
        ctx.set(dut.req.valid, 0)
        ctx.set(dut.resp.ready, 1)
        while True:     # the response taken at an edge is the one sampled there
            _, _, valid, p = await ctx.tick().sample(dut.resp.valid, dut.resp.payload)
            if valid:
                break
        got.append((int(p.hit), int(p.data)))
        ctx.set(dut.resp.ready, 0)

    async def tb(ctx):
        ctx.set(dut.base, BASE)
        await request(ctx, CacheOp.WRITE, 3, 777)        # dirty, never written back
        await request(ctx, CacheOp.WRITE, 7, 888)        # same set, the other way
        await request(ctx, CacheOp.READ, 3)
        assert got[-1] == (1, 777)
        ctx.set(dut.rst, 1)
        await ctx.tick()
        ctx.set(dut.rst, 0)
        ctx.set(dut.base, BASE)
        await request(ctx, CacheOp.READ, 3)
        assert got[-1] == (0, 555), "after a reset the key misses and fills from the host"
        for k in (11, 15, 19):                           # the set fills and evicts
            await request(ctx, CacheOp.READ, k)
        for _ in range(100):
            await ctx.tick()

    sim.add_testbench(tb)
    sim.run()
    assert [a for a, *_ in dma.writes] == [], "no stale dirty entry was written back"
    assert len(dma.reads) == 4
