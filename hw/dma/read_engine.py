"""DMA read engine: the NIC's client reads as tagged PCIe read requests, completions in any order.

Models the read half of an RNIC's host-interface DMA engine, as in Corundum's
``dma_if_pcie_rd`` (a client request becomes read-request TLPs with tags; completions are
written into a RAM at their place; the client is told when its data is there) and PCIe's
rules for a requester (PCI Express Base Specification 4.0, 2.2.9 and 2.3.1.1):

* **Splitting.** A client read of ``len`` bytes (1 .. 65536) at ``addr`` is cut at every
  multiple of ``max_read_request`` (MRRS, default 512 B); each piece is one MRd TLP of at
  most MRRS bytes and, since MRRS divides 4096, never crosses a 4 KB boundary. The engine
  issues one TLP per cycle, round robin over the clients with something to issue, each with
  a free tag from a pool of ``n_tags`` (PCIe's Tag field; 32 without extended tags). A
  client's next request is taken in the cycle the last TLP of its current one is issued,
  so one-TLP requests of one client go out one per cycle.
* **Completions in any order.** The host answers each MRd with one or more completions, in
  address order within a request, each naming the tag and the byte range ``[lo, lo + len)``
  of the request it carries in whole aligned words (the host may split at its read
  completion boundary). Completions of different tags may arrive in any order and
  interleave only at TLP boundaries. Each data word is written whole, as the host sent it,
  into its place in the client's ring (below); the tag returns to the pool with the
  completion marked ``last``. A completion whose tag is not outstanding is dropped and counted
  (``stat_bad``).
* **Realignment in the NIC.** The host sends whole aligned words; the client gets its bytes
  packed from byte 0 (:func:`~hw.interfaces.DmaReadPort`). Each client has a ring of
  ``ring_words[c]`` words that holds a request's host words as they came (a request of
  ``len`` bytes at ``addr`` takes ``ceil((addr mod W + len) / W)`` ring words; every TLP
  boundary is a multiple of MRRS, so no host word belongs to two TLPs and every write is a
  whole word, without byte enables). The ring is two banks (even / odd words); delivery
  reads a word and the next one in the same cycle and shifts the pair by ``addr mod W``
  bytes, so each client word is realigned on its way out, one per cycle. (Realigning on the
  write side instead needs byte-enabled writes, one per byte lane, which cost Verilator a
  delayed store per lane and port; docs/performance.md.)
* **Reserve, then read.** A TLP is issued only when the client's ring has room for every word
  it fills; data therefore always has a place and the completion stream is never
  back-pressured. Each client's data leaves its ring in request order, one word per cycle,
  as soon as the words are complete (a word that straddles two TLPs waits for both), so a
  client that stalls stalls only itself, and a slow completion delays only its own client.
* **Error status.** A completion with a status other than SC ends its TLP; every TLP's status
  is kept: each beat of the client's data carries ``err`` if its TLP or an earlier one of
  the request failed (so the last beat says whether any part did, and a request that fits in
  one TLP has its status on every beat).
* **Ordering against writes.** Every MRd carries ``after``, the number of client writes the
  write engine had accepted when the client asked for the read; the host interface sends an
  MRd only once that many writes are on the link, so a read never passes a write issued
  before it (PCIe: a read does not pass a posted write).

Parameters: ``data_bytes`` (W, power of two in [8, 64]); ``ring_words`` (one per client,
each a power of two in [4, 65536] and at least ``ceil(min(MRRS, max_len) / W) + 1``);
``n_tags`` in [1, 256]; ``max_read_request`` (power of two in [64, 4096], at least W);
``max_len`` (one per client, largest request it makes, default 65536); ``seq_depth`` (TLPs
of one client issued and not yet passed to its data, power of two, default >= n_tags).

Ports: ``rd: In(DmaReadPort(W)).array(n)``; ``mrd: Out(stream {hdr: TLP_DOWN_HDR, after:
16})``; ``cpl: In(TlpUp(W))`` (read completions only, always ready); ``w_accepted: In(16)``;
``stat_bad: Out(1)``; ``tags_free: Out(range(n_tags + 1))``.

A request whose address is not word-aligned can take one ring word more than its length
needs, so ``ring_words`` sized for ``k`` requests of ``max_len`` bytes holds fewer than
``k`` unaligned ones at once (never fewer than one).
"""

