"""RoCEv2 depacketizer: Ethernet frames in, verified header fields + payload out.

Models the receive parser of a RoCEv2 RNIC (InfiniBand Architecture Specification vol. 1
rel. 1.4: Annex A17.4 RoCEv2 encapsulation, UDP destination port 4791; A17.3.3 invariant
CRC; chapter 9.2 BTH, 9.3 RETH/AtomicETH/ImmDt, 9.5 AETH/AtomicAckETH; 9.6.1.1 header
validation: unknown opcode, transport version, length checks; packets failing them are
silently dropped). It is the inverse of :class:`hw.packetizer.Packetizer` and of
``sim.roce.encode``.

Store-and-forward: each frame is written into a ``lib.memory.Memory`` of
``ceil(max_frame_bytes / W) + 1`` beats while its header beats are kept in registers and
its ICRC is computed on the fly (same masks as the packetizer; a frame is good when the
CRC register, run over the whole frame including its ICRC, ends at the CRC-32 residue).
One cycle after the last beat the frame is judged; only a good frame is emitted (meta,
then ``ceil(paylen / W)`` payload beats realigned to byte 0 from two read ports, one beat
per cycle). Input is not accepted while a frame is judged or emitted.

Outcome, pulsed for one cycle with ``stat_bytes`` = frame length (saturated at 65535):

* ``stat_malformed``: structural errors first (longer than ``max_frame_bytes``, shorter
  than 58 bytes, a beat with ``nbytes`` 0 or a non-last beat with ``nbytes < W``);
* ``stat_icrc``: ICRC mismatch;
* ``stat_malformed``: header errors: ethertype != 0x0800, IPv4 version/IHL != 0x45,
  protocol != 17, bad IPv4 header checksum, UDP destination port != 4791, IPv4 total
  length or UDP length not matching the frame, unknown BTH opcode, TVer != 0, frame too
  short for the opcode's headers, pad count larger than the payload, payload or pad on
  READ_REQUEST / ACKNOWLEDGE / ATOMIC_ACKNOWLEDGE / COMPARE_SWAP / FETCH_ADD;
* ``stat_ok``: emitted.

``sim.roce.classify`` is the Python reference of this order.
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import bits_for

from . import formats
from .crc import CRC32_RESIDUE, Crc32Update, check_data_bytes
from .formats import BthOpcode, PKT_META
from .interfaces import BeatStream, PacketOut
from .packetizer import (ICRC_INIT, MAX_HEADER_BYTES, _ICRC_MASKED_END, byte_keep,
                         header_groups, icrc_mask, shift_mux)

__all__ = ["Depacketizer"]

_MIN_FRAME = 14 + 20 + 8 + 12 + 4
_NO_PAYLOAD = (BthOpcode.READ_REQUEST, BthOpcode.ACKNOWLEDGE, BthOpcode.ATOMIC_ACKNOWLEDGE,
               BthOpcode.COMPARE_SWAP, BthOpcode.FETCH_ADD)


def _hlen_of(m, opcode, name):
    hlen = Signal(range(MAX_HEADER_BYTES + 1), name=name)
    m.d.comb += hlen.eq(54)
    with m.Switch(opcode):
        for exts, ops in header_groups().items():
            with m.Case(*[op.value for op in ops]):
                m.d.comb += hlen.eq(formats.header_bytes(ops[0]))
    return hlen


def _be(byte_list):
    """Value of big-endian bytes."""
    return Cat(*reversed(byte_list))


class Depacketizer(wiring.Component):
    """RoCEv2 frame parser and checker.

    Ports: ``i: In(BeatStream(W))`` (frames), ``o: Out(PacketOut(W))`` (``o.meta``
    PKT_META stream, ``o.payload`` beats), ``stat_ok``, ``stat_icrc``, ``stat_malformed``:
    ``Out(1)`` one-cycle pulses, ``stat_bytes: Out(16)`` frame length with any pulse.
    """

    def __init__(self, data_bytes, max_frame_bytes=4096 + 128):
        check_data_bytes(data_bytes)
        if (not isinstance(max_frame_bytes, int) or isinstance(max_frame_bytes, bool)
                or not 128 <= max_frame_bytes <= 65535):
            raise ValueError(f"max_frame_bytes must be an integer in [128, 65535], "
                             f"not {max_frame_bytes!r}")
        self._w = data_bytes
        self._max = max_frame_bytes
        super().__init__({
            "i": In(BeatStream(data_bytes)),
            "o": Out(PacketOut(data_bytes)),
            "stat_ok": Out(1),
            "stat_icrc": Out(1),
            "stat_malformed": Out(1),
            "stat_bytes": Out(16),
        })

    def elaborate(self, platform):
        m = Module()
        w = self._w
        lw = bits_for(w - 1)
        depth = -(-self._max // w)
        nhdr = -(-MAX_HEADER_BYTES // w)
        nmask = -(-_ICRC_MASKED_END // w)
        shifts = sorted({formats.header_bytes(op) % w for op in BthOpcode})

        m.submodules.mem = mem = Memory(shape=8 * w, depth=depth + 1, init=[])
        wr = mem.write_port()
        rda = mem.read_port(transparent_for=())
        rdb = mem.read_port(transparent_for=())
        m.submodules.crc = crc = Crc32Update(w)

        RECV, CHECK, META, PAY = range(4)
        fsm = Signal(range(4))

        # ---------------------------------------------------------------- receive
        widx = Signal(range(depth + 1))         # saturates at depth
        fl = Signal(16)                         # saturates at 65535
        overflow = Signal()
        badbeat = Signal()
        crc_state = Signal(32)
        hdr = Signal(8 * nhdr * w)

        beat = self.i.p
        accept = Signal()
        m.d.comb += [self.i.ready.eq(fsm == RECV), accept.eq(self.i.valid & self.i.ready)]

        masked = Signal(8 * w)
        m.d.comb += masked.eq(beat.data)
        with m.Switch(widx):
            for b in range(nmask):
                and_m, or_m = icrc_mask(b, w)
                with m.Case(b):
                    m.d.comb += masked.eq((beat.data & and_m) | or_m)
        m.d.comb += [
            crc.state_in.eq(Mux(widx == 0, ICRC_INIT, crc_state)),
            crc.data.eq(masked), crc.nbytes.eq(beat.nbytes),
        ]
        fl_next = Signal(17)
        m.d.comb += fl_next.eq(fl + beat.nbytes)
        m.d.comb += [
            wr.addr.eq(widx), wr.data.eq(beat.data), wr.en.eq(accept & (widx < depth)),
        ]
        with m.If(accept):
            m.d.sync += [
                crc_state.eq(crc.state_out),
                fl.eq(Mux(fl_next[16], 0xFFFF, fl_next[:16])),
                widx.eq(Mux(widx == depth, depth, widx + 1)),
            ]
            with m.If(fl_next > self._max):
                m.d.sync += overflow.eq(1)
            with m.If((beat.nbytes == 0) | (beat.nbytes > w) | (~beat.last & (beat.nbytes != w))):
                m.d.sync += badbeat.eq(1)
            with m.Switch(widx):
                for b in range(nhdr):
                    with m.Case(b):
                        m.d.sync += hdr.word_select(b, 8 * w).eq(beat.data)
            with m.If(beat.last):
                m.d.sync += fsm.eq(CHECK)

        # ---------------------------------------------------------------- check
        hb = [hdr[8 * i:8 * i + 8] for i in range(nhdr * w)]
        opcode = hb[42]
        hlen = _hlen_of(m, opcode, "rx_hlen")
        pad = hb[43][4:6]
        known = opcode <= max(op.value for op in BthOpcode)
        no_payload = Signal()
        with m.Switch(opcode):
            with m.Case(*[op.value for op in _NO_PAYLOAD]):
                m.d.comb += no_payload.eq(1)
        # IPv4 header checksum: the ones' complement sum of the 10 words is 0xFFFF
        c0 = Signal(20)
        c1 = Signal(17)
        c2 = Signal(16)
        m.d.comb += [
            c0.eq(sum(_be(hb[14 + 2 * i:16 + 2 * i]) for i in range(10))),
            c1.eq(c0[:16] + c0[16:]),
            c2.eq(c1[:16] + c1[16:]),
        ]
        body = Signal(18)                       # payload + pad bytes (valid if fl >= hlen+4)
        m.d.comb += body.eq(fl - hlen - 4)
        paylen = Signal(16)
        m.d.comb += paylen.eq(body - pad)

        struct_bad = overflow | badbeat | (fl < _MIN_FRAME)
        icrc_bad = crc_state != CRC32_RESIDUE
        hdr_bad = (
            (_be(hb[12:14]) != 0x0800) | (hb[14] != 0x45) | (hb[23] != 17) | (c2 != 0xFFFF)
            | (_be(hb[36:38]) != formats.ROCE_UDP_PORT)
            | (_be(hb[16:18]) != fl - 14) | (_be(hb[38:40]) != fl - 34)
            | ~known | (hb[43][:4] != 0)
            | (fl < hlen + 4) | (fl < hlen + 4 + pad)
            | (no_payload & (body != 0))
        )

        parsed = Signal(PKT_META)
        m.d.comb += [
            parsed.opcode.eq(opcode),
            parsed.src_node.eq(hb[29] - 1), parsed.dst_node.eq(hb[33] - 1),
            parsed.se.eq(hb[43][7]), parsed.ackreq.eq(hb[50][7]),
            parsed.dest_qpn.eq(_be(hb[47:50])), parsed.psn.eq(_be(hb[51:54])),
            parsed.udp_sport.eq(_be(hb[34:36])), parsed.paylen.eq(paylen),
        ]
        with m.Switch(opcode):
            for exts, ops in header_groups().items():
                with m.Case(*[op.value for op in ops]):
                    off = 54
                    for h in exts:
                        f = hb[off:off + formats.HEADER_BYTES[h]]
                        if h == "reth":
                            m.d.comb += [parsed.va.eq(_be(f[0:8])), parsed.rkey.eq(_be(f[8:12])),
                                         parsed.dma_len.eq(_be(f[12:16]))]
                        elif h == "atomiceth":
                            m.d.comb += [parsed.va.eq(_be(f[0:8])), parsed.rkey.eq(_be(f[8:12])),
                                         parsed.swap_add.eq(_be(f[12:20])),
                                         parsed.compare.eq(_be(f[20:28]))]
                        elif h == "aeth":
                            m.d.comb += [parsed.syndrome.eq(f[0]), parsed.msn.eq(_be(f[1:4]))]
                        elif h == "atomicacketh":
                            m.d.comb += parsed.orig.eq(_be(f[0:8]))
                        elif h == "immdt":
                            m.d.comb += parsed.imm.eq(_be(f[0:4]))
                        off += formats.HEADER_BYTES[h]

        meta = Signal(PKT_META)
        with m.If(fsm == CHECK):
            m.d.comb += self.stat_bytes.eq(fl)
            with m.If(struct_bad):
                m.d.comb += self.stat_malformed.eq(1)
            with m.Elif(icrc_bad):
                m.d.comb += self.stat_icrc.eq(1)
            with m.Elif(hdr_bad):
                m.d.comb += self.stat_malformed.eq(1)
            with m.Else():
                m.d.comb += self.stat_ok.eq(1)
            m.d.sync += [
                meta.eq(parsed), fsm.eq(Mux(self.stat_ok, META, RECV)),
                widx.eq(0), fl.eq(0), overflow.eq(0), badbeat.eq(0),
            ]

        # ---------------------------------------------------------------- emit
        tx_hlen = _hlen_of(m, meta.opcode, "tx_hlen")
        j0 = Signal(range(nhdr + 1))
        s_amt = Signal(range(w))
        m.d.comb += [j0.eq(tx_hlen >> lw), s_amt.eq(tx_hlen[:lw])]
        k = Signal(range(depth + 1))
        left = Signal(17)
        pay = self.o.payload
        advance = pay.valid & pay.ready
        k_next = Signal(range(depth + 2))
        m.d.comb += k_next.eq(Mux(fsm == PAY, k + advance, 0))
        a_addr = Signal(range(depth + 2))
        m.d.comb += a_addr.eq(j0 + k_next)
        m.d.comb += [
            rda.addr.eq(Mux(a_addr > depth, depth, a_addr)),
            rdb.addr.eq(Mux(a_addr >= depth, depth, a_addr + 1)),
        ]
        joined = shift_mux(m, "rx_join", Cat(rda.data, rdb.data), s_amt, shifts, 8 * w,
                           left=False)
        is_last = left <= w
        nbytes = Mux(is_last, left, w)

        m.d.comb += self.o.meta.p.eq(meta)
        with m.If(fsm == META):
            m.d.comb += self.o.meta.valid.eq(1)
            with m.If(self.o.meta.ready):
                m.d.sync += [k.eq(0), left.eq(meta.paylen),
                             fsm.eq(Mux(meta.paylen == 0, RECV, PAY))]
        with m.If(fsm == PAY):
            m.d.comb += [
                pay.valid.eq(1), pay.p.data.eq(joined & byte_keep(nbytes, w)),
                pay.p.nbytes.eq(nbytes), pay.p.last.eq(is_last),
            ]
            with m.If(pay.ready):
                m.d.sync += [k.eq(k + 1), left.eq(left - w)]
                with m.If(is_last):
                    m.d.sync += fsm.eq(RECV)
        return m
