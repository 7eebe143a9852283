"""Per-queue state in a memory: the write ports of :class:`~hw.lib.reg_array.RegArray`,
asynchronous read ports, and a sweep that writes the reset value into every element.

:class:`~hw.lib.reg_array.RegArray` keeps one register per element, so the simulator
evaluates every element's next-state logic every cycle (docs/performance.md: the per-QP
arrays of the requester, about 0.9 % each, a quarter of the idle ``connectx6`` system's
simulation time by perf).
:class:`MemArray` keeps the elements in a ``lib.memory.Memory``: a write is one indexed
store per port, a read one indexed load per port, whatever the number of elements, as
Corundum keeps per-queue state in RAM (``queue_manager.v``). What it gives up: the elements
cannot be scanned (no ``q[i]``); a block that needs every element at once (an eligibility
mask) keeps those fields in a ``RegArray`` or, better, turns the scan into events.

Write semantics are :class:`~hw.lib.reg_array.RegArray`'s: ports are applied in the order
given, a later port wins on the same element (an earlier port's write to an element that a
later port also writes this cycle is dropped, so two memory ports never write one row in a
cycle), and a read in the cycle of a write returns the old value.

Reset: a memory has no reset, so after a reset the array *sweeps*: for ``n`` cycles
``busy`` is high, the sweep writes ``init`` into element 0, 1, ... ``n - 1``, and the
ports' writes are ignored. A block using the array holds off its work until ``busy``
falls (an FPGA design clears its RAMs the same way). The memory's initial contents are
``init`` too, so the array is right from the first cycle of a simulation.

Parameters: ``n`` (elements) in [1, 65536], ``shape`` (of each element), ``ports`` (names of
the write ports in priority order, lowest first) and ``reads`` (names of the read ports):
1 to 8 distinct identifiers each, all distinct, none ``busy``; ``init`` (the reset value of
every element).

Ports: ``busy: Out(1)``; per write port ``p``: ``p: In(RegWriteSignature(n, shape))``
(``en``, ``addr``, ``data``); per read port ``r``: ``r: In(MemReadSignature(n, shape))``
(``addr`` driven by the reader, ``data`` the element at ``addr`` in the same cycle).
"""

from amaranth.hdl import Module, Shape, Signal
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from .checks import check_int
from .reg_array import RegWriteSignature, port_write

__all__ = ["MemArray", "MemReadSignature"]


class MemReadSignature(wiring.Signature):
    """One asynchronous read port: ``addr`` driven by the reader, ``data`` back."""

    def __init__(self, n, shape):
        super().__init__({
            "addr": Out(max(1, ceil_log2(n))),
            "data": In(shape),
        })


def _names_ok(names):
    return (1 <= len(names) <= 8 and len(set(names)) == len(names)
            and all(isinstance(p, str) and p.isidentifier() and p != "busy" for p in names))


class MemArray(wiring.Component):
    def __init__(self, n, shape, ports, reads, *, init=0):
        check_int("n", n, 1, 1 << 16)
        ports, reads = tuple(ports), tuple(reads)
        if not _names_ok(ports):
            raise ValueError(f"ports must be 1 to 8 distinct identifiers other than 'busy', "
                             f"not {ports!r}")
        if not _names_ok(reads) or set(reads) & set(ports):
            raise ValueError(f"reads must be 1 to 8 distinct identifiers other than 'busy' "
                             f"and the write ports, not {reads!r}")
        self.n = n
        self.shape = Shape.cast(shape)
        self.port_names = ports
        self.read_names = reads
        self.init = init
        members = {"busy": Out(1)}
        for p in ports:
            members[p] = In(RegWriteSignature(n, shape))
        for r in reads:
            members[r] = In(MemReadSignature(n, shape))
        super().__init__(members)

    def write(self, port, index, value):
        """Statements (for ``m.d.comb``) that make ``port`` write ``value`` at ``index``
        this cycle."""
        return port_write(self, port, index, value)

    def read(self, port, index):
        """``(statements, value)``: the statements (for ``m.d.comb``) point read port
        ``port`` at ``index``; ``value`` is the element there, this cycle."""
        if port not in self.read_names:
            raise ValueError(f"port must be one of {self.read_names!r}, not {port!r}")
        r = getattr(self, port)
        return [r.addr.eq(index)], r.data

    def elaborate(self, platform):
        m = Module()
        n = self.n
        m.submodules.mem = mem = Memory(shape=self.shape, depth=n, init=[self.init] * n)
        for name in self.read_names:
            r = getattr(self, name)
            rp = mem.read_port(domain="comb")
            m.d.comb += [rp.addr.eq(r.addr), r.data.eq(rp.data)]

        # the sweep after reset: one element per cycle
        busy = Signal(init=1)
        at = Signal(range(n))
        m.d.comb += self.busy.eq(busy)
        with m.If(busy):
            m.d.sync += at.eq(at + 1)
            with m.If(at == n - 1):
                m.d.sync += busy.eq(0)
        sw = mem.write_port()
        m.d.comb += [sw.en.eq(busy), sw.addr.eq(at), sw.data.eq(self.init)]

        ports = [getattr(self, p) for p in self.port_names]
        for k, p in enumerate(ports):
            wp = mem.write_port()
            # a later port writing the same element this cycle wins
            beaten = 0
            for later in ports[k + 1:]:
                beaten = beaten | (later.en & (later.addr == p.addr))
            m.d.comb += [wp.en.eq(p.en & ~busy & ~beaten), wp.addr.eq(p.addr),
                         wp.data.eq(p.data)]
        return m
