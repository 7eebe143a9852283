"""Driver model and verbs API of the RNIC (host side, pure Python, per transaction).

Names follow libibverbs / pyverbs: :class:`Context`, :meth:`Context.alloc_pd`,
:meth:`Context.reg_mr`, :meth:`Context.create_cq`, :meth:`Context.create_qp`,
:meth:`QueuePair.modify_qp`, :meth:`QueuePair.post_send`, :meth:`QueuePair.post_recv`,
:meth:`CompletionQueue.poll_cq`, with :class:`SendWR`, :class:`RecvWR` and :class:`WC`.

The driver talks to the NIC only through two abstract hooks, so that the same code runs
under cocotb (MMIO on the simulated bus, host memory in ``sim/host.py``) or against a fake:

* ``mmio``: ``await mmio.write(addr, value)`` and ``await mmio.read(addr)`` on the 64-bit
  registers of :mod:`hw.regmap` (:class:`Mmio`);
* ``mem``: ``mem.read(addr, n) -> bytes`` and ``mem.write(addr, data)`` on host memory
  (:class:`Memory`). Either may be a plain function or a coroutine function.

What the driver does, in the order the hardware sees it:

* configuration through the command interface (``ARG[i]`` words, then ``CMD``, then a read of
  ``CMD`` for the status; ``BUSY``, "in progress", is read again, any other non-OK status
  is a permanent refusal and raises :class:`CommandError` at once, for example ``BAD_STATE``
  for ``SET_QP`` on a QP that is not in RESET): ``SET_MR`` for memory regions (IBA 10.6:
  key, bounds, access rights, protection domain), ``SET_CQ`` for completion queues,
  ``SET_QP`` + ``BIND_DB`` for queue pairs and ``MODIFY_QP`` for the state machine of
  IBA 10.3.1 (RESET -> INIT -> RTR -> RTS, any -> ERR / RESET);
* send work requests (IBA 10.8, 11.4.1) as :data:`~hw.formats.WQE` entries in a host ring
  of ``sq_depth`` slots (each names its slot, ``index``, and its QP), then one 64-bit
  :data:`~hw.formats.DOORBELL` write with the new free running producer index at
  ``DOORBELL_BASE + 8 * register``; or, for a single work request with ``blueflame`` on,
  the WQE once more in a 64-byte write to ``BLUEFLAME_BASE + 64 * register`` (mlx5's
  BlueFlame: the NIC has the WQE without reading it, and the write is the doorbell);
* receive work requests as :data:`~hw.formats.RECV_WQE` entries, then ``RQ_DB``;
* completions (IBA 11.6, ``ibv_poll_cq``) read from a host ring of :data:`~hw.formats.CQE`
  entries; an entry is new when its owner bit equals the pass over the ring (first pass 1);
  the consumer index is then written to ``CQ_DB``.

Doorbell registers (SMART, ASPLOS'24, section 3.1): with ``doorbell_policy='mlx5'`` the first
``dedicated_doorbells`` QPs (4, as mlx5's low-latency bfregs; at most ``n_doorbells - 1``)
get registers 0, 1, 2, 3 of their own, every later QP goes to the least-used remaining
(shared) register, lowest number first, which is round-robin when QPs are only created.
With ``'per_thread'`` every QP gets a register of its own and creation fails when they run
out. A shared register is behind a host lock in the real driver: :meth:`Context.doorbell_shared`
tells a workload model when to take one.

Send-queue slots are reclaimed from completions as in libibverbs: a send CQE frees its WQE
and every unsignaled WQE posted before it, so a QP that never signals eventually fills up.
The driver's copy of a QP's state follows its own modify_qp calls, and moves to ERR when
poll_cq returns an error completion of that QP (on RC every error completion means the QP is
in ERR, IBA 10.3.1); an NIC-side transition it has not seen yet shows up as a refused command.
"""

import inspect
from dataclasses import dataclass
from enum import IntFlag
from typing import NamedTuple, Protocol, runtime_checkable

from hw import formats
from hw.config import NicConfig
from hw.formats import (Access, QpState, WcOpcode, WcStatus, WrOpcode, CQE, CQE_BYTES,
                        CQE_FLAG_IMM, CQE_FLAG_OWNER, DOORBELL, MR_ENTRY, RECV_WQE,
                        RECV_WQE_BYTES, WQE, WQE_BYTES)
from hw.regmap import (ARG_BASE, ARG_WORDS, BLUEFLAME_BASE, BLUEFLAME_BYTES, CQ_CTX,
                       DOORBELL_BASE, COUNTER_BASE, ID_VALUE, LEGAL_TRANSITIONS,
                       MR_ICM_ENTRY_BYTES, CQ_ICM_ENTRY_BYTES, QP_ICM_ENTRY_BYTES, QP_CTX, Cmd, CmdStatus,
                       Counter, IcmTable, Reg)

__all__ = [
    "Memory", "Mmio", "SendFlags", "SGE", "SendWR", "RecvWR", "WC", "VerbsError",
    "CommandError", "Context", "ProtectionDomain", "MemoryRegion", "CompletionQueue",
    "QueuePair", "connect", "ALL_REMOTE", "ENOMEM", "EINVAL",
]

ENOMEM = 12
EINVAL = 22

#: Remote rights a QP grants by default (ibv_qp_attr.qp_access_flags).
ALL_REMOTE = Access.REMOTE_WRITE | Access.REMOTE_READ | Access.REMOTE_ATOMIC

