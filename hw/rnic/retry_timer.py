"""Per-QP transport timers of the requester: the local ACK timer and the RNR timer.

Models the two timers of an RC requester (InfiniBand Architecture Specification vol. 1
rel. 1.4):

* **Local ACK timeout** (9.7.6.1.3, C9-140/C9-141): while a QP has requests outstanding,
  the time since the last forward progress (an acknowledgement that completed a request,
  or the first request sent into an idle QP, or a retransmission) is measured; after
  ``4.096 us * 2**timeout`` the requester retransmits. ``timeout == 0`` means infinite
  (the timer never expires).
* **RNR timer** (9.7.5.2.8, table 45): after an RNR NAK the requester waits the time coded
  in the NAK's 5-bit timer field, then retransmits. The wait is the table's value rounded up
  to whole ticks plus one tick (the NAK arrives somewhere inside the current tick), so it is
  never shorter than the table's value and at most 2.048 us (plus the scan) longer.

Structure: a free-running time base ``now`` counts ticks of 1.024 us (``tick_cycles`` clock
cycles, so that 4.096 us is exactly 4 ticks and the RNR values are rounded up to whole
ticks). One row per QP (``lib.memory.Memory``) holds the timer's mode (idle, ACK, RNR) and
its deadline in ticks. A scanner visits one QP per cycle (round robin): it starts the ACK
timer of an idle QP that has requests outstanding (``armed``: a combinational answer for
the QP at ``to_index``, like ``to_value``, so that no per-QP mask is built), restarts it on
a ``kick`` (progress), stops it when nothing is outstanding, and reports an expired ACK or
RNR timer on ``expire`` (one pulse, the requester always takes it). A QP is therefore looked
at every ``n_qps`` cycles: the timers are late by at most that many cycles plus one tick
(at 250 MHz: 4 us at 1,024 QPs, 16 us at 4,096; the shortest ACK timeout is 4.096 us, the
shortest RNR wait 10 us), while the hardware is one memory and one comparator
instead of a counter per QP.

``rnr`` (always ready) starts the RNR wait of a QP; it takes the row's write port that cycle
and the scanner waits.

Ports: ``kick: In(stream of {qpn}, always ready).array(2)`` (pulses: restart the ACK timer
of that QP; two ports, the send and the response engine), ``armed: In(1)`` (level: the QP
at ``to_index`` has requests outstanding and may time out),
``rnr: In(stream of {qpn, code})``, ``to_index: Out(qpn_bits)`` / ``to_value: In(5)`` (the
``timeout`` exponent of the QP being scanned: a combinational lookup answered by the
requester), ``expire_valid: Out(1)``, ``expire_qpn: Out(qpn_bits)``, ``expire_rnr: Out(1)``,
``now: Out(TIME_BITS)`` (the time base, for tests).
"""

import math

from amaranth.hdl import Array, Const, Module, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from ..lib.mem_array import MemArray

__all__ = ["RetryTimer", "TICK_NS", "RNR_TIMER_US", "rnr_ticks", "ack_timeout_ticks", "TIME_BITS"]

#: One tick of the time base, in ns (4.096 us = 4 ticks).
TICK_NS = 1024
#: Width of the time base and deadlines (2**36 ticks = 19.5 hours before wrapping).
TIME_BITS = 36

#: RNR NAK timer field -> minimum wait in microseconds (IBA table 45; 0 is the longest).
RNR_TIMER_US = [655360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920,
                2560, 3840, 5120, 7680, 10240, 15360, 20480, 30720, 40960, 61440, 81920,
                122880, 163840, 245760, 327680, 491520]

MODE_IDLE, MODE_ACK, MODE_RNR = 0, 1, 2

TIMER_ROW = data.StructLayout({"mode": 2, "deadline": TIME_BITS})


def rnr_ticks(code):
    """Ticks the requester waits after an RNR NAK with timer field ``code`` (rounded up)."""
    return math.ceil(RNR_TIMER_US[code] * 1000 / TICK_NS)


