"""Atomic execution unit of the RNIC responder.

Models the memory side of the RC atomic operations of the InfiniBand Architecture
Specification vol. 1 release 1.4, chapter 9.4 (COMPARE_SWAP / FETCH_ADD operations) as
executed by the responder (9.7): an 8-byte read-modify-write of a little-endian quadword in
host memory, done through the NIC's DMA ports.

* CAS (``op == 0``): read ``orig``; if ``orig == compare`` write ``swap_add``, otherwise
  write nothing (a failed compare leaves memory untouched).
* FAA (``op == 1``): read ``orig``; write ``(orig + swap_add) mod 2**64``.

Either way the unit answers ``orig`` on its ``o`` stream, once its write (if any) has been
answered by the host. If the host fails the read or the write (``err`` of the DMA ports),
the answer has ``err`` set and the operation must be reported as failed (the responder NAKs
it with a remote operational error); after a failed read nothing is written.

Atomicity and concurrency: up to ``inflight`` operations are in flight at once, each
holding its 8-byte-aligned address in a table of addresses in flight
(:class:`~hw.lib.inflight.InflightTable`, IBA vol. 1 9.4.5: atomics on one address appear in
some sequential order). An operation *claims* its address before it issues its DMA read and
*releases* it once it has been answered, that is after the host acknowledged its write; an
operation whose address is in flight waits (and the operations behind it: the unit is in
order), so the second of two atomics on one address reads the value the first one wrote.
Operations on different addresses overlap: their reads go out back to back and the unit
waits for each host round trip only once per operation in flight, not once per operation.
With ``inflight == 1`` the unit executes one operation at a time. Addresses are expected to
be 8-byte aligned (the responder NAKs an unaligned atomic before it gets here); an
unaligned one is executed but serialised only against operations in its aligned quadword.
Atomicity against CPU accesses on the host is not modelled (``IBV_ATOMIC_HCA``: atomic only
with respect to this HCA).

Pipeline (all FIFOs in request order, so answers come out in request order):

1. claim: the head of ``i`` waits until its address is not in flight and a slot is free,
   then issues its 8-byte DMA read and enters the read queue;
2. read data (in request order on the port) meet the head of the read queue: the new value
   is computed and, for a FAA or a CAS whose compare matched, written (a failed read writes
   nothing); the operation enters the answer queue;
3. answer: the head of the answer queue leaves on ``o`` once its write (if any) is
   answered (``done``, in write order); its slot is released in the same cycle.

Ports
-----
``i``: ``In(stream.Signature({op: 1, addr: 64, compare: 64, swap_add: 64, ctx: ctx_bits}))``
``o``: ``Out(stream.Signature({orig: 64, err: 1, ctx: ctx_bits}))`` (``ctx`` is carried
through unchanged: the client's context of the operation)
``dma_rd``: ``Out(DmaReadPort(data_bytes))`` (one 8-byte read per operation)
``dma_wr``: ``Out(DmaWritePort(data_bytes))`` (one 8-byte single-beat write, skipped for a
failed CAS)
``busy``: ``Out(1)``, an operation has been taken and not yet answered
``owner``: ``In(owner_bits)``, ``owner_busy``: ``Out(1)`` (with ``owner_bits > 0``): an
operation whose ``ctx[:owner_bits]`` equals ``owner`` has been taken and not yet answered,
in the same cycle (a compare per slot). The responder gives the QPN of the packet it is
writing, so that a WRITE or SEND waits for the atomics of its own QP only (IBA vol. 1 9.5:
ordering is per QP).
``claim_waits``: ``Out(32)``, cycles the head waited because its address was in flight or
every slot was taken

Parameters: ``data_bytes`` a power of two in [8, 64]; ``inflight`` in [1, 16];
``ctx_bits`` in [1, 64]; ``owner_bits`` in [0, ``ctx_bits``] (0: no ``owner`` ports).
"""

from amaranth.hdl import Cat, Module, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from ..interfaces import DmaReadPort, DmaWritePort
from ..lib.checks import check_int
from ..lib.inflight import InflightTable

__all__ = ["AtomicUnit", "atomic_req", "atomic_resp", "ATOMIC_CAS", "ATOMIC_FAA",
           "ATOMIC_DMA_TAG"]

ATOMIC_CAS = 0
ATOMIC_FAA = 1
#: DMA tag of the unit's reads
ATOMIC_DMA_TAG = 3


def atomic_req(ctx_bits):
    return data.StructLayout({"op": 1, "addr": 64, "compare": 64, "swap_add": 64,
                              "ctx": ctx_bits})


def atomic_resp(ctx_bits):
    return data.StructLayout({"orig": 64, "err": 1, "ctx": ctx_bits})


def check_data_bytes(data_bytes):
    if (not isinstance(data_bytes, int) or isinstance(data_bytes, bool)
            or not 8 <= data_bytes <= 64 or data_bytes & (data_bytes - 1)):
        raise ValueError(f"data_bytes must be a power of two in [8, 64], not {data_bytes!r}")


