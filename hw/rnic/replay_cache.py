"""The responder's atomic replay cache: the results of every QP's last atomics.

InfiniBand Architecture Specification vol. 1 rel. 1.4, 9.7.5.1.2 ("Responder: duplicate
packets") and 9.7.5.2.1: a duplicate COMPARE_SWAP or FETCH_ADD must not be executed again;
the responder answers it with the original value of the first execution. A requester has
at most ``max_rd_atomic`` (16) READ / atomic requests outstanding per QP, so a
retransmitted atomic is always among the QP's last 16 atomics: the cache keeps ``slots``
entries (PSN, original value, valid) per QP in one ``lib.memory`` array, a ring per QP
whose write pointer (``rp``) and "ring has wrapped" bit (``rfull``) live in the
responder's per-QP state row (hw/rnic/request_check.py ``RSP_STATE``).

* **inv**: as an atomic is handed to the atomic unit it takes the QP's next slot, which is
  invalidated in that cycle: until the atomic's result is written the slot answers no
  duplicate, so the window is exactly the QP's last ``slots`` atomics, whatever the atomic
  unit's latency.
* **put**: the atomic unit's answer (not after a failure) is written into its slot. An
  answer whose slot is being taken by a new atomic in the same cycle is out of the window
  and not written.
* **scan**: a duplicate atomic's PSN is looked up in its QP's ring, one slot per cycle from
  slot 0 (``start`` in the cycle before the first): ``hit`` (with ``orig``) when the slot
  read holds the PSN, is valid and has been written since the ring was reset (a slot below
  ``rp``, or any slot once ``rfull``); ``last`` while the last slot is read. The key
  (``qpn``, ``psn``, ``rp``, ``rfull``) is held while the scan runs; ``step`` advances it.

Parameters: ``qpn_bits`` (1 .. 14), ``slots`` (16: the 4-bit ``rp`` of the state row).
"""

from amaranth.hdl import Cat, Module, Signal
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..lib.checks import check_int

__all__ = ["ReplayCache", "REPLAY_ENTRY"]

#: One slot: the atomic's PSN and original value; ``valid`` is cleared when an atomic takes
#: the slot and set with its result.
REPLAY_ENTRY = data.StructLayout({"psn": 24, "orig": 64, "valid": 1})


class ReplayCache(wiring.Component):
    def __init__(self, qpn_bits, slots=16):
        check_int("qpn_bits", qpn_bits, 1, 14)
        if slots != 16:
            raise ValueError(f"slots must be 16 (the responder's replay pointer is 4 bits), "
                             f"not {slots!r}")
        self.qpn_bits = qpn_bits
        self.slots = slots
        super().__init__({
            # an atomic takes slot inv_slot of QP inv_qpn
            "inv_en": In(1), "inv_qpn": In(qpn_bits), "inv_slot": In(4),
            # an atomic's result into its slot
            "put_en": In(1), "put_qpn": In(qpn_bits), "put_slot": In(4),
            "put_psn": In(24), "put_orig": In(64),
            # a duplicate's scan
            "start": In(1), "step": In(1),
            "qpn": In(qpn_bits), "psn": In(24), "rp": In(4), "rfull": In(1),
            "hit": Out(1), "last": Out(1), "orig": Out(64),
        })

    def elaborate(self, platform):
        m = Module()
        qb = self.qpn_bits
        m.submodules.mem = mem = Memory(shape=REPLAY_ENTRY, depth=(1 << qb) * self.slots,
                                        init=[])
        rd = mem.read_port(domain="comb")
        wr = mem.write_port()
        inv = mem.write_port()
        scan = Signal(range(self.slots))
        m.d.comb += [
            inv.addr.eq(Cat(self.inv_slot, self.inv_qpn)),
            inv.data.valid.eq(0),
            inv.en.eq(self.inv_en),
            wr.addr.eq(Cat(self.put_slot, self.put_qpn)),
            wr.data.psn.eq(self.put_psn),
            wr.data.orig.eq(self.put_orig),
            wr.data.valid.eq(1),
            wr.en.eq(self.put_en & ~(inv.en & (inv.addr == wr.addr))),
            rd.addr.eq(Cat(scan, self.qpn)),
            self.hit.eq((rd.data.psn == self.psn) & rd.data.valid
                        & (self.rfull | (scan < self.rp))),
            self.last.eq(scan == self.slots - 1),
            self.orig.eq(rd.data.orig),
        ]
        with m.If(self.start):
            m.d.sync += scan.eq(0)
        with m.Elif(self.step):
            m.d.sync += scan.eq(scan + 1)
        return m
