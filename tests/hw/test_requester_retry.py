"""Requester retransmission (IBA 9.7.6): PSN sequence NAKs, local ACK timeouts, RNR waits,
lost READ responses, retry limits, against a responder model that keeps the real
responder's PSN rules (expected PSN, one NAK per gap, duplicates acknowledged or replayed).

The bench is the one of ``test_requester.py`` with its responder stand-in replaced.
"""

import collections
import math
import random

import pytest

from hw import formats
from hw.formats import WcStatus as S
from tests.hw.test_requester import (B, CFG, GOOD, O, SIG, World, cqes_of, qp_ctx, run,
                                     setup_memory, wqe)

M24 = (1 << 24) - 1
ACK = formats.AethSyndrome.ACK.value


class StrictResponder:
    """The remote responder's PSN handling (as hw/rnic/responder.py does it), with losses.

    ``lose``: {(q, psn): n} drop the request packet with that PSN the first n times it
    arrives in sequence; ``lose_resp``: {(q, psn): n} drop n times the response packet with
    that PSN; ``rnr``: {(q, psn): n} answer n times with an RNR NAK (timer code ``rnr_code``);
    ``late``: {(q, psn): d} deliver the first response packet with that PSN d cycles late;
    ``dup``: {(q, psn): d} deliver a copy of it d cycles after it (the network duplicated it).
    """

    def __init__(self, lose=None, lose_resp=None, rnr=None, rnr_code=1, resp_lat=20, late=None, dup=None):
        self.lose = dict(lose or {})
        self.lose_resp = dict(lose_resp or {})
        self.late = dict(late or {})
        self.dup = dict(dup or {})
        self.rnr = dict(rnr or {})
        self.rnr_code = rnr_code
        self.resp_lat = resp_lat
        self.st = {}
        self.executed = []          # (q, psn, opcode) executed once each
        self.atomic_results = {}

    def take(self, table, key):
        if table.get(key, 0) > 0:
            table[key] -= 1
            return True
        return False

    def __call__(self, world, q, meta, payload):
        st = self.st.setdefault(q, dict(epsn=0, nak_sent=False, msn=0))
        op = B(meta["opcode"])
        psn = meta["psn"]
        ready = world.t + self.resp_lat
        base = dict(src_node=meta["dst_node"], dst_node=meta["src_node"], dest_qpn=q, se=0, ackreq=0,
                    syndrome=ACK, msn=0, paylen=0)

        def send(**kw):
            m = dict(base, **kw)
            if not self.take(self.lose_resp, (q, m["psn"])):
                t = ready + self.late.pop((q, m["psn"]), 0)
                world.resp.append((t, m, b""))
                if (q, m["psn"]) in self.dup:
                    world.resp.append((t + self.dup.pop((q, m["psn"])), m, b""))

        def read_responses(m):
            n = max(1, math.ceil(m["dma_len"] / world.cfg.mtu))
            for k in range(n):
                ln = min(world.cfg.mtu, m["dma_len"] - k * world.cfg.mtu)
                bop = (B.READ_RESPONSE_ONLY if n == 1 else B.READ_RESPONSE_FIRST if k == 0 else
                       B.READ_RESPONSE_LAST if k == n - 1 else B.READ_RESPONSE_MIDDLE)
                p = (m["psn"] + k) & M24
                if self.take(self.lose_resp, (q, p)):
                    continue
                world.resp.append((ready + self.late.pop((q, p), 0), dict(base, opcode=bop.value, psn=p, paylen=ln),
                                   world.get(world.remote, m["va"] + k * world.cfg.mtu, ln)))
            return n

        behind = (st["epsn"] - psn) & M24
        if 0 < behind <= 1 << 23:
            # duplicate: no second effect
            if op == B.READ_REQUEST:
                read_responses(meta)
            elif op in (B.COMPARE_SWAP, B.FETCH_ADD):
                if (q, psn) in self.atomic_results:
                    send(opcode=B.ATOMIC_ACKNOWLEDGE.value, psn=psn, orig=self.atomic_results[(q, psn)])
            elif meta["ackreq"]:
                send(opcode=B.ACKNOWLEDGE.value, psn=(st["epsn"] - 1) & M24)
            return
        if psn != st["epsn"]:
            if not st["nak_sent"]:
                st["nak_sent"] = True
                send(opcode=B.ACKNOWLEDGE.value, psn=st["epsn"],
                     syndrome=formats.AethSyndrome.NAK_PSN_SEQ_ERR.value)
            return
        if self.take(self.lose, (q, psn)):
            return                                   # lost on the way: never arrived
        if self.take(self.rnr, (q, psn)):
            st["nak_sent"] = True
            send(opcode=B.ACKNOWLEDGE.value, psn=psn, syndrome=0x20 | self.rnr_code)
            return
        st["nak_sent"] = False
        self.executed.append((q, psn, op.name))
        if op == B.READ_REQUEST:
            st["epsn"] = (psn + read_responses(meta)) & M24
            return
        st["epsn"] = (psn + 1) & M24
        if op in (B.COMPARE_SWAP, B.FETCH_ADD):
            orig = int.from_bytes(world.get(world.remote, meta["va"], 8), "little")
            if op == B.COMPARE_SWAP:
                new = meta["swap_add"] if orig == meta["compare"] else orig
            else:
                new = (orig + meta["swap_add"]) % (1 << 64)
            world.fill(world.remote, meta["va"], new.to_bytes(8, "little"))
            self.atomic_results[(q, psn)] = orig
            send(opcode=B.ATOMIC_ACKNOWLEDGE.value, psn=psn, orig=orig)
            return
        if op.name.startswith("WRITE"):
            if op in (B.WRITE_FIRST, B.WRITE_ONLY, B.WRITE_ONLY_IMM):
                st["va"], st["off"] = meta["va"], 0
            world.fill(world.remote, st["va"] + st["off"], payload)
            st["off"] += len(payload)
        if meta["ackreq"]:
            send(opcode=B.ACKNOWLEDGE.value, psn=psn)


