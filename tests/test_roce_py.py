"""sim/roce.py and sim/pcap.py against scapy."""

import random

import pytest
from scapy.compat import raw
from scapy.contrib.roce import BTH
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.utils import rdpcap

from hw.formats import BthOpcode
from sim import roce
from sim.pcap import PcapWriter


def random_meta(rng, op):
    meta = {name: rng.getrandbits(w) for name, w in roce._WIDTH.items()}
    meta["opcode"] = op.value
    del meta["paylen"]
    return meta


def random_case(rng, op, maxlen=600):
    n = 0 if op in roce.NO_PAYLOAD_OPCODES else rng.randrange(0, maxlen + 1)
    return random_meta(rng, op), rng.randbytes(n)


@pytest.mark.parametrize("op", list(BthOpcode))
def test_encode_against_scapy(op):
    rng = random.Random(op.value)
    for _ in range(5):
        meta, payload = random_case(rng, op)
        frame = roce.encode(meta, payload)
        p = Ether(frame)
        assert p.type == 0x0800 and p.dst == f"02:00:00:00:00:{meta['dst_node']:02x}"
        assert p.src == f"02:00:00:00:00:{meta['src_node']:02x}"
        ip = p[IP]
        assert ip.ttl == 64 and ip.flags == "DF" and ip.proto == 17 and ip.len == len(frame) - 14
        assert ip.src == f"192.0.2.{(meta['src_node'] + 1) & 255}"
        # scapy recomputes the same IPv4 checksum
        q = Ether(frame)
        del q[IP].chksum
        assert raw(q)[:34] == frame[:34]
        udp = p[UDP]
        assert udp.dport == 4791 and udp.sport == meta["udp_sport"] and udp.len == len(frame) - 34
        bth = p[BTH]
        assert bth.opcode == op.value and bth.solicited == meta["se"] and bth.migreq == 0
        assert bth.padcount == -len(payload) & 3 and bth.version == 0 and bth.pkey == 0xFFFF
        assert bth.dqpn == meta["dest_qpn"] and bth.ackreq == meta["ackreq"]
        assert bth.psn == meta["psn"]
        assert bth.icrc == int.from_bytes(frame[-4:], "big")
        # scapy recomputes the same ICRC
        r = Ether(frame)
        r[BTH].icrc = None
        assert raw(r) == frame
        # round trip
        m2, p2, ok = roce.decode(frame)
        assert ok and p2 == payload and m2 == roce.normalize(meta, payload)
        assert roce.classify(frame) == "ok"


def test_decode_errors():
    rng = random.Random(5)
    meta, payload = random_case(rng, BthOpcode.SEND_ONLY, 50)
    f = bytearray(roce.encode(meta, payload))
    f[60] ^= 1
    assert roce.classify(bytes(f)) == "icrc"
    _, _, ok = roce.decode(bytes(f), check_icrc=False)
    assert not ok
    g = bytearray(roce.encode(meta, payload))
    g[42] = 0x30
    g[-4:] = roce.icrc(g).to_bytes(4, "little")
    assert roce.classify(bytes(g)) == "malformed"
    assert roce.classify(roce.encode(meta, payload), max_frame_bytes=60) == "malformed"
    with pytest.raises(ValueError, match="paylen"):
        roce.encode(dict(meta, paylen=3), payload)
    with pytest.raises(ValueError, match="psn must be in"):
        roce.encode(dict(meta, psn=1 << 24), payload)


def test_pcap_roundtrip(tmp_path):
    rng = random.Random(7)
    frames = [roce.encode(*random_case(rng, op, 100)) for op in list(BthOpcode)[:6]]
    path = tmp_path / "x.pcap"
    with PcapWriter(path) as w:
        for i, fr in enumerate(frames):
            w.write(fr, 1_000_000_123 + 1000 * i)
    head = path.read_bytes()[:4]
    assert int.from_bytes(head, "little") == 0xA1B23C4D
    pkts = rdpcap(str(path))
    assert [raw(p) for p in pkts] == frames
    assert pkts[0][BTH].opcode == 0
    assert int(pkts[1].time * 10**9) == 1_000_001_123 or abs(float(pkts[1].time) - 1.000001123) < 1e-9
    with pytest.raises(ValueError, match="snaplen must be an integer"):
        PcapWriter(tmp_path / "y.pcap", snaplen=3)
