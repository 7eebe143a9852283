"""Reference model of RDMA Reliable Connection semantics, used by every scoreboard.

A pure-Python, untimed model of what an RC queue pair must do (InfiniBand Architecture
Specification vol. 1 rel. 1.4): nodes with byte-addressed memory, protection domains, memory
regions, completion queues and queue pairs connected in pairs. Work requests are posted with
:meth:`ReferenceModel.post_send` / :meth:`ReferenceModel.post_recv` and executed by
:meth:`ReferenceModel.run`, which returns the completions each QP must report and the final
memory of every node.

Semantics modelled
------------------
* Operations (IBA 9.4): RDMA WRITE, WRITE with immediate (consumes a receive WQE, completion
  ``RECV_RDMA_WITH_IMM`` with ``byte_len`` = write length), SEND, SEND with immediate, RDMA
  READ, and the 8-byte atomics (9.4.5) COMPARE_SWAP and FETCH_ADD, little-endian in host
  memory, the original value written to the requester's local buffer.
* Ordering (IBA 9.7, 10.8): every QP executes its send queue in order; completions of one
  queue are reported in order. A fence only orders, so it has no visible effect here.
  Unsignaled WRs produce no completion on success (IBA 10.8, 11.4.1).
* Local checks, by the requester before anything is sent (IBA 10.6.3, 11.6.2), in this
  order: unknown opcode -> ``LOC_QP_OP_ERR``; atomic length other than 8 (or any length above
  2**31) -> ``LOC_LEN_ERR``; an lkey that names no valid region, a region of another PD, a
  buffer outside the region, or a READ/atomic target without ``LOCAL_WRITE`` ->
  ``LOC_PROT_ERR``. A zero-length WRITE/READ/SEND checks no key.
* Remote checks, by the responder (IBA 9.7.4, 10.6.3), in the order of the Linux rxe
  responder: the responder QP must be in RTR or RTS, otherwise its packets are dropped and the
  requester ends with ``RETRY_EXC_ERR``; for WRITE/READ/atomic the rkey must name a valid
  region of the responder's PD whose rights and the responder QP's ``access`` both include
  the operation and which contains ``[va, va + length)``, otherwise ``REM_ACCESS_ERR`` (a
  zero-length WRITE/READ checks nothing: IBA 9.7.4 lets the
  responder skip R_Key validation when the DMA length is zero); an atomic ``va`` not 8-byte aligned
  -> ``REM_INV_REQ_ERR``; a SEND (or WRITE with immediate, after the rkey check) with no
  receive WQE posted -> RNR NAK, and with ``rnr_retry = 0`` the requester ends with
  ``RNR_RETRY_EXC_ERR``; then a receive WQE whose buffer ``[addr, addr + length)`` fails
  the local checks (lkey, PD, bounds, ``LOCAL_WRITE``; not checked when the WQE's length is
  0) -> requester ``REM_OP_ERR``, responder CQE ``LOC_PROT_ERR``, nothing written; then a
  SEND longer than the receive buffer -> requester ``REM_INV_REQ_ERR``, responder CQE
  ``LOC_LEN_ERR``. (This order and the whole-buffer check are those of ``hw/rnic/responder.py``;
  the specification does not fix them.)
* Errors (IBA 10.3.1 "Error" state, 11.6.2): the QP that reports an error moves to ERR; a
  responder that NAKs an access / invalid-request / operational error moves to ERR too (an
  RNR NAK does not). When a QP enters ERR every WR still on either of its queues completes
  with ``WR_FLUSH_ERR``, signaled or not, send queue first; so does every WR posted later.
  Moving a QP to RESET drops its WRs without completions.

Completions and what is defined
-------------------------------
A :class:`Completion` is ``(wr_id, status, opcode, byte_len, imm, qpn)``. On success
``byte_len`` is the message length (8 for atomics) and ``imm`` the immediate data of a
receive completion or ``None``. libibverbs defines only ``wr_id``, ``status`` and ``qp_num``
of an error completion; the model fills ``opcode`` with the WR's natural completion opcode
(``RECV`` for receive WQEs, ``None`` for an unknown send opcode), ``byte_len = 0`` and
``imm = None``, and :meth:`Completion.essential` drops them for comparison.

What is deterministic: the list of completions of each QP's send queue and of its receive
queue, and the memory of every byte outside :attr:`Node.undefined` (ranges that an erroring
operation may or may not have written, e.g. a receive buffer on ``LOC_LEN_ERR``: IBA
11.6.2 leaves the buffers of a WR completed in error undefined). ``run`` interleaves the QPs
round-robin, one WR each, in creation order: a workload whose QPs touch overlapping bytes,
or whose responder QP also sends while it is being driven into ERR, has timing-dependent
results in hardware and must not rely on this interleaving.
"""

