"""An N-port Ethernet switch for RoCEv2 frames: forwarding table, per-output queues of a
configured size, lossless (back-pressure) or drop-tail, wire overhead, forwarding latency.

Models the top-of-rack switch between the nodes of SMART's and ODRP's testbeds (issue 9,
docs/switch.md). RoCEv2 frames are Ethernet frames (InfiniBand Architecture Specification
vol. 1 rel. 1.4, Annex A17); the switch forwards them by destination MAC address, as a
layer-2 switch does (IEEE 802.1Q, 8.6: the filtering database):

* **Forwarding**: the first beat of a frame holds its destination MAC (bytes 0..5). The
  model's MACs are ``02:00:00:00:00:<node>`` (hw/net/packetizer.py); a table of 256 entries,
  indexed by the last byte and written by the harness (``tbl_*``), names the output port. A
  frame with another MAC prefix or an invalid entry is dropped at its input and counted
  (``n_unroutable`` of that input).
* **Queues**: each output has a buffer of ``queue_bytes`` in cells of ``data_bytes`` (a frame
  of n bytes takes ceil(n / data_bytes) cells, as switch ASICs allocate cells), shared by
  the frames of every input bound for it. Frames are stored and forwarded: a frame leaves
  only once all of it has arrived (hw/lib/frame_fifo.py, one queue per input and output, so
  that no input blocks another: every input may write a beat into a different or the same
  output in every cycle, up to N beats a cycle into one output's buffer).
* **Lossless** (``lossless=True``, as InfiniBand's credits or Ethernet PFC give): a frame's
  first beat enters only when its output has room for a frame of ``max_frame_bytes`` (the
  room is reserved; what the frame does not use is given back at its end: the headroom a
  PFC threshold keeps); otherwise the input is back-pressured, and so is the link in front
  of it. No frame is ever dropped. One new frame per output and cycle is admitted, the inputs
  taken round robin.
* **Drop-tail** (``lossless=False``): a beat enters if its output has a free cell; when
  fewer cells are free than there are inputs, only one input per cycle (round robin) may
  write to that output. A frame one of whose beats finds no room is dropped whole (the beats
  already written are taken back, the rest is discarded as it arrives) and counted
  (``n_drops`` of the output). Inputs are never back-pressured.
* **Output**: the frames of an output's queues leave in round robin over the inputs, one
  whole frame at a time, serialised at ``bytes_per_cycle`` with ``wire_bytes`` more per frame
  (preamble, start delimiter, inter-frame gap and FCS: 8 + 12 + 4 = 24 B on Ethernet, which
  the model's frames do not carry), then delayed by ``latency_cycles`` (the switching
  latency; hw/lib/delay.py).

Counters per port: ``n_frames`` / ``n_bytes`` (frames and frame bytes that left the
output), ``n_drops`` (frames dropped for the output), ``max_bytes`` (the highest number of
bytes held in the output's queues, in cells of ``data_bytes``), ``n_unroutable`` (frames
that arrived on the input with no route).

Parameters: ``n_ports`` (2 .. 16), ``data_bytes`` (a power of two in [8, 64]),
``queue_bytes`` (per output, in [``max_frame_bytes``, 2**24]), ``bytes_per_cycle`` (the port
rate, in [1/1024, 4096]), ``latency_cycles`` (in [0, 2**24]), ``wire_bytes`` (in [0, 64]),
``lossless`` (bool), ``max_frame_bytes`` (in [64, 16384]), ``routes`` (the table's contents
at reset: ``{last MAC byte: output port}``).

Ports: ``i``: ``In(BeatStream(W)).array(n)``, ``o``: ``Out(BeatStream(W)).array(n)``;
``tbl_en``, ``tbl_mac`` (8 bits), ``tbl_port`` (4 bits), ``tbl_valid``: a table write;
the counters above, ``Out(32)`` each, as arrays of ``n``.
"""

import math

from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import bits_for, ceil_log2

