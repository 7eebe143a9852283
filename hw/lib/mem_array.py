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

* ``"valid"`` (the default): each element carries a *generation* number beside its value,
  in the same memory row, and a reset starts a new generation (a register the reset does
  not clear counts generations; a reset-cleared ``alive`` bit tells it that a reset has
  happened). An element whose generation is not the current one reads ``init``; any write
  stores the current generation. The array is usable in the cycle after the reset
  (``busy`` is always low) and nothing is kept per element outside the memory, so the
  simulated logic does not grow with ``n``. A scrubber (one more read and write port, the
  lowest priority) rewrites one stale element per cycle to ``init`` in the current
  generation, round robin, so that no element is left unwritten for ``2**gen_bits``
  generations and a generation number is never mistaken for a current one:
  ``gen_bits = ceil_log2(n) + 2`` and at most one generation starts per cycle. The memory
  starts all zero: generation 0, not current until the counter wraps, which takes at least
  ``4 * n`` cycles, by when the scrubber has rewritten every element once.
* ``"sweep"``: after a reset, for ``n`` cycles ``busy`` is high, the sweep writes ``init``
  into element 0, 1, ... ``n - 1``, and the ports' writes are ignored. A block using the
  array holds off its work until ``busy`` falls (an FPGA design clears its RAMs the same
  way). No flip-flop per element.

Both are right from the first cycle of a simulation: the memory of ``"sweep"`` starts with
``init`` in every element, that of ``"valid"`` with no element in the current generation.

Parameters: ``n`` (elements) in [1, 65536], ``shape`` (of each element), ``ports`` (names of
the write ports in priority order, lowest first; 1 to 8) and ``reads`` (names of the read
ports; 1 to 16): distinct identifiers, all distinct, none ``busy``; ``init`` (the reset value of
every element); ``reset`` (``"valid"`` or ``"sweep"``, above).

Ports: ``busy: Out(1)``; per write port ``p``: ``p: In(RegWriteSignature(n, shape))``
(``en``, ``addr``, ``data``); per read port ``r``: ``r: In(MemReadSignature(n, shape))``
(``addr`` driven by the reader, ``data`` the element at ``addr`` in the same cycle).
"""

from amaranth.hdl import Cat, Const, Module, Mux, Shape, Signal
from amaranth.lib import data, wiring
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


class _Write:
    """A write request that is not a port (the scrubber's): ``en`` and ``addr``."""

    def __init__(self, en, addr):
        self.en, self.addr = en, addr


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
        if self.reset == "sweep":
            m.submodules.mem = mem = Memory(shape=self.shape, depth=self.n,
                                            init=[self.init] * self.n)
            for name in self.read_names:
                r = getattr(self, name)
                rp = mem.read_port(domain="comb")
                m.d.comb += [rp.addr.eq(r.addr), r.data.eq(rp.data)]
            busy = self._sweep(m, mem)
            self._writes(m, mem, [(getattr(self, p), getattr(self, p).data)
                                  for p in self.port_names], busy)
        else:
            busy = Const(0)
            self._generations(m)
        m.d.comb += self.busy.eq(busy)
        return m

    def _writes(self, m, mem, ports, busy):
        """One memory write port per (port, data) in priority order: a later port writing
        the same element this cycle wins."""
        for k, (p, wdata) in enumerate(ports):
            wp = mem.write_port()
            beaten = 0
            for later, _ in ports[k + 1:]:
                beaten = beaten | (later.en & (later.addr == p.addr))
            m.d.comb += [wp.en.eq(p.en & ~busy & ~beaten), wp.addr.eq(p.addr),
                         wp.data.eq(wdata)]

    def _generations(self, m):
        """Reset by generations (``reset="valid"``, see the module docstring)."""
        n, gb = self.n, ceil_log2(self.n) + 2
        row = data.StructLayout({"value": self.shape, "gen": gb})
        m.submodules.mem = mem = Memory(shape=row, depth=n, init=[])
        gen = Signal(gb, init=1, reset_less=True)   # the generation before the last reset
        alive = Signal()                            # cleared by a reset: a new generation
        cur = Signal(gb)
        m.d.comb += cur.eq(Mux(alive, gen, gen + 1))
        m.d.sync += alive.eq(1)
        with m.If(~alive):
            m.d.sync += gen.eq(gen + 1)

        def read(addr):
            rp = mem.read_port(domain="comb")
            m.d.comb += rp.addr.eq(addr)
            return Mux(rp.data.gen == cur, rp.data.value, self.init)

        for name in self.read_names:
            r = getattr(self, name)
            m.d.comb += r.data.eq(read(r.addr))

        # the scrubber: a stale element it passes is written init in the current generation
        at = Signal(range(n), reset_less=True)
        m.d.sync += at.eq(Mux(at == n - 1, 0, at + 1))
        rp = mem.read_port(domain="comb")
        m.d.comb += rp.addr.eq(at)
        scrub = _Write(en=rp.data.gen != cur, addr=at)
        init = Const(self.init, self.shape.width)
        ports = [(scrub, Cat(init, cur))]
        ports += [(getattr(self, p), Cat(getattr(self, p).data, cur)) for p in self.port_names]
        self._writes(m, mem, ports, Const(0))

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
