"""cocotb harness for the two-node system (hw/system.py): hosts, verbs, pcap, scoreboard.

A :class:`Host` owns one node's host side in Python: the memory (a :class:`HostMemory`
served by a :class:`PyHostDriver` for the Python host, or an :class:`RtlHostMemory` for the
RTL host), the MMIO driver and a verbs :class:`~sim.verbs.Context`. :class:`TwoNodes` starts
the clock, resets, opens both contexts and offers helpers used by tests and experiments:
connected QP pairs with their CQs and memory regions, waiting for completions, and an
optional pcap of every frame the links carry.

Python acts per transaction here: a thread waiting for completions sleeps until the host
takes a DMA write into one of its CQ rings (the host driver's ``on_write``: a CPU polling the
CQ's cache line sees the CQE then), never polling every clock.
"""

import cocotb
from cocotb.triggers import Event, FallingEdge, First, RisingEdge, Timer
from cocotb.utils import get_sim_time

from hw.formats import CQE_BYTES, Access
from hw.system import TwoNodeSystem
from .host import HostMemory, MmioDriver, PyHostDriver, RtlHostMemory
from .pcap import PcapWriter
from .simclock import start_clock_and_reset
from . import verbs

__all__ = ["Host", "TwoNodes", "FrameMonitor", "ALL_ACCESS"]

ALL_ACCESS = (Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ
              | Access.REMOTE_ATOMIC).value


def now_ns():
    return get_sim_time("ns")


