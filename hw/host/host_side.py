"""Everything between one NIC and its host: PCIe link both ways, the host, the MMIO path.

::

    NIC down --> PcieLink(down) --> host (RtlHost, or PyHostPort to Python)
    NIC up   <-- PcieLink(up)   <--
    NIC mmio <-- MmioMaster <-- mmio_cmd (Python / workload engine)

The host kind comes from :class:`hw.config.HostConfig` ``kind``: ``"rtl"`` (memory on chip,
``cpu`` / ``cpu_rdata`` ports for the host CPU, and a write tap: ``wtap`` holds the last MWr
that reached the memory, header and data, and ``wtap_count`` counts them, so that a
testbench can mirror the memory without asking for it) or ``"python"`` (the adapter's
``py_*`` ports, served by ``sim/host.py``). Both see identical link timing, so a workload gives the
same completion times on both (checked by tests/hw/test_hosts.py).

The host's event line (an interrupt in spirit): ``cqe_events`` counts the MWrs marked
``th`` (the NIC marks its CQE writes) once they are in host memory: for the RTL host at the
edge that stores the TLP's last word, for the Python host when Python acknowledges the TLP
(it has written it into its memory). A waiter woken by the count therefore finds the CQE in
memory. Python's own waiters use the count with the RTL host (when they do not mirror its
memory) and the writes themselves with the Python host (``sim/harness.py``).

Ports (NIC side): ``nic_down: In(TlpDown(W))``, ``nic_up: Out(TlpUp(W))``, ``nic_mmio:
Out(MmioPort())``. Host side, for Python or a workload engine,
each a mailbox handshaken by counters (:mod:`hw.lib.seq_port`, so that it works whatever
side of a clock edge the testbench reads on): ``mmio_cmd`` (``_seq`` in, ``_taken`` out),
``mmio_resp`` (``_seq`` out, ``_ack`` in), for the RTL host ``cpu`` and ``cpu_rdata`` the same
way; ``cqe_events: Out(32)``; ``stat_down_bytes``, ``stat_up_bytes``; and the ports named
above.
"""

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ..config import SystemConfig
from ..interfaces import MMIO_RDATA, MMIO_REQ, MmioPort, TlpDown, TlpUp
from ..lib.seq_port import SeqIn, SeqOut
from .mmio_master import MmioMaster
from .pcie_link import PcieLink
from .py_port import PyHostPort, py_req_layout
from .rtl_host import CPU_RDATA, CPU_REQ, RtlHost

__all__ = ["HostSide", "pcie_params", "MIN_TURNAROUND"]

#: Smallest time, in cycles, from a read's arrival at a host to its first completion: the
#: Python host's adapter needs four cycles to hand a request to Python and take the answer
#: back, so both hosts wait at least this long and answer at the same cycle.
MIN_TURNAROUND = 4


def pcie_params(cfg: SystemConfig):
    """(latency cycles, bytes per cycle) of the PCIe link of this configuration."""
    nic, host = cfg.nic, cfg.host
    return nic.cycles(host.pcie_ns), host.pcie_gbps * 1e9 / 8 / (nic.clock_mhz * 1e6)


