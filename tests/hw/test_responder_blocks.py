"""The responder's blocks against Python models: the request checks
(hw/rnic/request_check.py) and the write gate with what leaves it
(hw/rnic/responder_gate.py)."""

import random

import pytest
from amaranth.sim import Simulator

from hw.formats import AethSyndrome as Syn, BthOpcode as Op, WcStatus
from hw.rnic.request_check import MSG_SEND, MSG_WRITE, RequestCheck
from hw.rnic.responder_gate import ITEM_CQE, ITEM_RESP, ResponderGate
from hw.rnic.response_queue import RESP_ACK, RESP_ATOMIC_PEND, RESP_READ

from .port_drivers import WriteHost, comb_cases, offer

M24 = (1 << 24) - 1
SENDS_FIRST = {Op.SEND_FIRST, Op.SEND_ONLY, Op.SEND_ONLY_IMM}
SENDS_CONT = {Op.SEND_MIDDLE, Op.SEND_LAST, Op.SEND_LAST_IMM}
WRITES_FIRST = {Op.WRITE_FIRST, Op.WRITE_ONLY, Op.WRITE_ONLY_IMM}
WRITES_CONT = {Op.WRITE_MIDDLE, Op.WRITE_LAST, Op.WRITE_LAST_IMM}
LAST = {Op.SEND_LAST, Op.SEND_LAST_IMM, Op.SEND_ONLY, Op.SEND_ONLY_IMM, Op.WRITE_LAST,
        Op.WRITE_LAST_IMM, Op.WRITE_ONLY, Op.WRITE_ONLY_IMM}
FULL = {Op.SEND_FIRST, Op.SEND_MIDDLE, Op.WRITE_FIRST, Op.WRITE_MIDDLE}


