"""Scoreboard: the RTL's completions and memory against the pure-Python reference model.

Every work request posted through :meth:`Scoreboard.post_send` / :meth:`post_recv` goes to
the RTL (through the verbs API) and to :class:`sim.reference.ReferenceModel`. :meth:`check`
waits until each CQ has delivered as many completions as the reference model predicts,
then compares, per QP, the completions (in order) and the memory of every registered region
on both nodes, and checks that every DMA write the NIC made landed inside a registered
region or a completion-queue ring: nothing outside them changed.
"""

import itertools

from hw.regmap import CQ_ICM_ENTRY_BYTES, MR_ICM_ENTRY_BYTES, QP_ICM_ENTRY_BYTES

from .reference import ReferenceModel, compare_completions

__all__ = ["Scoreboard", "ScoreboardError"]


class ScoreboardError(AssertionError):
    pass


class Scoreboard:
    def __init__(self, system):
        self.system = system
        self.hosts = (system.a, system.b)
        self.ref = ReferenceModel()
        self.actual = {}          # (node, qpn) -> [WC]
        self.expected = {}        # (node, qpn) -> [Completion]
        self.posted = 0
        for h in self.hosts:
            h.dma.write_log = []
        self._wlog_checked = {}   # host -> entries of its write log already checked

    def mirror(self):
        """Copy both hosts' verbs state (MRs, QPs, region contents) into the reference."""
        for h in self.hosts:
            self.ref.mirror(h.ctx)

    def _ref_qp(self, qp):
        return self.ref.qp(qp.ctx.node_id, qp.qpn)

    async def post_send(self, qp, wrs, **kw):
        await qp.post_send(wrs, **kw)
        self.ref.post_send(self._ref_qp(qp), wrs)
        self.posted += len(wrs) if isinstance(wrs, list) else 1

    async def post_recv(self, qp, wrs):
        await qp.post_recv(wrs)
        self.ref.post_recv(self._ref_qp(qp), wrs)

    def predict(self):
        """Run the reference model on everything posted so far."""
        result = self.ref.run()
        for key, comps in result.completions.items():
            self.expected.setdefault(key, []).extend(comps)
        return result

    def _expected_per_cq(self):
        counts = {}
        for h in self.hosts:
            node = h.ctx.node_id
            for qpn, qp in h.ctx.qps.items():
                exp = self.expected.get((node, qpn), [])
                for c in exp:
                    cq = qp.recv_cq if c.is_recv else qp.send_cq
                    counts[(h, cq)] = counts.get((h, cq), 0) + 1
        return counts

    async def drain(self, timeout_ns=2_000_000):
        """Collect completions until every CQ has what the reference model predicts."""
        self.predict()
        want = self._expected_per_cq()
        for (h, cq), n in want.items():
            got = sum(1 for (node, _), wcs in self.actual.items() if node == h.ctx.node_id
                      for w in wcs if self._cq_of(h, w) is cq)
            if n > got:
                wcs = await h.wait_completions(cq, n - got, timeout_ns)
                for w in wcs:
                    self.actual.setdefault((h.ctx.node_id, w.qp_num), []).append(w)

    def _cq_of(self, h, wc):
        qp = h.ctx.qps[wc.qp_num]
        return qp.recv_cq if getattr(wc.opcode, "value", wc.opcode) >= 128 else qp.send_cq

    async def check(self, timeout_ns=2_000_000):
        """Drain, then compare completions, memory and DMA write targets; raise on mismatch."""
        await self.drain(timeout_ns)
        problems = []
        # No surplus completions on any CQ.
        for h in self.hosts:
            for cq in {id(qp.send_cq): qp.send_cq for qp in h.ctx.qps.values()}.values():
                extra = await cq.poll_cq(64)
                if extra:
                    problems.append(f"node {h.ctx.node_id} CQ {cq.cqn}: unexpected {extra}")
        keys = set(self.expected) | set(self.actual)
        for key in sorted(keys):
            for p in compare_completions(self.expected.get(key, []), self.actual.get(key, [])):
                problems.append(f"node {key[0]} qp {key[1]}: {p}")
        for h in self.hosts:
            node = self.ref.node(h.ctx.node_id)
            for addr, exp, act in node.compare_memory(h.mem.read)[:10]:
                problems.append(f"node {h.ctx.node_id} memory at {addr:#x}: expected "
                                f"{exp[:16].hex()} got {act[:16].hex()} ({len(exp)} bytes)")
            problems += self._check_write_targets(h, self._wlog_checked.get(h, 0))
            self._wlog_checked[h] = len(h.dma.write_log)
        if problems:
            raise ScoreboardError("\n".join(problems[:40]))
        return sum(len(v) for v in self.actual.values())

    async def check_host_memory(self):
        """For an RTL host: its real memory (read back through the host CPU port) equals the
        copy the checks used (kept by the CPU writes and the write tap), over every
        registered region and CQ ring."""
        problems = []
        for h in self.hosts:
            readback = getattr(h.mem, "readback", None)
            if readback is None:
                continue
            ranges = [(mr.addr, mr.length) for mr in h.ctx._mr_slots if mr is not None]
            ranges += [(cq.base, cq.depth * 32) for cq in h.ctx.cqs.values()]
            for a, n in ranges:
                real, copy = await readback(a, n), h.mem.read(a, n)
                if real != copy:
                    k = next(i for i in range(n) if real[i] != copy[i])
                    problems.append(f"node {h.ctx.node_id}: RTL host memory at {a + k:#x} "
                                    f"differs from what its write tap showed")
        if problems:
            raise ScoreboardError("\n".join(problems[:10]))

    @staticmethod
    def _check_write_targets(h, start=0):
        """Every DMA write (of the log from entry ``start`` on: the ones not checked yet)
        lies inside a region registered at the time of the check, a CQ ring, or the NIC's
        own context memory (ICM: the MR, CQ- and QP-context caches write entries back there)."""
        allowed = [(mr.addr, mr.length) for mr in h.ctx._mr_slots if mr is not None]
        allowed += [(cq.base, cq.depth * 32) for cq in h.ctx.cqs.values()]
        if h.ctx.icm_mr_base is not None:
            allowed.append((h.ctx.icm_mr_base, h.ctx.cfg.n_mrs * MR_ICM_ENTRY_BYTES))
        if h.ctx.icm_cq_base is not None:
            allowed.append((h.ctx.icm_cq_base, h.ctx.cfg.n_cqs * CQ_ICM_ENTRY_BYTES))
        if h.ctx.icm_qp_base is not None:
            allowed.append((h.ctx.icm_qp_base, h.ctx.cfg.n_qps * QP_ICM_ENTRY_BYTES))
        bad = []
        for addr, n in itertools.islice(h.dma.write_log, start, None):
            if not any(lo <= addr and addr + n <= lo + size for lo, size in allowed):
                bad.append(f"node {h.ctx.node_id}: DMA write of {n} bytes at {addr:#x} outside "
                           f"every registered region and CQ ring")
        return bad[:5]