def mixed_wqes():
    return [wqe(O.RDMA_WRITE, 300, SIG, local=GOOD["base"], remote=0x800000),        # PSN 0, 1
            wqe(O.RDMA_READ, 600, SIG, local=GOOD["base"] + 0x8000, remote=0x801000),  # 2..4
            wqe(O.ATOMIC_FETCH_AND_ADD, 8, SIG, local=GOOD["base"] + 0x9000, remote=0x802000,
                cmp=5),                                                                 # 5
            wqe(O.SEND, 10, 0, local=GOOD["base"]),                                     # 6
            wqe(O.RDMA_WRITE, 20, SIG, local=GOOD["base"] + 0x100, remote=0x803000),    # 7
            wqe(O.RDMA_READ, 8, SIG, local=GOOD["base"] + 0xA000, remote=0x801000)]     # 8


def go(responder, qctx=None, wqes=None, seed=3, max_cycles=40000, bp=0.2):
    qps = {q: qp_ctx(q, **{"timeout": 1, "retry_cnt": 3, "rnr_retry": 3, **(qctx or {})}) for q in range(4)}
    world = World(CFG, seed, bp=bp, qps=qps)
    world.responder = responder
    world.reads_inflight = collections.defaultdict(int)     # not tracked by this responder
    setup_memory(world, random.Random(seed))
    ws = wqes or mixed_wqes()
    remote0 = dict(world.remote)

    async def script(ctx, world, event, wait):
        await event(0, formats.QpState.RTS.value, 0)
        for w in ws:
            world.post(0, w)
        world.ring(0)
        n_sig = sum(1 for w in ws if w["flags"] & SIG)
        await wait(lambda: len(cqes_of(world, 0)) >= n_sig or world.set_err, max_cycles)
        await wait(lambda: len(cqes_of(world, 0)) >= len(ws) or not world.set_err, max_cycles)
        for _ in range(200):
            await ctx.tick()

    run(world, script, max_cycles)
    return world, ws, remote0


