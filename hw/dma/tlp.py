"""TLP helpers shared by the NIC's host interface and the host-side models.

The cost of a TLP on the link (PCIe: header plus framing plus the payload in double words,
PCI Express Base Specification 4.0, 2.2.1 and 4.2.3) is computed in one place, here, as an
RTL expression for the link model and the NIC's counters and as a Python function
(:func:`hw.formats.tlp_cost`) for the host models and tests.
"""

from amaranth.hdl import Mux

from ..formats import CplKind, TlpKind

__all__ = ["down_cost", "up_cost"]


def down_cost(hdr, overhead):
    """RTL: bytes of link time of a down TLP (its header beat): MRd = ``overhead``, MWr =
    ``overhead`` + 4 * double words of [addr, addr + len)."""
    dw = (hdr.addr[:2] + hdr.len + 3) >> 2
    return Mux(hdr.kind == TlpKind.MWR, overhead + (dw << 2), overhead)


def up_cost(hdr, overhead):
    """RTL: bytes of link time of an up TLP: a completion costs ``overhead`` + 4 * ``dw``;
    a write response is a sideband signal of the model (PCIe's posted writes have no
    completion) and costs nothing."""
    return Mux(hdr.kind == CplKind.CPLD, overhead + (hdr.dw << 2), 0)
