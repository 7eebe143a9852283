"""Two RNIC nodes joined by a link in each direction: the system every experiment runs on.

Each node has its host side (``hw/host/host_side.py``: the PCIe link model, the host of the
configured kind and the MMIO path); the host side's Python-facing ports are
at the top level, prefixed ``a_`` and ``b_`` (``a_mmio_cmd``, ``a_mmio_resp``,
and ``a_py_*`` for the Python host or ``a_cpu``, ``a_cpu_rdata``,
``a_wtap`` for the RTL host). The network links model serialisation and latency
(``hw/net/link.py``) from the :class:`~hw.config.LinkConfig` converted to NIC cycles. ``tap_ab`` / ``tap_ba`` mirror every beat accepted by a link so
that a testbench can write a pcap of everything the network carried (before faults).

Faults (``hw/net/fault.py``, InfiniBand Architecture Specification vol. 1 rel. 1.4, Annex A17:
RoCEv2 over a lossy Ethernet fabric): each link direction ``d`` in ``ab``/``ba`` exposes
its injector's controls ``fault_{d}_seed`` (32), ``fault_{d}_seed_load``, ``fault_{d}_loss``,
``fault_{d}_dup``, ``fault_{d}_reorder``, ``fault_{d}_corrupt`` (16), ``fault_{d}_down`` as
inputs and its counters ``fault_{d}_n_frames``, ``fault_{d}_n_lost``, ``fault_{d}_n_down``,
``fault_{d}_n_dup``, ``fault_{d}_n_reordered``, ``fault_{d}_n_corrupted`` (32) as outputs
(``sim/faults.py`` drives them). ``inj_a`` / ``inj_b`` (``In(BeatStream(W))``) let a
testbench inject frames into node a's / b's receive path: a :class:`~hw.net.fault.FrameMerger`
merges them with the frames arriving from the link, whole frames at a time.
``rxtap_a`` / ``rxtap_b`` (with ``rxtap_{n}_valid``) mirror every beat each node's ``rx``
actually takes (after faults and injection).

Reset: the ``rst`` input goes through one register before it reaches any block (a reset
pipeline flop, as FPGA designs register a high-fan-out reset), so the system leaves reset
:attr:`TwoNodeSystem.RESET_LATENCY` cycle after ``rst`` falls; everything else runs in the
``core`` domain, the ``sync`` domain's clock with the registered reset. The reason is the
simulator: Verilator evaluates every logic cone that depends on a top-level input in each
``eval()`` call (its input-combinational region, twice per clock cycle), and a sync reset
feeds the next-state logic of every register, so with ``rst`` used directly that cone held
a third of the design's statements (docs/performance.md: the raw ``connectx6`` system about twice as fast).
"""

from amaranth import *
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from .config import SystemConfig
from .net.fault import CONTROL_WIDTHS, COUNTERS, FrameMerger
from .host.host_side import HostSide
from .interfaces import BeatStream, beat_layout
from .net.link import Link
from .rnic import Rnic

__all__ = ["TwoNodeSystem", "link_params"]

NODES = ("a", "b")


def link_params(cfg: SystemConfig):
    """(latency in cycles, bytes per cycle) of a link of this system."""
    latency = cfg.nic.cycles(cfg.link.latency_ns)
    bytes_per_cycle = cfg.link.gbps * 1e9 / 8 / (cfg.nic.clock_mhz * 1e6)
    return latency, bytes_per_cycle


class TwoNodeSystem(wiring.Component):
    #: cycles between ``rst`` falling and the system leaving reset (the registered reset)
    RESET_LATENCY = 1

    def __init__(self, cfg: SystemConfig):
        if not isinstance(cfg, SystemConfig):
            raise TypeError(f"cfg must be a SystemConfig, not {cfg!r}")
        self.cfg = cfg
        W = cfg.nic.data_bytes
        ports = {}
        self.sides = {n: HostSide(cfg) for n in NODES}
        self.nodes = {n: Rnic(cfg.nic) for n in NODES}
        for n in NODES:
            for name, member in self.sides[n].signature.members.items():
                if not name.startswith(("nic_", "stat_")):
                    ports[f"{n}_{name}"] = member
        for d in ("ab", "ba"):
            ports[f"tap_{d}_valid"] = Out(1)
            ports[f"tap_{d}"] = Out(beat_layout(W))
        for d in ("ab", "ba"):
            for name, width in CONTROL_WIDTHS.items():
                ports[f"fault_{d}_{name}"] = In(width)
            for name in COUNTERS:
                ports[f"fault_{d}_{name}"] = Out(32)
        for n in NODES:
            ports[f"inj_{n}"] = In(BeatStream(W))
            ports[f"rxtap_{n}_valid"] = Out(1)
            ports[f"rxtap_{n}"] = Out(beat_layout(W))
        super().__init__(ports)

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        W = cfg.nic.data_bytes
        latency, rate = link_params(cfg)
        nodes = self.nodes
        for n in NODES:
            m.submodules[f"node_{n}"] = nodes[n]
            side = m.submodules[f"host_{n}"] = self.sides[n]
            wiring.connect(m, nodes[n].down, side.nic_down)
            wiring.connect(m, side.nic_up, nodes[n].up)
            wiring.connect(m, side.nic_mmio, nodes[n].mmio)
            for name, member in side.signature.members.items():
                if name.startswith(("nic_", "stat_")):
                    continue
                ours, theirs = getattr(self, f"{n}_{name}"), getattr(side, name)
                if member.is_signature:
                    if member.flow == In:
                        wiring.connect(m, wiring.flipped(ours), theirs)
                    else:
                        wiring.connect(m, theirs, wiring.flipped(ours))
                elif member.flow == In:
                    m.d.comb += theirs.eq(ours)
                else:
                    m.d.comb += ours.eq(theirs)
        for src, dst in (("a", "b"), ("b", "a")):
            link = m.submodules[f"link_{src}{dst}"] = Link(W, latency_cycles=latency, bytes_per_cycle=rate,
                                                        faults=True)
            d = src + dst
            wiring.connect(m, nodes[src].tx, link.i)
            for name in CONTROL_WIDTHS:
                m.d.comb += getattr(link, f"fault_{name}").eq(getattr(self, f"fault_{d}_{name}"))
            for name in COUNTERS:
                m.d.comb += getattr(self, f"fault_{d}_{name}").eq(getattr(link, f"fault_{name}"))
            # frames from the link (input 0) and injected frames (input 1) into dst's rx
            merge = m.submodules[f"rx_merge_{dst}"] = FrameMerger(W, 2)
            wiring.connect(m, link.o, merge.i[0])
            wiring.connect(m, wiring.flipped(getattr(self, f"inj_{dst}")), merge.i[1])
            wiring.connect(m, merge.o, nodes[dst].rx)
            m.d.comb += [getattr(self, f"tap_{d}_valid").eq(link.i.valid & link.i.ready),
                         getattr(self, f"tap_{d}").eq(link.i.payload),
                         getattr(self, f"rxtap_{dst}_valid").eq(merge.o.valid & merge.o.ready),
                         getattr(self, f"rxtap_{dst}").eq(merge.o.payload)]
        top = Module()
        top.domains.core = ClockDomain("core", local=True)
        rst_core = Signal(init=1)
        top.d.sync += rst_core.eq(ResetSignal("sync"))
        top.d.comb += [ClockSignal("core").eq(ClockSignal("sync")),
                       ResetSignal("core").eq(rst_core)]
        top.submodules.core = DomainRenamer("core")(m)
        return top
