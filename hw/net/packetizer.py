"""RoCEv2 packetizer: header fields + payload stream in, complete Ethernet frame out.

Models the transmit framing of a RoCEv2 RNIC (InfiniBand Architecture Specification
vol. 1 rel. 1.4: chapter 9.2 BTH, 9.3 extended transport headers RETH/AtomicETH/AETH/
AtomicAckETH/ImmDt, in the order of ``formats.headers_of``; Annex A17.4 RoCEv2 encapsulation in UDP/IPv4, destination
port 4791; Annex A17.3.3 invariant CRC). The frame is: Ethernet (02:00:00:00:00:<node>,
type 0x0800), IPv4 (0x45, TOS 0, total length, id 0, DF, TTL 64, UDP, header checksum,
192.0.2.<node+1>), UDP (source port from the meta, 4791, length, checksum 0), BTH (pad
count = (-paylen) & 3, P_Key 0xFFFF, M = 0, TVer 0), the extension headers, the payload,
pad zero bytes and the ICRC, byte for byte what ``sim.roce.encode`` produces.

Two stages:

* *body*: the header bytes are built combinationally from the registered meta (IP header
  checksum included); full header beats go out first, then a junction beat with the last
  ``H mod W`` header bytes and the first payload bytes, then the payload shifted by
  ``H mod W`` bytes (a mux over the few possible header lengths), then pad zeros.
  One beat per cycle; the next packet's meta is taken in the cycle of a packet's last
  beat, so frames follow each other without an idle cycle (before 2026-12-07, one idle
  cycle per packet: a READ request, two beats, took three cycles).
* *ICRC*: a one-beat holding register; the CRC register is updated when a beat enters it
  (ICRC masks applied by beat position), so when the last body beat leaves, the CRC is
  final and is inserted after its last byte (spilling into one extra beat if needed).

The ICRC pseudo-header (8 bytes of 0xFF replacing the Ethernet header) is obtained by
starting the CRC register at the value that 6 zero bytes take to 0xFFFFFFFF and by
replacing frame bytes 0-5 with zeros and 6-13 with 0xFF.
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import bits_for

from .. import formats
from .crc import Crc32Update, check_data_bytes, solve_state
from ..formats import BthOpcode, PKT_META
from ..interfaces import BeatStream, PacketOut

__all__ = ["Packetizer", "ICRC_INIT", "icrc_mask", "MAX_HEADER_BYTES", "header_groups"]

#: CRC register value that, after 6 zero bytes, is the standard 0xFFFFFFFF.
ICRC_INIT = solve_state(bytes(6), 0xFFFFFFFF)

#: Frame byte offsets replaced by 0xFF in the ICRC computation (after bytes 0-13:
#: TOS, TTL, IP checksum, UDP checksum, BTH byte 4).
_ICRC_ONES = (15, 22, 24, 25, 40, 41, 46)
_ICRC_MASKED_END = 47

MAX_HEADER_BYTES = max(formats.header_bytes(op) for op in BthOpcode)


def icrc_mask(beat, w):
    """``(and_mask, or_mask)`` integers applied to frame beat ``beat`` before the CRC."""
    and_m = (1 << (8 * w)) - 1
    or_m = 0
    for i in range(w):
        p = beat * w + i
        if p < 6:
            and_m &= ~(0xFF << (8 * i))
        elif p < 14 or p in _ICRC_ONES:
            or_m |= 0xFF << (8 * i)
    return and_m, or_m


def header_groups():
    """``{extension-header tuple: [opcodes]}``."""
    groups = {}
    for op in BthOpcode:
        groups.setdefault(formats.headers_of(op), []).append(op)
    return groups


def be(value, nbytes):
    """Big-endian byte order: byte 0 of the result is the most significant byte."""
    return Cat(*[value[8 * (nbytes - 1 - i):8 * (nbytes - i)] for i in range(nbytes)])


def shift_mux(m, name, value, amount, choices, width, left):
    """``value`` shifted by ``amount`` bytes (one of ``choices``), truncated to ``width`` bits."""
    out = Signal(width, name=name)
    with m.Switch(amount):
        for c in choices:
            with m.Case(c):
                if left:
                    m.d.comb += out.eq((value << (8 * c))[:width])
                else:
                    m.d.comb += out.eq((value >> (8 * c))[:width])
    return out


def byte_keep(nbytes, w):
    """Mask with the low ``nbytes`` bytes set (``nbytes`` a Value in 0..w)."""
    return Cat(*[Mux(nbytes > i, 0xFF, 0x00) for i in range(w)])


class IcrcAppend(wiring.Component):
    """Appends the ICRC to a frame body stream (all bytes through the pad)."""

    def __init__(self, data_bytes):
        check_data_bytes(data_bytes)
        self._w = data_bytes
        super().__init__({"i": In(BeatStream(data_bytes)), "o": Out(BeatStream(data_bytes))})

    def elaborate(self, platform):
        m = Module()
        w = self._w
        m.submodules.crc = crc = Crc32Update(w)
        nmask = -(-_ICRC_MASKED_END // w)

        h_data = Signal(8 * w)
        h_n = Signal(bits_for(w))
        h_last = Signal()
        h_valid = Signal()
        extra = Signal()
        x_data = Signal(32)
        x_n = Signal(3)
        state = Signal(32, init=ICRC_INIT)
        bidx = Signal(range(nmask + 1))

        icrc = Signal(32)
        m.d.comb += icrc.eq(~state)
        total = Signal(range(w + 5))
        m.d.comb += total.eq(h_n + 4)
        spill = total > w
        ins = Signal(8 * w + 32)
        m.d.comb += ins.eq((h_data & byte_keep(h_n, w)) | (icrc << (h_n * 8)))

        with m.If(extra):
            m.d.comb += [
                self.o.valid.eq(1), self.o.p.data.eq(x_data),
                self.o.p.nbytes.eq(x_n), self.o.p.last.eq(1),
            ]
            with m.If(self.o.ready):
                m.d.sync += extra.eq(0)
        with m.Elif(h_valid):
            m.d.comb += self.o.valid.eq(1)
            with m.If(h_last):
                m.d.comb += [
                    self.o.p.data.eq(ins[:8 * w]),
                    self.o.p.nbytes.eq(Mux(spill, w, total)),
                    self.o.p.last.eq(~spill),
                ]
                with m.If(self.o.ready & spill):
                    m.d.sync += [extra.eq(1), x_data.eq(ins[8 * w:]), x_n.eq(total - w)]
            with m.Else():
                m.d.comb += [
                    self.o.p.data.eq(h_data), self.o.p.nbytes.eq(h_n), self.o.p.last.eq(0),
                ]
            with m.If(self.o.ready):
                m.d.sync += h_valid.eq(0)

        m.d.comb += self.i.ready.eq(~h_valid | (self.o.ready & ~extra))

        # a new frame starts after a last beat: CRC from ICRC_INIT, masks from beat 0
        first = Signal(init=1)
        bsel = Mux(first, 0, bidx)
        masked = Signal(8 * w)
        m.d.comb += masked.eq(self.i.p.data)
        with m.Switch(bsel):
            for b in range(nmask):
                and_m, or_m = icrc_mask(b, w)
                with m.Case(b):
                    m.d.comb += masked.eq((self.i.p.data & and_m) | or_m)
        m.d.comb += [
            crc.state_in.eq(Mux(first, ICRC_INIT, state)), crc.data.eq(masked),
            crc.nbytes.eq(self.i.p.nbytes),
        ]
        with m.If(self.i.valid & self.i.ready):
            m.d.sync += [
                h_valid.eq(1), h_data.eq(self.i.p.data), h_n.eq(self.i.p.nbytes),
                h_last.eq(self.i.p.last), state.eq(crc.state_out), first.eq(self.i.p.last),
                bidx.eq(Mux(bsel == nmask, nmask, bsel + 1)),
            ]
        return m


class Packetizer(wiring.Component):
    """RoCEv2 frame builder.

    Ports: ``i: In(PacketOut(W))`` (``i.meta`` PKT_META stream, ``i.payload`` beats),
    ``o: Out(BeatStream(W))`` (whole frames, ``last`` on the ICRC beat).
    """

    def __init__(self, data_bytes):
        check_data_bytes(data_bytes)
        self._w = data_bytes
        super().__init__({"i": In(PacketOut(data_bytes)), "o": Out(BeatStream(data_bytes))})

    def elaborate(self, platform):
        m = Module()
        w = self._w
        hb = -(-MAX_HEADER_BYTES // w) * w
        hlens = sorted({formats.header_bytes(op) for op in BthOpcode})
        shifts = sorted({h % w for h in hlens})
        assert 0 not in shifts

        m.submodules.icrc = icrc = IcrcAppend(w)
        wiring.connect(m, wiring.flipped(self.o), icrc.o)
        body = icrc.i

        meta = Signal(PKT_META)
        hdr = Signal(8 * hb)
        hlen = Signal(range(MAX_HEADER_BYTES + 1))
        pad = Signal(2)
        m.d.comb += pad.eq(-meta.paylen)
        ip_total = Signal(16)
        udp_len = Signal(16)
        m.d.comb += [
            ip_total.eq(hlen - 14 + meta.paylen + pad + 4),
            udp_len.eq(ip_total - 20),
        ]
        src_ip = Signal(8)
        dst_ip = Signal(8)
        m.d.comb += [src_ip.eq(meta.src_node + 1), dst_ip.eq(meta.dst_node + 1)]
        csum_const = 0x4500 + 0x4000 + 0x4011 + 0xC000 + 0x0200 + 0xC000 + 0x0200
        s0 = Signal(20)
        s1 = Signal(17)
        s2 = Signal(16)
        m.d.comb += [
            s0.eq(csum_const + ip_total + src_ip + dst_ip),
            s1.eq(s0[:16] + s0[16:]),
            s2.eq(s1[:16] + s1[16:]),
        ]
        ip_csum = ~s2

        fixed = Cat(
            Const(0x02, 8), Const(0, 32), meta.dst_node,
            Const(0x02, 8), Const(0, 32), meta.src_node,
            Const(0x08, 8), Const(0x00, 8),
            Const(0x45, 8), Const(0, 8), be(ip_total, 2), Const(0, 16), Const(0x40, 8),
            Const(0, 8), Const(64, 8), Const(17, 8), be(ip_csum, 2),
            Const(192, 8), Const(0, 8), Const(2, 8), src_ip,
            Const(192, 8), Const(0, 8), Const(2, 8), dst_ip,
            be(meta.udp_sport, 2), be(Const(formats.ROCE_UDP_PORT, 16), 2), be(udp_len, 2),
            Const(0, 16),
            meta.opcode, Cat(Const(0, 4), pad, Const(0, 1), meta.se), Const(0xFFFF, 16),
            Const(0, 8), be(meta.dest_qpn, 3), Cat(Const(0, 7), meta.ackreq), be(meta.psn, 3),
        )
        assert len(fixed) == 54 * 8
        reth = Cat(be(meta.va, 8), be(meta.rkey, 4), be(meta.dma_len, 4))
        parts = {
            "reth": reth,
            "atomiceth": Cat(be(meta.va, 8), be(meta.rkey, 4), be(meta.swap_add, 8),
                             be(meta.compare, 8)),
            "aeth": Cat(meta.syndrome, be(meta.msn, 3)),
            "atomicacketh": be(meta.orig, 8),
            "immdt": be(meta.imm, 4),
        }
        m.d.comb += [hdr.eq(fixed), hlen.eq(54)]
        with m.Switch(meta.opcode):
            for exts, ops in header_groups().items():
                with m.Case(*[op.value for op in ops]):
                    ext = Cat(*[parts[h] for h in exts]) if exts else Const(0, 0)
                    m.d.comb += [
                        hdr.eq(Cat(fixed, ext)),
                        hlen.eq(54 + len(ext) // 8),
                    ]

        # --- body stage: beat ``b`` of the body is header beat ``b`` while b < hlen // W,
        # the junction beat when b == hlen // W, payload/pad beats after (b saturates there)
        busy = Signal()
        b = Signal(range(hb // w + 2))
        sent = Signal(18)
        beats_left = Signal(16)
        residual = Signal(8 * w)
        lw = bits_for(w - 1)
        s_amt = Signal(range(w))
        hfull = Signal(range(hb // w + 1))
        m.d.comb += [s_amt.eq(hlen[:lw]), hfull.eq(hlen >> lw)]
        left = Signal(18)
        m.d.comb += left.eq(hlen + meta.paylen + pad - sent)

        pay = self.i.payload
        consume = Signal()
        pay_masked = Signal(8 * w)
        m.d.comb += pay_masked.eq(Mux(consume, pay.p.data & byte_keep(pay.p.nbytes, w), 0))
        hdr_beat = hdr.word_select(b, 8 * w)
        low = Signal(8 * w)
        m.d.comb += low.eq(Mux(b == hfull, hdr_beat & byte_keep(s_amt, w), residual))
        wide = shift_mux(m, "pay_shl", pay_masked, s_amt, shifts, 16 * w, left=True)
        shifted, res_next = wide[:8 * w], wide[8 * w:]
        is_last = left <= w
        m.d.comb += [
            body.p.nbytes.eq(Mux(is_last, left, w)),
            body.p.last.eq(is_last),
        ]

        def take_meta():
            m.d.comb += self.i.meta.ready.eq(1)
            with m.If(self.i.meta.valid):
                p = self.i.meta.p
                m.d.sync += [
                    meta.eq(p), b.eq(0), sent.eq(0), busy.eq(1),
                    beats_left.eq((p.paylen + (w - 1)) >> lw),
                ]

        with m.If(~busy):
            take_meta()
        with m.Elif(b < hfull):
            m.d.comb += [body.valid.eq(1), body.p.data.eq(hdr_beat)]
            with m.If(body.ready):
                m.d.sync += [b.eq(b + 1), sent.eq(sent + w)]
        with m.Else():
            m.d.comb += consume.eq(beats_left != 0)
            m.d.comb += [
                body.valid.eq(~consume | pay.valid),
                pay.ready.eq(consume & body.ready),
                body.p.data.eq(low | shifted),
            ]
            with m.If(body.valid & body.ready):
                m.d.sync += [sent.eq(sent + w), residual.eq(res_next), b.eq(hfull + 1)]
                with m.If(consume):
                    m.d.sync += beats_left.eq(beats_left - 1)
                with m.If(is_last):
                    # the next packet's meta is taken with this packet's last beat, so
                    # that packets follow each other without an idle cycle
                    m.d.sync += busy.eq(0)
                    take_meta()
        return m