def check_all_succeeded(world, ws, remote0, responder):
    cq = [(c["wr_id"], c["status"]) for c in cqes_of(world, 0)]
    assert cq == [(w["wr_id"], 0) for w in ws if w["flags"] & SIG]
    # every packet, retransmissions included, carries a PSN of its own message (a rewind
    # never sends a PSN outside the rewound messages' ranges)
    first, ranges = 0, []
    for w in ws:
        n = max(1, math.ceil(w["length"] / world.cfg.mtu)) if w["opcode"] <= O.RDMA_READ else 1
        ranges.append((first, first + n - 1))
        first += n
    for _, q, m, _ in world.tx:
        if q == 0:
            assert any(a <= m["psn"] <= b for a, b in ranges), m["psn"]
            if m["opcode"] == B.READ_REQUEST.value:
                a, b = next(r for r in ranges if r[0] <= m["psn"] <= r[1])
                # a resumed READ asks for the packets from its PSN to the READ's last
                assert m["psn"] + max(1, math.ceil(m["dma_len"] / world.cfg.mtu)) - 1 == b
    # every message executed exactly once at the responder, in order
    psns = [p for q, p, _ in responder.executed if q == 0]
    assert len(psns) == len(set(psns))
    # the READs brought the remote data, the atomic added once
    for w in ws:
        if w["opcode"] == O.RDMA_READ:
            assert world.get(world.host, w["local_addr"], w["length"]) == \
                world.get(remote0, w["remote_addr"], w["length"])
        if w["opcode"] == O.ATOMIC_FETCH_AND_ADD:
            before = int.from_bytes(world.get(remote0, w["remote_addr"], 8), "little")
            after = int.from_bytes(world.get(world.remote, w["remote_addr"], 8), "little")
            assert after == (before + w["compare_add"]) % (1 << 64)
            assert int.from_bytes(world.get(world.host, w["local_addr"], 8), "little") == before
    assert world.set_err == []


def sent_psns(world):
    return [m["psn"] for _, q, m, _ in world.tx if q == 0]


def test_psn_sequence_nak_goes_back_n():
    """The WRITE's second packet (PSN 1) is lost: the next packet draws a PSN sequence NAK
    for PSN 1, and the requester sends again from there (the responder has PSN 0: the WRITE
    resumes with its LAST packet and the payload from byte 256), then everything after it."""
    r = StrictResponder(lose={(0, 1): 1})
    world, ws, remote0 = go(r)
    check_all_succeeded(world, ws, remote0, r)
    psns = sent_psns(world)
    assert psns.count(0) == 1 and psns.count(1) == 2 and psns.count(2) == 2
    assert world.stats["stat_retransmit"] == 1 and world.stats["stat_timeout"] == 0
    assert world.stats["stat_nak_rx"] == 1
    resent = [(m["opcode"], len(p)) for _, q, m, p in world.tx if m["psn"] == 1]
    assert resent == [(B.WRITE_LAST.value, 300 - 256)] * 2


def _write_packets(world, remote):
    return [(m["psn"], B(m["opcode"]).name) for _, q, m, _ in world.tx
            if q == 0 and m["opcode"] != B.READ_REQUEST.value]


@pytest.mark.parametrize("kind", ["write", "send"])
def test_nak_inside_message_resumes_there(kind):
    """A 5-packet WRITE (SEND) loses PSN 2: it resumes at PSN 2 with MIDDLE packets (no RETH
    on a resumed WRITE), the responder gets every byte once and in place."""
    op = O.RDMA_WRITE if kind == "write" else O.SEND
    ws = [wqe(op, 4 * 256 + 100, SIG, local=GOOD["base"], remote=0x800000)]
    r = StrictResponder(lose={(0, 2): 1})
    world, ws, remote0 = go(r, wqes=ws)
    check_all_succeeded(world, ws, remote0, r)
    first = "WRITE" if kind == "write" else "SEND"
    assert _write_packets(world, None) == (
        [(0, f"{first}_FIRST")] + [(p, f"{first}_MIDDLE") for p in (1, 2, 3)]
        + [(4, f"{first}_LAST")] + [(2, f"{first}_MIDDLE"), (3, f"{first}_MIDDLE"),
                                    (4, f"{first}_LAST")])
    assert [p for q, p, _ in r.executed] == [0, 1, 2, 3, 4]
    if kind == "write":
        assert world.get(world.remote, 0x800000, 4 * 256 + 100) == \
            world.get(world.host, GOOD["base"], 4 * 256 + 100)
    assert world.stats["stat_timeout"] == 0 and world.stats["stat_retransmit"] == 1


