"""Seeded fault injection on a network link, and a frame merger for injected frames.

:class:`FaultInjector` models the faults of a lossy Ethernet fabric carrying RoCEv2
(InfiniBand Architecture Specification vol. 1 rel. 1.4, Annex A17 "RoCEv2": RoCEv2 runs
over ordinary routed UDP/IPv4 Ethernet, which may lose, duplicate or reorder packets; the
RC transport of chapter 9 must recover through PSN checks, NAK sequence errors and
retransmission, 9.7.5 / 9.9). Per frame (a run of beats ending with ``last``) it can

* **drop** it while the link is **down** (``down`` high when the frame starts) or with
  probability ``loss``;
* **corrupt** it with probability ``corrupt``: one bit is flipped in the frame's last beat,
  among its last ``min(nbytes, 8)`` valid bytes. A RoCEv2 frame ends with its 4-byte ICRC
  (no pad after it; the packet's own pad bytes are before it) and is at least 58 bytes
  long, so its last 8 bytes lie in the BTH/payload/pad/ICRC region, which the ICRC covers
  with no masked (variant) field (Annex A17.3.3: the ICRC covers the IP/UDP/BTH headers with
  only TTL/TOS/checksums/resv8a masked, and all of the payload). A CRC-32 detects every
  single-bit error, so the receiver's depacketizer drops the frame as an ICRC mismatch
  (``stat_icrc``, counted as RX_DROP_ICRC);
* **duplicate** it with probability ``dup``: it goes out live and a copy written to the
  frame buffer is sent again right after it (at the next frame boundary);
* **reorder** it with probability ``reorder``: it is written to the frame buffer only and
  held back until ``k`` later frames (``1 <= k <= reorder_window``, drawn per frame) have
  been taken on ``i`` (dropped ones included), or until ``hold_cycles`` cycles passed with
  no beat taken on ``i``; then it is sent at the next frame boundary. So a frame is never
  overtaken by more than ``reorder_window`` later frames, and never stuck.

Corruption, duplication and reordering are drawn independently (a frame may be duplicated
*and* held back: it is then sent twice when released).

**PRNG.** A 32-bit xorshift generator (Marsaglia 2003, shifts 13/17/5). At the first beat
of each frame (one *decision*) it is stepped three times combinationally, ``s1, s2, s3``;
``s1[0:16]`` is compared with ``loss``, ``s1[16:32]`` with ``corrupt``, ``s2[0:16]`` with
``dup``, ``s2[16:32]`` with ``reorder``, ``s3[0:8]`` gives the hold count
``k = 1 + (s3[0:8] * reorder_window >> 8)`` and ``s3[8:14]`` the bit to flip (bits 0-2: bit
in the byte, bits 3-5: byte counted back from the last valid byte, halved while it is not
below ``nbytes``). The state becomes ``s3`` when the first beat is taken. Only decisions
advance it, so the same seed and the same traffic give the same run. While ``seed_load``
is high the state is loaded with ``seed`` (a zero seed loads :data:`ZERO_SEED_STATE`,
since xorshift stays at 0 forever).

**Probabilities** are in units of 1/65536 per frame: an event happens when its 16-bit
random draw is below the setting; ``0xFFFF`` means *always*. **Decision order**: down ->
drop (``n_down``); else loss -> drop (``n_lost``); else, independently, corrupt, dup and
reorder. Dup and reorder need a free slot of the frame buffer (``reorder_window + 1``
slots of ``max_frame_bytes``); without one the frame just passes. A frame longer than
``max_frame_bytes`` is not duplicated or reordered (a dup copy is abandoned; a held frame
is released at once and the rest of it follows live), and not counted in ``n_dup`` /
``n_reordered``, which count completed copies.

**Timing.** With no fault decided the frame goes from ``i`` to ``o`` combinationally (no
added latency, one beat per cycle). The output switches between the live input and replays
from the frame buffer only at frame boundaries; at a boundary a replay that is due goes
first. A frame that waits for the output stalls ``i`` (its decision is kept). Dropped and
held frames are taken at one beat per cycle whatever ``o`` does. Control inputs are read
when a frame's first beat is offered.

Ports: ``i: In(BeatStream(W))``, ``o: Out(BeatStream(W))``; inputs ``seed`` (32),
``seed_load``, ``loss``, ``dup``, ``reorder``, ``corrupt`` (16 each), ``down``; counters
(``Out(32)``, wrapping) ``n_frames`` (frames taken on ``i``), ``n_lost``, ``n_down``,
``n_dup``, ``n_reordered``, ``n_corrupted``.

:class:`FrameMerger` merges ``n`` beat streams into one, round robin, whole frames at a time
(used to inject test frames into a node's receive path).
"""

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import bits_for