from ..interfaces import BeatStream, beat_layout
from ..lib.checks import check_int, check_number, check_pow2
from ..lib.delay import DelayLine
from ..lib.frame_fifo import FrameFifo
from ..lib.shaper import Shaper

__all__ = ["Switch", "MAC_PREFIX"]

#: The first five bytes of every MAC address of the model (locally administered, unicast).
MAC_PREFIX = 0x02
ROUTE = data.StructLayout({"port": 4, "valid": 1})
COUNTERS = ("n_frames", "n_bytes", "n_drops", "max_bytes", "n_unroutable")


def _rr_pick(m, valid, last, n, name):
    """Round robin: the first index after ``last`` whose ``valid`` bit is set (``any``, ``idx``)."""
    idx = Signal(range(n), name=f"{name}_idx")
    any_ = Signal(name=f"{name}_any")
    m.d.comb += any_.eq(valid != 0)
    # lowest index above last first, then the lowest at all: later assignments win
    for j in reversed(range(n)):
        with m.If(valid[j]):
            m.d.comb += idx.eq(j)
    for j in reversed(range(n)):
        with m.If(valid[j] & (j > last)):
            m.d.comb += idx.eq(j)
    return any_, idx


class Switch(wiring.Component):
    def __init__(self, n_ports, data_bytes, *, queue_bytes, bytes_per_cycle, latency_cycles,
                 wire_bytes=24, lossless=True, max_frame_bytes=4096 + 128, routes=None):
        check_int("n_ports", n_ports, 2, 16)
        check_pow2("data_bytes", data_bytes, 8, 64)
        check_int("max_frame_bytes", max_frame_bytes, 64, 16384)
        check_int("queue_bytes", queue_bytes, max_frame_bytes, 1 << 24)
        check_number("bytes_per_cycle", bytes_per_cycle, 1.0 / 1024, 4096.0)
        check_int("latency_cycles", latency_cycles, 0, 1 << 24)
        check_int("wire_bytes", wire_bytes, 0, 64)
        if not isinstance(lossless, bool):
            raise ValueError(f"lossless must be True or False, not {lossless!r}")
        self.n = n_ports
        self.data_bytes = W = data_bytes
        self.cells = math.ceil(queue_bytes / W)            # per output
        self.frame_cells = math.ceil(max_frame_bytes / W)
        self.queue_bytes = queue_bytes
        self.bytes_per_cycle = bytes_per_cycle
        self.latency_cycles = latency_cycles
        self.wire_bytes = wire_bytes
        self.lossless = lossless
        routes = {} if routes is None else dict(routes)
        for mac, port in routes.items():
            check_int("routes key (the MAC's last byte)", mac, 0, 255)
            check_int(f"routes[{mac}] (an output port)", port, 0, n_ports - 1)
        self.routes = routes
        ports = {
            "i": In(BeatStream(W)).array(n_ports),
            "o": Out(BeatStream(W)).array(n_ports),
            "tbl_en": In(1), "tbl_mac": In(8), "tbl_port": In(4), "tbl_valid": In(1),
        }
        for c in COUNTERS:
            ports[c] = Out(32).array(n_ports)
        super().__init__(ports)

    def elaborate(self, platform):
        m = Module()
        n, W = self.n, self.data_bytes
        cells, fc = self.cells, self.frame_cells
        depth = 1 << ceil_log2(max(2, cells))
        cw = bits_for(cells + (fc + 1) * n)

        init = [{"port": self.routes.get(a, 0), "valid": int(a in self.routes)}
                for a in range(256)]
        m.submodules.table = table = Memory(shape=ROUTE, depth=256, init=init)
        tw = table.write_port()
        m.d.comb += [tw.addr.eq(self.tbl_mac), tw.data.port.eq(self.tbl_port),
                     tw.data.valid.eq(self.tbl_valid), tw.en.eq(self.tbl_en)]

        q = [[FrameFifo(W, depth) for p in range(n)] for k in range(n)]  # input k, output p
        for k in range(n):
            for p in range(n):
                m.submodules[f"q{k}_{p}"] = q[k][p]
        used = [Signal(cw, name=f"used{p}") for p in range(n)]    # cells held or reserved
        free = [Signal(cw, name=f"free{p}") for p in range(n)]
        for p in range(n):
            m.d.comb += free[p].eq(Mux(used[p] >= cells, 0, cells - used[p]))
        inc = [[Signal(cw, name=f"inc{k}_{p}") for p in range(n)] for k in range(n)]
        dec = [[Signal(cw, name=f"dec{k}_{p}") for p in range(n)] for k in range(n)]
        rd = [Signal(name=f"rd{p}") for p in range(n)]
        drops = [[Signal(name=f"drop{k}_{p}") for p in range(n)] for k in range(n)]

        # ---- inputs: route, then admission per output --------------------------------
        want = [[Signal(name=f"want{k}_{p}") for p in range(n)] for k in range(n)]
        firstw = [[Signal(name=f"firstw{k}_{p}") for p in range(n)] for k in range(n)]
        grant = [[Signal(name=f"grant{k}_{p}") for p in range(n)] for k in range(n)]
        st = []
        for k in range(n):
            i = self.i[k]
            mid = Signal(name=f"mid{k}")               # inside a frame
            port = Signal(4, name=f"port{k}")          # the frame's output
            dropping = Signal(name=f"dropping{k}")     # the rest of the frame is discarded
            written = Signal(cw, name=f"written{k}")   # cells of the frame written so far
            look = table.read_port(domain="comb")
            mac = i.payload.data[:48]
            routable = Signal(name=f"routable{k}")
            m.d.comb += [look.addr.eq(mac[40:48]),
                         routable.eq((mac[:40] == MAC_PREFIX) & look.data.valid
                                     & (look.data.port < n))]
            target = Mux(mid, port, look.data.port)
            first = i.valid & ~mid
            for p in range(n):
                m.d.comb += [want[k][p].eq(i.valid & ~dropping & (mid | routable)
                                           & (target == p)),
                             firstw[k][p].eq(first & routable & (look.data.port == p))]
            st.append((i, mid, port, dropping, written, routable, target, first, look))

        for p in range(n):
            rr = Signal(range(n), name=f"adm_rr{p}")
            if self.lossless:
                # one new frame per cycle and output, when a whole frame's room is free
                any_, idx = _rr_pick(m, Cat(*[firstw[k][p] for k in range(n)]), rr, n,
                                     f"adm{p}")
                room = free[p] >= fc
                for k in range(n):
                    m.d.comb += grant[k][p].eq(Mux(firstw[k][p], room & (idx == k), want[k][p]))
                with m.If(any_ & room):
                    m.d.sync += rr.eq(idx)
            else:
                # every beat while a cell is free for each input; else one input (round robin)
                any_, idx = _rr_pick(m, Cat(*[want[k][p] for k in range(n)]), rr, n, f"adm{p}")
                for k in range(n):
                    m.d.comb += grant[k][p].eq(want[k][p] & ((free[p] >= n)
                                                             | ((free[p] != 0) & (idx == k))))
                with m.If(any_ & (free[p] < n)):
                    m.d.sync += rr.eq(idx)

        for k, (i, mid, port, dropping, written, routable, target, first, look) in enumerate(st):
            ok = Signal(name=f"ok{k}")                 # the offered beat is written
            refused = Signal(name=f"refused{k}")       # drop-tail: no room for it
            last = i.payload.last
            m.d.comb += ok.eq(Cat(*[grant[k][p] for p in range(n)]) != 0)
            if self.lossless:
                m.d.comb += i.ready.eq(ok | dropping | (first & ~routable))
            else:
                m.d.comb += [i.ready.eq(1),
                             refused.eq(i.valid & ~dropping & (mid | routable) & ~ok)]
            xfer = i.valid & i.ready
            after = Mux(first, 1, written + 1)         # cells of the frame with this beat
            for p in range(n):
                here = target == p
                m.d.comb += [q[k][p].i.payload.eq(i.payload), q[k][p].i.valid.eq(grant[k][p]),
                             q[k][p].abort.eq(refused & here)]
                if self.lossless:
                    # a frame's whole room reserved with its first beat, what it did not use
                    # given back with its last (a longer frame takes a cell a beat beyond it)
                    m.d.comb += [
                        inc[k][p].eq(Mux(grant[k][p], Mux(first, fc, written >= fc), 0)),
                        dec[k][p].eq(Mux(grant[k][p] & last & (after < fc), fc - after, 0)),
                    ]
                else:
                    m.d.comb += [inc[k][p].eq(grant[k][p]),
                                 dec[k][p].eq(Mux(refused & here & mid, written, 0)),
                                 drops[k][p].eq(refused & here)]
            with m.If(xfer):
                m.d.sync += mid.eq(~last)
                with m.If(first):
                    m.d.sync += port.eq(look.data.port)
                with m.If(ok):
                    m.d.sync += written.eq(after)
                with m.If(refused | (first & ~routable)):
                    m.d.sync += [dropping.eq(~last), written.eq(0)]
                with m.If(last):
                    m.d.sync += dropping.eq(0)
            with m.If(xfer & first & ~routable):
                m.d.sync += self.n_unroutable[k].eq(self.n_unroutable[k] + 1)

        # ---- outputs: whole frames round robin, serialisation, latency ------------------
        in_flight = math.ceil(self.latency_cycles * min(self.bytes_per_cycle, W) / W)
        dl_depth = min(1 << ceil_log2(max(4, in_flight + 4)), 1 << 16)
        for p in range(n):
            busy = Signal(name=f"busy{p}")
            cur = Signal(range(n), name=f"cur{p}")
            lastg = Signal(range(n), name=f"lastg{p}")
            any_, pick = _rr_pick(m, Cat(*[q[k][p].o.valid for k in range(n)]), lastg, n,
                                  f"out{p}")
            sel = Mux(busy, cur, pick)
            shaper = Shaper(beat_layout(W), self.bytes_per_cycle, W + self.wire_bytes)
            delay = DelayLine(beat_layout(W), self.latency_cycles, dl_depth)
            m.submodules[f"shaper{p}"] = shaper
            m.submodules[f"delay{p}"] = delay
            with m.Switch(sel):
                for k in range(n):
                    with m.Case(k):
                        m.d.comb += [shaper.i.valid.eq(q[k][p].o.valid & (busy | any_)),
                                     shaper.i.payload.eq(q[k][p].o.payload),
                                     q[k][p].o.ready.eq(shaper.i.ready & (busy | any_))]
            beat = shaper.i.payload
            m.d.comb += [shaper.cost.eq(beat.nbytes + Mux(beat.last, self.wire_bytes, 0)),
                         rd[p].eq(shaper.i.valid & shaper.i.ready)]
            with m.If(rd[p]):
                m.d.sync += [busy.eq(~beat.last), cur.eq(sel)]
                with m.If(beat.last):
                    m.d.sync += lastg.eq(sel)
            wiring.connect(m, shaper.o, delay.i)
            wiring.connect(m, delay.o, wiring.flipped(self.o[p]))
            o = self.o[p]
            with m.If(o.valid & o.ready):
                m.d.sync += [self.n_bytes[p].eq(self.n_bytes[p] + o.payload.nbytes),
                             self.n_frames[p].eq(self.n_frames[p] + o.payload.last)]
            # occupancy: cells held or reserved; the highest number of bytes held
            m.d.sync += used[p].eq(used[p] + sum(inc[k][p] for k in range(n))
                                   - sum(dec[k][p] for k in range(n)) - rd[p])
            held = Signal(cw, name=f"held{p}")
            m.d.comb += held.eq(sum(q[k][p].level for k in range(n)))
            with m.If(held * W > self.max_bytes[p]):
                m.d.sync += self.max_bytes[p].eq(held * W)
            if not self.lossless:
                m.d.sync += self.n_drops[p].eq(self.n_drops[p]
                                               + sum(drops[k][p] for k in range(n)))
        return m
