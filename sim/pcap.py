"""Nanosecond-resolution pcap writer for frames seen on the simulated RoCEv2 link.

Classic libpcap format with the nanosecond magic 0xa1b23c4d, link type 1 (Ethernet),
so that Wireshark's RoCE dissector (UDP port 4791, IBA Annex A17) decodes the frames.
"""

import struct

__all__ = ["PcapWriter"]

_MAGIC_NS = 0xA1B23C4D
_LINKTYPE_ETHERNET = 1


class PcapWriter:
    """``PcapWriter(path, snaplen=65535)``; ``write(frame, t_ns)``; ``close()`` or ``with``."""

    def __init__(self, path, snaplen=65535):
        if not isinstance(snaplen, int) or not 64 <= snaplen <= 262144:
            raise ValueError(f"snaplen must be an integer in [64, 262144], not {snaplen!r}")
        self._snaplen = snaplen
        self._f = open(path, "wb")
        self._f.write(struct.pack("<IHHiIII", _MAGIC_NS, 2, 4, 0, 0, snaplen, _LINKTYPE_ETHERNET))

    def write(self, frame, t_ns):
        """Append one frame captured at simulation time ``t_ns`` (integer nanoseconds >= 0)."""
        t_ns = int(t_ns)
        if t_ns < 0:
            raise ValueError(f"t_ns must be >= 0, not {t_ns}")
        if self._f is None:
            raise ValueError("write to a closed PcapWriter")
        frame = bytes(frame)
        cap = frame[:self._snaplen]
        self._f.write(struct.pack("<IIII", t_ns // 1_000_000_000, t_ns % 1_000_000_000,
                                  len(cap), len(frame)))
        self._f.write(cap)

    def close(self):
        if self._f is not None:
            self._f.close()
            self._f = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