from ..lib.arbiter import round_robin_pick
from ..interfaces import BeatStream, beat_layout
from ..lib.encoder import first_set

__all__ = ["FaultInjector", "FrameMerger", "xorshift32", "ZERO_SEED_STATE", "ALWAYS",
           "COUNTERS", "CONTROLS", "CONTROL_WIDTHS", "check_params"]

#: Probability setting meaning "always".
ALWAYS = 0xFFFF
#: PRNG state loaded for a zero seed (and the reset state).
ZERO_SEED_STATE = 0x2545F491

#: Control inputs and their widths, and the counters (``Out(32)``), in port order.
CONTROL_WIDTHS = {"seed": 32, "seed_load": 1, "loss": 16, "dup": 16, "reorder": 16,
                  "corrupt": 16, "down": 1}
CONTROLS = tuple(CONTROL_WIDTHS)
COUNTERS = ("n_frames", "n_lost", "n_down", "n_dup", "n_reordered", "n_corrupted")

_M32 = 0xFFFFFFFF


def xorshift32(x):
    """One step of the generator (Python reference of the RTL)."""
    x ^= (x << 13) & _M32
    x ^= x >> 17
    x ^= (x << 5) & _M32
    return x


def _check_data_bytes(data_bytes):
    if (not isinstance(data_bytes, int) or isinstance(data_bytes, bool)
            or not 8 <= data_bytes <= 64 or data_bytes & (data_bytes - 1)):
        raise ValueError(f"data_bytes must be a power of two in [8, 64], not {data_bytes!r}")


def _check_int(name, value, lo, hi):
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise ValueError(f"{name} must be an integer in [{lo}, {hi}], not {value!r}")


def check_params(data_bytes, max_frame_bytes=4096 + 128, reorder_window=4, hold_cycles=4096):
    """Raise ``ValueError`` naming the first bad :class:`FaultInjector` parameter."""
    _check_data_bytes(data_bytes)
    _check_int("max_frame_bytes", max_frame_bytes, 64, 16384)
    _check_int("reorder_window", reorder_window, 1, 16)
    _check_int("hold_cycles", hold_cycles, 16, 1 << 20)


def _xs(m, x, name):
    a = Signal(32, name=f"{name}_a")
    b = Signal(32, name=f"{name}_b")
    c = Signal(32, name=name)
    m.d.comb += [a.eq(x ^ (x << 13)[:32]), b.eq(a ^ (a >> 17)), c.eq(b ^ (b << 5)[:32])]
    return c