from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple, Optional

from hw.formats import Access, CQE_FLAG_IMM, QpState, WcOpcode, WcStatus, WrOpcode
from hw.regmap import LEGAL_TRANSITIONS

from .verbs import ALL_REMOTE, RecvWR, SendFlags, SendWR, SGE

__all__ = ["Completion", "SparseMemory", "MemoryRegion", "QueuePair", "Node", "RunResult",
           "ReferenceModel", "compare_completions", "split_completions",
           "SendWR", "RecvWR", "SendFlags", "SGE"]

PAGE_BYTES = 4096
MAX_MSG_BYTES = 1 << 31          # IBA 9.4: a message is at most 2**31 bytes

_S = WcStatus
_WC_OF = {
    WrOpcode.RDMA_WRITE: WcOpcode.RDMA_WRITE,
    WrOpcode.RDMA_WRITE_WITH_IMM: WcOpcode.RDMA_WRITE,
    WrOpcode.SEND: WcOpcode.SEND,
    WrOpcode.SEND_WITH_IMM: WcOpcode.SEND,
    WrOpcode.RDMA_READ: WcOpcode.RDMA_READ,
    WrOpcode.ATOMIC_CMP_AND_SWP: WcOpcode.COMP_SWAP,
    WrOpcode.ATOMIC_FETCH_AND_ADD: WcOpcode.FETCH_ADD,
}
_ATOMICS = (WrOpcode.ATOMIC_CMP_AND_SWP, WrOpcode.ATOMIC_FETCH_AND_ADD)
_RECV_OPCODES = (WcOpcode.RECV, WcOpcode.RECV_RDMA_WITH_IMM)


def _flag(value):
    return int(getattr(value, "value", value))


class Completion(NamedTuple):
    """One expected work completion (IBA 11.6.2); see the module doc for undefined fields."""
    wr_id: int
    status: WcStatus
    opcode: Optional[WcOpcode]
    byte_len: int
    imm: Optional[int]
    qpn: int

    @property
    def is_recv(self):
        """True for a receive-queue completion."""
        return self.opcode in _RECV_OPCODES

    def essential(self):
        """This completion with the fields IBA leaves undefined on error cleared."""
        if self.status == WcStatus.SUCCESS:
            return self
        return self._replace(opcode=None, byte_len=0, imm=None)

    @classmethod
    def from_wc(cls, wc):
        """From a :class:`sim.verbs.WC` (``imm`` kept only when the CQE flags say so)."""
        return cls(wc.wr_id, wc.status, wc.opcode, wc.byte_len,
                   wc.imm if wc.flags & CQE_FLAG_IMM else None, wc.qp_num)

    @classmethod
    def from_cqe(cls, f):
        """From a dict of :data:`~hw.formats.CQE` fields (``formats.unpack(CQE, raw)``)."""
        def enum_or_int(e, v):
            try:
                return e(v)
            except ValueError:
                return v
        return cls(f["wr_id"], enum_or_int(WcStatus, f["status"]),
                   enum_or_int(WcOpcode, f["opcode"]), f["byte_len"],
                   f["imm"] if f["flags"] & CQE_FLAG_IMM else None, f["qpn"])


def split_completions(completions):
    """(send-queue completions, receive-queue completions) of one QP's list, order kept."""
    return ([c for c in completions if not c.is_recv], [c for c in completions if c.is_recv])