def test_second_nak_during_retransmission_is_taken():
    """PSN 1 of a 6-packet WRITE is lost once and PSN 3 once more in the retransmission: the
    second NAK (PSN 3) arrives while the requester is still retransmitting after the first
    one. It shows the responder further inside the message, so the requester rewinds to
    PSN 3 at once; before the fix it was ignored as a repeat of the first NAK and only the
    local ACK timer (counted against retry_cnt) recovered."""
    ws = [wqe(O.RDMA_WRITE, 5 * 256 + 10, SIG, local=GOOD["base"], remote=0x800000)]
    r = StrictResponder(lose={(0, 1): 1, (0, 3): 1})
    world, ws, remote0 = go(r, wqes=ws, qctx=dict(retry_cnt=0))
    check_all_succeeded(world, ws, remote0, r)
    assert world.stats["stat_nak_rx"] == 2 and world.stats["stat_retransmit"] == 2
    assert world.stats["stat_timeout"] == 0
    starts = [p for (p, name), (p0, _) in zip(_write_packets(world, None)[1:],
                                              _write_packets(world, None)) if p <= p0]
    assert starts == [1, 3]


def test_ack_timeout_retransmits_the_tail():
    """The last packet (PSN 8) is lost: nothing follows it, only the local ACK timer
    (4.096 us * 2**1 = 2048 cycles at 250 MHz) recovers it."""
    r = StrictResponder(lose={(0, 8): 1})
    world, ws, remote0 = go(r)
    check_all_succeeded(world, ws, remote0, r)
    assert world.stats["stat_timeout"] == 1 and world.stats["stat_retransmit"] == 1
    t_first = [t for t, q, m, _ in world.tx if m["psn"] == 8]
    assert len(t_first) == 2 and t_first[1] - t_first[0] >= 2048


def test_duplicate_ack_while_the_message_is_sent_again():
    """A READ's response comes late: the next SEND's ACK arrives first (an implied NAK, IBA
    9.7.5.1.5), the READ then completes and the SEND is rewound and fetched again. A copy of
    the SEND's ACK (the network duplicated it) arrives at every cycle around the moment the
    SEND re-enters the tracker, while the response path looks at the queue. The SEND's
    completion must carry its own wr_id and length: before the fix the response path saw the
    empty queue one cycle ("no WQE fields needed") and completed the re-entered SEND the
    next with the READ's fields (the 5 % lossy system test saw the previous wr_id)."""
    ws = [wqe(O.RDMA_READ, 8, SIG, local=GOOD["base"] + 0x8000, remote=0x801000, wr_id=0x1111),
          wqe(O.SEND, 64, SIG, local=GOOD["base"], wr_id=0x2222)]
    exp = [(w["wr_id"], 0, w["length"]) for w in ws]
    early = set()
    # the READ's response late enough that only the SEND is sent again, and the copies
    # around its re-entry (both depend on the pipeline's timing: re-tuned when it changes)
    for d in range(32, 46):
        r = StrictResponder(late={(0, 0): 32}, dup={(0, 1): d})
        world, _, _ = go(r, wqes=ws, bp=0.0, max_cycles=4000)
        assert [(c["wr_id"], c["status"], c["byte_len"]) for c in cqes_of(world, 0)] == exp, d
        assert world.set_err == [] and world.stats["stat_retransmit"] == 1
        # the SEND completed by the copy (before its retransmission is answered) or not
        t_resent = [t for t, q, m, _ in world.tx if m["psn"] == 1][1]
        early.add(cqes_of(world, 0)[1]["t"] < t_resent)
    assert early == {False, True}       # the sweep crosses the cycle the SEND re-enters


