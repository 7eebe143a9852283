"""Priority encoder: the lowest set bit of a vector, in logarithmic depth.

Schedulers, free-slot finders and event scans all ask the same question of a vector of
request bits: is any set, and which is the lowest? Written as a chain of ``If``s (one per
bit, the last wins), the simulator walks the whole chain every cycle, one comparison per
bit (in the ``connectx6`` system the requester's scans over 64 QPs were among the largest
functions Verilator generated, docs/performance.md, before they became ready queues). :func:`first_set` computes the same
answer as a synthesis tool lays out a priority encoder: isolate the lowest set bit
(``v & -v``, one carry chain) and encode the one-hot result with one OR-reduction per
index bit (``ceil(log2 n)`` masked reductions of the vector, each a few word operations in
a simulator, a tree of LUTs on an FPGA).

``first_set(m, bits, name)`` adds the logic to module ``m`` and returns ``(any, index)``:
``any`` is high when a bit of ``bits`` is set, ``index`` the lowest such bit (0 when none
is). ``bits`` is a value of 1 to 65,536 bits; ``name`` prefixes the signals.
``round_robin_pick(m, requests, last)`` is the round-robin arbiter's choice built from two
of them (the lowest request above the last grant, else the lowest), used by the stream
arbiters. (The requester's send scheduler, which scanned an ``n_qps``-bit vector with it,
is a ready queue since 499c06b: ``hw/lib/ready_queue.py``.)
"""

from amaranth.hdl import Cat, Const, Mux, Signal, Value
from amaranth.utils import ceil_log2

__all__ = ["first_set", "lowest_one_hot", "round_robin_pick"]


def lowest_one_hot(m, bits, name):
    """The lowest set bit of ``bits`` alone (a one-hot value, 0 when none is set)."""
    bits = Value.cast(bits)
    n = len(bits)
    if not 1 <= n <= 1 << 16:
        raise ValueError(f"bits must be 1 to 65536 bits wide, not {n}")
    low = Signal(n, name=f"{name}_low")
    m.d.comb += low.eq(bits & (~bits + 1)[:n])
    return low


def first_set(m, bits, name):
    """``(any, index)`` of the lowest set bit of ``bits`` (module docstring)."""
    low = lowest_one_hot(m, bits, name)
    n = len(low)
    anyb = Signal(name=f"{name}_any")
    idx = Signal(range(max(n, 2)), name=f"{name}_idx")
    m.d.comb += anyb.eq(low.any())
    for b in range(max(1, ceil_log2(n))):
        mask = sum(1 << i for i in range(n) if (i >> b) & 1)
        m.d.comb += idx[b].eq((low & Const(mask, n)).any())
    return anyb, idx


def round_robin_pick(m, requests, last, name="rr"):
    """Round-robin choice among ``requests`` (a value, or a list of 1-bit values): the first
    requesting index after ``last`` (the previous grant), cyclically. Returns
    ``(any, pick)``: the lowest request above ``last`` if there is one, else the lowest."""
    if isinstance(requests, (list, tuple)):
        requests = Cat(*requests)
    req = Value.cast(requests)
    n = len(req)
    if n == 1:
        anyb = Signal(name=f"{name}_any")
        m.d.comb += anyb.eq(req[0])
        return anyb, Const(0, 1)
    # the bits above last: not (one-hot of last, shifted up by one, minus one)
    at_last = (Const(1, 1) << last)[:n]
    upto = Signal(n, name=f"{name}_upto")
    m.d.comb += upto.eq(((at_last << 1) - 1)[:n])
    hi_any, hi_idx = first_set(m, req & ~upto, f"{name}_hi")
    anyb, lo_idx = first_set(m, req, f"{name}_lo")
    pick = Signal(range(max(n, 2)), name=f"{name}_pick")
    m.d.comb += pick.eq(Mux(hi_any, hi_idx, lo_idx))
    return anyb, pick
