"""The host side of a NIC: the PCIe link model and the two hosts (RTL memory, Python adapter)."""
