"""cocotb harness for the two-node system (hw/system.py): hosts, verbs, pcap, scoreboard.

A :class:`Host` owns one node's host memory, its DMA model, its MMIO driver and a verbs
:class:`~sim.verbs.Context`. :class:`TwoNodes` starts the clock, resets, opens both
contexts and offers helpers used by tests and experiments: connected QP pairs with their
CQs and memory regions, waiting for completions without waking Python every cycle, and an
optional pcap of every frame the links carry.

Python acts per transaction here: completions are awaited on the DMA model's
"writes became visible" event, never by polling every clock.
"""

import cocotb
from cocotb.triggers import First, RisingEdge, Timer
from cocotb.utils import get_sim_time

from hw.formats import Access
from .host import DmaSlave, HostMemory, Mmio, start_clock_and_reset
from .pcap import PcapWriter
from . import verbs

__all__ = ["Host", "TwoNodes", "FrameMonitor", "ALL_ACCESS"]

ALL_ACCESS = (Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ
              | Access.REMOTE_ATOMIC).value


def now_ns():
    return get_sim_time("ns")


class Host:
    """The host side of one node."""

    def __init__(self, dut, prefix, node_id, cfg, *, backpressure=None, seed=0, doorbell_policy="mlx5"):
        self.cfg = cfg
        self.mem = HostMemory()
        self.dma = DmaSlave(dut, f"{prefix}_dma_", self.mem, dut.clk, cfg.host, cfg.nic.clock_mhz,
                            backpressure=backpressure, seed=seed)
        self.mmio = Mmio(dut, f"{prefix}_mmio__", dut.clk, cfg.host.mmio_ns)
        self.ctx = verbs.Context(self.mmio, self.mem, cfg.nic, node_id, doorbell_policy=doorbell_policy)

    async def wait_completions(self, cq, n, timeout_ns=1_000_000):
        """Poll ``cq`` until ``n`` completions arrived; woken only when DMA writes land."""
        wcs = []
        deadline = now_ns() + timeout_ns
        while True:
            # Clear before polling: a CQE that lands while poll_cq is itself waiting (on its
            # consumer-index doorbell) sets the event again and is not missed.
            self.dma.visible.clear()
            wcs += await cq.poll_cq(n - len(wcs))
            if len(wcs) >= n:
                return wcs
            left = deadline - now_ns()
            if left <= 0:
                raise TimeoutError(f"{len(wcs)} of {n} completions after {timeout_ns} ns")
            await First(self.dma.visible.wait(), Timer(max(1, int(left * 1000)), "ps"))

    async def read_counters(self):
        from hw.regmap import Counter
        return {c.name: await self.ctx.read_counter(c) for c in Counter}


class FrameMonitor:
    """Collects the frames a link accepts (``tap_<dir>`` ports) into a pcap writer."""

    def __init__(self, dut, name, writer, data_bytes):
        self.valid = getattr(dut, f"{name}_valid")
        self.payload = getattr(dut, name)
        self.clk = dut.clk
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
            await RisingEdge(self.clk)
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
    async def start(cls, dut, cfg, *, backpressure=None, seed=0, pcap=None, doorbell_policy="mlx5"):
        await start_clock_and_reset(dut, cfg.nic.clock_mhz)
        hosts = [Host(dut, p, i, cfg, backpressure=backpressure, seed=seed * 2 + i,
                      doorbell_policy=doorbell_policy) for i, p in enumerate(("a", "b"))]
        self = cls(dut, cfg, hosts)
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
                   access=ALL_ACCESS, same_pd=True, **qp_attrs):
        """A connected QP pair with one CQ per side and one registered buffer per side.

        Returns ``(ends_a, ends_b)``, each a dict with ``qp``, ``cq``, ``pd``, ``mr``, ``buf``.
        ``qp_attrs`` (timeout, retry_cnt, rnr_retry, min_rnr_timer) go to both ``create_qp``.
        """
        ends = []
        for h in (self.a, self.b):
            pd = h.ctx.alloc_pd()
            cq = await h.ctx.create_cq(cq_depth)
            buf = h.ctx.alloc(buf_bytes, 4096)
            mr = await h.ctx.reg_mr(pd, buf, buf_bytes, access)
            qp = await h.ctx.create_qp(pd, cq, cq, sq_depth=sq_depth, rq_depth=rq_depth, access=access,
                                       **qp_attrs)
            ends.append({"host": h, "qp": qp, "cq": cq, "pd": pd, "mr": mr, "buf": buf})
        await verbs.connect(ends[0]["qp"], ends[1]["qp"])
        return ends
