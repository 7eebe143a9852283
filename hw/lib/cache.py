"""Set-associative write-back cache of fixed-size entries that live in host memory.

Models the on-NIC caches of a ConnectX-style RNIC: context (QP, CQ, MR) lives in a region of
host memory the driver hands to the NIC (ICM), entry ``k`` at ``base + k * entry_bytes``;
the NIC keeps the entries it uses in a small on-chip cache, and a miss becomes a DMA read
over the host interface (SMART, ASPLOS 2024, section 3.2: "NIC cache thrashing"; the
ConnectX PRM calls the region Interconnect Context Memory).

Structure (one entry is one cache line):

* **Tag memory**: one row per set (``lib.memory.Memory``, registered read port) holding, for
  every way, ``valid``, ``dirty``, ``pending`` (a fill is on its way) and the tag, plus the
  set's replacement state: true LRU (an age per way, a permutation of ``0 .. ways-1``) or
  tree pseudo-LRU (``ways - 1`` bits, ``ways`` a power of two).
* **Data memory**: ``sets * ways`` entries, registered read port.
* **MSHRs** (miss status holding registers, ``mshrs`` of them): a READ that misses reserves
  its victim way (``pending``), issues one DMA read of the entry and leaves; the cache goes
  on serving other requests (hit under miss). The fill is assembled in a buffer and
  installed between two requests; the response then leaves, so responses come back out of
  request order and carry the client's ``id``.
* **Write-back buffer**: evicting a dirty entry copies it into a buffer that a DMA write
  empties; the victim way is free at once.

Requests are taken one at a time by one state machine, so the memories see no hazard (each
request reads a tag row and writes it back before the next is looked at). A READ hit, a
WRITE, a FILL and an INVAL of a clean entry take two cycles of the state machine each (the
tag compare, then the data read or the answer, in whose cycle the next request's tag row is
read); a READ hit answers two cycles after it was taken (in the data read's cycle, if no
earlier answer waits and the client is ready). Answers the client does not take at once
wait in a FIFO (``RESP_DEPTH``), so the cache goes on while a client has not taken its
answer yet (it takes a request only while its answer will have room). A request that
cannot go on *waits at the head of the queue* (counted in ``stalls``, one per retry): a READ
or WRITE or INVAL of a key whose fill is still pending (a lookup racing its own fill: it
hits once the fill is installed), a miss of a key still in the write-back buffer (its host
copy is not written yet), a miss when every MSHR or every way of the set is pending, a dirty
eviction while the write-back buffer is busy, a miss while the DMA read request slot is
still full.

Operations (``req.op``):

* ``READ``: respond with the entry (``hit`` says whether it was in the cache). With
  ``req.last`` set the client says this is the entry's last use (a WQE whose message
  completes with this response): a clean entry's way is freed after the read (a hit) or
  once the fill has answered (a miss), so that it is the next victim of its set instead
  of a live entry the policy would pick (an entry still needed but least recently used:
  the oldest outstanding request's WQE). A dirty entry is kept.
* ``WRITE``: write the whole entry (no fill on a miss: the line is allocated and written),
  mark it dirty; respond without data.
* ``INVAL``: write the entry back if it is dirty and drop it (a QP destroyed or modified by
  the driver behind the cache); respond without data.
* ``FILL``: install the whole entry *clean* (a copy of what host memory holds, arrived by
  another path: a WQE that came by BlueFlame or by the requester's own fetch); on a hit
  the data are replaced and the dirty bit kept. Respond without data.

With ``addressed=True`` a request also carries ``addr``, the host address a miss reads the
entry from (instead of ``base + key * entry_bytes``): for entries whose place in host memory
is not a function of the key alone (a WQE in its QP's send queue). Such a cache holds
read-only copies: ``WRITE`` is not used with it (a dirty entry would be written back to
``base + key * entry_bytes``).

Victim choice: the lowest invalid way that is not pending; otherwise the policy's choice
(LRU: the oldest way not pending; PLRU: the way the tree points at, or the lowest way not
pending if that one is pending). Every READ hit, WRITE and miss touches its way.

A DMA error on a fill answers the READ with ``err`` and frees the way; an error on a
write-back is counted (``wb_errors``): the host refused the data, the model reports it.

Parameters: ``entry_bytes`` (a power of two in [1, 4096]), ``key_bits`` in [1, 32],
``sets`` (a power of two in [1, 65536], at most ``2**key_bits``), ``ways`` in [1, 16] (a
power of two for ``"plru"``), ``policy`` (``"lru"`` or ``"plru"``), ``mshrs`` in [1, 16],
``data_bytes`` (the DMA data width, a power of two in [1, 256]), ``id_bits`` in [1, 16].

Ports: ``base: In(64)``; ``req: In(stream of {op, key, id, data, last})``; ``resp: Out(stream of
{op, id, hit, err, data})``; ``dma_rd: Out(DmaReadPort(data_bytes))``; ``dma_wr:
Out(DmaWritePort(data_bytes))``; counters ``hits``, ``misses``, ``evictions``,
``writebacks``, ``stalls``, ``fill_errors``, ``wb_errors``, ``rd_bytes``, ``wr_bytes``
(``Out(32)`` each); ``stat_busy: Out(1)``, high in every cycle the state machine is not idle
(its occupancy: one request at a time, so a cache whose busy cycles near the elapsed
cycles is a bound).
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal, unsigned
from amaranth.lib import data, enum, stream, wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import bits_for, ceil_log2, exact_log2

from ..interfaces import DmaReadPort, DmaWritePort
from .checks import check_int, check_pow2

__all__ = ["CacheOp", "SetAssocCache", "COUNTERS", "POLICIES"]

POLICIES = ("lru", "plru")
#: Responses queued for the clients (the cache goes on while they wait to be taken).
RESP_DEPTH = 4
COUNTERS = ("hits", "misses", "evictions", "writebacks", "stalls", "fill_errors", "wb_errors",
            "rd_bytes", "wr_bytes")


class CacheOp(enum.Enum, shape=2):
    READ = 0
    WRITE = 1
    INVAL = 2
    FILL = 3


class SetAssocCache(wiring.Component):
    def __init__(self, *, entry_bytes, key_bits, sets, ways, policy="lru", mshrs=2,
                 data_bytes=8, id_bits=8, addressed=False):
        check_pow2("entry_bytes", entry_bytes, 1, 4096)
        check_int("key_bits", key_bits, 1, 32)
        check_pow2("sets", sets, 1, min(1 << 16, 1 << key_bits))
        check_int("ways", ways, 1, 16)
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, not {policy!r}")
        if policy == "plru":
            check_pow2("ways", ways, 1, 16)
        check_int("mshrs", mshrs, 1, 16)
        check_pow2("data_bytes", data_bytes, 1, 256)
        check_int("id_bits", id_bits, 1, 16)
        self.entry_bytes, self.key_bits, self.sets, self.ways = entry_bytes, key_bits, sets, ways
        self.policy, self.mshrs, self.data_bytes, self.id_bits = policy, mshrs, data_bytes, id_bits
        self.set_bits = exact_log2(sets)
        self.tag_bits = max(key_bits - self.set_bits, 1)
        self.nbeats = -(-entry_bytes // data_bytes)
        entry_bits = 8 * entry_bytes
        if not isinstance(addressed, bool):
            raise ValueError(f"addressed must be True or False, not {addressed!r}")
        self.addressed = addressed
        self.req_layout = data.StructLayout({
            "op": CacheOp, "key": key_bits, "id": id_bits, "data": entry_bits, "last": 1,
            **({"addr": 64} if addressed else {})})
        self.resp_layout = data.StructLayout({
            "op": CacheOp, "id": id_bits, "hit": 1, "err": 1, "data": entry_bits})
        self.way_layout = data.StructLayout({
            "valid": 1, "dirty": 1, "pending": 1, "tag": self.tag_bits})
        if ways == 1:
            repl_bits = 1
        elif policy == "lru":
            repl_bits = ways * ceil_log2(ways)
        else:
            repl_bits = ways - 1
        self.row_layout = data.StructLayout({
            "ways": data.ArrayLayout(self.way_layout, ways), "repl": repl_bits})
        super().__init__({
            "base": In(64),
            "req": In(stream.Signature(self.req_layout)),
            "resp": Out(stream.Signature(self.resp_layout)),
            "dma_rd": Out(DmaReadPort(data_bytes)),
            "dma_wr": Out(DmaWritePort(data_bytes)),
            **{name: Out(32) for name in COUNTERS},
            "stat_busy": Out(1),
        })

    # -- replacement state ----------------------------------------------------------------
    def _age_bits(self):
        return ceil_log2(self.ways)

    def _initial_repl(self):
        if self.ways > 1 and self.policy == "lru":      # ages 0, 1, ..., ways-1: a permutation
            ab = self._age_bits()
            return sum(i << (i * ab) for i in range(self.ways))
        return 0

    def _touch(self, repl, way):
        """The replacement state after an access to ``way`` (a Value)."""
        n = self.ways
        if n == 1:
            return repl
        if self.policy == "lru":
            ab = self._age_bits()
            ages = [repl[i * ab:(i + 1) * ab] for i in range(n)]
            cur = Const(0, ab)
            for i in range(n):
                cur = Mux(way == i, ages[i], cur)
            new = []
            for i in range(n):
                new.append(Mux(way == i, 0, Mux(ages[i] < cur, ages[i] + 1, ages[i]))[:ab])
            return Cat(*new)
        # Tree PLRU, heap order: node 1 is the root, node j's children are 2j and 2j+1;
        # bit j-1 says which child to evict next (0 left, 1 right). A touch points every node
        # on the way's path away from it.
        bits = [repl[j] for j in range(n - 1)]
        levels = exact_log2(n)
        for lvl in range(levels):
            # the node at depth lvl on the path to `way`: 1 << lvl plus the way's top bits
            for j in range(1 << lvl, 2 << lvl):
                on_path = (way >> (levels - lvl)) == (j - (1 << lvl))
                went_right = way[levels - lvl - 1]
                bits[j - 1] = Mux(on_path, ~went_right, bits[j - 1])
        return Cat(*bits)

    def _victim(self, m, row, usable):
        """(way, any): the way to replace among ``usable`` (a bit per way) and whether one is."""
        n = self.ways
        wb = max(bits_for(n - 1), 1)
        free = Signal(n)
        m.d.comb += free.eq(Cat(*[usable[i] & ~row.ways[i].valid for i in range(n)]))
        first_free = Const(0, wb)
        first_usable = Const(0, wb)
        for i in reversed(range(n)):
            first_free = Mux(free[i], i, first_free)
            first_usable = Mux(usable[i], i, first_usable)
        if n == 1:
            choice = Const(0, wb)
        elif self.policy == "lru":
            ab = self._age_bits()
            best, best_age, found = Const(0, wb), Const(0, ab), Const(0, 1)
            for i in range(n):
                age = row.repl[i * ab:(i + 1) * ab]
                better = usable[i] & (~found | (age > best_age))
                best = Mux(better, i, best)
                best_age = Mux(better, age, best_age)
                found = found | usable[i]
            choice = best
        else:
            node = Const(1, wb + 1)
            for _ in range(exact_log2(n)):
                bit = Const(0, 1)
                for j in range(1, n):
                    bit = Mux(node == j, row.repl[j - 1], bit)
                node = Cat(bit, node)[:wb + 1]
            leaf = Signal(wb)
            m.d.comb += leaf.eq(node - n)
            choice = Mux(usable.bit_select(leaf, 1), leaf, first_usable)
        way = Signal(wb)
        m.d.comb += way.eq(Mux(free.any(), first_free, choice))
        return way, usable.any()

    # -- logic ----------------------------------------------------------------------------
    def elaborate(self, platform):
        m = Module()
        n, W = self.ways, self.data_bytes
        entry_bits = 8 * self.entry_bytes
        wb = max(bits_for(n - 1), 1)
        sb = self.set_bits
        mb = max(bits_for(self.mshrs - 1), 1)
        ebits = exact_log2(self.entry_bytes)
        nbeats = self.nbeats
        beat_bytes = min(W, self.entry_bytes)

        init_row = {"repl": self._initial_repl()}
        m.submodules.tags = tags = Memory(shape=self.row_layout, depth=self.sets,
                                          init=[init_row] * self.sets)
        tag_rd = tags.read_port(transparent_for=())
        tag_wr = tags.write_port()
        m.submodules.lines = lines = Memory(shape=unsigned(entry_bits), depth=self.sets * n,
                                            init=[])
        line_rd = lines.read_port(transparent_for=())
        line_wr = lines.write_port()

        def set_of(key):
            return key[:sb] if sb else Const(0, 1)

        def tag_of(key):
            return (key >> sb)[:self.tag_bits]

        def slot(set_, way):
            return (set_ * n + way)[:max(ceil_log2(self.sets * n), 1)]

        # The request being worked on (taken from `req`, kept while it waits).
        cur = Signal(self.req_layout)
        held = Signal()

        # MSHRs: the key, way and client id of each fill in flight.
        ms_valid = Signal(self.mshrs)
        ms_key = [Signal(self.key_bits, name=f"ms_key{i}") for i in range(self.mshrs)]
        ms_way = [Signal(wb, name=f"ms_way{i}") for i in range(self.mshrs)]
        ms_id = [Signal(self.id_bits, name=f"ms_id{i}") for i in range(self.mshrs)]
        ms_last = Signal(self.mshrs)
        ms_free = Signal(mb)
        for i in reversed(range(self.mshrs)):
            with m.If(~ms_valid[i]):
                m.d.comb += ms_free.eq(i)

        # DMA read request slot.
        rq_valid = Signal()
        rq_addr = Signal(64)
        rq_tag = Signal(mb)
        m.d.comb += [
            self.dma_rd.req.valid.eq(rq_valid),
            self.dma_rd.req.payload.addr.eq(rq_addr),
            self.dma_rd.req.payload.len.eq(self.entry_bytes),
            self.dma_rd.req.payload.tag.eq(rq_tag),
        ]
        with m.If(self.dma_rd.req.valid & self.dma_rd.req.ready):
            m.d.sync += rq_valid.eq(0)

        # Fill buffer: the beats of one read (the beats of a read arrive together).
        fill_buf = Signal(nbeats * 8 * W)
        fill_beat = Signal(range(nbeats + 1))
        fill_err = Signal()
        fill_full = Signal()
        fill_tag = Signal(mb)
        rd = self.dma_rd.rd
        m.d.comb += rd.ready.eq(~fill_full)
        with m.If(rd.valid & rd.ready):
            m.d.sync += [fill_buf.word_select(fill_beat[:max(ceil_log2(nbeats), 1)]
                                              if nbeats > 1 else 0, 8 * W).eq(rd.payload.data),
                         fill_err.eq(fill_err | rd.payload.err),
                         self.rd_bytes.eq(self.rd_bytes + rd.payload.nbytes)]
            with m.If(rd.payload.last):
                m.d.sync += [fill_full.eq(1), fill_tag.eq(rd.payload.tag), fill_beat.eq(0)]
            with m.Else():
                m.d.sync += fill_beat.eq(fill_beat + 1)
        fill_key = Signal(self.key_bits)
        fill_way = Signal(wb)
        fill_id = Signal(self.id_bits)
        fill_last = Signal()
        for i in range(self.mshrs):
            with m.If(fill_tag == i):
                m.d.comb += [fill_key.eq(ms_key[i]), fill_way.eq(ms_way[i]), fill_id.eq(ms_id[i]),
                             fill_last.eq(ms_last[i])]

        # Write-back buffer, emptied by the DMA write port; busy until the host answered.
        wb_busy = Signal()
        wb_send = Signal()
        wb_buf = Signal(nbeats * 8 * W)
        wb_key = Signal(self.key_bits)
        wb_beat = Signal(range(nbeats + 1))
        wr = self.dma_wr.wr
        m.d.comb += [
            wr.valid.eq(wb_send),
            wr.payload.addr.eq(self.base + (wb_key << ebits)),
            wr.payload.len.eq(self.entry_bytes),
            wr.payload.tag.eq(0),
            wr.payload.data.eq(wb_buf.word_select(wb_beat[:max(ceil_log2(nbeats), 1)]
                                                  if nbeats > 1 else 0, 8 * W)),
            wr.payload.nbytes.eq(beat_bytes),
            wr.payload.last.eq(wb_beat == nbeats - 1),
        ]
        with m.If(wr.valid & wr.ready):
            m.d.sync += self.wr_bytes.eq(self.wr_bytes + beat_bytes)
            with m.If(wr.payload.last):
                m.d.sync += [wb_send.eq(0), wb_beat.eq(0)]
            with m.Else():
                m.d.sync += wb_beat.eq(wb_beat + 1)
        with m.If(self.dma_wr.done.valid):
            m.d.sync += wb_busy.eq(0)
            with m.If(self.dma_wr.done.payload.err):
                m.d.sync += self.wb_errors.eq(self.wb_errors + 1)

        # Responses leave through a FIFO (the cache does not wait for the client to take
        # one); ``resp`` holds a response made in LOOK until RESP pushes it. A request or
        # a fill is taken only while the FIFO has room for its response and the one being
        # pushed in the same cycle.
        # A response made while the FIFO is empty and the client is ready goes straight to
        # the client (no cycle in the FIFO): a READ hit answers two cycles after it was taken.
        resp = Signal(self.resp_layout)
        m.submodules.resp_fifo = rfifo = SyncFIFO(width=self.resp_layout.size, depth=RESP_DEPTH)
        push = Signal()                         # a response is made this cycle ...
        push_data = Signal(self.resp_layout)    # ... this one
        bypass = Signal()
        m.d.comb += [bypass.eq(push & ~rfifo.r_rdy & self.resp.ready),
                     self.resp.valid.eq(rfifo.r_rdy | push),
                     self.resp.payload.eq(Mux(rfifo.r_rdy, rfifo.r_data, push_data)),
                     rfifo.r_en.eq(self.resp.ready),
                     rfifo.w_data.eq(push_data), rfifo.w_en.eq(push & ~bypass)]
        room = Signal()
        m.d.comb += room.eq(rfifo.level < RESP_DEPTH - 1)

        # Tag-row decode of the row being looked at (valid one cycle after its read). A
        # memory keeps its contents through a reset: one bit per set, cleared by the reset
        # and set by the set's first tag write, says whether the row has been written since;
        # a row that has not reads as the initial row (every way invalid), so that a reset
        # empties the cache (no stale entry is hit or written back) without a sweep.
        row_ok = Signal(self.sets)
        rd_ok = Signal()
        m.d.sync += rd_ok.eq(row_ok.bit_select(tag_rd.addr, 1))
        with m.If(tag_wr.en):
            m.d.sync += row_ok.bit_select(tag_wr.addr, 1).eq(1)
        row = Signal(self.row_layout)
        m.d.comb += row.eq(Mux(rd_ok, tag_rd.data.as_value(),
                               Const.cast(self.row_layout.const(init_row)).value))
        key = Signal(self.key_bits)
        is_fill = Signal()                      # the row is for an install, not a request
        hit_v = Signal(n)
        pend_v = Signal(n)
        dirty_v = Signal(n)
        usable = Signal(n)
        hit_way = Signal(wb)
        m.d.comb += [
            hit_v.eq(Cat(*[row.ways[i].valid & (row.ways[i].tag == tag_of(key))
                           for i in range(n)])),
            pend_v.eq(Cat(*[row.ways[i].pending & (row.ways[i].tag == tag_of(key))
                            for i in range(n)])),
            usable.eq(Cat(*[~row.ways[i].pending for i in range(n)])),
            dirty_v.eq(Cat(*[row.ways[i].dirty for i in range(n)])),
        ]
        for i in reversed(range(n)):
            with m.If(hit_v[i]):
                m.d.comb += hit_way.eq(i)
        victim, any_usable = self._victim(m, row, usable)
        vic = Signal(self.way_layout)
        for i in range(n):
            with m.If(victim == i):
                m.d.comb += vic.eq(row.ways[i])
        vic_key = Signal(self.key_bits)
        m.d.comb += vic_key.eq(Cat(set_of(key), vic.tag) if sb else vic.tag)

        new_row = Signal(self.row_layout)
        m.d.comb += [new_row.eq(row), tag_wr.data.eq(new_row), tag_wr.addr.eq(set_of(key)),
                     tag_rd.addr.eq(set_of(key))]

        def set_way(way, **fields):
            for i in range(n):
                with m.If(way == i):
                    for f, v in fields.items():
                        m.d.comb += getattr(new_row.ways[i], f).eq(v)

        def touch(way):
            m.d.comb += new_row.repl.eq(self._touch(row.repl, way))

        def stall():
            m.d.sync += self.stalls.eq(self.stalls + 1)
            m.next = "IDLE"

        def respond(**fields):
            m.d.sync += resp.eq(0)
            m.d.sync += [getattr(resp, f).eq(v) for f, v in fields.items()]

        def start_writeback(k):
            """The victim's data arrives from the line memory next cycle (state WB_LOAD)."""
            m.d.sync += [wb_busy.eq(1), wb_key.eq(k), self.writebacks.eq(self.writebacks + 1)]

        wb_load = Signal()                      # the line read this cycle goes to wb_buf

        def take():
            """Start on a fill, the held request or a new one (its tag row is read now)."""
            with m.If(~room):
                m.next = "IDLE"
            with m.Elif(fill_full):
                m.d.comb += key.eq(fill_key)
                m.d.sync += is_fill.eq(1)
                m.next = "LOOK"
            with m.Elif(held):
                m.d.comb += key.eq(cur.key)
                m.d.sync += is_fill.eq(0)
                m.next = "LOOK"
            with m.Elif(self.req.valid):
                m.d.comb += [key.eq(self.req.payload.key), self.req.ready.eq(1)]
                m.d.sync += [cur.eq(self.req.payload), held.eq(1), is_fill.eq(0)]
                m.next = "LOOK"
            with m.Else():
                m.next = "IDLE"

        with m.FSM() as fsm:
            with m.State("IDLE"):
                take()
            with m.State("LOOK"):
                m.d.comb += key.eq(Mux(is_fill, fill_key, cur.key))
                with m.If(is_fill):
                    # Install the fill (or drop it on a DMA error) and answer its READ.
                    m.d.comb += tag_wr.en.eq(1)
                    with m.If(fill_err):
                        set_way(fill_way, valid=0, pending=0, dirty=0)
                        m.d.sync += self.fill_errors.eq(self.fill_errors + 1)
                    with m.Else():
                        # a last use leaves the way free (the data still answer the READ)
                        set_way(fill_way, valid=~fill_last, pending=0, dirty=0)
                        m.d.comb += [line_wr.addr.eq(slot(set_of(key), fill_way)),
                                     line_wr.data.eq(fill_buf[:entry_bits]), line_wr.en.eq(1)]
                    for i in range(self.mshrs):
                        with m.If(fill_tag == i):
                            m.d.sync += ms_valid[i].eq(0)
                    respond(op=CacheOp.READ, id=fill_id, hit=0, err=fill_err,
                            data=fill_buf[:entry_bits])
                    m.d.sync += [fill_full.eq(0), fill_err.eq(0)]
                    m.next = "RESP"
                with m.Elif(pend_v.any()):
                    stall()                     # its own fill is still on the way
                with m.Elif(hit_v.any() & (cur.op == CacheOp.INVAL) & (hit_v & dirty_v).any()
                            & wb_busy):
                    stall()                     # a dirty entry to drop, the buffer is busy
                with m.Elif(hit_v.any()):
                    m.d.sync += held.eq(0)
                    with m.If(cur.op != CacheOp.INVAL):
                        m.d.sync += self.hits.eq(self.hits + 1)
                    m.d.comb += [tag_wr.en.eq(1), line_rd.addr.eq(slot(set_of(key), hit_way))]
                    with m.Switch(cur.op):
                        with m.Case(CacheOp.READ):
                            with m.If(cur.last & ~(hit_v & dirty_v).any()):
                                set_way(hit_way, valid=0)   # its last use: the way is free
                            with m.Else():
                                touch(hit_way)
                            m.next = "READ_DATA"
                        with m.Case(CacheOp.WRITE, CacheOp.FILL):
                            m.d.comb += [line_wr.addr.eq(slot(set_of(key), hit_way)),
                                         line_wr.data.eq(cur.data), line_wr.en.eq(1)]
                            with m.If(cur.op == CacheOp.WRITE):
                                set_way(hit_way, dirty=1)
                            touch(hit_way)
                            respond(op=cur.op, id=cur.id, hit=1)
                            m.next = "RESP"
                        with m.Case(CacheOp.INVAL):
                            set_way(hit_way, valid=0, dirty=0)
                            respond(op=CacheOp.INVAL, id=cur.id, hit=1)
                            with m.If((hit_v & dirty_v).any()):
                                # write it back and answer once the host has it
                                start_writeback(key)
                                m.d.sync += wb_load.eq(1)
                                m.next = "WAIT_WB"
                            with m.Else():
                                m.next = "RESP"
                with m.Elif(wb_busy & (wb_key == key)):
                    stall()                     # the host copy is not written back yet
                with m.Elif(cur.op == CacheOp.INVAL):
                    m.d.sync += held.eq(0)
                    respond(op=CacheOp.INVAL, id=cur.id, hit=0)
                    m.next = "RESP"
                with m.Elif(~any_usable):
                    stall()                     # every way of the set waits for a fill
                with m.Elif(vic.valid & vic.dirty & wb_busy):
                    stall()                     # the victim needs the write-back buffer
                with m.Elif((cur.op == CacheOp.READ) & (ms_valid.all() | rq_valid)):
                    stall()                     # no MSHR, or the DMA request slot is full
                with m.Else():
                    # A miss: replace the victim (writing it back if dirty).
                    m.d.comb += [tag_wr.en.eq(1), line_rd.addr.eq(slot(set_of(key), victim))]
                    touch(victim)
                    m.d.sync += [self.misses.eq(self.misses + 1), held.eq(0)]
                    with m.If(vic.valid):
                        m.d.sync += self.evictions.eq(self.evictions + 1)
                    with m.If(vic.valid & vic.dirty):
                        start_writeback(vic_key)
                        m.d.sync += wb_load.eq(1)
                    with m.If(cur.op == CacheOp.READ):
                        set_way(victim, valid=0, dirty=0, pending=1, tag=tag_of(key))
                        for i in range(self.mshrs):
                            with m.If(ms_free == i):
                                m.d.sync += [ms_valid[i].eq(1), ms_key[i].eq(key),
                                             ms_way[i].eq(victim), ms_id[i].eq(cur.id),
                                             ms_last[i].eq(cur.last)]
                        fill_addr = cur.addr if self.addressed else self.base + (key << ebits)
                        m.d.sync += [rq_valid.eq(1), rq_addr.eq(fill_addr), rq_tag.eq(ms_free)]
                        m.next = "IDLE"
                    with m.Else():              # WRITE / FILL: allocate and write, no fill
                        set_way(victim, valid=1, dirty=cur.op == CacheOp.WRITE, pending=0,
                                tag=tag_of(key))
                        m.d.comb += [line_wr.addr.eq(slot(set_of(key), victim)),
                                     line_wr.data.eq(cur.data), line_wr.en.eq(1)]
                        respond(op=cur.op, id=cur.id, hit=0)
                        m.next = "RESP"
            with m.State("READ_DATA"):
                # a hit's data leave now, and the next request is taken in the same cycle
                # (the tag row written in LOOK is in the memory already): two cycles a hit
                hit_resp = Signal(self.resp_layout)
                m.d.comb += [hit_resp.op.eq(CacheOp.READ), hit_resp.id.eq(cur.id),
                             hit_resp.hit.eq(1), hit_resp.data.eq(line_rd.data),
                             push_data.eq(hit_resp), push.eq(1)]
                take()
            with m.State("WAIT_WB"):
                with m.If(~wb_busy):
                    m.next = "RESP"
            with m.State("RESP"):
                # the answer of a WRITE, FILL, INVAL or a miss's fill leaves; the next
                # request is taken in the same cycle (as after a hit's READ_DATA)
                m.d.comb += [push_data.eq(resp), push.eq(1)]
                take()

        # The line read in LOOK (a dirty victim) arrives the cycle after: into the buffer.
        with m.If(wb_load):
            m.d.sync += [wb_buf.eq(line_rd.data), wb_send.eq(1), wb_load.eq(0)]
        m.d.comb += self.stat_busy.eq(~fsm.ongoing("IDLE"))
        return m