class Host:
    """The host side of one node (``cfg.host.kind`` picks the Python or the RTL host).

    backpressure   Python host only: probability that it waits a few cycles before taking a
                   request (None: never).
    fail           Python host only: ``fail(addr, len, is_write)`` makes DMA requests fail.
    mirror         RTL host only: follow its write tap into a Python copy of its memory
                   (``mem.read`` is then synchronous and Python wakes for every DMA write);
                   off, Python reads through the CPU port and wakes only on the host's event
                   line (``<node>_cqe_events``), once per CQE, which it copies from the write
                   tap into its copy of the CQ rings (sim/host.py ``RtlHostMemory``).

    Construct it in the time step the design's reset is raised (it zeroes its mailbox
    ports), then call ``dma.start()`` once the reset is released.
    """

    def __init__(self, dut, prefix, node_id, cfg, *, backpressure=None, seed=0,
                 doorbell_policy="mlx5", fail=None, mirror=True):
        self.cfg = cfg
        self.kind = cfg.host.kind
        if self.kind == "python":
            self.mem = HostMemory()
            self.dma = PyHostDriver(dut, f"{prefix}_py_", self.mem, cfg,
                                    backpressure=backpressure, seed=seed, fail=fail)
            base, size = 0x1000_0000, 1 << 24
        else:
            if fail is not None:
                raise ValueError("fail: the RTL host fails only addresses outside its memory")
            self.mem = self.dma = RtlHostMemory(dut, f"{prefix}_", cfg, mirror=mirror)
            base, size = cfg.host.rtl_mem_base, cfg.host.rtl_mem_bytes
        self.mmio = MmioDriver(dut, f"{prefix}_mmio_")
        # how a waiter learns that its CQ was written: the host's DMA writes (on_write),
        # which the unmirrored RTL host reports for CQE writes only (from its event line);
        # one Event per CQ, so that a CQE wakes only the threads waiting on that CQ
        self._cq_events = {}
        self._cq_by_page, self._cq_known = {}, 0
        #: per CQ number: writes into its ring seen so far, and the time of the last (ns):
        #: when the NIC wrote its CQEs, whenever the host CPU reads them (sim/tb_bench.py)
        self.cq_writes, self.cq_last_write_ns = {}, {}
        self.dma.on_write = self._on_write
        self.ctx = verbs.Context(self.mmio, self.mem, cfg.nic, node_id,
                                 doorbell_policy=doorbell_policy, host_base=base, host_size=size,
                                 blueflame=cfg.host.blueflame)

    async def write_mem(self, addr, data):
        """Write host memory as the host CPU (both kinds)."""
        await verbs._maybe_await(self.mem.write(addr, data))

    def _on_write(self, addr, n):
        if len(self.ctx.cqs) != self._cq_known:
            self._cq_known = len(self.ctx.cqs)
            self._cq_by_page = {}
            for cq in self.ctx.cqs.values():
                for p in range(cq.base >> 12, ((cq.base + cq.depth * CQE_BYTES - 1) >> 12) + 1):
                    self._cq_by_page.setdefault(p, []).append(cq)
        for p in {addr >> 12, (addr + n - 1) >> 12}:
            for cq in self._cq_by_page.get(p, ()):
                if addr < cq.base + cq.depth * CQE_BYTES and cq.base < addr + n:
                    self.cq_writes[cq.cqn] = self.cq_writes.get(cq.cqn, 0) + 1
                    self.cq_last_write_ns[cq.cqn] = now_ns()
                    ev = self._cq_events.get(cq.cqn)
                    if ev is not None:
                        ev.set()

    async def wait_completions(self, cq, n, timeout_ns=1_000_000):
        """Poll ``cq`` until ``n`` completions arrived; woken only by writes into its ring.

        ``timeout_ns=None`` waits without a timer (for loops bounded otherwise, such as
        a cocotb test's ``timeout_time``: one Timer fewer per wait)."""
        wcs = []
        deadline = None if timeout_ns is None else now_ns() + timeout_ns
        ev = self._cq_events.get(cq.cqn)
        if ev is None:
            ev = self._cq_events[cq.cqn] = Event()
        while True:
            ev.clear()
            wcs += await cq.poll_cq(n - len(wcs))
            if len(wcs) >= n:
                return wcs
            if deadline is None:
                await ev.wait()
                continue
            left = deadline - now_ns()
            if left <= 0:
                raise TimeoutError(f"{len(wcs)} of {n} completions after {timeout_ns} ns")
            if not ev.is_set():
                await First(ev.wait(), Timer(max(1, int(left * 1000)), "ps"))

    async def wait_cq_writes(self, cq, n):
        """Wait until ``n`` writes into ``cq``'s ring have been seen in all (``cq_writes``);
        returns the time of the last (ns). The CQEs are not read."""
        ev = self._cq_events.get(cq.cqn)
        if ev is None:
            ev = self._cq_events[cq.cqn] = Event()
        while self.cq_writes.get(cq.cqn, 0) < n:
            ev.clear()
            await ev.wait()
        return self.cq_last_write_ns[cq.cqn]

    async def read_counters(self):
        from hw.regmap import Counter
        return {c.name: await self.ctx.read_counter(c) for c in Counter}


class FrameMonitor:
    """Collects the frames a link accepts (``tap_<dir>`` ports) into a pcap writer.

    Samples each beat where it is stable: at the rising edge with a cocotb ``Clock`` or a
    compatible in-simulation clock (values from before the edge), at the falling edge before
    it with a plain in-simulation clock (whose ``RisingEdge`` readers see the values from
    after the edge; sim/simclock.py)."""

    def __init__(self, dut, name, writer, data_bytes):
        from .simclock import internal_clock
        self.valid = getattr(dut, f"{name}_valid")
        self.payload = getattr(dut, name)
        self.clk = dut.clk
        internal = internal_clock(dut)
        self._edge = FallingEdge if internal is not None and not internal[1] else RisingEdge
        self.writer = writer
        self.W = data_bytes
        self.frames = 0
        self._task = cocotb.start_soon(self._run())

    async def _run(self):
        W = self.W
        frame = bytearray()
        t0 = None
        while True:
            if not int(self.valid.value):
                await RisingEdge(self.valid)
            await self._edge(self.clk)
            if not int(self.valid.value):
                continue
            v = int(self.payload.value)
            data = v & ((1 << (8 * W)) - 1)
            nbytes = (v >> (8 * W)) & ((1 << (W.bit_length())) - 1)
            last = (v >> (8 * W + W.bit_length())) & 1
            if t0 is None:
                t0 = now_ns()
            frame += data.to_bytes(W, "little")[:nbytes]
            if last:
                self.writer.write(bytes(frame), int(t0))
                self.frames += 1
                frame = bytearray()
                t0 = None


