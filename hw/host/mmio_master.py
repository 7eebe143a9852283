"""The host CPU's MMIO path to the NIC: posted writes and reads with the latency of PCIe.

Models a CPU store (or a 64-byte write-combined store, BlueFlame) to the NIC's registers
and a CPU load from them (PCI Express Base Specification 4.0, 2.2: a memory write from the
root complex is posted; a read waits for its completion): Python (or a hardware workload
engine) hands a request over on ``cmd``; it reaches the NIC's MMIO port
``latency_cycles`` later and waits there while the NIC back-pressures; read data takes
``latency_cycles`` back to ``resp``. Both hosts use this block, so an MMIO costs the
same in both.

MMIO requests do not share the link model's bandwidth with DMA completions (the NIC counts
their bytes, ``hw/rnic/node.py``); see docs/host-interface.md.

Parameters: ``latency_cycles`` in [0, 2**24], ``depth`` (requests in flight, power of two).

Ports: ``cmd: In(stream MMIO_REQ)``, ``resp: Out(stream MMIO_RDATA)``, ``nic: Out(MmioPort())``.
"""

from amaranth.hdl import Module
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ..interfaces import MMIO_RDATA, MMIO_REQ, MmioPort
from ..lib.delay import DelayLine

__all__ = ["MmioMaster"]


class MmioMaster(wiring.Component):
    def __init__(self, latency_cycles, depth=16):
        self.to_nic = DelayLine(MMIO_REQ, latency_cycles, depth)
        self.to_host = DelayLine(MMIO_RDATA, latency_cycles, depth)
        super().__init__({
            "cmd": In(stream.Signature(MMIO_REQ)),
            "resp": Out(stream.Signature(MMIO_RDATA)),
            "nic": Out(MmioPort()),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.to_nic = a = self.to_nic
        m.submodules.to_host = b = self.to_host
        wiring.connect(m, wiring.flipped(self.cmd), a.i)
        wiring.connect(m, a.o, wiring.flipped(self.nic.req))
        wiring.connect(m, wiring.flipped(self.nic.rdata), b.i)
        wiring.connect(m, b.o, wiring.flipped(self.resp))
        return m