class HostSide(wiring.Component):
    def __init__(self, cfg: SystemConfig, *, py_depth=None):
        if not isinstance(cfg, SystemConfig):
            raise TypeError(f"cfg must be a SystemConfig, not {cfg!r}")
        self.cfg = cfg
        nic, host = cfg.nic, cfg.host
        W = nic.data_bytes
        lat, rate = pcie_params(cfg)
        self.links = (PcieLink(W, "down", lat, rate, nic.tlp_overhead),
                      PcieLink(W, "up", lat, rate, nic.tlp_overhead))
        self.mmio = MmioMaster(nic.cycles(host.mmio_ns))
        mem_cycles = max(MIN_TURNAROUND, nic.cycles(host.host_mem_ns))
        ports = {
            "nic_down": In(TlpDown(W)),
            "nic_up": Out(TlpUp(W)),
            "nic_mmio": Out(MmioPort()),
            "mmio_cmd": In(MMIO_REQ),
            "mmio_cmd_seq": In(16),
            "mmio_cmd_taken": Out(16),
            "mmio_resp": Out(MMIO_RDATA),
            "mmio_resp_seq": Out(16),
            "mmio_resp_ack": In(16),
            "cqe_events": Out(32),
            "stat_down_bytes": Out(16),
            "stat_up_bytes": Out(16),
        }
        if host.kind == "rtl":
            self.host = RtlHost(W, mem_bytes=host.rtl_mem_bytes, base=host.rtl_mem_base,
                                mem_cycles=min(mem_cycles, 65535), cpl_bytes=host.cpl_bytes,
                                max_read_request=nic.max_read_request,
                                max_payload=nic.max_payload,
                                read_queue=max(2, 1 << (nic.dma_tags - 1).bit_length()))
            ports["cpu"] = In(CPU_REQ)
            ports["cpu_seq"] = In(16)
            ports["cpu_taken"] = Out(16)
            ports["cpu_rdata"] = Out(CPU_RDATA)
            ports["cpu_rdata_seq"] = Out(16)
            ports["cpu_rdata_ack"] = In(16)
            self.wtap_layout = py_req_layout(W, nic.max_payload)
            ports["wtap"] = Out(self.wtap_layout)
            ports["wtap_count"] = Out(32)
        else:
            depth = py_depth or max(2, 1 << (nic.dma_tags - 1).bit_length())
            self.host = PyHostPort(W, max_payload=nic.max_payload,
                                   max_read_request=nic.max_read_request,
                                   cpl_bytes=host.cpl_bytes, depth=depth)
            self.mem_cycles = mem_cycles
            for name, member in self.host.signature.members.items():
                if name not in ("down", "up", "events"):
                    ports[f"py_{name}"] = member
        super().__init__(ports)

    def elaborate(self, platform):
        m = Module()
        down, up = self.links
        m.submodules.link_down = down
        m.submodules.link_up = up
        m.submodules.host = host = self.host
        m.submodules.mmio = mmio = self.mmio
        wiring.connect(m, wiring.flipped(self.nic_down), down.i)
        wiring.connect(m, down.o, host.down)
        wiring.connect(m, host.up, up.i)
        wiring.connect(m, up.o, wiring.flipped(self.nic_up))
        # the testbench-facing ports are counter-handshaken mailboxes (hw/lib/seq_port.py)
        m.submodules.mmio_cmd_port = mc = SeqIn(MMIO_REQ)
        m.submodules.mmio_resp_port = mr = SeqOut(MMIO_RDATA)
        m.d.comb += [mc.data.eq(self.mmio_cmd), mc.seq.eq(self.mmio_cmd_seq),
                     self.mmio_cmd_taken.eq(mc.taken), self.mmio_resp.eq(mr.data),
                     self.mmio_resp_seq.eq(mr.seq), mr.ack.eq(self.mmio_resp_ack)]
        wiring.connect(m, mc.o, mmio.cmd)
        wiring.connect(m, mmio.resp, mr.i)
        wiring.connect(m, mmio.nic, wiring.flipped(self.nic_mmio))
        m.d.comb += [self.stat_down_bytes.eq(down.stat_bytes), self.stat_up_bytes.eq(up.stat_bytes)]
        if self.cfg.host.kind == "rtl":
            m.submodules.cpu_port = cc = SeqIn(CPU_REQ)
            m.submodules.cpu_rdata_port = cr = SeqOut(CPU_RDATA)
            m.d.comb += [cc.data.eq(self.cpu), cc.seq.eq(self.cpu_seq),
                         self.cpu_taken.eq(cc.taken), self.cpu_rdata.eq(cr.data),
                         self.cpu_rdata_seq.eq(cr.seq), cr.ack.eq(self.cpu_rdata_ack)]
            wiring.connect(m, cc.o, host.cpu)
            wiring.connect(m, host.cpu_rdata, cr.i)
            # write tap: every MWr the host takes, whole
            W = self.cfg.nic.data_bytes
            b = down.o
            fire = b.valid & b.ready
            t_first = Signal(init=1)
            t_idx = Signal(range(self.cfg.nic.max_payload // W + 2))
            acc = Signal(self.wtap_layout)
            with m.If(fire):
                m.d.sync += t_first.eq(b.payload.last)
                with m.If(t_first):
                    m.d.sync += [acc.hdr.eq(b.payload.hdr), t_idx.eq(1)]
                with m.Else():
                    m.d.sync += t_idx.eq(t_idx + 1)
                with m.Switch(Mux(t_first, 0, t_idx)):
                    for j in range(self.cfg.nic.max_payload // W + 1):
                        with m.Case(j):
                            m.d.sync += acc.data.word_select(j, 8 * W).eq(b.payload.data)
            hdr = Mux(t_first, b.payload.hdr.as_value(), acc.hdr.as_value())
            is_wr = Signal()
            m.d.comb += is_wr.eq(hdr[0])                   # TLP_DOWN_HDR.kind: MWR = 1
            # the count moves at the edge that stores the TLP's last word: a reader woken by
            # the count sees the whole TLP (the next one can only start at a later edge)
            with m.If(fire & b.payload.last & is_wr):
                m.d.sync += self.wtap_count.eq(self.wtap_count + 1)
                with m.If(Mux(t_first, b.payload.hdr.th, acc.hdr.th)):
                    m.d.sync += self.cqe_events.eq(self.cqe_events + 1)
            m.d.comb += [self.wtap.hdr.eq(acc.hdr), self.wtap.data.eq(acc.data)]
        else:
            m.d.comb += self.cqe_events.eq(host.events)
            for name, member in host.signature.members.items():
                if name in ("down", "up", "events"):
                    continue
                ours = getattr(self, f"py_{name}")
                if member.flow == In:
                    m.d.comb += getattr(host, name).eq(ours)
                else:
                    m.d.comb += ours.eq(getattr(host, name))
        return m
