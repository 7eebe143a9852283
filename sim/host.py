"""Transaction-level host model for cocotb simulations: memory, DMA target and MMIO master.

* :class:`HostMemory` is a sparse byte-addressed memory (4 KiB pages created on first
  write; unwritten bytes read as zero). It does not depend on cocotb.
* :class:`DmaSlave` answers the DMA master ports of an RTL design (the ``rd_req`` /
  ``rd_resp`` / ``wr`` streams of ``hw/interfaces.py``) from a :class:`HostMemory`, with the
  latencies and bandwidth of a :class:`hw.config.HostConfig`.
* :class:`Mmio` drives the host-to-NIC register bus of ``MmioSignature``.

How the models avoid running Python on every clock (the simulation runs at Verilator speed
while the host is idle): the clock is cocotb's C++ (GPI) clock, and every coroutine here
sleeps on an event that marks real work:

* a request/write acceptor whose ``valid`` input is low waits on a *value-change* trigger,
  ``RisingEdge(<prefix>..._valid)``, not on the clock; it samples on ``RisingEdge(clk)``
  only while ``valid`` is high (one wake-up per beat or per back-pressure cycle);
* the read responder sleeps on a :class:`cocotb.triggers.Event` while no read is
  outstanding and on a :class:`~cocotb.triggers.Timer` to the known time the next response
  is due (request time + ``dma_read_ns``), then drives one beat per clock;
* posted writes become visible in memory from a coroutine that sleeps on a ``Timer`` until
  ``dma_write_ns`` after each write's last beat (or on an ``Event`` when none is pending).

Sampling convention: after ``await RisingEdge(clk)`` the signal values read are those the
design saw at that edge (Verilator has not evaluated the edge yet), and values written are
applied after the edge, so a handshake happened at an edge iff ``valid`` and ``ready`` read
as 1 there. Every beat is driven right after a clock edge.

Ordering (PCIe): reads are answered in request order. A write is *before* a read when its
last beat was accepted at or before the clock edge that accepted the read request; the read
then returns the written data even if ``dma_write_ns`` has not elapsed (a read does not
pass an earlier posted write). A write accepted after a read request may or may not be seen
by it (posted writes may pass non-posted reads), depending on the latencies.

Timing: the first beat of a read response is driven at the first clock edge at or after
``request edge + max(dma_read_ns, one cycle)``. Each direction is a link of ``pcie_gbps``
(bytes of payload only, no TLP overhead): a beat of ``n`` bytes occupies it for
``8 n / pcie_gbps`` ns, so a beat is not driven (reads) or accepted (writes) before the link
is free. Written data is visible ``dma_write_ns`` after the write's last beat.
"""

from __future__ import annotations

import collections
import random

from hw.interfaces import DMA_READ_REQ, dma_read_data_layout, dma_write_layout

__all__ = ["HostMemory", "DmaSlave", "Mmio", "LayoutCodec", "start_clock_and_reset"]

PAGE = 4096
_ADDR_LIMIT = 1 << 64


class HostMemory:
    """Sparse byte memory: a dict of 4 KiB ``bytearray`` pages, zero where never written."""

    def __init__(self):
        self._pages = {}

    @staticmethod
    def _check(addr, n):
        if not isinstance(addr, int) or not 0 <= addr or addr + n > _ADDR_LIMIT or n < 0:
            raise ValueError(f"host address range [{addr!r}, +{n}) is outside [0, 2**64)")

    def read(self, addr, n):
        """Return ``n`` bytes from ``addr`` as ``bytes``."""
        self._check(addr, n)
        out = bytearray(n)
        pos = 0
        while pos < n:
            a = addr + pos
            page, off = divmod(a, PAGE)
            k = min(PAGE - off, n - pos)
            p = self._pages.get(page)
            if p is not None:
                out[pos:pos + k] = p[off:off + k]
            pos += k
        return bytes(out)

    def write(self, addr, data):
        """Write the bytes ``data`` at ``addr``."""
        data = memoryview(bytes(data))
        n = len(data)
        self._check(addr, n)
        pos = 0
        while pos < n:
            a = addr + pos
            page, off = divmod(a, PAGE)
            k = min(PAGE - off, n - pos)
            p = self._pages.get(page)
            if p is None:
                p = self._pages[page] = bytearray(PAGE)
            p[off:off + k] = data[pos:pos + k]
            pos += k

    def fill(self, addr, n, value=0):
        """Set ``n`` bytes from ``addr`` to the byte ``value``."""
        if not 0 <= value <= 255:
            raise ValueError(f"value must be a byte in [0, 255], not {value!r}")
        self.write(addr, bytes([value]) * n)

    def read_int(self, addr, n=8):
        """Little-endian unsigned integer of ``n`` bytes at ``addr``."""
        return int.from_bytes(self.read(addr, n), "little")

    def write_int(self, addr, value, n=8):
        self.write(addr, int(value).to_bytes(n, "little"))

    def __len__(self):
        """Bytes allocated (whole pages)."""
        return PAGE * len(self._pages)


