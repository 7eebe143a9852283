"""DMA arbiter: shares the NIC's single host-memory port among the blocks that use DMA.

Models the RNIC side of the PCIe interface through which the channel adapter reads work
requests and payloads from host memory and writes payloads and completions to it
(InfiniBand Architecture Specification vol. 1 rel. 1.4, chapter 9 "Transport layer": the
requester fetches WQEs and data, the responder places incoming data, completions are written
to the CQ). The DMA conventions are those of :mod:`hw.interfaces`.

* **Reads**: request beats of the ``n_read`` clients are granted round-robin, one request per
  grant, and forwarded unchanged (tags included) to ``rd_req``. The host answers in request
  order, so the arbiter keeps a FIFO of client numbers (``outstanding`` entries; requests
  stall when it is full) and sends each response (beats up to ``last``) to the client at its
  head, unchanged.
* **Writes**: the ``n_write`` write streams are granted round-robin per write; a grant lasts
  from the first beat to the beat with ``last``, so writes never interleave.
* **Counters**: ``stat_rd`` pulses one cycle (the cycle after the request) with
  ``stat_rd_bytes`` = its ``len``; ``stat_wr``/``stat_wr_bytes`` likewise for each write
  (from its first beat).

Grants are combinational; once a request or write is offered on the host side it keeps the
grant until taken, so the host side obeys the stream stability rule.

Ports::

    rd:         In(DmaReadClient(W)).array(n_read)   rd[k].req (in), rd[k].resp (out)
    wr:         In(DmaWrite(W)).array(n_write)
    rd_req:     Out(DmaReadReq())
    rd_resp:    In(DmaReadData(W))
    wr_out:     Out(DmaWrite(W))
    stat_rd:    Out(1)     stat_rd_bytes: Out(16)
    stat_wr:    Out(1)     stat_wr_bytes: Out(16)
"""

from amaranth.hdl import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.wiring import In, Out

from .arbiter import round_robin_pick
from .interfaces import DmaReadClient, DmaReadData, DmaReadReq, DmaWrite

__all__ = ["DmaArbiter"]


def _check_int(name, value, lo, hi):
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise ValueError(f"{name} must be an integer in [{lo}, {hi}], not {value!r}")


class DmaArbiter(wiring.Component):
    """Round-robin DMA arbiter for ``n_read`` read clients and ``n_write`` write clients.

    Parameters
    ----------
    data_bytes : power of two in [8, 64].
    n_read, n_write : integers in [1, 32].
    outstanding : integer in [1, 1024], read requests in flight (depth of the routing FIFO).
    """

    def __init__(self, data_bytes, n_read, n_write, outstanding=32):
        if (not isinstance(data_bytes, int) or isinstance(data_bytes, bool)
                or not 8 <= data_bytes <= 64 or data_bytes & (data_bytes - 1)):
            raise ValueError(f"data_bytes must be a power of two in [8, 64], not {data_bytes!r}")
        _check_int("n_read", n_read, 1, 32)
        _check_int("n_write", n_write, 1, 32)
        _check_int("outstanding", outstanding, 1, 1024)
        self.data_bytes = data_bytes
        self.n_read = n_read
        self.n_write = n_write
        self.outstanding = outstanding
        super().__init__({
            "rd": In(DmaReadClient(data_bytes)).array(n_read),
            "wr": In(DmaWrite(data_bytes)).array(n_write),
            "rd_req": Out(DmaReadReq()),
            "rd_resp": In(DmaReadData(data_bytes)),
            "wr_out": Out(DmaWrite(data_bytes)),
            "stat_rd": Out(1),
            "stat_rd_bytes": Out(16),
            "stat_wr": Out(1),
            "stat_wr_bytes": Out(16),
        })

    def elaborate(self, platform):
        m = Module()
        nr, nw = self.n_read, self.n_write

        # ---- read requests ----------------------------------------------------------------
        m.submodules.route = route = SyncFIFO(width=max(1, (nr - 1).bit_length()),
                                              depth=self.outstanding)
        r_last = Signal(range(max(nr, 2)), init=nr - 1)
        r_locked = Signal()
        r_owner = Signal(range(max(nr, 2)))
        _, r_pick = round_robin_pick(m, [c.req.valid for c in self.rd], r_last)
        r_sel = Signal(range(max(nr, 2)))
        with m.If(r_locked):
            m.d.comb += r_sel.eq(r_owner)
        with m.Else():
            m.d.comb += r_sel.eq(r_pick)
        with m.Switch(r_sel):
            for k in range(nr):
                with m.Case(k):
                    m.d.comb += [
                        self.rd_req.valid.eq(self.rd[k].req.valid & route.w_rdy),
                        self.rd_req.payload.eq(self.rd[k].req.payload),
                        self.rd[k].req.ready.eq(self.rd_req.ready & route.w_rdy),
                    ]
        r_fire = self.rd_req.valid & self.rd_req.ready
        m.d.comb += [route.w_data.eq(r_sel), route.w_en.eq(r_fire)]
        with m.If(r_fire):
            m.d.sync += [r_last.eq(r_sel), r_locked.eq(0)]
        with m.Elif(self.rd_req.valid):
            m.d.sync += [r_locked.eq(1), r_owner.eq(r_sel)]
        m.d.sync += [self.stat_rd.eq(r_fire), self.stat_rd_bytes.eq(self.rd_req.payload.len)]

        # ---- read responses: to the client at the head of the routing FIFO ----------------
        head = route.r_data
        for k in range(nr):
            m.d.comb += [
                self.rd[k].resp.payload.eq(self.rd_resp.payload),
                self.rd[k].resp.valid.eq(self.rd_resp.valid & route.r_rdy & (head == k)),
            ]
        with m.Switch(head):
            for k in range(nr):
                with m.Case(k):
                    m.d.comb += self.rd_resp.ready.eq(route.r_rdy & self.rd[k].resp.ready)
        m.d.comb += route.r_en.eq(self.rd_resp.valid & self.rd_resp.ready
                                  & self.rd_resp.payload.last)

        # ---- writes: grant held from the first beat to the last ---------------------------
        w_last = Signal(range(max(nw, 2)), init=nw - 1)
        w_locked = Signal()      # offered or in progress
        w_in_write = Signal()    # first beat taken, more to come
        w_owner = Signal(range(max(nw, 2)))
        _, w_pick = round_robin_pick(m, [c.valid for c in self.wr], w_last)
        w_sel = Signal(range(max(nw, 2)))
        with m.If(w_locked):
            m.d.comb += w_sel.eq(w_owner)
        with m.Else():
            m.d.comb += w_sel.eq(w_pick)
        with m.Switch(w_sel):
            for k in range(nw):
                with m.Case(k):
                    m.d.comb += [
                        self.wr_out.valid.eq(self.wr[k].valid),
                        self.wr_out.payload.eq(self.wr[k].payload),
                        self.wr[k].ready.eq(self.wr_out.ready),
                    ]
        w_fire = self.wr_out.valid & self.wr_out.ready
        with m.If(w_fire):
            with m.If(self.wr_out.payload.last):
                m.d.sync += [w_last.eq(w_sel), w_locked.eq(0), w_in_write.eq(0)]
            with m.Else():
                m.d.sync += [w_locked.eq(1), w_owner.eq(w_sel), w_in_write.eq(1)]
        with m.Elif(self.wr_out.valid):
            m.d.sync += [w_locked.eq(1), w_owner.eq(w_sel)]
        m.d.sync += [self.stat_wr.eq(w_fire & ~w_in_write),
                     self.stat_wr_bytes.eq(self.wr_out.payload.len)]
        return m
