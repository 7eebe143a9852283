"""Micro-benchmark of per-QP arrays in Verilator (docs/performance.md): which form of the
requester's per-QP state simulates fastest.

``python -m sim.bench_arrays [K=30] [CYCLES=500000]`` builds, with sim/rawsim.py, a design of
``K`` arrays of 64 x 24 bits with 3 write ports each (a counter makes every port write a
different element every cycle, and reads one element of each array), once per form, and
prints cycles/s of three runs per form:

* ``reg``: :class:`hw.lib.reg_array.RegArray` (one ``If(en & (addr == i))`` per element and
  port);
* ``flat``: one wide register per array written by ``word_select`` per port (an experiment
  defined here, not used by the NIC; same priority: a later statement wins);
* ``mem``: :class:`hw.lib.mem_array.MemArray` (``lib.memory``).

Every port writes every cycle, which the idle NIC never does: the figures compare the
forms, they do not measure the NIC's share.
"""

import sys

from amaranth import Module, Signal, Value
from amaranth.lib import wiring
from amaranth.lib.wiring import Out

from hw.lib.mem_array import MemArray
from hw.lib.reg_array import RegArray
from sim.rawsim import build_raw, run_raw

N, W, PORTS = 64, 24, ("x", "y", "z")


class FlatRegArray(RegArray):
    """RegArray with its elements stored as one wide register (the ``flat`` form)."""

    def elaborate(self, platform):
        m = Module()
        w = self.shape.width
        flat = Signal(self.n * w)
        for i in range(self.n):
            m.d.comb += Value.cast(self.q[i]).eq(flat[i * w:(i + 1) * w])
        for p in (getattr(self, name) for name in self.port_names):
            with m.If(p.en):
                m.d.sync += flat.word_select(p.addr, w).eq(p.data)
        return m


class Arrays(wiring.Component):
    def __init__(self, form, k):
        self.form, self.k = form, k
        super().__init__({"o": Out(W)})

    def elaborate(self, platform):
        m = Module()
        c = Signal(32)
        m.d.sync += c.eq(c + 1)
        acc = 0
        for j in range(self.k):
            if self.form == "mem":
                a = MemArray(N, W, PORTS, ("r",))
            else:
                a = (FlatRegArray if self.form == "flat" else RegArray)(N, W, PORTS)
            m.submodules[f"a{j}"] = a
            for i, p in enumerate(PORTS):
                m.d.comb += a.write(p, (c + 7 * i + j)[:6], c[:W] ^ j)
            if self.form == "mem":
                stmts, value = a.read("r", (c + j)[:6])
                m.d.comb += stmts
            else:
                value = a[(c + j)[:6]]
            acc = acc ^ value
        m.d.comb += self.o.eq(acc)
        return m


def main(argv):
    kv = dict(a.split("=", 1) for a in argv if "=" in a)
    k, cycles = int(kv.get("K", "30")), int(kv.get("CYCLES", "500000"))
    for form in ("reg", "flat", "mem"):
        exe = build_raw(Arrays(form, k), f"arrays_{form}_{k}")
        rates = [run_raw(exe, cycles if form != "mem" else 4 * cycles).cycles_per_s
                 for _ in range(3)]
        print(f"{form}: " + " / ".join(f"{r:,.0f}" for r in rates) + " cycles/s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