def compare_completions(expected, actual, strict=False):
    """Differences between two completion lists of one QP, as readable strings.

    Send- and receive-queue completions are compared separately (their relative order is
    timing). Unless ``strict``, error completions are compared on wr_id, status and qpn only.
    ``actual`` may hold :class:`Completion` or :class:`sim.verbs.WC` items.
    """
    actual = [a if isinstance(a, Completion) else Completion.from_wc(a) for a in actual]
    problems = []
    for kind, exp, act in zip(("send", "recv"), split_completions(expected),
                              split_completions(actual)):
        if not strict:
            exp = [c.essential() for c in exp]
            act = [c.essential() for c in act]
        for i in range(max(len(exp), len(act))):
            e = exp[i] if i < len(exp) else None
            a = act[i] if i < len(act) else None
            if e != a:
                problems.append(f"{kind} completion {i}: expected {e}, got {a}")
    return problems


class SparseMemory:
    """Byte-addressed memory of 4 KB pages, created on first write; unwritten bytes read 0."""

    def __init__(self):
        self.pages = {}

    def read(self, addr, n):
        out = bytearray()
        while n > 0:
            base, off = addr & ~(PAGE_BYTES - 1), addr & (PAGE_BYTES - 1)
            chunk = min(n, PAGE_BYTES - off)
            page = self.pages.get(base)
            out += page[off:off + chunk] if page is not None else bytes(chunk)
            addr, n = addr + chunk, n - chunk
        return bytes(out)

    def write(self, addr, data):
        data = bytes(data)
        pos = 0
        while pos < len(data):
            base, off = addr & ~(PAGE_BYTES - 1), addr & (PAGE_BYTES - 1)
            chunk = min(len(data) - pos, PAGE_BYTES - off)
            page = self.pages.setdefault(base, bytearray(PAGE_BYTES))
            page[off:off + chunk] = data[pos:pos + chunk]
            addr, pos = addr + chunk, pos + chunk

    def snapshot(self):
        """``{page address: bytes}`` of every page ever written, in address order."""
        return {a: bytes(self.pages[a]) for a in sorted(self.pages)}


@dataclass
class MemoryRegion:
    """A registered region (IBA 10.6.2): ``key`` serves as lkey and rkey."""
    node: int
    base: int
    length: int
    key: int
    access: int
    pd: int
    valid: bool = True

    lkey = property(lambda self: self.key)
    rkey = property(lambda self: self.key)

    def contains(self, addr, n):
        return self.base <= addr and addr + n <= self.base + self.length


@dataclass(eq=False)
class QueuePair:
    """An RC queue pair of the model (state per IBA 10.3.1)."""
    model: "ReferenceModel"
    node: int
    qpn: int
    pd: int
    access: int
    send_cq: int
    recv_cq: int
    state: QpState = QpState.RESET
    remote: Optional[tuple] = None                 # (node, qpn)
    sq: deque = field(default_factory=deque)
    rq: deque = field(default_factory=deque)
    completions: list = field(default_factory=list)

    def modify(self, state):
        self.model.modify_qp(self, state)

    def post_send(self, wrs):
        self.model.post_send(self, wrs)

    def post_recv(self, wrs):
        self.model.post_recv(self, wrs)

    @property
    def send_completions(self):
        return split_completions(self.completions)[0]

    @property
    def recv_completions(self):
        return split_completions(self.completions)[1]

    def __repr__(self):
        return f"QueuePair(node={self.node}, qpn={self.qpn}, state={self.state.name})"


