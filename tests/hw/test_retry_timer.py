"""RetryTimer: local ACK timeout and RNR waits, checked against their definitions."""

import pytest
from amaranth.sim import Simulator

from hw.rnic.retry_timer import RetryTimer, rnr_ticks, ack_timeout_ticks, RNR_TIMER_US

TICK = 4          # clock cycles per 1.024 us tick in these tests
NQ = 4


def run(script, n_cycles, timeouts=(1, 1, 1, 1)):
    """``script(cycle) -> dict`` of input values for that cycle; returns expiries
    [(cycle, qpn, rnr)]."""
    dut = RetryTimer(NQ, TICK)
    out = []

    async def tb(ctx):
        for cyc in range(n_cycles):
            ins = script(cyc)
            kicks = [q for q in range(NQ) if ins.get("kick", 0) >> q & 1]
            assert len(kicks) <= 2          # two kick ports
            for port, q in zip(dut.kick, kicks + [None, None]):
                ctx.set(port.valid, q is not None)
                ctx.set(port.payload.qpn, q or 0)
            # armed is answered for the QP the timer scans (to_index)
            ctx.set(dut.armed, (ins.get("armed", 0) >> ctx.get(dut.to_index)) & 1)
            rnr = ins.get("rnr")
            ctx.set(dut.rnr.valid, rnr is not None)
            if rnr is not None:
                ctx.set(dut.rnr.payload.qpn, rnr[0])
                ctx.set(dut.rnr.payload.code, rnr[1])
            ctx.set(dut.to_value, timeouts[ctx.get(dut.to_index)])
            if ctx.get(dut.expire_valid):
                out.append((cyc, ctx.get(dut.expire_qpn), ctx.get(dut.expire_rnr)))
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()
    return out


def test_tables():
    assert len(RNR_TIMER_US) == 32 and RNR_TIMER_US[1] == 10 and RNR_TIMER_US[0] == 655360
    assert rnr_ticks(1) == 10 and rnr_ticks(14) == 1250 and rnr_ticks(15) == 1875
    assert ack_timeout_ticks(1) == 8 and ack_timeout_ticks(14) == 4 << 14


def test_ack_timeout_expires_once_per_period_while_armed():
    # QP 1 armed from cycle 10 on, timeout 1 = 8 ticks = 32 cycles
    out = run(lambda c: {"armed": 0b0010 if c >= 10 else 0}, 200)
    ack = [(c, q) for c, q, r in out if not r]
    assert all(q == 1 for _, q in ack)
    period = ack_timeout_ticks(1) * TICK
    assert period <= ack[0][0] - 10 <= period + TICK + NQ + 1
    # it restarts by itself while the QP stays armed
    assert len(ack) >= 3
    for (a, _), (b, _) in zip(ack, ack[1:]):
        assert period - TICK <= b - a <= period + TICK + 2 * NQ


def test_kicks_postpone_and_disarm_stops():
    # kicked every 20 cycles: never expires; then unarmed: never expires
    out = run(lambda c: {"armed": 0b0001 if c < 300 else 0, "kick": 1 if c % 20 == 0 else 0}, 600)
    assert out == []
    # the last kick at cycle 280, still armed: expires about one period later
    out = run(lambda c: {"armed": 0b0001, "kick": 1 if c < 300 and c % 20 == 0 else 0}, 400)
    assert out and 280 + 32 - TICK - NQ <= out[0][0] <= 280 + 32 + TICK + 2 * NQ


def test_timeout_zero_is_infinite():
    assert run(lambda c: {"armed": 0b1111}, 400, timeouts=(0, 0, 0, 0)) == []


def test_rnr_wait():
    # RNR NAK for QP 2 at cycle 50 with code 1 (10 us = 10 ticks = 40 cycles); QP 2 is armed
    # but its ACK timer does not run during the wait
    out = run(lambda c: {"armed": 0b0100, "rnr": (2, 1) if c == 50 else None}, 130,
              timeouts=(1, 1, 5, 1))
    assert [(q, r) for _, q, r in out] == [(2, 1)]
    assert 50 + 40 <= out[0][0] <= 50 + 40 + 2 * TICK + NQ + 1


@pytest.mark.parametrize("code", [1, 2, 5, 14])
def test_rnr_wait_never_shorter_than_the_table(code):
    """IBA table 45 gives the minimum wait: from every phase of the 1.024 us tick, the wait
    is at least the table's value (one cycle is 1.024 us / TICK) and at most two ticks (and
    one scan of the QPs) longer. Before the fix an RNR NAK late in a tick waited up to one
    tick less than the table's value."""
    cycle_us = 1.024 / TICK
    need = RNR_TIMER_US[code] / cycle_us
    span = rnr_ticks(code) * TICK
    for phase in range(TICK):
        start = 50 + phase
        out = run(lambda c: {"rnr": (1, code) if c == start else None}, start + span + 40)
        assert [(q, r) for _, q, r in out] == [(1, 1)], phase
        wait = out[0][0] - start
        assert need <= wait <= need + 2 * TICK + NQ + 1, (phase, wait, need)


def test_bad_parameters():
    with pytest.raises(ValueError, match=r"n_qps must be a power of two in \[2, 65536\], not 3"):
        RetryTimer(3, 4)
    with pytest.raises(ValueError, match=r"tick_cycles must be an integer in \[1, 1048576\], not 0"):
        RetryTimer(4, 0)