class AtomicUnit(wiring.Component):
    """8-byte CAS / FAA through DMA, several in flight, serialised per address (see the
    module docstring)."""

    def __init__(self, data_bytes, *, inflight=1, ctx_bits=1, owner_bits=0):
        check_data_bytes(data_bytes)
        check_int("inflight", inflight, 1, 16)
        check_int("ctx_bits", ctx_bits, 1, 64)
        check_int("owner_bits", owner_bits, 0, ctx_bits)
        self.data_bytes, self.inflight, self.ctx_bits = data_bytes, inflight, ctx_bits
        self.owner_bits = owner_bits
        owner = {"owner": In(owner_bits), "owner_busy": Out(1)} if owner_bits else {}
        super().__init__({
            **owner,
            "i": In(stream.Signature(atomic_req(ctx_bits))),
            "o": Out(stream.Signature(atomic_resp(ctx_bits))),
            "dma_rd": Out(DmaReadPort(data_bytes)),
            "dma_wr": Out(DmaWritePort(data_bytes)),
            "busy": Out(1),
            "claim_waits": Out(32),
        })

    def elaborate(self, platform):
        m = Module()
        n = self.inflight
        REQ = atomic_req(self.ctx_bits)
        slot_bits = max(1, (n - 1).bit_length())
        OP = data.StructLayout({"req": REQ, "slot": slot_bits})
        ANS = data.StructLayout({"orig": 64, "err": 1, "wrote": 1, "ctx": self.ctx_bits,
                                 "slot": slot_bits})
        m.submodules.table = table = InflightTable(61, n)
        m.submodules.rdq = rdq = SyncFIFOBuffered(width=OP.size, depth=n)
        m.submodules.ansq = ansq = SyncFIFOBuffered(width=ANS.size, depth=n)
        # the error status of each write's done, in write order, until its answer leaves
        m.submodules.donef = donef = SyncFIFOBuffered(width=1, depth=n)

        # 1. claim the address, issue the read
        req = self.i.payload
        rq = self.dma_rd.req
        m.d.comb += [
            table.claim.payload.key.eq(req.addr[3:]),
            rq.valid.eq(self.i.valid & table.claim.ready & rdq.w_rdy),
            rq.payload.addr.eq(req.addr),
            rq.payload.len.eq(8),
            rq.payload.tag.eq(ATOMIC_DMA_TAG),
            self.i.ready.eq(table.claim.ready & rdq.w_rdy & rq.ready),
            table.claim.valid.eq(self.i.valid & self.i.ready),
        ]
        with m.If(self.i.valid & ~table.claim.ready):
            m.d.sync += self.claim_waits.eq(self.claim_waits + 1)
        op_in = Signal(OP)
        m.d.comb += [op_in.req.eq(req), op_in.slot.eq(table.claim_slot),
                     rdq.w_data.eq(op_in), rdq.w_en.eq(self.i.valid & self.i.ready)]

        # 2. read data (an 8-byte read is a single beat for every data_bytes >= 8)
        head = OP(rdq.r_data)
        rd = self.dma_rd.rd
        wr = self.dma_wr.wr
        orig = Signal(64)
        new = Signal(64)
        m.d.comb += [orig.eq(rd.payload.data[:64]), new.eq(head.req.swap_add)]
        with m.If(head.req.op == ATOMIC_FAA):
            m.d.comb += new.eq((orig + head.req.swap_add)[:64])
        do_write = ~rd.payload.err & ((head.req.op == ATOMIC_FAA) | (orig == head.req.compare))
        have = rd.valid & rdq.r_rdy & ansq.w_rdy
        m.d.comb += [
            wr.valid.eq(have & do_write),
            wr.payload.addr.eq(head.req.addr),
            wr.payload.len.eq(8),
            wr.payload.tag.eq(ATOMIC_DMA_TAG),
            wr.payload.data.eq(new),
            wr.payload.nbytes.eq(8),
            wr.payload.last.eq(1),
            rd.ready.eq(rdq.r_rdy & ansq.w_rdy & (~do_write | wr.ready)),
            rdq.r_en.eq(rd.valid & rd.ready),
        ]
        ans_in = Signal(ANS)
        m.d.comb += [ans_in.orig.eq(orig), ans_in.err.eq(rd.payload.err), ans_in.wrote.eq(do_write),
                     ans_in.ctx.eq(head.req.ctx), ans_in.slot.eq(head.slot),
                     ansq.w_data.eq(ans_in), ansq.w_en.eq(rd.valid & rd.ready)]

        # 3. answer once the write (if any) is answered
        done = self.dma_wr.done
        m.d.comb += [donef.w_data.eq(done.payload.err), donef.w_en.eq(done.valid)]
        ans = ANS(ansq.r_data)
        m.d.comb += [
            self.o.valid.eq(ansq.r_rdy & (~ans.wrote | donef.r_rdy)),
            self.o.payload.orig.eq(ans.orig),
            self.o.payload.err.eq(ans.err | (ans.wrote & donef.r_data)),
            self.o.payload.ctx.eq(ans.ctx),
        ]
        fire = self.o.valid & self.o.ready
        m.d.comb += [
            ansq.r_en.eq(fire),
            donef.r_en.eq(fire & ans.wrote),
            table.release.valid.eq(fire),
            table.release.payload.slot.eq(ans.slot),
            self.busy.eq(table.used != 0),
        ]

        # owners of the slots in flight (set at the claim, cleared at the answer)
        if self.owner_bits:
            live = Signal(n)
            owners = [Signal(self.owner_bits, name=f"owner{i}") for i in range(n)]
            hits = []
            for i in range(n):
                with m.If(fire & (ans.slot == i)):
                    m.d.sync += live[i].eq(0)
                with m.If(self.i.valid & self.i.ready & (table.claim_slot == i)):
                    m.d.sync += [live[i].eq(1), owners[i].eq(req.ctx[:self.owner_bits])]
                hits.append(live[i] & (owners[i] == self.owner))
            m.d.comb += self.owner_busy.eq(Cat(*hits).any())
        return m
