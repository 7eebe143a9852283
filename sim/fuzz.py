"""Seeded generator of random and mutated RoCEv2 frames for fuzzing an RNIC's receive path.

:class:`FuzzGenerator` produces :class:`FuzzFrame` objects: the frame bytes, the class and
detail of the mutation that made them, and the outcome the depacketizer must reach
(``"ok"``: parsed and passed on, ``"icrc"``: dropped for a bad ICRC, ``"malformed"``: dropped
as malformed). The expected outcome is never guessed from the mutation: it is computed by
:func:`sim.roce.classify`, the Python reference of ``hw/net/depacketizer.py`` (same check order:
structural errors, then the ICRC, then header errors; InfiniBand Architecture Specification
vol. 1 rel. 1.4, 9.6 packet header validation and Annex A17 RoCEv2), with the depacketizer's
``max_frame_bytes`` (``mtu + 128`` in ``hw/rnic/node.py``). Frames that must pass the ICRC check
carry a correct ICRC (``sim.roce.encode`` / :func:`fix_icrc`).

For frames that pass the depacketizer the generator also says what the receive demultiplexer
(``hw/rnic/dispatch.py``) does with them: ``demux_drop`` (addressed to another node, or a QPN the
NIC does not have: dropped and counted), or which engine gets them (``"responder"`` for
requests, ``"requester"`` for responses).

Classes (:data:`CLASSES`):

``random``      fully random bytes, 1 byte to beyond the largest frame;
``random_bth``  a valid Ethernet/IPv4/UDP header followed by random bytes, ICRC recomputed;
``valid``       a valid request (every request opcode, READ and atomics included) with random
                fields: RETH / AtomicETH inside a registered region or not, payload lengths the
                opcode allows; per QP, PSNs and multi-packet messages (FIRST, MIDDLE, LAST)
                follow each other like a real requester's;
``response``    a valid response (READ_RESPONSE_*, ACKNOWLEDGE, ATOMIC_ACKNOWLEDGE);
``qpn``         a valid request to an unknown, inactive or random QPN;
``psn``         a valid request with a PSN far ahead, just behind, just ahead or random;
``opcode``      an unknown opcode byte, a response opcode, or another request opcode written
                over a request's BTH (headers no longer match), ICRC recomputed;
``reth``        bad RETH / AtomicETH: unknown rkey, va outside / straddling the region,
                unaligned atomic va, dma_len > 2**31 or not matching the payload;
``length``      payload length the opcode does not allow: > MTU, FIRST/MIDDLE != MTU, payload
                on READ / atomics;
``trunc``       a frame cut at a random point: as is, with the ICRC recomputed, or with the
                IPv4/UDP lengths, IPv4 checksum and ICRC all fixed;
``icrc``        one bit flipped in the ICRC-covered bytes or in the ICRC (always an ICRC drop),
                or in a field the ICRC masks (TOS, TTL, checksums, FECN/BECN);
``ipcsum``      wrong IPv4 header checksum;
``udpport``     UDP destination port other than 4791 (ICRC recomputed);
``ethertype``   ethertype other than IPv4;
``header``      IPv4 version/IHL, protocol, total length, UDP length, BTH TVer or pad count
                wrong (checksum and ICRC recomputed);
``oversize``    a well-formed frame longer than ``max_frame_bytes``;
``node``        a valid request addressed to another node (the demultiplexer drops it).

Pure Python: no cocotb import. The QPNs in ``avoid_qpns`` (e.g. a QP pair whose traffic must
not be disturbed) never receive a frame that would pass the depacketizer addressed to this node.
"""

import dataclasses
import random
import struct

from hw import formats
from hw.formats import BthOpcode as Op
from . import roce

__all__ = ["FuzzFrame", "FuzzGenerator", "CLASSES", "REQUEST_OPCODES", "RESPONSE_OPCODES",
           "fix_icrc", "fix_ip_checksum", "fix_lengths", "expected_outcome"]

