"""Table of keys in flight: at most one operation per key, several keys at once.

The serialisation point of a read-modify-write engine that keeps several operations in
flight (issue 8: the atomic unit serialises per address instead of one operation at a time
for the whole NIC; IBA vol. 1 9.4.5 requires atomics on one address to appear in some
sequential order). An operation *claims* its key (for example the 8-byte-aligned address of
an atomic) before it reads, and *releases* it once its write has been answered; a claim of a
key that is in flight waits, claims of other keys go on while a slot is free.

A small CAM of ``entries`` registers (valid bit and key per slot): ``entries`` is the number
of operations in flight, a handful, so a register compare per slot is the right structure.

* ``claim`` is ready when no slot holds its key and a slot is free; the slot given is
  ``claim_slot`` (the lowest free one) in the cycle of the transfer.
* ``release`` (always ready) frees a slot; a claim in the same cycle already sees the slot
  free and the key gone.
* Counters: ``conflict_waits`` (cycles a claim waited because its key was in flight) and
  ``full_waits`` (cycles it waited for a free slot).

Parameters: ``key_bits`` in [1, 64], ``entries`` in [1, 64].

Ports: ``claim: In(stream of {key})``, ``claim_slot: Out(range(entries))``, ``release:
In(stream of {slot}, always ready)``, ``used: Out(range(entries + 1))``,
``conflict_waits``, ``full_waits``: ``Out(32)``.
"""

from amaranth.hdl import Cat, Module, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from .checks import check_int
from .encoder import first_set

__all__ = ["InflightTable"]


class InflightTable(wiring.Component):
    def __init__(self, key_bits, entries):
        check_int("key_bits", key_bits, 1, 64)
        check_int("entries", entries, 1, 64)
        self.key_bits, self.entries = key_bits, entries
        slot_bits = max(ceil_log2(entries), 1)
        super().__init__({
            "claim": In(stream.Signature(data.StructLayout({"key": key_bits}))),
            "claim_slot": Out(slot_bits),
            "release": In(stream.Signature(data.StructLayout({"slot": slot_bits}),
                                           always_ready=True)),
            "used": Out(range(entries + 1)),
            "conflict_waits": Out(32),
            "full_waits": Out(32),
        })

    def elaborate(self, platform):
        m = Module()
        n = self.entries
        valid = Signal(n)
        keys = [Signal(self.key_bits, name=f"key{i}") for i in range(n)]

        freeing = Signal(n)             # the slot released this cycle
        for i in range(n):
            m.d.comb += freeing[i].eq(self.release.valid & (self.release.payload.slot == i))
        live = Signal(n)                # held after this cycle's release
        m.d.comb += live.eq(valid & ~freeing)

        match = Signal(n)
        m.d.comb += match.eq(Cat(*[live[i] & (keys[i] == self.claim.payload.key)
                                   for i in range(n)]))
        free_any, free_slot = first_set(m, ~live, "free")
        m.d.comb += self.claim_slot.eq(free_slot)

        m.d.comb += self.claim.ready.eq(~match.any() & free_any)
        take = self.claim.valid & self.claim.ready
        grant = Signal(n)
        for i in range(n):
            m.d.comb += grant[i].eq(take & (self.claim_slot == i))
            with m.If(grant[i]):
                m.d.sync += keys[i].eq(self.claim.payload.key)
        m.d.sync += valid.eq(live | grant)

        count = 0
        for i in range(n):
            count = count + (live[i] | grant[i])
        m.d.sync += self.used.eq(count)

        with m.If(self.claim.valid & match.any()):
            m.d.sync += self.conflict_waits.eq(self.conflict_waits + 1)
        with m.Elif(self.claim.valid & ~free_any):
            m.d.sync += self.full_waits.eq(self.full_waits + 1)
        return m
