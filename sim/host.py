"""The Python side of a simulated host: memory, the Python host's TLP server, MMIO, host CPU.

The RTL around a NIC's host port is ``hw/host/host_side.py`` (the PCIe link model, the host,
the MMIO path); Python talks to it through mailboxes handshaken by counters
(``hw/lib/seq_port.py``), so that it acts once per transaction and whatever side of a clock
edge it reads on (a cocotb ``Clock`` or a clock inside the simulation). Nothing here wakes
once per clock cycle: every coroutine sleeps on a value change of a counter (a new request,
a mailbox taken) or on a ``Timer``.

* :class:`HostMemory` is a sparse byte-addressed memory (4 KiB pages created on first
  write; unwritten bytes read as zero). It does not depend on cocotb.
* :class:`PyHostDriver` serves the Python host's adapter (``hw/host/py_port.py``): once per
  down TLP it takes the whole TLP from the ``req`` mailbox, applies it with
  :class:`sim.tlp_host.PyHost` (memory writes at once, a read's whole response pushed into
  the ``cpl`` mailbox with the cycle it may leave: arrival + the host's memory time), and
  acknowledges it with the write's status. Options: seeded completion reordering, random
  delays before taking a request (back-pressure), and failing address ranges.
* :class:`RtlHostMemory` is the host CPU's view of the RTL host's on-chip memory: writes go
  through the ``cpu`` mailbox (a transaction of up to 64 bytes, done when the RTL host has
  written it); reads come from a shadow copy that the CPU writes and the write tap (every
  MWr the RTL host takes) keep current, so that checks cost no simulation;
  :meth:`RtlHostMemory.readback` reads the real memory for the final comparison.
* :class:`MmioDriver` issues MMIO writes (8 bytes, or 64-byte BlueFlame writes) and reads
  through the ``mmio_cmd`` / ``mmio_resp`` mailboxes; the latency is in RTL.
* :func:`wait_change` waits for a counter to change.

Write logs (``write_log``, a list or None) record ``(addr, len)`` of every DMA write the host
took, for the scoreboard's check that the NIC wrote nothing outside registered memory.
``on_write`` (a callable or None) is called with ``(addr, len)`` of every DMA write once it
is in memory (and in the shadow): the harness wakes the threads waiting on a CQ with it, as
a CPU polling the CQ's cache line would see the CQE arrive.
"""

from __future__ import annotations

import collections
import random

from hw.formats import TLP_DOWN_HDR, TlpKind, TlpStatus
from hw.host.py_port import py_cpl_layout, py_req_layout
from hw.host.rtl_host import CPU_REQ
from hw.interfaces import MMIO_REQ
from .tlp_host import PyHost, TlpHost

__all__ = ["HostMemory", "PyHostDriver", "RtlHostMemory", "MmioDriver", "LayoutCodec",
           "wait_change", "SeqInPort", "SeqOutPort"]

PAGE = 4096
_ADDR_LIMIT = 1 << 64
_M16 = 0xFFFF


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

    def get(self, value, name):
        off, mask = self.fields[name]
        return (int(value) >> off) & mask

    def encode(self, **kw):
        v = 0
        for n, x in kw.items():
            off, mask = self.fields[n]
            if x < 0 or x > mask:
                raise ValueError(f"field {n} value {x} does not fit in {mask.bit_length()} bits")
            v |= x << off
        return v


async def wait_change(signal):
    """Wait until ``signal`` changes value."""
    from cocotb.triggers import ValueChange
    await ValueChange(signal)


class SeqInPort:
    """Python's end of a :class:`~hw.lib.seq_port.SeqIn` mailbox (Python -> RTL): ``put``
    writes the item and counts ``seq`` up; the next ``put`` waits until the RTL took it.

    Construct it while the design is held in reset (or in the time step the reset is
    raised): it sets ``seq`` to 0, the reset value of ``taken``, so that no stale count of
    an earlier test makes the RTL take an item."""

    def __init__(self, data, seq, taken):
        self.data, self.seq, self.taken = data, seq, taken
        self.n = 0
        self.data.value = 0
        self.seq.value = self.n

    async def wait_taken(self):
        while (int(self.taken.value) & _M16) != self.n:
            await wait_change(self.taken)

    async def put(self, value):
        await self.wait_taken()
        self.data.value = value
        self.n = (self.n + 1) & _M16
        self.seq.value = self.n