REQUEST_OPCODES = (
    Op.SEND_FIRST, Op.SEND_MIDDLE, Op.SEND_LAST, Op.SEND_LAST_IMM, Op.SEND_ONLY,
    Op.SEND_ONLY_IMM, Op.WRITE_FIRST, Op.WRITE_MIDDLE, Op.WRITE_LAST, Op.WRITE_LAST_IMM,
    Op.WRITE_ONLY, Op.WRITE_ONLY_IMM, Op.READ_REQUEST, Op.COMPARE_SWAP, Op.FETCH_ADD,
)
RESPONSE_OPCODES = (
    Op.READ_RESPONSE_FIRST, Op.READ_RESPONSE_MIDDLE, Op.READ_RESPONSE_LAST,
    Op.READ_RESPONSE_ONLY, Op.ACKNOWLEDGE, Op.ATOMIC_ACKNOWLEDGE,
)
_FULL = (Op.SEND_FIRST, Op.SEND_MIDDLE, Op.WRITE_FIRST, Op.WRITE_MIDDLE)
_ATOMIC = (Op.COMPARE_SWAP, Op.FETCH_ADD)

#: Class name -> default weight.
CLASSES = {
    "random": 4, "random_bth": 4, "valid": 16, "response": 5, "qpn": 6, "psn": 8,
    "opcode": 6, "reth": 9, "length": 7, "trunc": 9, "icrc": 8, "ipcsum": 3, "udpport": 3,
    "ethertype": 3, "header": 6, "oversize": 3, "node": 3,
}

# Bytes of the frame that the ICRC masks (sim/roce.py icrc()): TOS, TTL, IPv4 checksum,
# UDP checksum, BTH byte 4 (FECN, BECN, resv6).
_ICRC_MASKED = frozenset({15, 22, 24, 25, 40, 41, 46})


def fix_ip_checksum(frame):
    """``frame`` with its IPv4 header checksum recomputed."""
    f = bytearray(frame)
    if len(f) < 34:
        return bytes(f)
    f[24:26] = b"\0\0"
    f[24:26] = struct.pack("!H", roce._ip_checksum(bytes(f[14:34])))
    return bytes(f)


def fix_icrc(frame):
    """``frame`` with its last four bytes replaced by the ICRC of the rest."""
    f = bytes(frame)
    if len(f) < 14 + 20 + 8 + 12 + 4:     # too short for any RoCEv2 frame: left as is
        return f
    return f[:-4] + roce.icrc(f).to_bytes(4, "little")


def fix_lengths(frame):
    """``frame`` with IPv4 total length, UDP length, IPv4 checksum and ICRC made consistent."""
    f = bytearray(frame)
    if len(f) < 42:
        return bytes(f)
    f[16:18] = struct.pack("!H", (len(f) - 14) & 0xFFFF)
    f[38:40] = struct.pack("!H", (len(f) - 34) & 0xFFFF)
    return fix_icrc(fix_ip_checksum(bytes(f)))


def expected_outcome(frame, max_frame_bytes):
    """``"ok"``, ``"icrc"`` or ``"malformed"``: what the depacketizer does (sim.roce.classify)."""
    return roce.classify(frame, max_frame_bytes)


@dataclasses.dataclass(frozen=True)
class FuzzFrame:
    """One fuzz frame and what must happen to it."""
    index: int                 # position in the generator's sequence
    frame: bytes
    cls: str                   # a key of CLASSES
    detail: str                # the mutation
    expect: str                # depacketizer outcome: "ok", "icrc" or "malformed"
    meta: dict = None          # decoded header fields when expect == "ok"
    demux_drop: bool = False   # passes the depacketizer, dropped by the demultiplexer
    engine: str = None         # "responder" / "requester" when it reaches one, else None

    def reproducer(self):
        """A one-line Python literal of the frame for bug reports."""
        return f"# frame {self.index} class {self.cls} ({self.detail}) expect {self.expect}\n" \
               f"bytes.fromhex({self.frame.hex()!r})"


