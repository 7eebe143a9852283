"""Two RNIC nodes joined by a link in each direction: the system every experiment runs on.

Each node keeps its host-facing ports (MMIO and DMA) at the top level, prefixed ``a_`` and
``b_``, so that a host model (``sim/host.py``) or an on-chip memory can serve them. The
links model serialisation and latency (``hw/link.py``) from the :class:`~hw.config.LinkConfig`
converted to NIC cycles. ``tap_ab`` / ``tap_ba`` mirror every beat accepted by a link so
that a testbench can write a pcap of everything the network carried.
"""

from amaranth import *
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from .config import SystemConfig
from .interfaces import MmioSignature, DmaReadReq, DmaReadData, DmaWrite, beat_layout
from .link import Link
from .rnic import Rnic

__all__ = ["TwoNodeSystem", "link_params"]

NODES = ("a", "b")


def link_params(cfg: SystemConfig):
    """(latency in cycles, bytes per cycle) of a link of this system."""
    latency = cfg.nic.cycles(cfg.link.latency_ns)
    bytes_per_cycle = cfg.link.gbps * 1e9 / 8 / (cfg.nic.clock_mhz * 1e6)
    return latency, bytes_per_cycle


class TwoNodeSystem(wiring.Component):
    def __init__(self, cfg: SystemConfig):
        if not isinstance(cfg, SystemConfig):
            raise TypeError(f"cfg must be a SystemConfig, not {cfg!r}")
        self.cfg = cfg
        W = cfg.nic.data_bytes
        ports = {}
        for n in NODES:
            ports[f"{n}_mmio"] = In(MmioSignature())
            ports[f"{n}_dma_rd_req"] = Out(DmaReadReq())
            ports[f"{n}_dma_rd_resp"] = In(DmaReadData(W))
            ports[f"{n}_dma_wr"] = Out(DmaWrite(W))
        for d in ("ab", "ba"):
            ports[f"tap_{d}_valid"] = Out(1)
            ports[f"tap_{d}"] = Out(beat_layout(W))
        super().__init__(ports)

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        W = cfg.nic.data_bytes
        latency, rate = link_params(cfg)
        nodes = {}
        for n in NODES:
            nodes[n] = m.submodules[f"node_{n}"] = Rnic(cfg.nic)
            wiring.connect(m, wiring.flipped(getattr(self, f"{n}_mmio")), nodes[n].mmio)
            wiring.connect(m, nodes[n].dma_rd_req, wiring.flipped(getattr(self, f"{n}_dma_rd_req")))
            wiring.connect(m, wiring.flipped(getattr(self, f"{n}_dma_rd_resp")), nodes[n].dma_rd_resp)
            wiring.connect(m, nodes[n].dma_wr, wiring.flipped(getattr(self, f"{n}_dma_wr")))
        for src, dst in (("a", "b"), ("b", "a")):
            link = m.submodules[f"link_{src}{dst}"] = Link(W, latency_cycles=latency, bytes_per_cycle=rate)
            wiring.connect(m, nodes[src].tx, link.i)
            wiring.connect(m, link.o, nodes[dst].rx)
            m.d.comb += [getattr(self, f"tap_{src}{dst}_valid").eq(link.i.valid & link.i.ready),
                         getattr(self, f"tap_{src}{dst}").eq(link.i.payload)]
        return m