from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2, exact_log2

from ..lib.arbiter import round_robin_pick
from ..formats import TLP_DOWN_HDR, TlpKind, TlpStatus
from ..interfaces import DMA_MAX_LEN, DmaReadPort, TlpUp
from ..lib.checks import check_int, check_pow2
from ..lib.encoder import first_set

__all__ = ["DmaReadEngine", "MRD_OUT", "split_reads", "ring_words_for"]


def ring_words_for(data_bytes, max_len, max_read_request, bytes_in_flight=0):
    """Smallest legal ring (words) for a client whose requests are at most ``max_len`` bytes,
    at least ``bytes_in_flight`` bytes."""
    need = max(-(-min(max_read_request, max_len) // data_bytes) + 1,
               -(-bytes_in_flight // data_bytes), 4)
    return 1 << (need - 1).bit_length()

MRD_OUT = data.StructLayout({"hdr": TLP_DOWN_HDR, "after": 16})


def split_reads(addr, length, mrrs):
    """Python model of the splitting rule: ``[(addr, len)]`` of the MRd TLPs of a read."""
    out = []
    end = addr + length
    while addr < end:
        n = min(end, (addr // mrrs + 1) * mrrs) - addr
        out.append((addr, n))
        addr += n
    return out


class DmaReadEngine(wiring.Component):
    def __init__(self, data_bytes, ring_words, *, n_tags=32, max_read_request=512,
                 max_len=None, seq_depth=None):
        check_pow2("data_bytes", data_bytes, 8, 64)
        if not isinstance(ring_words, (list, tuple)) or not 1 <= len(ring_words) <= 16:
            raise ValueError(f"ring_words must be a list of 1 to 16 ring sizes, not {ring_words!r}")
        check_int("n_tags", n_tags, 1, 256)
        check_pow2("max_read_request", max_read_request, 64, 4096)
        if max_read_request < data_bytes:
            raise ValueError(f"max_read_request must be at least data_bytes ({data_bytes}), "
                             f"not {max_read_request!r}")
        n = len(ring_words)
        max_len = [DMA_MAX_LEN] * n if max_len is None else list(max_len)
        if len(max_len) != n:
            raise ValueError(f"max_len must have one entry per client ({n}), not {max_len!r}")
        for c, (words, ml) in enumerate(zip(ring_words, max_len)):
            check_int(f"max_len[{c}]", ml, 1, DMA_MAX_LEN)
            need = -(-min(max_read_request, ml) // data_bytes) + 1
            check_pow2(f"ring_words[{c}]", words, max(4, 1 << ceil_log2(need)), 1 << 16)
        if seq_depth is None:
            seq_depth = 1 << ceil_log2(max(2, n_tags))
        check_pow2("seq_depth", seq_depth, 2, 1024)
        self.data_bytes = data_bytes
        self.ring_words = list(ring_words)
        self.max_len = max_len
        self.n_tags = n_tags
        self.mrrs = max_read_request
        self.seq_depth = seq_depth
        super().__init__({
            "rd": In(DmaReadPort(data_bytes)).array(n),
            "mrd": Out(stream.Signature(MRD_OUT)),
            "cpl": In(TlpUp(data_bytes)),
            "w_accepted": In(16),
            "stat_bad": Out(1),
            "tags_free": Out(range(n_tags + 1), init=n_tags),
        })

    def elaborate(self, platform):
        m = Module()
        W = self.data_bytes
        lw = exact_log2(W)
        n = len(self.ring_words)
        NT = self.n_tags
        DS = self.seq_depth
        ls = exact_log2(DS)
        MRRS = self.mrrs
        cb = max(1, ceil_log2(n))
        kbits = max(exact_log2(d) for d in self.ring_words) + 1

        # ---- tag pool and tag table -------------------------------------------------------
        free = Signal(NT, init=(1 << NT) - 1)
        tag_any, tag_pick = first_set(m, free, "tag")
        # kbase: ring word of the TLP's first host word; s_lo: the TLP address mod W
        TAG_ENTRY = data.StructLayout({"client": cb, "seq": ls, "kbase": kbits, "s_lo": lw})
        m.submodules.tagtab = tagtab = Memory(shape=TAG_ENTRY, depth=NT, init=[])
        tt_wr = tagtab.write_port()
        tt_rd = tagtab.read_port(domain="comb")
        free_set = Signal(NT)
        free_clr = Signal(NT)
        m.d.sync += free.eq((free & ~free_clr) | free_set)
        # tags free: a count kept beside the pool (a tag is taken and one given back at most
        # once per cycle each), not a popcount of the pool
        m.d.sync += self.tags_free.eq(self.tags_free - (free_clr != 0) + (free_set != 0))

        # ---- MRd output register -----------------------------------------------------------
        mrd_v = Signal()
        m.d.comb += self.mrd.valid.eq(mrd_v)
        mrd_free = ~mrd_v | self.mrd.ready
        with m.If(self.mrd.ready):
            m.d.sync += mrd_v.eq(0)

        # ---- per client: request registers, chunk issue, ring, delivery -------------------
        can = []
        issue = []           # per client: the chunk is issued this cycle
        clients = []
        CHUNK = data.StructLayout({"dend": 17, "last": 1})
        for c, D in enumerate(self.ring_words):
            lD = exact_log2(D)
            port = self.rd[c]
            st = type("Client", (), {})()
            clients.append(st)
            # request being split
            busy = Signal(name=f"c{c}_busy")
            s_addr = Signal(64, name=f"c{c}_s")        # next byte to request
            off = Signal(17, name=f"c{c}_off")        # s - request address
            rlen = Signal(17, name=f"c{c}_len")
            base = Signal(lD + 1, name=f"c{c}_base")  # ring word of the request's first host word
            shift0 = Signal(lw, name=f"c{c}_shift")   # the request's address mod W
            after = Signal(16, name=f"c{c}_after")
            alloc = Signal(lD + 1, name=f"c{c}_alloc")  # next request's base
            seq = Signal(ls + 1, name=f"c{c}_seq")      # next TLP number
            hseq = Signal(ls + 1, name=f"c{c}_hseq")    # oldest TLP not yet passed
            done = Signal(DS, name=f"c{c}_done")
            errv = Signal(DS, name=f"c{c}_errv")
            dp = Signal(lD + 1, name=f"c{c}_dp")        # words fetched for delivery
            st.done_set = Signal(DS, name=f"c{c}_done_set")
            st.err_set = Signal(DS, name=f"c{c}_err_set")

            m.submodules[f"c{c}_desc"] = desc = SyncFIFOBuffered(
                width=14 + lw + 1 + lw + port.rd.payload.tag.shape().width, depth=DS)
            # TLPs passed in order, as segments of deliverable words: {end word, error so far}
            m.submodules[f"c{c}_seg"] = segq = SyncFIFOBuffered(width=lD + 2, depth=DS)
            m.submodules[f"c{c}_chunks"] = chunks = Memory(shape=CHUNK, depth=DS, init=[])
            ch_wr = chunks.write_port()
            ch_rd = chunks.read_port(domain="comb")

            # -- accept a request when idle
            req = port.req.payload
            nw_req = Signal(15, name=f"c{c}_nw_req")
            m.d.comb += nw_req.eq((req.len + (W - 1)) >> lw)
            lastn = Signal(lw + 1, name=f"c{c}_lastn")
            m.d.comb += lastn.eq(req.len - ((nw_req - 1) << lw))
            nh_req = Signal(15, name=f"c{c}_nh_req")     # host words the request spans
            m.d.comb += nh_req.eq((req.addr[:lw] + req.len + (W - 1)) >> lw)
            m.d.comb += [
                desc.w_data.eq(Cat(nw_req[:14], lastn, req.addr[:lw], req.tag)),
                desc.w_en.eq(port.req.valid & port.req.ready),
            ]

            # -- the next chunk of the request
            rem = Signal(17, name=f"c{c}_rem")
            to_bnd = Signal(range(MRRS + 1), name=f"c{c}_tobnd")
            clen = Signal(range(MRRS + 1), name=f"c{c}_clen")
            m.d.comb += [
                rem.eq(rlen - off),
                to_bnd.eq(MRRS - s_addr[:exact_log2(MRRS)]),
                clen.eq(Mux(rem < to_bnd, rem, to_bnd)),
            ]
            last = Signal(name=f"c{c}_last")
            m.d.comb += last.eq(rem <= to_bnd)
            e_off = Signal(18, name=f"c{c}_eoff")
            m.d.comb += e_off.eq(off + clen)
            w1 = Signal(16, name=f"c{c}_w1")           # host words of the request filled so far
            m.d.comb += w1.eq((shift0 + e_off + (W - 1)) >> lw)
            res_end = Signal(lD + 1, name=f"c{c}_resend")
            m.d.comb += res_end.eq(base + w1)
            used = Signal(lD + 1, name=f"c{c}_used")
            m.d.comb += used.eq(res_end - dp)
            space_ok = used <= D
            seq_ok = (seq - hseq)[:ls + 1] != DS
            ok = Signal(name=f"c{c}_can")
            m.d.comb += ok.eq(busy & space_ok & seq_ok)
            can.append(ok)
            go = Signal(name=f"c{c}_issue")
            issue.append(go)
            # the TLP ends on an MRRS boundary (a whole host word) or at the request's end
            dend = res_end
            st.tt_data = Signal(TAG_ENTRY, name=f"c{c}_tt")
            m.d.comb += [
                st.tt_data.client.eq(c),
                st.tt_data.seq.eq(seq[:ls]),
                st.tt_data.kbase.eq(base + ((shift0 + off) >> lw)),
                st.tt_data.s_lo.eq(s_addr[:lw]),
            ]
            st.mrd_addr, st.mrd_len, st.after = s_addr, clen, after
            m.d.comb += [ch_wr.addr.eq(seq[:ls]), ch_wr.data.dend.eq(dend),
                         ch_wr.data.last.eq(last), ch_wr.en.eq(go)]
            clr = Signal(DS, name=f"c{c}_clr")
            with m.If(go):
                m.d.comb += clr.eq(1 << seq[:ls])
                m.d.sync += [seq.eq(seq + 1), off.eq(off + clen), s_addr.eq(s_addr + clen)]
                with m.If(last):
                    m.d.sync += busy.eq(0)
            # a request is taken when idle or in the cycle the last TLP of the one before is
            # issued (its registers then override the updates above), so that requests of one
            # TLP each are taken one per cycle (before 2026-12-08: one every two cycles)
            m.d.comb += port.req.ready.eq((~busy | (go & last)) & desc.w_rdy)
            with m.If(port.req.valid & port.req.ready):
                m.d.sync += [busy.eq(1), s_addr.eq(req.addr), off.eq(0), rlen.eq(req.len),
                             base.eq(alloc), alloc.eq(alloc + nh_req), after.eq(self.w_accepted),
                             shift0.eq(req.addr[:lw])]

            # -- passing completed TLPs in order: words become deliverable
            acc_err = Signal(name=f"c{c}_accerr")
            m.d.comb += ch_rd.addr.eq(hseq[:ls])
            head_done = (hseq != seq) & done.bit_select(hseq[:ls], 1)
            head_err = errv.bit_select(hseq[:ls], 1)
            m.d.comb += segq.w_data.eq(Cat(ch_rd.data.dend[:lD + 1], acc_err | head_err))
            pass_ok = head_done & segq.w_rdy
            with m.If(pass_ok):
                m.d.comb += segq.w_en.eq(1)
                m.d.sync += hseq.eq(hseq + 1)
                with m.If(ch_rd.data.last):
                    m.d.sync += acc_err.eq(0)
                with m.Else():
                    m.d.sync += acc_err.eq(acc_err | head_err)
            m.d.sync += [done.eq((done & ~clr) | st.done_set),
                         errv.eq((errv & ~clr) | st.err_set)]

            # -- ring: two banks of D/2 words (even / odd), whole-word writes
            bank = []
            for b in range(2):
                mem = Memory(shape=8 * W, depth=D // 2, init=[])
                m.submodules[f"c{c}_bank{b}"] = mem
                bank.append((mem.write_port(), mem.read_port(domain="sync", transparent_for=())))
            st.bank = bank
            st.lD = lD

            # -- delivery: one client word per cycle, in order, from host words dp and dp + 1
            d_nw = Signal(14, name=f"c{c}_d_nw")
            d_lastn = Signal(lw + 1, name=f"c{c}_d_lastn")
            d_shift = Signal(lw, name=f"c{c}_d_shift")
            d_tag = Signal(port.rd.payload.tag.shape().width, name=f"c{c}_d_tag")
            m.d.comb += Cat(d_nw, d_lastn, d_shift, d_tag).eq(desc.r_data)
            dcount = Signal(14, name=f"c{c}_dcount")
            out_v = Signal(name=f"c{c}_out_v")
            is_last = dcount + 1 == d_nw
            # the client word's bytes run past host word dp into dp + 1
            need2 = Signal(name=f"c{c}_need2")
            m.d.comb += need2.eq(d_shift + Mux(is_last, d_lastn, W) > W)
            # a: the passed segment (TLP) that holds host word dp; the next one is segq's head
            a_v = Signal(name=f"c{c}_a_v")
            a_end = Signal(lD + 1, name=f"c{c}_a_end")
            a_err = Signal(name=f"c{c}_a_err")
            a_left = Signal(lD + 1, name=f"c{c}_a_left")   # host words of a from dp on
            m.d.comb += a_left.eq(a_end - dp)
            in_a = a_v & (a_left > need2)
            in_ab = a_v & need2 & (a_left == 1) & segq.r_rdy
            fetch = Signal(name=f"c{c}_fetch")
            m.d.comb += fetch.eq((in_a | in_ab) & desc.r_rdy & (~out_v | port.rd.ready))
            step = Signal(2, name=f"c{c}_step")           # host words the client word frees
            m.d.comb += step.eq(Mux(is_last, 1 + need2, 1))
            a_done = fetch & (a_left <= step)              # dp leaves segment a
            b_done = fetch & (a_left < step)               # ... and the next one (a request's end)
            with m.If(b_done):
                m.d.comb += segq.r_en.eq(1)
                m.d.sync += a_v.eq(0)
            with m.Elif((~a_v | a_done) & segq.r_rdy):
                m.d.comb += segq.r_en.eq(1)
                m.d.sync += [a_v.eq(1), a_end.eq(segq.r_data[:lD + 1]),
                             a_err.eq(segq.r_data[lD + 1])]
            with m.Elif(a_done):
                m.d.sync += a_v.eq(0)
            sel = Signal(name=f"c{c}_sel")
            o_last = Signal(name=f"c{c}_o_last")
            o_nb = Signal(lw + 1, name=f"c{c}_o_nb")
            o_shift = Signal(lw, name=f"c{c}_o_shift")
            o_tag = Signal.like(d_tag, name=f"c{c}_o_tag")
            o_err = Signal(name=f"c{c}_o_err")
            dp1 = Signal(lD + 1, name=f"c{c}_dp1")
            m.d.comb += dp1.eq(dp + 1)
            # bank 0 holds the even one of dp, dp + 1 and bank 1 the odd one
            m.d.comb += [bank[0][1].addr.eq(dp1[1:lD]), bank[1][1].addr.eq(dp[1:lD]),
                         bank[0][1].en.eq(fetch), bank[1][1].en.eq(fetch)]
            lo_w = Mux(sel, bank[1][1].data, bank[0][1].data)
            hi_w = Mux(sel, bank[0][1].data, bank[1][1].data)
            m.d.comb += [
                port.rd.valid.eq(out_v),
                port.rd.payload.data.eq((Cat(lo_w, hi_w) >> (o_shift << 3))[:8 * W]),
                port.rd.payload.nbytes.eq(o_nb),
                port.rd.payload.last.eq(o_last),
                port.rd.payload.tag.eq(o_tag),
                port.rd.payload.err.eq(o_err),
            ]
            with m.If(fetch):
                m.d.sync += [out_v.eq(1), dp.eq(dp + step), sel.eq(dp[0]), o_last.eq(is_last),
                             o_nb.eq(Mux(is_last, d_lastn, W)), o_tag.eq(d_tag),
                             o_shift.eq(d_shift),
                             # the word's last byte is in the next segment: its status counts
                             o_err.eq(Mux(in_a, a_err, segq.r_data[lD + 1]))]
                with m.If(is_last):
                    m.d.comb += desc.r_en.eq(1)
                    m.d.sync += dcount.eq(0)
                with m.Else():
                    m.d.sync += dcount.eq(dcount + 1)
            with m.Elif(port.rd.ready):
                m.d.sync += out_v.eq(0)

        # ---- issue: one TLP per cycle, round robin over the clients ---------------------
        last_c = Signal(range(max(n, 2)), init=n - 1)
        any_c, pick = round_robin_pick(m, [c & tag_any for c in can], last_c)
        go_any = any_c & mrd_free
        m.d.comb += [tt_wr.addr.eq(tag_pick), tt_wr.en.eq(go_any)]
        with m.Switch(pick):
            for c in range(n):
                with m.Case(c):
                    st = clients[c]
                    m.d.comb += [issue[c].eq(go_any), tt_wr.data.eq(st.tt_data)]
                    with m.If(go_any):
                        m.d.sync += [
                            self.mrd.payload.hdr.kind.eq(TlpKind.MRD),
                            self.mrd.payload.hdr.tag.eq(tag_pick),
                            self.mrd.payload.hdr.addr.eq(st.mrd_addr),
                            self.mrd.payload.hdr.len.eq(st.mrd_len),
                            self.mrd.payload.after.eq(st.after),
                        ]
        with m.If(go_any):
            m.d.comb += free_clr.eq(1 << tag_pick)
            m.d.sync += [mrd_v.eq(1), last_c.eq(pick)]

        # ---- completions: rotate each word into its client's ring -----------------------
        cpl = self.cpl
        hdr = cpl.payload.hdr
        m.d.comb += cpl.ready.eq(1)
        first = Signal(init=1)          # the next beat starts a TLP
        beat = cpl.valid
        with m.If(beat):
            m.d.sync += first.eq(cpl.payload.last)

        tag_ok = Signal()
        m.d.comb += tt_rd.addr.eq(hdr.tag)
        m.d.comb += tag_ok.eq((hdr.tag < NT) & ~free.bit_select(hdr.tag, 1))
        ent = tt_rd.data
        # registered state of the TLP in progress
        r_client = Signal(cb)
        r_seq = Signal(ls)
        r_k = Signal(kbits)
        r_drop = Signal()
        r_last = Signal()
        r_err = Signal()
        r_tag = Signal(8)
        # values for the current beat: it is host word k of the client's ring
        k = Signal(kbits)
        client = Signal(cb)
        cseq = Signal(ls)
        drop = Signal()
        k_first = Signal(kbits)
        m.d.comb += k_first.eq(ent.kbase + ((ent.s_lo + hdr.lo) >> lw))
        with m.If(first):
            m.d.comb += [k.eq(k_first), client.eq(ent.client), cseq.eq(ent.seq),
                         drop.eq(~tag_ok)]
        with m.Else():
            m.d.comb += [k.eq(r_k), client.eq(r_client), cseq.eq(r_seq), drop.eq(r_drop)]
        # a completion without data (a failed TLP) writes nothing
        wr_en = beat & ~drop & ~(first & (hdr.len == 0))
        for c, st in enumerate(clients):
            lD = st.lD
            for b, (wp, _) in enumerate(st.bank):
                m.d.comb += [wp.addr.eq(k[1:lD]), wp.data.eq(cpl.payload.data),
                             wp.en.eq(wr_en & (client == c) & (k[0] == b))]
        with m.If(beat):
            with m.If(first):
                m.d.sync += [r_client.eq(ent.client), r_seq.eq(ent.seq),
                             r_drop.eq(~tag_ok), r_last.eq(hdr.last),
                             r_err.eq(hdr.status != TlpStatus.SC), r_tag.eq(hdr.tag),
                             r_k.eq(k_first + 1)]
            with m.Else():
                m.d.sync += r_k.eq(r_k + 1)
        # the TLP's last beat: a completion marked last ends its tag
        tlp_last = Mux(first, hdr.last, r_last)
        tlp_err = Mux(first, hdr.status != TlpStatus.SC, r_err)
        tlp_tag = Mux(first, hdr.tag, r_tag)
        with m.If(beat & cpl.payload.last):
            with m.If(drop):
                m.d.comb += self.stat_bad.eq(1)
            with m.Elif(tlp_last | tlp_err):
                m.d.comb += free_set.eq(1 << tlp_tag[:max(1, ceil_log2(NT))])
                for c, st in enumerate(clients):
                    with m.If(client == c):
                        m.d.comb += [st.done_set.eq(1 << cseq),
                                     st.err_set.eq(Mux(tlp_err, 1 << cseq, 0))]
        return m