_MAX_QUEUE_DEPTH = 1 << 15        # producer / consumer indices are 16-bit, free running
_CMD_BUSY_POLLS = 1000


@runtime_checkable
class Memory(Protocol):
    """Host memory as the driver sees it (byte addressed, little-endian structures)."""

    def read(self, addr: int, n: int) -> bytes: ...

    def write(self, addr: int, data: bytes) -> None: ...


@runtime_checkable
class Mmio(Protocol):
    """The NIC's 64-bit register bus (see :mod:`hw.regmap`)."""

    async def write(self, addr: int, value: int) -> None: ...

    async def read(self, addr: int) -> int: ...


@runtime_checkable
class BlueFlameMmio(Mmio, Protocol):
    """A register bus that also takes 64-byte write-combined writes (BlueFlame)."""

    async def write_bf(self, addr: int, data: bytes) -> None: ...


async def _maybe_await(value):
    if inspect.isawaitable(value):
        return await value
    return value


def _check_int(name, value, lo, hi):
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise ValueError(f"{name} must be an integer in [{lo}, {hi}], not {value!r}")


def _check_pow2(name, value, lo, hi):
    _check_int(name, value, lo, hi)
    if value & (value - 1):
        raise ValueError(f"{name} must be a power of two in [{lo}, {hi}], not {value!r}")


def _enum_or_int(enum_cls, value):
    try:
        return enum_cls(value)
    except ValueError:
        return value


# ---------------------------------------------------------------------------------------
# Work requests and completions

#: QP numbers 0 and 1 are the special QPs of subnet management and general services
#: (IBA vol. 1, 3.9.3 and 13.5.1); an RC QP never has them, and Wireshark decodes traffic to
#: them as management datagrams. The driver hands out QPNs from here on.
FIRST_QPN = 2


class SendFlags(IntFlag):
    """``ibv_send_flags`` as stored in the WQE flags byte."""
    SIGNALED = formats.WQE_FLAG_SIGNALED
    FENCE = formats.WQE_FLAG_FENCE
    SOLICITED = formats.WQE_FLAG_SOLICITED


class SGE(NamedTuple):
    """One scatter/gather entry (``ibv_sge``)."""
    addr: int
    length: int
    lkey: int


@dataclass(frozen=True)
class SendWR:
    """A send work request (``ibv_send_wr`` with one SGE).

    ``opcode`` is a :class:`~hw.formats.WrOpcode` or, to exercise the NIC's error path, any
    byte value. ``sg`` is ``(addr, length, lkey)``. ``compare_add`` is the CAS compare value or
    the fetch-and-add addend, ``swap`` the CAS swap value. As in pyverbs, ``send_flags``
    defaults to ``SIGNALED``.
    """
    wr_id: int = 0
    opcode: object = WrOpcode.SEND
    sg: object = (0, 0, 0)
    remote_addr: int = 0
    rkey: int = 0
    compare_add: int = 0
    swap: int = 0
    imm: int = 0
    send_flags: int = SendFlags.SIGNALED

    def __post_init__(self):
        sg = SGE(0, 0, 0) if self.sg is None else SGE(*self.sg)
        object.__setattr__(self, "sg", sg)
        op = self.opcode.value if isinstance(self.opcode, WrOpcode) else self.opcode
        _check_int("opcode", op, 0, 255)
        object.__setattr__(self, "opcode", _enum_or_int(WrOpcode, op))
        object.__setattr__(self, "send_flags", SendFlags(int(self.send_flags) & 0xFF))
        for name, bits in (("wr_id", 64), ("remote_addr", 64), ("rkey", 32),
                           ("compare_add", 64), ("swap", 64), ("imm", 32)):
            _check_int(name, getattr(self, name), 0, (1 << bits) - 1)
        _check_int("sg.addr", sg.addr, 0, (1 << 64) - 1)
        _check_int("sg.length", sg.length, 0, (1 << 32) - 1)
        _check_int("sg.lkey", sg.lkey, 0, (1 << 32) - 1)

    @property
    def signaled(self):
        return bool(self.send_flags & SendFlags.SIGNALED)

    def wqe_bytes(self, index=0, qpn=0):
        """The 64-byte :data:`~hw.formats.WQE` of this request, in slot ``index`` (free
        running, 16 bits) of the send queue of QP ``qpn``."""
        return formats.pack(
            WQE, opcode=int(getattr(self.opcode, "value", self.opcode)), index=index, qpn=qpn,
            flags=int(self.send_flags), imm=self.imm, wr_id=self.wr_id,
            local_addr=self.sg.addr, length=self.sg.length, lkey=self.sg.lkey,
            remote_addr=self.remote_addr, rkey=self.rkey,
            compare_add=self.compare_add, swap=self.swap)


@dataclass(frozen=True)
class RecvWR:
    """A receive work request (``ibv_recv_wr`` with one SGE)."""
    wr_id: int = 0
    addr: int = 0
    length: int = 0
    lkey: int = 0

    def __post_init__(self):
        _check_int("wr_id", self.wr_id, 0, (1 << 64) - 1)
        _check_int("addr", self.addr, 0, (1 << 64) - 1)
        _check_int("length", self.length, 0, (1 << 32) - 1)
        _check_int("lkey", self.lkey, 0, (1 << 32) - 1)

    def wqe_bytes(self):
        """The 32-byte :data:`~hw.formats.RECV_WQE` of this request."""
        return formats.pack(RECV_WQE, wr_id=self.wr_id, addr=self.addr,
                            length=self.length, lkey=self.lkey)