def test_lost_acks_and_responses():
    """Lost ACK, lost atomic acknowledge, lost READ response packet in the middle: the
    duplicates are answered without a second effect (the FETCH_ADD adds once)."""
    r = StrictResponder(lose_resp={(0, 1): 1, (0, 3): 1, (0, 5): 1, (0, 7): 1})
    world, ws, remote0 = go(r)
    check_all_succeeded(world, ws, remote0, r)
    assert world.stats["stat_retransmit"] >= 1


def test_rnr_wait_then_success():
    """An RNR NAK (timer code 1 = 10 us = 2500 cycles) holds the QP, then the SEND is sent
    again and succeeds; rnr_retry counts only RNR NAKs."""
    r = StrictResponder(rnr={(0, 6): 2}, rnr_code=1)
    world, ws, remote0 = go(r, max_cycles=60000)
    check_all_succeeded(world, ws, remote0, r)
    assert world.stats["stat_rnr_rx"] == 2
    t6 = [t for t, q, m, _ in world.tx if m["psn"] == 6]
    assert len(t6) == 3 and all(b - a >= 2500 for a, b in zip(t6, t6[1:]))


@pytest.mark.parametrize("kind", ["timeout", "rnr"])
def test_retry_exceeded(kind):
    """A peer that never answers PSN 5 (or always answers RNR): after retry_cnt (rnr_retry)
    retransmissions the oldest message completes with RETRY_EXC_ERR (RNR_RETRY_EXC_ERR), the
    QP goes to ERR and the rest is flushed."""
    if kind == "timeout":
        r = StrictResponder(lose={(0, 5): 100})
        status = S.RETRY_EXC_ERR
    else:
        r = StrictResponder(rnr={(0, 5): 100}, rnr_code=1)
        status = S.RNR_RETRY_EXC_ERR
    ws = mixed_wqes()
    world, ws, _ = go(r, qctx=dict(retry_cnt=2, rnr_retry=2), wqes=ws, max_cycles=60000)
    cq = [(c["wr_id"], c["status"]) for c in cqes_of(world, 0)]
    exp = [(w["wr_id"], 0) for w in ws[:2]] + [(ws[2]["wr_id"], status.value)]
    exp += [(w["wr_id"], S.WR_FLUSH_ERR.value) for w in ws[3:]]
    assert cq == exp
    assert world.set_err == [0]
    assert world.stats["stat_retry_exc"] == 1
    assert sent_psns(world).count(5) == 3        # first try + 2 retries


def test_random_losses():
    """Random request and response losses on two QPs with mixed traffic: every WR completes
    once and successfully, memory is right."""
    rng = random.Random(7)
    lose = {(0, p): 1 for p in range(60) if rng.random() < 0.1}
    lose_resp = {(0, p): 1 for p in range(60) if rng.random() < 0.1}
    r = StrictResponder(lose=lose, lose_resp=lose_resp)
    ws = []
    for i in range(16):
        k = i % 4
        if k == 0:
            ws.append(wqe(O.RDMA_WRITE, rng.randrange(1, 700), SIG, local=GOOD["base"],
                          remote=0x800000 + 0x1000 * i))
        elif k == 1:
            ws.append(wqe(O.RDMA_READ, rng.randrange(1, 700), SIG, local=GOOD["base"] + 0x1000 * i,
                          remote=0x900000 + 0x1000 * i))
        elif k == 2:
            ws.append(wqe(O.ATOMIC_FETCH_AND_ADD, 8, SIG, local=GOOD["base"] + 0x1000 * i,
                          remote=0xA00000 + 8 * i, cmp=i + 1))
        else:
            ws.append(wqe(O.SEND, rng.randrange(0, 300), SIG, local=GOOD["base"]))
    world, ws, remote0 = go(r, qctx=dict(retry_cnt=7), wqes=ws, max_cycles=200000)
    check_all_succeeded(world, ws, remote0, r)
    assert world.stats["stat_retransmit"] >= 3 and world.stats["stat_timeout"] >= 1
    # the sum of the READ/atomic counts (Q_REQ_RD_OUT) follows the rewinds that clear them
    assert world.q_max["stat_q_rd_out"] >= 1 and world.q_last["stat_q_rd_out"] == 0


