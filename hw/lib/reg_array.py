"""Per-queue registers written through a few write ports.

The requester keeps about thirty values per QP (indices, PSNs, retry state). Written as
``m.d.sync += arr[cur].eq(v)`` inside a state machine, an ``Array`` of signals gives *every*
element its own copy of the whole decision tree of that state machine (each register's
next value is a function of every branch that might write it): the generated Verilog grows
with the number of queues times the size of the state machine, 533,000 lines for the
requester of the 64-QP ``connectx6`` preset, and the simulator evaluates all of it every
cycle.

:class:`RegArray` keeps the storage per element and moves the decision logic into its write
ports: a port is an ``(en, addr, data)`` triple that the state machine drives
combinationally, where it used to assign the element. The decision tree appears once per
port, not once per element. The elements are stored as one wide register that each port
writes with a ``word_select`` (in Verilator about three times as fast as one address
comparison per element and port: ``python -m sim.bench_arrays``). It is the write side of a
register file (as Corundum keeps per-queue state in RAM, ``queue_manager.v``); reads stay
combinational (``arr[index]``, a multiplexer), so the values can still be scanned per
element (``arr.q[i]``) where a block needs all of them at once.

Semantics are those of the sync assignments the ports replace: a port that writes the same
element in a cycle as an earlier port wins (ports are applied in the order given, as later
statements win in Amaranth), and the last write to a port in a cycle is the one it makes.
A port must therefore carry at most one address per cycle: give each writer that can write a
different element in the same cycle (two state machines, a timer) its own port.

Parameters: ``n`` (elements) in [1, 65536], ``shape`` (of each element), ``ports`` (names of
the write ports in priority order, lowest first; 1 to 8 distinct identifiers), ``init`` (the
reset value of every element).

Ports: ``q: Out(shape).array(n)`` (the elements), and per port name ``p``:
``p: In(RegWriteSignature(n, shape))`` with ``en``, ``addr``, ``data``.
"""

from amaranth.hdl import Array, Module, Shape, Signal, Value
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from .checks import check_int

__all__ = ["RegArray", "RegWriteSignature", "port_write"]


def port_write(array, port, index, value):
    """The statements of ``array.write``: write port ``port`` (one of ``array.port_names``)
    writes ``value`` at ``index`` this cycle."""
    if port not in array.port_names:
        raise ValueError(f"port must be one of {array.port_names!r}, not {port!r}")
    p = getattr(array, port)
    return [p.en.eq(1), p.addr.eq(index), p.data.eq(value)]


class RegWriteSignature(wiring.Signature):
    """One write port: ``en``, ``addr`` (element), ``data``, all driven by the writer."""

    def __init__(self, n, shape):
        super().__init__({
            "en": Out(1),
            "addr": Out(max(1, ceil_log2(n))),
            "data": Out(shape),
        })


class RegArray(wiring.Component):
    def __init__(self, n, shape, ports, *, init=0):
        check_int("n", n, 1, 1 << 16)
        ports = tuple(ports)
        if (not 1 <= len(ports) <= 8 or len(set(ports)) != len(ports)
                or not all(isinstance(p, str) and p.isidentifier() and p != "q" for p in ports)):
            raise ValueError(f"ports must be 1 to 8 distinct identifiers other than 'q', "
                             f"not {ports!r}")
        self.n = n
        self.shape = Shape.cast(shape)
        self.port_names = ports
        members = {"q": Out(shape, init=init).array(n)}
        for p in ports:
            members[p] = In(RegWriteSignature(n, shape))
        super().__init__(members)
        self._array = Array(self.q)

    def __getitem__(self, index):
        """The element at ``index`` (a value): a combinational read."""
        return self._array[index]

    def write(self, port, index, value):
        """Statements (for ``m.d.comb``) that make ``port`` write ``value`` at ``index``
        this cycle."""
        return port_write(self, port, index, value)

    def elaborate(self, platform):
        # One wide register holding every element; each port writes its element with a
        # word_select (a later statement wins, so a later port does). Measured with
        # Verilator (docs/performance.md): 30 arrays of 64 x 24 bits with 3 ports run about
        # three times as fast as with one ``If(en & (addr == i))`` per element and port.
        m = Module()
        w = self.shape.width
        elems = [Value.cast(q) for q in self.q]
        init = elems[0].init & ((1 << w) - 1)   # every element's, as bits
        flat = Signal(self.n * w, init=sum(init << (i * w) for i in range(self.n)))
        for i in range(self.n):
            m.d.comb += elems[i].eq(flat[i * w:(i + 1) * w])
        for p in (getattr(self, name) for name in self.port_names):
            with m.If(p.en):
                m.d.sync += flat.word_select(p.addr, w).eq(p.data)
        return m
