"""ResponseQueue (hw/rnic/response_queue.py) against an independent Python model.

One Amaranth testbench drives the block every cycle: it pushes descriptors (random gaps, or
back to back while ``tx`` is held), feeds the atomic unit's results in order some random
time after their RESP_ATOMIC_PEND went in, answers the DMA reads in order after a random
latency from a Python memory (random gaps between beats, ``err`` on the reads told to fail)
and takes ``tx`` and ``set_err`` with random back-pressure. :func:`model` says what must
leave: every response in queue order (ACK/NAK, READ_RESPONSE FIRST/MIDDLE/LAST/ONLY with
their payload, ATOMIC_ACKNOWLEDGE), which ACKs are coalesced (exactly while ``tx`` is
held, when the queue's occupancy is known; with ``tx`` running, the coalescing seen must be
of an ACK onto its QP's newest and give the same output), the DMA reads, the QP-error
requests and the statistics pulses. Every run also checks: the stream rule (no valid withdrawn, no payload
changed before ``ready``) on tx, rd.req and set_err; DMA data always taken (rule 2); store
and forward (a READ packet's header only after its data's last beat); a READ behind a
pending atomic not requested before that atomic's result came in.
"""

import random

import pytest
from amaranth.sim import Simulator

from hw.config import NicConfig
from hw.formats import BthOpcode as Op, AethSyndrome as Syn, PKT_META, unpack
from hw.rnic.response_queue import (ResponseQueue, READ_DMA_TAG, RESP_ACK, RESP_READ, RESP_ATOMIC,
                                    RESP_ATOMIC_PEND)

CFG = NicConfig(data_bytes=8, mtu=256, n_qps=4, n_mrs=4, n_cqs=4)
W, MTU = CFG.data_bytes, CFG.mtu
QD = CFG.n_qps * CFG.max_outstanding        # queue entries (4 * 32)
NODE = 0x5A
BASE = 0xFFFF_0000_0000                     # host address of mem[0]
MEM_SIZE = 0x2000
M24 = (1 << 24) - 1
ACK = Syn.ACK.value
OP_ERR = Syn.NAK_REM_OP_ERR.value
PULSES = {"naks": "stat_nak", "dma_errs": "stat_dma_err", "at_sent": "at_sent",
          "resp_full": "stat_resp_full", "coalesce": "stat_coalesce"}
NAKS = [Syn.RNR_NAK.value | 0x0E, Syn.NAK_PSN_SEQ_ERR.value, Syn.NAK_INV_REQ.value,
        Syn.NAK_REM_ACCESS_ERR.value, OP_ERR, Syn.NAK_INV_RD_REQ.value]


# ---------------------------------------------------------------------------------------
# descriptors

def entry(rng, kind, qpn, syn=ACK, length=0, arg=0):
    psn = M24 - rng.randrange(3) if rng.random() < 0.2 else rng.randrange(1 << 24)  # PSN wrap
    return dict(kind=kind, psn=psn, syn=syn, msn=rng.randrange(1 << 24), dest_node=rng.randrange(256),
                dest_qpn=rng.randrange(1 << 24), udp_sport=rng.randrange(1 << 16), arg=arg,
                len=length, qpn=qpn)


def ack(rng, qpn, syn=ACK):
    return entry(rng, RESP_ACK, qpn, syn)


def read(rng, qpn, length):
    return entry(rng, RESP_READ, qpn, length=length, arg=BASE + rng.randrange(MEM_SIZE - length + 1))


def pos_ack(e):
    return e["kind"] == RESP_ACK and e["syn"] == ACK


def mix(rng, n):
    """``n`` random descriptors of QPs 0..3, never a positive ACK right after a positive ACK
    of the same QP (whether that one coalesces would depend on timing)."""
    items = []
    while len(items) < n:
        q, r = rng.randrange(4), rng.random()
        if r < 0.35:
            e = ack(rng, q, ACK if rng.random() < 0.6 else rng.choice(NAKS))
        elif r < 0.65:
            e = read(rng, q, rng.choice([0, rng.randrange(1, 9), rng.randrange(1, 700), MTU,
                                         2 * MTU, 2 * MTU + 1, 3 * MTU - 5]))
        elif r < 0.8:
            e = entry(rng, RESP_ATOMIC, q, arg=rng.randrange(1 << 64))
        else:   # a pending atomic; rarely one the write gate already turned into a NAK
            e = entry(rng, RESP_ATOMIC_PEND, q, ACK if rng.random() < 0.85 else OP_ERR)
        if items and pos_ack(e) and pos_ack(items[-1]) and items[-1]["qpn"] == q:
            continue
        items.append(e)
    return items


