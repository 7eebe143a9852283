"""The RTL side of the Python host: whole TLPs to Python in one transfer, whole responses back.

Python must act once per request and once per response, never per beat (docs/host-interface.md):
this adapter sits between the PCIe link model and the Python host model (``sim/host.py``)
and moves whole bursts.

* **Requests** (NIC -> host): the beats of each down TLP are collected into one wide
  register; Python takes the whole TLP in one transfer from the ``req`` mailbox
  (:class:`~hw.lib.seq_port.SeqOut`: ``req_seq`` counts the TLPs put there, Python writes
  ``req_ack``): its header, its data words (an MWr's, up to ``max_payload`` bytes) and
  ``time``, the cycle its first beat arrived. With the acknowledgement of an MWr Python gives
  its status on ``req_status``; the adapter answers the MWr with a write response of that
  status.
* **Responses** (host -> NIC): Python pushes one transfer per read request into the ``cpl``
  mailbox (:class:`~hw.lib.seq_port.SeqIn`: ``cpl_seq`` / ``cpl_taken``): tag, status, the request's address (low 12 bits) and
  length, the aligned words of its data, and ``due``, the cycle before which it may not
  leave. Responses wait in a FIFO of ``depth`` entries in push order; the one at the head
  leaves at ``due`` (or as soon as it reaches the head, if later), split into completions by
  a :class:`~hw.host.cpl_emitter.CplEmitter` exactly as the RTL host splits them. Python
  reorders completions by choosing the push order.

``now`` is the adapter's cycle counter (the time base of ``time`` and ``due``). ``events``
counts the MWrs with ``th`` that Python acknowledged (they are in its memory: the host's
event line, ``hw/host/host_side.py``).

Parameters: ``data_bytes``, ``max_payload``, ``max_read_request``, ``cpl_bytes``,
``depth`` (power of two in [2, 256]).

Ports: ``down: In(TlpDown(W))``, ``up: Out(TlpUp(W))``; to Python: ``req: Out(PY_REQ)``,
``req_seq: Out(16)``, ``req_ack: In(16)``, ``req_status: In(2)``, ``cpl: In(PY_CPL)``,
``cpl_seq: In(16)``, ``cpl_taken: Out(16)``, ``now: Out(32)``.
"""

from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from ..formats import TLP_DOWN_HDR, TlpKind
from ..interfaces import TlpDown, TlpUp
from ..lib.checks import check_pow2
from ..lib.seq_port import SeqIn, SeqOut
from ..lib.wide_fifo import WideFifo
from .cpl_emitter import CplEmitter
from .up_mux import UpMux, WR_TURNAROUND

__all__ = ["PyHostPort", "py_req_layout", "py_cpl_layout"]


def py_req_layout(data_bytes, max_payload):
    return data.StructLayout({"hdr": TLP_DOWN_HDR, "time": 32,
                              "data": 8 * (max_payload + data_bytes)})


def py_cpl_layout(data_bytes, max_read_request):
    return data.StructLayout({"tag": 8, "status": 2, "addr": 12, "len": 13, "due": 32,
                              "data": 8 * (max_read_request + data_bytes)})