class LayoutCodec:
    """Encode/decode the flat integer of an Amaranth ``StructLayout`` port by field offsets."""

    def __init__(self, layout):
        self.fields = {}
        for name, f in layout:
            self.fields[name] = (f.offset, (1 << f.width) - 1)
        self.width = layout.size

    def decode(self, value):
        value = int(value)
        return {n: (value >> off) & mask for n, (off, mask) in self.fields.items()}

    def encode(self, **kw):
        v = 0
        for n, x in kw.items():
            off, mask = self.fields[n]
            if x < 0 or x > mask:
                raise ValueError(f"field {n} value {x} does not fit in {mask.bit_length()} bits")
            v |= x << off
        return v


def _sim_ps():
    from cocotb.simtime import get_sim_time
    return int(get_sim_time("ps"))


class _Write:
    __slots__ = ("t_done", "addr", "data")

    def __init__(self, t_done, addr, data):
        self.t_done, self.addr, self.data = t_done, addr, data


class DmaSlave:
    """Host side of an RTL DMA master (see the module docstring for timing and ordering).

    dut          the cocotb top-level handle.
    prefix       port name prefix: the design has ``<prefix>rd_req__valid``,
                 ``<prefix>rd_req__ready``, ``<prefix>rd_req__payload`` and the same for
                 ``rd_resp`` and ``wr`` (give ``"dma__"`` for a sub-interface ``dma``).
    mem          the :class:`HostMemory` read and written.
    clk          the clock handle (e.g. ``dut.clk``), driven by a ``cocotb.clock.Clock``.
    host_cfg     :class:`hw.config.HostConfig` (``dma_read_ns``, ``dma_write_ns``,
                 ``pcie_gbps``).
    clock_mhz    frequency of ``clk``.
    backpressure None (ready always high, no valid gaps) or a probability in [0, 1): each
                 cycle ``ready`` of ``rd_req``/``wr`` is low and a ``rd_resp`` beat is
                 delayed by one idle cycle with that probability.
    seed         seed of the back-pressure random generator.
    data_bytes   beat width W; by default taken from the width of ``rd_resp__payload``.
    read_only    the design has no ``wr`` port.

    Counters: ``reads``, ``read_bytes``, ``read_beats``, ``writes``, ``write_bytes``,
    ``write_beats``; ``wakeups`` counts every time one of the model's coroutines resumed
    (it stays constant while the DMA ports are idle). Protocol errors (zero length, ``nbytes``/``last`` inconsistent with
    ``len``) raise ``AssertionError`` in the model's task, which fails the cocotb test, and
    are also listed in ``errors``.
    """

    def __init__(self, dut, prefix, mem, clk, host_cfg, clock_mhz, backpressure=None,
                 seed=0, data_bytes=None, read_only=False):
        import cocotb
        from cocotb.triggers import Event

        if backpressure is not None and not 0.0 <= backpressure < 1.0:
            raise ValueError(f"backpressure must be None or a probability in [0, 1), "
                             f"not {backpressure!r}")
        if not 0 < clock_mhz <= 10_000:
            raise ValueError(f"clock_mhz must be in (0, 10000], not {clock_mhz!r}")
        self.mem = mem
        self.clk = clk
        self.cfg = host_cfg
        self.period_ps = int(round(1e6 / clock_mhz))
        self.read_ps = int(round(host_cfg.dma_read_ns * 1000))
        self.write_ps = int(round(host_cfg.dma_write_ns * 1000))
        self.ps_per_byte = 8000.0 / host_cfg.pcie_gbps
        self.bp = backpressure or 0.0
        self.rng = random.Random(seed)

        def sig(name):
            return getattr(dut, prefix + name)

        self.rq_valid, self.rq_ready, self.rq_payload = (
            sig("rd_req__valid"), sig("rd_req__ready"), sig("rd_req__payload"))
        self.rs_valid, self.rs_ready, self.rs_payload = (
            sig("rd_resp__valid"), sig("rd_resp__ready"), sig("rd_resp__payload"))
        if data_bytes is None:
            width = len(self.rs_payload)
            for w in (1, 2, 4, 8, 16, 32, 64, 128):
                if dma_read_data_layout(w).size == width:
                    data_bytes = w
                    break
            else:
                raise ValueError(f"cannot infer data_bytes from {prefix}rd_resp__payload "
                                 f"width {width}")
        self.W = data_bytes
        self.req_codec = LayoutCodec(DMA_READ_REQ)
        self.resp_codec = LayoutCodec(dma_read_data_layout(data_bytes))
        self.wr_codec = LayoutCodec(dma_write_layout(data_bytes))
        if len(self.rs_payload) != self.resp_codec.width:
            raise ValueError(f"{prefix}rd_resp__payload is {len(self.rs_payload)} bits, "
                             f"expected {self.resp_codec.width} for data_bytes={data_bytes}")

        self.reads = self.read_bytes = self.read_beats = 0
        self.writes = self.write_bytes = self.write_beats = 0
        self.errors = []
        self.wakeups = 0                  # resumptions of the model's coroutines
        self.last_read_beat_ps = None     # time of the last read beat transferred

        self._rd_queue = collections.deque()       # (t_accept, addr, len, tag)
        self._rd_event = Event()
        self._pending = collections.deque()        # _Write, in completion order
        self._wr_event = Event()
        self.visible = Event()                     # set whenever writes became visible
        self.write_log = None                      # a list to record (addr, len) of writes
        self._rd_link_free = 0
        self._wr_link_free = 0
        self._busy_reads = 0
        self._wr_cur = None                        # write being received: [addr, len, data]

        self.rq_ready.value = 0
        self.rs_valid.value = 0
        self.rs_payload.value = 0
        self._tasks = [cocotb.start_soon(self._rd_req_loop()),
                       cocotb.start_soon(self._rd_resp_loop())]
        if not read_only:
            self.w_valid, self.w_ready, self.w_payload = (
                sig("wr__valid"), sig("wr__ready"), sig("wr__payload"))
            self.w_ready.value = 0
            self._tasks += [cocotb.start_soon(self._wr_loop()),
                            cocotb.start_soon(self._wr_apply_loop())]

    # -- helpers -------------------------------------------------------------------------

    def _fail(self, msg):
        self.errors.append(msg)
        raise AssertionError(msg)

    def _chance(self):
        """True with probability ``backpressure`` (a stalled cycle)."""
        return self.bp > 0.0 and self.rng.random() < self.bp

    async def _edge_at_or_after(self, t_ps):
        """Return right after the first rising clock edge at or after ``t_ps``."""
        from cocotb.triggers import RisingEdge, Timer
        now = _sim_ps()
        if t_ps - now > 2 * self.period_ps:
            await Timer(t_ps - now - self.period_ps, "ps")
            self.wakeups += 1
        await RisingEdge(self.clk)
        self.wakeups += 1
        while _sim_ps() < t_ps:
            await RisingEdge(self.clk)
            self.wakeups += 1

    def _apply_writes_before(self, t_ps):
        """Make every write whose last beat was accepted at or before ``t_ps`` visible."""
        applied = False
        while self._pending and self._pending[0].t_done <= t_ps:
            w = self._pending.popleft()
            self.mem.write(w.addr, w.data)
            applied = True
        if applied:
            self.visible.set()

    @property
    def last_read_beat_ns(self):
        return None if self.last_read_beat_ps is None else self.last_read_beat_ps / 1000.0

    @property
    def idle(self):
        """No read outstanding, no write in flight or waiting to become visible."""
        return (not self._rd_queue and self._busy_reads == 0 and not self._pending
                and self._wr_cur is None)

    async def wait_writes(self):
        """Wait until every write accepted so far is visible in memory (honest timing)."""
        from cocotb.triggers import Timer
        while self._pending:
            due = self._pending[-1].t_done + self.write_ps
            now = _sim_ps()
            await Timer(max(1, due - now + 1), "ps")

    def flush(self):
        """Make all accepted writes visible now (ignoring ``dma_write_ns``)."""
        self._apply_writes_before(1 << 80)

    # -- read requests -------------------------------------------------------------------

    async def _rd_req_loop(self):
        from cocotb.triggers import RisingEdge
        valid, ready, payload = self.rq_valid, self.rq_ready, self.rq_payload
        while True:
            if not int(valid.value):
                ready.value = 0
                await RisingEdge(valid)                 # value change: no clock wake-ups
                self.wakeups += 1
            r = 0 if self._chance() else 1
            ready.value = r
            await RisingEdge(self.clk)
            self.wakeups += 1
            if r and int(valid.value):
                req = self.req_codec.decode(payload.value)
                if req["len"] == 0:
                    self._fail(f"DMA read request with len 0 at addr {req['addr']:#x}")
                self.reads += 1
                self._rd_queue.append((_sim_ps(), req["addr"], req["len"], req["tag"]))
                self._rd_event.set()

    # -- read responses ------------------------------------------------------------------

    async def _rd_resp_loop(self):
        from cocotb.triggers import RisingEdge
        valid, ready, payload = self.rs_valid, self.rs_ready, self.rs_payload
        W, period = self.W, self.period_ps
        at_edge = False
        while True:
            if not self._rd_queue:
                valid.value = 0
                self._rd_event.clear()
                await self._rd_event.wait()
                self.wakeups += 1
                at_edge = False
            t_acc, addr, n, tag = self._rd_queue.popleft()
            self._busy_reads += 1
            start = t_acc + max(self.read_ps, period)
            if not (at_edge and _sim_ps() >= start):
                valid.value = 0
                await self._edge_at_or_after(start)
            self._apply_writes_before(t_acc)            # a read does not pass a write
            data = self.mem.read(addr, n)
            nbeats = (n + W - 1) // W
            for i in range(nbeats):
                chunk = data[i * W:(i + 1) * W]
                nb = len(chunk)
                while (_sim_ps() + period < self._rd_link_free) or self._chance():
                    valid.value = 0
                    await RisingEdge(self.clk)
                    self.wakeups += 1
                payload.value = self.resp_codec.encode(
                    data=int.from_bytes(chunk, "little"), nbytes=nb,
                    last=int(i == nbeats - 1), tag=tag)
                valid.value = 1
                while True:
                    await RisingEdge(self.clk)
                    self.wakeups += 1
                    if int(ready.value):
                        break
                t = _sim_ps()
                self._rd_link_free = max(self._rd_link_free, t) + nb * self.ps_per_byte
                self.last_read_beat_ps = t
                self.read_beats += 1
                self.read_bytes += nb
            self._busy_reads -= 1
            at_edge = True
            if not self._rd_queue:
                valid.value = 0

    # -- writes --------------------------------------------------------------------------

    async def _wr_loop(self):
        from cocotb.triggers import RisingEdge
        valid, ready, payload = self.w_valid, self.w_ready, self.w_payload
        W, period = self.W, self.period_ps
        while True:
            if not int(valid.value):
                ready.value = 0
                await RisingEdge(valid)                 # value change: no clock wake-ups
                self.wakeups += 1
            r = 0 if (_sim_ps() + period < self._wr_link_free or self._chance()) else 1
            ready.value = r
            await RisingEdge(self.clk)
            self.wakeups += 1
            if not (r and int(valid.value)):
                continue
            beat = self.wr_codec.decode(payload.value)
            t = _sim_ps()
            nb = beat["nbytes"]
            self._wr_link_free = max(self._wr_link_free, t) + nb * self.ps_per_byte
            self.write_beats += 1
            cur = self._wr_cur
            if cur is None:
                if beat["len"] == 0:
                    self._fail(f"DMA write with len 0 at addr {beat['addr']:#x}")
                cur = self._wr_cur = [beat["addr"], beat["len"], bytearray()]
            if not 1 <= nb <= W:
                self._fail(f"DMA write beat nbytes={nb} outside [1, {W}]")
            cur[2] += beat["data"].to_bytes(W, "little")[:nb]
            if beat["last"]:
                if len(cur[2]) != cur[1]:
                    self._fail(f"DMA write to {cur[0]:#x}: len={cur[1]} but the beats "
                               f"carry {len(cur[2])} bytes")
                self._pending.append(_Write(t, cur[0], bytes(cur[2])))
                if self.write_log is not None:
                    self.write_log.append((cur[0], cur[1]))
                self.writes += 1
                self.write_bytes += cur[1]
                self._wr_cur = None
                self._wr_event.set()
            elif nb != W or len(cur[2]) >= cur[1]:
                self._fail(f"DMA write to {cur[0]:#x}: beat with nbytes={nb} after "
                           f"{len(cur[2])} of {cur[1]} bytes is not marked last")

    async def _wr_apply_loop(self):
        from cocotb.triggers import Timer
        while True:
            if not self._pending:
                self._wr_event.clear()
                await self._wr_event.wait()
                self.wakeups += 1
                continue
            due = self._pending[0].t_done + self.write_ps
            now = _sim_ps()
            if due > now:
                await Timer(due - now, "ps")
                self.wakeups += 1
            self._apply_writes_before(_sim_ps() - self.write_ps)


