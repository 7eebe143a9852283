"""The requester's combinational blocks against Python models: the local WQE checks
(hw/rnic/wqe_check.py), the request header (hw/rnic/request_header.py) and the response
classification (hw/rnic/response_check.py)."""

import random

import pytest
from amaranth.sim import Simulator

from hw.formats import AethSyndrome, BthOpcode as B, WcStatus as S, WrOpcode as W
from hw.rnic.request_header import RequestHeader
from hw.rnic.response_check import ResponseCheck
from hw.rnic.wqe_check import WqeCheck

from .port_drivers import comb_cases

M24 = (1 << 24) - 1


@pytest.mark.parametrize("mtu", [100, 4097, "4096"])
def test_blocks_check_the_mtu(mtu):
    for block in (WqeCheck, RequestHeader, ResponseCheck):
        with pytest.raises(ValueError, match=r"^mtu must be one of 256, 512, 1024, 2048, 4096, "
                                             rf"not {mtu!r}$"):
            block(mtu)


# ---- local checks (IBA 10.6.3.1, 11.6.2)

def wqe_check_model(wqe, wqe_err, mr, pd, mtu):
    op, n = wqe["opcode"], wqe["length"]
    atomic = op in (W.ATOMIC_CMP_AND_SWP.value, W.ATOMIC_FETCH_AND_ADD.value)
    writes_local = atomic or op == W.RDMA_READ.value
    inside = mr["base"] <= wqe["local_addr"] and wqe["local_addr"] + n <= mr["base"] + mr["length"]
    mr_ok = (mr["valid"] and mr["key"] == wqe["lkey"] and mr["pd"] == pd and inside
             and (not writes_local or mr["access"] & 1))
    if wqe_err or op > W.ATOMIC_FETCH_AND_ADD.value:
        status = S.LOC_QP_OP_ERR.value
    elif atomic and n != 8:
        status = S.LOC_LEN_ERR.value
    elif n != 0 and not mr_ok:
        status = S.LOC_PROT_ERR.value
    else:
        status = 0
    npkts = 1 if atomic or n == 0 else -(-n // mtu)
    return status, npkts


def test_wqe_check_against_model():
    mtu = 1024
    dut = WqeCheck(mtu)
    rng = random.Random(1)
    cases = []
    for _ in range(400):
        base = rng.choice([0, 0x1000, 0xFFFF_F000])
        mr = {"base": base, "length": rng.choice([0, 8, 4096, 1 << 20]), "key": rng.choice([5, 6]),
              "pd": rng.choice([1, 2]), "access": rng.choice([0, 1, 6, 15]),
              "valid": rng.random() < 0.8}
        wqe = {"opcode": rng.choice(list(range(8)) + [0x40]),
               "length": rng.choice([0, 1, 8, 9, mtu, mtu + 1, 4096, 1 << 20]),
               "local_addr": base + rng.choice([0, 8, 4088, 1 << 20]), "lkey": rng.choice([5, 6])}
        cases.append({"wqe": wqe, "mr": mr, "pd": rng.choice([1, 2]),
                      "wqe_err": int(rng.random() < 0.1)})
    seen = set()

    def check(case, get):
        want = wqe_check_model(case["wqe"], case["wqe_err"], case["mr"], case["pd"], mtu)
        got = (get(dut.status), get(dut.npkts))
        assert got == want, case
        seen.add(want[0])
    comb_cases(dut, cases, check)
    # every outcome occurred
    assert seen == {0, S.LOC_QP_OP_ERR.value, S.LOC_LEN_ERR.value, S.LOC_PROT_ERR.value}


# ---- request headers (IBA 9.2, table 35: the opcode sequence of a message)

def header_model(op, length, mtu, imm):
    """Opcodes and payload lengths of the packets of one message."""
    if op == W.RDMA_READ.value:
        return [(B.READ_REQUEST.value, 0)]
    if op in (W.ATOMIC_CMP_AND_SWP.value, W.ATOMIC_FETCH_AND_ADD.value):
        return [((B.COMPARE_SWAP if op == W.ATOMIC_CMP_AND_SWP.value else B.FETCH_ADD).value, 0)]
    kind = "WRITE" if op <= W.RDMA_WRITE_WITH_IMM.value else "SEND"
    n = max(1, -(-length // mtu))
    out = []
    for k in range(n):
        sfx = ("ONLY" if n == 1 else "FIRST") if k == 0 else ("LAST" if k == n - 1 else "MIDDLE")
        if imm and sfx in ("ONLY", "LAST"):
            sfx += "_IMM"
        out.append((B[f"{kind}_{sfx}"].value, min(mtu, length - k * mtu)))
    return out


@pytest.mark.parametrize("op", [o.value for o in W])
def test_request_header_sequence(op):
    mtu = 256
    dut = RequestHeader(mtu)
    imm = op in (W.RDMA_WRITE_WITH_IMM.value, W.SEND_WITH_IMM.value)
    single = op >= W.RDMA_READ.value
    got = []

    async def tb(ctx):
        for length in (0, 1, mtu, mtu + 1, 3 * mtu, 3 * mtu + 5):
            ctx.set(dut.op, {"imm": imm, "single": single, "read": op == W.RDMA_READ.value,
                             "atomic": single and op != W.RDMA_READ.value, "known": 1,
                             "write": op <= W.RDMA_WRITE_WITH_IMM.value})
            ctx.set(dut.wqe, {"opcode": op, "length": length, "remote_addr": 0x5000,
                              "flags": 4, "swap": 11, "compare_add": 22})
            ctx.set(dut.ctx, {"dest_qpn": 77, "dest_node": 3})
            ctx.set(dut.qpn, 9)
            left, first, pkts = length, 1, []
            while True:
                ctx.set(dut.seg_left, left)
                ctx.set(dut.seg_first, first)
                meta = ctx.get(dut.meta)
                pkts.append((int(meta.opcode), ctx.get(dut.paylen)))
                assert meta.dest_qpn == 77 and meta.dst_node == 3 and meta.udp_sport == 0xC009
                assert meta.ackreq == ctx.get(dut.last)
                # solicited only on the last packet of a SEND or a WRITE with immediate
                assert meta.se == (ctx.get(dut.last) and (imm or op == W.SEND.value))
                if single:
                    assert meta.dma_len == length and meta.va == 0x5000
                if op == W.ATOMIC_CMP_AND_SWP.value:
                    assert (meta.swap_add, meta.compare) == (11, 22)
                if ctx.get(dut.last):
                    break
                left, first = left - mtu, 0
            got.append(pkts)
            assert pkts == header_model(op, length, mtu, imm), (length, pkts)

    sim = Simulator(dut)
    sim.add_testbench(tb)
    sim.run()
    assert len(got) == 6


# ---- response classification (IBA 9.7.5.1)

def psn_le(a, b):
    return ((b - a) & M24) < (1 << 23)


def response_model(rxm, head, nonempty, length, hi_psn, mtu):
    op, syn, psn = rxm["opcode"], rxm["syndrome"], rxm["psn"]
    ok = nonempty and head["status"] == 0
    r = {}
    r["is_ack"] = op == B.ACKNOWLEDGE.value
    r["is_nak"] = r["is_ack"] and (syn >> 5) & 3 != 0
    r["is_rnr"] = r["is_ack"] and (syn >> 5) & 3 == 1
    r["is_seq_nak"] = r["is_nak"] and syn == AethSyndrome.NAK_PSN_SEQ_ERR.value
    r["is_rresp"] = B.READ_RESPONSE_FIRST.value <= op <= B.READ_RESPONSE_ONLY.value
    r["rresp_end"] = op in (B.READ_RESPONSE_LAST.value, B.READ_RESPONSE_ONLY.value)
    r["is_aack"] = op == B.ATOMIC_ACKNOWLEDGE.value
    first, last = head["first_psn"], head["last_psn"]
    hop = head["opcode"]
    inside = psn_le(first, psn) and psn_le(psn, last)
    r["head_ws"] = nonempty and hop <= W.SEND_WITH_IMM.value and head["status"] == 0
    if r["is_ack"] and not r["is_nak"]:
        r["ack_covers"] = psn_le(last, psn)
    else:
        r["ack_covers"] = psn_le(last, psn) and last != psn
    read, atomic = hop == W.RDMA_READ.value, hop in (5, 6)
    nxt = (first + head["rcv"]) & M24
    r["rresp_at"] = ok and read and inside and psn == nxt
    r["at_last"] = psn == last
    off = ((psn - first) & M24) * mtu
    if psn == last:
        form = r["rresp_end"] and off + rxm["paylen"] == length
    else:
        form = op in (B.READ_RESPONSE_FIRST.value, B.READ_RESPONSE_MIDDLE.value) \
            and rxm["paylen"] == mtu
    if head["rcv"] == 0 and op not in (B.READ_RESPONSE_FIRST.value, B.READ_RESPONSE_ONLY.value):
        form = False
    r["rresp_match"] = r["rresp_at"] and form
    r["bad_resp"] = (r["rresp_at"] and not form) or (
        ok and inside and ((r["is_rresp"] and not read) or (r["is_aack"] and not atomic)))
    r["rresp_gap"] = ok and read and inside and psn != nxt and psn_le(nxt, psn)
    r["ack_ghost"] = r["is_ack"] and not psn_le(psn, hi_psn)
    r["implied_nak"] = (r["is_ack"] and not r["is_nak"] and ok and (read or atomic)
                        and psn_le(first, psn))
    r["aack_match"] = ok and atomic and first == psn
    r["last_use"] = ((r["rresp_at"] and r["rresp_end"] and r["at_last"])
                     or (r["is_aack"] and r["aack_match"])
                     or (r["head_ws"] and r["ack_covers"] and not r["is_nak"]))
    r["nak_off"] = (psn - first) & M24
    r["nak_more"] = (r["head_ws"] and inside and r["nak_off"] > head["rcv"]
                     and r["nak_off"] < 1 << 16)
    r["rx_off"] = off
    r["need_info"] = ok and not head["noinfo"] and (head["signaled"] or hop >= W.RDMA_READ.value)
    return {k: int(v) for k, v in r.items()}


NAK_STATUS = {AethSyndrome.NAK_INV_REQ.value: S.REM_INV_REQ_ERR,
              AethSyndrome.NAK_REM_ACCESS_ERR.value: S.REM_ACCESS_ERR,
              AethSyndrome.NAK_REM_OP_ERR.value: S.REM_OP_ERR,
              AethSyndrome.NAK_PSN_SEQ_ERR.value: S.RETRY_EXC_ERR,
              AethSyndrome.NAK_INV_RD_REQ.value: S.REM_INV_RD_REQ_ERR}


def test_response_check_against_model():
    mtu = 256
    dut = ResponseCheck(mtu)
    rng = random.Random(3)
    cases = []
    for _ in range(1500):
        first = rng.choice([0, 100, M24 - 2])
        npk = rng.choice([1, 1, 2, 4])
        head = {"first_psn": first, "last_psn": (first + npk - 1) & M24,
                "opcode": rng.choice(range(7)), "status": rng.choice([0, 0, 0, 7]),
                "rcv": rng.choice([0, 0, 1, 2]), "signaled": rng.random() < 0.5,
                "noinfo": rng.random() < 0.1, "index": 0}
        length = rng.choice([(npk - 1) * mtu + 8, npk * mtu, 8])
        rxm = {"opcode": rng.choice([B.ACKNOWLEDGE.value, B.ATOMIC_ACKNOWLEDGE.value]
                                    + list(range(B.READ_RESPONSE_FIRST.value,
                                                 B.READ_RESPONSE_ONLY.value + 1))),
               "syndrome": rng.choice([0x1F, 0x2C, 0x60, 0x61, 0x62, 0x63, 0x64, 0x7F]),
               "psn": (first + rng.choice([-2, -1, 0, 1, 2, 3, 5])) & M24,
               "paylen": rng.choice([0, 8, mtu])}
        cases.append({"rxm": rxm, "head": head, "nonempty": int(rng.random() < 0.9),
                      "length": length, "hi_psn": (first + rng.choice([0, 3, 8])) & M24})
    hits = {}

    def check(case, get):
        want = response_model(case["rxm"], case["head"], case["nonempty"], case["length"],
                              case["hi_psn"], mtu)
        o = get(dut.o)
        got = {k: int(getattr(o, k)) for k in want}
        assert got == want, case
        for k, v in got.items():
            hits[k] = hits.get(k, 0) + (v != 0)
        syn = case["rxm"]["syndrome"]
        if got["is_nak"] and not got["is_rnr"]:
            assert o.nak_status == NAK_STATUS.get(syn, S.REM_OP_ERR).value
        if got["is_rnr"]:
            assert o.nak_status == S.RNR_RETRY_EXC_ERR.value
    comb_cases(dut, cases, check)
    # every classification occurred, so none of the comparisons above is vacuous
    assert all(hits[k] > 0 for k in hits), hits


# ---- a QP's eligibility (hw/rnic/send_engine.py may_issue) and the engines' parameters

def test_may_issue_against_model():
    from amaranth.hdl import Module
    from amaranth.lib import data, wiring
    from amaranth.lib.wiring import In, Out

    from hw.rnic.send_engine import ISSUE_FIELDS, may_issue

    MO = 16
    widths = {"fi": 16, "pi": 16, "tail": 5, "head": 5, "rd_out": 5, "qlim": 5}
    layout = data.StructLayout({f: widths.get(f, 1) for f in ISSUE_FIELDS})

    class Dut(wiring.Component):
        v: In(layout)
        o: Out(1)

        def elaborate(self, platform):
            m = Module()
            m.d.comb += self.o.eq(may_issue(self.v, MO))
            return m

    dut = Dut()
    rng = random.Random(7)
    cases, seen = [], set()
    for _ in range(800):
        v = {f: int(rng.random() < 0.15) for f in ISSUE_FIELDS if widths.get(f, 1) == 1}
        v["rts"] = int(rng.random() < 0.9)
        v["fi"] = rng.choice([3, 0xFFFF])
        v["pi"] = rng.choice([3, 4, 0])
        v["head"] = rng.choice([0, 30])
        v["tail"] = (v["head"] + rng.choice([0, 5, MO])) % 32
        v["qlim"] = rng.choice([1, 16])
        v["rd_out"] = rng.choice([0, 1, 16])
        cases.append({"v": v})

    def check(case, get):
        v = case["v"]
        want = (v["rts"] and not v["err"] and not v["lerr"] and not v["ev_pend"]
                and v["fi"] != v["pi"] and not v["rwd_pend"] and not v["rnr_wait"]
                and (v["tail"] - v["head"]) % 32 != MO and v["rd_out"] < v["qlim"]
                and not v["fence_wait"])
        assert get(dut.o) == int(want), v
        seen.add(int(want))
    comb_cases(dut, cases, check)
    assert seen == {0, 1}


def test_engines_check_their_parameters():
    from hw.config import preset
    from hw.rnic.fetch_issuer import FetchIssuer
    from hw.rnic.response_engine import ResponseEngine
    from hw.rnic.send_engine import SendEngine

    cfg = preset("small").nic
    with pytest.raises(ValueError, match=r"^qpn_bits must be an integer in \[1, 16\], not 0$"):
        ResponseEngine(cfg, 0)
    with pytest.raises(ValueError, match=r"^fetch_depth must be an integer in \[1, 16\], not 17$"):
        SendEngine(cfg, 3, 3, 17)
    with pytest.raises(ValueError, match=r"^mr_bits must be an integer in \[1, 16\], not 0$"):
        SendEngine(cfg, 3, 0, 4)
    with pytest.raises(ValueError, match=r"^cfg must be a NicConfig, not SystemConfig$"):
        FetchIssuer(preset("small"), 3, 4)