class SeqOutPort:
    """Python's end of a :class:`~hw.lib.seq_port.SeqOut` mailbox (RTL -> Python): ``get``
    waits for the next item and returns it (the integer of the data port); ``ack`` frees the
    mailbox for the next one (``get`` does it unless ``ack=False``)."""

    def __init__(self, data, seq, ack):
        self.data, self.seq, self.ackp = data, seq, ack
        self.n = 0
        self.ackp.value = 0

    def ready(self):
        return (int(self.seq.value) & _M16) != self.n

    async def get(self, ack=True):
        while not self.ready():
            await wait_change(self.seq)
        value = int(self.data.value)
        if ack:
            self.ack()
        return value

    def ack(self):
        self.n = (self.n + 1) & _M16
        self.ackp.value = self.n


class PyHostDriver:
    """Serves a Python host adapter's ``py_*`` ports (see the module docstring).

    dut, prefix   the cocotb top and the port prefix (``"a_py_"``).
    mem           the :class:`HostMemory`.
    cfg           the :class:`hw.config.SystemConfig` (data width, TLP sizes, completion
                  size, host memory time, reordering).
    backpressure  None, or the probability that the host waits 1..4 cycles before it takes
                  a request (the link then stalls).
    fail          ``fail(addr, len, is_write) -> TlpStatus or None``: requests touching the
                  range get that error status.

    Counters: ``reads``, ``writes``, ``wakeups`` (resumptions of the driver's coroutines),
    and ``py`` (the :class:`sim.tlp_host.PyHost`: ``reordered``).
    """

    def __init__(self, dut, prefix, mem, cfg, *, backpressure=None, seed=0, fail=None,
                 mem_cycles=None):
        from hw.host.host_side import MIN_TURNAROUND
        nic, host = cfg.nic, cfg.host
        if backpressure is not None and not 0.0 <= backpressure < 1.0:
            raise ValueError(f"backpressure must be None or a probability in [0, 1), "
                             f"not {backpressure!r}")
        self.W = nic.data_bytes
        self.mem = mem
        self.tlp = TlpHost(mem, self.W, cpl_bytes=host.cpl_bytes, max_payload=nic.max_payload,
                           fail=fail)
        if mem_cycles is None:
            mem_cycles = max(MIN_TURNAROUND, nic.cycles(host.host_mem_ns))
        self.py = PyHost(self.tlp, mem_cycles=mem_cycles, reorder=host.reorder, seed=seed)
        self.period_ps = int(round(1e6 / nic.clock_mhz))
        self.bp = backpressure or 0.0
        self.rng = random.Random(seed)
        self.req_bytes = nic.max_payload + self.W
        self.req_codec = LayoutCodec(py_req_layout(self.W, nic.max_payload))
        self.hdr_codec = LayoutCodec(TLP_DOWN_HDR)
        self.cpl_codec = LayoutCodec(py_cpl_layout(self.W, nic.max_read_request))

        def sig(name):
            return getattr(dut, prefix + name)

        self.req = SeqOutPort(sig("req"), sig("req_seq"), sig("req_ack"))
        self.req_status = sig("req_status")
        self.req_status.value = 0
        self.cpl = SeqInPort(sig("cpl"), sig("cpl_seq"), sig("cpl_taken"))
        self.reads = self.writes = self.wakeups = 0
        self.write_log = self.on_write = None
        self._pushes = collections.deque()
        from cocotb.triggers import Event
        self._push_event = Event()
        self._tasks = []

    def start(self):
        """Start serving (once the design is out of reset)."""
        import cocotb
        self._tasks = [cocotb.start_soon(self._req_loop()), cocotb.start_soon(self._cpl_loop())]

    async def _req_loop(self):
        from cocotb.triggers import First, Timer, ValueChange
        rc, hc = self.req_codec, self.hdr_codec
        while True:
            if not self.req.ready():
                if self.py.held is not None:
                    # a held-back response goes out if no other read comes soon
                    await First(ValueChange(self.req.seq), Timer(64 * self.period_ps, "ps"))
                    self.wakeups += 1
                    if not self.req.ready():
                        self._queue(self.py.flush())
                    continue
                await wait_change(self.req.seq)
                self.wakeups += 1
                continue
            if self.bp and self.rng.random() < self.bp:
                await Timer(self.rng.randint(1, 4) * self.period_ps, "ps")
                self.wakeups += 1
            v = await self.req.get(ack=False)
            hv = rc.get(v, "hdr")
            hdr = hc.decode(hv)
            if hdr["kind"] == TlpKind.MWR.value:
                self.writes += 1
                words = rc.get(v, "data").to_bytes(self.req_bytes, "little")
                st, pushes = self.py.request(hdr, 0, words)
                if st == TlpStatus.SC.value:
                    if self.write_log is not None:
                        self.write_log.append((hdr["addr"], hdr["len"]))
                    if self.on_write is not None:
                        self.on_write(hdr["addr"], hdr["len"])
            else:
                self.reads += 1
                st, pushes = self.py.request(hdr, rc.get(v, "time"))
            self.req_status.value = st
            self.req.ack()
            self._queue(pushes)

    def _queue(self, pushes):
        if pushes:
            self._pushes.extend(pushes)
            self._push_event.set()

    async def _cpl_loop(self):
        cc = self.cpl_codec
        while True:
            if not self._pushes:
                self._push_event.clear()
                await self._push_event.wait()
                self.wakeups += 1
                continue
            q = self._pushes.popleft()
            await self.cpl.put(cc.encode(tag=q["tag"], status=q["status"], addr=q["addr"],
                                         len=q["len"], due=q["due"],
                                         data=int.from_bytes(q["data"], "little")))


