"""Pure-Python RoCEv2 frame encoder/decoder: the reference model of the packetizer and
depacketizer (hw/net/packetizer.py, hw/net/depacketizer.py).

Frame layout (InfiniBand Architecture Specification vol. 1 rel. 1.4, chapter 9.2-9.3 for
BTH and extension headers, Annex A17.4 for the RoCEv2 UDP/IPv4 encapsulation, A17.3.3
for the ICRC): Ethernet (dst 02:00:00:00:00:<dst_node>, src 02:00:00:00:00:<src_node>,
type 0x0800), IPv4 (no options, DF, TTL 64, protocol 17, 192.0.2.<node+1>), UDP (source
port from the meta, destination 4791, checksum 0), BTH, the extension headers of
``formats.headers_of(opcode)``, payload, pad to a multiple of 4, ICRC (little-endian,
as scapy.contrib.roce computes it).

Field names are those of :data:`hw.formats.PKT_META`.
"""

import struct
import zlib

from amaranth.hdl import Shape

from hw import formats
from hw.formats import BthOpcode, PKT_META, ROCE_UDP_PORT

__all__ = ["encode", "decode", "icrc", "classify", "header_bytes", "META_FIELDS",
           "NO_PAYLOAD_OPCODES"]

META_FIELDS = tuple(name for name, _ in PKT_META)

#: Opcodes whose packets carry no payload (IBA 9.4).
NO_PAYLOAD_OPCODES = frozenset({
    BthOpcode.READ_REQUEST, BthOpcode.ACKNOWLEDGE, BthOpcode.ATOMIC_ACKNOWLEDGE,
    BthOpcode.COMPARE_SWAP, BthOpcode.FETCH_ADD,
})

_WIDTH = {name: Shape.cast(f.shape).width for name, f in PKT_META}


def header_bytes(opcode):
    """Bytes from the start of the frame to the first payload byte."""
    return formats.header_bytes(opcode)


def _ip_checksum(hdr):
    s = sum(struct.unpack("!10H", hdr))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def icrc(frame):
    """ICRC of a RoCEv2/IPv4 frame whose last 4 bytes are the ICRC field (ignored)."""
    body = bytearray(frame[14:len(frame) - 4])
    body[1] = 0xFF                  # TOS
    body[8] = 0xFF                  # TTL
    body[10:12] = b"\xff\xff"       # IP header checksum
    body[26:28] = b"\xff\xff"       # UDP checksum
    body[32] = 0xFF                 # BTH byte 4: FECN, BECN, resv6
    return zlib.crc32(b"\xff" * 8 + bytes(body))


def encode(meta, payload=b""):
    """Frame bytes for header fields ``meta`` (dict, missing fields are 0) and ``payload``."""
    payload = bytes(payload)
    for name, val in meta.items():
        if name not in _WIDTH:
            raise ValueError(f"{name!r} is not a PKT_META field")
        if not 0 <= int(val) < (1 << _WIDTH[name]):
            raise ValueError(f"{name} must be in [0, {(1 << _WIDTH[name]) - 1}], not {val}")
    g = lambda name: int(meta.get(name, 0))
    if "paylen" in meta and g("paylen") != len(payload):
        raise ValueError(f"paylen {g('paylen')} does not match the payload length {len(payload)}")
    op = BthOpcode(g("opcode"))
    pad = -len(payload) & 3
    ext = b""
    for h in formats.headers_of(op):
        if h == "reth":
            ext += struct.pack("!QII", g("va"), g("rkey"), g("dma_len"))
        elif h == "atomiceth":
            ext += struct.pack("!QIQQ", g("va"), g("rkey"), g("swap_add"), g("compare"))
        elif h == "aeth":
            ext += struct.pack("!I", (g("syndrome") << 24) | g("msn"))
        elif h == "atomicacketh":
            ext += struct.pack("!Q", g("orig"))
        elif h == "immdt":
            ext += struct.pack("!I", g("imm"))
    bth = struct.pack("!BBHII", op.value, (g("se") << 7) | (pad << 4), 0xFFFF,
                      g("dest_qpn"), (g("ackreq") << 31) | g("psn"))
    udp_len = 8 + len(bth) + len(ext) + len(payload) + pad + 4
    udp = struct.pack("!HHHH", g("udp_sport"), ROCE_UDP_PORT, udp_len, 0)
    src_ip = bytes([192, 0, 2, (g("src_node") + 1) & 0xFF])
    dst_ip = bytes([192, 0, 2, (g("dst_node") + 1) & 0xFF])
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + udp_len, 0, 0x4000, 64, 17, 0, src_ip, dst_ip)
    ip = ip[:10] + struct.pack("!H", _ip_checksum(ip)) + ip[12:]
    eth = bytes([2, 0, 0, 0, 0, g("dst_node"), 2, 0, 0, 0, 0, g("src_node")]) + b"\x08\x00"
    frame = eth + ip + udp + bth + ext + payload + bytes(pad) + bytes(4)
    return frame[:-4] + icrc(frame).to_bytes(4, "little")