def test_read_resumes_after_received_responses():
    """The READ of 600 bytes (PSNs 2..4) loses its second response packet (PSN 3): the READ
    is requested again from PSN 3 for the remaining 344 bytes (IBA 9.7.5.1.5), not from the
    start."""
    r = StrictResponder(lose_resp={(0, 3): 1})
    world, ws, remote0 = go(r, wqes=mixed_wqes()[:2])
    check_all_succeeded(world, ws, remote0, r)
    reads = [(m["psn"], m["va"], m["dma_len"]) for _, q, m, _ in world.tx
             if m["opcode"] == B.READ_REQUEST.value]
    assert reads == [(2, 0x801000, 600), (3, 0x801000 + 256, 600 - 256)]


class GhostResponder(StrictResponder):
    """A StrictResponder that also answers the first request packet with ``ghost`` (an ACK or
    NAK for a PSN far beyond anything the requester has sent)."""

    def __init__(self, ghost, **kw):
        super().__init__(**kw)
        self.ghost = ghost

    def __call__(self, world, q, meta, payload):
        if self.ghost is not None:
            world.resp.append((world.t + 5, dict(
                src_node=meta["dst_node"], dst_node=meta["src_node"], dest_qpn=q, se=0,
                ackreq=0, msn=0, paylen=0, opcode=B.ACKNOWLEDGE.value, **self.ghost), b""))
            self.ghost = None
        super().__call__(world, q, meta, payload)


@pytest.mark.parametrize("syndrome", [ACK, formats.AethSyndrome.NAK_REM_ACCESS_ERR.value])
def test_ack_or_nak_beyond_the_psns_sent_completes_nothing(syndrome):
    """IBA 9.7.5.1: a response whose PSN is not one the requester sent answers nothing. The
    first WRITE is lost and an ACK (a fatal NAK) for PSN 0x1000 arrives: it must neither
    complete the WRITE as a success nor fail it; the sequence NAK then recovers everything.
    Before the fix the ACK completed the unexecuted WRITE (the NAK failed it and the QP)."""
    r = GhostResponder(dict(psn=0x1000, syndrome=syndrome), lose={(0, 0): 1})
    world, ws, remote0 = go(r)
    check_all_succeeded(world, ws, remote0, r)
    assert [p for q, p, _ in r.executed] == [0, 1, 2, 5, 6, 7, 8]    # a READ counts once
    assert world.get(world.remote, 0x800000, 300) == world.get(world.host, GOOD["base"], 300)
    assert world.stats["stat_resp_drop"] >= 1


@pytest.mark.parametrize("first", [O.RDMA_READ, O.ATOMIC_FETCH_AND_ADD])
def test_ack_beyond_a_read_or_atomic_is_an_implied_nak(first):
    """IBA 9.7.5.1.5: the response of the head READ (atomic) is lost, the next WRITE's ACK
    arrives: the requester retransmits from the READ (atomic) at once, not after its local ACK
    timer (2,048 cycles); the atomic is answered from the responder's replay, adding once."""
    ws = [wqe(first, 8, SIG, local=GOOD["base"] + 0x8000, remote=0x801000, cmp=3),
          wqe(O.RDMA_WRITE, 20, SIG, local=GOOD["base"] + 0x100, remote=0x803000)]
    r = StrictResponder(lose_resp={(0, 0): 1})
    world, ws, remote0 = go(r, wqes=ws)
    check_all_succeeded(world, ws, remote0, r)
    assert world.stats["stat_timeout"] == 0 and world.stats["stat_retransmit"] == 1
    t0 = [t for t, q, m, _ in world.tx if m["psn"] == 0]
    assert len(t0) == 2 and t0[1] - t0[0] < 500
