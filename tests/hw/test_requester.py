"""Requester: request packets, responses, completions, local errors, NAKs and flush.

The bench wraps the Requester with its QP and MR context tables (asynchronous read ports of
``lib.memory.Memory``) and drives it from Python models: a host memory answering both DMA
read ports (latency, random back-pressure) and taking DMA writes, a responder stand-in that
answers every request packet like the remote RNIC would (ACK, READ responses from a remote
memory, atomics; optional NAKs and coalesced ACKs), and collectors of CQEs, QP error
requests and statistics pulses. Every test compares against a Python model of the packets,
memory contents and completions (InfiniBand Architecture Specification vol. 1 rel. 1.4,
9.7 and 10.8).
"""

import enum
import math
import random
from collections import deque

import pytest
from amaranth import Module
from amaranth.lib import wiring
from amaranth.sim import Simulator

from hw import formats, regmap
from hw.config import NicConfig
from hw.formats import WcOpcode, WcStatus as S
from hw.rnic.requester import Requester
from tests.hw.lookup_model import TableLookup

# integer mirrors of the opcode enums, for arithmetic in the models
O = enum.IntEnum("O", {e.name: e.value for e in formats.WrOpcode})
B = enum.IntEnum("B", {e.name: e.value for e in formats.BthOpcode})

CFG = NicConfig(data_bytes=8, mtu=256, n_qps=4, n_mrs=4, n_cqs=4, max_outstanding=8)

SIG, FENCE, SOL = formats.WQE_FLAG_SIGNALED, formats.WQE_FLAG_FENCE, formats.WQE_FLAG_SOLICITED
NODE = 3
# MR slots: 1 = good (pd 1, local write), 2 = pd 1 without local write, 3 = pd 2; 0 invalid
MRS = {
    1: dict(base=0x200000, length=0x10000, key=0x0155, pd=1, access=1, valid=1),
    2: dict(base=0x300000, length=0x1000, key=0x0266, pd=1, access=0, valid=1),
    3: dict(base=0x400000, length=0x10000, key=0x0377, pd=2, access=1, valid=1),
}
GOOD = MRS[1]


def qp_ctx(q, **kw):
    ctx = dict(sq_base=0x1000000 + 0x100000 * q, rq_base=0, sq_log_size=5, rq_log_size=0,
               send_cq=(q + 1) % 4, recv_cq=0, pd=1, dest_qpn=0x100 + q, dest_node=7 + q,
               access=0, max_rd_atomic=0)
    ctx.update(kw)
    return ctx


class Bench(wiring.Component):
    def __init__(self, cfg, qps, fetch_depth=4, mr_bad=(), mr_lat=None):
        self.dut = Requester(cfg, fetch_depth)
        # the QP-context lookups' stand-ins: request / response with a pseudo-random latency
        init = [int.from_bytes(formats.pack(regmap.QP_CTX, **qps[q]), "little")
                for q in range(cfg.n_qps)]
        qb = max(1, (cfg.n_qps - 1).bit_length())
        self.qpt_tx = TableLookup(qb, regmap.QP_CTX.size, init)
        self.qpt_fetch = TableLookup(qb, regmap.QP_CTX.size, init)
        mrs = [int.from_bytes(formats.pack(formats.MR_ENTRY, **MRS[i]), "little") if i in MRS else 0
               for i in range(cfg.n_mrs)]
        # the MR cache stand-in: request / response with a pseudo-random latency (or, with
        # mr_lat, a hit's: always ready, answered mr_lat cycles after the request)
        self.mrt = TableLookup(max(1, (cfg.n_mrs - 1).bit_length()), formats.MR_ENTRY.size, mrs,
                               bad=mr_bad, latency=mr_lat, always_ready=mr_lat is not None)
        super().__init__({})

    def elaborate(self, platform):
        m = Module()
        m.submodules.dut = self.dut
        m.submodules.qpt_tx = self.qpt_tx
        m.submodules.qpt_fetch = self.qpt_fetch
        m.submodules.mrt = self.mrt
        wiring.connect(m, self.dut.qpc_tx, self.qpt_tx.port)
        wiring.connect(m, self.dut.qpc_fetch, self.qpt_fetch.port)
        wiring.connect(m, self.dut.mr, self.mrt.port)
        return m


def wc_of(op):
    return {0: WcOpcode.RDMA_WRITE, 1: WcOpcode.RDMA_WRITE, 2: WcOpcode.SEND, 3: WcOpcode.SEND,
            4: WcOpcode.RDMA_READ, 5: WcOpcode.COMP_SWAP, 6: WcOpcode.FETCH_ADD}.get(op, WcOpcode.SEND).value


def wqe(op, length=0, flags=SIG, local=0, lkey=None, remote=0, rkey=0x9999, imm=0, cmp=0, swap=0,
        wr_id=None):
    return dict(opcode=int(op), flags=flags, imm=imm, wr_id=wr_id, local_addr=local, length=length,
                lkey=GOOD["key"] if lkey is None else lkey, remote_addr=remote, rkey=rkey,
                compare_add=cmp, swap=swap)


class World:
    """Everything outside the requester, as Python models."""

    def __init__(self, cfg, seed, bp=0.3, resp_lat=20, naks=None, ack_skip=0.0, qps=None, dma_lat=4,
                 fetch_depth=4):
        self.cfg = cfg
        self.fetch_depth = fetch_depth    # the requester's WQE fetches in flight
        self.W = cfg.data_bytes
        self.rng = random.Random(seed)
        self.bp = bp
        self.resp_lat = resp_lat
        self.dma_lat = dma_lat            # DMA read latency (cycles, plus 0..7 random)
        self.naks = naks or {}           # (q, message index) -> syndrome
        self.ack_skip = ack_skip          # probability of not acknowledging a message at once
        self.qps = qps or {q: qp_ctx(q) for q in range(cfg.n_qps)}
        self.host = {}                    # byte address -> value
        self.remote = {}
        self.t = 0
        self.tx = []                      # (time, q, meta dict, payload bytes)
        self.msg_count = {}
        self.unacked = {}                 # q -> psn of the last unacknowledged message
        self.resp = deque()               # (ready time, meta, payload)
        self.rx_from = 0                  # no response is delivered before this cycle
        self.rx_log = []                  # (time, meta) accepted by the DUT
        self.cqes = []
        self.set_err = []
        self.stats = {}
        self.wqe_reads = []
        self.pay_reads = []
        self.reread_reads = []            # the WQE cache reading a WQE again
        self.writes = []
        self.reads_inflight = {}
        self.max_reads_inflight = {}
        self.posted = {q: [] for q in range(cfg.n_qps)}
        self.db_q = deque()
        self.ev_q = deque()
        self.inject = {}                  # (q, message index) -> [(meta, payload)] sent first
        self.final_psn = {}               # q -> PSN of the last message (always acknowledged)
        self.tx_block = None              # (packets sent, cycles): then tx.meta.ready held low
        self.tx_block_t = None            # when that block started
        self.responder = None             # optional responder model (world, q, meta, payload)
        self.fail_reread = None           # fail(addr, len): the host fails a WQE re-read
        self.fail = None                  # fail(addr, len, is_write): the host fails a DMA
        self.wr_lat = 6                   # DMA write response latency (cycles)

    # ---- host-side helpers
    def fill(self, mem, addr, data):
        for i, b in enumerate(data):
            mem[addr + i] = b

    def get(self, mem, addr, n):
        return bytes(mem.get(addr + i, 0) for i in range(n))

    def post(self, q, w):
        """Write WQE w at the QP's producer index (the doorbell comes separately)."""
        ctx = self.qps[q]
        if w["wr_id"] is None:
            w["wr_id"] = self.rng.getrandbits(64)
        idx = len(self.posted[q])
        addr = ctx["sq_base"] + (idx % (1 << ctx["sq_log_size"])) * 64
        w["index"], w["qpn"] = idx % 65536, q
        self.fill(self.host, addr, formats.pack(formats.WQE, **w))
        self.posted[q].append(w)
        return idx + 1

    def ring(self, q, pi=None, bf=False):
        """Ring the doorbell of ``q``; ``bf``: by BlueFlame (the last posted WQE goes with
        it, as the doorbell block hands it over: the WQE one cycle, the ring the next)."""
        self.db_q.append((q, len(self.posted[q]) % 65536 if pi is None else pi,
                          self.posted[q][-1] if bf else None))


def seg_opcodes(op, n):
    if op in (O.RDMA_WRITE, O.RDMA_WRITE_WITH_IMM):
        f, mid, last, only = B.WRITE_FIRST, B.WRITE_MIDDLE, B.WRITE_LAST, B.WRITE_ONLY
        if op == O.RDMA_WRITE_WITH_IMM:
            last, only = B.WRITE_LAST_IMM, B.WRITE_ONLY_IMM
    else:
        f, mid, last, only = B.SEND_FIRST, B.SEND_MIDDLE, B.SEND_LAST, B.SEND_ONLY
        if op == O.SEND_WITH_IMM:
            last, only = B.SEND_LAST_IMM, B.SEND_ONLY_IMM
    if n == 1:
        return [only]
    return [f] + [mid] * (n - 2) + [last]


def expected_packets(world, q, wqes, psn):
    """Request packets (meta subset, payload) of the WQEs, sent in order from psn."""
    cfg, ctx = world.cfg, world.qps[q]
    out = []
    for w in wqes:
        op = O(w["opcode"])
        common = dict(src_node=NODE, dst_node=ctx["dest_node"], dest_qpn=ctx["dest_qpn"],
                      udp_sport=0xC000 | q)
        if op in (O.RDMA_WRITE, O.RDMA_WRITE_WITH_IMM, O.SEND, O.SEND_WITH_IMM):
            n = max(1, math.ceil(w["length"] / cfg.mtu))
            for k, bop in enumerate(seg_opcodes(op, n)):
                last = k == n - 1
                ln = min(cfg.mtu, w["length"] - k * cfg.mtu)
                meta = dict(common, opcode=bop.value, psn=(psn + k) % (1 << 24), ackreq=int(last),
                            se=int(last and bool(w["flags"] & SOL) and op != O.RDMA_WRITE),
                            paylen=ln)
                hdr = formats.headers_of(bop)
                if "reth" in hdr:
                    meta.update(va=w["remote_addr"], rkey=w["rkey"], dma_len=w["length"])
                if "immdt" in hdr:
                    meta.update(imm=w["imm"])
                out.append((meta, world.get(world.host, w["local_addr"] + k * cfg.mtu, ln)))
            psn += n
        elif op == O.RDMA_READ:
            out.append((dict(common, opcode=B.READ_REQUEST.value, psn=psn % (1 << 24), ackreq=1, se=0,
                             paylen=0, va=w["remote_addr"], rkey=w["rkey"], dma_len=w["length"]), b""))
            psn += max(1, math.ceil(w["length"] / cfg.mtu))
        else:
            cas = op == O.ATOMIC_CMP_AND_SWP
            out.append((dict(common, opcode=(B.COMPARE_SWAP if cas else B.FETCH_ADD).value,
                             psn=psn % (1 << 24), ackreq=1, se=0, paylen=0, va=w["remote_addr"],
                             rkey=w["rkey"], swap_add=w["swap"] if cas else w["compare_add"],
                             compare=w["compare_add"] if cas else 0), b""))
            psn += 1
    return out