class RtlHostMemory:
    """The host CPU's view of the RTL host's memory (see the module docstring).

    ``read`` is synchronous (the shadow), ``write`` a coroutine (through the CPU port).
    The window is ``[base, base + size)``; writes outside it are refused with ValueError.

    ``mirror=False`` does not follow the write tap (Python then never wakes for the NIC's
    DMA writes: full-speed runs): ``read`` returns a coroutine that reads the real memory
    through the CPU port, except inside the ranges given to :meth:`watch` (the verbs layer
    watches its CQ rings). Those the shadow keeps current from the host's event line: at
    each step of ``cqe_events`` (one per CQE write, which the NIC marks ``th``) the write
    tap holds that very write, so one wake-up and one read of the tap bring the CQE into
    the shadow, and ``on_write`` is called for it; ``read`` is then synchronous there. (The
    NIC writes a CQ ring with CQE writes only, the host CPU through :meth:`write`, which
    updates the shadow too.) ``events`` counts those wake-ups.
    """

    def __init__(self, dut, prefix, cfg, *, mirror=True):
        host = cfg.host
        self.mirror = mirror
        self.base, self.size = host.rtl_mem_base, host.rtl_mem_bytes
        self.shadow = HostMemory()
        self.cpu_codec = LayoutCodec(CPU_REQ)
        self.cpu = SeqInPort(getattr(dut, prefix + "cpu"), getattr(dut, prefix + "cpu_seq"),
                             getattr(dut, prefix + "cpu_taken"))
        self.rdata = SeqOutPort(getattr(dut, prefix + "cpu_rdata"),
                                getattr(dut, prefix + "cpu_rdata_seq"),
                                getattr(dut, prefix + "cpu_rdata_ack"))
        self.tap = getattr(dut, prefix + "wtap")
        self.tap_count = getattr(dut, prefix + "wtap_count")
        self.tap_codec = LayoutCodec(py_req_layout(cfg.nic.data_bytes, cfg.nic.max_payload))
        self.hdr_codec = LayoutCodec(TLP_DOWN_HDR)
        self.W = cfg.nic.data_bytes
        self.req_bytes = cfg.nic.max_payload + self.W
        self.event_count = getattr(dut, prefix + "cqe_events")
        self.write_log = self.on_write = None
        self.writes = self.cpu_writes = self.cpu_reads = self.wakeups = self.events = 0
        self._watched = []          # [(lo, hi)] read from the shadow when not mirroring
        from cocotb.triggers import Lock
        self._lock = Lock()
        self._task = None

    def start(self):
        """Start mirroring the write tap, or following the event line (once the design is
        out of reset)."""
        import cocotb
        self._task = cocotb.start_soon(self._tap_loop() if self.mirror else self._event_loop())

    def watch(self, addr, n):
        """Keep ``[addr, addr + n)`` (a CQ ring) in the shadow from the event line."""
        self._check(addr, n)
        self._watched.append((addr, addr + n))

    def _is_watched(self, addr, n):
        return any(lo <= addr and addr + n <= hi for lo, hi in self._watched)

    def _check(self, addr, n):
        if not (self.base <= addr and addr + n <= self.base + self.size):
            raise ValueError(f"host address range [{addr:#x}, +{n}) is outside the RTL host's "
                             f"memory [{self.base:#x}, {self.base + self.size:#x})")

    def read(self, addr, n):
        if not self.mirror and not self._is_watched(addr, n):
            return self.readback(addr, n)
        return self.shadow.read(addr, n)

    async def write(self, addr, data):
        data = bytes(data)
        self._check(addr, len(data))
        async with self._lock:
            for off in range(0, len(data), 64):
                chunk = data[off:off + 64]
                await self.cpu.put(self.cpu_codec.encode(
                    we=1, addr=addr + off, len=len(chunk), data=int.from_bytes(chunk, "little")))
                self.cpu_writes += 1
            # done when the RTL host has written the last chunk
            await self.cpu.wait_taken()
        if self.mirror or self._watched:
            self.shadow.write(addr, data)

    async def readback(self, addr, n):
        """Read the RTL host's real memory through the CPU port."""
        self._check(addr, n)
        out = bytearray()
        async with self._lock:
            for off in range(0, n, 64):
                k = min(64, n - off)
                await self.cpu.put(self.cpu_codec.encode(we=0, addr=addr + off, len=k, data=0))
                self.cpu_reads += 1
                v = await self.rdata.get()
                out += v.to_bytes(64, "little")[:k]
        return bytes(out)

    def _tapped(self):
        """``(addr, bytes)`` of the MWr the write tap holds."""
        v = int(self.tap.value)
        hdr = self.hdr_codec.decode(self.tap_codec.get(v, "hdr"))
        a, n = hdr["addr"], hdr["len"]
        words = self.tap_codec.get(v, "data").to_bytes(self.req_bytes, "little")
        off = a % self.W
        return a, words[off:off + n]

    async def _event_loop(self):
        seen = int(self.event_count.value)
        while True:
            await wait_change(self.event_count)
            now = int(self.event_count.value)
            if now == seen:
                continue
            if (now - seen) & 0xFFFFFFFF != 1:
                raise AssertionError(f"event line: {now - seen} CQE writes in one step, "
                                     f"expected 1")
            seen = now
            self.events += 1
            a, data = self._tapped()
            if self.base <= a and a + len(data) <= self.base + self.size:
                self.shadow.write(a, data)
                if self.on_write is not None:
                    self.on_write(a, len(data))

    async def _tap_loop(self):
        seen = int(self.tap_count.value)
        tc, hc = self.tap_codec, self.hdr_codec
        while True:
            await wait_change(self.tap_count)
            self.wakeups += 1
            now = int(self.tap_count.value)
            if now == seen:
                continue
            if (now - seen) & 0xFFFFFFFF != 1:
                raise AssertionError(f"write tap: {now - seen} MWrs in one step, expected 1")
            seen = now
            v = int(self.tap.value)
            hdr = hc.decode(tc.get(v, "hdr"))
            a, n = hdr["addr"], hdr["len"]
            if self.base <= a and a + n <= self.base + self.size:
                words = tc.get(v, "data").to_bytes(self.req_bytes, "little")
                off = a % self.W
                self.shadow.write(a, words[off:off + n])
                self.writes += 1
                if self.write_log is not None:
                    self.write_log.append((a, n))
                if self.on_write is not None:
                    self.on_write(a, n)


