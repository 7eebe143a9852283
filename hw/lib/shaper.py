"""Credit shaper: lets a stream through at a long-run rate of ``rate`` bytes per cycle.

Models the serialisation of a line (a network link, a PCIe link) whose transfers cost a
known number of bytes each. A credit accumulator in fixed point (:data:`FRAC_BITS`
fractional bits) gains ``rate`` every cycle; a transfer whose ``cost`` (bytes, driven by the
parent as a function of the offered payload) fits in the credit is let through and costs
that much. While nothing is offered the credit is capped at ``max_cost`` (an idle line does
not save up bandwidth); while a transfer waits it may grow to ``max_cost`` plus one cycle's
worth, so that no credit is lost and the long-run rate is exact. The data path is
combinational (no added latency): ``o.valid = i.valid & fits``, ``i.ready = o.ready & fits``.

Parameters: ``shape`` of the payload, ``rate`` in [1/1024, 4096] bytes per cycle (rounded
to a multiple of 2**-16; :attr:`rate_exact` is the rate the hardware uses), ``max_cost`` in
[1, 65535] bytes (the largest cost of one transfer).

Ports: ``i: In(stream(shape))``, ``cost: In(16)`` (bytes of the transfer offered on ``i``),
``o: Out(stream(shape))``.
"""

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from .checks import check_int, check_number

__all__ = ["Shaper", "FRAC_BITS", "fixed_rate"]

#: Fractional bits of the credit accumulator (rate resolution 2**-16 bytes per cycle).
FRAC_BITS = 16
MIN_RATE, MAX_RATE = 1.0 / 1024, 4096.0


def fixed_rate(rate):
    """The fixed-point rate the shaper uses for ``rate`` bytes per cycle."""
    check_number("rate", rate, MIN_RATE, MAX_RATE)
    return max(1, round(rate * (1 << FRAC_BITS)))


class Shaper(wiring.Component):
    def __init__(self, shape, rate, max_cost):
        check_int("max_cost", max_cost, 1, 65535)
        self.rate_fixed = fixed_rate(rate)
        self.rate_exact = self.rate_fixed / (1 << FRAC_BITS)
        self.max_cost = max_cost
        super().__init__({
            "i": In(stream.Signature(shape)),
            "cost": In(16),
            "o": Out(stream.Signature(shape)),
        })

    def elaborate(self, platform):
        m = Module()
        F = FRAC_BITS
        top = self.max_cost << F
        cap_busy = top + self.rate_fixed
        credit = Signal(range(cap_busy + 1), init=top)
        cost = Signal(range(top + 1))
        fits = Signal()
        m.d.comb += [
            cost.eq(self.cost << F),
            fits.eq(credit >= cost),
            self.o.payload.eq(self.i.payload),
            self.o.valid.eq(self.i.valid & fits),
            self.i.ready.eq(self.o.ready & fits),
        ]
        spent = Mux(self.i.valid & self.i.ready, cost, 0)
        after = Signal(range(cap_busy + self.rate_fixed + 1))
        m.d.comb += after.eq(credit - spent + self.rate_fixed)
        cap = Mux(self.i.valid, cap_busy, top)
        m.d.sync += credit.eq(Mux(after > cap, cap, after))
        return m