def run(world, script, max_cycles=20000):
    """script(ctx, world) is an async function driving events/doorbells; runs until it ends."""
    cfg = world.cfg
    W = world.W
    bench = Bench(cfg, world.qps, world.fetch_depth, getattr(world, "mr_bad", ()),
                  getattr(world, "mr_lat", None))
    dut = bench.dut
    rng = world.rng
    bp = world.bp
    from hw.rnic.requester import STATS as stat_names
    stat_names = stat_names + ["stat_bf_miss", "stat_dma_err", "stat_wqe_hit", "stat_wqe_miss",
                               "stat_wqe_evict"]
    world.stats = {s: 0 for s in stat_names}
    # the queue occupancies (Q_REQ_*): the highest and the last value seen
    q_names = ["stat_q_ready", "stat_q_fetch", "stat_q_rd_out"]
    world.q_max = {s: 0 for s in q_names}
    world.q_last = {}
    remote_qpn = {world.qps[q]["dest_qpn"]: q for q in world.qps}

    async def clock(ctx):
        while True:
            res = await ctx.tick().sample(*[getattr(dut, s) for s in stat_names + q_names])
            for s, v in zip(stat_names, res[2:]):
                world.stats[s] += v
            for s, v in zip(q_names, res[2 + len(stat_names):]):
                world.q_max[s] = max(world.q_max[s], v)
                world.q_last[s] = v
            world.t += 1

    async def dma_read_req(ctx, port, log, queue, fail=None):
        # pipelined: requests are accepted while earlier ones are being answered
        held = None         # a request offered and not taken must stay valid and stable
        while True:
            ctx.set(port.req.ready, rng.random() >= bp and len(queue) < 16)
            _, _, v, r, p = await ctx.tick().sample(port.req.valid, port.req.ready, port.req.payload)
            if held is not None:
                assert v and (p.addr, p.len) == held, ("DMA request withdrawn or changed", held)
            held = (p.addr, p.len) if v and not r else None
            if v and r:
                log.append((p.addr, p.len))
                assert 0 < p.len <= 65535
                bad = bool(world.fail and world.fail(p.addr, p.len, False))
                bad = bad or bool(fail and fail(p.addr, p.len))
                queue.append((world.t + world.dma_lat + rng.randrange(0, 8), p.addr, p.len, p.tag, bad))

    async def dma_read(ctx, port, queue, backpressured=False):
        while True:
            if not queue or queue[0][0] > world.t:
                await ctx.tick()
                continue
            _, addr, ln, tag, bad = queue.popleft()
            p = type("Req", (), dict(addr=addr, len=ln, tag=tag))
            nb = (p.len + W - 1) // W
            for b in range(nb):
                while rng.random() < bp:
                    ctx.set(port.rd.valid, 0)
                    await ctx.tick()
                cnt = min(W, p.len - b * W)
                data = 0 if bad else int.from_bytes(world.get(world.host, p.addr + b * W, cnt), "little")
                ctx.set(port.rd.payload, {"data": data, "nbytes": cnt, "last": b == nb - 1,
                                          "tag": p.tag, "err": int(bad)})
                ctx.set(port.rd.valid, 1)
                if backpressured:                   # the WQE cache installs one fill at a time
                    while not ctx.get(port.rd.ready):
                        await ctx.tick()
                else:
                    assert ctx.get(port.rd.ready)   # read data is never back-pressured
                await ctx.tick()
            ctx.set(port.rd.valid, 0)

    wq, pq, rq = deque(), deque(), deque()

    async def reread_req(ctx):
        await dma_read_req(ctx, dut.reread_rd, world.reread_reads, rq, world.fail_reread)

    async def reread_dma(ctx):
        await dma_read(ctx, dut.reread_rd, rq, backpressured=True)

    async def wqe_req(ctx):
        await dma_read_req(ctx, dut.wqe_rd, world.wqe_reads, wq)

    async def wqe_dma(ctx):
        await dma_read(ctx, dut.wqe_rd, wq)

    async def pay_req(ctx):
        await dma_read_req(ctx, dut.pay_rd, world.pay_reads, pq)

    async def pay_dma(ctx):
        await dma_read(ctx, dut.pay_rd, pq)

    done_q = deque()

    async def dma_write(ctx):
        cur = None
        wr = dut.dma_wr.wr
        while True:
            ctx.set(wr.ready, rng.random() >= bp)
            _, _, v, r, p = await ctx.tick().sample(wr.valid, wr.ready, wr.payload)
            if v and r:
                if cur is None:
                    cur = [p.addr, p.len, b"", p.tag]
                cur[2] += int(p.data).to_bytes(W, "little")[:p.nbytes]
                if p.last:
                    assert len(cur[2]) == cur[1], cur
                    bad = bool(world.fail and world.fail(cur[0], cur[1], True))
                    if not bad:
                        world.fill(world.host, cur[0], cur[2])
                        world.writes.append((cur[0], cur[2]))
                    done_q.append((world.t + world.wr_lat, int(cur[3]), bad))
                    cur = None

    async def dma_done(ctx):
        done = dut.dma_wr.done
        while True:
            if done_q and done_q[0][0] <= world.t:
                _, tag, bad = done_q.popleft()
                ctx.set(done.payload, {"tag": tag, "err": int(bad)})
                ctx.set(done.valid, 1)
            else:
                ctx.set(done.valid, 0)
            await ctx.tick()

    def respond(q, meta, payload):
        """Responder stand-in: answers like the remote RNIC (9.7.4), with injected NAKs."""
        ready = world.t + world.resp_lat
        op = B(meta["opcode"])
        base = dict(src_node=meta["dst_node"], dst_node=meta["src_node"], dest_qpn=q, se=0, ackreq=0,
                    syndrome=formats.AethSyndrome.ACK.value, msn=0, paylen=0)
        psn = meta["psn"]
        last = meta["ackreq"]
        st = world.__dict__.setdefault("rstate", {}).setdefault(q, {})
        if op in (B.WRITE_FIRST, B.WRITE_ONLY, B.WRITE_ONLY_IMM):
            st["va"] = meta["va"]
            st["off"] = 0
        if op.name.startswith("WRITE"):
            world.fill(world.remote, st["va"] + st["off"], payload)
            st["off"] += len(payload)
        if not last:
            return
        idx = world.msg_count.get(q, 0)
        world.msg_count[q] = idx + 1
        for meta_x, pay_x in world.inject.get((q, idx), []):
            world.resp.append((ready, {**base, "psn": psn, **meta_x}, pay_x))
        if (q, idx) in world.naks:
            world.resp.append((ready, dict(base, opcode=B.ACKNOWLEDGE.value, psn=psn,
                                           syndrome=world.naks[(q, idx)]), b""))
            return
        if op == B.READ_REQUEST:
            world.reads_inflight[q] = world.reads_inflight.get(q, 0) + 1
            world.max_reads_inflight[q] = max(world.max_reads_inflight.get(q, 0), world.reads_inflight[q])
            n = max(1, math.ceil(meta["dma_len"] / world.cfg.mtu))
            for k in range(n):
                ln = min(world.cfg.mtu, meta["dma_len"] - k * world.cfg.mtu)
                bop = (B.READ_RESPONSE_ONLY if n == 1 else B.READ_RESPONSE_FIRST if k == 0 else
                       B.READ_RESPONSE_LAST if k == n - 1 else B.READ_RESPONSE_MIDDLE)
                world.resp.append((ready, dict(base, opcode=bop.value, psn=(psn + k) % (1 << 24), paylen=ln),
                                   world.get(world.remote, meta["va"] + k * world.cfg.mtu, ln)))
            return
        if op in (B.COMPARE_SWAP, B.FETCH_ADD):
            world.reads_inflight[q] = world.reads_inflight.get(q, 0) + 1
            world.max_reads_inflight[q] = max(world.max_reads_inflight.get(q, 0), world.reads_inflight[q])
            orig = int.from_bytes(world.get(world.remote, meta["va"], 8), "little")
            if op == B.COMPARE_SWAP:
                new = meta["swap_add"] if orig == meta["compare"] else orig
            else:
                new = (orig + meta["swap_add"]) % (1 << 64)
            world.fill(world.remote, meta["va"], new.to_bytes(8, "little"))
            world.resp.append((ready, dict(base, opcode=B.ATOMIC_ACKNOWLEDGE.value, psn=psn, orig=orig), b""))
            return
        # WRITE / SEND: acknowledge, possibly coalesced with a later ACK
        world.unacked[q] = world.unacked.get(q, 0) + 1
        if (rng.random() >= world.ack_skip or world.final_psn.get(q) == psn
                or world.unacked[q] >= 4):
            world.unacked[q] = 0
            world.resp.append((ready, dict(base, opcode=B.ACKNOWLEDGE.value, psn=psn), b""))

    def tx_blocked():
        if world.tx_block is None:
            return False
        n, cycles = world.tx_block
        if world.tx_block_t is None:
            if len(world.tx) < n:
                return False
            world.tx_block_t = world.t
        return world.t < world.tx_block_t + cycles

    async def tx(ctx):
        while True:
            ctx.set(dut.tx.meta.ready, rng.random() >= bp and not tx_blocked())
            _, _, v, r, p = await ctx.tick().sample(dut.tx.meta.valid, dut.tx.meta.ready, dut.tx.meta.payload)
            if not (v and r):
                continue
            ctx.set(dut.tx.meta.ready, 0)
            meta = {name: int(getattr(p, name)) for name, _ in formats.PKT_META}
            payload = b""
            paystall = 0
            if meta["paylen"]:
                while True:
                    ready = rng.random() >= bp
                    ctx.set(dut.tx.payload.ready, ready)
                    _, _, v, r, b = await ctx.tick().sample(dut.tx.payload.valid, dut.tx.payload.ready,
                                                            dut.tx.payload.payload)
                    paystall += ready and not v
                    if v and r:
                        payload += int(b.data).to_bytes(W, "little")[:b.nbytes]
                        if b.last:
                            break
                ctx.set(dut.tx.payload.ready, 0)
            assert len(payload) == meta["paylen"]
            assert paystall == 0, "payload beats must follow the header without waiting on DMA"
            q = remote_qpn[meta["dest_qpn"]]
            world.tx.append((world.t, q, meta, payload))
            if world.responder is not None:
                world.responder(world, q, meta, payload)
            else:
                respond(q, meta, payload)

    async def rx(ctx):
        while True:
            # the oldest response that is due (one delivered late lets later ones pass it)
            due = next((k for k, r in enumerate(world.resp)
                        if max(r[0], world.rx_from) <= world.t), None)
            if due is None:
                await ctx.tick()
                continue
            _, meta, payload = world.resp[due]
            del world.resp[due]
            full = {name: 0 for name, _ in formats.PKT_META}
            full.update(meta)
            ctx.set(dut.rx.meta.payload, full)
            ctx.set(dut.rx.meta.valid, 1)
            await ctx.tick().until(dut.rx.meta.ready)
            ctx.set(dut.rx.meta.valid, 0)
            nb = (len(payload) + W - 1) // W
            for b in range(nb):
                while rng.random() < bp:
                    await ctx.tick()
                chunk = payload[b * W:(b + 1) * W]
                ctx.set(dut.rx.payload.payload, {"data": int.from_bytes(chunk, "little"), "nbytes": len(chunk),
                                                 "last": b == nb - 1})
                ctx.set(dut.rx.payload.valid, 1)
                await ctx.tick().until(dut.rx.payload.ready)
                ctx.set(dut.rx.payload.valid, 0)
            world.rx_log.append((world.t, meta))
            if meta["opcode"] in (B.READ_RESPONSE_LAST.value, B.READ_RESPONSE_ONLY.value,
                                  B.ATOMIC_ACKNOWLEDGE.value):
                world.reads_inflight[meta["dest_qpn"]] -= 1

    async def cqe(ctx):
        while True:
            ctx.set(dut.cqe.ready, rng.random() >= bp)
            _, _, v, r, p = await ctx.tick().sample(dut.cqe.valid, dut.cqe.ready, dut.cqe.payload)
            if v and r:
                c = {name: int(getattr(p.cqe, name)) for name, _ in formats.CQE}
                c["cqn"] = int(p.cqn)
                c["t"] = world.t
                world.cqes.append(c)

    async def set_err(ctx):
        while True:
            ctx.set(dut.set_err.ready, rng.random() >= bp)
            _, _, v, r, p = await ctx.tick().sample(dut.set_err.valid, dut.set_err.ready, dut.set_err.payload)
            if v and r:
                world.set_err.append(int(p.qpn))

    async def doorbells(ctx):
        while True:
            if not world.db_q:
                await ctx.tick()
                continue
            q, pi, bfw = world.db_q.popleft()
            if bfw is not None:
                ctx.set(dut.bf.payload, {"qpn": q, "wqe": bfw})
                ctx.set(dut.bf.valid, 1)
                await ctx.tick()
                ctx.set(dut.bf.valid, 0)
            ctx.set(dut.db.payload, {"qpn": q, "pi": pi})
            ctx.set(dut.db.valid, 1)
            await ctx.tick().until(dut.db.ready)
            ctx.set(dut.db.valid, 0)

    async def main(ctx):
        ctx.set(dut.node_id, NODE)

        async def event(q, state, psn=0):
            # every event says "new QP" with its send-queue size (what SET_QP's event gives)
            ctx.set(dut.qp_event.payload, {"qpn": q, "state": state, "sq_psn": psn, "rq_psn": 0,
                                           "new": 1,
                                           "sq_log": world.qps[q]["sq_log_size"]})
            ctx.set(dut.qp_event.valid, 1)
            assert ctx.get(dut.qp_event.ready)
            await ctx.tick()
            ctx.set(dut.qp_event.valid, 0)

        async def wait(cond, limit=max_cycles):
            for _ in range(limit):
                if cond():
                    return
                await ctx.tick()
            raise AssertionError("timeout waiting")

        await script(ctx, world, event, wait)

    sim = Simulator(bench)
    sim.add_clock(1e-8)
    for fn in (clock, wqe_req, wqe_dma, pay_req, pay_dma, reread_req, reread_dma, dma_write,
               dma_done, tx, rx, cqe, set_err, doorbells):
        sim.add_testbench(fn, background=True)
    sim.add_testbench(main)
    sim.run()
    return world