class MmioDriver:
    """MMIO from the host CPU (see the module docstring).

    ``await write(addr, value)``: an 8-byte posted write; returns once it is on its way (the
    MMIO master took it). ``await write_bf(addr, data)``: a 64-byte write-combined write
    (BlueFlame). ``await read(addr)``: waits for the NIC's answer (the RTL adds the latency
    both ways). Concurrent callers (host threads) are served in order of arrival; the
    latency of posted writes overlaps.
    """

    def __init__(self, dut, prefix):
        from cocotb.triggers import Lock
        self.cmd = SeqInPort(getattr(dut, prefix + "cmd"), getattr(dut, prefix + "cmd_seq"),
                             getattr(dut, prefix + "cmd_taken"))
        self.resp = SeqOutPort(getattr(dut, prefix + "resp"), getattr(dut, prefix + "resp_seq"),
                               getattr(dut, prefix + "resp_ack"))
        self.codec = LayoutCodec(MMIO_REQ)
        self._lock = Lock()
        self._rlock = Lock()
        self.writes = self.reads = self.bf_writes = 0

    async def write(self, addr, value):
        async with self._lock:
            await self.cmd.put(self.codec.encode(we=1, addr=addr, len=8,
                                                 data=int(value) & ((1 << 64) - 1)))
        self.writes += 1

    async def write_bf(self, addr, data):
        data = bytes(data)
        if len(data) != 64:
            raise ValueError(f"a BlueFlame write carries 64 bytes, not {len(data)}")
        async with self._lock:
            await self.cmd.put(self.codec.encode(we=1, addr=addr, len=64,
                                                 data=int.from_bytes(data, "little")))
        self.bf_writes += 1

    async def read(self, addr):
        async with self._rlock:               # one read in flight: answers pair with reads
            async with self._lock:
                await self.cmd.put(self.codec.encode(we=0, addr=addr, len=8, data=0))
            v = await self.resp.get()
        self.reads += 1
        return v & ((1 << 64) - 1)
