"""Per-queue state in a memory: the write ports of :class:`~hw.lib.reg_array.RegArray`,
asynchronous read ports, and a reset through valid bits or a sweep of every element.

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

Reset: a memory has no reset. Two ways back to ``init`` (parameter ``reset``):

* ``"valid"`` (the default): one valid bit per element, in a register that the reset
  clears all at once (as a cache flash-clears its tag valid bits). An element whose bit is
  clear reads ``init``; any write to it sets the bit. The array is usable in the cycle
  after the reset (``busy`` is always low), at the cost of ``n`` flip-flops and a bit
  select per read and write port.
* ``"sweep"``: after a reset, for ``n`` cycles ``busy`` is high, the sweep writes ``init``
  into element 0, 1, ... ``n - 1``, and the ports' writes are ignored. A block using the
  array holds off its work until ``busy`` falls (an FPGA design clears its RAMs the same
  way). No flip-flop per element.

The memory's initial contents are ``init`` in both, so the array is right from the first
cycle of a simulation.

Parameters: ``n`` (elements) in [1, 65536], ``shape`` (of each element), ``ports`` (names of
the write ports in priority order, lowest first; 1 to 8) and ``reads`` (names of the read
ports; 1 to 16): distinct identifiers, all distinct, none ``busy``; ``init`` (the reset value of
every element); ``reset`` (``"valid"`` or ``"sweep"``, above).

Ports: ``busy: Out(1)``; per write port ``p``: ``p: In(RegWriteSignature(n, shape))``
(``en``, ``addr``, ``data``); per read port ``r``: ``r: In(MemReadSignature(n, shape))``
(``addr`` driven by the reader, ``data`` the element at ``addr`` in the same cycle).
"""

from amaranth.hdl import Const, Module, Mux, Shape, Signal
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


def _names_ok(names, most):
    return (1 <= len(names) <= most and len(set(names)) == len(names)
            and all(isinstance(p, str) and p.isidentifier() and p != "busy" for p in names))


class MemArray(wiring.Component):
    def __init__(self, n, shape, ports, reads, *, init=0, reset="valid"):
        check_int("n", n, 1, 1 << 16)
        if reset not in ("valid", "sweep"):
            raise ValueError(f"reset must be 'valid' or 'sweep', not {reset!r}")
        self.reset = reset
        ports, reads = tuple(ports), tuple(reads)
        if not _names_ok(ports, 8):
            raise ValueError(f"ports must be 1 to 8 distinct identifiers other than 'busy', "
                             f"not {ports!r}")
        if not _names_ok(reads, 16) or set(reads) & set(ports):
            raise ValueError(f"reads must be 1 to 16 distinct identifiers other than 'busy' "
                             f"and the write ports, not {reads!r}")
        self.n = n
        self.shape = Shape.cast(shape)
        self.port_names = ports
        self.read_names = reads
        self.init = init
        self._bound = []            # (index value, read port) taken by arr[index]
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

    def __getitem__(self, index):
        """The element at ``index`` this cycle, for a parent that reads by index as from a
        :class:`~hw.lib.reg_array.RegArray`: each distinct index value (the same Python
        object) takes the next free read port. The parent adds :meth:`read_addrs` to its
        ``comb`` domain once, at the top level of its ``elaborate``."""
        for value, r in self._bound:
            if value is index:
                return r.data
        if len(self._bound) == len(self.read_names):
            raise ValueError(f"all {len(self.read_names)} read ports are in use: {index!r} "
                             f"would need one more")
        r = getattr(self, self.read_names[len(self._bound)])
        self._bound.append((index, r))
        return r.data

    def read_addrs(self):
        """The statements that point the read ports taken by ``arr[index]`` at their
        indices (for the parent's ``m.d.comb``, outside any conditional)."""
        return [r.addr.eq(value) for value, r in self._bound]

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
        ports = [getattr(self, p) for p in self.port_names]
        valid = Signal(n) if self.reset == "valid" else None
        for name in self.read_names:
            r = getattr(self, name)
            rp = mem.read_port(domain="comb")
            m.d.comb += rp.addr.eq(r.addr)
            if valid is None:
                m.d.comb += r.data.eq(rp.data)
            else:       # an element not written since the reset reads init
                m.d.comb += r.data.eq(Mux(valid.bit_select(r.addr, 1), rp.data, self.init))
        if valid is None:
            busy = self._sweep(m, mem)
        else:
            # the valid bits: cleared by the reset, set by any write to the element
            for p in ports:
                with m.If(p.en):
                    m.d.sync += valid.bit_select(p.addr, 1).eq(1)
            busy = Const(0)
        m.d.comb += self.busy.eq(busy)

        for k, p in enumerate(ports):
            wp = mem.write_port()
            # a later port writing the same element this cycle wins
            beaten = 0
            for later in ports[k + 1:]:
                beaten = beaten | (later.en & (later.addr == p.addr))
            m.d.comb += [wp.en.eq(p.en & ~busy & ~beaten), wp.addr.eq(p.addr),
                         wp.data.eq(p.data)]
        return m

    def _sweep(self, m, mem):
        """After a reset, write init into every element, one per cycle: returns busy."""
        n = self.n
        busy = Signal(init=1)
        at = Signal(range(n))
        with m.If(busy):
            m.d.sync += at.eq(at + 1)
            with m.If(at == n - 1):
                m.d.sync += busy.eq(0)
        sw = mem.write_port()
        m.d.comb += [sw.en.eq(busy), sw.addr.eq(at), sw.data.eq(self.init)]
        return busy