class FaultInjector(wiring.Component):
    """Seeded per-frame loss / down / duplication / reordering / corruption (see module doc).

    Parameters
    ----------
    data_bytes : power of two in [8, 64], bytes per beat.
    max_frame_bytes : integer in [64, 16384], the largest frame that can be duplicated or
        held back (size of one frame-buffer slot).
    reorder_window : integer in [1, 16], most later frames a held frame waits for.
    hold_cycles : integer in [16, 2**20], idle cycles after which held frames are released.
    """

    # slot states
    FREE, WRITING, HELD, READY = range(4)
    # output modes
    IDLE, LIVE, REPLAY = range(3)

    def __init__(self, data_bytes, max_frame_bytes=4096 + 128, reorder_window=4, hold_cycles=4096):
        check_params(data_bytes, max_frame_bytes, reorder_window, hold_cycles)
        self.data_bytes = data_bytes
        self.max_frame_bytes = max_frame_bytes
        self.reorder_window = reorder_window
        self.hold_cycles = hold_cycles
        #: beats per frame-buffer slot and number of slots
        self.slot_beats = -(-max_frame_bytes // data_bytes)
        self.n_slots = reorder_window + 1
        ports = {
            "i": In(BeatStream(data_bytes)),
            "o": Out(BeatStream(data_bytes)),
        }
        for c, width in CONTROL_WIDTHS.items():
            ports[c] = In(width)
        for c in COUNTERS:
            ports[c] = Out(32)
        super().__init__(ports)

    def elaborate(self, platform):
        m = Module()
        W = self.data_bytes
        N = self.n_slots
        S = self.slot_beats
        R = self.reorder_window
        i, o = self.i, self.o

        # ---- PRNG and the decision for a frame starting now ------------------------------
        state = Signal(32, init=ZERO_SEED_STATE)
        s1 = _xs(m, state, "s1")
        s2 = _xs(m, s1, "s2")
        s3 = _xs(m, s2, "s3")

        def hit(r, p):
            return (r < p) | (p == ALWAYS)

        dec_layout = data.StructLayout({
            "down": 1, "lost": 1, "cor": 1, "dup": 1, "hold": 1,
            "slot": range(max(N, 2)), "k": range(R + 1), "bitsel": 6,
        })
        slot_state = [Signal(2, name=f"slot{s}_state") for s in range(N)]
        slot_len = Array(Signal(range(S + 1), name=f"slot{s}_len") for s in range(N))
        slot_cnt = [Signal(range(R + 1), name=f"slot{s}_cnt") for s in range(N)]
        slot_reps = Array(Signal(name=f"slot{s}_reps") for s in range(N))
        slot_spill = Array(Signal(name=f"slot{s}_spill") for s in range(N))

        have_free, free_idx = first_set(m, Cat(*[st == self.FREE for st in slot_state]), "free")
        any_ready, ready_idx = first_set(m, Cat(*[st == self.READY for st in slot_state]), "ready")

        dnew = Signal(dec_layout)
        drop_new = self.down | hit(s1[:16], self.loss)
        m.d.comb += [
            dnew.down.eq(self.down),
            dnew.lost.eq(~self.down & hit(s1[:16], self.loss)),
            dnew.cor.eq(~drop_new & hit(s1[16:], self.corrupt)),
            dnew.dup.eq(~drop_new & have_free & hit(s2[:16], self.dup)),
            dnew.hold.eq(~drop_new & have_free & hit(s2[16:], self.reorder)),
            dnew.slot.eq(free_idx),
            dnew.k.eq(1 + ((s3[:8] * R) >> 8)),
            dnew.bitsel.eq(s3[8:14]),
        ]

        # ---- input side ---------------------------------------------------------------------
        in_mid = Signal()        # beats of a started frame remain
        dlatched = Signal()      # first beat offered but not taken: decision kept in dreg
        dreg = Signal(dec_layout)
        dsel = Signal(dec_layout)
        first = ~in_mid
        m.d.comb += dsel.eq(Mux(in_mid | dlatched, dreg, dnew))

        widx = Signal(range(S + 1))     # beat index in the frame's slot
        copy_ok = Signal()              # mid-frame: still copying into the slot
        spill = Signal()                # mid-frame: held frame too long, rest goes live

        drop = dsel.down | dsel.lost
        copying = Mux(first, dsel.dup | dsel.hold, copy_ok)
        # does the current beat go to o (live)?
        wants_live = ~drop & Mux(first, ~dsel.hold, ~dsel.hold | spill)

        # corruption of the last beat
        nb = i.payload.nbytes
        kb = dsel.bitsel[3:6]
        kbyte = Signal(3)
        with m.If(kb < nb):
            m.d.comb += kbyte.eq(kb)
        with m.Elif((kb >> 1) < nb):
            m.d.comb += kbyte.eq(kb >> 1)
        with m.Elif((kb >> 2) < nb):
            m.d.comb += kbyte.eq(kb >> 2)
        bitpos = Signal(range(8 * W))
        m.d.comb += bitpos.eq(Cat(dsel.bitsel[:3], (nb - 1 - kbyte)[:bits_for(W - 1)]))
        flip = Signal(8 * W)
        with m.If(dsel.cor & i.payload.last & (nb != 0)):
            m.d.comb += flip.eq((Const(1, 8 * W) << bitpos)[:8 * W])
        beat = Signal(beat_layout(W))
        m.d.comb += [beat.eq(i.payload), beat.data.eq(i.payload.data ^ flip)]

        # ---- output side --------------------------------------------------------------------
        mode = Signal(2)
        live_lock = Signal()     # a live first beat is on o and was not taken
        live_sel = Signal()
        m.d.comb += live_sel.eq(
            (mode == self.LIVE)
            | ((mode == self.IDLE) & first & wants_live & (live_lock | ~any_ready)))
        start_replay = Signal()
        m.d.comb += start_replay.eq((mode == self.IDLE) & ~live_lock & any_ready)

        rslot = Signal(range(max(N, 2)))
        fidx = Signal(range(S + 1))      # next beat of the slot to fetch
        rvalid = Signal()                # the read port's data register holds a beat for o
        rfinal = Signal()                # ... and it is the slot's final beat

        m.submodules.buf = buf = Memory(shape=beat_layout(W), depth=N * S, init=[])
        wr = buf.write_port()
        rd = buf.read_port(domain="sync", transparent_for=())

        with m.If(live_sel):
            m.d.comb += [o.valid.eq(i.valid), o.payload.eq(beat)]
        with m.Elif(mode == self.REPLAY):
            m.d.comb += [o.valid.eq(rvalid), o.payload.eq(rd.data)]

        with m.If(drop):
            m.d.comb += i.ready.eq(1)
        with m.Elif(wants_live):
            m.d.comb += i.ready.eq(live_sel & o.ready)
        with m.Else():
            m.d.comb += i.ready.eq(1)          # held frame: into the buffer

        take = i.valid & i.ready
        o_fire = o.valid & o.ready
        m.d.comb += [
            wr.addr.eq(dsel.slot * S + widx),
            wr.data.eq(beat),
            wr.en.eq(take & copying),
        ]

        # ---- PRNG, decision latch, counters -------------------------------------------------
        with m.If(first & i.valid):
            m.d.sync += dreg.eq(dsel)
            with m.If(i.ready):
                m.d.sync += [
                    dlatched.eq(0),
                    state.eq(s3),
                    self.n_frames.eq(self.n_frames + 1),
                    self.n_down.eq(self.n_down + dsel.down),
                    self.n_lost.eq(self.n_lost + dsel.lost),
                    self.n_corrupted.eq(self.n_corrupted + dsel.cor),
                    copy_ok.eq(dsel.dup | dsel.hold),
                ]
            with m.Else():
                m.d.sync += dlatched.eq(1)
        with m.If(self.seed_load):
            m.d.sync += state.eq(Mux(self.seed == 0, ZERO_SEED_STATE, self.seed))

        # ---- input frame progress and slot writes -------------------------------------------
        fend = take & i.payload.last                 # a frame has passed the input
        ovf = take & copying & ~i.payload.last & (widx == S - 1)
        done = take & copying & i.payload.last       # the copy is complete
        with m.If(take):
            m.d.sync += in_mid.eq(~i.payload.last)
            with m.If(i.payload.last):
                m.d.sync += [widx.eq(0), copy_ok.eq(0), spill.eq(0)]
            with m.Elif(copying):
                m.d.sync += widx.eq(widx + 1)
        with m.If(ovf):
            m.d.sync += copy_ok.eq(0)
            with m.If(dsel.hold):
                m.d.sync += spill.eq(1)
        with m.If(done):
            with m.If(dsel.dup):
                m.d.sync += self.n_dup.eq(self.n_dup + 1)
            with m.If(dsel.hold):
                m.d.sync += self.n_reordered.eq(self.n_reordered + 1)

        # idle timer for held frames
        idle = Signal(range(self.hold_cycles + 1))
        timeout = Signal()
        m.d.comb += timeout.eq(idle == self.hold_cycles)
        with m.If(take):
            m.d.sync += idle.eq(0)
        with m.Elif(~timeout):
            m.d.sync += idle.eq(idle + 1)

        # ---- replay from the buffer ---------------------------------------------------------
        can_fetch = Signal()
        m.d.comb += [
            can_fetch.eq((mode == self.REPLAY) & (fidx != slot_len[rslot]) & (~rvalid | o.ready)),
            rd.addr.eq(Mux(mode == self.REPLAY, rslot * S + fidx, ready_idx * S)),
            rd.en.eq(can_fetch | start_replay),
        ]
        replay_end = (mode == self.REPLAY) & o_fire & rfinal

        with m.Switch(mode):
            with m.Case(self.IDLE):
                m.d.sync += live_lock.eq(0)
                with m.If(live_sel & i.valid):
                    with m.If(o.ready):
                        with m.If(~i.payload.last):
                            m.d.sync += mode.eq(self.LIVE)
                    with m.Else():
                        m.d.sync += live_lock.eq(1)
                with m.Elif(start_replay):
                    m.d.sync += [
                        mode.eq(self.REPLAY), rslot.eq(ready_idx), fidx.eq(1),
                        rvalid.eq(1), rfinal.eq(slot_len[ready_idx] == 1),
                    ]
            with m.Case(self.LIVE):
                with m.If(o_fire & i.payload.last):
                    m.d.sync += mode.eq(self.IDLE)
            with m.Case(self.REPLAY):
                with m.If(can_fetch):
                    m.d.sync += [fidx.eq(fidx + 1), rvalid.eq(1),
                                 rfinal.eq(fidx == slot_len[rslot] - 1)]
                with m.Elif(o.ready):
                    m.d.sync += rvalid.eq(0)
                with m.If(replay_end):
                    m.d.sync += mode.eq(Mux(slot_spill[rslot], self.LIVE, self.IDLE))

        # ---- slot state machine -------------------------------------------------------------
        for s in range(N):
            st = slot_state[s]
            mine = dsel.slot == s
            with m.If(take & first & copying & mine):
                m.d.sync += st.eq(self.WRITING)
            with m.If(done & mine):
                m.d.sync += slot_len[s].eq(widx + 1)
                with m.If(dsel.hold):
                    m.d.sync += [st.eq(self.HELD), slot_cnt[s].eq(dsel.k),
                                 slot_reps[s].eq(dsel.dup), slot_spill[s].eq(0)]
                with m.Else():
                    m.d.sync += [st.eq(self.READY), slot_reps[s].eq(0), slot_spill[s].eq(0)]
            with m.If(ovf & mine):
                with m.If(dsel.hold):
                    m.d.sync += [st.eq(self.READY), slot_len[s].eq(S),
                                 slot_reps[s].eq(0), slot_spill[s].eq(1)]
                with m.Else():
                    m.d.sync += st.eq(self.FREE)
            with m.If(st == self.HELD):
                with m.If(timeout | (fend & (slot_cnt[s] == 1))):
                    m.d.sync += st.eq(self.READY)
                with m.Elif(fend):
                    m.d.sync += slot_cnt[s].eq(slot_cnt[s] - 1)
            with m.If(replay_end & (rslot == s)):
                with m.If(slot_reps[s]):
                    m.d.sync += slot_reps[s].eq(0)
                with m.Else():
                    m.d.sync += [st.eq(self.FREE), slot_spill[s].eq(0)]
        return m


class FrameMerger(wiring.Component):
    """Round-robin merge of ``n`` beat streams; a frame (beats up to ``last``) is never split.

    Combinational (no added latency). Once an input's beat has been offered on ``o`` the
    grant stays with that input until its ``last`` beat has been taken.

    Ports: ``i: In(BeatStream(W)).array(n)``, ``o: Out(BeatStream(W))``.
    """

    def __init__(self, data_bytes, n=2):
        _check_data_bytes(data_bytes)
        _check_int("n", n, 1, 16)
        self.data_bytes = data_bytes
        self.n = n
        super().__init__({
            "i": In(BeatStream(data_bytes)).array(n),
            "o": Out(BeatStream(data_bytes)),
        })

    def elaborate(self, platform):
        m = Module()
        n = self.n
        last = Signal(range(max(n, 2)), init=n - 1)
        owner = Signal(range(max(n, 2)))
        locked = Signal()
        _, pick = round_robin_pick(m, [s.valid for s in self.i], last)
        sel = Signal(range(max(n, 2)))
        m.d.comb += sel.eq(Mux(locked, owner, pick))
        with m.Switch(sel):
            for k in range(n):
                with m.Case(k):
                    m.d.comb += [
                        self.o.valid.eq(self.i[k].valid),
                        self.o.payload.eq(self.i[k].payload),
                        self.i[k].ready.eq(self.o.ready),
                    ]
        with m.If(self.o.valid):
            m.d.sync += owner.eq(sel)
            with m.If(self.o.ready & self.o.payload.last):
                m.d.sync += [locked.eq(0), last.eq(sel)]
            with m.Else():
                m.d.sync += locked.eq(1)
        return m
