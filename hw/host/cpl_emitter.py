"""Completion emitter: the host's answer to one read request, as PCIe completion TLPs.

Models the completer side of a memory read (PCI Express Base Specification 4.0, 2.3.1.1
"Data return for read requests"): the ``len`` bytes of a request are returned in
completions in address order, each ending on a multiple of ``cpl_bytes`` (a multiple of the
read completion boundary, at most the maximum payload size) except the last, each carrying
whole aligned words (``sim.tlp_host.split_completions`` is the Python model). A request
with an error status gets one completion without data. Shared by the two hosts: the RTL
host reads the words from its memory, the Python host's adapter from the response the
Python model wrote.

The words are fetched through ``word``: the emitter drives ``word.index`` (the word of the
request, 0 = the aligned word holding its first byte) with ``word.en`` and uses
``word.data`` in the next cycle (a synchronous read port whose data register holds until
the next ``en``, like ``lib.memory``'s). ``req`` is taken (ready) when the request's last
beat leaves.

Parameters: ``data_bytes``, ``cpl_bytes`` (power of two in [W, 4096]), ``max_words``
(largest number of words of a request: ``(max_read_request + W) // W``).

Ports: ``req: In(stream {tag: 8, status: 2, addr: 12 (low bits of the request address),
len: 13})``, ``word``: ``index: Out(range(max_words))``, ``en: Out(1)``, ``data: In(8W)``;
``up: Out(TlpUp(W))``.
"""

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from ..formats import CplKind, TlpStatus
from ..interfaces import TlpUp
from ..lib.checks import check_int, check_pow2

__all__ = ["CplEmitter", "CPL_REQ"]

CPL_REQ = data.StructLayout({"tag": 8, "status": 2, "addr": 12, "len": 13})


class CplEmitter(wiring.Component):
    def __init__(self, data_bytes, cpl_bytes, max_words):
        check_pow2("data_bytes", data_bytes, 8, 64)
        check_pow2("cpl_bytes", cpl_bytes, data_bytes, 4096)
        check_int("max_words", max_words, 1, 4096 // data_bytes + 1)
        self.data_bytes = data_bytes
        self.cpl_bytes = cpl_bytes
        self.max_words = max_words
        super().__init__({
            "req": In(stream.Signature(CPL_REQ)),
            "word": Out(wiring.Signature({"index": Out(range(max_words)), "en": Out(1),
                                          "data": In(8 * data_bytes)})),
            "up": Out(TlpUp(data_bytes)),
        })

    def elaborate(self, platform):
        m = Module()
        W = self.data_bytes
        lw = exact_log2(W)
        lc = exact_log2(self.cpl_bytes)
        req = self.req.payload
        up = self.up

        lo_r = Signal(13)          # bytes of the request already sent
        widx_r = Signal(range(self.max_words + 1))   # next word to fetch
        start = Signal()           # IDLE: a new request, nothing of it sent yet
        lo = Signal(13)
        widx = Signal(range(self.max_words + 1))
        m.d.comb += [lo.eq(Mux(start, 0, lo_r)), widx.eq(Mux(start, 0, widx_r))]
        left = Signal(range(self.cpl_bytes // W + 2))   # words of this completion still to fetch
        a = Signal(13)
        m.d.comb += a.eq(req.addr + lo)                # address (low bits) of the part
        to_bnd = Signal(lc + 1)
        m.d.comb += to_bnd.eq(self.cpl_bytes - a[:lc])
        rem = Signal(13)
        m.d.comb += rem.eq(req.len - lo)
        n = Signal(13)
        m.d.comb += n.eq(Mux(rem < to_bnd, rem, to_bnd))
        nwords = Signal(range(self.cpl_bytes // W + 2))
        m.d.comb += nwords.eq((a[:lw] + n + (W - 1)) >> lw)
        part_last = rem <= to_bnd

        # output register: header / last registered, data from the word source's register
        o_v = Signal()
        o_hdr = Signal.like(up.payload.hdr)
        o_last = Signal()
        m.d.comb += [up.valid.eq(o_v), up.payload.hdr.eq(o_hdr), up.payload.last.eq(o_last),
                     up.payload.data.eq(self.word.data), self.word.index.eq(widx)]
        free = ~o_v | up.ready
        with m.If(up.ready):
            m.d.sync += o_v.eq(0)

        def part():
            """The first word of a completion: its header goes with it."""
            m.d.comb += self.word.en.eq(1)
            m.d.sync += [
                o_v.eq(1), o_last.eq(nwords == 1),
                o_hdr.kind.eq(CplKind.CPLD), o_hdr.tag.eq(req.tag),
                o_hdr.status.eq(TlpStatus.SC), o_hdr.lo.eq(lo), o_hdr.len.eq(n),
                o_hdr.dw.eq((a[:2] + n + 3) >> 2), o_hdr.last.eq(part_last),
                widx_r.eq(widx + 1), left.eq(nwords - 1),
                lo_r.eq(lo + n),
            ]
            # a part other than the last ends on a cpl_bytes (hence word) boundary, so the
            # next part starts with the next word
            with m.If(nwords == 1):
                with m.If(part_last):
                    m.d.comb += self.req.ready.eq(1)
                    m.next = "IDLE"
                with m.Else():
                    m.next = "PART"
            with m.Else():
                m.next = "WORDS"

        with m.FSM():
            with m.State("IDLE"):
                # a request's first part leaves in the cycle it is taken: a one-word read
                # costs one cycle, and requests follow each other without a gap
                with m.If(self.req.valid & free):
                    with m.If(req.status != TlpStatus.SC):
                        # one completion, no data, ends the request
                        m.d.sync += [o_v.eq(1), o_last.eq(1), o_hdr.eq(0),
                                     o_hdr.kind.eq(CplKind.CPLD), o_hdr.tag.eq(req.tag),
                                     o_hdr.status.eq(req.status), o_hdr.last.eq(1)]
                        m.d.comb += self.req.ready.eq(1)
                    with m.Else():
                        m.d.comb += start.eq(1)
                        part()
            with m.State("PART"):
                with m.If(free):
                    part()
            with m.State("WORDS"):
                with m.If(free):
                    m.d.comb += self.word.en.eq(1)
                    m.d.sync += [o_v.eq(1), o_last.eq(left == 1), widx_r.eq(widx + 1),
                                 left.eq(left - 1)]
                    with m.If(left == 1):
                        # lo was advanced when the part started: lo == len means done
                        with m.If(lo == req.len):
                            m.d.comb += self.req.ready.eq(1)
                            m.next = "IDLE"
                        with m.Else():
                            m.next = "PART"
        return m
