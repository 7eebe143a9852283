"""hw/rnic/packet_emitter.py against a Python model, driven like the requester's send FSM.

Per packet (random payload length 0 or 1..mtu, random header bits, QP and tracker slot) the
bench waits for ``res_fits`` with ``res_len`` = paylen, pulses ``res_take`` (reserving the
room) and queues the descriptor on ``desc``; a DMA stand-in delivers the payload on ``pay``
some cycles after the reservation, in request order, with ``err`` on the last beat of the
packets chosen to fail. ``tx.meta`` and ``tx.payload`` see random back-pressure, ``perr`` is
taken after a random delay. Checked every cycle:

* packets leave in descriptor order: a good one as its header on ``tx.meta`` and exactly
  its payload beats on ``tx.payload`` (bytes equal), after the payloads of the headers
  before it; a header may go while the previous packet's payload flows (one ahead at
  most); a failed one never on ``tx`` but on ``perr`` with its QP, slot and PSN, held
  until taken, and only once every payload before it has left;
* store and forward: no header (nor perr) before the last beat of its payload was given;
* the reservation: ``res_fits`` never lets the reserved-but-unsent beats exceed
  ``pay_buffers * mtu / W`` and, once no failed payload is being skipped, says exactly
  whether ``res_len`` still fits; ``pay.ready`` is always 1;
* ``desc`` back-pressure: with ``desc_depth`` = 2 and ``tx.meta`` held low the FIFO takes
  two descriptors, then ``desc.ready`` stays low, and nothing is lost afterwards.
"""

import dataclasses
import random

import pytest
from amaranth.sim import Simulator

from hw import formats
from hw.config import NicConfig
from hw.interfaces import beat_layout, dma_rd_data_layout
from hw.rnic.packet_emitter import PacketEmitter

W = 8
CFG = NicConfig(data_bytes=W, mtu=256, n_qps=4, n_mrs=4, n_cqs=4, max_outstanding=8)
CFGS = {
    "base": CFG,
    "pay1": dataclasses.replace(CFG, pay_buffers=1),
    "desc2": dataclasses.replace(CFG, desc_depth=2),
}
META = formats.PKT_META
BEAT = beat_layout(W)
RD = dma_rd_data_layout(W)


def pack(layout, **fields):
    return sum(v << layout[k].offset for k, v in fields.items())


def field(layout, value, name):
    f = layout[name]
    return (value >> f.offset) & ((1 << f.width) - 1)