class Node:
    """One host: memory, PDs, MRs, CQs and QPs, numbered like the hardware's tables."""

    def __init__(self, model, node_id):
        self.model = model
        self.node_id = node_id
        self.memory = SparseMemory()
        self.mrs = {}              # key -> MemoryRegion (valid or not: the last one per key)
        self.all_mrs = []          # every region ever registered, for compare_memory
        self.qps = {}
        self.cqs = {}              # cqn -> list of completions in generation order
        self.undefined = []        # (addr, length) whose final contents are not defined
        self._next_pd = 1
        self._next_slot = 0

    def read(self, addr, n):
        return self.memory.read(addr, n)

    def write(self, addr, data):
        self.memory.write(addr, data)

    def snapshot(self):
        return self.memory.snapshot()

    def alloc_pd(self):
        pd = self._next_pd
        self._next_pd += 1
        return pd

    def reg_mr(self, pd, addr, length, access, key=None):
        """Register a region; ``key`` defaults to ``(n << 8) | 1`` for the n-th region."""
        if key is None:
            key = (self._next_slot << 8) | 1
            self._next_slot += 1
        old = self.mrs.get(key)
        if old is not None and old.valid:
            raise ValueError(f"key {key:#x} is already registered on node {self.node_id}")
        mr = MemoryRegion(self.node_id, addr, length, key, _flag(access), int(pd))
        self.mrs[key] = mr
        self.all_mrs.append(mr)
        return mr

    def dereg_mr(self, mr):
        """Invalidate a region (by object or key): its key stops working (IBA 10.6)."""
        key = mr if isinstance(mr, int) else mr.key
        self.mrs[key].valid = False

    def create_cq(self, cqn=None):
        cqn = len(self.cqs) if cqn is None else cqn
        self.cqs.setdefault(cqn, [])
        return cqn

    def create_qp(self, pd, send_cq=0, recv_cq=None, access=ALL_REMOTE, qpn=None):
        qpn = len(self.qps) if qpn is None else qpn
        if qpn in self.qps:
            raise ValueError(f"qpn {qpn} already exists on node {self.node_id}")
        recv_cq = send_cq if recv_cq is None else recv_cq
        self.create_cq(send_cq)
        self.create_cq(recv_cq)
        qp = QueuePair(self.model, self.node_id, qpn, int(pd), _flag(access), send_cq, recv_cq)
        self.qps[qpn] = qp
        self.model._qp_order.append(qp)
        return qp

    # -- checks (IBA 10.6.3) --------------------------------------------------------------

    def _mr_for(self, key, pd):
        mr = self.mrs.get(key)
        if mr is None or not mr.valid or mr.pd != pd:
            return None
        return mr

    def check_local(self, key, pd, addr, n, need_write):
        mr = self._mr_for(key, pd)
        return (mr is not None and mr.contains(addr, n)
                and (not need_write or mr.access & Access.LOCAL_WRITE.value))

    def check_remote(self, key, qp, addr, n, right):
        mr = self._mr_for(key, qp.pd)
        return (mr is not None and mr.contains(addr, n) and bool(mr.access & right)
                and bool(qp.access & right))

    def _mark_undefined(self, key, pd, addr, n, need_write=True):
        """Mark the part of [addr, addr+n) that ``key`` would let the NIC write."""
        mr = self._mr_for(key, pd)
        if mr is None or n <= 0 or (need_write and not mr.access & Access.LOCAL_WRITE.value):
            return
        lo, hi = max(addr, mr.base), min(addr + n, mr.base + mr.length)
        if lo < hi:
            self.undefined.append((lo, hi - lo))

    def compare_memory(self, read, ranges=None):
        """Mismatches between this node's memory and ``read(addr, n)`` of the real one.

        Compares ``ranges`` (``(addr, length)`` pairs; default: every region ever
        registered) except :attr:`undefined` bytes; returns ``(addr, expected, actual)``
        for each run of differing bytes.
        """
        if ranges is None:
            ranges = [(mr.base, mr.length) for mr in self.all_mrs]
        undefined = _merge_intervals((a, a + n) for a, n in self.undefined)
        problems = []
        for base, n in sorted(set(ranges)):
            exp, act = self.read(base, n), bytes(read(base, n))
            if exp == act:
                continue
            # compare the defined parts only; a run of differing bytes ends at an undefined one
            for lo, hi in _subtract_intervals(base, base + n, undefined):
                e, a = exp[lo - base:hi - base], act[lo - base:hi - base]
                if e == a:
                    continue
                i, m = 0, hi - lo
                while i < m:
                    if e[i] != a[i]:
                        j = i
                        while j < m and e[j] != a[j]:
                            j += 1
                        problems.append((lo + i, e[i:j], a[i:j]))
                        i = j
                    else:
                        i += 1
        return problems


def _merge_intervals(intervals):
    """Sorted, disjoint ``[lo, hi)`` intervals covering the given ones."""
    out = []
    for lo, hi in sorted(i for i in intervals if i[0] < i[1]):
        if out and lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return out