class FuzzGenerator:
    """Seeded source of fuzz frames aimed at node ``dst_node``.

    seed         any int: the same seed and parameters give the same frames.
    dst_node     node the frames are addressed to (the receiving NIC's NODE_ID).
    src_node     node they claim to come from.
    qpns         QPNs of the receiver that fuzz frames aim at (QPs set up for it).
    n_qps        number of QPs of the receiver (QPN >= n_qps is unknown to it).
    mtu          path MTU of the receiver (bytes).
    rkeys        keys of registered regions the frames may use (valid keys); other keys are
                 made by flipping bits of these.
    va_ranges    ``(base, length)`` of each region of ``rkeys`` (same order).
    psn_hint     first expected PSN of each QP in ``qpns``: an int for all, or a dict.
    avoid_qpns   QPNs that must never receive a frame that passes the depacketizer.
    region_weights  relative weights of the regions of ``rkeys`` when a frame picks one.
    max_frame_bytes  the depacketizer's largest frame (default ``mtu + 128``).
    weights      dict class -> weight, replacing :data:`CLASSES` entries.
    """

    def __init__(self, seed, *, dst_node, src_node, qpns, n_qps, mtu, rkeys=(), va_ranges=(),
                 psn_hint=0, avoid_qpns=(), max_frame_bytes=None, weights=None,
                 region_weights=None):
        if not qpns:
            raise ValueError("qpns must name at least one QP to aim at")
        if len(rkeys) != len(va_ranges):
            raise ValueError(f"rkeys and va_ranges must have the same length, not "
                             f"{len(rkeys)} and {len(va_ranges)}")
        if mtu not in (256, 512, 1024, 2048, 4096):
            raise ValueError(f"mtu must be one of 256, 512, 1024, 2048, 4096, not {mtu!r}")
        self.rng = random.Random(seed)
        self.seed = seed
        self.dst_node = dst_node
        self.src_node = src_node
        self.qpns = list(qpns)
        self.n_qps = n_qps
        self.mtu = mtu
        self.rkeys = list(rkeys)
        self.va_ranges = list(va_ranges)
        self.avoid = frozenset(avoid_qpns)
        if set(self.qpns) & self.avoid:
            raise ValueError(f"qpns and avoid_qpns overlap: {sorted(set(self.qpns) & self.avoid)}")
        self.max_frame = mtu + 128 if max_frame_bytes is None else max_frame_bytes
        self.weights = dict(CLASSES)
        for k, v in (weights or {}).items():
            if k not in CLASSES:
                raise ValueError(f"weights: unknown class {k!r}; classes are {sorted(CLASSES)}")
            self.weights[k] = v
        self._names = [k for k, v in self.weights.items() if v > 0]
        self._w = [self.weights[k] for k in self._names]
        if region_weights is not None and len(region_weights) != len(self.rkeys):
            raise ValueError(f"region_weights must have one weight per rkey, not "
                             f"{len(region_weights)} for {len(self.rkeys)}")
        self.region_weights = list(region_weights or [1] * len(self.rkeys))
        self.next_psn = {}
        self.msg = {}              # qpn -> ("send" | "write", bytes left) of a message in progress
        self.set_psn(psn_hint)
        self.count = 0

    # -- state ------------------------------------------------------------------------

    def set_psn(self, psn, qpn=None):
        """Set the PSN the next in-sequence request of ``qpn`` (default: every QP) carries
        and forget its message in progress (the QP was reset)."""
        if isinstance(psn, dict):
            for q, p in psn.items():
                self.next_psn[q] = p & 0xFFFFFF
                self.msg.pop(q, None)
            for q in self.qpns:
                self.next_psn.setdefault(q, 0)
            return
        for q in (self.qpns if qpn is None else [qpn]):
            self.next_psn[q] = psn & 0xFFFFFF
            self.msg.pop(q, None)

    # -- public -----------------------------------------------------------------------

    def frames(self, n):
        """The next ``n`` frames."""
        return [self.frame() for _ in range(n)]

    def frame(self, cls=None):
        """The next frame (of class ``cls``, default a random class by weight)."""
        rng = self.rng
        c = cls if cls is not None else rng.choices(self._names, self._w)[0]
        if c not in CLASSES:
            raise ValueError(f"cls must be one of {sorted(CLASSES)}, not {c!r}")
        for _ in range(100):
            frame, detail = getattr(self, "_c_" + c)()
            ff = self._judge(frame, c, detail)
            if ff is not None:
                self.count += 1
                return ff
        raise RuntimeError(f"class {c}: no acceptable frame in 100 tries")

    # -- helpers ----------------------------------------------------------------------

    def _judge(self, frame, cls, detail):
        frame = bytes(frame)
        expect = roce.classify(frame, self.max_frame)
        meta, demux_drop, engine = None, False, None
        if expect == "ok":
            meta, _, _ = roce.decode(frame, self.max_frame)
            demux_drop = meta["dst_node"] != self.dst_node or meta["dest_qpn"] >= self.n_qps
            if not demux_drop:
                if meta["dest_qpn"] in self.avoid:
                    return None
                engine = "requester" if Op(meta["opcode"]) in RESPONSE_OPCODES else "responder"
        return FuzzFrame(self.count, frame, cls, detail, expect, meta, demux_drop, engine)

    def _qpn(self):
        return self.rng.choice(self.qpns)

    def _region(self):
        """(rkey, base, length) of a registered region, or a made-up one."""
        rng = self.rng
        if self.rkeys and rng.random() < 0.85:
            i = rng.choices(range(len(self.rkeys)), self.region_weights)[0]
            return self.rkeys[i], self.va_ranges[i][0], self.va_ranges[i][1]
        return rng.getrandbits(32), rng.getrandbits(48), rng.randrange(1, 1 << 16)

    def _base_meta(self, op, qpn=None, advance=False):
        rng = self.rng
        qpn = self._qpn() if qpn is None else qpn
        psn = self.next_psn.get(qpn, rng.getrandbits(24))
        meta = {
            "opcode": op.value, "src_node": self.src_node, "dst_node": self.dst_node,
            "se": rng.random() < 0.1, "ackreq": rng.random() < 0.8, "dest_qpn": qpn,
            "psn": psn, "udp_sport": rng.getrandbits(16),
        }
        if advance and qpn in self.next_psn:
            self.next_psn[qpn] = (psn + 1) & 0xFFFFFF
        return meta

    def _reth(self, meta, op, length_wanted):
        """Fill RETH / AtomicETH fields: a region, an address inside it when it fits."""
        rng = self.rng
        key, base, length = self._region()
        meta["rkey"] = key & 0xFFFFFFFF
        if op in _ATOMIC:
            off = rng.randrange(0, max(1, length - 7)) & ~7
            meta["va"] = (base + off) & (2**64 - 1)
            meta["swap_add"] = rng.getrandbits(64)
            meta["compare"] = rng.getrandbits(64)
        else:
            off = rng.randrange(0, max(1, length - length_wanted + 1))
            meta["va"] = (base + off) & (2**64 - 1)
            meta["dma_len"] = length_wanted

    def _request(self, op=None, qpn=None, advance=False):
        """(meta, payload) of a request whose fields follow the rules of its opcode.

        With ``advance`` the frame continues the QP's request stream like a real requester's:
        the PSN is the next one, a multi-packet message in progress goes on (MIDDLE, LAST)
        and a READ takes as many PSNs as it has response packets. Without it (the mutation
        classes) the PSN is the next one but the stream does not move on.
        """
        rng = self.rng
        mtu = self.mtu
        qpn = self._qpn() if qpn is None else qpn
        msg = self.msg.get(qpn) if advance else None
        if op is None:
            if msg is not None:
                kind, left = msg
                if left > mtu:
                    op = Op.SEND_MIDDLE if kind == "send" else Op.WRITE_MIDDLE
                else:
                    op = rng.choice([Op.SEND_LAST, Op.SEND_LAST_IMM] if kind == "send"
                                    else [Op.WRITE_LAST, Op.WRITE_LAST_IMM])
            elif advance:
                op = rng.choice([Op.SEND_FIRST, Op.SEND_ONLY, Op.SEND_ONLY_IMM, Op.WRITE_FIRST,
                                 Op.WRITE_ONLY, Op.WRITE_ONLY_IMM, Op.READ_REQUEST,
                                 Op.COMPARE_SWAP, Op.FETCH_ADD, Op.WRITE_ONLY, Op.SEND_ONLY])
            else:
                op = rng.choice(REQUEST_OPCODES)
        meta = self._base_meta(op, qpn, advance=advance)
        if op in _FULL:
            paylen = mtu
        elif op == Op.READ_REQUEST or op in _ATOMIC:
            paylen = 0
        elif msg is not None:
            paylen = msg[1]                       # the rest of the message
        else:
            paylen = rng.choice([0, 1, rng.randrange(1, mtu + 1), mtu, rng.randrange(1, 64)])
        if op == Op.WRITE_FIRST:
            total = rng.choice([mtu + 1, 2 * mtu, rng.randrange(mtu + 1, 4 * mtu + 1)])
            self._reth(meta, op, total)
        elif op in (Op.WRITE_ONLY, Op.WRITE_ONLY_IMM):
            self._reth(meta, op, paylen)
        elif op == Op.READ_REQUEST:
            self._reth(meta, op, rng.choice([0, 8, rng.randrange(1, 4 * mtu + 1)]))
            if advance and qpn in self.next_psn:
                n_resp = max(1, -(-meta["dma_len"] // mtu))
                self.next_psn[qpn] = (meta["psn"] + n_resp) & 0xFFFFFF
        elif op in _ATOMIC:
            self._reth(meta, op, 8)
        if "immdt" in formats.headers_of(op):
            meta["imm"] = rng.getrandbits(32)
        if advance:
            if op == Op.WRITE_FIRST:
                self.msg[qpn] = ("write", meta["dma_len"] - mtu)
            elif op == Op.SEND_FIRST:
                self.msg[qpn] = ("send", rng.randrange(1, 2 * mtu + 1))
            elif op in (Op.SEND_MIDDLE, Op.WRITE_MIDDLE):
                self.msg[qpn] = (msg[0], msg[1] - mtu)
            else:
                self.msg.pop(qpn, None)
        return meta, rng.randbytes(paylen)

    def _encode(self, meta, payload):
        return roce.encode({k: int(v) for k, v in meta.items()}, payload)

    # -- classes ----------------------------------------------------------------------

    def _c_random(self):
        rng = self.rng
        n = rng.choice([rng.randrange(1, 58), rng.randrange(58, self.max_frame + 64),
                        rng.randrange(1, 16)])
        return rng.randbytes(n), f"{n} random bytes"

    def _c_random_bth(self):
        rng = self.rng
        meta, payload = self._request()
        frame = bytearray(self._encode(meta, payload))
        n = rng.randrange(58, min(len(frame) + 64, self.max_frame) + 1)
        frame = frame[:42] + rng.randbytes(n - 42)
        if rng.random() < 0.5:                    # a known opcode and TVer 0 more often
            frame[42] = rng.randrange(0, 0x15)
            frame[43] &= 0xF0
        if rng.random() < 0.5:
            frame[47] = 0                         # a QPN that is local more often
            frame[48] = 0
        return fix_lengths(bytes(frame)), f"random BTH and rest, {n} bytes"

    def _c_valid(self):
        meta, payload = self._request(advance=True)
        return self._encode(meta, payload), f"valid {Op(meta['opcode']).name}"

    def _c_response(self):
        rng = self.rng
        op = rng.choice(RESPONSE_OPCODES)
        meta = self._base_meta(op, advance=False)
        meta["psn"] = rng.choice([meta["psn"], rng.getrandbits(24)])
        if op in (Op.ACKNOWLEDGE, Op.ATOMIC_ACKNOWLEDGE, Op.READ_RESPONSE_FIRST,
                  Op.READ_RESPONSE_LAST, Op.READ_RESPONSE_ONLY):
            meta["syndrome"] = rng.choice([0x1F, 0x20 | rng.randrange(32), 0x60, 0x61, 0x62,
                                           0x63, 0x64, rng.getrandbits(8)])
            meta["msn"] = rng.getrandbits(24)
        if op == Op.ATOMIC_ACKNOWLEDGE:
            meta["orig"] = rng.getrandbits(64)
        if op in (Op.READ_RESPONSE_FIRST, Op.READ_RESPONSE_MIDDLE):
            n = self.mtu
        elif op in (Op.READ_RESPONSE_LAST, Op.READ_RESPONSE_ONLY):
            n = rng.randrange(0, self.mtu + 1)
        else:
            n = 0
        return self._encode(meta, rng.randbytes(n)), f"response {op.name}"

    def _c_qpn(self):
        rng = self.rng
        meta, payload = self._request()
        choices = [rng.randrange(self.n_qps, 1 << 24), rng.randrange(self.n_qps, 2 * self.n_qps),
                   rng.randrange(0, self.n_qps), rng.getrandbits(24)]
        meta["dest_qpn"] = rng.choice(choices)
        return self._encode(meta, payload), f"QPN {meta['dest_qpn']:#x}"

    def _c_psn(self):
        rng = self.rng
        meta, payload = self._request()
        p = meta["psn"]
        kind, psn = rng.choice([
            ("far ahead", p + rng.randrange(1 << 20, 1 << 23)),
            ("just behind", p - rng.randrange(1, 4)),
            ("far behind", p - rng.randrange(1 << 20, 1 << 23)),
            ("just ahead", p + rng.randrange(1, 4)),
            ("random", rng.getrandbits(24)),
        ])
        meta["psn"] = psn & 0xFFFFFF
        return self._encode(meta, payload), f"PSN {kind}"

    def _c_opcode(self):
        rng = self.rng
        meta, payload = self._request()
        frame = bytearray(self._encode(meta, payload))
        kind = rng.choice(["unknown", "response", "other request", "random byte"])
        if kind == "unknown":
            frame[42] = rng.randrange(0x15, 0x100)
        elif kind == "response":
            frame[42] = rng.choice(RESPONSE_OPCODES).value
        elif kind == "other request":
            frame[42] = rng.choice(REQUEST_OPCODES).value
        else:
            frame[42] = rng.getrandbits(8)
        return fix_icrc(bytes(frame)), f"opcode {kind} {frame[42]:#x} over {Op(meta['opcode']).name}"

    def _c_reth(self):
        rng = self.rng
        op = rng.choice([Op.WRITE_FIRST, Op.WRITE_ONLY, Op.WRITE_ONLY_IMM, Op.READ_REQUEST,
                         Op.COMPARE_SWAP, Op.FETCH_ADD])
        meta, payload = self._request(op)
        key, base, length = self._region()
        kind = rng.choice(["rkey", "va before", "va beyond", "straddle", "random va",
                           "huge dma_len", "dma_len mismatch", "unaligned"])
        if kind == "rkey":
            meta["rkey"] = rng.choice([meta.get("rkey", 0) ^ (1 << rng.randrange(32)),
                                       rng.getrandbits(32), 0])
        elif kind == "va before":
            meta["va"] = (base - rng.randrange(1, 64)) & (2**64 - 1)
        elif kind == "va beyond":
            meta["va"] = (base + length + rng.randrange(0, 64)) & (2**64 - 1)
        elif kind == "straddle":
            n = meta.get("dma_len") or 8
            meta["va"] = (base + length - max(1, n // 2)) & (2**64 - 1)
        elif kind == "random va":
            meta["va"] = rng.getrandbits(64)
        elif kind == "huge dma_len":
            if op not in _ATOMIC:
                meta["dma_len"] = rng.choice([1 << 31, (1 << 31) + 1, 0xFFFFFFFF,
                                              rng.randrange(1 << 31, 1 << 32)])
            else:
                meta["va"] = (2**64 - 8)
        elif kind == "dma_len mismatch":
            if op not in _ATOMIC:
                meta["dma_len"] = rng.choice([0, 1, self.mtu, self.mtu * 2 + 3,
                                              (meta.get("dma_len", 0) + 1) & 0xFFFFFFFF])
        else:  # unaligned
            meta["va"] = (meta.get("va", base) | rng.randrange(1, 8)) & (2**64 - 1)
        return self._encode(meta, payload), f"{op.name} bad {kind}"

    def _c_length(self):
        rng = self.rng
        op = rng.choice(REQUEST_OPCODES)
        meta, _ = self._request(op)
        mtu = self.mtu
        if op in (Op.READ_REQUEST,) + _ATOMIC:
            n, kind = rng.choice([1, 4, 8, rng.randrange(1, mtu + 1)]), "payload on no-payload op"
        elif op in _FULL:
            n, kind = rng.choice([0, 1, mtu - 1, mtu - 4, mtu + 1, rng.randrange(0, mtu)]), \
                "FIRST/MIDDLE not MTU"
        else:
            n, kind = rng.randrange(mtu + 1, self.max_frame - 40), "longer than MTU"
        if op in (Op.WRITE_ONLY, Op.WRITE_ONLY_IMM) and rng.random() < 0.5:
            meta["dma_len"] = n
        return self._encode(meta, rng.randbytes(n)), f"{op.name} {kind} ({n} bytes)"

    def _any_valid(self):
        if self.rng.random() < 0.2:
            return bytes(self._c_response()[0])
        meta, payload = self._request()
        return self._encode(meta, payload)

    def _c_trunc(self):
        rng = self.rng
        frame = self._any_valid()
        cut = rng.choice([rng.randrange(1, len(frame)), len(frame) - rng.randrange(1, 9),
                          rng.randrange(50, 80)])
        cut = max(1, min(cut, len(frame) - 1))
        f = frame[:cut]
        kind = rng.choice(["as is", "ICRC recomputed", "lengths and ICRC fixed"])
        if kind == "ICRC recomputed":
            f = fix_icrc(f)
        elif kind == "lengths and ICRC fixed":
            f = fix_lengths(f)
        return f, f"cut {len(frame)} -> {cut}, {kind}"

    def _c_icrc(self):
        rng = self.rng
        f = bytearray(self._any_valid())
        kind = rng.choice(["covered", "covered", "icrc field", "masked"])
        if kind == "covered":
            pos = rng.choice([i for i in range(14, len(f) - 4) if i not in _ICRC_MASKED])
        elif kind == "icrc field":
            pos = len(f) - 1 - rng.randrange(4)
        else:
            pos = rng.choice(sorted(_ICRC_MASKED))
        bit = rng.randrange(8)
        f[pos] ^= 1 << bit
        return bytes(f), f"bit {bit} of byte {pos} flipped ({kind})"

    def _c_ipcsum(self):
        rng = self.rng
        f = bytearray(self._any_valid())
        f[24:26] = struct.pack("!H", struct.unpack("!H", f[24:26])[0] ^ rng.randrange(1, 1 << 16))
        return bytes(f), "IPv4 checksum"

    def _c_udpport(self):
        rng = self.rng
        f = bytearray(self._any_valid())
        port = rng.choice([p for p in (4790, 4792, 0, 0xFFFF, rng.getrandbits(16)) if p != 4791])
        f[36:38] = struct.pack("!H", port)
        return fix_icrc(bytes(f)), f"UDP port {port}"

    def _c_ethertype(self):
        rng = self.rng
        f = bytearray(self._any_valid())
        et = rng.choice([t for t in (0x86DD, 0x8915, 0x0806, 0x0000, rng.getrandbits(16))
                         if t != 0x0800])
        f[12:14] = struct.pack("!H", et)
        return bytes(f), f"ethertype {et:#06x}"

    def _c_header(self):
        rng = self.rng
        f = bytearray(self._any_valid())
        kind = rng.choice(["version/IHL", "protocol", "IP length", "UDP length", "TVer", "pad"])
        if kind == "version/IHL":
            f[14] = rng.choice([0x46, 0x65, 0x44, 0x4F, rng.getrandbits(8)])
            if f[14] == 0x45:
                f[14] = 0x55
        elif kind == "protocol":
            f[23] = rng.choice([6, 1, 0, 255, 16, 18])
        elif kind == "IP length":
            v = struct.unpack("!H", f[16:18])[0]
            f[16:18] = struct.pack("!H", (v + rng.choice([-1, 1, 4, -4, 0x1000])) & 0xFFFF)
        elif kind == "UDP length":
            v = struct.unpack("!H", f[38:40])[0]
            f[38:40] = struct.pack("!H", (v + rng.choice([-1, 1, 4, -4, 0x1000])) & 0xFFFF)
        elif kind == "TVer":
            f[43] = (f[43] & 0xF0) | rng.randrange(1, 16)
        else:
            pad = (f[43] >> 4) & 3
            f[43] = (f[43] & 0xCF) | (rng.choice([p for p in range(4) if p != pad]) << 4)
        return fix_icrc(fix_ip_checksum(bytes(f))), f"header {kind}"

    def _c_oversize(self):
        rng = self.rng
        op = rng.choice([Op.SEND_ONLY, Op.WRITE_ONLY, Op.SEND_LAST, Op.READ_RESPONSE_ONLY])
        meta = self._base_meta(op, advance=False)
        hdr = formats.header_bytes(op) + 4
        n = rng.randrange(self.max_frame - hdr + 1, self.max_frame - hdr + 600)
        if op == Op.WRITE_ONLY:
            key, base, _ = self._region()
            meta.update(rkey=key & 0xFFFFFFFF, va=base, dma_len=n)
        return self._encode(meta, rng.randbytes(n)), f"{op.name} frame of {hdr + n} bytes"

    def _c_node(self):
        rng = self.rng
        meta, payload = self._request()
        meta["dst_node"] = rng.choice([n for n in (0, 2, 255, rng.getrandbits(8))
                                       if n != self.dst_node])
        return self._encode(meta, payload), f"dst_node {meta['dst_node']}"
