"""Host memory at the transaction layer: what the host does with each TLP (pure Python).

One model of the host side of the NIC's host port (docs/host-interface.md), shared by the
Python host of the cocotb simulations (``sim/host.py``) and by the unit tests of the DMA
engines (``tests/hw/``): it applies a memory write, answers a memory read with its
completions, and decides the status of each. Timing (latency, bandwidth, reordering) is not
its business: the link model in RTL and the callers add it.

Rules it follows (PCI Express Base Specification 4.0, 2.3.1.1 and 2.2.9):

* a read of ``len`` bytes is answered by completions in address order; every completion but
  the last ends on a multiple of ``cpl_bytes`` (the host's completion size: a multiple of the
  read completion boundary, at most the maximum payload size), so a 512-byte read at an
  aligned address gives 8 completions of 64 bytes with the default ``cpl_bytes`` = 64;
* each completion carries whole aligned words (W bytes) covering its bytes; bytes outside
  the requested range are filled with :data:`FILL` so that a NIC that used them would be
  caught;
* a request that touches an address ``fail`` rejects (by default: none) gets an error status
  (``UR``) and, for a read, one completion with no data; a failed write changes nothing.
"""

from hw.formats import TlpStatus, tlp_dwords

__all__ = ["TlpHost", "Completion", "FILL", "split_completions"]

#: Byte value of the parts of a completion's words that lie outside the requested bytes.
FILL = 0xA5


class Completion:
    """One up TLP: ``kind`` ("CPLD" or "WRRSP"), ``tag``, ``status`` (TlpStatus), ``lo``,
    ``len``, ``dw``, ``last`` and ``words`` (bytes, a whole number of W-byte words)."""

    __slots__ = ("kind", "tag", "status", "lo", "len", "dw", "last", "words")

    def __init__(self, kind, tag, status, lo=0, length=0, dw=0, last=1, words=b""):
        self.kind, self.tag, self.status, self.lo, self.len = kind, tag, status, lo, length
        self.dw, self.last, self.words = dw, last, words

    def hdr(self):
        """The fields of :data:`hw.formats.TLP_UP_HDR` as a dict."""
        from hw.formats import CplKind
        return {"kind": getattr(CplKind, self.kind).value, "tag": self.tag,
                "status": self.status.value, "lo": self.lo, "len": self.len, "dw": self.dw,
                "last": self.last}

    def __repr__(self):
        return (f"Completion({self.kind}, tag={self.tag}, {self.status.name}, lo={self.lo}, "
                f"len={self.len}, last={self.last})")