def ack_timeout_ticks(timeout):
    """Ticks of the local ACK timeout ``4.096 us * 2**timeout`` (``timeout`` in 1..31)."""
    return (4096 // TICK_NS) << timeout


def RnrStart(qpn_bits):
    return stream.Signature(data.StructLayout({"qpn": qpn_bits, "code": 5}), always_ready=True)


class RetryTimer(wiring.Component):
    """Local ACK and RNR timers of ``n_qps`` QPs; ``tick_cycles`` clock cycles per 1.024 us."""

    def __init__(self, n_qps, tick_cycles):
        if (not isinstance(n_qps, int) or isinstance(n_qps, bool) or not 2 <= n_qps <= 65536
                or n_qps & (n_qps - 1)):
            raise ValueError(f"n_qps must be a power of two in [2, 65536], not {n_qps!r}")
        if (not isinstance(tick_cycles, int) or isinstance(tick_cycles, bool)
                or not 1 <= tick_cycles <= 1 << 20):
            raise ValueError(f"tick_cycles must be an integer in [1, {1 << 20}], not {tick_cycles!r}")
        self.n_qps = n_qps
        self.tick_cycles = tick_cycles
        qb = ceil_log2(n_qps)
        self.qpn_bits = qb
        super().__init__({
            "kick": In(stream.Signature(data.StructLayout({"qpn": qb}),
                                        always_ready=True)).array(2),
            "armed": In(1),
            "rnr": In(RnrStart(qb)),
            "to_index": Out(qb),
            "to_value": In(5),
            "expire_valid": Out(1),
            "expire_qpn": Out(qb),
            "expire_rnr": Out(1),
            "now": Out(TIME_BITS),
        })

    def elaborate(self, platform):
        m = Module()
        nq = self.n_qps
        qb = self.qpn_bits

        # ---- time base: one tick per 1.024 us
        pre = Signal(range(self.tick_cycles))
        with m.If(pre == self.tick_cycles - 1):
            m.d.sync += [pre.eq(0), self.now.eq(self.now + 1)]
        with m.Else():
            m.d.sync += pre.eq(pre + 1)
        now = self.now

        m.submodules.rows = rows = Memory(shape=TIMER_ROW, depth=nq, init=[])
        rd = rows.read_port(domain="comb")
        wr = rows.write_port()

        rnr_table = Array(Const(rnr_ticks(c), TIME_BITS) for c in range(32))

        # kicks wait (sticky, one bit per QP in a memory, set and cleared at one index)
        # until their QP is scanned; a kick in the cycle of its QP's scan stays pending
        m.submodules.kick_pend = kick_pend = MemArray(nq, 1, ("clr", "k0", "k1"), ("scan",))
        scan = Signal(qb)
        m.d.comb += [kick_pend.clr.en.eq(~self.rnr.valid), kick_pend.clr.addr.eq(scan),
                     kick_pend.clr.data.eq(0)]
        for k, port in zip(self.kick, (kick_pend.k0, kick_pend.k1)):
            m.d.comb += [port.en.eq(k.valid), port.addr.eq(k.payload.qpn), port.data.eq(1)]
        rd_kick, kicked = kick_pend.read("scan", scan)
        m.d.comb += rd_kick

        m.d.comb += [rd.addr.eq(scan), self.to_index.eq(scan)]
        row = rd.data
        expired = ~(now - row.deadline)[TIME_BITS - 1]
        ack_ticks = Signal(TIME_BITS)
        m.d.comb += ack_ticks.eq(Const(4096 // TICK_NS, TIME_BITS) << self.to_value)
        infinite = self.to_value == 0

        with m.If(self.rnr.valid):
            # an RNR NAK: the row's write port is taken, the scanner waits this cycle
            m.d.comb += [
                wr.addr.eq(self.rnr.payload.qpn),
                wr.data.mode.eq(MODE_RNR),
                # one tick more than the rounded-up table value: the RNR NAK can come at
                # any point of the current tick, and the wait must never be shorter than
                # the table's (IBA table 45)
                wr.data.deadline.eq(now + rnr_table[self.rnr.payload.code] + 1),
                wr.en.eq(1),
            ]
        with m.Else():
            m.d.sync += scan.eq(scan + 1)
            m.d.comb += [wr.addr.eq(scan), wr.data.eq(row)]
            armed = self.armed
            with m.Switch(row.mode):
                with m.Case(MODE_RNR):
                    with m.If(expired):
                        m.d.comb += [wr.data.mode.eq(MODE_IDLE), wr.en.eq(1),
                                     self.expire_valid.eq(1), self.expire_rnr.eq(1)]
                with m.Case(MODE_ACK):
                    with m.If(~armed):
                        m.d.comb += [wr.data.mode.eq(MODE_IDLE), wr.en.eq(1)]
                    with m.Elif(kicked):
                        m.d.comb += [wr.data.deadline.eq(now + ack_ticks), wr.en.eq(1)]
                    with m.Elif(expired & ~infinite):
                        m.d.comb += [wr.data.mode.eq(MODE_IDLE), wr.en.eq(1),
                                     self.expire_valid.eq(1)]
                with m.Default():
                    with m.If(armed):
                        m.d.comb += [wr.data.mode.eq(MODE_ACK),
                                     wr.data.deadline.eq(now + ack_ticks), wr.en.eq(1)]
        m.d.comb += self.expire_qpn.eq(scan)
        return m