class Mmio:
    """Host MMIO master on an ``MmioSignature`` port ``<prefix>addr/wdata/we/re/rdata/rvalid``.

    ``await write(addr, value)``: waits ``mmio_ns`` (the posted write crossing PCIe), then
    drives ``we`` for one clock cycle; returns when the NIC has taken the write.
    ``await read(addr)``: waits ``mmio_ns``, drives ``re`` for one cycle, samples ``rdata``
    in the next cycle (``rvalid`` must be high) and waits ``mmio_ns`` for the completion to
    return: two cycles plus the round trip. The latency of concurrent callers (host threads)
    overlaps, as posted writes from several cores do; only the bus cycles are serialised by
    a lock, in order of arrival.
    """

    def __init__(self, dut, prefix, clk, mmio_ns=0.0):
        from cocotb.triggers import Lock
        self.clk = clk
        self.mmio_ps = int(round(mmio_ns * 1000))
        self.addr = getattr(dut, prefix + "addr")
        self.wdata = getattr(dut, prefix + "wdata")
        self.we = getattr(dut, prefix + "we")
        self.re = getattr(dut, prefix + "re")
        self.rdata = getattr(dut, prefix + "rdata")
        self.rvalid = getattr(dut, prefix + "rvalid")
        self._lock = Lock()
        self.we.value = 0
        self.re.value = 0
        self.writes = self.reads = 0

    async def _latency(self):
        from cocotb.triggers import Timer
        if self.mmio_ps > 0:
            await Timer(self.mmio_ps, "ps")

    async def write(self, addr, value):
        from cocotb.triggers import RisingEdge
        await self._latency()
        async with self._lock:
            await RisingEdge(self.clk)
            self.addr.value = addr
            self.wdata.value = value & ((1 << 64) - 1)
            self.we.value = 1
            await RisingEdge(self.clk)                  # the NIC takes the write here
            self.we.value = 0
            self.writes += 1

    async def read(self, addr):
        from cocotb.triggers import RisingEdge
        await self._latency()
        async with self._lock:
            await RisingEdge(self.clk)
            self.addr.value = addr
            self.re.value = 1
            await RisingEdge(self.clk)                  # re sampled
            self.re.value = 0
            await RisingEdge(self.clk)                  # rdata/rvalid of the cycle after re
            if not int(self.rvalid.value):
                raise AssertionError(f"MMIO read of {addr:#x}: rvalid low the cycle after re")
            value = int(self.rdata.value)
            self.reads += 1
        await self._latency()
        return value


async def start_clock_and_reset(dut, clock_mhz, *, clk="clk", rst="rst", cycles=4):
    """Start a C++ (GPI) clock on ``dut.<clk>`` and pulse ``dut.<rst>`` for ``cycles``.

    Returns the :class:`cocotb.clock.Clock`. On return the reset is released and the
    coroutine stands right after a rising edge.
    """
    from cocotb.clock import Clock
    from cocotb.triggers import RisingEdge
    period_ps = int(round(1e6 / clock_mhz))
    clock = Clock(getattr(dut, clk), period_ps, unit="ps")
    clock.start(start_high=False)
    reset = getattr(dut, rst, None)
    if reset is not None:
        reset.value = 1
        for _ in range(cycles):
            await RisingEdge(getattr(dut, clk))
        reset.value = 0
    await RisingEdge(getattr(dut, clk))
    return clock
