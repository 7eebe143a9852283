"""The NIC's host interface: DMA engines that speak PCIe-like TLPs to host memory, and MMIO."""