class TwoNodes:
    """Two RNIC nodes (``a`` = node 0, ``b`` = node 1) with their hosts."""

    def __init__(self, dut, cfg, hosts):
        self.dut = dut
        self.cfg = cfg
        self.a, self.b = hosts
        self.monitors = []
        self.pcap = None

    @classmethod
    async def start(cls, dut, cfg, *, backpressure=None, seed=0, pcap=None, doorbell_policy="mlx5",
                    fail=None, mirror=True):
        """``fail`` (Python host): ``fail(node, addr, len, is_write)`` fails DMA requests.
        ``mirror`` (RTL host): keep a Python copy of host memory from the write tap (checks
        read it synchronously); off for full-speed runs (see :class:`Host`)."""
        # the hosts' mailbox ports are set in the time step the reset is raised
        hosts = [Host(dut, p, i, cfg, backpressure=backpressure, seed=seed * 2 + i,
                      doorbell_policy=doorbell_policy, mirror=mirror,
                      fail=None if fail is None else (lambda a, n, w, i=i: fail(i, a, n, w)))
                 for i, p in enumerate(("a", "b"))]
        await start_clock_and_reset(dut, cfg.nic.clock_mhz, settle=TwoNodeSystem.RESET_LATENCY)
        self = cls(dut, cfg, hosts)
        for h in hosts:
            h.dma.start()
        for h in hosts:
            await h.ctx.open()
        if pcap:
            self.pcap = PcapWriter(pcap)
            self.monitors = [FrameMonitor(dut, f"tap_{d}", self.pcap, cfg.nic.data_bytes)
                             for d in ("ab", "ba")]
        return self

    def close(self):
        if self.pcap is not None:
            self.pcap.close()

    @property
    def cycles(self):
        return int(now_ns() * self.cfg.nic.clock_mhz / 1000)

    async def pair(self, *, buf_bytes=1 << 16, sq_depth=64, rq_depth=64, cq_depth=256,
                   access=ALL_ACCESS, same_pd=True, share=None, **qp_attrs):
        """A connected QP pair with one CQ per side and one registered buffer per side.

        Returns ``(ends_a, ends_b)``, each a dict with ``qp``, ``cq``, ``pd``, ``mr``, ``buf``.
        ``qp_attrs`` (timeout, retry_cnt, rnr_retry, min_rnr_timer) go to both ``create_qp``.
        ``share``: the ends of an earlier pair whose PD, buffer and MR this pair uses too
        (many QPs behind one MR, as SMART's threads share one; ``buf_bytes`` and ``access``
        are then those of the earlier pair).
        """
        ends = []
        for i, h in enumerate((self.a, self.b)):
            cq = await h.ctx.create_cq(cq_depth)
            if share is None:
                pd = h.ctx.alloc_pd()
                buf = h.ctx.alloc(buf_bytes, 4096)
                mr = await h.ctx.reg_mr(pd, buf, buf_bytes, access)
            else:
                pd, buf, mr = (share[i][k] for k in ("pd", "buf", "mr"))
            qp = await h.ctx.create_qp(pd, cq, cq, sq_depth=sq_depth, rq_depth=rq_depth, access=access,
                                       **qp_attrs)
            ends.append({"host": h, "qp": qp, "cq": cq, "pd": pd, "mr": mr, "buf": buf})
        await verbs.connect(ends[0]["qp"], ends[1]["qp"])
        return ends