def _subtract_intervals(lo, hi, holes):
    """The parts of ``[lo, hi)`` outside the sorted, disjoint ``holes``."""
    out = []
    for a, b in holes:
        if b <= lo:
            continue
        if a >= hi:
            break
        if a > lo:
            out.append((lo, a))
        lo = max(lo, b)
    if lo < hi:
        out.append((lo, hi))
    return out


@dataclass
class RunResult:
    """What :meth:`ReferenceModel.run` produced.

    ``completions``: ``{(node, qpn): [Completion, ...]}`` new since the previous run, per QP
    in generation order (use :func:`split_completions`); ``memory``: ``{node: snapshot}``;
    ``undefined``: ``{node: [(addr, length), ...]}``.
    """
    completions: dict
    memory: dict
    undefined: dict


class ReferenceModel:
    """Nodes, connections and the executor; see the module doc for the semantics."""

    def __init__(self):
        self.nodes = {}
        self._qp_order = []
        self._reported = {}

    def add_node(self, node_id):
        if node_id in self.nodes:
            raise ValueError(f"node {node_id} already exists")
        node = Node(self, node_id)
        self.nodes[node_id] = node
        return node

    def node(self, node_id):
        return self.nodes[node_id]

    def mirror(self, ctx, copy_memory=True):
        """Create or refresh the node of a :class:`sim.verbs.Context` (for scoreboards).

        The node gets the context's valid memory regions (same keys; regions no longer
        valid there are invalidated here), its QPs (same numbers, PD, access, CQs, remote
        QP and state, with empty queues) and, with ``copy_memory``, the current contents
        of every region read from ``ctx.mem`` (which must read synchronously). Work
        requests are then mirrored by posting the same :class:`SendWR` / :class:`RecvWR`.
        """
        node = self.nodes.get(ctx.node_id) or self.add_node(ctx.node_id)
        live = {mr.key: mr for mr in ctx._mr_slots if mr is not None and mr.valid}
        for key, mr in node.mrs.items():
            if key not in live:
                mr.valid = False
        for key, vmr in live.items():
            mine = node.mrs.get(key)
            if mine is None or not mine.valid or (mine.base, mine.length) != (vmr.addr, vmr.length):
                if mine is not None:
                    mine.valid = False
                node.reg_mr(vmr.pd.pdn, vmr.addr, vmr.length, vmr.access, key=key)
            if copy_memory and vmr.length:
                data = ctx.mem.read(vmr.addr, vmr.length)
                if not isinstance(data, (bytes, bytearray, memoryview)):
                    raise TypeError("mirror(copy_memory=True) needs a memory that reads "
                                    "synchronously")
                node.write(vmr.addr, data)
        for qpn, vqp in ctx.qps.items():
            qp = node.qps.get(qpn) or node.create_qp(vqp.pd.pdn, vqp.send_cq.cqn,
                                                     vqp.recv_cq.cqn, vqp.access, qpn=qpn)
            qp.pd, qp.access = vqp.pd.pdn, _flag(vqp.access)
            qp.send_cq, qp.recv_cq = vqp.send_cq.cqn, vqp.recv_cq.cqn
            node.create_cq(qp.send_cq)
            node.create_cq(qp.recv_cq)
            qp.remote = (vqp.dest_node, vqp.dest_qpn)
            qp.state = vqp.state
        return node

    def qp(self, node_id, qpn):
        return self.nodes[node_id].qps[qpn]

    # -- QP state (IBA 10.3.1) ----------------------------------------------------------

    def modify_qp(self, qp, state):
        state = QpState(state)
        if (qp.state.name, state.name) not in LEGAL_TRANSITIONS:
            raise ValueError(f"state: QP {qp.qpn} cannot go from {qp.state.name} to "
                             f"{state.name} (IBA 10.3.1)")
        if state == QpState.ERR:
            self._enter_err(qp)
        else:
            qp.state = state
            if state == QpState.RESET:
                qp.sq.clear()
                qp.rq.clear()

    def connect(self, qp_a, qp_b):
        """Point two QPs at each other and bring both to RTS."""
        qp_a.remote = (qp_b.node, qp_b.qpn)
        qp_b.remote = (qp_a.node, qp_a.qpn)
        for state in (QpState.INIT, QpState.RTR, QpState.RTS):
            self.modify_qp(qp_a, state)
            self.modify_qp(qp_b, state)

    # -- posting (IBA 11.4.1) -------------------------------------------------------------

    def post_send(self, qp, wrs):
        wrs = [wrs] if isinstance(wrs, SendWR) else list(wrs)
        if qp.state not in (QpState.RTS, QpState.ERR):
            raise ValueError(f"QP {qp.qpn} is in {qp.state.name}: the send queue accepts work "
                             f"requests in RTS or ERR (IBA 10.3.1)")
        for wr in wrs:
            if qp.state == QpState.ERR:
                self._send_cqe(qp, wr, _S.WR_FLUSH_ERR)
            else:
                qp.sq.append(wr)

    def post_recv(self, qp, wrs):
        wrs = [wrs] if isinstance(wrs, RecvWR) else list(wrs)
        if qp.state == QpState.RESET:
            raise ValueError(f"QP {qp.qpn} is in RESET: receive work requests can be posted "
                             f"from INIT on (IBA 10.3.1)")
        for wr in wrs:
            if qp.state == QpState.ERR:
                self._recv_cqe(qp, wr, _S.WR_FLUSH_ERR)
            else:
                qp.rq.append(wr)

    # -- execution ----------------------------------------------------------------------

    def run(self):
        """Execute every posted send WR (round-robin over QPs, one WR each) to completion."""
        progress = True
        while progress:
            progress = False
            for qp in self._qp_order:
                if qp.state == QpState.RTS and qp.sq:
                    self._execute(qp, qp.sq.popleft())
                    progress = True
        new = {}
        for qp in self._qp_order:
            key = (qp.node, qp.qpn)
            done = self._reported.get(key, 0)
            if len(qp.completions) > done:
                new[key] = qp.completions[done:]
            self._reported[key] = len(qp.completions)
        return RunResult(completions=new,
                         memory={n: node.snapshot() for n, node in self.nodes.items()},
                         undefined={n: list(node.undefined) for n, node in self.nodes.items()})

    def _add(self, qp, cq, completion):
        qp.completions.append(completion)
        self.nodes[qp.node].cqs[cq].append(completion)

    def _send_cqe(self, qp, wr, status, byte_len=0):
        if status == _S.SUCCESS and not (wr.send_flags & SendFlags.SIGNALED):
            return
        opcode = _WC_OF.get(wr.opcode) if isinstance(wr.opcode, WrOpcode) else None
        self._add(qp, qp.send_cq, Completion(wr.wr_id, status, opcode,
                                             byte_len if status == _S.SUCCESS else 0,
                                             None, qp.qpn))

    def _recv_cqe(self, qp, wr, status, opcode=WcOpcode.RECV, byte_len=0, imm=None):
        if status != _S.SUCCESS:
            opcode, byte_len, imm = WcOpcode.RECV, 0, None
        self._add(qp, qp.recv_cq, Completion(wr.wr_id, status, opcode, byte_len, imm, qp.qpn))

    def _enter_err(self, qp):
        """QP to ERR; flush its send queue, then its receive queue (IBA 10.3.1, 11.6.2)."""
        qp.state = QpState.ERR
        while qp.sq:
            self._send_cqe(qp, qp.sq.popleft(), _S.WR_FLUSH_ERR)
        while qp.rq:
            self._recv_cqe(qp, qp.rq.popleft(), _S.WR_FLUSH_ERR)

    def _fail(self, qp, wr, status):
        self._send_cqe(qp, wr, status)
        self._enter_err(qp)

    def _execute(self, qp, wr):
        node = self.nodes[qp.node]
        op = wr.opcode
        if not isinstance(op, WrOpcode):
            return self._fail(qp, wr, _S.LOC_QP_OP_ERR)
        laddr, length, lkey = wr.sg
        atomic = op in _ATOMICS
        if (atomic and length != 8) or length > MAX_MSG_BYTES:
            return self._fail(qp, wr, _S.LOC_LEN_ERR)
        if length > 0:
            need_write = op == WrOpcode.RDMA_READ or atomic
            if not node.check_local(lkey, qp.pd, laddr, length, need_write):
                return self._fail(qp, wr, _S.LOC_PROT_ERR)
        rqp = self._peer(qp)
        if rqp is None or rqp.state not in (QpState.RTR, QpState.RTS):
            return self._fail(qp, wr, _S.RETRY_EXC_ERR)
        rnode = self.nodes[rqp.node]

        def remote_error(status, recv=None, recv_status=None):
            if recv is not None:
                self._recv_cqe(rqp, recv, recv_status)
            self._enter_err(rqp)
            self._fail(qp, wr, status)

        if op in (WrOpcode.RDMA_WRITE, WrOpcode.RDMA_WRITE_WITH_IMM):
            if length > 0 and not rnode.check_remote(wr.rkey, rqp, wr.remote_addr, length,
                                                     Access.REMOTE_WRITE.value):
                return remote_error(_S.REM_ACCESS_ERR)
            recv = None
            if op == WrOpcode.RDMA_WRITE_WITH_IMM:
                if not rqp.rq:
                    # data may already have landed before the last packet found no WQE
                    rnode._mark_undefined(wr.rkey, rqp.pd, wr.remote_addr, length, False)
                    return self._fail(qp, wr, _S.RNR_RETRY_EXC_ERR)
                recv = rqp.rq.popleft()
            rnode.write(wr.remote_addr, node.read(laddr, length))
            if recv is not None:
                self._recv_cqe(rqp, recv, _S.SUCCESS, WcOpcode.RECV_RDMA_WITH_IMM, length,
                               wr.imm)
            return self._send_cqe(qp, wr, _S.SUCCESS, length)

        if op in (WrOpcode.SEND, WrOpcode.SEND_WITH_IMM):
            if not rqp.rq:
                return self._fail(qp, wr, _S.RNR_RETRY_EXC_ERR)
            recv = rqp.rq.popleft()
            # the receive WQE's whole data segment is validated before any byte is placed
            if recv.length > 0 and not rnode.check_local(recv.lkey, rqp.pd, recv.addr,
                                                         recv.length, True):
                return remote_error(_S.REM_OP_ERR, recv, _S.LOC_PROT_ERR)
            if length > recv.length:
                # packets that fitted may already have been placed
                rnode._mark_undefined(recv.lkey, rqp.pd, recv.addr, recv.length)
                return remote_error(_S.REM_INV_REQ_ERR, recv, _S.LOC_LEN_ERR)
            rnode.write(recv.addr, node.read(laddr, length))
            self._recv_cqe(rqp, recv, _S.SUCCESS, WcOpcode.RECV, length,
                           wr.imm if op == WrOpcode.SEND_WITH_IMM else None)
            return self._send_cqe(qp, wr, _S.SUCCESS, length)

        if op == WrOpcode.RDMA_READ:
            if length > 0:
                if not rnode.check_remote(wr.rkey, rqp, wr.remote_addr, length,
                                          Access.REMOTE_READ.value):
                    return remote_error(_S.REM_ACCESS_ERR)
                node.write(laddr, rnode.read(wr.remote_addr, length))
            return self._send_cqe(qp, wr, _S.SUCCESS, length)

        # atomics (IBA 9.4.5): 8 bytes, naturally aligned, executed once
        if not rnode.check_remote(wr.rkey, rqp, wr.remote_addr, 8, Access.REMOTE_ATOMIC.value):
            return remote_error(_S.REM_ACCESS_ERR)
        if wr.remote_addr % 8:
            return remote_error(_S.REM_INV_REQ_ERR)
        old = int.from_bytes(rnode.read(wr.remote_addr, 8), "little")
        if op == WrOpcode.ATOMIC_CMP_AND_SWP:
            new = wr.swap if old == wr.compare_add else old
        else:
            new = (old + wr.compare_add) & ((1 << 64) - 1)
        rnode.write(wr.remote_addr, new.to_bytes(8, "little"))
        node.write(laddr, old.to_bytes(8, "little"))
        return self._send_cqe(qp, wr, _S.SUCCESS, 8)

    def _peer(self, qp):
        if qp.remote is None:
            return None
        node, qpn = qp.remote
        return self.nodes.get(node) and self.nodes[node].qps.get(qpn)
