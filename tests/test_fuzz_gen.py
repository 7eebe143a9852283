"""sim/fuzz.py: the fuzz-frame generator (pure Python)."""

import collections
import struct

import pytest

from hw.formats import BthOpcode
from sim import fuzz, roce

MTU = 256
MAXF = MTU + 128


def gen(seed=1, **kw):
    args = dict(dst_node=1, src_node=0, qpns=[3, 4, 5], n_qps=8, mtu=MTU,
                rkeys=[0x101, 0x202], va_ranges=[(0x1000_0000, 4096), (0x1000_8000, 512)],
                psn_hint={3: 0, 4: 100, 5: 0xFFFFFE}, avoid_qpns=[2])
    args.update(kw)
    return fuzz.FuzzGenerator(seed, **args)


@pytest.fixture(scope="module")
def sample():
    return gen(7).frames(6000)


def test_deterministic_per_seed():
    a = [f.frame for f in gen(5).frames(500)]
    b = [f.frame for f in gen(5).frames(500)]
    c = [f.frame for f in gen(6).frames(500)]
    assert a == b
    assert a != c


def test_every_class_and_outcome(sample):
    classes = collections.Counter(f.cls for f in sample)
    assert set(classes) == set(fuzz.CLASSES), classes
    outcomes = collections.Counter(f.expect for f in sample)
    assert all(outcomes[o] > 300 for o in ("ok", "icrc", "malformed")), outcomes
    assert any(f.demux_drop for f in sample)
    assert {f.engine for f in sample} >= {"responder", "requester", None}
    # every request opcode appears in a frame that passes the depacketizer
    ops = {BthOpcode(f.meta["opcode"]) for f in sample if f.expect == "ok"}
    assert set(fuzz.REQUEST_OPCODES) | set(fuzz.RESPONSE_OPCODES) <= ops


def test_expectation_is_the_classifier(sample):
    for f in sample:
        assert f.expect == roce.classify(f.frame, MAXF), f.reproducer()
        assert 1 <= len(f.frame)


def test_ok_frames_decode_and_carry_a_good_icrc(sample):
    for f in sample:
        if f.expect != "ok":
            continue
        meta, payload, icrc_ok = roce.decode(f.frame, MAXF)
        assert icrc_ok and meta == f.meta
        assert len(f.frame) <= MAXF
        # the ICRC field is the CRC of the frame (independent recomputation)
        assert fuzz.fix_icrc(f.frame) == f.frame
        assert f.demux_drop == (meta["dst_node"] != 1 or meta["dest_qpn"] >= 8)
        if not f.demux_drop:
            assert meta["dest_qpn"] != 2            # never the avoided QP


def test_valid_class_follows_the_rules(sample):
    for f in sample:
        if f.cls != "valid":
            continue
        assert f.expect == "ok"
        m = f.meta
        op = BthOpcode(m["opcode"])
        assert op in fuzz.REQUEST_OPCODES
        assert m["paylen"] <= MTU
        if op in (BthOpcode.SEND_FIRST, BthOpcode.SEND_MIDDLE, BthOpcode.WRITE_FIRST,
                  BthOpcode.WRITE_MIDDLE):
            assert m["paylen"] == MTU


def test_bad_icrc_and_truncated_frames_fail(sample):
    n_flip = n_cut = 0
    for f in sample:
        if f.cls == "icrc" and "masked" not in f.detail:
            n_flip += 1
            assert f.expect == "icrc", f.reproducer()
            with pytest.raises(ValueError, match="bad ICRC"):
                roce.decode(f.frame, MAXF)
        if f.cls == "trunc" and "fixed" not in f.detail:
            # cut as is, or only the ICRC recomputed: the IPv4/UDP lengths no longer match
            n_cut += 1
            with pytest.raises(ValueError):
                roce.decode(f.frame, MAXF)
            assert f.expect in ("icrc", "malformed"), f.reproducer()
            if "as is" in f.detail and len(f.frame) >= 58:
                assert f.expect == "icrc", f.reproducer()
    assert n_flip > 100 and n_cut > 100