def split_completions(addr, length, cpl_bytes):
    """Python model of the completer's split: ``[(lo, len)]`` of the completions of a read."""
    out = []
    pos = addr
    end = addr + length
    while pos < end:
        nxt = min(end, (pos // cpl_bytes + 1) * cpl_bytes)
        out.append((pos - addr, nxt - pos))
        pos = nxt
    return out


class TlpHost:
    """The host side of one NIC's host port, at the transaction layer.

    mem         a memory with ``read(addr, n)`` and ``write(addr, data)`` (sim.host.HostMemory).
    data_bytes  W, bytes per data word.
    cpl_bytes   completion size (a power of two, multiple of ``rcb``, at most ``max_payload``).
    fail        ``fail(addr, length, is_write) -> TlpStatus or None``: the status to give a
                request touching ``[addr, addr + length)`` (None: it succeeds).

    Counters: ``reads``, ``writes``, ``completions``, ``errors``; ``log`` (None or a list)
    records ``("R"|"W", addr, len, status)`` of every request.
    """

    def __init__(self, mem, data_bytes, *, cpl_bytes=64, rcb=64, max_payload=256, fail=None):
        for name, v in (("data_bytes", data_bytes), ("cpl_bytes", cpl_bytes), ("rcb", rcb),
                        ("max_payload", max_payload)):
            if not isinstance(v, int) or v < 1 or v & (v - 1):
                raise ValueError(f"{name} must be a power of two, not {v!r}")
        if not rcb <= cpl_bytes <= max_payload:
            raise ValueError(f"cpl_bytes must be a power of two in [rcb={rcb}, "
                             f"max_payload={max_payload}], not {cpl_bytes!r}")
        self.mem = mem
        self.W = data_bytes
        self.cpl_bytes = cpl_bytes
        self.fail = fail
        self.reads = self.writes = self.completions = self.errors = 0
        self.log = None

    def _status(self, addr, length, is_write):
        if self.fail is None:
            return TlpStatus.SC
        st = self.fail(addr, length, is_write)
        return TlpStatus.SC if st is None else TlpStatus(st)

    def write(self, tag, addr, length, words):
        """Apply an MWr (``words``: its aligned data words as bytes); return its response."""
        W = self.W
        self.writes += 1
        st = self._status(addr, length, True)
        if st == TlpStatus.SC:
            off = addr % W
            if len(words) < off + length:
                raise ValueError(f"MWr at {addr:#x} len {length}: {len(words)} bytes of words "
                                 f"do not cover it")
            self.mem.write(addr, words[off:off + length])
        else:
            self.errors += 1
        if self.log is not None:
            self.log.append(("W", addr, length, st))
        return Completion("WRRSP", tag, st)

    def read(self, tag, addr, length):
        """Answer an MRd: the list of its completions, in the order they are sent."""
        W = self.W
        self.reads += 1
        st = self._status(addr, length, False)
        if self.log is not None:
            self.log.append(("R", addr, length, st))
        if st != TlpStatus.SC:
            self.errors += 1
            self.completions += 1
            return [Completion("CPLD", tag, st, 0, 0, 0, 1, b"")]
        out = []
        parts = split_completions(addr, length, self.cpl_bytes)
        for i, (lo, n) in enumerate(parts):
            a = addr + lo
            nwords = (a % W + n + W - 1) // W
            raw = bytearray([FILL]) * (nwords * W)
            raw[a % W:a % W + n] = self.mem.read(a, n)
            out.append(Completion("CPLD", tag, TlpStatus.SC, lo, n, tlp_dwords(a, n),
                                  int(i == len(parts) - 1), bytes(raw)))
        self.completions += len(out)
        return out


class PyHost:
    """What the Python host does per request arriving at its adapter (``hw/host/py_port.py``).

    ``request(hdr, time, words)`` is called once per down TLP (``hdr``: dict of
    :data:`~hw.formats.TLP_DOWN_HDR`, ``time``: its arrival cycle, ``words``: the MWr's
    aligned data words as bytes) and returns ``(status, pushes)``: the status of a write's
    response, and the responses to push to the adapter now, in order (dicts of
    :func:`~hw.host.py_port.py_cpl_layout` fields; ``data`` as bytes). A read is answered
    with ``due = time + mem_cycles``. With ``reorder`` > 0 a read's response is held back
    with that probability and pushed after the next read's (so its completions come later,
    out of order); ``flush()`` returns a response still held (call it when no request came
    for a while).
    """

    def __init__(self, host, *, mem_cycles=0, reorder=0.0, seed=0):
        import random
        if not 0.0 <= reorder < 1.0:
            raise ValueError(f"reorder must be a probability in [0, 1), not {reorder!r}")
        self.host = host
        self.mem_cycles = mem_cycles
        self.reorder = reorder
        self.rng = random.Random(seed)
        self.held = None
        self.reordered = 0

    def response(self, tag, addr, length, due):
        """The push answering a read (data: aligned words; an error gets no data)."""
        W = self.host.W
        st = self.host._status(addr, length, False)
        self.host.reads += 1
        if self.host.log is not None:
            self.host.log.append(("R", addr, length, st))
        raw = b""
        if st == TlpStatus.SC:
            nwords = (addr % W + length + W - 1) // W
            buf = bytearray([FILL]) * (nwords * W)
            buf[addr % W:addr % W + length] = self.host.mem.read(addr, length)
            raw = bytes(buf)
        else:
            self.host.errors += 1
        return {"tag": tag, "status": st.value, "addr": addr & 0xFFF, "len": length,
                "due": due & 0xFFFFFFFF, "data": raw}

    def request(self, hdr, time, words=b""):
        from hw.formats import TlpKind
        if hdr["kind"] == TlpKind.MWR.value:
            rsp = self.host.write(hdr["tag"], hdr["addr"], hdr["len"], words)
            return rsp.status.value, []
        push = self.response(hdr["tag"], hdr["addr"], hdr["len"], time + self.mem_cycles)
        out = [push]
        if self.held is not None:
            out.append(self.held)
            self.held = None
            self.reordered += 1
        elif self.reorder and self.rng.random() < self.reorder:
            self.held = push
            out = []
        return TlpStatus.SC.value, out

    def flush(self):
        held, self.held = self.held, None
        return [] if held is None else [held]