def request_model(pk, st, ctx, mr, key, wqe, pi, mtu):
    op = Op(pk["opcode"]) if pk["opcode"] in {o.value for o in Op} else None
    r = {"send_first": op in SENDS_FIRST, "send_cont": op in SENDS_CONT,
         "write_first": op in WRITES_FIRST, "write_cont": op in WRITES_CONT,
         "last": op in LAST, "full": op in FULL,
         "imm": op in {Op.SEND_LAST_IMM, Op.SEND_ONLY_IMM, Op.WRITE_LAST_IMM, Op.WRITE_ONLY_IMM},
         "wimm": op in {Op.WRITE_LAST_IMM, Op.WRITE_ONLY_IMM},
         "read": op == Op.READ_REQUEST, "atomic": op in {Op.COMPARE_SWAP, Op.FETCH_ADD}}
    r["known"] = any(r[k] for k in ("send_first", "send_cont", "write_first", "write_cont",
                                    "read", "atomic"))
    cont = r["send_cont"] or r["write_cont"]
    r["seq_ok"] = {MSG_SEND: r["send_cont"], MSG_WRITE: r["write_cont"]}.get(st["inprog"],
                                                                            not cont)
    n = pk["paylen"]
    r["len_ok"] = (n <= mtu and (not r["full"] or n == mtu)
                   and (not (r["read"] or r["atomic"]) or n == 0))
    behind = (st["epsn"] - pk["psn"]) & M24
    r["psn_behind"] = 0 < behind <= 1 << 23
    r["rq_empty"] = st["ci"] == pi

    def ok(right, va, length, remote):
        good = (mr["valid"] and mr["key"] == key and mr["pd"] == ctx["pd"]
                and mr["access"] & right and mr["base"] <= va
                and va + length <= mr["base"] + mr["length"])
        return good and (not remote or ctx["access"] & right)

    r["w_va"] = pk["va"] if r["write_first"] else st["va"]
    r["w_rem"] = pk["dma_len"] if r["write_first"] else st["rem"]
    r["w_acc_bad"] = r["write_first"] and pk["dma_len"] != 0 and not ok(2, pk["va"], pk["dma_len"], True)
    r["w_len_bad"] = n > r["w_rem"] or (r["last"] and n != r["w_rem"])
    r["r_acc_bad"] = pk["dma_len"] != 0 and not ok(4, pk["va"], pk["dma_len"], True)
    r["a_align_bad"] = pk["va"] % 8 != 0
    r["a_acc_bad"] = not ok(8, pk["va"], 8, True)
    r["s_len_bad"] = n > st["rem"]
    r["q_prot_bad"] = wqe["length"] != 0 and not ok(1, wqe["addr"], wqe["length"], False)
    r["q_len_bad"] = n > wqe["length"]
    r["n_resp"] = 1 if pk["dma_len"] == 0 else -(-pk["dma_len"] // mtu)
    return {k: int(v) for k, v in r.items()}


def test_request_check_mtu():
    with pytest.raises(ValueError, match=r"^mtu must be one of 256, 512, 1024, 2048, 4096, "
                                         r"not 100$"):
        RequestCheck(100)


def test_request_check_against_model():
    mtu = 512
    dut = RequestCheck(mtu)
    rng = random.Random(5)
    cases = []
    for _ in range(1500):
        base = rng.choice([0x1000, 0x8000])
        pk = {"opcode": rng.choice([o.value for o in Op] + [0x15, 0x60]),
              "psn": rng.choice([0, 5, M24, 1 << 23]), "paylen": rng.choice([0, 8, mtu, mtu + 8]),
              "va": base + rng.choice([0, 4, 8, 0x7000]),
              "dma_len": rng.choice([0, 8, mtu, 3 * mtu + 1])}
        st = {"epsn": rng.choice([0, 5, 6, (1 << 23) + 1]), "inprog": rng.choice([0, 1, 2]),
              "ci": rng.choice([3, 4]), "va": base, "rem": rng.choice([0, 8, mtu, 2 * mtu])}
        ctx = {"pd": rng.choice([1, 2]), "access": rng.choice([0, 2, 4, 8, 14])}
        mr = {"valid": rng.random() < 0.85, "key": rng.choice([0x100, 0x200]), "pd": 1,
              "access": rng.choice([1, 2, 4, 8, 15]), "base": base, "length": 0x4000}
        wqe = {"addr": base + rng.choice([0, 0x3ff8]), "length": rng.choice([0, 8, 4096])}
        cases.append({"pk": pk, "state": st, "ctx": ctx, "mr": mr,
                      "key": rng.choice([0x100, 0x200]), "wqe": wqe, "pi": rng.choice([3, 4])})
    hits = {}

    def check(case, get):
        want = request_model(case["pk"], case["state"], case["ctx"], case["mr"], case["key"],
                             case["wqe"], case["pi"], mtu)
        o = get(dut.o)
        got = {k: int(getattr(o, k)) for k in want}
        assert got == want, case
        for k, v in got.items():
            hits[k] = hits.get(k, 0) + (v != 0)
    comb_cases(dut, cases, check)
    assert all(hits[k] > 0 for k in hits), hits


# ---- the write gate and what leaves it

def run_gate(events, *, seed, p_ready=0.6, n_cycles=5000):
    """``events``: ("w", qp, fail) a payload write; ("c", qp, n, status) a receive CQE;
    ("r", qp, n, kind) a response descriptor (``n`` in its PSN). Returns what left on
    ``cqe``, ``resp`` and ``err``, and the cycle each write was answered."""
    dut = ResponderGate(4, 16)
    rng = random.Random(seed)
    out = {"cqe": [], "resp": [], "err": []}
    host = WriteHost(dut.done, rng)

    async def drive(ctx):
        for ev in events:
            if ev[0] == "w":
                await host.write(ctx, dut.wr_issued, ev[1], ev[2])
            else:
                if ev[0] == "c":
                    item = {"kind": ITEM_CQE, "cqn": 2,
                            "cqe": {"wr_id": ev[2], "status": ev[3], "qpn": ev[1], "byte_len": 9}}
                else:
                    item = {"kind": ITEM_RESP, "resp": {"kind": ev[3], "psn": ev[2],
                                                        "syn": Syn.ACK.value, "qpn": ev[1]}}
                await offer(ctx, dut.i, {"item": item, "key": ev[1]})
            for _ in range(rng.randint(0, 2)):
                await ctx.tick()

    async def sink(ctx):
        ports = {"cqe": dut.cqe, "resp": dut.resp, "err": dut.err}
        for _ in range(n_cycles):
            rdy = {k: rng.random() < p_ready for k in ports}
            for k, p in ports.items():
                ctx.set(p.ready, rdy[k])
            sampled = await ctx.tick().sample(*[x for p in ports.values()
                                                for x in (p.valid, p.payload)])
            vals = sampled[2:]
            for j, k in enumerate(ports):
                v, p = vals[2 * j], vals[2 * j + 1]
                if not (v and rdy[k]):
                    continue
                if k == "cqe":
                    out[k].append((int(p.cqe.wr_id), int(p.cqe.qpn), int(p.cqe.status),
                                   host.cycle))
                elif k == "resp":
                    out[k].append((int(p.psn), int(p.qpn), int(p.kind), int(p.syn),
                                   host.cycle))
                else:
                    out[k].append((int(p.qpn), host.cycle))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(drive, background=True)
    sim.add_testbench(host.run, background=True)
    sim.add_testbench(sink)
    sim.run()
    return out, host.answered


@pytest.mark.parametrize("seed", range(3))
def test_responder_gate_against_model(seed):
    rng = random.Random(seed)
    events = []
    for n in range(150):
        r = rng.random()
        if r < 0.35:
            events.append(("w", rng.randrange(3), rng.random() < 0.15))
        elif r < 0.6:
            events.append(("c", rng.randrange(3), n, rng.choice([0, 0, 1])))
        else:
            events.append(("r", rng.randrange(3), n,
                           rng.choice([RESP_ACK, RESP_READ, RESP_ATOMIC_PEND])))
    out, answered = run_gate(events, seed=seed)
    # model: a failed write marks its QP until the QP's next response, which leaves as a
    # NAK (a pending atomic keeps its kind) followed by an ERR request; a CQE in between
    # leaves as LOC_PROT_ERR (if it was a success) and does not clear the mark
    issued, failed = 0, set()
    cqes, resps, errs = [], [], []
    for ev in events:
        if ev[0] == "w":
            issued += 1
            if ev[2]:
                failed.add(ev[1])
        elif ev[0] == "c":
            st = WcStatus.LOC_PROT_ERR.value if ev[1] in failed and ev[3] == 0 else ev[3]
            cqes.append((ev[2], ev[1], st, issued))
        else:
            if ev[1] in failed:
                failed.discard(ev[1])
                kind = RESP_ATOMIC_PEND if ev[3] == RESP_ATOMIC_PEND else RESP_ACK
                resps.append((ev[2], ev[1], kind, Syn.NAK_REM_OP_ERR.value, issued))
                errs.append(ev[1])
            else:
                resps.append((ev[2], ev[1], ev[3], Syn.ACK.value, issued))
    assert [c[:3] for c in out["cqe"]] == [c[:3] for c in cqes]
    assert [r[:4] for r in out["resp"]] == [r[:4] for r in resps]
    assert [e for e, _ in out["err"]] == errs
    for got, want in ((out["cqe"], cqes), (out["resp"], resps)):
        for g, w in zip(got, want):
            if w[-1]:
                assert g[-1] > answered[w[-1] - 1]
    assert errs


def test_responder_gate_failed_write_directed():
    """A failed write of QP 1: its next CQE leaves as LOC_PROT_ERR, its next response as a NAK
    (remote operational error) and then QP 1 is asked to go to ERR; QP 2 is untouched."""
    events = [("w", 1, True), ("c", 1, 0, 0), ("c", 2, 1, 0), ("r", 1, 7, RESP_READ),
              ("r", 1, 8, RESP_ACK), ("r", 2, 9, RESP_ACK)]
    out, _ = run_gate(events, seed=0, n_cycles=400)
    assert [c[:3] for c in out["cqe"]] == [(0, 1, WcStatus.LOC_PROT_ERR.value), (1, 2, 0)]
    assert [r[:4] for r in out["resp"]] == [(7, 1, RESP_ACK, Syn.NAK_REM_OP_ERR.value),
                                            (8, 1, RESP_ACK, Syn.ACK.value),
                                            (9, 2, RESP_ACK, Syn.ACK.value)]
    assert [e for e, _ in out["err"]] == [1]