def cqes_of(world, q):
    return [c for c in world.cqes if c["qpn"] == q]


def wqe_slots_read(world):
    """The WQE addresses read, one per WQE, from the (batched) DMA reads."""
    out = []
    for a, ln in world.wqe_reads:
        assert ln % 64 == 0 and 64 <= ln <= 64 * 4
        out += [a + 64 * k for k in range(ln // 64)]
    return out


def check_wqe_reads(world, n_posted):
    """Every posted WQE read at least once, reads inside the rings, one stat pulse per WQE read."""
    slots = wqe_slots_read(world)
    hits = world.stats["stat_bf_hit"]
    assert world.stats["stat_wqe_fetch"] == len(slots) + hits
    for q, n in n_posted.items():
        ctx = world.qps[q]
        size = 1 << ctx["sq_log_size"]
        ring = [a for a in slots if ctx["sq_base"] <= a < ctx["sq_base"] + 64 * size]
        if hits == 0:
            assert {ctx["sq_base"] + 64 * (i % size) for i in range(n)} <= set(ring)
    for a, ln in world.wqe_reads:   # a batch never wraps around the ring
        q = [q for q in world.qps if world.qps[q]["sq_base"] <= a < world.qps[q]["sq_base"] + (64 << world.qps[q]["sq_log_size"])][0]
        assert a + ln <= world.qps[q]["sq_base"] + (64 << world.qps[q]["sq_log_size"])


def check_success(world, q, wqes, psn0=0):
    """Packets, completions and memory of WQEs that all succeed."""
    got = [(m, p) for _, qq, m, p in world.tx if qq == q]
    exp = expected_packets(world, q, wqes, psn0)
    assert len(got) == len(exp)
    for (gm, gp), (em, ep) in zip(got, exp):
        assert {k: gm[k] for k in em} == em
        assert gp == ep
    cq = [(c["wr_id"], c["status"], c["opcode"], c["byte_len"], c["cqn"]) for c in cqes_of(world, q)]
    ecq = [(w["wr_id"], 0, wc_of(w["opcode"]),
            8 if w["opcode"] in (5, 6) else w["length"], world.qps[q]["send_cq"])
           for w in wqes if w["flags"] & SIG]
    assert cq == ecq


def check_error_sequence(world, q, wqes, bad, status):
    """CQEs of a QP where WQE number bad fails with status: before it, the signaled WQEs
    succeed; bad gets status; after it, everything is flushed (signaled or not)."""
    cq = [(c["wr_id"], c["status"]) for c in cqes_of(world, q)]
    exp = [(w["wr_id"], 0) for w in wqes[:bad] if w["flags"] & SIG]
    exp.append((wqes[bad]["wr_id"], status.value))
    exp += [(w["wr_id"], S.WR_FLUSH_ERR.value) for w in wqes[bad + 1:]]
    assert cq == exp
    assert all(c["cqn"] == world.qps[q]["send_cq"] and c["byte_len"] == 0
               for c in cqes_of(world, q) if c["status"])


def random_wqes(world, rng, n, q, ops=None, flags_p=0.7):
    out = []
    for i in range(n):
        op = rng.choice(ops or list(O))
        local = GOOD["base"] + 0x1000 * q * 4 + rng.randrange(0, 0x3000)
        if op in (O.ATOMIC_CMP_AND_SWP, O.ATOMIC_FETCH_AND_ADD):
            length = 8
        else:
            length = rng.choice([0, 1, 7, 8, 100, 255, 256, 257, 511, 512, 700])
        remote = 0x800000 + q * 0x10000 + i * 0x1000
        flags = SIG if rng.random() < flags_p else 0
        if rng.random() < 0.2:
            flags |= SOL
        out.append(wqe(op, length, flags, local=local if op not in (O.RDMA_READ, 5, 6) else
                       GOOD["base"] + 0xC000 + q * 0x1000 + (i % 4) * 0x400 + (8 if op in (5, 6) else 0),
                       remote=remote, imm=rng.getrandbits(32), cmp=rng.getrandbits(64) if rng.random() < 0.5 else 0,
                       swap=rng.getrandbits(64), rkey=rng.getrandbits(32)))
    # the last one signaled so that the test can wait for it
    out[-1]["flags"] |= SIG
    return out


def setup_memory(world, rng):
    world.fill(world.host, GOOD["base"], bytes(rng.getrandbits(8) for _ in range(0x10000)))
    for q in range(4):
        world.fill(world.remote, 0x800000 + q * 0x10000, bytes(rng.getrandbits(8) for _ in range(0x10000)))


# ---------------------------------------------------------------------------------------
# tests


def mixed(seed, bp, n=12, qs=(0, 1, 2), psn0=0, cfg=CFG, bf_p=0.0):
    """``bf_p``: probability that a WQE is posted alone and rung by BlueFlame."""
    world = World(cfg, seed, bp=bp, ack_skip=0.5)
    rng = random.Random(seed)
    setup_memory(world, rng)
    remote_before = dict(world.remote)
    plan = world.plan = {q: random_wqes(world, rng, n, q) for q in qs}
    # reads target distinct local buffers: no overlap between READ destinations and WRITE sources
    # (a READ result may land before a later WRITE is sent)
    for q in qs:
        for w in plan[q]:
            if w["opcode"] in (0, 1, 2, 3):
                w["local_addr"] = GOOD["base"] + 0x1000 * q * 3 + rng.randrange(0, 0x1000)
    for q in qs:
        psn = psn0
        for w in plan[q]:
            psn += 1 if w["opcode"] in (5, 6) else max(1, math.ceil(w["length"] / cfg.mtu))
        world.final_psn[q] = (psn - 1) % (1 << 24)

    async def script(ctx, world, event, wait):
        for q in qs:
            await event(q, formats.QpState.RTS.value, psn0)
        for q in qs:
            for k, w in enumerate(plan[q]):
                world.post(q, w)
                if rng.random() < bf_p:
                    world.ring(q, bf=True)
                elif k % 5 == 4 or k == len(plan[q]) - 1:
                    world.ring(q)
        need = sum(sum(1 for w in plan[q] if w["flags"] & SIG) for q in qs)
        await wait(lambda: len(world.cqes) >= need)
        for _ in range(50):
            await ctx.tick()

    run(world, script)
    for q in qs:
        check_success(world, q, plan[q], psn0)
        assert world.max_reads_inflight.get(q, 0) <= 16
    # memory effects, replayed per QP in order (the QPs use disjoint remote regions)
    replay = dict(remote_before)
    local_expect = {}
    for q in qs:
        for w in plan[q]:
            op = w["opcode"]
            if op in (0, 1):
                for i in range(w["length"]):
                    replay[w["remote_addr"] + i] = world.host.get(w["local_addr"] + i, 0)
            elif op == 4:
                for i in range(w["length"]):
                    local_expect[w["local_addr"] + i] = replay.get(w["remote_addr"] + i, 0)
            elif op in (5, 6):
                orig = int.from_bytes(bytes(replay.get(w["remote_addr"] + i, 0) for i in range(8)), "little")
                if op == 5:
                    new = w["swap"] if orig == w["compare_add"] else orig
                else:
                    new = (orig + w["compare_add"]) % (1 << 64)
                for i in range(8):
                    replay[w["remote_addr"] + i] = (new >> (8 * i)) & 0xFF
                    local_expect[w["local_addr"] + i] = (orig >> (8 * i)) & 0xFF
    assert all(world.host.get(a, 0) == v for a, v in local_expect.items())
    # every byte of the remote memory touched as the model says
    assert all(world.remote.get(a, 0) == v for a, v in replay.items())
    nmsg = {k: 0 for k in ("stat_write", "stat_read", "stat_send", "stat_cas", "stat_faa")}
    for q in qs:
        for w in plan[q]:
            nmsg[["stat_write", "stat_write", "stat_send", "stat_send", "stat_read", "stat_cas",
                  "stat_faa"][w["opcode"]]] += 1
    assert {k: world.stats[k] for k in nmsg} == nmsg
    assert world.stats["stat_nak_rx"] == 0 and world.set_err == []
    check_wqe_reads(world, {q: len(plan[q]) for q in qs})
    return world



def post_ring_wait(ws, n_cqes, settle):
    """A script for run(): QP 0 to RTS, post ``ws``, ring once, wait for ``n_cqes`` CQEs,
    then let the model run ``settle`` more cycles (to catch anything extra)."""
    async def script(ctx, world, event, wait):
        await event(0, formats.QpState.RTS.value, 0)
        for w in ws:
            world.post(0, w)
        world.ring(0)
        await wait(lambda: len(world.cqes) >= n_cqes)
        for _ in range(settle):
            await ctx.tick()
    return script


def test_mixed_no_backpressure():
    mixed(1, 0.0)


def test_mixed_backpressure():
    mixed(2, 0.4)


@pytest.mark.parametrize("sets,ways,bp", [(1, 1, 0.3), (2, 2, 0.0), (2, 2, 0.4), (16, 4, 0.3)])
def test_wqe_cache_capacity(sets, ways, bp):
    """The WQE cache (hw/ctx/wqe_cache.py) holds the WQEs of outstanding messages. With fewer
    entries than messages outstanding (3 QPs x up to 8), a WQE a response or a completion
    needs has been evicted and is read again, 64 bytes from its send-queue slot; every
    packet, byte and completion is still right (the mixed test's checks). With enough
    entries (64), nothing is read again."""
    import dataclasses
    cfg = dataclasses.replace(CFG, wqe_cache_sets=sets, wqe_cache_ways=ways)
    world = mixed(3 + sets, bp, n=16, cfg=cfg)    # 16: the QPs' remote regions stay apart
    rr = world.reread_reads
    assert world.stats["stat_wqe_miss"] == len(rr)
    for addr, n in rr:
        q = (addr - 0x1000000) // 0x100000
        assert n == 64 and 0 <= q < 3
        off = addr - qp_ctx(q)["sq_base"]
        assert off % 64 == 0 and 0 <= off < 64 << 5
    if sets * ways >= 3 * CFG.max_outstanding:
        assert rr == [] and world.stats["stat_wqe_evict"] == 0
    else:
        assert len(rr) > 5 and world.stats["stat_wqe_evict"] > 0
    assert world.stats["stat_wqe_hit"] + world.stats["stat_wqe_miss"] > 24


def test_wqe_cache_spreads_qps_over_sets():
    """Four QPs posting in step (one READ each per round, as SMART's batch-synchronous
    threads do) keep their WQEs at the same send-queue index: the WQE cache's set index mixes
    the QPN in, so four sets of one way hold them all and nothing is read again."""
    import dataclasses
    cfg = dataclasses.replace(CFG, wqe_cache_sets=4, wqe_cache_ways=1)
    world = World(cfg, 31, bp=0.2, resp_lat=60)
    rng = random.Random(31)
    setup_memory(world, rng)
    qs = range(4)
    plan = {q: [wqe(O.RDMA_READ, 8, SIG, local=GOOD["base"] + 0x1000 * q + 8 * r,
                    remote=0x800000 + q * 0x10000 + 8 * r) for r in range(6)] for q in qs}
    for q in qs:
        world.final_psn[q] = None

    async def script(ctx, world, event, wait):
        for q in qs:
            await event(q, formats.QpState.RTS.value, 0)
        for r in range(6):
            for q in qs:
                world.post(q, plan[q][r])
                world.ring(q)
            await wait(lambda: len(world.cqes) >= 4 * (r + 1))

    run(world, script)
    for q in qs:
        check_success(world, q, plan[q])
    assert world.reread_reads == [] and world.stats["stat_wqe_hit"] == 24


def test_wqe_cache_set_mapping():
    """hw/ctx/wqe_cache.py ``wqe_set``: the outstanding READs of a QP (consecutive indices, at
    most max_rd_atomic) fall in different sets whatever the index, and the QPs of a QPN class
    share sets evenly: connectx6's 256 x 4 sets hold 64 QPs' full READ windows however far
    apart the QPs' indices have drifted; QPs in step at one index spread over the sets."""
    from hw.ctx.wqe_cache import wqe_set
    rng = random.Random(5)
    for trial in range(20):
        load = {}
        for q in range(2, 66):
            start = rng.randrange(1 << 16)
            for i in range(16):
                s = wqe_set(q, (start + i) % (1 << 16), 256, 16, 10)
                load[s] = load.get(s, 0) + 1
        assert max(load.values()) == 4 and len(load) == 256
    assert sorted(wqe_set(q, 7, 4, 16, 2) for q in range(4)) == [0, 1, 2, 3]
    # one-to-one (the key): every (qpn, index) of a small space in its own (set, rest)
    keys = {(wqe_set(q, i, 8, 4, 2), q, i >> 2) for q in range(4) for i in range(64)}
    assert len(keys) == 4 * 64


def test_wqe_cache_drifted_windows():
    """Two QPs with four READs in flight each, their send-queue indices three apart: in an
    8-set, one-way WQE cache (max_rd_atomic 4) each QP's window has four sets of its own, so
    no WQE is evicted while outstanding and nothing is read again (a set index that mixed
    the QPN into the index by XOR put both windows over the same sets)."""
    import dataclasses
    cfg = dataclasses.replace(CFG, wqe_cache_sets=8, wqe_cache_ways=1, max_rd_atomic=4)
    world = World(cfg, 41, bp=0.2, resp_lat=80)
    rng = random.Random(41)
    setup_memory(world, rng)
    lead = {0: 0, 1: 3}
    plan = {q: [wqe(O.RDMA_READ, 8, SIG, local=GOOD["base"] + 0x1000 * q + 8 * r,
                    remote=0x800000 + q * 0x10000 + 8 * r) for r in range(lead[q] + 12)]
            for q in (0, 1)}
    for q in (0, 1):
        world.final_psn[q] = None

    async def script(ctx, world, event, wait):
        for q in (0, 1):
            await event(q, formats.QpState.RTS.value, 0)
        for w in plan[1][:3]:                 # QP 1 runs three WQEs ahead
            world.post(1, w)
        world.ring(1)
        await wait(lambda: len(world.cqes) >= 3)
        for r in range(3):
            for q in (0, 1):
                for w in plan[q][lead[q] + 4 * r:lead[q] + 4 * r + 4]:
                    world.post(q, w)
                world.ring(q)
            await wait(lambda: len(world.cqes) >= 3 + 8 * (r + 1))

    run(world, script)
    for q in (0, 1):
        check_success(world, q, plan[q])
    assert world.reread_reads == [] and world.stats["stat_wqe_miss"] == 0
    assert world.stats["stat_wqe_hit"] == 27


def test_wqe_reread_fails():
    """Six READs outstanding, a one-entry WQE cache: every response's WQE is read again. The
    host fails the re-read of the third: that WR completes in LOC_QP_OP_ERR with wr_id 0 (it
    is unknown, as for an unreadable WQE), none of its data is written, the QP goes to ERR
    and the rest are flushed (their wr_ids read again)."""
    import dataclasses
    cfg = dataclasses.replace(CFG, wqe_cache_sets=1, wqe_cache_ways=1)
    world = World(cfg, 21, bp=0.2, resp_lat=150)
    rng = random.Random(21)
    setup_memory(world, rng)
    ws = [wqe(O.RDMA_READ, 16, SIG, local=GOOD["base"] + 0x100 * i, remote=0x800000 + 0x100 * i)
          for i in range(6)]
    bad_slot = qp_ctx(0)["sq_base"] + 2 * 64
    world.fail_reread = lambda a, n: a == bad_slot
    world.final_psn[0] = None
    run(world, post_ring_wait(ws, 6, 200))
    cq = [(c["wr_id"], c["status"]) for c in cqes_of(world, 0)]
    assert cq == ([(w["wr_id"], 0) for w in ws[:2]] + [(0, S.LOC_QP_OP_ERR.value)]
                  + [(w["wr_id"], S.WR_FLUSH_ERR.value) for w in ws[3:]])
    assert world.set_err == [0] and world.stats["stat_dma_err"] == 1
    assert not [a for a, _ in world.writes if a == ws[2]["local_addr"]]
    assert [a for a, _ in world.writes if a == ws[1]["local_addr"]]
    assert any(a == bad_slot for a, _ in world.reread_reads)


@pytest.mark.parametrize("kw", [dict(wqe_batch=1), dict(wqe_batch=2, desc_depth=2),
                                dict(bf_entries=1, fetch_depth=1),
                                dict(pay_buffers=1, gate_depth=2)])
def test_structural_fields(kw):
    """The pipeline's structural constants are NicConfig fields: other values than the
    defaults give the same results (the mixed random test, with BlueFlame posts)."""
    import dataclasses
    mixed(31, 0.3, cfg=dataclasses.replace(CFG, **kw), bf_p=0.5)


def test_psn_wrap():
    world = mixed(3, 0.2, n=8, qs=(1,), psn0=(1 << 24) - 5)
    psns = [m["psn"] for _, q, m, _ in world.tx]
    assert 0 in psns and (1 << 24) - 5 in psns


def test_wide_datapath():
    cfg = NicConfig(data_bytes=64, mtu=256, n_qps=4, n_mrs=4, n_cqs=4, max_outstanding=8)
    mixed(4, 0.3, n=8, qs=(0, 3), cfg=cfg)


def test_segmentation_every_opcode():
    """Each opcode across the MTU boundary, one QP, all signaled."""
    world = World(CFG, 5, bp=0.2)
    rng = random.Random(5)
    setup_memory(world, rng)
    ws = []
    for op in (O.RDMA_WRITE, O.RDMA_WRITE_WITH_IMM, O.SEND, O.SEND_WITH_IMM):
        for ln in (0, 1, 256, 257, 768, 1000):
            ws.append(wqe(op, ln, SIG | SOL, local=GOOD["base"] + 0x100, remote=0x800000, imm=0x1234 + ln))
    rlocal = {ln: GOOD["base"] + 0x4000 + i * 0x800 for i, ln in enumerate((0, 1, 256, 257, 1000))}
    for ln in (0, 1, 256, 257, 1000):
        ws.append(wqe(O.RDMA_READ, ln, SIG, local=rlocal[ln], remote=0x810000 + ln))
    ws.append(wqe(O.ATOMIC_CMP_AND_SWP, 8, SIG, local=GOOD["base"] + 0xF000, remote=0x820000,
                  cmp=int.from_bytes(bytes(world.remote.get(0x820000 + i, 0) for i in range(8)), "little"),
                  swap=0x1122334455667788))
    ws.append(wqe(O.ATOMIC_FETCH_AND_ADD, 8, SIG, local=GOOD["base"] + 0xF008, remote=0x820000, cmp=5))

    async def script(ctx, world, event, wait):
        await event(0, formats.QpState.RTS.value, 100)
        for w in ws:
            world.post(0, w)
        world.ring(0)
        await wait(lambda: len(world.cqes) >= len(ws))

    world.final_psn[0] = None
    run(world, script)
    check_success(world, 0, ws, 100)
    # CAS swapped, then FAA added 5 to the swapped value and returned it
    assert int.from_bytes(world.get(world.remote, 0x820000, 8), "little") == 0x1122334455667788 + 5
    assert int.from_bytes(world.get(world.host, GOOD["base"] + 0xF008, 8), "little") == 0x1122334455667788
    for ln in (1, 256, 257, 1000):
        assert world.get(world.host, rlocal[ln], ln) == world.get(world.remote, 0x810000 + ln, ln)
    # the READ of 1000 bytes consumed 4 PSNs: the next request's PSN
    reads = [m for _, _, m, _ in world.tx if m["opcode"] == B.READ_REQUEST.value]
    assert reads[-1]["psn"] == reads[-2]["psn"] + 2
    atom = [m for _, _, m, _ in world.tx if m["opcode"] == B.COMPARE_SWAP.value][0]
    assert atom["psn"] == reads[-1]["psn"] + 4


def test_unsignaled_and_coalesced_ack():
    world = World(CFG, 6, bp=0.3, ack_skip=0.8)
    rng = random.Random(6)
    setup_memory(world, rng)
    ws = [wqe(O.RDMA_WRITE, 300, SIG if i % 3 == 2 else 0, local=GOOD["base"], remote=0x800000) for i in range(9)]
    world.final_psn[0] = 17

    run(world, post_ring_wait(ws, 3, settle=200))
    check_success(world, 0, ws)
    assert len(world.cqes) == 3


def test_fence_waits_for_read():
    world = World(CFG, 7, bp=0.1, resp_lat=150)
    rng = random.Random(7)
    setup_memory(world, rng)
    ws = [wqe(O.RDMA_READ, 300, SIG, local=GOOD["base"] + 0x8000, remote=0x800000),
          wqe(O.RDMA_WRITE, 16, SIG, local=GOOD["base"], remote=0x801000),       # not fenced
          wqe(O.RDMA_WRITE, 16, SIG | FENCE, local=GOOD["base"], remote=0x802000),
          wqe(O.SEND, 16, SIG, local=GOOD["base"], remote=0)]

    async def script(ctx, world, event, wait):
        await event(0, formats.QpState.RTS.value, 0)
        for w in ws:
            world.post(0, w)
        world.ring(0)
        await wait(lambda: len(world.cqes) >= 4)

    world.final_psn[0] = None
    run(world, script)
    check_success(world, 0, ws)
    t_tx = [t for t, _, _, _ in world.tx]
    t_read_done = [t for t, m in world.rx_log if m["opcode"] == B.READ_RESPONSE_LAST.value][0]
    assert t_tx[1] < t_read_done          # the unfenced WRITE went out under the READ
    assert t_tx[2] > t_read_done          # the fenced one waited for the READ response


@pytest.mark.parametrize("lat", range(8, 24))
def test_fence_clearing_during_batch(lat):
    """A fenced WQE dropped in the middle of a batch while the fence clears right then (the
    atomic's response arrives at any cycle around it): the rest of the batch must be dropped
    too and fetched again after the fenced one, never sent in its place (found by the long
    lossy system test: a fenced WRITE was skipped)."""
    world = World(CFG, lat, bp=0.0, resp_lat=lat, dma_lat=1)
    setup_memory(world, random.Random(lat))
    ws = [wqe(O.ATOMIC_FETCH_AND_ADD, 8, SIG, local=GOOD["base"] + 0x9000, remote=0x800100, cmp=1),
          wqe(O.RDMA_WRITE, 8, SIG, local=GOOD["base"], remote=0x801000),
          wqe(O.RDMA_WRITE, 8, SIG | FENCE, local=GOOD["base"] + 8, remote=0x802000),
          wqe(O.RDMA_WRITE, 0, SIG, local=GOOD["base"], remote=0x803000)]
    world.final_psn[0] = None
    run(world, post_ring_wait(ws, 4, 0))
    check_success(world, 0, ws)


def test_max_rd_atomic_limit():
    qps = {q: qp_ctx(q, max_rd_atomic=2) for q in range(4)}
    world = World(CFG, 8, bp=0.1, resp_lat=80, qps=qps)
    rng = random.Random(8)
    setup_memory(world, rng)
    ws = [wqe(O.RDMA_READ, 100, SIG, local=GOOD["base"] + 0x8000 + 0x100 * i, remote=0x800000 + 0x100 * i)
          for i in range(6)] + [wqe(O.ATOMIC_FETCH_AND_ADD, 8, SIG, local=GOOD["base"] + 0xF000, remote=0x800000, cmp=1)]

    async def script(ctx, world, event, wait):
        await event(0, formats.QpState.RTS.value, 0)
        for w in ws:
            world.post(0, w)
        world.ring(0)
        await wait(lambda: len(world.cqes) >= len(ws))

    world.final_psn[0] = None
    run(world, script)
    check_success(world, 0, ws)
    assert world.max_reads_inflight[0] == 2
    # the first batch is whole (nothing outstanding yet); after it, a QP with READs in
    # flight reads no more WQEs than its READ/atomic budget left (it may send no more), so
    # no WQE is read only to be dropped
    lens = [ln // formats.WQE_BYTES for _, ln in world.wqe_reads]
    assert lens[0] == min(len(ws), CFG.wqe_batch) and all(n <= 2 for n in lens[1:]), lens
    assert sum(lens) <= len(ws) + lens[0] - 2, lens
    # Q_REQ_RD_OUT, the sum of the QPs' READ/atomic counts: at the limit, back to 0 at the
    # end; one QP was queued and one batch in flight at a time (Q_REQ_READY, Q_REQ_FETCH)
    assert world.q_max["stat_q_rd_out"] == 2 and world.q_last["stat_q_rd_out"] == 0
    assert world.q_max["stat_q_ready"] == 1 and world.q_max["stat_q_fetch"] == 1
    assert world.q_last["stat_q_ready"] == 0 and world.q_last["stat_q_fetch"] == 0


def test_tracker_limit_and_ring_wrap():
    """sq of 4 entries, posted in batches; max_outstanding 8 bounds unacknowledged messages."""
    qps = {q: qp_ctx(q, sq_log_size=2) for q in range(4)}
    world = World(CFG, 9, bp=0.2, resp_lat=60, qps=qps)
    rng = random.Random(9)
    setup_memory(world, rng)
    ws = [wqe(O.SEND, 20 + i, SIG, local=GOOD["base"] + i, remote=0) for i in range(12)]

    async def script(ctx, world, event, wait):
        await event(2, formats.QpState.RTS.value, 7)
        for b in range(3):
            for w in ws[4 * b:4 * b + 4]:
                world.post(2, w)
            world.ring(2)
            await wait(lambda: len(world.cqes) >= 4 * b + 4)

    world.final_psn[2] = None
    run(world, script)
    check_success(world, 2, ws, 7)
    assert wqe_slots_read(world) == [qps[2]["sq_base"] + 64 * (i % 4) for i in range(12)]
    assert len(world.wqe_reads) == 3            # one batch of 4 per doorbell


def test_tracker_full():
    world = World(CFG, 10, bp=0.0, resp_lat=400)
    rng = random.Random(10)
    setup_memory(world, rng)
    ws = [wqe(O.RDMA_WRITE, 8, SIG, local=GOOD["base"], remote=0x800000) for i in range(12)]
    seen = {}

    async def script(ctx, world, event, wait):
        await event(1, formats.QpState.RTS.value, 0)
        for w in ws:
            world.post(1, w)
        world.ring(1)
        await wait(lambda: len(world.tx) >= 8)
        for _ in range(200):
            await ctx.tick()
        seen["tx"] = len(world.tx)          # no ACK yet: at most max_outstanding messages
        await wait(lambda: len(world.cqes) >= 12)

    world.final_psn[1] = None
    run(world, script)
    assert seen["tx"] == 8
    check_success(world, 1, ws)


@pytest.mark.parametrize("name,mk,status", [
    ("bad_opcode", lambda: wqe(9, 16, SIG, local=GOOD["base"]), S.LOC_QP_OP_ERR),
    ("atomic_len", lambda: wqe(O.ATOMIC_FETCH_AND_ADD, 4, SIG, local=GOOD["base"]), S.LOC_LEN_ERR),
    ("bad_lkey_tag", lambda: wqe(O.RDMA_WRITE, 16, SIG, local=GOOD["base"], lkey=0x0156), S.LOC_PROT_ERR),
    ("invalid_mr", lambda: wqe(O.RDMA_WRITE, 16, SIG, local=GOOD["base"], lkey=0x0011), S.LOC_PROT_ERR),
    ("other_pd", lambda: wqe(O.SEND, 16, 0, local=MRS[3]["base"], lkey=MRS[3]["key"]), S.LOC_PROT_ERR),
    ("below_mr", lambda: wqe(O.SEND, 16, SIG, local=GOOD["base"] - 1), S.LOC_PROT_ERR),
    ("beyond_mr", lambda: wqe(O.RDMA_WRITE, 17, SIG, local=GOOD["base"] + 0x10000 - 16), S.LOC_PROT_ERR),
    ("read_no_local_write", lambda: wqe(O.RDMA_READ, 16, SIG, local=MRS[2]["base"], lkey=MRS[2]["key"]),
     S.LOC_PROT_ERR),
    ("atomic_no_local_write", lambda: wqe(O.ATOMIC_CMP_AND_SWP, 8, SIG, local=MRS[2]["base"], lkey=MRS[2]["key"]),
     S.LOC_PROT_ERR),
    # a WQE whose lkey's MR entry could not be read: the WRITE from MR 2 that succeeds in
    # `before` of the other cases fails when the lookup answers err
    ("mr_fill_fails", lambda: wqe(O.RDMA_WRITE, 16, SIG, local=MRS[2]["base"], lkey=MRS[2]["key"]),
     S.LOC_PROT_ERR),
])
def test_local_errors(name, mk, status):
    # slow responses: the WQEs before the bad one are still outstanding when it is checked,
    # they complete normally before the error completion
    world = World(CFG, 11, bp=0.3, resp_lat=150)
    if name == "mr_fill_fails":
        world.mr_bad = {2}          # the MR cache cannot read slot 2 from ICM: err
    rng = random.Random(11)
    setup_memory(world, rng)
    before = [wqe(O.RDMA_WRITE, 300, SIG if i != 1 else 0, local=GOOD["base"], remote=0x800000) for i in range(3)]
    # a WRITE from a no-local-write MR is fine (the MR is only read); length 0 needs no lkey
    if name != "mr_fill_fails":
        before.append(wqe(O.SEND, 16, SIG, local=MRS[2]["base"], lkey=MRS[2]["key"]))
    before.append(wqe(O.RDMA_WRITE, 0, SIG, local=0, lkey=0))
    bad = mk()
    after = [wqe(O.SEND, 8, SIG if i else 0, local=GOOD["base"]) for i in range(3)]
    ws = before + [bad] + after
    world.final_psn[0] = None

    async def script(ctx, world, event, wait):
        await event(0, formats.QpState.RTS.value, 0)
        for w in ws:
            world.post(0, w)
        world.ring(0)
        await wait(lambda: any(c["wr_id"] == ws[-1]["wr_id"] for c in world.cqes))
        for _ in range(100):
            await ctx.tick()

    run(world, script)
    check_error_sequence(world, 0, ws, len(before), status)
    assert world.set_err == [0]
    # the QP went to ERR only after the last good message was acknowledged
    t_ack = max(t for t, m in world.rx_log if m["opcode"] == B.ACKNOWLEDGE.value)
    t_err = [c["t"] for c in world.cqes if c["status"]][0]
    assert t_err > t_ack
    assert len([p for p in world.tx]) == sum(max(1, math.ceil(w["length"] / 256)) for w in before)
    # nothing more is sent once the QP is in error
    check_wqe_reads(world, {0: len(ws)})


@pytest.mark.parametrize("syndrome,status,victim", [
    (0x61, S.REM_INV_REQ_ERR, O.RDMA_WRITE), (0x62, S.REM_ACCESS_ERR, O.RDMA_READ),
    (0x63, S.REM_OP_ERR, O.ATOMIC_CMP_AND_SWP), (0x20, S.RNR_RETRY_EXC_ERR, O.SEND),
    (0x3F, S.RNR_RETRY_EXC_ERR, O.RDMA_WRITE_WITH_IMM), (0x60, S.RETRY_EXC_ERR, O.ATOMIC_FETCH_AND_ADD),
    (0x62, S.REM_ACCESS_ERR, O.RDMA_WRITE), (0x61, S.REM_INV_REQ_ERR, O.RDMA_READ),
])
def test_nak(syndrome, status, victim):
    world = World(CFG, 12, bp=0.3, naks={(0, 3): syndrome})
    rng = random.Random(12)
    setup_memory(world, rng)
    ws = [wqe(O.RDMA_WRITE, 300, SIG, local=GOOD["base"], remote=0x800000),
          wqe(O.RDMA_READ, 20, SIG, local=GOOD["base"] + 0x8000, remote=0x800000),
          wqe(O.SEND, 10, 0, local=GOOD["base"]),
          wqe(victim, 8, SIG if victim != O.RDMA_WRITE else 0, local=GOOD["base"] + 0x9000, remote=0x800100),
          wqe(O.RDMA_WRITE, 600, SIG, local=GOOD["base"], remote=0x800000),
          wqe(O.RDMA_READ, 8, 0, local=GOOD["base"] + 0xA000, remote=0x800000)]
    world.final_psn[0] = None

    async def script(ctx, world, event, wait):
        await event(0, formats.QpState.RTS.value, 0)
        for w in ws[:4]:
            world.post(0, w)
        world.ring(0)
        await wait(lambda: world.set_err)
        # the context table confirms the error state; later posts are flushed too
        await event(0, formats.QpState.ERR.value)
        for w in ws[4:]:
            world.post(0, w)
        world.ring(0)
        await wait(lambda: any(c["wr_id"] == ws[-1]["wr_id"] for c in world.cqes))
        for _ in range(100):
            await ctx.tick()

    run(world, script)
    cq = cqes_of(world, 0)
    # deterministic: earlier messages were acknowledged before the NAK
    assert [(c["wr_id"], c["status"]) for c in cq] == [
        (ws[0]["wr_id"], 0), (ws[1]["wr_id"], 0), (ws[3]["wr_id"], status.value),
        (ws[4]["wr_id"], S.WR_FLUSH_ERR.value), (ws[5]["wr_id"], S.WR_FLUSH_ERR.value)]
    assert cq[2]["opcode"] == wc_of(victim)
    assert world.set_err == [0]
    assert world.stats["stat_nak_rx"] == 1
    assert len(world.tx) == 4 + 1          # WRITE of 300 bytes is two packets


def test_flush_on_err_event():
    """WQEs posted while the QP is not yet RTS are flushed, in order, when it goes to ERR."""
    world = World(CFG, 13, bp=0.3)
    ws = [wqe(O.RDMA_WRITE, 10, 0, local=GOOD["base"]) for _ in range(5)] + [wqe(9, 0, 0)]
    world.final_psn[0] = None

    async def script(ctx, world, event, wait):
        await event(3, formats.QpState.INIT.value, 0)
        for w in ws:
            world.post(3, w)
        world.ring(3)
        for _ in range(100):
            await ctx.tick()
        assert world.tx == [] and world.cqes == []
        await event(3, formats.QpState.ERR.value)
        await wait(lambda: len(world.cqes) >= len(ws))
        for _ in range(50):
            await ctx.tick()

    run(world, script)
    assert [(c["wr_id"], c["status"], c["qpn"], c["cqn"]) for c in world.cqes] == [
        (w["wr_id"], S.WR_FLUSH_ERR.value, 3, world.qps[3]["send_cq"]) for w in ws]
    assert world.set_err == []


def test_flush_outstanding_on_err_event_then_reset():
    """ERR while messages are outstanding: they and the unfetched ones are flushed; a reset
    (RESET, then RTS with a new PSN) starts the queue again at index 0."""
    world = World(CFG, 14, bp=0.2, resp_lat=300)
    ws = [wqe(O.RDMA_WRITE, 10, SIG, local=GOOD["base"], remote=0x800000) for _ in range(10)]
    ws2 = [wqe(O.SEND, 10, SIG, local=GOOD["base"]) for _ in range(2)]
    world.final_psn[0] = None

    async def script(ctx, world, event, wait):
        await event(0, formats.QpState.RTS.value, 0)
        for w in ws:
            world.post(0, w)
        world.ring(0)
        await wait(lambda: len(world.tx) >= 3)
        await event(0, formats.QpState.ERR.value)
        await wait(lambda: len(world.cqes) >= len(ws))
        for _ in range(400):        # late ACKs are ignored
            await ctx.tick()
        n_tx = len(world.tx)
        await event(0, formats.QpState.RESET.value)
        await event(0, formats.QpState.RTS.value, 500)
        world.posted[0] = []
        for w in ws2:
            world.post(0, w)
        world.ring(0)
        await wait(lambda: len(world.cqes) >= len(ws) + 2)
        world.n_tx = n_tx

    run(world, script)
    assert all(c["status"] == S.WR_FLUSH_ERR.value for c in world.cqes[:len(ws)])
    assert [c["wr_id"] for c in world.cqes] == [w["wr_id"] for w in ws + ws2]
    assert all(c["status"] == 0 for c in world.cqes[len(ws):])
    assert [m["psn"] for _, _, m, _ in world.tx[world.n_tx:]] == [500, 501]
    assert world.wqe_reads[-1] == (world.qps[0]["sq_base"], 128)


def test_read_count_sum_through_err_and_reset():
    """Q_REQ_RD_OUT, the sum of every QP's READ/atomic count: READs of two QPs outstanding,
    one QP put in ERR (its READs flushed) and reset, then used again: the sum is what both
    QPs have outstanding, and 0 once everything completed."""
    world = World(CFG, 16, bp=0.2, resp_lat=300)
    ws = {q: [wqe(O.RDMA_READ, 8, SIG, local=GOOD["base"] + 0x8000 + 0x100 * i + 0x1000 * q,
                  remote=0x800000 + 0x100 * i) for i in range(6)] for q in (0, 1)}
    ws2 = [wqe(O.RDMA_READ, 8, SIG, local=GOOD["base"] + 0x9000, remote=0x800000)]
    world.final_psn[0] = None

    async def script(ctx, world, event, wait):
        for q in (0, 1):
            await event(q, formats.QpState.RTS.value, 0)
            for w in ws[q]:
                world.post(q, w)
            world.ring(q)
        await wait(lambda: len(world.tx) >= 8)
        await event(0, formats.QpState.ERR.value)
        await wait(lambda: len(world.cqes) >= 12)
        for _ in range(400):        # late responses are dropped
            await ctx.tick()
        await event(0, formats.QpState.RESET.value)
        await event(0, formats.QpState.RTS.value, 500)
        world.posted[0] = []
        for w in ws2:
            world.post(0, w)
        world.ring(0)
        await wait(lambda: len(world.cqes) >= 13)

    run(world, script)
    assert world.q_max["stat_q_rd_out"] >= 7 and world.q_last["stat_q_rd_out"] == 0
    assert sorted(c["status"] for c in world.cqes).count(0) >= 7


def test_doorbell_overflow():
    qps = {q: qp_ctx(q, sq_log_size=2) for q in range(4)}
    world = World(CFG, 15, bp=0.2, qps=qps)
    ws = [wqe(O.SEND, 4, SIG, local=GOOD["base"]) for _ in range(4)]
    world.final_psn[1] = None

    async def script(ctx, world, event, wait):
        await event(1, formats.QpState.RTS.value, 0)
        await event(2, formats.QpState.INIT.value, 0)
        for w in ws:
            world.post(1, w)
        world.ring(1)
        await wait(lambda: len(world.cqes) >= 4)
        world.ring(2, 5)             # 5 > 4 entries
        await wait(lambda: world.set_err)
        for _ in range(50):
            await ctx.tick()

    run(world, script)
    check_success(world, 1, ws)
    assert world.stats["stat_db_reject"] == 1
    assert world.set_err == [2]
    assert cqes_of(world, 2) == []           # the rejected doorbell posted nothing


def test_bad_cfg():
    with pytest.raises(ValueError, match="cfg must be a NicConfig"):
        Requester(None)
    for k in (0, 17, True, 2.0):
        with pytest.raises(ValueError, match=r"fetch_depth must be an integer in \[1, 16\]"):
            Requester(CFG, k)


@pytest.mark.parametrize("fetch_depth", [4, 1])
def test_wqe_fetches_overlap(fetch_depth):
    """One 8-byte READ posted on each of four QPs, DMA read latency L = 200 cycles: with four
    WQE fetches in flight the four requests leave within about L + 4 * c cycles of the
    doorbells (the fetches overlap); with one fetch in flight they take more than 4 * L."""
    L = 200
    world = World(CFG, 20 + fetch_depth, bp=0.0, resp_lat=10, dma_lat=L, fetch_depth=fetch_depth)
    rng = random.Random(20)
    setup_memory(world, rng)
    ws = {q: [wqe(O.RDMA_READ, 8, SIG, local=GOOD["base"] + 0x100 * q, remote=0x800000 + 0x10000 * q)]
          for q in range(4)}
    t_ring = []

    async def script(ctx, world, event, wait):
        for q in range(4):
            await event(q, formats.QpState.RTS.value, 0)
        for q in range(4):
            world.post(q, ws[q][0])
        t_ring.append(world.t)
        for q in range(4):
            world.ring(q)
        await wait(lambda: len(world.cqes) >= 4)

    for q in range(4):
        world.final_psn[q] = None
    run(world, script)
    for q in range(4):
        check_success(world, q, ws[q])
    assert sorted(q for _, q, _, _ in world.tx) == [0, 1, 2, 3]
    assert world.wqe_reads == [(world.qps[q]["sq_base"], 64) for q in range(4)]
    span = world.tx[-1][0] - t_ring[0]
    if fetch_depth == 4:
        assert span < L + 8 + 4 * 20, [t for t, *_ in world.tx]
    else:
        assert span > 4 * L, [t for t, *_ in world.tx]


def test_bad_responses_dropped():
    """Responses that do not concern the head message (a READ response for a PSN beyond the
    READ, an ACK of an old PSN) are ignored; the real response then completes the READ.
    (A response *for* the head message of the wrong kind or form fails it:
    test_bad_response_fails_the_wr.)"""
    world = World(CFG, 16, bp=0.3)
    rng = random.Random(16)
    setup_memory(world, rng)
    dst = GOOD["base"] + 0x8000
    world.fill(world.host, dst, bytes(300))
    ws = [wqe(O.RDMA_WRITE, 40, SIG, local=GOOD["base"], remote=0x800000),
          wqe(O.RDMA_READ, 100, SIG, local=dst, remote=0x801000)]
    world.inject[(0, 1)] = [
        (dict(opcode=B.READ_RESPONSE_ONLY.value, paylen=100, psn=7), bytes([0xDD]) * 100),  # wrong PSN
        (dict(opcode=B.ACKNOWLEDGE.value, psn=0xFFFFF0), b""),                            # old PSN
    ]
    world.final_psn[0] = None

    run(world, post_ring_wait(ws, 2, settle=50))
    check_success(world, 0, ws)
    assert world.get(world.host, dst, 300) == world.get(world.remote, 0x801000, 100) + bytes(200)
    assert world.set_err == []


@pytest.mark.parametrize("target,meta,pay", [
    (1, dict(opcode=B.READ_RESPONSE_ONLY.value, paylen=200), 200),   # longer than the READ
    (1, dict(opcode=B.READ_RESPONSE_ONLY.value, paylen=60), 60),     # shorter
    (1, dict(opcode=B.ATOMIC_ACKNOWLEDGE.value, orig=0x5555), 0),     # atomic ACK for a READ
    (2, dict(opcode=B.READ_RESPONSE_MIDDLE.value, paylen=256), 256),  # MIDDLE before FIRST
    (2, dict(opcode=B.READ_RESPONSE_LAST.value, paylen=44), 44),      # LAST as the first
    (2, dict(opcode=B.READ_RESPONSE_FIRST.value, paylen=100), 100),   # FIRST shorter than MTU
    (0, dict(opcode=B.READ_RESPONSE_ONLY.value, paylen=8), 8),        # READ response for a WRITE
    (0, dict(opcode=B.ATOMIC_ACKNOWLEDGE.value, orig=1), 0),          # atomic ACK for a WRITE
])
def test_bad_response_fails_the_wr(target, meta, pay):
    """IBA 9.7.5.1.3: a response for the oldest outstanding message of the wrong kind, or a
    READ response out of sequence (MIDDLE/LAST for the first packet, FIRST/MIDDLE for the last)
    or of the wrong length, completes that WR with BAD_RESP_ERR and moves the QP to ERR (the
    rest is flushed); nothing of it is written. Before the fix such responses were dropped,
    and a too-short READ response completed the READ as a success with truncated data."""
    world = World(CFG, 16, bp=0.3)
    setup_memory(world, random.Random(16))
    dst = GOOD["base"] + 0x8000
    world.fill(world.host, dst, bytes(0x800))
    ws = [wqe(O.RDMA_WRITE, 40, SIG, local=GOOD["base"], remote=0x800000),       # PSN 0
          wqe(O.RDMA_READ, 100, SIG, local=dst, remote=0x801000),               # PSN 1
          wqe(O.RDMA_READ, 300, SIG, local=dst + 0x400, remote=0x801000),       # PSN 2, 3
          wqe(O.RDMA_WRITE, 8, SIG, local=GOOD["base"], remote=0x800100)]       # PSN 4
    world.inject[(0, target)] = [(meta, bytes([0xEE]) * pay)]
    world.final_psn[0] = None
    run(world, err_script([], ws, len(ws)))
    check_error_sequence(world, 0, ws, target, S.BAD_RESP_ERR)
    assert world.set_err == [0]
    # no byte of a failed or flushed READ was written
    first_read = 1 if target <= 1 else 2
    for w in ws[first_read:3]:
        assert world.get(world.host, w["local_addr"], w["length"]) == bytes(w["length"])


def test_pipelined_dma():
    """With a long DMA read latency, payload reads of successive packets overlap (the send
    engine does not wait for one packet's data before requesting the next)."""
    world = World(CFG, 17, bp=0.0, resp_lat=10, dma_lat=100)
    rng = random.Random(17)
    setup_memory(world, rng)
    ws = [wqe(O.RDMA_WRITE, 64, SIG, local=GOOD["base"] + 64 * i, remote=0x800000 + 64 * i) for i in range(4)]
    ws.append(wqe(O.SEND, 1024, SIG, local=GOOD["base"]))
    world.final_psn[0] = None

    async def script(ctx, world, event, wait):
        await event(0, formats.QpState.RTS.value, 0)
        for w in ws:
            world.post(0, w)
        world.ring(0)
        await wait(lambda: len(world.cqes) >= len(ws))

    run(world, script)
    check_success(world, 0, ws)
    t0 = world.tx[0][0]
    # 8 packets; one DMA round trip each would take > 800 cycles (the second batch's WQE
    # fetch is one round trip, and each WQE waits 1 .. 8 cycles for its lkey's MR entry)
    assert len(world.tx) == 8
    assert world.tx[-1][0] - t0 < 400, [t for t, *_ in world.tx]


def test_doorbell_before_event_keeps_order():
    """A doorbell that waits while the engine is busy and a QP event that comes after it take
    effect in that order: the event's reset discards the doorbell."""
    world = World(CFG, 18, bp=0.0, dma_lat=100)
    rng = random.Random(18)
    setup_memory(world, rng)
    w0 = [wqe(O.RDMA_WRITE, 8, SIG, local=GOOD["base"], remote=0x800000)]
    stale = [wqe(O.SEND, 8, SIG, local=GOOD["base"]) for _ in range(2)]
    fresh = [wqe(O.SEND, 16, SIG, local=GOOD["base"] + 0x100)]
    world.final_psn[0] = None

    async def script(ctx, world, event, wait):
        await event(0, formats.QpState.RTS.value, 0)
        await event(1, formats.QpState.INIT.value, 0)
        for _ in range(3):
            await ctx.tick()
        world.post(0, w0[0])
        world.ring(0)
        await wait(lambda: len(world.wqe_reads) == 1)       # the engine waits for the WQE
        for w in stale:
            world.post(1, w)
        world.ring(1)
        await ctx.tick()
        await ctx.tick()
        assert world.db_q == deque()                         # taken by the doorbell driver
        await event(1, formats.QpState.RESET.value, 0)       # resets QP 1: pi = ci = 0
        await event(1, formats.QpState.RTS.value, 40)        # (as INIT -> RTR -> RTS would)
        await wait(lambda: len(world.cqes) >= 1)
        for _ in range(300):
            await ctx.tick()
        assert [q for _, q, _, _ in world.tx] == [0]
        world.posted[1] = []
        world.post(1, fresh[0])
        world.ring(1)
        await wait(lambda: len(world.cqes) >= 2)

    run(world, script)
    check_success(world, 0, w0)
    check_success(world, 1, fresh, 40)


def test_large_messages_many_qps():
    """Messages up to 20000 bytes (79 packets) on three of eight QPs, 16 outstanding, sq of 64."""
    cfg = NicConfig(data_bytes=8, mtu=256, n_qps=8, n_mrs=8, n_cqs=8, max_outstanding=16)
    qps = {q: qp_ctx(q, sq_log_size=6) for q in range(8)}
    world = World(cfg, 2, bp=0.2, qps=qps, resp_lat=30, dma_lat=20)
    rng = random.Random(2)
    setup_memory(world, rng)
    plan = {}
    for q in (0, 1, 5):
        ws = []
        for i in range(7):
            op = rng.choice([O.RDMA_WRITE, O.RDMA_READ, O.SEND, O.RDMA_WRITE_WITH_IMM, O.ATOMIC_FETCH_AND_ADD])
            size = 8 if op == O.ATOMIC_FETCH_AND_ADD else rng.choice(
                [0, 1, 64, rng.randrange(1, 4096), rng.randrange(4096, 20000)])
            local = GOOD["base"] + (0x8000 if op not in (O.RDMA_READ, O.ATOMIC_FETCH_AND_ADD) else 0)
            ws.append(wqe(op, size, SIG if rng.random() < 0.8 else 0, local=local,
                          remote=0x800000 + q * 0x10000, cmp=3))
        ws[-1]["flags"] |= SIG
        plan[q] = ws

    async def script(ctx, world, event, wait):
        for q in plan:
            await event(q, formats.QpState.RTS.value, 0)
        for q in plan:
            for w in plan[q]:
                world.post(q, w)
            world.ring(q)
        need = sum(1 for q in plan for w in plan[q] if w["flags"] & SIG)
        await wait(lambda: len(world.cqes) >= need, limit=60000)

    run(world, script, max_cycles=60000)
    for q in plan:
        check_success(world, q, plan[q])
    assert max(len(p) for _, _, _, p in world.tx) == 256


def test_responses_while_tx_blocked():
    """Deadlock freedom: tx.meta.ready is held low for a long time while the send engine is in
    the middle of a long message (its payload buffer full). The responses to the messages
    already sent (ACKs, READ data, atomic ACK) keep arriving on rx: they must all be accepted
    and their completions (and READ / atomic results) must come out while tx is still blocked."""
    world = World(CFG, 19, bp=0.2, resp_lat=20)
    rng = random.Random(19)
    setup_memory(world, rng)
    rd_dst = GOOD["base"] + 0x8000
    pre = [wqe(O.RDMA_WRITE, 300, SIG, local=GOOD["base"], remote=0x800000),
           wqe(O.RDMA_READ, 700, SIG, local=rd_dst, remote=0x801000),
           wqe(O.ATOMIC_FETCH_AND_ADD, 8, SIG, local=GOOD["base"] + 0xF000, remote=0x802000, cmp=9),
           wqe(O.SEND, 40, SIG, local=GOOD["base"] + 0x100)]
    big = wqe(O.RDMA_WRITE, 6000, SIG, local=GOOD["base"], remote=0x803000)      # 24 packets
    qps = (0, 2)
    plan = {q: [dict(w, wr_id=None) for w in pre] + [dict(big, wr_id=None)] for q in qps}
    n_pre = sum(len(expected_packets(world, 0, pre, 0)) for _ in qps)
    BLOCK = 2500
    world.tx_block = (n_pre, BLOCK)
    for q in qps:
        world.final_psn[q] = None
    seen = {}

    async def script(ctx, world, event, wait):
        for q in qps:
            await event(q, formats.QpState.RTS.value, 0)
        for q in qps:
            for w in plan[q]:
                world.post(q, w)
            world.ring(q)
        await wait(lambda: world.tx_block_t is not None)
        # the responses to everything sent before the block come in and complete, tx blocked
        await wait(lambda: len(world.cqes) >= len(pre) * len(qps), limit=BLOCK - 500)
        for _ in range(100):
            await ctx.tick()
        seen["blocked"] = world.t < world.tx_block_t + BLOCK
        seen["tx"] = len(world.tx)
        seen["resp_left"] = len(world.resp)
        seen["cqes"] = len(world.cqes)
        await wait(lambda: len(world.cqes) >= len(pre) * len(qps) + len(qps), limit=30000)

    run(world, script, max_cycles=30000)
    assert seen == dict(blocked=True, tx=n_pre, resp_left=0, cqes=len(pre) * len(qps))
    for q in qps:
        check_success(world, q, plan[q])
        assert world.get(world.host, rd_dst, 700) == world.get(world.remote, 0x801000, 700)
    assert int.from_bytes(world.get(world.host, GOOD["base"] + 0xF000, 8), "little") == \
        int.from_bytes(world.get(world.remote, 0x802000, 8), "little") - 9


@pytest.mark.parametrize("op", [O.RDMA_READ, O.RDMA_WRITE])
def test_requests_back_to_back(op):
    """The send engine issues a one-packet READ or WRITE every four cycles while its WQEs
    are there: the WQE taken (its lkey's MR entry asked for), the MR cache's answer (in whose
    cycle the WQE is checked and enters the tracker), the header queued. Four QPs post eight
    each; their WQE batches arrive ahead of the engine (a 64-byte data path: a WQE a beat),
    the MR entries two cycles after they are asked for (a hit of the MR cache)."""
    cfg = NicConfig(data_bytes=64, mtu=256, n_qps=4, n_mrs=4, n_cqs=4, max_outstanding=8)
    world = World(cfg, 29, bp=0.0, resp_lat=10, dma_lat=2)
    world.mr_lat = 2                    # as the MR cache answers a hit
    setup_memory(world, random.Random(29))
    qps = (0, 1, 2, 3)
    plan = {q: [wqe(op, 8, SIG, local=GOOD["base"] + 0x8000 + 0x100 * (8 * q + k),
                    remote=0x800000 + 0x100 * (8 * q + k)) for k in range(8)] for q in qps}

    async def script(ctx, world, event, wait):
        for q in qps:
            await event(q, formats.QpState.RTS.value, 0)
        for q in qps:
            for w in plan[q]:
                world.post(q, w)
            world.ring(q)
        await wait(lambda: len(world.cqes) >= 32, limit=8000)

    run(world, script, max_cycles=10000)
    for q in qps:
        check_success(world, q, plan[q])
    times = [t for t, _, _, _ in world.tx]
    assert len(times) == 32
    gaps = sorted(b - a for a, b in zip(times, times[1:]))
    assert gaps[len(gaps) // 2] <= 4, gaps


@pytest.mark.parametrize("op", [O.RDMA_READ, O.RDMA_WRITE])
def test_responses_back_to_back(op):
    """Responses that wait at the requester's input are handled back to back, a one-beat
    READ response or the ACK of a signaled WRITE every four cycles: the take, the head
    message's WQE-cache lookup, its answer (in whose cycle the response is checked, the
    READ data written and the message popped), the CQE (in whose cycle the next response is
    taken). Held back until everything is sent, 32 responses of four QPs then arrive as fast
    as the engine takes them."""
    world = World(CFG, 23, bp=0.0, resp_lat=10)
    world.rx_from = 4000
    setup_memory(world, random.Random(23))
    qps = (0, 1, 2, 3)
    plan = {q: [wqe(op, 8, SIG, local=GOOD["base"] + 0x8000 + 0x100 * (8 * q + k),
                    remote=0x800000 + 0x100 * (8 * q + k)) for k in range(8)] for q in qps}

    async def script(ctx, world, event, wait):
        for q in qps:
            await event(q, formats.QpState.RTS.value, 0)
        for q in qps:
            for w in plan[q]:
                world.post(q, w)
            world.ring(q)
        await wait(lambda: len(world.cqes) >= 32, limit=8000)

    run(world, script, max_cycles=10000)
    for q in qps:
        check_success(world, q, plan[q])
    times = [t for t, _ in world.rx_log]
    assert len(times) == 32 and times[0] >= world.rx_from
    gaps = sorted(b - a for a, b in zip(times, times[1:]))
    assert gaps[len(gaps) // 2] <= 4, gaps


def test_wqe_fetches_overlap_random_bp():
    """Four QPs posting mixed messages in several rounds, fetches overlapping (three in flight),
    random back-pressure: each QP's packets and completions are in order and correct."""
    world = World(CFG, 21, bp=0.3, resp_lat=40, dma_lat=60, fetch_depth=3)
    rng = random.Random(21)
    setup_memory(world, rng)
    ws = {q: [] for q in range(4)}
    for q in range(4):
        for i in range(6):
            op = rng.choice([O.RDMA_WRITE, O.SEND, O.RDMA_READ])
            ln = rng.choice([8, 40, 300])
            ws[q].append(wqe(op, ln, SIG, local=GOOD["base"] + 0x1000 * q + 0x200 * i,
                             remote=0x800000 + 0x10000 * q + 0x400 * i))

    async def script(ctx, world, event, wait):
        for q in range(4):
            await event(q, formats.QpState.RTS.value, 0)
        for r in range(3):
            for q in range(4):
                for w in ws[q][2 * r:2 * r + 2]:
                    world.post(q, w)
                world.ring(q)
            for _ in range(rng.randrange(0, 200)):
                await ctx.tick()
        await wait(lambda: len(world.cqes) >= 24)

    for q in range(4):
        world.final_psn[q] = None
    run(world, script)
    for q in range(4):
        check_success(world, q, ws[q])


# ---------------------------------------------------------------------------------------
# the host failing the requester's DMA (docs/errors.md)

def err_script(first, then, n_cqes):
    """QP 0 to RTS; post ``first`` and wait for their completions; post ``then``; when the
    requester asks for ERR, deliver the ERR event as the context would; wait for n_cqes."""
    async def script(ctx, world, event, wait):
        await event(0, formats.QpState.RTS.value, 0)
        for w in first:
            world.post(0, w)
        if first:
            world.ring(0)
            await wait(lambda: len(world.cqes) >= sum(1 for w in first if w["flags"] & SIG))
        for w in then:
            world.post(0, w)
        world.ring(0)
        await wait(lambda: world.set_err)
        await event(0, formats.QpState.ERR.value)
        await wait(lambda: len(world.cqes) >= n_cqes)
        for _ in range(200):
            await ctx.tick()
    return script


def test_wqe_read_failure():
    """The host fails the read of a batch of WQEs: the first completes with LOC_QP_OP_ERR
    (wr_id unknown: 0), the QP goes to ERR, the rest are flushed; nothing is sent for them."""
    world = World(CFG, 31, bp=0.2)
    rng = random.Random(31)
    setup_memory(world, rng)
    ok = [wqe(O.RDMA_WRITE, 8, SIG, local=GOOD["base"], remote=0x800000) for _ in range(2)]
    bad = [wqe(O.RDMA_WRITE, 8, SIG, local=GOOD["base"], remote=0x800000) for _ in range(3)]
    sq = world.qps[0]["sq_base"]
    world.fail = lambda a, n, w: not w and a < sq + 64 * 5 and a + n > sq + 64 * 2
    world.final_psn[0] = None
    run(world, err_script(ok, bad, 5))
    got = [(c["wr_id"], c["status"]) for c in cqes_of(world, 0)]
    assert got == [(w["wr_id"], 0) for w in ok] + [(0, S.LOC_QP_OP_ERR.value)] + [
        (0, S.WR_FLUSH_ERR.value)] * 2
    assert len(world.tx) == 2 and world.set_err == [0]


def test_payload_read_failure():
    """The host fails the payload read of a WRITE: its packets are not sent, it completes
    with LOC_PROT_ERR, the QP goes to ERR and the next WR is flushed."""
    world = World(CFG, 32, bp=0.2)
    rng = random.Random(32)
    setup_memory(world, rng)
    src = GOOD["base"] + 0x4000
    ok = [wqe(O.RDMA_WRITE, 300, SIG, local=GOOD["base"], remote=0x800000)]
    bad = [wqe(O.RDMA_WRITE, 600, SIG, local=src, remote=0x810000),
           wqe(O.SEND, 8, SIG, local=GOOD["base"])]
    world.fail = lambda a, n, w: not w and src <= a < src + 600
    world.final_psn[0] = None
    run(world, err_script(ok, bad, 3))
    got = [(c["wr_id"], c["status"]) for c in cqes_of(world, 0)]
    assert got == [(ok[0]["wr_id"], 0), (bad[0]["wr_id"], S.LOC_PROT_ERR.value),
                   (bad[1]["wr_id"], S.WR_FLUSH_ERR.value)]
    # the WRITE of 600 bytes (3 packets) never left: the only packets are the first WRITE's 2
    # and maybe the SEND's
    assert not any(m["va"] == 0x810000 for _, _, m, _ in world.tx)
    assert world.stats["stat_dma_err"] == 1 and world.set_err[0] == 0


@pytest.mark.parametrize("signaled", [SIG, 0])
def test_read_data_write_failure(signaled):
    """The host fails the write of a READ's data into the local buffer: the READ completes
    with LOC_PROT_ERR even if unsignaled (after its write was answered), the QP goes to ERR."""
    world = World(CFG, 33, bp=0.2)
    rng = random.Random(33)
    setup_memory(world, rng)
    dst = GOOD["base"] + 0x2000
    ok = [wqe(O.RDMA_READ, 16, SIG, local=GOOD["base"] + 0x100, remote=0x800000)]
    bad = [wqe(O.RDMA_READ, 64, signaled, local=dst, remote=0x800100),
           wqe(O.RDMA_WRITE, 8, SIG, local=GOOD["base"], remote=0x800000)]
    world.fail = lambda a, n, w: w and dst <= a < dst + 64
    world.final_psn[0] = None
    run(world, err_script(ok, bad, 3))
    got = [(c["wr_id"], c["status"]) for c in cqes_of(world, 0)]
    assert got[:2] == [(ok[0]["wr_id"], 0), (bad[0]["wr_id"], S.LOC_PROT_ERR.value)]
    assert got[2] in ((bad[1]["wr_id"], 0), (bad[1]["wr_id"], S.WR_FLUSH_ERR.value))
    assert world.set_err == [0] and world.stats["stat_dma_err"] == 1
    # the failed completion was not announced before the host answered the write
    t_cqe = [c["t"] for c in world.cqes if c["status"]][0]
    t_data = max(t for t, m in world.rx_log if m["opcode"] == B.READ_RESPONSE_ONLY.value)
    assert t_cqe >= t_data + world.wr_lat


# ---------------------------------------------------------------------------------------
# BlueFlame (hw/rnic/bf_buffer.py): WQEs handed over with their doorbell


def test_blueflame_posts_need_no_wqe_fetch():
    """One WR at a time by BlueFlame, each after the previous completed: every WQE is sent
    from its BlueFlame copy, none is read from the send queue."""
    world = World(CFG, 40, bp=0.2)
    rng = random.Random(40)
    setup_memory(world, rng)
    ws = random_wqes(world, rng, 8, 0, ops=[O.RDMA_WRITE, O.SEND, O.RDMA_READ, O.ATOMIC_FETCH_AND_ADD],
                     flags_p=1.0)
    world.final_psn[0] = None

    async def script(ctx, world, event, wait):
        await event(0, formats.QpState.RTS.value, 0)
        for k, w in enumerate(ws):
            world.post(0, w)
            world.ring(0, bf=True)
            await wait(lambda: len(world.cqes) >= k + 1)
        for _ in range(50):
            await ctx.tick()

    run(world, script)
    check_success(world, 0, ws)
    assert world.wqe_reads == []
    assert world.stats["stat_bf_hit"] == 8 and world.stats["stat_bf_miss"] == 0


def test_blueflame_copies_dropped_when_behind():
    """Six BlueFlame writes before the QP can send: the four entries keep the copies of
    WQEs 2..5 (0 and 1 replaced: 2 misses); WQE 0 is fetched by DMA in a batch of four,
    which drops the copies of 2 and 3 (2 more misses); 4 and 5 are sent from their copies."""
    world = World(CFG, 41, bp=0.0)
    rng = random.Random(41)
    setup_memory(world, rng)
    ws = [wqe(O.RDMA_WRITE, 8, SIG, local=GOOD["base"] + 8 * i, remote=0x800000 + 8 * i)
          for i in range(6)]
    world.final_psn[0] = 5

    async def script(ctx, world, event, wait):
        await event(0, formats.QpState.INIT.value)      # the QP exists (its SQ size known)
        for w in ws:
            world.post(0, w)
            world.ring(0, bf=True)
        await wait(lambda: not world.db_q)
        for _ in range(10):
            await ctx.tick()
        await event(0, formats.QpState.RTS.value, 0)
        await wait(lambda: len(world.cqes) >= 6)
        for _ in range(50):
            await ctx.tick()

    run(world, script)
    check_success(world, 0, ws)
    assert world.wqe_reads == [(world.qps[0]["sq_base"], 4 * 64)]
    assert world.stats["stat_bf_hit"] == 2 and world.stats["stat_bf_miss"] == 4


@pytest.mark.parametrize("seed,bp", [(42, 0.0), (43, 0.4)])
def test_blueflame_mixed(seed, bp):
    """Several QPs, WQEs rung by BlueFlame or by batched doorbells at random: everything is
    sent once and right, and the BlueFlame copies spare some WQE reads."""
    world = mixed(seed, bp, bf_p=0.5)
    assert world.stats["stat_bf_hit"] > 0
    assert len(wqe_slots_read(world)) + world.stats["stat_bf_hit"] >= 36
