"""Test top for the host side: the DmaCopy engine behind the NIC's host interface and a host.

::

    Python (sim/host.py) --h_mmio_cmd--> HostSide: MmioMaster --> MmioFrontend --> DmaCopy
                                                                                 rd | ^ wr
    HostMemory / RTL host <-- h_py_* or   HostSide: PcieLink x 2, host  <-->  HostInterface
    RtlHostMemory         <-- h_cpu/wtap                                  (1 read, 1 write client)

Not part of the NIC: :class:`CopySystem` puts :class:`~tests.cocotb.dma_copy.DmaCopy` on one
read and one write client of a :class:`~hw.dma.host_if.HostInterface` configured as the NIC's
(tags, MRRS, MPS, TLP overhead from ``cfg.nic``), its registers behind the NIC's
:class:`~hw.rnic.mmio.MmioFrontend`, and the host side of ``cfg`` (:class:`~hw.host.host_side.HostSide`:
PCIe link model both ways, the Python or the RTL host, the MMIO master). HostSide's
Python-facing ports are at the top level prefixed ``h_`` (``h_mmio_cmd``, ``h_mmio_resp``,
``h_py_*`` for the Python host, ``h_cpu``, ``h_cpu_rdata``, ``h_wtap`` for the RTL host), as
in :class:`hw.system.TwoNodeSystem`, so the drivers of sim/host.py serve it unchanged.

Extra outputs for the testbench: ``data_bytes`` (the constant W, so that a testbench can
check it has the build it expects), ``link_down_bytes`` / ``link_up_bytes`` (32-bit running
totals of the bytes the two PCIe link models charged, TLP overhead included).

:func:`copy_config` is the configuration the tests build and check against (both must use
the same one).
"""

from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from hw.config import SystemConfig, preset
from hw.dma.host_if import HostInterface
from hw.dma.read_engine import ring_words_for
from hw.host.host_side import HostSide
from hw.rnic.mmio import MmioFrontend
from .dma_copy import DmaCopy

__all__ = ["CopySystem", "copy_config", "RTL_MEM_BYTES"]

#: Memory of the RTL host in the copy tests: small, to keep the build small.
RTL_MEM_BYTES = 1 << 16


def copy_config(kind, data_bytes):
    """The ``small`` preset with W = ``data_bytes`` and the host ``kind`` ("python" or
    "rtl"; the RTL host gets :data:`RTL_MEM_BYTES` of memory)."""
    cfg = preset("small").replace(nic__data_bytes=data_bytes, host__kind=kind)
    if kind == "rtl":
        cfg = cfg.replace(host__rtl_mem_bytes=RTL_MEM_BYTES)
    return cfg


class CopySystem(wiring.Component):
    """``CopySystem(cfg, chunk=256, max_outstanding=8)``: see the module docstring.

    chunk, max_outstanding  of the :class:`~tests.cocotb.dma_copy.DmaCopy` (checked there);
                            the read client's ring holds ``max_outstanding`` chunks.
    """

    def __init__(self, cfg, *, chunk=256, max_outstanding=8):
        if not isinstance(cfg, SystemConfig):
            raise TypeError(f"cfg must be a SystemConfig, not {cfg!r}")
        self.cfg = cfg
        nic = cfg.nic
        W = nic.data_bytes
        self.copy = DmaCopy(W, chunk=chunk, max_outstanding=max_outstanding)
        ring = ring_words_for(W, chunk, nic.max_read_request, max_outstanding * chunk)
        self.hif = HostInterface(W, [ring], 1, n_tags=nic.dma_tags,
                                 max_read_request=nic.max_read_request,
                                 max_payload=nic.max_payload,
                                 write_outstanding=nic.dma_write_outstanding,
                                 tlp_overhead=nic.tlp_overhead, rd_max_len=[chunk])
        self.side = HostSide(cfg)
        ports = {}
        for name, member in self.side.signature.members.items():
            if not name.startswith(("nic_", "stat_")):
                ports[f"h_{name}"] = member
        ports["data_bytes"] = Out(8)
        ports["link_down_bytes"] = Out(32)
        ports["link_up_bytes"] = Out(32)
        super().__init__(ports)

    def elaborate(self, platform):
        m = Module()
        m.submodules.copy = copy = self.copy
        m.submodules.hif = hif = self.hif
        m.submodules.mmio = front = MmioFrontend()
        m.submodules.host = side = self.side
        wiring.connect(m, copy.rd, hif.rd[0])
        wiring.connect(m, copy.wr, hif.wr[0])
        wiring.connect(m, hif.down, side.nic_down)
        wiring.connect(m, side.nic_up, hif.up)
        wiring.connect(m, side.nic_mmio, front.host)
        wiring.connect(m, front.bus, copy.mmio)
        m.d.comb += front.bf.ready.eq(1)          # no BlueFlame window here: dropped
        for name, member in side.signature.members.items():
            if name.startswith(("nic_", "stat_")):
                continue
            ours, theirs = getattr(self, f"h_{name}"), getattr(side, name)
            if member.flow == In:
                m.d.comb += theirs.eq(ours)
            else:
                m.d.comb += ours.eq(theirs)
        m.d.comb += self.data_bytes.eq(self.cfg.nic.data_bytes)
        m.d.sync += [self.link_down_bytes.eq(self.link_down_bytes + side.stat_down_bytes),
                     self.link_up_bytes.eq(self.link_up_bytes + side.stat_up_bytes)]
        return m