class PyHostPort(wiring.Component):
    def __init__(self, data_bytes, *, max_payload=256, max_read_request=512, cpl_bytes=64,
                 depth=32):
        check_pow2("data_bytes", data_bytes, 8, 64)
        check_pow2("max_payload", max_payload, data_bytes, 4096)
        check_pow2("max_read_request", max_read_request, data_bytes, 4096)
        check_pow2("depth", depth, 2, 256)
        self.data_bytes = data_bytes
        self.mps = max_payload
        self.mrrs = max_read_request
        self.cpl_bytes = cpl_bytes
        self.depth = depth
        self.req_layout = py_req_layout(data_bytes, max_payload)
        self.cpl_layout = py_cpl_layout(data_bytes, max_read_request)
        self.emitter = CplEmitter(data_bytes, cpl_bytes, (max_read_request + data_bytes) // data_bytes)
        self.req_port = SeqOut(data.StructLayout({"req": self.req_layout, "due": 32}))
        self.cpl_port = SeqIn(self.cpl_layout)
        super().__init__({
            "down": In(TlpDown(data_bytes)),
            "up": Out(TlpUp(data_bytes)),
            "req": Out(self.req_layout),
            "req_seq": Out(16),
            "req_ack": In(16),
            "req_status": In(2),
            "cpl": In(self.cpl_layout),
            "cpl_seq": In(16),
            "cpl_taken": Out(16),
            "now": Out(32),
            "events": Out(32),
        })

    def elaborate(self, platform):
        m = Module()
        W = self.data_bytes
        m.d.sync += self.now.eq(self.now + 1)

        # ---- requests: collect a TLP's beats, hand it over whole ---------------------------
        nwords = self.mps // W + 1
        acc = Signal(8 * (self.mps + W))
        acc_hdr = Signal(TLP_DOWN_HDR)
        acc_time = Signal(32)
        acc_due = Signal(32)       # when the write response may leave (WR_TURNAROUND)
        acc_full = Signal()
        widx = Signal(range(nwords + 1))
        m.submodules.req_port = rp = self.req_port
        m.submodules.wrsp = wrsp = SyncFIFOBuffered(width=8 + 2 + 32, depth=8)
        # an MWr goes to Python only with room for its write response
        is_wr_acc = acc_hdr.kind == TlpKind.MWR
        move = Signal()            # the collected TLP goes to the mailbox
        m.d.comb += [
            rp.i.valid.eq(acc_full & (~is_wr_acc | (wrsp.level < 7))),
            rp.i.payload.req.hdr.eq(acc_hdr), rp.i.payload.req.time.eq(acc_time),
            rp.i.payload.req.data.eq(acc), rp.i.payload.due.eq(acc_due),
            move.eq(rp.i.valid & rp.i.ready),
            self.down.ready.eq(~acc_full | move),
            self.req.eq(rp.data.req), self.req_seq.eq(rp.seq), rp.ack.eq(self.req_ack),
        ]
        with m.If(self.down.valid & self.down.ready):
            p = self.down.payload
            with m.If(widx == 0):
                m.d.sync += [acc_hdr.eq(p.hdr), acc_time.eq(self.now)]
            with m.Switch(widx):
                for j in range(nwords):
                    with m.Case(j):
                        m.d.sync += acc.word_select(j, 8 * W).eq(p.data)
            m.d.sync += widx.eq(Mux(p.last, 0, widx + 1))
            with m.If(p.last):
                m.d.sync += [acc_full.eq(1), acc_due.eq(self.now + WR_TURNAROUND)]
        with m.If(move & ~(self.down.valid & self.down.ready & self.down.payload.last)):
            m.d.sync += acc_full.eq(0)
        # Python acknowledged the TLP in the mailbox (still there this cycle): an MWr gets its
        # write response with the status Python gave
        m.d.comb += [wrsp.w_data.eq(Cat(rp.data.req.hdr.tag, self.req_status, rp.data.due)),
                     wrsp.w_en.eq(rp.ack_edge & (rp.data.req.hdr.kind == TlpKind.MWR))]
        with m.If(rp.ack_edge & (rp.data.req.hdr.kind == TlpKind.MWR) & rp.data.req.hdr.th):
            m.d.sync += self.events.eq(self.events + 1)

        # ---- responses: Python's pushes, each leaves at its due cycle ----------------------
        m.submodules.cplq = cplq = WideFifo(self.cpl_layout.size, self.depth)
        m.submodules.emitter = em = self.emitter
        m.submodules.cpl_port = cp = self.cpl_port
        m.d.comb += [cp.data.eq(self.cpl), cp.seq.eq(self.cpl_seq), self.cpl_taken.eq(cp.taken),
                     cplq.w_data.eq(cp.o.payload), cplq.w_en.eq(cp.o.valid),
                     cp.o.ready.eq(cplq.w_rdy)]
        head = Signal(self.cpl_layout)
        m.d.comb += head.eq(cplq.r_data)
        due_ok = ~(self.now - head.due)[31]
        m.d.comb += [
            em.req.valid.eq(cplq.r_rdy & due_ok),
            em.req.payload.tag.eq(head.tag),
            em.req.payload.status.eq(head.status),
            em.req.payload.addr.eq(head.addr),
            em.req.payload.len.eq(head.len),
            cplq.r_en.eq(em.req.valid & em.req.ready),
        ]
        word = Signal(8 * W)
        with m.If(em.word.en):
            # a flat case per word (a variable word_select nests one mux per word)
            with m.Switch(em.word.index):
                for j in range((self.mrrs + W) // W):
                    with m.Case(j):
                        m.d.sync += word.eq(head.data.word_select(j, 8 * W))
        m.d.comb += em.word.data.eq(word)

        # ---- up: completions and write responses, merged at TLP boundaries -------------
        m.submodules.upmux = upmux = UpMux(W)
        wiring.connect(m, em.up, upmux.cpl)
        m.d.comb += [upmux.wrsp.valid.eq(wrsp.r_rdy & ~(self.now - wrsp.r_data[10:42])[31]),
                     upmux.wrsp.payload.tag.eq(wrsp.r_data[:8]),
                     upmux.wrsp.payload.status.eq(wrsp.r_data[8:10]),
                     wrsp.r_en.eq(upmux.wrsp.ready)]
        wiring.connect(m, upmux.up, wiring.flipped(self.up))
        return m
