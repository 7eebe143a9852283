"""A synthesizable host: host memory in on-chip RAM behind the NIC's TLP port, and a CPU port.

The host that full-speed simulations and FPGA builds use (docs/host-interface.md): nothing
in it runs in Python. It answers the NIC's TLPs as a root complex with DRAM behind it would
(PCI Express Base Specification 4.0, 2.2 and 2.3.1.1), after the same link model as the
Python host (``hw/host/pcie_link.py``):

* **MWr**: each data word is written to memory as its beat arrives, bytes outside the
  TLP's ``[addr, addr + len)`` disabled; the write response (status SC, or UR when any byte
  lies outside the memory window ``[base, base + mem_bytes)``, in which case nothing is
  written) follows the last beat.
* **MRd**: queued with its arrival cycle; from ``mem_cycles`` after its arrival it is
  answered, in arrival order, by a :class:`~hw.host.cpl_emitter.CplEmitter` reading the
  words from memory (completions of ``cpl_bytes``, as the Python host). Outside the window:
  one UR completion.
* **CPU port**: the host CPU (Python, or later a hardware workload engine) reads or writes
  up to 64 bytes at any byte address per transaction; a write is accepted (``cpu.ready``)
  in the cycle its last word is written, so a transfer that completed is in memory; a read
  answers on ``cpu_rdata``. The DMA write has priority on the write port; the CPU has a
  read port of its own.

Memory writes and reads are applied in link order (a read arriving after a write sees it:
PCIe's rule that a read does not pass a posted write, on the host side).

Parameters: ``data_bytes``, ``mem_bytes`` (power of two in [4 KB, 1 GB]), ``base`` (byte
address of the window, a multiple of ``mem_bytes``), ``mem_cycles`` in [0, 65535],
``cpl_bytes``, ``max_read_request``, ``max_payload``, ``read_queue`` (MRds waiting, power of
two in [2, 256]).

Ports: ``down: In(TlpDown(W))``, ``up: Out(TlpUp(W))``, ``cpu: In(stream CPU_REQ)``,
``cpu_rdata: Out(stream {data: 512})``.
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from ..formats import TlpKind, TlpStatus
from ..interfaces import TlpDown, TlpUp
from ..lib.checks import check_int, check_pow2
from .cpl_emitter import CplEmitter
from .up_mux import UpMux, WR_TURNAROUND

__all__ = ["RtlHost", "CPU_REQ", "CPU_RDATA"]

#: A host-CPU access: ``len`` (1..64) bytes at ``addr``; ``data`` packed from byte 0.
CPU_REQ = data.StructLayout({"we": 1, "addr": 64, "len": 7, "data": 512})
CPU_RDATA = data.StructLayout({"data": 512})


def _byte_mask(W, first, end):
    """Byte enables of a word: bytes [first, end) (first in [0, W), end in [1, W])."""
    return ((Const(1, W + 1) << end) - 1) & (Const((1 << W) - 1, W) << first)


class RtlHost(wiring.Component):
    def __init__(self, data_bytes, *, mem_bytes=1 << 20, base=0x1000_0000, mem_cycles=0,
                 cpl_bytes=64, max_read_request=512, max_payload=256, read_queue=64):
        check_pow2("data_bytes", data_bytes, 8, 64)
        check_pow2("mem_bytes", mem_bytes, 4096, 1 << 30)
        if not isinstance(base, int) or base < 0 or base % mem_bytes or base + mem_bytes > 1 << 64:
            raise ValueError(f"base must be a multiple of mem_bytes ({mem_bytes}) in [0, 2**64), "
                             f"not {base!r}")
        check_int("mem_cycles", mem_cycles, 0, 65535)
        check_pow2("read_queue", read_queue, 2, 256)
        self.data_bytes = data_bytes
        self.mem_bytes = mem_bytes
        self.base = base
        self.mem_cycles = mem_cycles
        self.read_queue = read_queue
        self.mrrs = max_read_request
        self.emitter = CplEmitter(data_bytes, cpl_bytes, (max_read_request + data_bytes) // data_bytes)
        super().__init__({
            "down": In(TlpDown(data_bytes)),
            "up": Out(TlpUp(data_bytes)),
            "cpu": In(stream.Signature(CPU_REQ)),
            "cpu_rdata": Out(stream.Signature(CPU_RDATA)),
        })

    def elaborate(self, platform):
        m = Module()
        W = self.data_bytes
        lw = exact_log2(W)
        words = self.mem_bytes // W
        ab = exact_log2(words)
        base, size = self.base, self.mem_bytes

        m.submodules.mem = mem = Memory(shape=8 * W, depth=words, init=[])
        wp = mem.write_port(granularity=8)
        rp_dma = mem.read_port(domain="sync", transparent_for=(wp,))
        rp_cpu = mem.read_port(domain="sync", transparent_for=(wp,))

        def in_window(addr, length):
            return (addr >= base) & ((addr + length) <= base + size) & (length != 0)

        now = Signal(32)
        m.d.sync += now.eq(now + 1)

        # ---- down: writes to memory as they arrive, reads into the read queue ------------
        RQ = data.StructLayout({"tag": 8, "addr": 64, "len": 13, "time": 32})
        m.submodules.rq = rq = SyncFIFOBuffered(width=RQ.size, depth=self.read_queue)
        m.submodules.wrsp = wrsp = SyncFIFOBuffered(width=10 + 32, depth=8)
        down = self.down
        first = Signal(init=1)
        w_hdr = Signal.like(down.payload.hdr)
        w_ok = Signal()
        w_word = Signal(ab)
        w_left = Signal(range(4096 // W + 2))
        hdr = Signal.like(down.payload.hdr)
        m.d.comb += hdr.eq(Mux(first, down.payload.hdr, w_hdr))
        is_mrd = first & (down.payload.hdr.kind == TlpKind.MRD)
        # a read needs room in the read queue, a write's last beat room for its response
        m.d.comb += down.ready.eq(Mux(is_mrd, rq.w_rdy, wrsp.w_rdy))
        beat = down.valid & down.ready
        h = down.payload.hdr
        ok_first = in_window(h.addr, h.len)
        m.d.comb += [
            rq.w_data.eq(Cat(h.tag, h.addr, h.len, now)),
            rq.w_en.eq(beat & is_mrd),
        ]
        nwords = (h.addr[:lw] + h.len + (W - 1)) >> lw
        cur_ok = Mux(first, ok_first, w_ok)
        cur_word = Mux(first, ((h.addr - base) >> lw)[:ab], w_word)
        is_last_word = Mux(first, nwords <= 1, w_left == 1)
        first_b = Mux(first, h.addr[:lw], 0)
        end_a = (hdr.addr + hdr.len)[:lw]
        end_b = Mux(is_last_word, Mux(end_a == 0, W, end_a), W)
        dma_we = beat & ~is_mrd & cur_ok
        m.d.comb += [
            wp.addr.eq(cur_word), wp.data.eq(down.payload.data),
            wp.en.eq(Mux(dma_we, _byte_mask(W, first_b, end_b), 0)),
            wrsp.w_data.eq(Cat(hdr.tag, Mux(cur_ok, TlpStatus.SC, TlpStatus.UR),
                               now + WR_TURNAROUND)),
            wrsp.w_en.eq(beat & ~is_mrd & down.payload.last),
        ]
        with m.If(beat):
            m.d.sync += first.eq(down.payload.last)
            with m.If(first):
                m.d.sync += [w_hdr.eq(h), w_ok.eq(ok_first), w_word.eq(cur_word + 1),
                             w_left.eq(nwords - 1)]
            with m.Else():
                m.d.sync += [w_word.eq(w_word + 1), w_left.eq(w_left - 1)]

        # ---- reads: answered in order, mem_cycles after they arrived ---------------------
        m.submodules.emitter = em = self.emitter
        head = Signal(RQ)
        m.d.comb += head.eq(rq.r_data)
        due_ok = ~(now - (head.time + self.mem_cycles))[31]
        r_ok = in_window(head.addr, head.len)
        m.d.comb += [
            em.req.valid.eq(rq.r_rdy & due_ok),
            em.req.payload.tag.eq(head.tag),
            em.req.payload.status.eq(Mux(r_ok, TlpStatus.SC, TlpStatus.UR)),
            em.req.payload.addr.eq(head.addr[:12]),
            em.req.payload.len.eq(head.len),
            rq.r_en.eq(em.req.valid & em.req.ready),
            rp_dma.addr.eq((((head.addr - base) >> lw) + em.word.index)[:ab]),
            rp_dma.en.eq(em.word.en),
            em.word.data.eq(rp_dma.data),
        ]
        m.submodules.upmux = upmux = UpMux(W)
        wiring.connect(m, em.up, upmux.cpl)
        m.d.comb += [upmux.wrsp.valid.eq(wrsp.r_rdy & ~(now - wrsp.r_data[10:42])[31]),
                     upmux.wrsp.payload.tag.eq(wrsp.r_data[:8]),
                     upmux.wrsp.payload.status.eq(wrsp.r_data[8:10]),
                     wrsp.r_en.eq(upmux.wrsp.ready)]
        wiring.connect(m, upmux.up, wiring.flipped(self.up))

        # ---- CPU port: up to 64 bytes at any address, one word per cycle ----------------
        cpu = self.cpu.payload
        cw = 64 // W + 1                                   # words an access can touch
        c_rot = cpu.addr[:lw]
        c_nw = (c_rot + cpu.len + (W - 1)) >> lw
        c_k = Signal(range(cw + 1))                        # word of the access
        c_word0 = ((cpu.addr - base) >> lw)[:ab]
        c_shift = Signal(8 * (64 + W))
        c_mask = Signal(64 + W)
        m.d.comb += [c_shift.eq(cpu.data << (c_rot << 3)),
                     c_mask.eq(((Const(1, 65) << cpu.len) - 1) << c_rot)]
        c_ok = in_window(cpu.addr, cpu.len)
        c_rd = Signal(8 * W * cw)                          # words read so far
        c_busy_rd = Signal()
        r_v = Signal()
        with m.FSM(name="cpu"):
            with m.State("IDLE"):
                with m.If(self.cpu.valid & ~r_v):
                    m.d.sync += c_k.eq(0)
                    m.next = "RUN"
            with m.State("RUN"):
                last = c_k + 1 >= c_nw
                with m.If(cpu.we):
                    # the DMA write has the write port; wait for a free cycle
                    with m.If(~dma_we):
                        with m.Switch(c_k):
                            for k in range(cw):
                                with m.Case(k):
                                    m.d.comb += [
                                        wp.addr.eq(c_word0 + k),
                                        wp.data.eq(c_shift.word_select(k, 8 * W)),
                                        wp.en.eq(Mux(c_ok, c_mask[k * W:(k + 1) * W], 0)),
                                    ]
                        m.d.sync += c_k.eq(c_k + 1)
                        with m.If(last):
                            m.d.comb += self.cpu.ready.eq(1)
                            m.next = "IDLE"
                with m.Else():
                    m.d.comb += [rp_cpu.addr.eq(c_word0 + c_k), rp_cpu.en.eq(1)]
                    m.d.sync += [c_k.eq(c_k + 1), c_busy_rd.eq(1)]
                    with m.If(last):
                        m.next = "RD_LAST"
            with m.State("RD_LAST"):
                m.d.comb += self.cpu.ready.eq(1)
                m.next = "IDLE"
        # collect the read words (data of the read issued last cycle)
        rd_k = Signal(range(cw + 1))
        with m.If(c_busy_rd):
            with m.Switch(rd_k):
                for k in range(cw):
                    with m.Case(k):
                        m.d.sync += c_rd.word_select(k, 8 * W).eq(rp_cpu.data)
            m.d.sync += rd_k.eq(rd_k + 1)
        with m.If(self.cpu.valid & self.cpu.ready):
            m.d.sync += [c_busy_rd.eq(0), rd_k.eq(0)]
            with m.If(~cpu.we):
                m.d.sync += r_v.eq(1)
        # answer: the bytes from the access's first byte (zero outside the window)
        r_rot = Signal(lw)
        r_ok = Signal()
        with m.If(self.cpu.valid & self.cpu.ready):
            m.d.sync += [r_rot.eq(c_rot), r_ok.eq(c_ok)]
        m.d.comb += [self.cpu_rdata.valid.eq(r_v & ~c_busy_rd),
                     self.cpu_rdata.payload.data.eq(Mux(r_ok, (c_rd >> (r_rot << 3))[:512], 0))]
        with m.If(self.cpu_rdata.valid & self.cpu_rdata.ready):
            m.d.sync += r_v.eq(0)
        return m