class WC(NamedTuple):
    """A work completion (``ibv_wc``) decoded from a CQE.

    ``status`` and ``opcode`` are :class:`~hw.formats.WcStatus` / :class:`~hw.formats.WcOpcode`
    (or the raw byte when the CQE holds an unknown value). ``imm`` is meaningful when
    ``flags & CQE_FLAG_IMM``; ``flags`` excludes the owner bit.
    """
    wr_id: int
    status: object
    opcode: object
    byte_len: int
    imm: int
    qp_num: int
    src_qp: int
    flags: int
    vendor_err: int = 0

    @property
    def with_imm(self):
        return bool(self.flags & CQE_FLAG_IMM)

    @classmethod
    def from_bytes(cls, raw):
        f = formats.unpack(CQE, raw)
        return cls(wr_id=f["wr_id"], status=_enum_or_int(WcStatus, f["status"]),
                   opcode=_enum_or_int(WcOpcode, f["opcode"]), byte_len=f["byte_len"],
                   imm=f["imm"], qp_num=f["qpn"], src_qp=f["src_qpn"],
                   flags=f["flags"] & ~CQE_FLAG_OWNER & 0xFF, vendor_err=f["vendor_err"])


class VerbsError(Exception):
    """A verb failed; ``errno`` is the libibverbs error number (ENOMEM, EINVAL)."""

    def __init__(self, message, errno=EINVAL):
        super().__init__(message)
        self.errno = errno


class CommandError(VerbsError):
    """The NIC refused a command: ``cmd``, ``index`` and the :class:`CmdStatus` it returned."""

    def __init__(self, cmd, index, status):
        status = _enum_or_int(CmdStatus, status)
        name = getattr(status, "name", status)
        super().__init__(f"command {Cmd(cmd).name} (index {index}) refused by the NIC: "
                         f"status {name}", EINVAL)
        self.cmd = Cmd(cmd)
        self.index = index
        self.status = status


# ---------------------------------------------------------------------------------------
# Objects

class ProtectionDomain:
    """``ibv_pd``: a number (1..65535) that MRs and QPs are checked against (IBA 10.6.3)."""

    def __init__(self, ctx, pdn):
        self.ctx = ctx
        self.pdn = pdn

    async def reg_mr(self, addr, length, access):
        return await self.ctx.reg_mr(self, addr, length, access)

    def __repr__(self):
        return f"ProtectionDomain({self.pdn})"


class MemoryRegion:
    """``ibv_mr``: slot in the NIC's MR table; ``lkey == rkey == (slot << 8) | tag``."""

    def __init__(self, ctx, pd, slot, key, addr, length, access):
        self.ctx = ctx
        self.pd = pd
        self.slot = slot
        self.key = key
        self.addr = addr
        self.length = length
        self.access = access
        self.valid = True

    lkey = property(lambda self: self.key)
    rkey = property(lambda self: self.key)

    async def dereg(self):
        await self.ctx.dereg_mr(self)

    def __repr__(self):
        return (f"MemoryRegion(slot={self.slot}, key={self.key:#x}, addr={self.addr:#x}, "
                f"length={self.length}, access={self.access!r}, valid={self.valid})")


