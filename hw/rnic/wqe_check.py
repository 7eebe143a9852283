"""The requester's local checks on a work request, before anything of it is sent.

A WQE taken from the send queue (or from a BlueFlame write) is decoded and checked against
its local memory region (IBA vol. 1 rel. 1.4, 10.6.3.1 and 11.4.1.1; completion status
11.6.2): the opcode must be one the NIC knows (else ``LOC_QP_OP_ERR``), an atomic moves
exactly 8 bytes (``LOC_LEN_ERR``), and a non-empty local buffer must lie inside a valid
memory region of the QP's protection domain, with the lkey's key, that grants local write
when the NIC writes into it (a READ's or atomic's destination; ``LOC_PROT_ERR``). A WQE the
host could not read (``wqe_err``) fails with ``LOC_QP_OP_ERR``.

Combinational: the send engine registers the WQE and the MR entry and uses ``status`` and
``op`` in its CHECK state (hw/rnic/requester.py).

Parameters: ``mtu`` (the path MTU in bytes, 256 .. 4096): ``npkts`` is the number of PSNs
the message uses (one for a READ, an atomic or an empty message; a READ asks for its
response packets with one request).

Ports: ``wqe: In(WQE)``, ``wqe_err: In(1)``, ``mr: In(MR_ENTRY)`` (the lkey's entry),
``pd: In(16)`` (the QP's protection domain), ``op: Out(OP_CLASS)``, ``status: Out(5)``
(a WcStatus, 0: the WQE may be sent), ``npkts: Out(24)``.
"""

from amaranth.hdl import Module, Mux
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from .. import formats
from ..formats import WcStatus, WrOpcode
from ..lib.checks import check_mtu

__all__ = ["WqeCheck", "OP_CLASS"]

#: What kind of work request a WQE's opcode is.
OP_CLASS = data.StructLayout({
    "known": 1,       # one of the WrOpcodes the NIC executes
    "write": 1,       # RDMA WRITE, with or without immediate
    "read": 1,        # RDMA READ
    "atomic": 1,      # compare-and-swap or fetch-and-add
    "imm": 1,         # carries immediate data (WRITE or SEND with immediate)
    "single": 1,      # one request packet without payload (READ, atomic)
})


class WqeCheck(wiring.Component):
    def __init__(self, mtu):
        check_mtu(mtu)
        self.mtu = mtu
        super().__init__({
            "wqe": In(formats.WQE),
            "wqe_err": In(1),
            "mr": In(formats.MR_ENTRY),
            "pd": In(16),
            "op": Out(OP_CLASS),
            "status": Out(5),
            "npkts": Out(24),
        })

    def elaborate(self, platform):
        m = Module()
        wqe, mr, c = self.wqe, self.mr, self.op
        op = wqe.opcode
        m.d.comb += [
            c.known.eq(op <= WrOpcode.ATOMIC_FETCH_AND_ADD.value),
            c.atomic.eq((op == WrOpcode.ATOMIC_CMP_AND_SWP.value)
                        | (op == WrOpcode.ATOMIC_FETCH_AND_ADD.value)),
            c.read.eq(op == WrOpcode.RDMA_READ.value),
            c.write.eq(op <= WrOpcode.RDMA_WRITE_WITH_IMM.value),
            c.imm.eq((op == WrOpcode.RDMA_WRITE_WITH_IMM.value)
                     | (op == WrOpcode.SEND_WITH_IMM.value)),
            c.single.eq(c.read | c.atomic),
        ]
        mr_ok = ((mr.valid & (mr.key == wqe.lkey) & (mr.pd == self.pd)
                  & (wqe.local_addr >= mr.base)
                  & ((wqe.local_addr + wqe.length) <= (mr.base + mr.length))
                  & (~(c.read | c.atomic) | (mr.access & formats.Access.LOCAL_WRITE.value).any())))
        with m.If(self.wqe_err):
            m.d.comb += self.status.eq(WcStatus.LOC_QP_OP_ERR.value)
        with m.Elif(~c.known):
            m.d.comb += self.status.eq(WcStatus.LOC_QP_OP_ERR.value)
        with m.Elif(c.atomic & (wqe.length != 8)):
            m.d.comb += self.status.eq(WcStatus.LOC_LEN_ERR.value)
        with m.Elif((wqe.length != 0) & ~mr_ok):
            m.d.comb += self.status.eq(WcStatus.LOC_PROT_ERR.value)
        m.d.comb += self.npkts.eq(Mux(c.atomic | (wqe.length == 0), 1,
                                      (wqe.length + (self.mtu - 1)) >> exact_log2(self.mtu)))
        return m
