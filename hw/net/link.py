"""One direction of a network link between two RNIC ports: latency and serialisation only.

There is no switch model: no switch queues, no contention of several senders for one
output port, no congestion, PFC or ECN; a fixed latency stands for the cable and whatever
lies between the two ports.

Models the physical path that carries RoCEv2 frames (InfiniBand Architecture Specification
vol. 1 rel. 1.4, Annex A17 "RoCEv2": RoCEv2 packets are ordinary UDP/IPv4 Ethernet frames)
from one node's ``tx`` to the other node's ``rx``. Two effects are modelled:

* **Serialisation** at ``bytes_per_cycle`` (any positive rate, also fractional or above the
  beat width): a credit accumulator in fixed point (:data:`FRAC_BITS` fractional bits) gains
  ``bytes_per_cycle`` every cycle; a beat of ``n`` bytes is accepted only when at least ``n``
  bytes of credit are available and then costs ``n``. While no beat is offered the credit is
  capped at one beat (an idle line does not save up bandwidth); while beats are offered it may
  grow to one beat plus one cycle's worth, so that no credit is lost and the long-run rate is
  exact.
* **Latency**: a beat accepted at cycle ``t`` becomes visible on ``o`` at cycle
  ``t + latency_cycles`` at the earliest (exactly then if the output is not back-pressured and
  ``latency_cycles >= MIN_LATENCY``; smaller values give ``MIN_LATENCY``). Beats wait in a
  FIFO (``lib.memory.Memory``) next to their due time stamp, kept in a second memory. A
  "due pointer" walks the FIFO and checks one time stamp per cycle with a wrap-safe (modular,
  signed) comparison; since the pending entry it looks at is never more than
  ``latency_cycles`` in the future, a stalled output cannot make a stamp wrap.

(The shaper and the delay line are :class:`hw.lib.shaper.Shaper` and
:class:`hw.lib.delay.DelayLine`, shared with the PCIe link model.) When the FIFO is full the
link back-pressures ``i``. Between the shaper and the delay line
the frames pass through :meth:`Link.fault_stage`: with ``faults=True`` a seeded
:class:`~hw.net.fault.FaultInjector` (loss, link down, duplication, reordering within a window,
single-bit corruption caught by the receiver's ICRC check), otherwise nothing. With its
controls at 0 the injector is a combinational pass-through and the link never drops or
reorders beats.
A dropped frame has still used the line (it is lost after serialisation); a duplicate is
not charged serialisation time.

Ports: ``i: In(BeatStream(W))``, ``o: Out(BeatStream(W))``, ``frames: Out(32)`` (frames
delivered on ``o``, counting beats with ``last``); with ``faults=True``, the injector's
controls ``fault_seed: In(32)``, ``fault_seed_load: In(1)``, ``fault_loss``, ``fault_dup``,
``fault_reorder``, ``fault_corrupt: In(16)``, ``fault_down: In(1)`` and counters
``fault_n_frames``, ``fault_n_lost``, ``fault_n_down``, ``fault_n_dup``,
``fault_n_reordered``, ``fault_n_corrupted: Out(32)`` (see :mod:`hw.net.fault`).
"""

import math

from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from .fault import CONTROL_WIDTHS, CONTROLS, COUNTERS, FaultInjector, check_params
from ..interfaces import BeatStream, beat_layout
from ..lib.delay import DelayLine
from ..lib.shaper import FRAC_BITS, Shaper

__all__ = ["Link", "link_params", "FRAC_BITS"]

_MAX_LATENCY = 1 << 24
_MIN_RATE, _MAX_RATE = 1.0 / 1024, 4096.0


def _check_int(name, value, lo, hi):
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise ValueError(f"{name} must be an integer in [{lo}, {hi}], not {value!r}")


def link_params(cfg):
    """Constructor arguments of :class:`Link` for a :class:`hw.config.SystemConfig`."""
    nic = cfg.nic
    bytes_per_cycle = cfg.link.gbps * 1e9 / 8 / (nic.clock_mhz * 1e6)
    return dict(data_bytes=nic.data_bytes,
                latency_cycles=min(nic.cycles(cfg.link.latency_ns), _MAX_LATENCY),
                bytes_per_cycle=min(max(bytes_per_cycle, _MIN_RATE), _MAX_RATE))