class CompletionQueue:
    """``ibv_cq``: a ring of ``depth`` CQEs in host memory, consumed by :meth:`poll_cq`."""

    def __init__(self, ctx, cqn, depth, base):
        self.ctx = ctx
        self.cqn = cqn
        self.depth = depth
        self.base = base
        self.ci = 0                    # consumer index, free running (mod 2**16 on the bus)

    def _slot_addr(self, index):
        return self.base + (index % self.depth) * CQE_BYTES

    async def poll_cq(self, num_entries=1):
        """Up to ``num_entries`` new completions, oldest first (``ibv_poll_cq``).

        A CQE is new when its owner bit equals ``(pass + 1) % 2`` for the current pass over
        the ring: 1 on the first pass, 0 on the second, and so on. When at least one is consumed, the new
        consumer index is written to ``CQ_DB``.
        """
        _check_int("num_entries", num_entries, 1, 1 << 30)
        wcs = []
        while len(wcs) < num_entries:
            raw = await _maybe_await(self.ctx.mem.read(self._slot_addr(self.ci), CQE_BYTES))
            owner = 1 if raw[CQE_BYTES - 1] & CQE_FLAG_OWNER else 0
            if owner != ((self.ci // self.depth) + 1) & 1:
                break
            wc = WC.from_bytes(raw)
            self.ci += 1
            self.ctx._on_completion(self, wc)
            wcs.append(wc)
        if wcs:
            await self.ctx.mmio_write(Reg.CQ_DB, self.cqn | ((self.ci & 0xFFFF) << 32))
        return wcs

    def __repr__(self):
        return f"CompletionQueue(cqn={self.cqn}, depth={self.depth}, base={self.base:#x})"


class QueuePair:
    """``ibv_qp`` of type RC: send and receive rings in host memory, bound to a doorbell."""

    def __init__(self, ctx, qpn, pd, send_cq, recv_cq, sq_depth, rq_depth, sq_base, rq_base,
                 access, max_rd_atomic, db_reg, timeout=14, retry_cnt=7, rnr_retry=0,
                 min_rnr_timer=1):
        self.ctx = ctx
        self.timeout = timeout
        self.retry_cnt = retry_cnt
        self.rnr_retry = rnr_retry
        self.min_rnr_timer = min_rnr_timer
        self.qpn = qpn
        self.pd = pd
        self.send_cq = send_cq
        self.recv_cq = recv_cq
        self.sq_depth = sq_depth
        self.rq_depth = rq_depth
        self.sq_base = sq_base
        self.rq_base = rq_base
        self.access = Access(int(getattr(access, "value", access)))
        self.max_rd_atomic = max_rd_atomic
        self.db_reg = db_reg
        self.state = QpState.RESET
        self.dest_node = 0
        self.dest_qpn = 0
        self.sq_psn = 0
        self.rq_psn = 0
        self._reset_indices()

    qp_num = property(lambda self: self.qpn)

    def _reset_indices(self):
        self.sq_pi = 0                 # free running; WQE slot = index % sq_depth
        self.sq_unrung = 0             # WQEs written with ring=False, doorbell not yet rung
        self._last_wqe = b""
        self.sq_ci = 0
        self.rq_pi = 0
        self.rq_ci = 0
        self._sq_outstanding = []      # (wr_id, signaled) of posted, not yet completed WQEs

    @property
    def doorbell_addr(self):
        return DOORBELL_BASE + 8 * self.db_reg

    @property
    def blueflame_addr(self):
        return BLUEFLAME_BASE + BLUEFLAME_BYTES * self.db_reg

    def qp_ctx_bytes(self):
        """The :data:`~hw.regmap.QP_CTX` this QP is programmed with."""
        return formats.pack(
            QP_CTX, sq_base=self.sq_base, rq_base=self.rq_base,
            sq_log_size=self.sq_depth.bit_length() - 1,
            rq_log_size=self.rq_depth.bit_length() - 1,
            send_cq=self.send_cq.cqn, recv_cq=self.recv_cq.cqn, pd=self.pd.pdn,
            dest_qpn=self.dest_qpn, dest_node=self.dest_node, access=int(self.access.value),
            max_rd_atomic=self.max_rd_atomic, timeout=self.timeout, retry_cnt=self.retry_cnt,
            rnr_retry=self.rnr_retry, min_rnr_timer=self.min_rnr_timer)

    async def _program(self):
        await self.ctx.command(Cmd.SET_QP, self.qpn, self.qp_ctx_bytes())
        await self.ctx.command(Cmd.BIND_DB, self.qpn, self.db_reg.to_bytes(8, "little"))

    async def set_remote(self, dest_node, dest_qpn):
        """Name the connected QP; re-issues SET_QP, so the QP must be in RESET."""
        _check_int("dest_node", dest_node, 0, 255)
        _check_int("dest_qpn", dest_qpn, 0, (1 << 24) - 1)
        if self.state != QpState.RESET:
            raise VerbsError(f"QP {self.qpn}: the remote QP can only be set in RESET, "
                             f"not {self.state.name}")
        self.dest_node = dest_node
        self.dest_qpn = dest_qpn
        await self._program()

    async def modify_qp(self, state, sq_psn=None, rq_psn=None, *, check=True):
        """Move to ``state`` with MODIFY_QP (IBA 10.3.1); PSNs default to the last ones used.

        Raises :class:`ValueError` for a transition that IBA does not allow (the NIC is not
        asked) and :class:`CommandError` when the NIC refuses; either way nothing changes,
        neither the driver's state nor its PSNs. ``check=False`` skips the driver's own check
        and sends the command anyway, so that a test can see the NIC refuse it.
        """
        state = QpState(state)
        if not isinstance(check, bool):
            raise TypeError(f"check must be True or False, not {check!r}")
        if sq_psn is not None:
            _check_int("sq_psn", sq_psn, 0, (1 << 24) - 1)
        if rq_psn is not None:
            _check_int("rq_psn", rq_psn, 0, (1 << 24) - 1)
        if check and (self.state.name, state.name) not in LEGAL_TRANSITIONS:
            raise ValueError(f"state: QP {self.qpn} cannot go from {self.state.name} to "
                             f"{state.name}; legal transitions are {sorted(LEGAL_TRANSITIONS)}")
        sq_psn = self.sq_psn if sq_psn is None else sq_psn
        rq_psn = self.rq_psn if rq_psn is None else rq_psn
        args = state.value.to_bytes(8, "little") + (sq_psn | (rq_psn << 24)).to_bytes(8, "little")
        await self.ctx.command(Cmd.MODIFY_QP, self.qpn, args)
        self.state = state
        self.sq_psn, self.rq_psn = sq_psn, rq_psn
        if state == QpState.RESET:
            self._reset_indices()

    # -- posting -------------------------------------------------------------------------

    async def post_send(self, wrs, allow_overflow=False, ring=True):
        """Write the WQEs of ``wrs`` (one :class:`SendWR` or a list) and ring the doorbell once.

        Raises :class:`VerbsError` with ``errno == ENOMEM`` when the send queue would hold more
        than ``sq_depth`` outstanding WQEs, unless ``allow_overflow`` (then the ring is
        overwritten and the doorbell still rung, to test the NIC's behaviour).

        ``ring=False`` writes the WQEs only; :meth:`ring_sq` (or the next post with ``ring``)
        rings one doorbell for all of them, as a driver chaining WQEs does (mlx5's
        ``ibv_wr_start`` .. ``ibv_wr_complete``). BlueFlame is used only for a single WQE.
        """
        wrs = [wrs] if isinstance(wrs, SendWR) else list(wrs)
        for wr in wrs:
            if not isinstance(wr, SendWR):
                raise TypeError(f"post_send takes SendWR objects, not {type(wr).__name__}")
        if not wrs:
            return
        if self.state in (QpState.RESET, QpState.INIT, QpState.RTR):
            raise VerbsError(f"QP {self.qpn} is in {self.state.name}: the send queue accepts "
                             f"work requests in RTS or ERR (IBA 10.3.1)", EINVAL)
        if self.sq_pi - self.sq_ci + len(wrs) > self.sq_depth and not allow_overflow:
            raise VerbsError(f"QP {self.qpn}: send queue full ({self.sq_pi - self.sq_ci} of "
                             f"{self.sq_depth} outstanding, {len(wrs)} more posted)", ENOMEM)
        raw = b""
        for wr in wrs:
            addr = self.sq_base + (self.sq_pi % self.sq_depth) * WQE_BYTES
            raw = wr.wqe_bytes(index=self.sq_pi & 0xFFFF, qpn=self.qpn)
            await _maybe_await(self.ctx.mem.write(addr, raw))
            self._sq_outstanding.append((wr.wr_id, wr.signaled))
            self.sq_pi += 1
        self.sq_unrung += len(wrs)
        self._last_wqe = raw
        if ring:
            await self.ring_sq()

    async def ring_sq(self):
        """Ring the send doorbell for the WQEs written since the last ring: by BlueFlame (the
        WQE again, into the QP's BlueFlame register: that write is the doorbell) when there
        is exactly one and the context uses BlueFlame, else an 8-byte doorbell with the
        current producer index."""
        n, self.sq_unrung = self.sq_unrung, 0
        if n == 1 and self.ctx.blueflame:
            await _maybe_await(self.ctx.mmio.write_bf(self.blueflame_addr, self._last_wqe))
            return
        word = int.from_bytes(formats.pack(DOORBELL, qpn=self.qpn, pi=self.sq_pi & 0xFFFF),
                              "little")
        await self.ctx.mmio_write(self.doorbell_addr, word)

    async def post_recv(self, wrs):
        """Write the receive WQEs of ``wrs`` (one :class:`RecvWR` or a list), then ``RQ_DB``."""
        wrs = [wrs] if isinstance(wrs, RecvWR) else list(wrs)
        for wr in wrs:
            if not isinstance(wr, RecvWR):
                raise TypeError(f"post_recv takes RecvWR objects, not {type(wr).__name__}")
        if not wrs:
            return
        if self.state == QpState.RESET:
            raise VerbsError(f"QP {self.qpn} is in RESET: receive work requests can be posted "
                             f"from INIT on (IBA 10.3.1)", EINVAL)
        if self.rq_pi - self.rq_ci + len(wrs) > self.rq_depth:
            raise VerbsError(f"QP {self.qpn}: receive queue full ({self.rq_pi - self.rq_ci} of "
                             f"{self.rq_depth} outstanding, {len(wrs)} more posted)", ENOMEM)
        for wr in wrs:
            addr = self.rq_base + (self.rq_pi % self.rq_depth) * RECV_WQE_BYTES
            await _maybe_await(self.ctx.mem.write(addr, wr.wqe_bytes()))
            self.rq_pi += 1
        await self.ctx.mmio_write(Reg.RQ_DB, self.qpn | ((self.rq_pi & 0xFFFF) << 32))

    # -- completion bookkeeping ----------------------------------------------------------

    def _send_completed(self, wc):
        # In-order completion (IBA 10.8): the CQE's WQE and every unsignaled WQE before it
        # are done. Match on wr_id from the head of the outstanding list.
        for i, (wr_id, signaled) in enumerate(self._sq_outstanding):
            if wr_id == wc.wr_id and (signaled or wc.status != WcStatus.SUCCESS):
                del self._sq_outstanding[:i + 1]
                self.sq_ci += i + 1
                return

    def _recv_completed(self, wc):
        if self.rq_ci < self.rq_pi:
            self.rq_ci += 1

    def __repr__(self):
        return (f"QueuePair(qpn={self.qpn}, state={self.state.name}, db_reg={self.db_reg}, "
                f"sq_depth={self.sq_depth}, rq_depth={self.rq_depth})")


# ---------------------------------------------------------------------------------------

class Context:
    """``ibv_context``: one NIC, its host memory and the driver's allocators.

    ``host_base``/``host_size`` bound a bump allocator (:meth:`alloc`) for queues and
    buffers. ``doorbell_policy`` is ``'mlx5'`` or ``'per_thread'`` (see the module doc).
    ``blueflame``: post a single send work request by BlueFlame (the ``mmio`` must be a
    :class:`BlueFlameMmio`).
    Call ``await ctx.open()`` once before anything else (it checks ``ID`` and writes
    ``NODE_ID``).
    """

    POLICIES = ("mlx5", "per_thread")

    def __init__(self, mmio, mem, nic_cfg=None, node_id=0, *, host_base=0x1000_0000,
                 host_size=1 << 24, doorbell_policy="mlx5", dedicated_doorbells=4,
                 first_qpn=FIRST_QPN, blueflame=False):
        nic_cfg = NicConfig() if nic_cfg is None else nic_cfg
        if not isinstance(nic_cfg, NicConfig):
            raise ValueError(f"nic_cfg must be a NicConfig, not {type(nic_cfg).__name__}")
        _check_int("node_id", node_id, 0, 255)
        _check_int("host_base", host_base, 0, (1 << 64) - 1)
        _check_int("host_size", host_size, 1, (1 << 64) - host_base)
        if doorbell_policy not in self.POLICIES:
            raise ValueError(f"doorbell_policy must be one of {list(self.POLICIES)}, "
                             f"not {doorbell_policy!r}")
        _check_int("dedicated_doorbells", dedicated_doorbells, 0, 512)
        _check_int("first_qpn", first_qpn, 0, nic_cfg.n_qps - 1)
        if not isinstance(blueflame, bool):
            raise ValueError(f"blueflame must be True or False, not {blueflame!r}")
        if blueflame and not callable(getattr(mmio, "write_bf", None)):
            raise ValueError("blueflame=True needs an MMIO driver with write_bf (BlueFlameMmio)")
        self.blueflame = blueflame
        self.first_qpn = first_qpn
        self.mmio = mmio
        self.mem = mem
        self.cfg = nic_cfg
        self.node_id = node_id
        self.host_base = host_base
        self.host_size = host_size
        self.doorbell_policy = doorbell_policy
        # at least one register stays shared, so later QPs always have somewhere to go
        self.dedicated_doorbells = min(dedicated_doorbells, max(0, nic_cfg.n_doorbells - 1))
        self._brk = host_base
        self._top = host_base + host_size     # the allocator's end (ICM sits above it)
        self.icm_mr_base = None
        self.icm_cq_base = None
        self.icm_qp_base = None
        self._next_pd = 1
        self._mr_slots = [None] * nic_cfg.n_mrs
        self._mr_tag = 0
        self.cqs = {}
        self.qps = {}
        self.doorbell_users = [0] * nic_cfg.n_doorbells

    # -- plumbing ------------------------------------------------------------------------

    async def mmio_write(self, addr, value):
        await _maybe_await(self.mmio.write(int(addr), int(value)))

    async def mmio_read(self, addr):
        return int(await _maybe_await(self.mmio.read(int(addr))))

    async def open(self, check_id=True):
        """Check the ``ID`` register, program ``NODE_ID`` and map the NIC's context memory.

        ICM (the MR table, ``n_mrs`` entries of 32 bytes, the CQ context table, ``n_cqs``
        entries of 32 bytes, and the QP context table, ``n_qps`` entries of 32 bytes) takes
        the top of the host region, each table 4 KB aligned, out of the allocator's reach; the driver zeroes it (every entry invalid)
        and hands each table over with ``MAP_ICM`` (as mlx5 gives the firmware ICM pages at
        start-up, before any object is created).
        """
        if check_id:
            ident = await self.mmio_read(Reg.ID)
            if ident != ID_VALUE:
                raise VerbsError(f"ID register reads {ident:#x}, expected {ID_VALUE:#x}")
        await self.mmio_write(Reg.NODE_ID, self.node_id)
        if self.icm_mr_base is None:
            self.icm_mr_base = await self._map_icm(IcmTable.MR, self.cfg.n_mrs * MR_ICM_ENTRY_BYTES)
        if self.icm_cq_base is None:
            self.icm_cq_base = await self._map_icm(IcmTable.CQ, self.cfg.n_cqs * CQ_ICM_ENTRY_BYTES)
        if self.icm_qp_base is None:
            self.icm_qp_base = await self._map_icm(IcmTable.QP, self.cfg.n_qps * QP_ICM_ENTRY_BYTES)
        return self

    async def _map_icm(self, table, size):
        """Zero ``size`` bytes at the top of the host region (4 KB aligned) and hand them to
        the NIC as ICM ``table``; returns their address."""
        base = (self._top - size) & ~0xFFF
        if base < self._brk:
            raise VerbsError(f"host memory exhausted: the {size}-byte {table.name} table (ICM) "
                             f"does not fit above {self._brk:#x}", ENOMEM)
        await _maybe_await(self.mem.write(base, bytes(size)))
        await self.command(Cmd.MAP_ICM, table, base.to_bytes(8, "little"))
        self._top = base
        return base

    async def command(self, cmd, index, args=b""):
        """Run one command: write the argument words, ``CMD``, then read the status.

        ``args`` are the bytes of the argument layout (ARG0 = bytes 0-7); only the words
        they cover are written. ``CMD`` is read again while it says ``BUSY`` (in progress),
        at most ``_CMD_BUSY_POLLS`` times; any other non-OK status (a permanent refusal such
        as ``BAD_STATE`` or ``BAD_TRANSITION``) raises :class:`CommandError` at once, and so
        does a command still ``BUSY`` after the last read.
        """
        cmd = Cmd(cmd)
        _check_int("index", index, 0, 0xFFFF)
        args = bytes(args)
        nwords = (len(args) + 7) // 8
        if nwords > ARG_WORDS:
            raise ValueError(f"args must be at most {8 * ARG_WORDS} bytes, not {len(args)}")
        args = args.ljust(8 * nwords, b"\0")
        for i in range(nwords):
            await self.mmio_write(ARG_BASE + 8 * i, int.from_bytes(args[8 * i:8 * i + 8], "little"))
        await self.mmio_write(Reg.CMD, cmd.value | (index << 16))
        for _ in range(_CMD_BUSY_POLLS):
            status = (await self.mmio_read(Reg.CMD)) & 0xFF
            if status != CmdStatus.BUSY:
                break
        if status != CmdStatus.OK:
            raise CommandError(cmd, index, status)

    async def get_async_event(self):
        """The oldest asynchronous event (``ibv_get_async_event``, IBA 11.6.3) as
        ``(AsyncEventType value, CQN or QPN)``, or None when there is none (it is removed)."""
        v = await self.mmio_read(Reg.ASYNC_EVENT)
        if not v >> 63:
            return None
        return (v >> 24) & 0xF, v & 0xFFFFFF

    async def read_counter(self, counter):
        """Value of a performance counter (:class:`~hw.regmap.Counter`)."""
        return await self.mmio_read(COUNTER_BASE + 8 * Counter(counter).value)

    def alloc(self, size, align=64):
        """Host memory from the bump allocator: the address of ``size`` bytes."""
        _check_int("size", size, 1, self.host_size)
        _check_pow2("align", align, 1, 1 << 30)
        addr = (self._brk + align - 1) & ~(align - 1)
        if addr + size > self._top:
            raise VerbsError(f"host memory exhausted: {size} bytes do not fit in "
                             f"[{self.host_base:#x}, {self._top:#x})", ENOMEM)
        self._brk = addr + size
        return addr

    alloc_buffer = alloc

    # -- verbs ---------------------------------------------------------------------------

    def alloc_pd(self):
        """A new protection domain (numbers 1..65535; 0 is never handed out)."""
        if self._next_pd > 0xFFFF:
            raise ValueError("protection domains: at most 65535 per context")
        pd = ProtectionDomain(self, self._next_pd)
        self._next_pd += 1
        return pd

    async def reg_mr(self, pd, addr, length, access):
        """Register ``[addr, addr + length)`` with ``access`` rights; programs SET_MR.

        The key is ``(slot << 8) | tag``; the tag changes at every registration so that a key
        of a deregistered region never names the slot's next region.
        """
        self._check_pd(pd)
        _check_int("addr", addr, 0, (1 << 64) - 1)
        _check_int("length", length, 0, (1 << 64) - 1 - addr)
        access = Access(int(getattr(access, "value", access)))
        try:
            slot = self._mr_slots.index(None)
        except ValueError:
            raise ValueError(f"memory regions: at most n_mrs={self.cfg.n_mrs} registered at "
                             f"once") from None
        self._mr_tag = (self._mr_tag + 1) & 0xFF
        key = (slot << 8) | self._mr_tag
        mr = MemoryRegion(self, pd, slot, key, addr, length, access)
        await self.command(Cmd.SET_MR, slot, self._mr_entry(mr, valid=1))
        self._mr_slots[slot] = mr
        return mr

    async def dereg_mr(self, mr):
        """Invalidate ``mr`` (SET_MR with ``valid = 0``); its key stops working."""
        if not isinstance(mr, MemoryRegion) or mr.ctx is not self or not mr.valid:
            raise ValueError(f"mr must be a registered MemoryRegion of this context, not {mr!r}")
        await self.command(Cmd.SET_MR, mr.slot, self._mr_entry(mr, valid=0))
        mr.valid = False
        self._mr_slots[mr.slot] = None

    @staticmethod
    def _mr_entry(mr, valid):
        return formats.pack(MR_ENTRY, base=mr.addr, length=mr.length, key=mr.key,
                            pd=mr.pd.pdn, access=int(mr.access.value), valid=valid)

    async def create_cq(self, depth):
        """A CQ of ``depth`` entries (power of two) in zeroed host memory; programs SET_CQ."""
        _check_pow2("depth", depth, 2, _MAX_QUEUE_DEPTH)
        cqn = len(self.cqs)
        if cqn >= self.cfg.n_cqs:
            raise ValueError(f"completion queues: at most n_cqs={self.cfg.n_cqs} per context")
        base = self.alloc(depth * CQE_BYTES, align=4096)
        watch = getattr(self.mem, "watch", None)
        if watch is not None:      # a memory that keeps CQ rings current from the event line
            watch(base, depth * CQE_BYTES)
        await _maybe_await(self.mem.write(base, bytes(depth * CQE_BYTES)))
        cq = CompletionQueue(self, cqn, depth, base)
        await self.command(Cmd.SET_CQ, cqn,
                           formats.pack(CQ_CTX, base=base, log_size=depth.bit_length() - 1))
        self.cqs[cqn] = cq
        return cq

    async def create_qp(self, pd, send_cq, recv_cq=None, sq_depth=64, rq_depth=64,
                        access=ALL_REMOTE, max_rd_atomic=None, doorbell=None, timeout=14,
                        retry_cnt=7, rnr_retry=0, min_rnr_timer=1):
        """An RC QP in RESET with its rings and doorbell register; programs SET_QP, BIND_DB.

        ``access`` is the remote access the QP grants (``qp_access_flags``). ``doorbell``
        overrides the policy with an explicit register number. The transport attributes
        are those of ``ibv_modify_qp`` (IBA 9.7.6): ``timeout`` (local ACK timeout
        4.096 us * 2**timeout, 0 = infinite; 14 = 67 ms as in perftest), ``retry_cnt``
        (retransmissions after a timeout or PSN sequence NAK, 0..7), ``rnr_retry``
        (retransmissions after an RNR NAK, 0..6, 7 = infinite; 0 by default, as the
        reference model assumes) and ``min_rnr_timer`` (the RNR NAK timer code this QP's
        responder sends, IBA table 45; 1 = 10 us).
        """
        _check_int("timeout", timeout, 0, 31)
        _check_int("retry_cnt", retry_cnt, 0, 7)
        _check_int("rnr_retry", rnr_retry, 0, 7)
        _check_int("min_rnr_timer", min_rnr_timer, 0, 31)
        self._check_pd(pd)
        recv_cq = send_cq if recv_cq is None else recv_cq
        for name, cq in (("send_cq", send_cq), ("recv_cq", recv_cq)):
            if not isinstance(cq, CompletionQueue) or cq.ctx is not self:
                raise ValueError(f"{name} must be a CompletionQueue of this context, not {cq!r}")
        _check_pow2("sq_depth", sq_depth, 2, _MAX_QUEUE_DEPTH)
        _check_pow2("rq_depth", rq_depth, 2, _MAX_QUEUE_DEPTH)
        max_rd_atomic = self.cfg.max_rd_atomic if max_rd_atomic is None else max_rd_atomic
        _check_int("max_rd_atomic", max_rd_atomic, 1, 16)
        access_v = int(getattr(access, "value", access))
        _check_int("access", access_v, 0, 15)
        qpn = self.first_qpn + len(self.qps)
        if qpn >= self.cfg.n_qps:
            raise ValueError(f"queue pairs: at most n_qps={self.cfg.n_qps} per context, "
                             f"QPNs from first_qpn={self.first_qpn}")
        if doorbell is None:
            db_reg = self._pick_doorbell(len(self.qps))
        else:
            _check_int("doorbell", doorbell, 0, self.cfg.n_doorbells - 1)
            db_reg = doorbell
        sq_base = self.alloc(sq_depth * WQE_BYTES, align=4096)
        rq_base = self.alloc(rq_depth * RECV_WQE_BYTES, align=4096)
        qp = QueuePair(self, qpn, pd, send_cq, recv_cq, sq_depth, rq_depth, sq_base, rq_base,
                       access_v, max_rd_atomic, db_reg, timeout=timeout, retry_cnt=retry_cnt,
                       rnr_retry=rnr_retry, min_rnr_timer=min_rnr_timer)
        await qp._program()
        self.doorbell_users[db_reg] += 1
        self.qps[qpn] = qp
        return qp

    def _pick_doorbell(self, index):
        n = self.cfg.n_doorbells
        if self.doorbell_policy == "per_thread":
            free = [r for r in range(n) if self.doorbell_users[r] == 0]
            if not free:
                raise ValueError(f"doorbell_policy 'per_thread' needs one doorbell register per "
                                 f"QP: all n_doorbells={n} registers are in use")
            return free[0]
        dedicated = self.dedicated_doorbells
        if index < dedicated:
            return index
        shared = range(dedicated, n)
        return min(shared, key=lambda r: (self.doorbell_users[r], r))

    def doorbell_shared(self, reg):
        """True when register ``reg`` is (or may become) shared and so needs a host lock."""
        if self.doorbell_policy == "per_thread":
            return self.doorbell_users[reg] > 1
        return reg >= self.dedicated_doorbells

    def _check_pd(self, pd):
        if not isinstance(pd, ProtectionDomain) or pd.ctx is not self:
            raise ValueError(f"pd must be a ProtectionDomain of this context, not {pd!r}")

    def _on_completion(self, cq, wc):
        qp = self.qps.get(wc.qp_num)
        if qp is None:
            return
        is_send = cq is qp.send_cq
        is_recv = cq is qp.recv_cq
        if is_send and is_recv:
            is_recv = isinstance(wc.opcode, WcOpcode) and wc.opcode.value >= 0x80
            is_send = not is_recv
        if wc.status != WcStatus.SUCCESS:
            qp.state = QpState.ERR     # on RC every error completion means the QP is in ERR
        if is_send:
            qp._send_completed(wc)
        elif is_recv:
            qp._recv_completed(wc)


async def connect(qp_a, qp_b, psn_a=0, psn_b=0):
    """Connect two RC QPs: set each one's remote, then RESET -> INIT -> RTR -> RTS on both.

    ``psn_a`` is the first PSN ``qp_a`` sends (and ``qp_b`` expects), ``psn_b`` the reverse.
    Both QPs must be in RESET.
    """
    _check_int("psn_a", psn_a, 0, (1 << 24) - 1)
    _check_int("psn_b", psn_b, 0, (1 << 24) - 1)
    await qp_a.set_remote(qp_b.ctx.node_id, qp_b.qpn)
    await qp_b.set_remote(qp_a.ctx.node_id, qp_a.qpn)
    for state in (QpState.INIT, QpState.RTR, QpState.RTS):
        await qp_a.modify_qp(state, sq_psn=psn_a, rq_psn=psn_b)
        await qp_b.modify_qp(state, sq_psn=psn_b, rq_psn=psn_a)
