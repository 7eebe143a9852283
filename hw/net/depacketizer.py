"""RoCEv2 depacketizer: Ethernet frames in, verified header fields + payload out.

Models the receive parser of a RoCEv2 RNIC (InfiniBand Architecture Specification vol. 1
rel. 1.4: Annex A17.4 RoCEv2 encapsulation, UDP destination port 4791; A17.3.3 invariant
CRC; chapter 9.2 BTH, 9.3 extended transport headers RETH/AtomicETH/AETH/
AtomicAckETH/ImmDt; 9.6 packet header validation: unknown opcode, transport version,
length checks; packets failing them are silently dropped). It is the inverse of :class:`hw.net.packetizer.Packetizer` and of
``sim.roce.encode``.

Store-and-forward: each frame is written into a ring of beats in a ``lib.memory.Memory``
(a power of two >= ``ceil(max_frame_bytes / W) + 2`` beats) while its header beats are
kept in registers and its ICRC is computed on the fly (same masks as the packetizer; a
frame is good when the CRC register, run over the whole frame including its ICRC, ends at
the CRC-32 residue). In the cycle after the last beat the frame is judged (the next frame
may already start in that cycle): a bad frame is forgotten by rewinding the ring's write
pointer; a good one gets a descriptor (parsed meta, ring position) in a 4-entry FIFO. The
emitter sends the meta, then ``ceil(paylen / W)`` payload beats realigned to byte 0 from two
read ports (one beat per cycle), then frees the frame's ring space. Input waits only when
the ring or the descriptor FIFO is full; a frame longer than ``max_frame_bytes`` is not
written but still consumed to its last beat.

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

from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import bits_for

from .. import formats
from .crc import CRC32_RESIDUE, Crc32Update, check_data_bytes
from ..formats import BthOpcode, PKT_META
from ..interfaces import BeatStream, PacketOut
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
        maxbeats = -(-self._max // w)
        abits = bits_for(maxbeats + 1)
        ring = 1 << abits
        nhdr = -(-MAX_HEADER_BYTES // w)
        nmask = -(-_ICRC_MASKED_END // w)
        shifts = sorted({formats.header_bytes(op) % w for op in BthOpcode})

        m.submodules.mem = mem = Memory(shape=8 * w, depth=ring, init=[])
        wr = mem.write_port()
        rda = mem.read_port(transparent_for=())
        rdb = mem.read_port(transparent_for=())
        m.submodules.crc = crc = Crc32Update(w)
        desc_layout = data.StructLayout({
            "meta": PKT_META, "start": abits + 1, "nbeats": range(maxbeats + 1)})
        m.submodules.desc = desc = SyncFIFO(width=desc_layout.size, depth=4)

        # ---------------------------------------------------------------- receive
        # Frame n+1 may start in the cycle frame n is judged (``chk``): the counters of the
        # frame being received are then taken as 0 (``cur_*``) while the judgement still
        # reads the registers of frame n.
        chk = Signal()                          # the previous beat was a last beat
        wstart = Signal(abits + 1)              # ring pointer of the frame being received
        rtail = Signal(abits + 1)               # first beat still needed by the reader
        widx = Signal(range(maxbeats + 1))      # beats of this frame, saturates at maxbeats
        fl = Signal(16)                         # frame bytes, saturates at 65535
        overflow = Signal()
        badbeat = Signal()
        crc_state = Signal(32)
        hdr = Signal(8 * nhdr * w)

        good = Signal()
        commit = Signal()                       # chk and the frame is kept
        stall = Signal()                        # chk, frame good but the descriptor FIFO full

        cur_widx = Mux(chk, 0, widx)
        cur_fl = Mux(chk, 0, fl)
        cur_start = Signal(abits + 1)
        m.d.comb += cur_start.eq(Mux(commit, wstart + widx, wstart))
        wptr = Signal(abits + 1)
        m.d.comb += wptr.eq(cur_start + cur_widx)
        writing = cur_widx < maxbeats
        room = (wptr - rtail)[:abits + 1] < ring

        beat = self.i.p
        accept = Signal()
        m.d.comb += [
            self.i.ready.eq(~stall & (room | ~writing)),
            accept.eq(self.i.valid & self.i.ready),
        ]

        masked = Signal(8 * w)
        m.d.comb += masked.eq(beat.data)
        with m.Switch(cur_widx):
            for b in range(nmask):
                and_m, or_m = icrc_mask(b, w)
                with m.Case(b):
                    m.d.comb += masked.eq((beat.data & and_m) | or_m)
        m.d.comb += [
            crc.state_in.eq(Mux(cur_widx == 0, ICRC_INIT, crc_state)),
            crc.data.eq(masked), crc.nbytes.eq(beat.nbytes),
        ]
        fl_next = Signal(17)
        m.d.comb += fl_next.eq(cur_fl + beat.nbytes)
        m.d.comb += [
            wr.addr.eq(wptr[:abits]), wr.data.eq(beat.data), wr.en.eq(accept & writing),
        ]
        with m.If(chk & ~stall):
            m.d.sync += [chk.eq(0), wstart.eq(cur_start), widx.eq(0), fl.eq(0),
                         overflow.eq(0), badbeat.eq(0)]
        with m.If(accept):
            m.d.sync += [
                crc_state.eq(crc.state_out),
                fl.eq(Mux(fl_next[16], 0xFFFF, fl_next[:16])),
                widx.eq(Mux(cur_widx == maxbeats, maxbeats, cur_widx + 1)),
                chk.eq(beat.last),
            ]
            with m.If(fl_next > self._max):
                m.d.sync += overflow.eq(1)
            with m.If((beat.nbytes == 0) | (beat.nbytes > w) | (~beat.last & (beat.nbytes != w))):
                m.d.sync += badbeat.eq(1)
            with m.Switch(cur_widx):
                for b in range(nhdr):
                    with m.Case(b):
                        m.d.sync += hdr.word_select(b, 8 * w).eq(beat.data)

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

        with m.If(chk):
            m.d.comb += good.eq(~struct_bad & ~icrc_bad & ~hdr_bad)
            m.d.comb += [stall.eq(good & ~desc.w_rdy), commit.eq(good & desc.w_rdy)]
            with m.If(~stall):
                m.d.comb += self.stat_bytes.eq(fl)
                with m.If(struct_bad):
                    m.d.comb += self.stat_malformed.eq(1)
                with m.Elif(icrc_bad):
                    m.d.comb += self.stat_icrc.eq(1)
                with m.Elif(hdr_bad):
                    m.d.comb += self.stat_malformed.eq(1)
                with m.Else():
                    m.d.comb += self.stat_ok.eq(1)
        w_desc = Signal(desc_layout)
        m.d.comb += [
            w_desc.meta.eq(parsed), w_desc.start.eq(wstart), w_desc.nbeats.eq(widx),
            desc.w_data.eq(w_desc), desc.w_en.eq(commit),
        ]

        # ---------------------------------------------------------------- emit
        EMPTY, PAY = 0, 1
        rstate = Signal()
        r_desc = data.View(desc_layout, desc.r_data)
        meta = Signal(PKT_META)
        rstart = Signal(abits + 1)
        rbeats = Signal(range(maxbeats + 1))
        tx_hlen = _hlen_of(m, Mux(rstate == PAY, meta.opcode, r_desc.meta.opcode), "tx_hlen")
        j0 = Signal(range(nhdr + 1))
        s_amt = Signal(range(w))
        m.d.comb += [j0.eq(tx_hlen >> lw), s_amt.eq(tx_hlen[:lw])]
        k = Signal(range(maxbeats + 1))
        left = Signal(17)
        pay = self.o.payload
        advance = pay.valid & pay.ready
        a_addr = Signal(abits + 1)
        m.d.comb += a_addr.eq(Mux(rstate == PAY, rstart + j0 + k + advance, r_desc.start + j0))
        m.d.comb += [rda.addr.eq(a_addr[:abits]), rdb.addr.eq((a_addr + 1)[:abits])]
        joined = shift_mux(m, "rx_join", Cat(rda.data, rdb.data), s_amt, shifts, 8 * w,
                           left=False)
        is_last = left <= w
        nbytes = Mux(is_last, left, w)

        m.d.comb += self.o.meta.p.eq(r_desc.meta)
        with m.If(rstate == EMPTY):
            m.d.comb += [self.o.meta.valid.eq(desc.r_rdy), desc.r_en.eq(self.o.meta.ready)]
            with m.If(self.o.meta.valid & self.o.meta.ready):
                m.d.sync += [meta.eq(r_desc.meta), rstart.eq(r_desc.start),
                             rbeats.eq(r_desc.nbeats), k.eq(0), left.eq(r_desc.meta.paylen)]
                with m.If(r_desc.meta.paylen == 0):
                    m.d.sync += rtail.eq(r_desc.start + r_desc.nbeats)
                with m.Else():
                    m.d.sync += rstate.eq(PAY)
        with m.Else():
            m.d.comb += [
                pay.valid.eq(1), pay.p.data.eq(joined & byte_keep(nbytes, w)),
                pay.p.nbytes.eq(nbytes), pay.p.last.eq(is_last),
            ]
            with m.If(pay.ready):
                m.d.sync += [k.eq(k + 1), left.eq(left - w)]
                with m.If(is_last):
                    m.d.sync += [rstate.eq(EMPTY), rtail.eq(rstart + rbeats)]
        return m