def results(rng, items):
    """The atomic unit's answers (original value, err) for the pending atomics of ``items``."""
    return [(rng.randrange(1 << 64), 0) for e in items if e["kind"] == RESP_ATOMIC_PEND]


# ---------------------------------------------------------------------------------------
# the reference model

def header(e, op, psn, syn, msn, paylen=0, orig=0):
    h = {name: 0 for name, _ in PKT_META}
    h.update(opcode=op.value, src_node=NODE, dst_node=e["dest_node"], dest_qpn=e["dest_qpn"],
             udp_sport=e["udp_sport"], psn=psn & M24, syndrome=syn, msn=msn, paylen=paylen, orig=orig)
    return h


def model(items, at_res, fail, mem, held):
    """What must leave. ``held`` True: every push happens while tx is held, so nothing leaves
    the queue and an ACK coalesces iff the newest entry is a positive ACK of its QP and at
    least two entries are queued; a list: the coalescing seen with tx running, only checked
    to be of a positive ACK onto its QP's newest (an ACK already sent cannot be replaced:
    the output would differ). ``fail``: ordinals of the DMA reads answered with err."""
    queue, flags = [], []
    for i, e in enumerate(items):
        cand = bool(queue) and pos_ack(e) and pos_ack(queue[-1]) and queue[-1]["qpn"] == e["qpn"]
        c = held[i] if isinstance(held, list) else held and cand and len(queue) >= 2
        assert cand or not c, f"push {i} coalesced, not a positive ACK onto its QP's newest"
        flags.append(int(c))
        if c:
            queue[-1] = e
        else:
            queue.append(e)
    tx, reads, pends_before, errs = [], [], [], []
    n_at = dma_errs = 0
    for e in queue:
        if e["kind"] == RESP_READ:
            n = max(1, -(-e["len"] // MTU))
            bad = False
            for k in range(n):
                off = k * MTU
                chunk = min(MTU, e["len"] - off)
                r = None
                if chunk:
                    r = len(reads)
                    reads.append((e["arg"] + off, chunk, READ_DMA_TAG))
                    pends_before.append(n_at)
                if bad:
                    continue
                if r in fail:
                    tx.append((header(e, Op.ACKNOWLEDGE, e["psn"] + k, OP_ERR, e["msn"]), b"", r))
                    bad = True
                    dma_errs += 1
                    continue
                first, last = k == 0, k == n - 1
                op = (Op.READ_RESPONSE_ONLY if last else Op.READ_RESPONSE_FIRST) if first else (
                    Op.READ_RESPONSE_LAST if last else Op.READ_RESPONSE_MIDDLE)
                aeth = first or last
                a = e["arg"] - BASE + off
                tx.append((header(e, op, e["psn"] + k, ACK if aeth else 0, e["msn"] if aeth else 0,
                                  paylen=chunk), bytes(mem[a:a + chunk]), r))
            if bad:
                errs.append(e["qpn"])
        elif e["kind"] == RESP_ACK:
            tx.append((header(e, Op.ACKNOWLEDGE, e["psn"], e["syn"], e["msn"]), b"", None))
        else:
            orig, err = (e["arg"], 0) if e["kind"] == RESP_ATOMIC else at_res[n_at]
            n_at += e["kind"] == RESP_ATOMIC_PEND
            if err or e["syn"] != ACK:      # a failed result, or a NAK the gate made of it
                tx.append((header(e, Op.ACKNOWLEDGE, e["psn"], OP_ERR if err else e["syn"],
                                  e["msn"]), b"", None))
                if err and e["syn"] == ACK:
                    errs.append(e["qpn"])
                    dma_errs += 1
            else:
                tx.append((header(e, Op.ATOMIC_ACKNOWLEDGE, e["psn"], ACK, e["msn"], orig=orig),
                           b"", None))
    naks = sum(h["opcode"] == Op.ACKNOWLEDGE.value and h["syndrome"] != ACK for h, _, _ in tx)
    return dict(tx=tx, reads=reads, pends_before=pends_before, errs=errs, flags=flags, naks=naks,
                dma_errs=dma_errs, pends=n_at)


# ---------------------------------------------------------------------------------------
# the bench

def simulate(items, mem, *, at_res=(), fail=(), seed=0, read_buffers=4, p_tx=0.6, p_push=0.7,
             hold=False, lat=(1, 20), at_delay=(0, 40), max_cycles=60_000, p_req=0.7):
    """``hold``: tx is not ready before every descriptor is pushed (or ``push`` has waited
    20 cycles in a row), and the pushes are back to back until then. ``p_req``: the chance
    that the DMA read port takes a request in a cycle."""
    rng = random.Random(seed)
    dut = ResponseQueue(CFG, read_buffers)
    quiet_end = 100 + read_buffers * MTU // W      # dropping a failed READ's data is silent
    out = dict(tx=[], reads=[], req_cycles=[], last_beat=[], at_cycles=[], errs=[], flags=[],
               first_stall=None, stalls=0, resp_full=0, naks=0, dma_errs=0, at_sent=0, coalesce=0)
    streams = {"tx.meta": dut.tx.meta, "tx.payload": dut.tx.payload, "rd.req": dut.rd.req,
               "set_err": dut.set_err}

    async def tb(ctx):
        todo, beats, at_due = list(items), [], []
        at_i = stall = quiet = cyc = n_data = 0
        released, open_pkt, prev = not hold, None, {}
        ctx.set(dut.node_id, NODE)
        while True:
            # drive
            push_v = bool(todo) and ((hold and not released) or rng.random() < p_push)
            ctx.set(dut.push.valid, push_v)
            if todo:
                ctx.set(dut.push.payload, todo[0])
            at_v = at_i < len(at_due) and at_due[at_i] <= cyc and rng.random() < 0.8
            ctx.set(dut.at_result.valid, at_v)
            if at_i < len(at_res):
                ctx.set(dut.at_result.payload, {"orig": at_res[at_i][0], "err": at_res[at_i][1]})
            beat_v = bool(beats) and beats[0][0] <= cyc and rng.random() < 0.8
            ctx.set(dut.rd.rd.valid, beat_v)
            if beats:
                ctx.set(dut.rd.rd.payload, beats[0][1])
            ctx.set(dut.rd.req.ready, rng.random() < p_req)
            released = released or not todo or stall >= 20
            for s in (dut.tx.meta, dut.tx.payload):
                ctx.set(s.ready, released and rng.random() < p_tx)
            ctx.set(dut.set_err.ready, rng.random() < 0.5)

            # the stream rule: an offered payload stays offered, unchanged, until taken
            for name, s in streams.items():
                v, r, pl = ctx.get(s.valid), ctx.get(s.ready), ctx.get(s.payload.as_value())
                if name in prev and prev[name][0] and not prev[name][1]:
                    assert v and pl == prev[name][2], f"cycle {cyc}: {name} withdrawn or changed"
                prev[name] = (v, r, pl)

            # sample
            done_before = len(out["last_beat"])     # reads whose data is all in, before now
            busy = bool(beats) or at_i < len(at_due) or open_pkt is not None
            if push_v and ctx.get(dut.push.ready):
                out["flags"].append(ctx.get(dut.stat_coalesce))
                if todo.pop(0)["kind"] == RESP_ATOMIC_PEND:
                    at_due.append(cyc + rng.randint(*at_delay))
                stall, busy = 0, True
            elif push_v:
                stall += 1
                out["stalls"] += 1
                if out["first_stall"] is None:
                    out["first_stall"] = len(out["flags"])
            if at_v and ctx.get(dut.at_result.ready):
                out["at_cycles"].append(cyc)
                at_i += 1
            if ctx.get(dut.rd.req.valid) and ctx.get(dut.rd.req.ready):
                r = ctx.get(dut.rd.req.payload)
                a, n, t = int(r.addr), int(r.len), int(r.tag)
                assert 0 < n <= MTU and BASE <= a and a + n <= BASE + MEM_SIZE, (a, n)
                bad = len(out["reads"]) in fail
                raw = bytes(mem[a - BASE:a - BASE + n])
                nb = -(-n // W)
                e0 = rng.randrange(nb) if bad else nb       # err from this beat on
                due = max(cyc + rng.randint(*lat), beats[-1][0] if beats else 0)
                for i in range(nb):
                    c = raw[i * W:(i + 1) * W]
                    beats.append((due, {"data": 0 if i >= e0 else int.from_bytes(c, "little"),
                                        "nbytes": len(c), "last": i == nb - 1, "tag": t,
                                        "err": int(i >= e0)}))
                out["reads"].append((a, n, t))
                out["req_cycles"].append(cyc)
                busy = True
            if beat_v:
                assert ctx.get(dut.rd.rd.ready), "DMA read data must always be taken"
                if beats.pop(0)[1]["last"]:
                    out["last_beat"].append(cyc)
            if ctx.get(dut.tx.meta.valid) and ctx.get(dut.tx.meta.ready):
                assert open_pkt is None, "tx meta before the previous payload ended"
                v = ctx.get(dut.tx.meta.payload.as_value())
                pkt = [unpack(PKT_META, v.to_bytes((PKT_META.size + 7) // 8, "little")), b"", cyc]
                out["tx"].append(pkt)
                open_pkt = pkt if pkt[0]["paylen"] else None
                if open_pkt:        # store and forward, online (run() matches the reads)
                    assert done_before > n_data, f"cycle {cyc}: READ header before its data"
                    n_data += 1
                busy = True
            if ctx.get(dut.tx.payload.valid) and ctx.get(dut.tx.payload.ready):
                assert open_pkt is not None, "tx payload beat without meta"
                b = ctx.get(dut.tx.payload.payload)
                open_pkt[1] += int(b.data).to_bytes(W, "little")[:int(b.nbytes)]
                done = len(open_pkt[1]) >= open_pkt[0]["paylen"]
                assert bool(b.last) == done and (done or b.nbytes == W), "bad payload beat"
                if done:
                    assert len(open_pkt[1]) == open_pkt[0]["paylen"]
                    open_pkt = None
            if ctx.get(dut.set_err.valid) and ctx.get(dut.set_err.ready):
                out["errs"].append(ctx.get(dut.set_err.payload.qpn))
                busy = True
            for k, sig in PULSES.items():
                out[k] += ctx.get(getattr(dut, sig))
            quiet = 0 if busy else quiet + 1
            if not todo and quiet > quiet_end:
                break
            assert cyc < max_cycles, "simulation did not finish"
            await ctx.tick()
            cyc += 1
        out["cycles"] = cyc

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()
    return out


def run(items, *, seed=0, at_res=None, fail=(), hold=False, observed=False, **kw):
    """Simulate ``items``, compare with the model and check the invariants; return both.
    ``observed``: the model takes the coalescing seen (see :func:`model`)."""
    rng = random.Random(seed + 1000)
    mem = bytearray(rng.randbytes(MEM_SIZE))
    at_res = results(rng, items) if at_res is None else at_res
    out = simulate(items, mem, at_res=at_res, fail=set(fail), seed=seed, hold=hold, **kw)
    exp = model(items, at_res, set(fail), mem, out["flags"] if observed else hold)
    got = [(m, bytes(p)) for m, p, _ in out["tx"]]
    want = [(m, p) for m, p, _ in exp["tx"]]
    for i, (g, w) in enumerate(zip(got, want)):
        assert g == w, f"tx packet {i}: got {g}, expected {w}"
    assert len(got) == len(want), f"{len(got)} packets sent, {len(want)} expected"
    assert out["reads"] == exp["reads"]
    assert out["errs"] == exp["errs"]
    assert out["flags"] == exp["flags"] and out["coalesce"] == sum(exp["flags"])
    assert (out["naks"], out["dma_errs"]) == (exp["naks"], exp["dma_errs"])
    assert out["at_sent"] == exp["pends"] == len(out["at_cycles"])
    assert out["resp_full"] == out["stalls"]
    # store and forward: a READ packet's header (or its NAK) after the last beat of its data
    for (_, _, cyc), (_, _, r) in zip(out["tx"], exp["tx"]):
        if r is not None:
            assert cyc > out["last_beat"][r], f"header of read {r} at {cyc} before its data"
    # a READ behind a pending atomic is requested only after that atomic's result came in
    for r, n in enumerate(exp["pends_before"]):
        if n:
            assert out["req_cycles"][r] > out["at_cycles"][n - 1], f"read {r} passed a pending atomic"
    return out, exp


# ---------------------------------------------------------------------------------------
# tests

@pytest.mark.parametrize("seed,read_buffers", [(1, 2), (2, 4), (3, 2)])
def test_order(seed, read_buffers):
    """A random mix leaves in queue order, READ payloads equal to memory."""
    rng = random.Random(seed)
    items = mix(rng, 60)
    out, exp = run(items, seed=seed, read_buffers=read_buffers)
    ops = {m["opcode"] for m, _, _ in exp["tx"]}
    assert {Op.READ_RESPONSE_FIRST.value, Op.READ_RESPONSE_MIDDLE.value, Op.READ_RESPONSE_LAST.value,
            Op.READ_RESPONSE_ONLY.value, Op.ATOMIC_ACKNOWLEDGE.value} <= ops


def test_ack_coalescing_directed():
    """Hand-written case: which pushes coalesce while tx is held."""
    rng = random.Random(5)
    items = [ack(rng, 1), ack(rng, 1), ack(rng, 1), ack(rng, 1),       # 2 queued from the 3rd on
             ack(rng, 2), ack(rng, 1),                                  # another QP between
             ack(rng, 1, Syn.NAK_PSN_SEQ_ERR.value), ack(rng, 1), ack(rng, 1),   # not onto a NAK
             ack(rng, 1, NAKS[0]), entry(rng, RESP_ATOMIC, 1, arg=7), ack(rng, 1),
             read(rng, 1, 300), ack(rng, 1), ack(rng, 1), ack(rng, 1)]
    out, exp = run(items, seed=5, hold=True)
    assert out["flags"] == [0, 0, 1, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 1, 1]
    kept = [0, 3, 4, 5, 6, 8, 9, 10, 11, 12, 12, 15]         # the READ is two packets
    assert [m["psn"] for m, _, _ in out["tx"]] == [
        (items[i]["psn"] + (k == 10)) & M24 for k, i in enumerate(kept)]


@pytest.mark.parametrize("seed", [11, 12, 13])
def test_ack_coalescing_random(seed):
    """Pushed back to back while tx is held: the model's coalescing, never of a NAK or of an
    ACK of another QP (the model's flags are compared push by push)."""
    rng = random.Random(seed)
    items = [ack(rng, rng.randrange(2)) if r < 0.7 else ack(rng, rng.randrange(2), rng.choice(NAKS))
             if r < 0.85 else mix(rng, 1)[0] for r in (rng.random() for _ in range(60))]
    out, exp = run(items, seed=seed, hold=True)
    assert sum(out["flags"]) >= 3


@pytest.mark.parametrize("seed", [14, 15])
def test_ack_coalescing_running(seed):
    """tx slow but running: an ACK coalesces only onto its QP's newest positive ACK that is
    not yet sent (the model takes the pushes seen coalesced and must give the same output)."""
    rng = random.Random(seed)
    items = [ack(rng, rng.randrange(2), ACK if rng.random() < 0.85 else rng.choice(NAKS))
             for _ in range(120)]
    out, exp = run(items, seed=seed, observed=True, p_tx=0.6, p_push=0.5)
    cands = [i for i in range(1, len(items)) if pos_ack(items[i]) and pos_ack(items[i - 1])
             and items[i]["qpn"] == items[i - 1]["qpn"]]
    assert 0 < sum(out["flags"]) < len(cands)      # some coalesced, some too late to


@pytest.mark.parametrize("seed", [21, 22])
def test_store_and_forward(seed):
    """Long DMA latency, tx always ready: every READ header still waits for its data."""
    rng = random.Random(seed)
    items = [read(rng, rng.randrange(4), rng.randrange(1, 700)) for _ in range(16)]
    out, exp = run(items, seed=seed, p_tx=1.0, p_push=1.0, lat=(20, 60), read_buffers=2)
    gaps = [c - out["last_beat"][r] for (_, _, c), (_, _, r) in zip(out["tx"], exp["tx"])
            if r is not None]
    assert len(gaps) == len(exp["reads"]) and min(gaps) <= 4    # it did wait for the data


@pytest.mark.parametrize("seed", [31, 32])
def test_pending_atomic_blocks_prefetch(seed):
    """A READ behind a RESP_ATOMIC_PEND is not requested before the atomic's result."""
    rng = random.Random(seed)
    items = [e for _ in range(8) for e in (entry(rng, RESP_ATOMIC_PEND, rng.randrange(4)),
             read(rng, rng.randrange(4), rng.randrange(1, 600)), ack(rng, rng.randrange(4)))]
    out, exp = run(items, seed=seed, p_tx=1.0, p_push=1.0, lat=(1, 4), at_delay=(40, 90))
    assert all(n for n in exp["pends_before"])
    # the check in run() is not vacuous: some READ was requested soon after its result
    waits = [out["req_cycles"][r] - out["at_cycles"][n - 1] for r, n in enumerate(exp["pends_before"])]
    assert min(waits) < 10


@pytest.mark.parametrize("seed", [41, 42, 43])
def test_read_dma_error(seed):
    """A READ packet whose data failed becomes a NAK at its PSN, the rest of that READ is
    dropped, its QP goes to ERR; the descriptors after it still leave."""
    rng = random.Random(seed)
    items = mix(rng, 16)
    for i in range(0, 24, 3):       # a READ never makes two ACKs adjacent
        items.insert(i, read(rng, i % 4, rng.choice([100, 600, 700, 3 * MTU])))
    items.append(entry(rng, RESP_ATOMIC, 2, arg=5))
    spans, n = [], 0        # the DMA read ordinals of each READ
    for e in items:
        if e["kind"] == RESP_READ:
            spans.append(range(n, n + -(-e["len"] // MTU)))
            n += len(spans[-1])
    two = rng.choice([s for s in spans if len(s) >= 2])     # two failed packets: one NAK
    fail = set(rng.sample(range(n), 3)) | {two[0], two[-1]}
    out, exp = run(items, seed=seed, fail=fail)
    naks = [i for i, (m, _, r) in enumerate(exp["tx"]) if r in fail]
    assert out["dma_errs"] == len(naks) == len(out["errs"]) >= 2
    assert all(exp["tx"][i][0]["syndrome"] == OP_ERR for i in naks)
    assert naks[-1] < len(exp["tx"]) - 1            # something is sent after the last one
    assert sum(exp["tx"][i][2] in two for i in naks) == 1


def test_atomic_error():
    """A failed atomic result turns its RESP_ATOMIC_PEND into a NAK REM_OP_ERR + set_err;
    a PEND that is already a NAK still takes its result and asks for nothing more."""
    rng = random.Random(51)
    items = [entry(rng, RESP_ATOMIC_PEND, q % 4, OP_ERR if q == 5 else ACK) for q in range(8)]
    items += [read(rng, 1, 300), ack(rng, 3)]
    at_res = [(rng.randrange(1 << 64), int(q in (1, 4, 5))) for q in range(8)]
    out, exp = run(items, seed=51, at_res=at_res)
    assert out["errs"] == [1, 0] and out["dma_errs"] == 2 and out["naks"] == 3
    assert [m["opcode"] for m, _, _ in out["tx"][:8]].count(Op.ATOMIC_ACKNOWLEDGE.value) == 5


@pytest.mark.parametrize("read_buffers", [2, 4])
def test_full_queue(read_buffers):
    """More than n_qps * max_outstanding descriptors while tx is held: push waits once the
    queue holds QD of them (stat_resp_full pulses), nothing is lost."""
    rng = random.Random(61)
    items = [ack(rng, i % 4) if i % 5 else read(rng, i % 4, rng.randrange(0, 300))
             for i in range(QD + 20)]
    # (held=True in the model is exact here: no two adjacent positive ACKs of one QP)
    out, exp = run(items, seed=61, hold=True, read_buffers=read_buffers)
    assert out["first_stall"] == QD and out["resp_full"] >= 20
    assert len(out["tx"]) == len(exp["tx"]) >= QD + 20


def test_parameters():
    for bad in (3, 32, 1, 0, True, 4.0):
        with pytest.raises(ValueError, match=r"read_buffers must be a power of two in \[2, 16\]"):
            ResponseQueue(CFG, bad)
    with pytest.raises(ValueError):
        ResponseQueue(object(), 4)
    assert ResponseQueue(CFG, 16).at_depth == CFG.n_qps * CFG.replay_slots


def test_one_beat_reads_leave_every_two_cycles():
    """Forty one-beat READs whose data is in the ring: the transmitter sends a header and its
    beat per two cycles (the header of a READ's first packet leaves from IDLE, the next
    entry is taken with the last beat; was four cycles each), in order, with their data."""
    rng = random.Random(71)
    items = [read(rng, i % 4, W) for i in range(40)]
    out, _ = run(items, seed=71, hold=True, p_tx=1.0)
    cycles = [c for _, _, c in out["tx"]]
    assert len(cycles) == 40
    assert [b - a for a, b in zip(cycles, cycles[1:])] == [2] * 39


def test_one_packet_reads_are_requested_every_cycle():
    """Forty one-beat READs pushed back to back, the DMA read port always ready: the
    prefetcher requests a READ's data in the cycle it looks at the entry, one read per cycle
    (two cycles each before 2026-12-08, SCAN then ISSUE)."""
    rng = random.Random(72)
    items = [read(rng, i % 4, W) for i in range(40)]
    out, _ = run(items, seed=72, hold=True, p_req=1.0)
    cycles = out["req_cycles"]
    assert len(cycles) == 40
    assert [b - a for a, b in zip(cycles, cycles[1:])] == [1] * 39
