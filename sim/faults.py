"""cocotb drivers for the link fault injectors and the frame-injection ports of hw/system.py.

* :class:`LinkFaults` sets the ``fault_<d>_*`` controls of one link direction (``"ab"``:
  node a to node b, ``"ba"``) of :class:`hw.system.TwoNodeSystem` and reads its counters.
  Probabilities are floats in [0, 1], converted to the RTL's 1/65536 units
  (:func:`to_units`; 1.0 becomes ``0xFFFF``, which the RTL treats as *always*).
* :class:`FrameInjector` drives ``inj_<node>``: whole frames (bytes, RoCEv2 headers through
  ICRC, or anything a fuzzer wants) into that node's receive path, merged with the link's
  frames at frame boundaries.

Python acts per transaction: nothing here runs on every clock while idle. Sampling follows
``sim/host.py``: beats are driven right after a rising clock edge, and a beat was taken at
an edge iff ``ready`` reads 1 right after ``await RisingEdge(clk)`` while ``valid`` was
driven high.
"""

from hw.net.fault import ALWAYS, COUNTERS
from hw.interfaces import beat_layout

__all__ = ["LinkFaults", "FrameInjector", "to_units"]

DIRECTIONS = ("ab", "ba")
NODES = ("a", "b")


def to_units(name, p):
    """Probability ``p`` in [0, 1] to the injector's 16-bit setting (``ValueError`` names
    the parameter otherwise): ``round(p * 65536)``, at most ``0xFFFE`` below 1.0, and
    ``0xFFFF`` (always) for 1.0."""
    if not isinstance(p, (int, float)) or isinstance(p, bool) or not 0.0 <= p <= 1.0:
        raise ValueError(f"{name} must be a probability in [0, 1], not {p!r}")
    if p >= 1.0:
        return ALWAYS
    return min(int(round(p * 65536)), ALWAYS - 1)


class LinkFaults:
    """Fault controls and counters of one link direction (``"ab"`` or ``"ba"``)."""

    def __init__(self, dut, direction):
        if direction not in DIRECTIONS:
            raise ValueError(f"direction must be one of 'ab', 'ba', not {direction!r}")
        self.dut = dut
        self.direction = direction
        self.clk = dut.clk
        self._prefix = f"fault_{direction}_"

    def _sig(self, name):
        return getattr(self.dut, self._prefix + name)

    async def configure(self, seed=1, loss=0.0, dup=0.0, reorder=0.0, corrupt=0.0):
        """Set the per-frame probabilities and load ``seed`` into the PRNG (one clock).

        Settings apply from the next frame that starts on the link.
        """
        from cocotb.triggers import RisingEdge
        if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 1 << 32:
            raise ValueError(f"seed must be an integer in [0, 4294967295], not {seed!r}")
        units = {n: to_units(n, p) for n, p in
                 (("loss", loss), ("dup", dup), ("reorder", reorder), ("corrupt", corrupt))}
        for n, u in units.items():
            self._sig(n).value = u
        self._sig("seed").value = seed
        self._sig("seed_load").value = 1
        await RisingEdge(self.clk)
        self._sig("seed_load").value = 0
        self.settings = dict(seed=seed, **units)

    def set_down(self, flag):
        """Link down (frames starting while down are dropped) or up again."""
        self._sig("down").value = int(bool(flag))

    def counters(self):
        """The six counters: ``n_frames``, ``n_lost``, ``n_down``, ``n_dup``,
        ``n_reordered``, ``n_corrupted``."""
        return {c: int(self._sig(c).value) for c in COUNTERS}


class FrameInjector:
    """Drives ``inj_<node>__valid/payload`` (reads ``__ready``) of the system, frame by frame."""

    def __init__(self, dut, node):
        from cocotb.triggers import Lock
        if node not in NODES:
            raise ValueError(f"node must be one of 'a', 'b', not {node!r}")
        self.clk = dut.clk
        self.valid = getattr(dut, f"inj_{node}__valid")
        self.ready = getattr(dut, f"inj_{node}__ready")
        self.payload = getattr(dut, f"inj_{node}__payload")
        width = len(self.payload)
        for w in (8, 16, 32, 64):
            if beat_layout(w).size == width:
                break
        else:
            raise ValueError(f"inj_{node}__payload width {width} is not a beat layout")
        self.W = w
        layout = beat_layout(w)
        self._off = {name: f.offset for name, f in layout}
        self._lock = Lock()
        self.frames = 0            # frames sent
        self.beats = 0             # beats sent
        self.valid.value = 0

    def _encode(self, data, nbytes, last):
        o = self._off
        return (int.from_bytes(data, "little") << o["data"]) | (nbytes << o["nbytes"]) \
            | (int(last) << o["last"])

    async def _drive(self, frame):
        # ``ready`` is read in the ReadOnly phase before the edge that samples it (inputs
        # written, logic settled): the handshake the design sees on every kind of clock. A
        # read after ``RisingEdge`` would see the value from *after* the edge on a plain
        # in-simulation clock (sim/simclock.py, "Sampling").
        from cocotb.triggers import ReadOnly, RisingEdge
        W = self.W
        n = len(frame)
        for off in range(0, n, W):
            chunk = frame[off:off + W]
            self.payload.value = self._encode(chunk, len(chunk), off + W >= n)
            self.valid.value = 1
            while True:
                await ReadOnly()
                taken = int(self.ready.value)
                await RisingEdge(self.clk)
                if taken:
                    break
            self.beats += 1
        self.frames += 1

    @staticmethod
    def _check(frame):
        if not isinstance(frame, (bytes, bytearray)) or len(frame) == 0:
            raise ValueError(f"frame must be non-empty bytes, not {frame!r:.40}")
        return bytes(frame)

    async def send(self, frame: bytes):
        """Send one frame (one beat per clock while ``ready``); returns when it was taken."""
        frame = self._check(frame)
        async with self._lock:
            from cocotb.triggers import RisingEdge
            await RisingEdge(self.clk)
            try:
                await self._drive(frame)
            finally:
                self.valid.value = 0

    async def send_many(self, frames):
        """Send frames back to back (no idle cycle between them)."""
        frames = [self._check(f) for f in frames]
        if not frames:
            return
        async with self._lock:
            from cocotb.triggers import RisingEdge
            await RisingEdge(self.clk)
            try:
                for f in frames:
                    await self._drive(f)
            finally:
                self.valid.value = 0