def test_header_mutations_are_malformed(sample):
    for f in sample:
        if f.cls in ("ipcsum", "udpport", "ethertype", "header", "oversize") \
                and "pad" not in f.detail:       # a smaller pad count is a valid length
            assert f.expect == "malformed", f.reproducer()
        if f.cls == "oversize":
            assert len(f.frame) > MAXF
        if f.cls == "node" and f.expect == "ok":
            assert f.demux_drop


def test_psn_sequence():
    g = gen(3, qpns=[4], psn_hint=0xFFFFFF, weights={k: 0 for k in fuzz.CLASSES} | {"valid": 1})
    frames = g.frames(50)
    psn = 0xFFFFFF
    for f in frames:
        assert f.meta["psn"] == psn
        n = 1
        if f.meta["opcode"] == BthOpcode.READ_REQUEST.value:
            n = max(1, -(-f.meta["dma_len"] // MTU))
        psn = (psn + n) & 0xFFFFFF
    g.set_psn(77)
    assert g.frame("valid").meta["psn"] == 77


def test_fix_helpers():
    frame = roce.encode({"opcode": BthOpcode.SEND_ONLY.value, "dst_node": 1, "dest_qpn": 3}, b"abcd")
    assert fuzz.fix_lengths(frame) == frame
    assert fuzz.fix_ip_checksum(frame) == frame
    cut = fuzz.fix_lengths(frame[:-4] + frame[-8:])          # 4 bytes longer, consistent again
    assert struct.unpack("!H", cut[16:18])[0] == len(cut) - 14
    assert roce.classify(cut, MAXF) == "ok"


def test_bad_parameters():
    with pytest.raises(ValueError, match="qpns must name"):
        gen(qpns=[])
    with pytest.raises(ValueError, match="rkeys and va_ranges"):
        gen(rkeys=[1])
    with pytest.raises(ValueError, match="mtu must be one of"):
        gen(mtu=300)
    with pytest.raises(ValueError, match="overlap"):
        gen(qpns=[2, 3])
    with pytest.raises(ValueError, match="unknown class"):
        gen(weights={"nope": 1})
    with pytest.raises(ValueError, match="cls must be one of"):
        gen().frame("nope")


def test_valid_messages_are_in_sequence():
    """Per QP, "valid" frames form messages a responder accepts: FIRST, MIDDLE..., LAST with
    the byte count of the WRITE's RETH, consecutive PSNs."""
    g = gen(11, weights={k: 0 for k in fuzz.CLASSES} | {"valid": 1})
    state = {}
    psn = {3: 0, 4: 100, 5: 0xFFFFFE}
    firsts = lasts = 0
    for f in g.frames(3000):
        m = f.meta
        q, op = m["dest_qpn"], BthOpcode(m["opcode"])
        assert m["psn"] == psn[q]
        psn[q] = (psn[q] + (max(1, -(-m["dma_len"] // MTU)) if op == BthOpcode.READ_REQUEST
                            else 1)) & 0xFFFFFF
        name = op.name
        if q in state:
            kind, left = state[q]
            assert name.startswith(kind), (kind, name)
            assert "MIDDLE" in name or "LAST" in name
            if "MIDDLE" in name:
                assert left is None or left > MTU
                state[q] = (kind, None if left is None else left - MTU)
                assert m["paylen"] == MTU
            else:
                assert left is None or m["paylen"] == left
                assert 1 <= m["paylen"] <= MTU
                lasts += 1
                del state[q]
        else:
            assert "MIDDLE" not in name and "LAST" not in name
            if name == "WRITE_FIRST":
                state[q] = ("WRITE", m["dma_len"] - MTU)
                firsts += 1
            elif name == "SEND_FIRST":
                state[q] = ("SEND", None)
                firsts += 1
    assert firsts > 50 and lasts > 50
