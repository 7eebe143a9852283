"""DMA write engine: client writes as PCIe memory-write TLPs, with a response for each.

Models the write half of an RNIC's host-interface DMA engine (as Corundum's
``dma_if_pcie_wr``) under PCIe's rules for posted writes (PCI Express Base Specification
4.0, 2.2.2 and 2.2.7):

* **Splitting.** A client write of ``len`` bytes (1 .. 65536) at ``addr`` is cut at every
  multiple of ``max_payload`` (MPS, default 256 B); each piece is one MWr TLP of at most MPS
  bytes and never crosses a 4 KB boundary (MPS divides 4096).
* **Realignment in the NIC.** The client's bytes come packed from byte 0; the TLP carries
  whole aligned host words (the word at ``addr & ~(W-1)`` first), the bytes outside
  ``[addr, addr + len)`` disabled (PCIe's first/last DW byte enables, derived from the
  header's ``addr`` and ``len``). A shifter with one word of carry does it at one word per
  cycle; a write whose head and tail are both unaligned takes one extra word.
* **Writes in order.** One client write at a time (round robin between clients at write
  boundaries), its TLPs back to back; PCIe keeps posted writes in order. An idle engine
  takes a write together with its first word, so a one-word write is taken in the cycle it
  is offered and one-word writes (CQEs, 8-byte payloads) leave one per cycle, of one client
  or of several (before 2026-12-08 the first word left a cycle after the write was taken:
  a client alone got one one-word write every two cycles, and the responder spent a second
  cycle on every 8-byte WRITE). Another client's write is also taken in the cycle the
  last word of one leaves (its first word then leaves in the next cycle). The last TLP of a
  write whose client set ``hint`` carries ``th`` (the host signals it when it is in memory).
* **Responses** (as AXI's B channel; PCIe posted writes have none): the host answers every
  MWr in order with a write response carrying its tag and a status. When all TLPs of a
  client write are answered, the client gets one ``done`` entry with its tag and ``err``
  (some part failed). At most ``outstanding`` TLPs wait for their response; a response out
  of order (wrong tag) is counted (``stat_bad``).
* ``accepted`` / ``emitted`` count client writes started / completely sent (free running,
  16 bits): the read engine uses them so that no read passes an earlier write.

Parameters: ``data_bytes`` (W, power of two in [8, 64]), ``n_clients`` in [1, 16],
``max_payload`` (power of two in [64, 4096], at least W), ``outstanding`` (power of two
in [2, 256]).

Ports: ``wr: In(DmaWritePort(W)).array(n)``; ``mwr: Out(TlpDown(W))``; ``rsp: In(stream
TLP_UP_HDR, always ready)``; ``accepted``, ``emitted``: ``Out(16)``; ``stat_bad: Out(1)``;
``pending: Out(range(outstanding + 1))``, the TLPs waiting for their response.
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from ..lib.arbiter import round_robin_pick
from ..formats import TLP_UP_HDR, TlpKind, TlpStatus
from ..interfaces import DMA_USER_TAG_BITS, DmaWritePort, TlpDown
from ..lib.checks import check_int, check_pow2

__all__ = ["DmaWriteEngine", "split_writes"]


def split_writes(addr, length, mps):
    """Python model of the splitting rule: ``[(addr, len)]`` of the MWr TLPs of a write."""
    out = []
    end = addr + length
    while addr < end:
        n = min(end, (addr // mps + 1) * mps) - addr
        out.append((addr, n))
        addr += n
    return out


class DmaWriteEngine(wiring.Component):
    def __init__(self, data_bytes, n_clients, *, max_payload=256, outstanding=32):
        check_pow2("data_bytes", data_bytes, 8, 64)
        check_int("n_clients", n_clients, 1, 16)
        check_pow2("max_payload", max_payload, 64, 4096)
        if max_payload < data_bytes:
            raise ValueError(f"max_payload must be at least data_bytes ({data_bytes}), "
                             f"not {max_payload!r}")
        check_pow2("outstanding", outstanding, 2, 256)
        self.data_bytes = data_bytes
        self.n_clients = n_clients
        self.mps = max_payload
        self.outstanding = outstanding
        super().__init__({
            "wr": In(DmaWritePort(data_bytes)).array(n_clients),
            "mwr": Out(TlpDown(data_bytes)),
            "rsp": In(stream.Signature(TLP_UP_HDR, always_ready=True)),
            "accepted": Out(16),
            "emitted": Out(16),
            "stat_bad": Out(1),
            "pending": Out(range(outstanding + 1)),
        })

    def elaborate(self, platform):
        m = Module()
        W = self.data_bytes
        lw = exact_log2(W)
        n = self.n_clients
        MPS = self.mps
        lm = exact_log2(MPS)

        # TLPs waiting for their response: {client, last TLP of the write, client tag}
        cb = max(1, (n - 1).bit_length())
        OUT = data.StructLayout({"client": cb, "last": 1, "tag": DMA_USER_TAG_BITS})
        m.submodules.pend = pend = SyncFIFOBuffered(width=OUT.size, depth=self.outstanding)
        m.d.comb += self.pending.eq(pend.level)

        busy = Signal()
        owner = Signal(range(max(n, 2)))
        last_c = Signal(range(max(n, 2)), init=n - 1)
        addr = Signal(64)          # first byte of the write
        end = Signal(65)           # one past its last byte
        utag = Signal(DMA_USER_TAG_BITS)
        hint = Signal()
        rot = Signal(lw)           # addr mod W
        hk = Signal(64)            # host address of the next out word
        k = Signal(17)             # index of the next out word
        n_in = Signal(15)          # client beats
        n_out = Signal(15)         # out words
        prev = Signal(8 * W)
        t_end = Signal(65)         # end of the TLP in progress
        wseq = Signal(8)

        # the next write: while one is going, another client's only (the owner's next write
        # shows its first beat only once its current last beat has been taken)
        any_v, pick = round_robin_pick(
            m, [c.wr.valid & ~(busy & (owner == i)) for i, c in enumerate(self.wr)], last_c)
        first = Signal.like(self.wr[0].wr.payload)
        with m.Switch(pick):
            for c in range(n):
                with m.Case(c):
                    m.d.comb += first.eq(self.wr[c].wr.payload)

        # an idle engine takes a write and its first word in the same cycle: the registers'
        # values for the write in progress, or the offered write's own while idle
        start = Signal()
        m.d.comb += start.eq(any_v & ~busy)
        act = busy | start
        e_owner = Signal.like(owner)
        e_addr, e_end, e_hk = Signal(64), Signal(65), Signal(64)
        e_rot, e_k, e_nin, e_nout = Signal(lw), Signal(17), Signal(15), Signal(15)
        e_tag, e_hint = Signal(DMA_USER_TAG_BITS), Signal()
        with m.If(busy):
            m.d.comb += [e_owner.eq(owner), e_addr.eq(addr), e_end.eq(end), e_hk.eq(hk),
                         e_rot.eq(rot), e_k.eq(k), e_nin.eq(n_in), e_nout.eq(n_out),
                         e_tag.eq(utag), e_hint.eq(hint)]
        with m.Else():
            ln = first.len
            m.d.comb += [e_owner.eq(pick), e_addr.eq(first.addr), e_end.eq(first.addr + ln),
                         e_hk.eq(Cat(Const(0, lw), first.addr[lw:])), e_rot.eq(first.addr[:lw]),
                         e_k.eq(0), e_nin.eq((ln + (W - 1)) >> lw),
                         e_nout.eq((first.addr[:lw] + ln + (W - 1)) >> lw),
                         e_tag.eq(first.tag), e_hint.eq(first.hint)]

        # the client beat for out word k (none for the extra tail word)
        cur_v = Signal()
        cur = Signal(8 * W)
        with m.Switch(e_owner):
            for c in range(n):
                with m.Case(c):
                    m.d.comb += [cur_v.eq(self.wr[c].wr.valid), cur.eq(self.wr[c].wr.payload.data)]
        need_beat = e_k < e_nin
        # out word = client bytes [kW - rot, kW - rot + W)
        word = Signal(8 * W)
        shift = Signal(lw + 1)
        m.d.comb += [shift.eq(W - e_rot),
                     word.eq((Cat(prev, Mux(need_beat, cur, 0)) >> (shift << 3))[:8 * W])]
        tlp_start = (e_k == 0) | (e_hk[:lm] == 0)
        t_start = Mux(e_k == 0, e_addr, e_hk)
        bound = Signal(65)
        m.d.comb += bound.eq((t_start | (MPS - 1)) + 1)
        new_end = Signal(65)
        m.d.comb += new_end.eq(Mux(bound < e_end, bound, e_end))
        cur_end = Mux(tlp_start, new_end, t_end)
        w_last = (e_hk + W) >= cur_end
        write_last = e_k + 1 == e_nout

        mwr = self.mwr
        ok = act & (~need_beat | cur_v) & (~tlp_start | pend.w_rdy)
        m.d.comb += [
            mwr.valid.eq(ok),
            mwr.payload.data.eq(word),
            mwr.payload.last.eq(w_last),
            mwr.payload.hdr.kind.eq(TlpKind.MWR),
            mwr.payload.hdr.tag.eq(wseq),
            mwr.payload.hdr.addr.eq(t_start),
            mwr.payload.hdr.len.eq(new_end - t_start),
            mwr.payload.hdr.th.eq(e_hint & (new_end == e_end)),     # on the write's last TLP
            pend.w_data.eq(Cat(e_owner[:cb], new_end == e_end, e_tag)),
        ]
        take = mwr.valid & mwr.ready
        with m.Switch(e_owner):
            for c in range(n):
                with m.Case(c):
                    m.d.comb += self.wr[c].wr.ready.eq(need_beat & take)
        with m.If(take):
            m.d.sync += [k.eq(e_k + 1), hk.eq(e_hk + W)]
            with m.If(need_beat):
                m.d.sync += prev.eq(cur)
            with m.If(tlp_start):
                m.d.comb += pend.w_en.eq(1)
                m.d.sync += [t_end.eq(new_end), wseq.eq(wseq + 1)]
            with m.If(write_last):
                m.d.sync += self.emitted.eq(self.emitted + 1)

        with m.If(start):
            # taken from idle, with its first word if that left: busy unless it was its only one
            m.d.sync += [
                busy.eq(~(take & write_last)), owner.eq(pick), last_c.eq(pick),
                addr.eq(e_addr), end.eq(e_end), utag.eq(e_tag), hint.eq(e_hint), rot.eq(e_rot),
                n_in.eq(e_nin), n_out.eq(e_nout), self.accepted.eq(self.accepted + 1),
            ]
            with m.If(~take):
                m.d.sync += [k.eq(0), hk.eq(e_hk)]
        with m.Elif(take & write_last):
            # the last word leaves: another client's write is taken in this cycle (it overrides
            # the updates above; its first word leaves in the next), so that one-word writes
            # of different clients go back to back
            m.d.sync += busy.eq(0)
            with m.If(any_v):
                ln = first.len
                m.d.sync += [
                    busy.eq(1), owner.eq(pick), last_c.eq(pick),
                    addr.eq(first.addr), end.eq(first.addr + ln), utag.eq(first.tag),
                    hint.eq(first.hint),
                    rot.eq(first.addr[:lw]), hk.eq(Cat(Const(0, lw), first.addr[lw:])),
                    k.eq(0),
                    n_in.eq((ln + (W - 1)) >> lw),
                    n_out.eq((first.addr[:lw] + ln + (W - 1)) >> lw),
                    self.accepted.eq(self.accepted + 1),
                ]

        # ---- responses, in order -----------------------------------------------------------
        head = Signal(OUT)
        m.d.comb += head.eq(pend.r_data)
        rseq = Signal(8)
        err_acc = Signal()
        rsp = self.rsp.payload
        with m.If(self.rsp.valid & pend.r_rdy):
            m.d.comb += pend.r_en.eq(1)
            m.d.sync += rseq.eq(rseq + 1)
            bad = rsp.tag != rseq
            m.d.comb += self.stat_bad.eq(bad)
            e = err_acc | (rsp.status != TlpStatus.SC) | bad
            with m.If(head.last):
                m.d.sync += err_acc.eq(0)
                for c in range(n):
                    with m.If(head.client == c):
                        m.d.comb += [self.wr[c].done.valid.eq(1), self.wr[c].done.payload.tag.eq(head.tag),
                                     self.wr[c].done.payload.err.eq(e)]
            with m.Else():
                m.d.sync += err_acc.eq(e)
        with m.Elif(self.rsp.valid):
            m.d.comb += self.stat_bad.eq(1)      # a response with nothing outstanding
        return m