def classify(frame, max_frame_bytes=4096 + 128):
    """What the depacketizer does with ``frame``: ``"ok"``, ``"icrc"`` or ``"malformed"``.

    Structural errors (longer than the buffer, shorter than Ethernet+IPv4+UDP+BTH+ICRC)
    are reported before the ICRC; all header checks after it.
    """
    try:
        decode(frame, max_frame_bytes)
    except ValueError as e:
        return "icrc" if str(e).startswith("bad ICRC") else "malformed"
    return "ok"


def decode(frame, max_frame_bytes=None, check_icrc=True):
    """``(meta, payload, icrc_ok)`` of a frame; ``ValueError`` if it is malformed.

    Fields absent from the opcode's headers are 0. With ``check_icrc`` a bad ICRC also
    raises ``ValueError("bad ICRC ...")``, after the structural checks and before the
    header checks, as the depacketizer orders them.
    """
    frame = bytes(frame)
    n = len(frame)
    if max_frame_bytes is not None and n > max_frame_bytes:
        raise ValueError(f"frame of {n} bytes longer than {max_frame_bytes}")
    if n < 14 + 20 + 8 + 12 + 4:
        raise ValueError(f"frame of {n} bytes too short")
    icrc_ok = icrc(frame) == int.from_bytes(frame[-4:], "little")
    if check_icrc and not icrc_ok:
        raise ValueError("bad ICRC")
    if frame[12:14] != b"\x08\x00":
        raise ValueError("ethertype is not IPv4")
    if frame[14] != 0x45:
        raise ValueError("IPv4 version/IHL is not 0x45")
    if frame[23] != 17:
        raise ValueError("IP protocol is not UDP")
    if _ip_checksum(frame[14:34]) != 0:
        raise ValueError("bad IPv4 header checksum")
    if struct.unpack("!H", frame[36:38])[0] != ROCE_UDP_PORT:
        raise ValueError("UDP destination port is not 4791")
    if struct.unpack("!H", frame[16:18])[0] != n - 14:
        raise ValueError("IPv4 total length does not match the frame")
    if struct.unpack("!H", frame[38:40])[0] != n - 34:
        raise ValueError("UDP length does not match the frame")
    opcode = frame[42]
    try:
        op = BthOpcode(opcode)
    except ValueError:
        raise ValueError(f"unknown BTH opcode {opcode:#x}") from None
    if frame[43] & 0xF:
        raise ValueError("BTH transport version is not 0")
    pad = (frame[43] >> 4) & 3
    hlen = header_bytes(op)
    if n < hlen + 4:
        raise ValueError("frame too short for the opcode's headers")
    if n - hlen - 4 < pad:
        raise ValueError("pad count larger than the payload")
    paylen = n - hlen - 4 - pad
    if op in NO_PAYLOAD_OPCODES and (paylen or pad):
        raise ValueError(f"payload or pad on {op.name}")
    meta = dict.fromkeys(META_FIELDS, 0)
    meta.update(
        opcode=opcode, dst_node=(frame[33] - 1) & 0xFF, src_node=(frame[29] - 1) & 0xFF,
        se=frame[43] >> 7, ackreq=frame[50] >> 7,
        dest_qpn=int.from_bytes(frame[47:50], "big"),
        psn=int.from_bytes(frame[51:54], "big"),
        udp_sport=int.from_bytes(frame[34:36], "big"), paylen=paylen)
    off = 54
    for h in formats.headers_of(op):
        if h == "reth":
            meta["va"], meta["rkey"], meta["dma_len"] = struct.unpack("!QII", frame[off:off + 16])
        elif h == "atomiceth":
            (meta["va"], meta["rkey"], meta["swap_add"],
             meta["compare"]) = struct.unpack("!QIQQ", frame[off:off + 28])
        elif h == "aeth":
            meta["syndrome"] = frame[off]
            meta["msn"] = int.from_bytes(frame[off + 1:off + 4], "big")
        elif h == "atomicacketh":
            meta["orig"], = struct.unpack("!Q", frame[off:off + 8])
        elif h == "immdt":
            meta["imm"], = struct.unpack("!I", frame[off:off + 4])
        off += formats.HEADER_BYTES[h]
    return meta, frame[hlen:hlen + paylen], icrc_ok


def normalize(meta, payload=b""):
    """The meta dict as decode returns it: every field, absent headers 0, paylen set."""
    op = BthOpcode(int(meta.get("opcode", 0)))
    present = {"opcode", "src_node", "dst_node", "se", "ackreq", "dest_qpn", "psn", "udp_sport"}
    for h in formats.headers_of(op):
        present |= {"reth": {"va", "rkey", "dma_len"},
                    "atomiceth": {"va", "rkey", "swap_add", "compare"},
                    "aeth": {"syndrome", "msn"}, "atomicacketh": {"orig"},
                    "immdt": {"imm"}}[h]
    out = {name: (int(meta.get(name, 0)) if name in present else 0) for name in META_FIELDS}
    out["paylen"] = len(payload)
    return out