class Link(wiring.Component):
    """One link direction: serialisation at ``bytes_per_cycle`` plus ``latency_cycles`` delay.

    Parameters
    ----------
    data_bytes : power of two in [8, 64], bytes per beat.
    latency_cycles : integer in [0, 2**24].
    bytes_per_cycle : number in [1/1024, 4096]; rounded to a multiple of 2**-16.
    fifo_beats : power of two in [4, 65536]; default holds one bandwidth-delay product.
    faults : bool, include the fault injector and its ``fault_*`` ports (default False: a
        plain delay line, as the NIC's internal pipeline delays use it; the links of
        :class:`hw.system.TwoNodeSystem` have it).
    max_frame_bytes, reorder_window, hold_cycles : of the :class:`~hw.net.fault.FaultInjector`.
    """

    #: Smallest delay from input transfer to output valid (the pipeline of the delay line).
    MIN_LATENCY = 3

    def __init__(self, data_bytes, latency_cycles, bytes_per_cycle, fifo_beats=None, *,
                 faults=False, max_frame_bytes=4096 + 128, reorder_window=4, hold_cycles=4096):
        if (not isinstance(data_bytes, int) or isinstance(data_bytes, bool)
                or not 8 <= data_bytes <= 64 or data_bytes & (data_bytes - 1)):
            raise ValueError(f"data_bytes must be a power of two in [8, 64], not {data_bytes!r}")
        _check_int("latency_cycles", latency_cycles, 0, _MAX_LATENCY)
        if (not isinstance(bytes_per_cycle, (int, float)) or isinstance(bytes_per_cycle, bool)
                or not _MIN_RATE <= bytes_per_cycle <= _MAX_RATE):
            raise ValueError(f"bytes_per_cycle must be a number in [{_MIN_RATE}, {_MAX_RATE}], "
                             f"not {bytes_per_cycle!r}")
        if fifo_beats is None:
            in_flight = math.ceil(latency_cycles * min(bytes_per_cycle, data_bytes) / data_bytes)
            fifo_beats = 1 << ceil_log2(max(4, in_flight + 4))
            fifo_beats = min(fifo_beats, 1 << 16)
        if (not isinstance(fifo_beats, int) or isinstance(fifo_beats, bool)
                or not 4 <= fifo_beats <= 1 << 16 or fifo_beats & (fifo_beats - 1)):
            raise ValueError(f"fifo_beats must be a power of two in [4, 65536], not {fifo_beats!r}")

        if not isinstance(faults, bool):
            raise ValueError(f"faults must be True or False, not {faults!r}")
        self.faults = faults
        self.fault_params = dict(max_frame_bytes=max_frame_bytes, reorder_window=reorder_window,
                                 hold_cycles=hold_cycles)
        check_params(data_bytes, **self.fault_params)     # ValueError names the parameter

        self.data_bytes = data_bytes
        self.latency_cycles = latency_cycles
        self.effective_latency = max(latency_cycles, self.MIN_LATENCY)
        self.rate_fixed = max(1, round(bytes_per_cycle * (1 << FRAC_BITS)))
        #: The rate the hardware really uses (after rounding to the fixed-point grid).
        self.bytes_per_cycle = self.rate_fixed / (1 << FRAC_BITS)
        self.fifo_beats = fifo_beats

        ports = {
            "i": In(BeatStream(data_bytes)),
            "o": Out(BeatStream(data_bytes)),
            "frames": Out(32),
        }
        if faults:
            for name, width in CONTROL_WIDTHS.items():
                ports[f"fault_{name}"] = In(width)
            for name in COUNTERS:
                ports[f"fault_{name}"] = Out(32)
        super().__init__(ports)

    def fault_stage(self, m, beats):
        """Between the shaper and the delay line: returns the stream to delay.

        Builds a :class:`~hw.net.fault.FaultInjector` (submodule ``fault``) on ``beats`` and wires
        its controls and counters to the ``fault_*`` ports; with ``faults=False`` returns
        ``beats`` unchanged.
        """
        if not self.faults:
            return beats
        m.submodules.fault = fi = FaultInjector(self.data_bytes, **self.fault_params)
        wiring.connect(m, beats, fi.i)
        for name in CONTROLS:
            m.d.comb += getattr(fi, name).eq(getattr(self, f"fault_{name}"))
        for name in COUNTERS:
            m.d.comb += getattr(self, f"fault_{name}").eq(getattr(fi, name))
        return fi.o

    def elaborate(self, platform):
        m = Module()
        W = self.data_bytes
        # ---- serialisation (credit shaper), faults, latency (time-stamped FIFO) ------------
        m.submodules.shaper = shaper = Shaper(beat_layout(W), self.bytes_per_cycle, W)
        m.d.comb += shaper.cost.eq(self.i.payload.nbytes)
        wiring.connect(m, wiring.flipped(self.i), shaper.i)
        beats = self.fault_stage(m, shaper.o)
        m.submodules.delay = delay = DelayLine(beat_layout(W), self.latency_cycles, self.fifo_beats)
        wiring.connect(m, beats, delay.i)
        wiring.connect(m, delay.o, wiring.flipped(self.o))
        with m.If(self.o.valid & self.o.ready & self.o.payload.last):
            m.d.sync += self.frames.eq(self.frames + 1)
        return m