def nbeats(nbytes):
    return -(-nbytes // W)


@dataclasses.dataclass
class Pkt:
    paylen: int
    meta: int       # PKT_META bits
    qpn: int
    slot: int
    err: bool       # the host fails its payload read
    data: bytes

    @property
    def psn(self):
        return field(META, self.meta, "psn")

    def beats(self):
        """(data, nbytes, last) of each payload beat."""
        n = nbeats(self.paylen)
        return [(int.from_bytes(self.data[i * W:(i + 1) * W], "little"),
                 len(self.data[i * W:(i + 1) * W]), int(i == n - 1)) for i in range(n)]


def make_packets(cfg, rng, n, p_err):
    pkts = []
    for _ in range(n):
        r = rng.random()
        if r < 0.2:
            paylen = 0
        elif r < 0.45:     # the edges: one byte, around a beat, around the MTU
            paylen = rng.choice([1, W - 1, W, W + 1, cfg.mtu - W, cfg.mtu - 1, cfg.mtu])
        else:
            paylen = rng.randint(1, cfg.mtu)
        off = META["paylen"].offset
        meta = rng.getrandbits(META.size) & ~(0xFFFF << off) | (paylen << off)
        pkts.append(Pkt(paylen, meta, rng.randrange(cfg.n_qps), rng.randrange(cfg.max_outstanding),
                        paylen != 0 and rng.random() < p_err, rng.randbytes(paylen)))
    return pkts


def run(cfg, seed, n=100, p_err=0.25, p_meta=0.6, p_pay=0.6, p_beat=0.8, max_delay=12,
        perr_delays=(0, 0, 1, 3, 12), stall=0):
    """Send ``n`` random packets through a PacketEmitter, checking every cycle (see the module
    docstring); ``tx.meta.ready`` is held low for the first ``stall`` cycles. Returns counters."""
    rng = random.Random(seed)
    dut = PacketEmitter(cfg)
    cap = cfg.pay_buffers * cfg.mtu // W
    assert dut.pay_beats == cap
    pkts = make_packets(cfg, rng, n, p_err)
    dl = dut.desc_layout
    st = dict(cycles=0, sent=0, ahead=0, perrs=[], res_wait=0, max_out=0, perr_blocked=0, stall=None)

    async def tb(ctx):
        pi, res_done, desc_done, gap = 0, False, False, 0   # the send FSM's packet
        pushed = 0
        dma = []              # [packet, first cycle] reserved, payload not yet all given
        beat_i = 0            # next beat of dma[0]
        last_beat = {}        # packet -> cycle its last payload beat was given on pay
        out = 0               # beats reserved and not yet sent (a failed one's: until its perr)
        unsure = -1           # until this cycle the emitter may still be skipping a payload
        oi = 0                # next packet, in descriptor order, to leave on tx or perr
        due = []              # [packet, beat] whose payloads are due on tx.payload, in order
        perr_cur, perr_wait = None, 0
        cycle = 0
        while oi < n or due or perr_cur is not None:
            assert cycle < 150 * n + 2000, f"stuck at packet {oi}"
            # ---- the send FSM: descriptor and reservation of packet pi, in parallel
            active = pi < n and gap == 0
            p = pkts[pi] if active else None
            ctx.set(dut.desc.valid, active and not desc_done)
            ctx.set(dut.desc.payload.as_value(),
                    pack(dl, meta=p.meta, qpn=p.qpn, slot=p.slot) if active else 0)
            res_len = p.paylen if active else rng.randint(0, cfg.mtu)
            ctx.set(dut.res_len, res_len)
            fits = ctx.get(dut.res_fits)
            b = nbeats(res_len)
            if fits:
                assert out + b <= cap, f"cycle {cycle}: fits {b} beats with {out} of {cap} reserved"
            if cycle > unsure:
                assert fits == (out + b <= cap), f"cycle {cycle}: res_fits {fits}, {out}+{b} of {cap}"
            want = active and not res_done and p.paylen != 0
            st["res_wait"] += want and not fits
            take = want and fits and rng.random() < 0.7
            push = active and not desc_done and ctx.get(dut.desc.ready)
            ctx.set(dut.res_take, take)
            # ---- the DMA read data, in reservation order, never back-pressured
            pay_v = bool(dma) and cycle >= dma[0][1] and rng.random() < p_beat
            if pay_v:
                k = dma[0][0]
                d, nb, last = pkts[k].beats()[beat_i]
                ctx.set(dut.pay.payload.as_value(),
                        pack(RD, data=d, nbytes=nb, last=last, tag=rng.getrandbits(16),
                             err=int(pkts[k].err and last)))
            ctx.set(dut.pay.valid, pay_v)
            assert ctx.get(dut.pay.ready) == 1, f"cycle {cycle}: pay back-pressured"
            # ---- tx.payload, then tx.meta
            m_rdy = cycle >= stall and rng.random() < p_meta
            p_rdy = rng.random() < p_pay
            ctx.set(dut.tx.meta.ready, m_rdy)
            ctx.set(dut.tx.payload.ready, p_rdy)
            m_v, t_v = ctx.get(dut.tx.meta.valid), ctx.get(dut.tx.payload.valid)
            if t_v:
                assert due, f"cycle {cycle}: payload beat without a header"
                k, j = due[0]
                d, nb, last = pkts[k].beats()[j]
                assert ctx.get(dut.tx.payload.payload.as_value()) == pack(BEAT, data=d, nbytes=nb, last=last), \
                    f"cycle {cycle}: packet {k} beat {j}"
                if p_rdy:
                    out -= 1
                    if last:
                        due.pop(0)
                    else:
                        due[0] = [k, j + 1]
            if m_v:
                # one header ahead at most: the next one while a payload flows
                assert len(due) <= 1, f"cycle {cycle}: header with packets {due} due"
                st["ahead"] += bool(due) and m_rdy
                assert oi < n and not pkts[oi].err, f"cycle {cycle}: header, packet {oi} due"
                q = pkts[oi]
                assert ctx.get(dut.tx.meta.payload.as_value()) == q.meta, f"cycle {cycle}: packet {oi}"
                if q.paylen:
                    assert last_beat.get(oi, cycle) < cycle, f"cycle {cycle}: packet {oi} not stored"
                if m_rdy:
                    if q.paylen:
                        due.append([oi, 0])
                    oi += 1
                    st["sent"] += 1
            # ---- perr: checked while held, taken after a random delay
            e_v = ctx.get(dut.perr.valid)
            e_take = False
            if e_v:
                got = (ctx.get(dut.perr.payload.qpn), ctx.get(dut.perr.payload.slot),
                       ctx.get(dut.perr.payload.psn))
                if perr_cur is None:
                    assert oi < n and pkts[oi].err, f"cycle {cycle}: perr {got}, packet {oi} due"
                    q = pkts[oi]
                    assert got == (q.qpn, q.slot, q.psn), f"cycle {cycle}: perr of packet {oi}"
                    assert last_beat.get(oi, cycle) < cycle, f"cycle {cycle}: packet {oi} not stored"
                    assert not due
                    out -= nbeats(q.paylen)           # skipped from now on
                    unsure = cycle + nbeats(q.paylen) + 2
                    perr_cur, perr_wait = got, rng.choice(perr_delays)
                    oi += 1
                assert got == perr_cur, f"cycle {cycle}: perr changed while held"
                e_take = perr_wait == 0
                perr_wait -= 1
                if oi < n and pkts[oi].err and last_beat.get(oi, cycle) < cycle - 3:
                    st["perr_blocked"] += 1     # a second failure waits for this one
            else:
                assert perr_cur is None, f"cycle {cycle}: perr dropped before taken"
            ctx.set(dut.perr.ready, e_take)
            if cycle == stall - 1:
                st["stall"] = dict(pushed=pushed, perrs=len(st["perrs"]) + (perr_cur is not None),
                                   desc_ready=ctx.get(dut.desc.ready), waiting=active and not desc_done)
            await ctx.tick()
            # ---- after the clock edge
            if e_take:
                st["perrs"].append(perr_cur)
                perr_cur = None
            if pay_v:
                beat_i += 1
                if beat_i == nbeats(pkts[dma[0][0]].paylen):
                    last_beat[dma.pop(0)[0]] = cycle
                    beat_i = 0
            if take:
                res_done = True
                out += b
                dma.append([pi, cycle + rng.randint(1, max_delay)])
            if push:
                desc_done = True
                pushed += 1
            if active and desc_done and (res_done or p.paylen == 0):
                pi, res_done, desc_done, gap = pi + 1, False, False, rng.choice([0, 0, 0, 1, 4])
            elif gap:
                gap -= 1
            st["max_out"] = max(st["max_out"], out)
            cycle += 1
        # everything sent: the whole buffer is free again
        assert out == 0 and not dma and pi == n
        for _ in range(cap + 4):
            await ctx.tick()
        ctx.set(dut.res_len, cap * W)
        assert ctx.get(dut.res_fits) == 1
        ctx.set(dut.res_len, cap * W + 1)
        assert ctx.get(dut.res_fits) == 0
        st["cycles"] = cycle

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()
    good = [p for p in pkts if not p.err]
    assert st["sent"] == len(good)
    assert st["perrs"] == [(p.qpn, p.slot, p.psn) for p in pkts if p.err]
    st["pkts"] = pkts
    return st


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("cfg", list(CFGS), ids=list(CFGS))
def test_against_model(cfg, seed):
    """Good packets whole and in order, failed ones on perr in order; store and forward; the
    reservation (checked inside run) under random back-pressure."""
    st = run(CFGS[cfg], seed)
    assert len(st["perrs"]) > 5 and st["sent"] > 50
    assert st["ahead"] > 0      # headers did go while a payload flowed
    assert st["max_out"] <= CFGS[cfg].pay_buffers * CFGS[cfg].mtu // W


@pytest.mark.parametrize("seed", [4, 5])
def test_one_mtu_outstanding(seed):
    """pay_buffers=1, slow output: at most one MTU of payload reserved or buffered, and the
    reservation does hold the send FSM back."""
    cfg = CFGS["pay1"]
    st = run(cfg, seed, n=60, p_meta=0.3, p_pay=0.3, max_delay=4)
    assert cfg.mtu // W // 2 < st["max_out"] <= cfg.mtu // W
    assert st["res_wait"] > 100


@pytest.mark.parametrize("seed", [6, 7])
def test_failures_one_at_a_time(seed):
    """Many failed payload reads, perr taken late: a second failure waits for the first to
    be taken, none is lost or merged, later good packets still follow in order."""
    st = run(CFG, seed, n=60, p_err=0.6, perr_delays=(0, 5, 20, 40))
    assert len(st["perrs"]) >= 15 and st["perr_blocked"] > 0


@pytest.mark.parametrize("seed", [8, 9])
def test_desc_backpressure(seed):
    """desc_depth=2 with tx.meta held low: the FIFO takes two descriptors (besides those
    dropped to perr), then desc.ready stays low; afterwards every packet comes out."""
    cfg = CFGS["desc2"]
    st = run(cfg, seed, n=40, p_err=0.2, stall=400)
    s = st["stall"]
    assert s["waiting"] and not s["desc_ready"]
    assert s["pushed"] - s["perrs"] == cfg.desc_depth


def test_back_to_back_packets():
    """Two-beat packets, payloads stored, tx always ready: a header goes while the previous
    payload flows, so a beat leaves every cycle (two cycles per packet; three before
    2026-12-08, when the next header waited for the cycle after the last beat)."""
    dut = PacketEmitter(CFG)
    dl = dut.desc_layout
    n = 8
    beats = []

    async def tb(ctx):
        for k in range(n):      # payload first, then the descriptor: all stored
            ctx.set(dut.res_len, 2 * W)
            ctx.set(dut.res_take, 1)
            for j in range(2):
                ctx.set(dut.pay.valid, 1)
                ctx.set(dut.pay.payload.as_value(), pack(RD, data=k * 2 + j, nbytes=W, last=j))
                await ctx.tick()
                ctx.set(dut.res_take, 0)
            ctx.set(dut.pay.valid, 0)
        off = META["paylen"].offset
        for k in range(n):
            ctx.set(dut.desc.valid, 1)
            ctx.set(dut.desc.payload.as_value(), pack(dl, meta=(2 * W) << off | k, qpn=0, slot=0))
            await ctx.tick()
        ctx.set(dut.desc.valid, 0)
        ctx.set(dut.tx.meta.ready, 1)
        ctx.set(dut.tx.payload.ready, 1)
        for cycle in range(60):
            if ctx.get(dut.tx.payload.valid):
                beats.append((cycle, ctx.get(dut.tx.payload.payload.data)))
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()
    assert [d for _, d in beats] == list(range(2 * n))
    cycles = [c for c, _ in beats]
    assert cycles == list(range(cycles[0], cycles[0] + 2 * n))
