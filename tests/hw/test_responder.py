"""Responder: every request opcode and every responder error against a Python model.

The bench is one Amaranth testbench that, every cycle, answers the combinational QP/MR
lookups from Python tables, drives the request packets, a host memory model (DMA reads with
latency, DMA writes) and the sinks (tx, cqe, set_err) with optional random back-pressure,
and records what the responder emits. ``Model`` is an independent Python description of the
IBA responder behaviour (IBA vol. 1 rel. 1.4, 9.7); both must agree on the tx packets, CQEs,
QP-error requests, NAK/drop pulses and on every byte of host memory.
"""

from dataclasses import replace
import copy
import random

import pytest
from amaranth.sim import Simulator

from hw.config import NicConfig
from hw.formats import (BthOpcode as Op, AethSyndrome as Syn, Access, QpState, WcOpcode, WcStatus,
                        PKT_META, RECV_WQE, MR_ENTRY, CQE, CQE_FLAG_IMM, pack, unpack)
from hw.interfaces import QP_LOOKUP
from hw.regmap import QP_CTX, mkey_index
from hw.rnic.responder import Responder, RNR_TIMER

CFG = NicConfig(data_bytes=8, mtu=256, n_qps=4, n_mrs=4, n_cqs=4)
NODE = 7
MEM_SIZE = 0x4000
M24 = (1 << 24) - 1
M64 = (1 << 64) - 1
ALL = 0xF
RNR = Syn.RNR_NAK.value | RNR_TIMER
ACK = Syn.ACK.value


def lint(layout, fields):
    return int.from_bytes(pack(layout, **fields), "little")


def ldict(layout, value):
    return unpack(layout, int(value).to_bytes((layout.size + 7) // 8, "little"))


def qp_int(entry):
    return entry["state"].value << QP_LOOKUP["state"].offset


# ---------------------------------------------------------------------------------------
# default tables

def default_qps():
    qps = []
    for q in range(4):
        ctx = dict(sq_base=0, rq_base=0x3000 + 0x100 * q, sq_log_size=3, rq_log_size=3,
                   send_cq=0, recv_cq=q + 1, pd=1, dest_qpn=0x100 + q, dest_node=10 + q,
                   access=Access.REMOTE_WRITE.value | Access.REMOTE_READ.value | Access.REMOTE_ATOMIC.value,
                   max_rd_atomic=4, min_rnr_timer=RNR_TIMER)
        qps.append({"ctx": ctx, "state": QpState.RESET})
    # QP 2 grants remote READ only
    qps[2]["ctx"]["access"] = Access.REMOTE_READ.value
    return qps


K0, K1, K2, K3 = 0x00000011, 0xAB000122, 0x00000233, 0x00000344


def default_mrs():
    return [
        dict(base=0x0000, length=0x1000, key=K0, pd=1, access=ALL, valid=1),
        dict(base=0x1000, length=0x0800, key=K1, pd=1, access=Access.REMOTE_READ.value, valid=1),
        dict(base=0x1800, length=0x0800, key=K2, pd=2, access=ALL, valid=1),
        dict(base=0x2000, length=0x1000, key=K3, pd=1, access=ALL, valid=0),
    ]


def init_mem(seed=99):
    return bytearray(random.Random(seed).randbytes(MEM_SIZE))


# ---------------------------------------------------------------------------------------
# items: what the test feeds to the responder, in order

def meta(op, q, psn, paylen=0, ackreq=0, va=0, rkey=0, dma_len=0, compare=0, swap_add=0, imm=0):
    d = {name: 0 for name, _ in PKT_META}
    d.update(opcode=op.value if hasattr(op, "value") else op, src_node=(10 + q) & 0xFF, dst_node=NODE,
             dest_qpn=q, psn=psn & M24, ackreq=ackreq, va=va, rkey=rkey, dma_len=dma_len,
             compare=compare, swap_add=swap_add, imm=imm, paylen=paylen, udp_sport=0xC123)
    return d


def pkt(op, q, psn, payload=b"", **kw):
    return ("pkt", meta(op, q, psn, paylen=len(payload), **kw), bytes(payload))


def event(q, state, rq_psn, sq_psn=0, race=False):
    """A modify-QP event; ``race``: issue it while the previous packet is still in flight.
    An event to RTS here means "(re)connect at rq_psn": :func:`expand_events` turns it into
    RTR (which resets the receive side, IBA 10.3.1) then RTS (which keeps it)."""
    return ("event", q, state, sq_psn, rq_psn) + (("race",) if race else ())


def expand_events(items):
    out = []
    for it in items:
        if it[0] == "event" and it[2] == QpState.RTS:
            out.append(("event", it[1], QpState.RTR) + it[3:])
            out.append(("event", it[1], QpState.RTS, it[3], it[4]))
        else:
            out.append(it)
    return out


def post(q, slot, wr_id, addr, length, lkey, new_pi, rq_base=None):
    """Host writes a receive WQE in ring slot ``slot`` and rings the RQ doorbell with new_pi."""
    base = (0x3000 + 0x100 * q) if rq_base is None else rq_base
    raw = pack(RECV_WQE, wr_id=wr_id, addr=addr, length=length, lkey=lkey)
    return ("db", q, new_pi, [(base + 32 * slot, raw)])


def msg(kind, q, psn, data, mtu=256, imm=None, ackreq=1, va=0, rkey=0):
    """Split a SEND / WRITE message into packets (FIRST/MIDDLE/LAST or ONLY)."""
    chunks = [data[i:i + mtu] for i in range(0, len(data), mtu)] or [b""]
    n = len(chunks)
    out = []
    for i, c in enumerate(chunks):
        first, last = i == 0, i == n - 1
        suffix = ("ONLY" if first else "LAST") if last else ("FIRST" if first else "MIDDLE")
        name = f"{kind}_{suffix}" + ("_IMM" if last and imm is not None else "")
        kw = dict(ackreq=ackreq if last else 0, imm=imm or 0)
        if kind == "WRITE" and first:
            kw.update(va=va, rkey=rkey, dma_len=len(data))
        out.append(pkt(Op[name], q, psn + i, c, **kw))
    return out


# ---------------------------------------------------------------------------------------
# the reference model

class Model:
    def __init__(self, cfg, qps, mrs, mem):
        self.cfg, self.qps, self.mrs, self.mem = cfg, copy.deepcopy(qps), mrs, mem
        n = cfg.n_qps
        self.st = [self._fresh(0) for _ in range(n)]
        self.pi = [0] * n
        self.tx, self.cqes, self.errs = [], [], []
        self.naks = self.drops = self.dups = self.seq_drops = self.replays = 0
        self.last_fatal = None

    @staticmethod
    def _fresh(rq_psn):
        return dict(epsn=rq_psn, msn=0, ci=0, inprog=None, va=0, rem=0, count=0, wr_id=0,
                    nak_sent=False, replay=[])

    # -- helpers
    def resp(self, q, **f):
        ctx = self.qps[q]["ctx"]
        d = {name: 0 for name, _ in PKT_META}
        d.update(src_node=NODE, dst_node=ctx["dest_node"], dest_qpn=ctx["dest_qpn"],
                 udp_sport=0xC000 | (q & 0x3FFF))
        d.update(f)
        return d

    def nak(self, q, m, syn, fatal, psn=None):
        st = self.st[q]
        self.tx.append((self.resp(q, opcode=Op.ACKNOWLEDGE.value, psn=m["psn"] if psn is None else psn,
                                  syndrome=syn, msn=st["msn"]), b""))
        self.naks += 1
        if fatal:
            self.errs.append(q)
            self.last_fatal = q
            self.qps[q]["state"] = QpState.ERR

    def cqe(self, q, status, opcode, byte_len, wr_id, imm=None):
        ctx = self.qps[q]["ctx"]
        d = {name: 0 for name, _ in CQE}
        d.update(wr_id=wr_id, status=status.value, opcode=opcode.value, byte_len=byte_len,
                 imm=imm or 0, qpn=q, src_qpn=ctx["dest_qpn"], flags=CQE_FLAG_IMM if imm is not None else 0)
        d["cqn"] = ctx["recv_cq"]
        self.cqes.append(d)

    def mr_ok(self, q, key, right, va, length, remote=True):
        ctx = self.qps[q]["ctx"]
        e = self.mrs[mkey_index(key, self.cfg.n_mrs)]
        ok = (e["valid"] and e["key"] == key and e["pd"] == ctx["pd"] and e["access"] & right
              and va >= e["base"] and va + length <= e["base"] + e["length"])
        if remote:
            ok = ok and bool(ctx["access"] & right)
        return bool(ok)

    def fetch_wqe(self, q):
        ctx, st = self.qps[q]["ctx"], self.st[q]
        a = ctx["rq_base"] + (st["ci"] % (1 << ctx["rq_log_size"])) * 32
        st["ci"] = (st["ci"] + 1) & 0xFFFF
        return unpack(RECV_WQE, self.mem[a:a + 32])

    def rnr(self, q, m):
        self.st[q]["nak_sent"] = True
        return self.nak(q, m, RNR, False)

    def read_responses(self, q, m, msn):
        mtu = self.cfg.mtu
        n_bytes = m["dma_len"]
        n = max(1, -(-n_bytes // mtu))
        for i in range(n):
            chunk = min(mtu, n_bytes - i * mtu)
            a = m["va"] + i * mtu
            if n == 1:
                o = Op.READ_RESPONSE_ONLY
            elif i == 0:
                o = Op.READ_RESPONSE_FIRST
            elif i == n - 1:
                o = Op.READ_RESPONSE_LAST
            else:
                o = Op.READ_RESPONSE_MIDDLE
            aeth = o != Op.READ_RESPONSE_MIDDLE
            self.tx.append((self.resp(q, opcode=o.value, psn=(m["psn"] + i) & M24, paylen=chunk,
                                      syndrome=ACK if aeth else 0, msn=msn if aeth else 0),
                            bytes(self.mem[a:a + chunk])))
        return n

    def duplicate(self, q, m, op):
        """IBA 9.7.5.1.2: a duplicate has no second effect."""
        st = self.st[q]
        name = op.name if op else ""
        pl = m["paylen"]
        if name.startswith(("SEND_", "WRITE_")):
            if m["ackreq"]:
                self.tx.append((self.resp(q, opcode=Op.ACKNOWLEDGE.value, psn=(st["epsn"] - 1) & M24,
                                          syndrome=ACK, msn=st["msn"]), b""))
        elif op == Op.READ_REQUEST:
            if pl == 0 and not (m["dma_len"] and not self.mr_ok(q, m["rkey"], Access.REMOTE_READ.value,
                                                                 m["va"], m["dma_len"])):
                self.read_responses(q, m, st["msn"])
        elif op in (Op.FETCH_ADD, Op.COMPARE_SWAP) and pl == 0:
            for psn, orig in st["replay"]:
                if psn == m["psn"]:
                    self.replays += 1
                    self.tx.append((self.resp(q, opcode=Op.ATOMIC_ACKNOWLEDGE.value, psn=m["psn"],
                                              syndrome=ACK, msn=st["msn"], orig=orig), b""))
                    break

    def commit(self, q, m, last):
        st = self.st[q]
        st["nak_sent"] = False
        st["epsn"] = (st["epsn"] + 1) & M24
        st["msn"] = (st["msn"] + last) & M24
        if m["ackreq"]:
            self.tx.append((self.resp(q, opcode=Op.ACKNOWLEDGE.value, psn=m["psn"], syndrome=ACK,
                                      msn=st["msn"]), b""))

    # -- items
    def item(self, it):
        kind = it[0]
        if kind == "event":
            q, state, rq_psn = it[1], it[2], it[4]
            if len(it) > 5 and self.last_fatal == q:
                # the event overtook the packet that failed: the QP-error request of the
                # old incarnation is cancelled (the new one is not in error)
                self.errs.pop()
            self.qps[q]["state"] = state
            if state == QpState.RESET:
                self.pi[q] = 0          # the receive producer index restarts
            if state not in (QpState.RTS, QpState.ERR):
                self.st[q] = self._fresh(rq_psn)
        elif kind == "db":
            _, q, pi_, writes = it[:4]
            for a, raw in writes:
                self.mem[a:a + len(raw)] = raw
            self.pi[q] = pi_
        else:
            self.last_fatal = None
            self.packet(it[1], it[2])

    def packet(self, m, payload):
        cfg = self.cfg
        mtu = cfg.mtu
        q = m["dest_qpn"]
        if q >= cfg.n_qps or self.qps[q]["state"] not in (QpState.RTR, QpState.RTS):
            self.drops += 1
            return
        st = self.st[q]
        try:
            op = Op(m["opcode"])
        except ValueError:
            op = None
        behind = (st["epsn"] - m["psn"]) & M24
        if 0 < behind <= 1 << 23:
            self.dups += 1
            return self.duplicate(q, m, op)
        if m["psn"] != st["epsn"]:
            if st["nak_sent"]:
                self.seq_drops += 1
                return
            st["nak_sent"] = True
            return self.nak(q, m, Syn.NAK_PSN_SEQ_ERR.value, False, psn=st["epsn"])
        name = op.name if op else ""
        pl = m["paylen"]
        is_send = name.startswith("SEND_")
        is_write = name.startswith("WRITE_")
        starts = name in ("SEND_FIRST", "SEND_ONLY", "SEND_ONLY_IMM", "WRITE_FIRST", "WRITE_ONLY",
                          "WRITE_ONLY_IMM", "READ_REQUEST", "COMPARE_SWAP", "FETCH_ADD")
        cont = (is_send or is_write) and not starts
        last = "LAST" in name or "ONLY" in name
        full = name in ("SEND_FIRST", "SEND_MIDDLE", "WRITE_FIRST", "WRITE_MIDDLE")
        imm = m["imm"] if name.endswith("_IMM") else None
        noload = name in ("READ_REQUEST", "COMPARE_SWAP", "FETCH_ADD")
        known = starts or cont
        if st["inprog"] == "SEND":
            seq_ok = is_send and cont
        elif st["inprog"] == "WRITE":
            seq_ok = is_write and cont
        else:
            seq_ok = not cont
        len_ok = pl <= mtu and (not full or pl == mtu) and (not noload or pl == 0)
        if not (known and seq_ok and len_ok):
            return self.nak(q, m, Syn.NAK_INV_REQ.value, True)

        if is_write:
            wimm = name.endswith("_IMM")
            va = m["va"] if starts else st["va"]
            rem = m["dma_len"] if starts else st["rem"]
            if starts and m["dma_len"] and not self.mr_ok(q, m["rkey"], Access.REMOTE_WRITE.value,
                                                          m["va"], m["dma_len"]):
                return self.nak(q, m, Syn.NAK_REM_ACCESS_ERR.value, True)
            if pl > rem or (last and pl != rem):
                return self.nak(q, m, Syn.NAK_INV_REQ.value, True)
            if wimm and st["ci"] == self.pi[q]:
                return self.rnr(q, m)
            self.mem[va:va + pl] = payload
            if starts:
                st["count"] = m["dma_len"]
            st["va"], st["rem"] = va + pl, rem - pl
            st["inprog"] = None if last else "WRITE"
            if wimm:
                w = self.fetch_wqe(q)
                self.cqe(q, WcStatus.SUCCESS, WcOpcode.RECV_RDMA_WITH_IMM, st["count"], w["wr_id"], imm)
            return self.commit(q, m, last)

        if is_send:
            if starts:
                if st["ci"] == self.pi[q]:
                    return self.rnr(q, m)
                w = self.fetch_wqe(q)
                if w["length"] and not self.mr_ok(q, w["lkey"], Access.LOCAL_WRITE.value, w["addr"],
                                                  w["length"], remote=False):
                    self.cqe(q, WcStatus.LOC_PROT_ERR, WcOpcode.RECV, 0, w["wr_id"])
                    return self.nak(q, m, Syn.NAK_REM_OP_ERR.value, True)
                st.update(va=w["addr"], rem=w["length"], count=0, wr_id=w["wr_id"])
            if pl > st["rem"]:
                self.cqe(q, WcStatus.LOC_LEN_ERR, WcOpcode.RECV, 0, st["wr_id"])
                return self.nak(q, m, Syn.NAK_INV_REQ.value, True)
            self.mem[st["va"]:st["va"] + pl] = payload
            st["va"] += pl
            st["rem"] -= pl
            st["count"] += pl
            st["inprog"] = None if last else "SEND"
            if last:
                self.cqe(q, WcStatus.SUCCESS, WcOpcode.RECV, st["count"], st["wr_id"], imm)
            return self.commit(q, m, last)

        if op == Op.READ_REQUEST:
            n_bytes = m["dma_len"]
            if n_bytes and not self.mr_ok(q, m["rkey"], Access.REMOTE_READ.value, m["va"], n_bytes):
                return self.nak(q, m, Syn.NAK_REM_ACCESS_ERR.value, True)
            st["msn"] = (st["msn"] + 1) & M24
            st["nak_sent"] = False
            n = self.read_responses(q, m, st["msn"])
            st["epsn"] = (m["psn"] + n) & M24
            return

        # atomics
        va = m["va"]
        if va & 7:
            return self.nak(q, m, Syn.NAK_INV_REQ.value, True)
        if not self.mr_ok(q, m["rkey"], Access.REMOTE_ATOMIC.value, va, 8):
            return self.nak(q, m, Syn.NAK_REM_ACCESS_ERR.value, True)
        orig = int.from_bytes(self.mem[va:va + 8], "little")
        if op == Op.FETCH_ADD:
            self.mem[va:va + 8] = ((orig + m["swap_add"]) & M64).to_bytes(8, "little")
        elif orig == m["compare"]:
            self.mem[va:va + 8] = m["swap_add"].to_bytes(8, "little")
        st["epsn"] = (st["epsn"] + 1) & M24
        st["msn"] = (st["msn"] + 1) & M24
        st["nak_sent"] = False
        st["replay"] = (st["replay"] + [(m["psn"], orig)])[-16:]
        self.tx.append((self.resp(q, opcode=Op.ATOMIC_ACKNOWLEDGE.value, psn=m["psn"], syndrome=ACK,
                                  msn=st["msn"], orig=orig), b""))


# ---------------------------------------------------------------------------------------
# the simulation bench

def simulate(cfg, items, qps, mrs, mem, bp=False, seed=0, max_cycles=100_000, rd_latency=2, tx_p=0.6,
             tx_hold=0, read_buffers=4, fail=None, quiet_end=40, mr_fail=()):
    """``tx_hold``: tx (meta and payload) is not ready before that cycle. ``fail(addr, len,
    is_write)``: the host fails that DMA (a read's data is zero with err, a write changes
    nothing and its done has err). The run ends ``quiet_end`` cycles after the last visible
    activity. ``mr_fail``: MR slots whose lookup answers ``err`` (the MR cache's fill failed)."""
    rng = random.Random(seed)
    dut = Responder(cfg, read_buffers=read_buffers)
    W = cfg.data_bytes
    qps = copy.deepcopy(qps)
    mr_ints = [lint(MR_ENTRY, e) for e in mrs]
    out = dict(tx=[], cqes=[], errs=[], naks=0, drops=0, dups=0, seq_drops=0, replays=0, coalesced=0, mem=mem, cycles=0, rx_done=None,
               rd_stall=0, resp_full=0, busy=0, read_bytes_in_hold=0, first_tx=None,
               writes=[])

    def p(x):
        return rng.random() < x if bp else True

    async def tb(ctx):
        todo = list(items)
        rx_beats = []          # (data, nbytes, last)
        presented = False      # head packet's beats already queued
        rd_ports = (dut.rd_data, dut.rd_wqe, dut.at_rd)
        wr_ports = (dut.wr, dut.at_wr)
        rd = {k: [] for k in range(3)}      # per read port: [ready_cycle, data, nbytes, last, tag, err]
        wr = {k: None for k in range(2)}    # per write port: the write being received
        dones = {k: [] for k in range(2)}   # per write port: [ready_cycle, tag, err]
        tx_open = None         # [meta, expected paylen, bytes]
        # the lookup ports (request / response, one request in flight each): the request
        # lookahead's QP-context and rkey ports, the state machine's MR port (receive WQEs)
        lk_ports = ([("qpc", pt) for pt in dut.qpc] + [("mr", pt) for pt in dut.rkey]
                    + [("mr", dut.mr)])
        lk_q = [None] * len(lk_ports)   # per port, the lookup in flight: [ready_cycle, index]
        cyc = quiet = 0
        ctx.set(dut.node_id, NODE)
        while True:
            # combinational lookups (the indices depend on registers only)
            ctx.set(dut.qp.data.as_value(), qp_int(qps[ctx.get(dut.qp.index)]))
            # the QP-context and MR cache stand-ins: request / response, random latency and
            # back-pressure
            lk_v = []
            for (kind, pt), q in zip(lk_ports, lk_q):
                ctx.set(pt.req.ready, q is None and p(0.7))
                v = q is not None and q[0] <= cyc
                lk_v.append(v)
                ctx.set(pt.resp.valid, v)
                if v and kind == "qpc":
                    ctx.set(pt.resp.payload.data.as_value(), lint(QP_CTX, qps[q[1]]["ctx"]))
                elif v:
                    ctx.set(pt.resp.payload.data.as_value(), mr_ints[q[1]])
                    ctx.set(pt.resp.payload.err, int(q[1] in mr_fail))
            # sources
            head = todo[0] if todo else None
            meta_v = ev_v = db_v = False
            if head is not None and head[0] == "pkt":
                if not presented:
                    data = head[2]
                    for off in range(0, len(data), W):
                        c = data[off:off + W]
                        rx_beats.append((int.from_bytes(c, "little"), len(c), off + W >= len(data)))
                    presented = True
                meta_v = p(0.7)
                ctx.set(dut.rx.meta.payload.as_value(), lint(PKT_META, head[1]))
            elif head is not None and head[0] == "event":
                # a modify-QP is issued once the packets before it are fully processed (the
                # model is sequential; an event overtaking an in-flight packet is a race)
                # (a race: as soon as the state machine has taken the packet, so that the
                # event meets it executing rather than waiting in the request lookahead,
                # where the packet would be dropped)
                ev_v = (quiet >= 12 or (len(head) > 5 and ctx.get(dut.stat_busy))) and p(0.7)
                ctx.set(dut.qp_event.payload, {"qpn": head[1], "state": head[2], "sq_psn": head[3],
                                               "rq_psn": head[4]})
            elif head is not None and head[0] == "db":
                # ("db", ..., "settle"): posted once the packets before it are done (a
                # driver that reuses a ring slot waits for the completion of its last WQE)
                db_v = (len(head) < 5 or quiet >= 12) and p(0.7)
                ctx.set(dut.rq_db.payload, {"qpn": head[1], "pi": head[2]})
            ctx.set(dut.rx.meta.valid, meta_v)
            ctx.set(dut.qp_event.valid, ev_v)
            ctx.set(dut.rq_db.valid, db_v)
            beat_v = bool(rx_beats) and p(0.7)
            ctx.set(dut.rx.payload.valid, beat_v)
            if rx_beats:
                ctx.set(dut.rx.payload.payload, dict(zip(("data", "nbytes", "last"), rx_beats[0])))
            rd_v = {}
            for k, port in enumerate(rd_ports):
                rd_v[k] = bool(rd[k]) and rd[k][0][0] <= cyc and p(0.7)
                ctx.set(port.rd.valid, rd_v[k])
                if rd[k]:
                    ctx.set(port.rd.payload, dict(zip(("data", "nbytes", "last", "tag", "err"),
                                                      rd[k][0][1:])))
            for k, port in enumerate(wr_ports):
                dv = bool(dones[k]) and dones[k][0][0] <= cyc
                ctx.set(port.done.valid, dv)
                if dv:
                    ctx.set(port.done.payload, {"tag": dones[k][0][1], "err": dones[k][0][2]})
                    dones[k].pop(0)
            # sinks
            for s in [pt.req for pt in rd_ports] + [pt.wr for pt in wr_ports] + [dut.cqe, dut.set_err]:
                ctx.set(s.ready, p(0.6))
            for s in (dut.tx.meta, dut.tx.payload):
                ctx.set(s.ready, p(tx_p) and cyc >= tx_hold)

            # sample transfers
            for k, (kind, pt) in enumerate(lk_ports):
                if lk_v[k] and ctx.get(pt.resp.ready):
                    lk_q[k] = None
                elif lk_q[k] is None and ctx.get(pt.req.valid) and ctx.get(pt.req.ready):
                    # 3: a cache hit
                    lk_q[k] = [cyc + (rng.randint(1, 6) if bp else 3), ctx.get(pt.req.payload.index)]
            busy = any(q is not None for q in lk_q) or (
                any(rd.values()) or bool(rx_beats) or any(w is not None for w in wr.values())
                or any(dones.values()) or tx_open is not None)
            if out["rx_done"] is None and not todo and not rx_beats:
                out["rx_done"] = cyc
            # read data that waits (the atomic unit's read may wait for its own write,
            # which the host back-pressures: a read-modify-write, never a wait on tx)
            at_w = dut.at_wr.wr
            for k, port in enumerate(rd_ports):
                if ctx.get(port.rd.valid) and not ctx.get(port.rd.ready) and not (
                        k == 2 and ctx.get(at_w.valid) and not ctx.get(at_w.ready)):
                    out["rd_stall"] += 1
            out["resp_full"] += ctx.get(dut.stat_resp_full)
            if meta_v and ctx.get(dut.rx.meta.ready):
                todo.pop(0)
                presented = False
                busy = True
            if ev_v:
                assert ctx.get(dut.qp_event.ready), "qp_event must always be ready"
                qps[head[1]]["state"] = head[2]
                todo.pop(0)
                busy = True
            if db_v:
                assert ctx.get(dut.rq_db.ready)
                for a, raw in head[3]:
                    mem[a:a + len(raw)] = raw
                todo.pop(0)
            if beat_v and ctx.get(dut.rx.payload.ready):
                rx_beats.pop(0)
            for k, port in enumerate(rd_ports):
                if ctx.get(port.req.valid) and ctx.get(port.req.ready):
                    r = ctx.get(port.req.payload)
                    assert 0 < r.len <= 65535
                    if cyc < tx_hold and k == 0:
                        out["read_bytes_in_hold"] += r.len
                    bad = bool(fail and fail(r.addr, r.len, False))
                    raw = bytes(r.len) if bad else bytes(mem[r.addr:r.addr + r.len])
                    t = cyc + (rng.randint(1, 8) if bp else rd_latency)
                    for off in range(0, r.len, W):
                        c = raw[off:off + W]
                        rd[k].append([t, int.from_bytes(c, "little"), len(c), off + W >= r.len,
                                      r.tag, int(bad)])
                if rd_v[k] and ctx.get(port.rd.ready):
                    rd[k].pop(0)
            for k, port in enumerate(wr_ports):
                if ctx.get(port.wr.valid) and ctx.get(port.wr.ready):
                    b = ctx.get(port.wr.payload)
                    if wr[k] is None:
                        assert 0 < b.len <= 65535
                        wr[k] = [b.addr, b.len, b"", b.tag]
                    assert b.last or b.nbytes == W
                    wr[k][2] += int(b.data).to_bytes(W, "little")[:b.nbytes]
                    if b.last:
                        a, n, data, tag = wr[k]
                        assert len(data) == n, "DMA write length differs from its beats"
                        bad = bool(fail and fail(a, n, True))
                        if not bad:
                            mem[a:a + n] = data
                        out["writes"].append((cyc, a, n))
                        dones[k].append([cyc + (rng.randint(1, 8) if bp else rd_latency),
                                         int(tag), int(bad)])
                        wr[k] = None
            if ctx.get(dut.tx.meta.valid) and ctx.get(dut.tx.meta.ready):
                assert tx_open is None, "tx meta before the previous payload ended"
                md = ldict(PKT_META, ctx.get(dut.tx.meta.payload.as_value()))
                if out["first_tx"] is None:
                    out["first_tx"] = cyc
                entry = [md, b""]
                out["tx"].append(entry)
                if md["paylen"]:
                    tx_open = entry
                busy = True
            if ctx.get(dut.tx.payload.valid) and ctx.get(dut.tx.payload.ready):
                assert tx_open is not None, "tx payload beat without meta"
                b = ctx.get(dut.tx.payload.payload)
                assert b.last or b.nbytes == W
                tx_open[1] += int(b.data).to_bytes(W, "little")[:b.nbytes]
                if b.last:
                    assert len(tx_open[1]) == tx_open[0]["paylen"]
                    tx_open = None
            if ctx.get(dut.cqe.valid) and ctx.get(dut.cqe.ready):
                d = ldict(CQE, ctx.get(dut.cqe.payload.cqe.as_value()))
                d["cqn"] = ctx.get(dut.cqe.payload.cqn)
                out["cqes"].append(d)
                busy = True
            if ctx.get(dut.set_err.valid) and ctx.get(dut.set_err.ready):
                qn = ctx.get(dut.set_err.payload.qpn)
                out["errs"].append(qn)
                qps[qn]["state"] = QpState.ERR       # what the context table does
                busy = True
            out["naks"] += ctx.get(dut.stat_nak)
            out["drops"] += ctx.get(dut.stat_drop)
            out["dups"] += ctx.get(dut.stat_dup)
            out["seq_drops"] += ctx.get(dut.stat_seq_drop)
            out["replays"] += ctx.get(dut.stat_replay)
            out["coalesced"] += ctx.get(dut.stat_coalesce)
            out["busy"] += ctx.get(dut.stat_busy)
            quiet = 0 if busy else quiet + 1
            if not todo and quiet > quiet_end and cyc > tx_hold + quiet_end:
                break
            assert cyc < max_cycles, "simulation did not finish"
            await ctx.tick()
            cyc += 1
        out["cycles"] = cyc

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()
    out["tx"] = [(m, bytes(b)) for m, b in out["tx"]]
    return out


def run(items, qps=None, mrs=None, cfg=CFG, bp=False, seed=0, mem=None, rd_latency=2, tx_p=0.6, tx_hold=0, read_buffers=4):
    """Simulate and model ``items``; assert they agree; return the simulation's results."""
    qps = default_qps() if qps is None else qps
    mrs = default_mrs() if mrs is None else mrs
    mem0 = init_mem() if mem is None else mem
    items = expand_events(items)
    model = Model(cfg, qps, mrs, bytearray(mem0))
    for it in items:
        model.item(it)
    got = simulate(cfg, items, qps, mrs, bytearray(mem0), bp=bp, seed=seed, rd_latency=rd_latency, tx_p=tx_p,
                   tx_hold=tx_hold, read_buffers=read_buffers)
    # ACK coalescing (a queued, unsent positive ACK replaced by the next one of the same QP)
    # depends on timing: the model's ACK may be missing when the model's next response is
    # a positive ACK of the same QP
    def pos_ack(p):
        return p[0]["opcode"] == Op.ACKNOWLEDGE.value and p[0]["syndrome"] == ACK

    exp = model.tx
    skippable = [j + 1 < len(exp) and pos_ack(exp[j]) and pos_ack(exp[j + 1])
                 and exp[j + 1][0]["dest_qpn"] == exp[j][0]["dest_qpn"] for j in range(len(exp))]
    reach = {0}                    # positions in exp that the RTL's first i responses can reach
    for i, g in enumerate(got["tx"]):
        nxt = set()
        for j in reach:
            while j < len(exp):
                if exp[j] == g:
                    nxt.add(j + 1)
                if not skippable[j]:
                    break
                j += 1
        assert nxt, f"tx packet {i}: {g[0]} does not match the model"
        reach = nxt
    assert len(exp) in reach, "responses missing"
    assert len(exp) - len(got["tx"]) == got["coalesced"]
    assert got["dups"] == model.dups
    assert got["seq_drops"] == model.seq_drops
    assert got["replays"] == model.replays
    assert got["cqes"] == model.cqes
    assert got["errs"] == model.errs
    assert got["naks"] == model.naks
    assert got["drops"] == model.drops
    if got["mem"] != model.mem:
        diff = [hex(i) for i in range(MEM_SIZE) if got["mem"][i] != model.mem[i]]
        raise AssertionError(f"memory differs at {diff[:16]}")
    got["mem0"] = mem0
    return got


def coalesced_from(got, exp):
    """``got`` is ``exp`` (one QP's responses) with some positive ACKs left out that were
    directly followed by another positive ACK (ACK coalescing, which depends on timing: the
    write gate releases the ACKs of a burst of WRITEs together)."""
    j = 0
    for g in got:
        while j < len(exp) and exp[j] != g:
            if not (exp[j][0] == "ACKNOWLEDGE" and exp[j][2] == ACK and j + 1 < len(exp)
                    and exp[j + 1][0] == "ACKNOWLEDGE" and exp[j + 1][2] == ACK):
                return False
            j += 1
        if j == len(exp):
            return False
        j += 1
    return j == len(exp)


def naks(out):
    return [(m["psn"], m["syndrome"]) for m, _ in out["tx"] if m["opcode"] == Op.ACKNOWLEDGE.value
            and m["syndrome"] != ACK]


def changed(out):
    return [i for i in range(MEM_SIZE) if out["mem"][i] != out["mem0"][i]]


def rnd(n, seed):
    return random.Random(seed).randbytes(n)


# ---------------------------------------------------------------------------------------
# directed tests

def ops_ok_items():
    items = [event(0, QpState.RTS, 100), event(1, QpState.RTR, 0xFFFFFE)]
    items += [post(0, 0, 0xA0, 0x800, 128, K0, 1), post(0, 1, 0xA1, 0x900, 1024, K0, 3)]
    items[-1][3].append((0x3000 + 64, pack(RECV_WQE, wr_id=0xA2, addr=0, length=0, lkey=0)))  # slot 2
    items += [post(1, 0, 0xB0, 0xE00, 0x100, K0, 1)]
    psn = 100
    items += [pkt(Op.WRITE_ONLY, 0, psn, rnd(40, 1), ackreq=1, va=0x40, rkey=K0, dma_len=40)]
    psn += 1
    w = msg("WRITE", 0, psn, rnd(600, 2), va=0x105, rkey=K0)                     # 3 packets
    items += w
    psn += len(w)
    items += [pkt(Op.WRITE_ONLY, 0, psn, b"", ackreq=1, va=0, rkey=0xDEAD, dma_len=0)]  # no key check
    psn += 1
    items += [pkt(Op.SEND_ONLY, 0, psn, rnd(100, 3), ackreq=1)]                # -> wr 0xA0
    psn += 1
    s = msg("SEND", 0, psn, rnd(700, 4), imm=0x12345678)                        # -> wr 0xA1
    items += s
    psn += len(s)
    items += [pkt(Op.WRITE_ONLY_IMM, 0, psn, rnd(16, 5), ackreq=0, va=0x4A0, rkey=K0, dma_len=16,
                  imm=0xCAFEF00D)]                                              # -> wr 0xA2
    psn += 1
    items += [pkt(Op.READ_REQUEST, 0, psn, va=0x1003, rkey=K1, dma_len=600)]    # 3 responses
    psn += 3
    items += [pkt(Op.READ_REQUEST, 0, psn, va=0, rkey=0, dma_len=0)]            # ONLY, empty
    psn += 1
    items += [pkt(Op.READ_REQUEST, 0, psn, va=0x1100, rkey=K1, dma_len=8, ackreq=1)]
    psn += 1
    items += [pkt(Op.COMPARE_SWAP, 0, psn, va=0x400, rkey=K0, compare=0x1111, swap_add=5)]  # fails
    psn += 1
    items += [pkt(Op.FETCH_ADD, 0, psn, va=0x400, rkey=K0, swap_add=M64)]       # wraps
    psn += 1
    items += [pkt(Op.COMPARE_SWAP, 0, psn, va=0xFF8, rkey=K0, compare=0, swap_add=7)]
    psn += 1
    # QP 1 in RTR, PSNs wrap around 2**24
    items += [post(1, 1, 0xB1, 0, 0, 0, 2)]
    items += [pkt(Op.SEND_ONLY_IMM, 1, 0xFFFFFE, rnd(10, 6), imm=0x55, ackreq=1)]     # -> wr 0xB0
    items += msg("WRITE", 1, 0xFFFFFF, rnd(300, 7), imm=0x66, va=0x600, rkey=K0)      # -> wr 0xB1
    items += [pkt(Op.READ_REQUEST, 1, 1, va=0xA00, rkey=K0, dma_len=256)]
    return items


@pytest.mark.parametrize("bp", [False, True])
def test_every_opcode_succeeds(bp):
    mem = init_mem()
    mem[0x400:0x408] = (0x10).to_bytes(8, "little")
    mem[0xFF8:0x1000] = (0).to_bytes(8, "little")
    items = ops_ok_items()
    out = run(items, bp=bp, seed=1, mem=mem)
    m = out["mem"]
    assert out["errs"] == [] and out["drops"] == 0 and out["naks"] == 0
    pk = {it[1]["psn"]: it for it in items if it[0] == "pkt" and it[1]["dest_qpn"] == 0}
    assert m[0x40:0x68] == pk[100][2]
    assert m[0x105:0x105 + 600] == b"".join(pk[p][2] for p in (101, 102, 103))
    assert m[0x800:0x800 + 100] == pk[105][2]
    assert m[0x900:0x900 + 700] == b"".join(pk[p][2] for p in (106, 107, 108))
    assert m[0x4A0:0x4B0] == pk[109][2]
    assert int.from_bytes(m[0x400:0x408], "little") == 0xF            # 0x10 + (2**64 - 1)
    assert int.from_bytes(m[0xFF8:0x1000], "little") == 7             # CAS 0 -> 7
    tx = [(Op(t["opcode"]).name, t["psn"], t["syndrome"], t["msn"]) for t, _ in out["tx"]
          if t["dest_qpn"] == 0x100]
    assert coalesced_from(tx, [
        ("ACKNOWLEDGE", 100, ACK, 1), ("ACKNOWLEDGE", 103, ACK, 2), ("ACKNOWLEDGE", 104, ACK, 3),
        ("ACKNOWLEDGE", 105, ACK, 4), ("ACKNOWLEDGE", 108, ACK, 5),
        ("READ_RESPONSE_FIRST", 110, ACK, 7), ("READ_RESPONSE_MIDDLE", 111, 0, 0),
        ("READ_RESPONSE_LAST", 112, ACK, 7), ("READ_RESPONSE_ONLY", 113, ACK, 8),
        ("READ_RESPONSE_ONLY", 114, ACK, 9), ("ATOMIC_ACKNOWLEDGE", 115, ACK, 10),
        ("ATOMIC_ACKNOWLEDGE", 116, ACK, 11), ("ATOMIC_ACKNOWLEDGE", 117, ACK, 12),
    ]), tx
    reads = [b for t, b in out["tx"] if t["dest_qpn"] == 0x100 and t["paylen"]]
    assert b"".join(reads[:3]) == out["mem0"][0x1003:0x1003 + 600]
    origs = [t["orig"] for t, _ in out["tx"] if t["opcode"] == Op.ATOMIC_ACKNOWLEDGE.value]
    assert origs == [0x10, 0x10, 0]
    assert all(t["udp_sport"] == 0xC000 and t["src_node"] == NODE and t["dst_node"] == 10
               for t, _ in out["tx"] if t["dest_qpn"] == 0x100)
    cq = [(c["cqn"], c["wr_id"], c["opcode"], c["status"], c["byte_len"], c["imm"], c["flags"], c["qpn"],
           c["src_qpn"]) for c in out["cqes"]]
    assert cq == [
        (1, 0xA0, WcOpcode.RECV.value, 0, 100, 0, 0, 0, 0x100),
        (1, 0xA1, WcOpcode.RECV.value, 0, 700, 0x12345678, CQE_FLAG_IMM, 0, 0x100),
        (1, 0xA2, WcOpcode.RECV_RDMA_WITH_IMM.value, 0, 16, 0xCAFEF00D, CQE_FLAG_IMM, 0, 0x100),
        (2, 0xB0, WcOpcode.RECV.value, 0, 10, 0x55, CQE_FLAG_IMM, 1, 0x101),
        (2, 0xB1, WcOpcode.RECV_RDMA_WITH_IMM.value, 0, 300, 0x66, CQE_FLAG_IMM, 1, 0x101),
    ]
    q1 = [(Op(t["opcode"]).name, t["psn"], t["syndrome"], t["msn"]) for t, _ in out["tx"]
          if t["dest_qpn"] == 0x101]
    assert coalesced_from(q1, [("ACKNOWLEDGE", 0xFFFFFE, ACK, 1), ("ACKNOWLEDGE", 0, ACK, 2),
                               ("READ_RESPONSE_ONLY", 1, ACK, 3)]), q1
    # bytes outside every written range are unchanged
    written = set(range(0x40, 0x68)) | set(range(0x105, 0x105 + 600)) | set(range(0x800, 0x800 + 100)) \
        | set(range(0x900, 0x900 + 700)) | set(range(0x4A0, 0x4B0)) | set(range(0x400, 0x408)) \
        | set(range(0xFF8, 0x1000)) | set(range(0x600, 0x600 + 300)) | set(range(0xE00, 0xE0A)) \
        | set(range(0x3000, 0x3400))  # receive WQEs written by the host
    assert set(changed(out)) <= written


@pytest.mark.parametrize("data_bytes", [64, 16])
def test_every_opcode_succeeds_wide(data_bytes):
    cfg = NicConfig(data_bytes=data_bytes, mtu=256, n_qps=4, n_mrs=4, n_cqs=4)
    out = run(ops_ok_items(), cfg=cfg, bp=True, seed=5)
    assert out["naks"] == 0 and out["errs"] == [] and len(out["cqes"]) == 5


def with_resets(q, cases, probe=True):
    """For each case: reset QP q (RESET: its receive producer index restarts at 0, so the
    receive WQE prefetch drops what it read of the old ring) and bring it to RTS at PSN 10*i,
    run the case's packets, then (after a fatal error) probe with a WRITE_ONLY that must be
    dropped because the QP is in ERR."""
    items = []
    for i, case in enumerate(cases):
        psn = 10 * (i + 1)
        items.append(event(q, QpState.RESET, psn))
        items.append(event(q, QpState.RTS, psn))
        for it in case(psn):
            items.append(it)
        if probe:
            items.append(pkt(Op.WRITE_ONLY, q, psn + 5, b"\x01", va=0, rkey=K0, dma_len=1))
    return items


def wr(psn, q=0, va=0x40, rkey=K0, n=8, dma_len=None, payload=None):
    data = rnd(n, psn) if payload is None else payload
    return [pkt(Op.WRITE_ONLY, q, psn, data, ackreq=1, va=va, rkey=rkey,
                dma_len=len(data) if dma_len is None else dma_len)]


def test_write_errors():
    cases = [
        lambda p: wr(p, rkey=K0 ^ 0x3),                       # wrong rkey (tag bits)
        lambda p: wr(p, va=0xFF8, n=9),                       # one byte beyond the end of the MR
        lambda p: wr(p, va=M64 - 7, n=16, dma_len=16),        # va + len wraps around 2**64
        lambda p: wr(p, va=0x1000, rkey=K1),                  # MR without REMOTE_WRITE
        lambda p: wr(p, va=0x1800, rkey=K2),                  # MR of another PD
        lambda p: wr(p, va=0x2000, rkey=K3),                  # MR not valid
        lambda p: wr(p, n=20, dma_len=16),                    # more payload than dma_len
        lambda p: wr(p, n=8, dma_len=16),                     # ONLY with less payload than dma_len
        lambda p: [pkt(Op.WRITE_FIRST, 0, p, rnd(256, 1), va=0x500, rkey=K0, dma_len=300),
                   pkt(Op.WRITE_LAST, 0, p + 1, rnd(100, 2), ackreq=1)],   # 100 > 44 left
        lambda p: [pkt(Op.WRITE_MIDDLE, 0, p, rnd(256, 3))],  # MIDDLE without FIRST
        lambda p: [pkt(Op.WRITE_FIRST, 0, p, rnd(100, 4), va=0x500, rkey=K0, dma_len=300)],  # FIRST != MTU
    ]
    items = with_resets(0, cases)
    # QP 2 does not grant REMOTE_WRITE
    items += [event(2, QpState.RTS, 7)] + wr(7, q=2)
    out = run(items, bp=True, seed=2)
    exp = [(10, 0x62), (20, 0x62), (30, 0x62), (40, 0x62), (50, 0x62), (60, 0x62), (70, 0x61),
           (80, 0x61), (91, 0x61), (100, 0x61), (110, 0x61), (7, 0x62)]
    assert naks(out) == exp
    assert out["errs"] == [0] * 11 + [2]
    assert out["drops"] == 11                                  # every probe found the QP in ERR
    assert out["cqes"] == []
    # only the first packet of the 300-byte WRITE reached memory
    assert changed(out) == [i for i in range(0x500, 0x600) if out["mem0"][i] != out["mem"][i]]
    assert out["mem"][0x500:0x600] == rnd(256, 1)


def test_read_and_atomic_errors():
    mrs = default_mrs()
    mrs[3].update(valid=1, access=ALL & ~Access.REMOTE_READ.value)    # no REMOTE_READ
    qps = default_qps()
    qps[3]["ctx"]["access"] = Access.REMOTE_WRITE.value               # QP 3 grants no READ/atomic

    def rd(p, va=0, rkey=K0, n=16, q=0, payload=b""):
        return [pkt(Op.READ_REQUEST, q, p, payload, va=va, rkey=rkey, dma_len=n)]

    def at(p, op=Op.FETCH_ADD, va=0x400, rkey=K0, q=0):
        return [pkt(op, q, p, va=va, rkey=rkey, compare=1, swap_add=1)]

    cases = [
        lambda p: rd(p, rkey=K0 + 1),                          # wrong rkey
        lambda p: rd(p, va=0xFF8, n=9),                        # one byte beyond the MR
        lambda p: rd(p, va=0xFFF, n=8, rkey=K1),               # one byte below MR1
        lambda p: rd(p, va=0x2000, rkey=K3),                   # MR without REMOTE_READ
        lambda p: rd(p, va=0x1800, rkey=K2),                   # other PD
        lambda p: rd(p, payload=b"12345678"),                  # READ request with payload
        lambda p: at(p, va=0x404),                             # misaligned FAA
        lambda p: at(p, op=Op.COMPARE_SWAP, va=0x401),         # misaligned CAS
        lambda p: at(p, va=0x1000, rkey=K1),                   # MR without REMOTE_ATOMIC
        lambda p: at(p, op=Op.COMPARE_SWAP, va=0x1000),        # 8 bytes outside MR0
        lambda p: at(p, va=0x1800, rkey=K2),                   # other PD
    ]
    items = with_resets(0, cases, probe=False)
    items += [event(3, QpState.RTS, 3)] + rd(3, q=3) + [event(3, QpState.RTS, 4)] + at(4, q=3)
    items += [event(2, QpState.RTS, 5)] + at(5, q=2)           # QP 2: READ only
    items += rd(6, q=2, va=0x100, n=8)                         # dropped: QP 2 is in ERR now
    out = run(items, qps=qps, mrs=mrs, bp=True, seed=3)
    assert naks(out) == [(10, 0x62), (20, 0x62), (30, 0x62), (40, 0x62), (50, 0x62), (60, 0x61),
                         (70, 0x61), (80, 0x61), (90, 0x62), (100, 0x62), (110, 0x62),
                         (3, 0x62), (4, 0x62), (5, 0x62)]
    assert out["errs"] == [0] * 11 + [3, 3, 2]
    assert out["drops"] == 1
    assert changed(out) == []                                  # no memory touched


def test_receive_errors():
    def send_only(p, n, **kw):
        return [pkt(Op.SEND_ONLY, 0, p, rnd(n, p), ackreq=1, **kw)]

    def wimm(p):
        return [pkt(Op.WRITE_ONLY_IMM, 0, p, rnd(8, 9), ackreq=1, va=0x40, rkey=K0, dma_len=8, imm=3)]

    # after each reset the driver restarts its receive ring: producer index 0, then slot 0
    empty = ("db", 0, 0, [])
    cases = [
        lambda p: [empty] + send_only(p, 100) + [post(0, 0, 0x1, 0x800, 128, K0, 1)] + send_only(p, 100),
        lambda p: [empty] + wimm(p) + [post(0, 0, 0x2, 0, 0, 0, 1)] + wimm(p),     # RNR, retry
        lambda p: [post(0, 0, 0x3, 0x800, 64, K0, 1)] + send_only(p, 100),        # message too long
        lambda p: [post(0, 0, 0x4, 0x800, 300, K0, 1)] + msg("SEND", 0, p, rnd(600, 4)),
        lambda p: [post(0, 0, 0x5, 0x800, 128, K0 ^ 0x80, 1)] + send_only(p, 10),  # bad lkey
        lambda p: [post(0, 0, 0x6, 0x1000, 128, K1, 1)] + send_only(p, 10),        # no LOCAL_WRITE
        lambda p: [post(0, 0, 0x7, 0xFC0, 128, K0, 1)] + send_only(p, 10),         # beyond the MR
        lambda p: [post(0, 0, 0x8, 0x1800, 128, K2, 1)] + send_only(p, 10),        # other PD
        lambda p: [post(0, 0, 0x9, 0x800, 128, K0, 1)] + send_only(p, 0),          # ok, empty SEND
    ]
    items = with_resets(0, cases, probe=False)
    out = run(items, bp=True, seed=4)
    assert naks(out) == [(10, RNR), (20, RNR), (30, 0x61), (41, 0x61), (50, 0x63), (60, 0x63),
                         (70, 0x63), (80, 0x63)]
    assert out["errs"] == [0] * 6
    acks = [m["psn"] for m, _ in out["tx"] if m["syndrome"] == ACK]
    assert acks == [10, 20, 90]
    cq = [(c["wr_id"], c["status"], c["opcode"], c["byte_len"]) for c in out["cqes"]]
    assert cq == [(1, 0, WcOpcode.RECV.value, 100), (2, 0, WcOpcode.RECV_RDMA_WITH_IMM.value, 8),
                  (3, WcStatus.LOC_LEN_ERR.value, WcOpcode.RECV.value, 0),
                  (4, WcStatus.LOC_LEN_ERR.value, WcOpcode.RECV.value, 0),
                  (5, WcStatus.LOC_PROT_ERR.value, WcOpcode.RECV.value, 0),
                  (6, WcStatus.LOC_PROT_ERR.value, WcOpcode.RECV.value, 0),
                  (7, WcStatus.LOC_PROT_ERR.value, WcOpcode.RECV.value, 0),
                  (8, WcStatus.LOC_PROT_ERR.value, WcOpcode.RECV.value, 0),
                  (9, 0, WcOpcode.RECV.value, 0)]
    # memory: the retried SEND (0x800..0x864), the WRITE_IMM (0x40..0x48), the first 256 bytes of
    # the too-long multi-packet SEND at 0x800 (overwrites the first SEND's bytes)
    ok = set(range(0x800, 0x900)) | set(range(0x40, 0x48)) | set(range(0x3000, 0x3020))
    assert set(changed(out)) <= ok
    assert out["mem"][0x800:0x900] == rnd(600, 4)[:256]


def test_drops_psn_and_opcode_errors():
    items = [event(0, QpState.RTS, 50), event(1, QpState.RTS, 0)]
    items += [pkt(Op.WRITE_ONLY, 4, 0, b"x", va=0, rkey=K0, dma_len=1)]            # QPN not local
    items += [pkt(Op.WRITE_ONLY, 0x800001, 0, b"x", va=0, rkey=K0, dma_len=1)]     # not local either
    items += [pkt(Op.WRITE_ONLY, 3, 0, b"x", va=0, rkey=K0, dma_len=1)]            # QP 3 in RESET
    items += [event(3, QpState.INIT, 0), pkt(Op.READ_REQUEST, 3, 0, va=0, rkey=K0, dma_len=8)]
    items += [event(3, QpState.ERR, 0), pkt(Op.SEND_ONLY, 3, 0, rnd(300 - 44, 1))]
    items += [pkt(Op.WRITE_ONLY, 0, 52, b"y" * 9, ackreq=1, va=0, rkey=K0, dma_len=9)]  # ahead
    items += [pkt(Op.WRITE_ONLY, 0, 49, b"y" * 9, ackreq=1, va=0, rkey=K0, dma_len=9)]  # duplicate
    items += [pkt(Op.WRITE_ONLY, 0, 50, b"z" * 9, ackreq=1, va=0, rkey=K0, dma_len=9)]  # expected
    # opcode errors on QP 1 (each followed by a reset)
    bad = [pkt(0x15, 1, 0), pkt(0x1F, 1, 0, b"abc"), pkt(Op.ACKNOWLEDGE, 1, 0),
           pkt(Op.READ_RESPONSE_ONLY, 1, 0, rnd(40, 2)), pkt(Op.SEND_MIDDLE, 1, 0, rnd(256, 3)),
           pkt(Op.SEND_LAST, 1, 0, rnd(10, 3)), pkt(Op.WRITE_LAST_IMM, 1, 0, rnd(10, 3)),
           pkt(Op.SEND_ONLY, 1, 0, rnd(257, 5))]                                     # > MTU
    for b in bad:
        items += [b, event(1, QpState.RTS, 0)]
    # a new message while a SEND is in progress
    items += [post(1, 0, 0x11, 0x800, 1024, K0, 1), pkt(Op.SEND_FIRST, 1, 0, rnd(256, 6)),
              pkt(Op.WRITE_ONLY, 1, 1, b"q", va=0, rkey=K0, dma_len=1)]
    out = run(items, bp=True, seed=6)
    assert out["drops"] == 5
    # ahead: one PSN sequence NAK; the duplicate: a positive ACK of epsn - 1 (49), no write
    assert naks(out) == [(50, 0x60)] + [(0, 0x61)] * 8 + [(1, 0x61)]
    assert out["dups"] == 1
    assert out["errs"] == [1] * 9
    assert [m["psn"] for m, _ in out["tx"] if m["syndrome"] == ACK] == [49, 50]
    assert out["mem"][0:9] == b"z" * 9
    assert set(changed(out)) <= set(range(0, 9)) | set(range(0x800, 0x900)) | set(range(0x3100, 0x3120))


def test_qp_event_resets_state():
    items = [event(0, QpState.RTS, 10), post(0, 0, 0x1, 0x800, 1024, K0, 1),
             pkt(Op.SEND_FIRST, 0, 10, rnd(256, 1)),
             pkt(Op.WRITE_ONLY, 0, 11, b"a", ackreq=1, va=0, rkey=K0, dma_len=1),  # invalid: in a SEND
             event(0, QpState.RTS, 500),
             pkt(Op.SEND_MIDDLE, 0, 500, rnd(256, 2)),                              # no SEND in progress
             event(0, QpState.RTR, 600),
             pkt(Op.WRITE_ONLY, 0, 600, b"b", ackreq=1, va=1, rkey=K0, dma_len=1),  # ACK with MSN 1
             pkt(Op.WRITE_ONLY, 0, 601, b"c", ackreq=1, va=2, rkey=K0, dma_len=1)]  # MSN 2
    out = run(items, bp=False)
    assert naks(out) == [(11, 0x61), (500, 0x61)]
    assert [(m["psn"], m["msn"]) for m, _ in out["tx"] if m["syndrome"] == ACK] == [(600, 1), (601, 2)]


@pytest.mark.parametrize("bp", [False, True])
def test_qp_event_during_packet_cancels_write_back(bp):
    """An event for the QP of the packet in flight wins over that packet's state write-back."""
    items = [event(0, QpState.RTS, 10), event(1, QpState.RTS, 20),
             pkt(Op.WRITE_ONLY, 0, 10, rnd(64, 1), ackreq=1, va=0x40, rkey=K0, dma_len=64),
             event(0, QpState.RTS, 100, race=True),
             pkt(Op.WRITE_ONLY, 0, 100, rnd(8, 2), ackreq=1, va=0x100, rkey=K0, dma_len=8),
             # an event for another QP does not cancel anything
             pkt(Op.WRITE_ONLY, 1, 20, rnd(64, 3), ackreq=1, va=0x200, rkey=K0, dma_len=64),
             event(0, QpState.RTS, 200, race=True),
             pkt(Op.WRITE_ONLY, 1, 21, rnd(8, 4), ackreq=1, va=0x300, rkey=K0, dma_len=8)]
    out = run(items, bp=bp, seed=8)
    acks = [(m["dest_qpn"], m["psn"], m["syndrome"], m["msn"]) for m, _ in out["tx"]]
    assert acks == [(0x100, 10, ACK, 1), (0x100, 100, ACK, 1), (0x101, 20, ACK, 1), (0x101, 21, ACK, 2)]


@pytest.mark.parametrize("bp", [False, True])
def test_qp_event_during_failing_packet_cancels_set_err(bp):
    """A packet that fails fatally (wrong rkey) while its QP is being reset: the NAK still
    leaves, but no QP-error request reaches the new incarnation of the QP (found by the
    fuzzing test: the re-created QP went to ERR)."""
    items = [event(0, QpState.RTS, 10),
             pkt(Op.WRITE_ONLY, 0, 10, rnd(64, 1), ackreq=1, va=0x40, rkey=K1, dma_len=64),
             event(0, QpState.RTS, 100, race=True),
             pkt(Op.WRITE_ONLY, 0, 100, rnd(8, 2), ackreq=1, va=0x100, rkey=K0, dma_len=8),
             # without the race the error reaches the QP
             pkt(Op.WRITE_ONLY, 0, 101, rnd(8, 2), ackreq=1, va=0x100, rkey=K1, dma_len=8)]
    out = run(items, bp=bp, seed=18)
    assert naks(out) == [(10, 0x62), (101, 0x62)]
    assert out["errs"] == [0]


def test_receive_ring_wraps():
    """Receive WQEs are read from rq_base + (ci mod 2**rq_log_size) * 32; ci is free running."""
    qps = default_qps()
    qps[1]["ctx"]["rq_log_size"] = 1                         # two slots
    items = [event(1, QpState.RTS, 0)]
    for i in range(5):
        # (posted once the SEND two before it has consumed the slot)
        items += [post(1, i % 2, 0x100 + i, 0x800 + 0x40 * i, 0x40, K0, i + 1) + ("settle",),
                  pkt(Op.SEND_ONLY, 1, i, rnd(0x20 + i, i), ackreq=1)]
    out = run(items, qps=qps, bp=True, seed=9)
    assert [(c["wr_id"], c["byte_len"]) for c in out["cqes"]] == [(0x100 + i, 0x20 + i) for i in range(5)]
    for i in range(5):
        assert out["mem"][0x800 + 0x40 * i:0x820 + 0x40 * i + i] == rnd(0x20 + i, i)


@pytest.mark.parametrize("bp", [False, True])
def test_reads_overlap_and_keep_order(bp):
    """READ responses are queued while later requests execute; every response leaves in
    request order (one response queue), and a READ sees the data of every request before it
    (here a WRITE and an atomic on the same bytes). A request after a READ does not touch the
    READ's bytes: IBA 9.5 lets it pass the READ's data fetch (the requester fences)."""
    items = [event(0, QpState.RTS, 0), event(1, QpState.RTS, 0)]
    psn = 0
    for i in range(6):
        items.append(pkt(Op.READ_REQUEST, 0, psn, va=0x100 + 8 * i, rkey=K0, dma_len=8 + 200 * i))
        psn += max(1, -(-(8 + 200 * i) // 256))
    items.append(pkt(Op.WRITE_ONLY, 1, 0, rnd(64, 1), ackreq=1, va=0x800, rkey=K0, dma_len=64))
    items.append(pkt(Op.FETCH_ADD, 1, 1, va=0x808, rkey=K0, swap_add=1))
    items.append(pkt(Op.READ_REQUEST, 1, 2, va=0x7F0, rkey=K0, dma_len=300))
    items.append(pkt(Op.WRITE_ONLY, 1, 4, rnd(64, 2), ackreq=1, va=0xC00, rkey=K0, dma_len=64))
    items.append(pkt(Op.FETCH_ADD, 0, psn, va=0xC40, rkey=K0, swap_add=1))
    items.append(pkt(Op.WRITE_ONLY, 0, psn + 5, b"", ackreq=1, va=0, rkey=K0, dma_len=0))  # PSN NAK
    out = run(items, bp=bp, seed=12)
    kinds = [(m["dest_qpn"], Op(m["opcode"]).name, m["psn"]) for m, _ in out["tx"]]
    assert kinds[-3:] == [(0x101, "ACKNOWLEDGE", 4), (0x100, "ATOMIC_ACKNOWLEDGE", psn),
                          (0x100, "ACKNOWLEDGE", psn + 1)]       # NAK: expected PSN
    q1 = [b for m, b in out["tx"] if m["dest_qpn"] == 0x101 and m["paylen"]]
    new = bytearray(out["mem0"][0x7F0:0x7F0 + 300])
    new[0x10:0x50] = rnd(64, 2 - 1)
    new[0x18:0x20] = (int.from_bytes(new[0x18:0x20], "little") + 1).to_bytes(8, "little")
    assert b"".join(q1) == bytes(new)                        # the WRITE's and the FAA's data


def test_atomic_ack_waits_for_queued_read_responses():
    """A slow network side (tx ready 10 %) lets READ responses queue up behind the FSM."""
    items = [event(0, QpState.RTS, 0)]
    items += [pkt(Op.READ_REQUEST, 0, i, va=0, rkey=0, dma_len=0) for i in range(14)]
    items += [pkt(Op.COMPARE_SWAP, 0, 14, va=0x100, rkey=K0, compare=0, swap_add=1),
              pkt(Op.READ_REQUEST, 0, 15, va=0x100, rkey=K0, dma_len=8),
              pkt(Op.FETCH_ADD, 0, 16, va=0x100, rkey=K0, swap_add=1),
              pkt(Op.READ_REQUEST, 0, 17, va=0, rkey=0, dma_len=0),
              pkt(Op.WRITE_ONLY, 0, 18, b"", ackreq=1, va=0, rkey=0, dma_len=0)]
    out = run(items, bp=True, seed=13, tx_p=0.1)
    assert [m["psn"] for m, _ in out["tx"]] == list(range(19))


def test_read_throughput_with_dma_latency():
    """Small READs overlap their DMA latency (no per-packet round trip in the responder)."""
    items = [event(0, QpState.RTS, 0)]
    items += [pkt(Op.READ_REQUEST, 0, i, va=0x100, rkey=K0, dma_len=8) for i in range(16)]
    out = run(items, bp=False, rd_latency=40)
    # one DMA round trip (40 cycles) for all of them, not one per READ (16 * 40); each READ
    # costs about 10 cycles of processing and 5 of its rkey lookup (a 3-cycle cache hit)
    assert out["cycles"] < 16 * 15 + 40 + 41


@pytest.mark.parametrize("op", ["read", "write"])
def test_small_requests_take_two_cycles_each(op):
    """With the next packets' QP-context and rkey lookups in flight ahead of the state machine
    (hw/rnic/request_lookup.py), an 8-byte READ costs the state machine two cycles (IDLE,
    CHECK: its descriptor queued and its state written back there) and so does an 8-byte
    WRITE with an acknowledge request (its beat written, its ACK queued and its state written
    back in CHECK). Before the lookahead a READ took three, a WRITE five."""
    n = 32
    items = [event(0, QpState.RTS, 0)]
    if op == "read":
        items += [pkt(Op.READ_REQUEST, 0, i, va=0x100, rkey=K0, dma_len=8) for i in range(n)]
    else:
        items += [pkt(Op.WRITE_ONLY, 0, i, rnd(8, i), ackreq=1, va=0x100 + 8 * i, rkey=K0,
                      dma_len=8) for i in range(n)]
    out = run(items, bp=False, tx_p=1.0)
    # IDLE (taking the packet) is not counted busy: one busy cycle per packet
    assert out["busy"] <= n + 2, out["busy"]


def hazard_items():
    """READs (far more response data than the READ payload ring holds) mixed with a WRITE
    that needs an ACK, a SEND (receive-WQE DMA read) and an atomic (DMA read), on two QPs."""
    items = [event(0, QpState.RTS, 0), event(1, QpState.RTS, 0), post(1, 0, 0x77, 0x800, 256, K0, 1)]
    psn0 = psn1 = 0
    for i in range(8):
        items.append(pkt(Op.READ_REQUEST, 0, psn0, va=0xC00 + 16 * i, rkey=K0, dma_len=600))
        psn0 += 3
        if i == 2:
            items.append(pkt(Op.WRITE_ONLY, 1, psn1, rnd(40, 7), ackreq=1, va=0x100, rkey=K0, dma_len=40))
            psn1 += 1
        if i == 4:
            items.append(pkt(Op.SEND_ONLY, 1, psn1, rnd(30, 8), ackreq=1))
            psn1 += 1
        if i == 5:
            items.append(pkt(Op.FETCH_ADD, 1, psn1, va=0x600, rkey=K0, swap_add=3))
            psn1 += 1
    items.append(pkt(Op.WRITE_ONLY, 0, psn0, rnd(16, 9), ackreq=1, va=0x200, rkey=K0, dma_len=16))
    return items


@pytest.mark.parametrize("bp", [False, True])
def test_no_wait_on_tx(bp):
    """The deadlock hazard of a node: tx is not ready for a long time (the link and the peer
    are full) while requests keep arriving. The responder must keep accepting requests (their
    responses queue up), must accept every DMA read beat at once (READ data only up to the
    payload ring: 4 MTUs are requested, the rest waits for tx), and, once tx runs, send
    everything in order."""
    hold = 3000
    out = run(hazard_items(), bp=bp, seed=21, tx_hold=hold)
    assert out["rx_done"] is not None and out["rx_done"] < hold // 2   # every request taken
    assert out["first_tx"] >= hold
    assert out["rd_stall"] == 0                                         # DMA data never waits
    assert out["resp_full"] == 0
    assert 0 < out["read_bytes_in_hold"] <= 4 * CFG.mtu                 # only reserved space
    assert len(out["cqes"]) == 1 and out["mem"][0x800:0x81E] == rnd(30, 8)
    assert [Op(m["opcode"]).name for m, _ in out["tx"]].count("READ_RESPONSE_FIRST") == 8


def test_response_queue_full_is_counted():
    """With a queue smaller than the peer's traffic (a configuration error: 4 QPs x 2
    outstanding = 8 descriptors) the responses wait for room and ``stat_resp_full`` counts
    it; nothing is lost."""
    cfg = NicConfig(data_bytes=8, mtu=256, n_qps=4, n_mrs=4, n_cqs=4, max_outstanding=2)
    items = [event(0, QpState.RTS, 0)]
    items += [pkt(Op.READ_REQUEST, 0, i, va=0xC00, rkey=K0, dma_len=8) for i in range(12)]
    items += [pkt(Op.WRITE_ONLY, 0, 12, b"", ackreq=1, va=0, rkey=K0, dma_len=0)]
    out = run(items, cfg=cfg, seed=3, tx_hold=400)
    assert out["resp_full"] > 0
    # (the write gate in front of the queue holds the rest, so requests are still taken)
    assert [m["psn"] for m, _ in out["tx"]] == list(range(13))
    out = run(items, seed=3, tx_hold=400)                      # 4 x 32 descriptors: no wait
    assert out["resp_full"] == 0 and out["rx_done"] < 400


# ---------------------------------------------------------------------------------------
# random traffic against the model

def random_items(rng, n_ops, cfg=CFG):
    qps, mrs = default_qps(), default_mrs()
    model = Model(cfg, qps, mrs, init_mem())
    items = []
    mtu = cfg.mtu

    recent = []

    def add(it):
        items.append(it)
        model.item(it)
        if it[0] == "pkt":
            recent.append(it)
            del recent[:-12]

    for q in range(4):
        add(event(q, QpState.RTS, rng.choice([0, M24 - 2, rng.randrange(1 << 24)])))
    for _ in range(n_ops):
        if recent and rng.random() < 0.1:
            add(rng.choice(recent))      # a duplicate, as after a retransmission or on a lossy link
        q = rng.randrange(4)
        st = model.st[q]
        if model.qps[q]["state"] == QpState.ERR or rng.random() < 0.02:
            add(event(q, QpState.RTS, rng.randrange(1 << 24)))
            continue
        if rng.random() < 0.3 and (model.pi[q] - st["ci"]) % 65536 < 8:
            pi_ = model.pi[q]
            lkey = K0 if rng.random() < 0.9 else rng.choice([K1, K2, K0 ^ 1])
            add(post(q, pi_ % 8, rng.getrandbits(64), 0x800 + rng.randrange(0x200),
                     rng.choice([0, 64, 300, 600, 0x400]), lkey, (pi_ + 1) % 65536))
        psn = st["epsn"] if rng.random() < 0.93 else rng.randrange(1 << 24)
        kind = rng.choice(["write", "write", "write_imm", "send", "send", "read", "atomic", "bad"])
        good_key = rng.random() < 0.9
        if kind in ("write", "write_imm"):
            n = rng.choice([0, 1, 8, 13, mtu, mtu + 1, 2 * mtu + 7])
            va = rng.randrange(0x600 - n) if good_key else rng.choice([0xFFF, 0x1000])
            for it in msg("WRITE", q, psn, rnd(n, rng.random()), mtu=mtu, va=va, rkey=K0 if good_key else K1,
                          imm=rng.getrandbits(32) if kind == "write_imm" else None,
                          ackreq=rng.randrange(2)):
                it[1]["ackreq"] |= rng.random() < 0.2          # ACK requested mid-message too
                add(it)
        elif kind == "send":
            n = rng.choice([0, 5, mtu, mtu + 3, 3 * mtu])
            for it in msg("SEND", q, psn, rnd(n, rng.random()), mtu=mtu,
                          imm=rng.getrandbits(32) if rng.random() < 0.3 else None, ackreq=rng.randrange(2)):
                it[1]["ackreq"] |= rng.random() < 0.2
                add(it)
        elif kind == "read":
            n = rng.choice([0, 1, 8, mtu, mtu + 1, 3 * mtu - 1])
            # READ sources are never written (WRITE < 0x600, atomics 0x600.., SEND 0x800..0xC00):
            # a later write may pass a READ's data fetch (IBA 9.5), the model is sequential
            key, base, size = (K0, 0xC00, 0x400) if rng.random() < 0.5 else (K1, 0x1000, 0x800)
            va = base + rng.randrange(size - n) if good_key else base + size - n // 2
            add(pkt(Op.READ_REQUEST, q, psn, va=va, rkey=key, dma_len=n))
        elif kind == "atomic":
            va = 0x600 + 8 * rng.randrange(4) + (0 if rng.random() < 0.9 else 4)
            op = rng.choice([Op.COMPARE_SWAP, Op.FETCH_ADD])
            cur = int.from_bytes(model.mem[va:va + 8], "little")
            add(pkt(op, q, psn, va=va, rkey=K0 if good_key else K1,
                    compare=cur if rng.random() < 0.5 else rng.getrandbits(64), swap_add=rng.getrandbits(64)))
        else:
            add(pkt(rng.choice([0x15, 0x40, Op.ACKNOWLEDGE.value, Op.SEND_MIDDLE.value]), q, psn,
                    rnd(rng.choice([0, 8, 20]), 1)))
    return items


@pytest.mark.parametrize("seed,bp,data_bytes", [(10, True, 8), (11, False, 8), (12, True, 8), (13, True, 64)])
def test_random_traffic(seed, bp, data_bytes):
    cfg = NicConfig(data_bytes=data_bytes, mtu=256, n_qps=4, n_mrs=4, n_cqs=4)
    rng = random.Random(seed)
    items = random_items(rng, 80, cfg)
    out = run(items, cfg=cfg, bp=bp, seed=seed)
    kinds = {Op(m["opcode"]).name for m, _ in out["tx"]}
    assert "ACKNOWLEDGE" in kinds and len(out["tx"]) > 20
    assert out["dups"] > 0


def test_bad_config():
    with pytest.raises(ValueError, match="cfg must be a hw.config.NicConfig"):
        Responder({"data_bytes": 8})
    for bad in (1, 3, 32, True, 4.0):
        with pytest.raises(ValueError, match=r"read_buffers must be a power of two in \[2, 16\], not "):
            Responder(CFG, read_buffers=bad)


def test_two_read_buffers():
    """The smallest payload ring (2 MTUs) still sends every READ correctly."""
    items = [event(0, QpState.RTS, 0)]
    items += [pkt(Op.READ_REQUEST, 0, 3 * i, va=0xC00 + i, rkey=K0, dma_len=700) for i in range(4)]
    out = run(items, bp=True, seed=4, read_buffers=2)
    assert len(out["tx"]) == 12



# ---------------------------------------------------------------------------------------
# reliability: duplicates, one NAK per sequence gap, atomic replay, ACK coalescing

def test_duplicates_have_no_second_effect():
    """IBA 9.7.5.1.2: a duplicate WRITE/SEND is acknowledged and not executed again, a
    duplicate READ is executed again from its RETH, a duplicate atomic is answered from the
    replay cache (the FETCH_ADD is applied once)."""
    items = [event(0, QpState.RTS, 10), post(0, 0, 0x55, 0x800, 256, K0, 1)]
    w = pkt(Op.WRITE_ONLY, 0, 10, rnd(20, 1), ackreq=1, va=0x100, rkey=K0, dma_len=20)
    snd = pkt(Op.SEND_ONLY, 0, 11, rnd(30, 2), ackreq=1)
    rd = pkt(Op.READ_REQUEST, 0, 12, va=0xC00, rkey=K0, dma_len=300)       # PSNs 12, 13
    fa = pkt(Op.FETCH_ADD, 0, 14, va=0x600, rkey=K0, swap_add=5)
    items += [w, snd, rd, fa]
    # the whole sequence again (a go-back-N retransmission), then new work
    items += [w, snd, rd, fa]
    items += [pkt(Op.FETCH_ADD, 0, 15, va=0x600, rkey=K0, swap_add=7)]
    mem = init_mem()
    out = run(items, mem=mem, bp=True, seed=4)
    assert out["dups"] == 4 and out["replays"] == 1
    assert len(out["cqes"]) == 1                                   # one receive completion
    before = int.from_bytes(mem[0x600:0x608], "little")
    assert int.from_bytes(out["mem"][0x600:0x608], "little") == (before + 5 + 7) & M64
    acks = [(Op(m["opcode"]).name, m["psn"], m["orig"]) for m, _ in out["tx"]
            if m["opcode"] in (Op.ATOMIC_ACKNOWLEDGE.value,)]
    assert acks == [("ATOMIC_ACKNOWLEDGE", 14, before), ("ATOMIC_ACKNOWLEDGE", 14, before),
                    ("ATOMIC_ACKNOWLEDGE", 15, (before + 5) & M64)]
    reads = [m["psn"] for m, _ in out["tx"] if m["opcode"] == Op.READ_RESPONSE_FIRST.value]
    assert reads == [12, 12]


@pytest.mark.parametrize("seed", [5, 6, 7])
def test_atomic_replay_cache_window(seed):
    """The cache holds the last 16 atomics of a QP: older duplicates are dropped, never
    executed a second time, even while the atomic that took an old one's slot is still in
    the atomic unit (the slot is invalidated as it is taken; seeds vary the timing)."""
    items = [event(0, QpState.RTS, 0)]
    ops = [pkt(Op.FETCH_ADD, 0, i, va=0x600, rkey=K0, swap_add=1) for i in range(20)]
    items += ops + [ops[3], ops[4], ops[19], ops[8]]     # 3 is too old; 4, 19, 8 are cached
    mem = init_mem()
    out = run(items, mem=mem, bp=True, seed=seed)
    before = int.from_bytes(mem[0x600:0x608], "little")
    assert int.from_bytes(out["mem"][0x600:0x608], "little") == (before + 20) & M64
    assert out["dups"] == 4 and out["replays"] == 3
    replayed = [(m["psn"], m["orig"]) for m, _ in out["tx"]][20:]
    assert replayed == [(4, before + 4), (19, before + 19), (8, before + 8)]


def test_one_nak_per_sequence_gap():
    """After a PSN sequence NAK, later out-of-sequence packets are dropped silently until the
    expected PSN arrives (then a new gap gets a new NAK). An RNR NAK counts as such a NAK."""
    items = [event(0, QpState.RTS, 0)]
    items += [pkt(Op.WRITE_ONLY, 0, p, b"a", ackreq=1, va=0, rkey=K0, dma_len=1) for p in (0, 2, 3, 4)]
    items += [pkt(Op.WRITE_ONLY, 0, p, b"b", ackreq=1, va=1, rkey=K0, dma_len=1) for p in (1, 2, 4, 5)]
    # RNR: SEND with an empty receive queue, then packets behind it are dropped silently
    items += [pkt(Op.SEND_ONLY, 0, 3, b"c", ackreq=1), pkt(Op.WRITE_ONLY, 0, 4, b"d", ackreq=1,
                                                              va=2, rkey=K0, dma_len=1)]
    out = run(items, bp=True, seed=8)
    assert naks(out) == [(1, 0x60), (3, 0x60), (3, RNR)]
    assert out["seq_drops"] == 2 + 1 + 1 and out["dups"] == 0


def test_acks_are_coalesced_while_tx_waits():
    """Positive ACKs of one QP queued behind a busy transmitter are replaced by the newest
    one; NAKs and READ/atomic responses are never coalesced."""
    items = [event(0, QpState.RTS, 0), event(1, QpState.RTS, 0)]
    items += [pkt(Op.WRITE_ONLY, 0, p, b"a", ackreq=1, va=0, rkey=K0, dma_len=1) for p in range(6)]
    items += [pkt(Op.WRITE_ONLY, 1, 0, b"a", ackreq=1, va=0, rkey=K0, dma_len=1)]
    items += [pkt(Op.WRITE_ONLY, 0, p, b"a", ackreq=1, va=0, rkey=K0, dma_len=1) for p in range(6, 9)]
    out = run(items, seed=9, tx_hold=800)
    got = [(m["dest_qpn"], m["psn"]) for m, _ in out["tx"]]
    # the first ACK was offered on tx already; 1..4 coalesced into 5; QP 1; 6, 7 into 8
    assert got == [(0x100, 0), (0x100, 5), (0x101, 0), (0x100, 8)]
    assert out["coalesced"] == 6


# ---------------------------------------------------------------------------------------
# the host failing the responder's DMA (docs/errors.md)

def sim_fail(items, fail, seed=5, bp=True):
    mem0 = init_mem()
    # a failed READ packet's payload is drained from the ring silently (one beat a cycle):
    # up to a few hundred cycles pass before the QP error request
    out = simulate(CFG, expand_events(items), default_qps(), default_mrs(), bytearray(mem0),
                   bp=bp, seed=seed, fail=fail, quiet_end=400)
    out["mem0"] = mem0
    return out


def test_payload_write_failure():
    """The host fails a WRITE's payload write: the ACK becomes a NAK (remote operational
    error) at that PSN, sent only after the write was answered, and the QP goes to ERR; a
    SEND's receive completes with LOC_PROT_ERR. The packets before are acknowledged."""
    BAD = 0x600
    fail = lambda a, n, w: w and a <= BAD < a + n
    items = [event(0, QpState.RTS, 10)] + wr(10, va=0x40, n=8) + wr(11, va=BAD, n=16)
    out = sim_fail(items, fail)
    assert naks(out) == [(11, 0x63)]
    assert [m["psn"] for m, _ in out["tx"] if m["syndrome"] == ACK] == [10]
    assert out["errs"] == [0]
    assert out["mem"][BAD:BAD + 16] == out["mem0"][BAD:BAD + 16]
    items = [event(0, QpState.RTS, 10), post(0, 0, 0x77, BAD, 128, K0, 1),
             pkt(Op.SEND_ONLY, 0, 10, rnd(40, 1), ackreq=1)]
    out = sim_fail(items, fail)
    assert naks(out) == [(10, 0x63)] and out["errs"] == [0]
    assert [(c["wr_id"], c["status"]) for c in out["cqes"]] == [(0x77, WcStatus.LOC_PROT_ERR.value)]


def test_mr_lookup_failure():
    """The MR cache cannot read an entry from ICM (its lookup answers err, with the good
    entry's bits on data): the key counts as invalid. A WRITE's rkey and a READ's rkey draw a
    remote access error NAK, a receive WQE's lkey LOC_PROT_ERR; nothing is written."""
    mem0 = init_mem()
    for items, want in (
            ([event(0, QpState.RTS, 10), pkt(Op.WRITE_ONLY, 0, 10, rnd(16, 2), ackreq=1, va=0x40,
                                             rkey=K0, dma_len=16)], [(10, 0x62)]),
            ([event(0, QpState.RTS, 10), pkt(Op.READ_REQUEST, 0, 10, va=0x40, rkey=K0, dma_len=8)],
             [(10, 0x62)]),
            ([event(0, QpState.RTS, 10), post(0, 0, 0x77, 0x100, 128, K0, 1),
              pkt(Op.SEND_ONLY, 0, 10, rnd(40, 3), ackreq=1)], [(10, 0x63)])):
        out = simulate(CFG, expand_events(items), default_qps(), default_mrs(), bytearray(mem0),
                       bp=True, seed=2, mr_fail={0})
        assert naks(out) == want and out["errs"] == [0]
        assert out["mem"][:0x3000] == mem0[:0x3000]       # (the receive rings start at 0x3000)
        assert [c["status"] for c in out["cqes"]] == ([WcStatus.LOC_PROT_ERR.value]
                                                    if want == [(10, 0x63)] else [])
    # the same requests with the lookup answering: no NAK (the bench itself is sound)
    out = simulate(CFG, expand_events(items), default_qps(), default_mrs(), bytearray(mem0),
                   bp=True, seed=2)
    assert naks(out) == [] and out["errs"] == []


def test_read_data_failure():
    """The host fails the read of a READ's second response packet: the first is sent, then a
    NAK (remote operational error) at the failed packet's PSN, nothing more of that READ; the
    QP goes to ERR."""
    fail = lambda a, n, w: not w and a <= 0x300 < a + n
    items = [event(0, QpState.RTS, 10),
             pkt(Op.READ_REQUEST, 0, 10, va=0x200, rkey=K0, dma_len=600)]
    out = sim_fail(items, fail)
    ops = [(Op(m["opcode"]).name, m["psn"], m["syndrome"]) for m, _ in out["tx"]]
    assert ops == [("READ_RESPONSE_FIRST", 10, ACK), ("ACKNOWLEDGE", 11, 0x63)]
    assert out["tx"][0][1] == out["mem0"][0x200:0x300]
    assert out["errs"] == [0]


def test_receive_wqe_and_atomic_failures():
    """The host fails the read of a receive WQE: NAK (remote operational error), the receive
    completes with LOC_QP_OP_ERR (its wr_id unknown: 0). It fails an atomic's read: NAK,
    nothing written."""
    rq = default_qps()[0]["ctx"]["rq_base"]
    fail = lambda a, n, w: (not w and a == rq) or (not w and a == 0x400)
    items = [event(0, QpState.RTS, 10), post(0, 0, 0x55, 0x800, 128, K0, 1),
             pkt(Op.SEND_ONLY, 0, 10, rnd(16, 2), ackreq=1)]
    out = sim_fail(items, fail)
    assert naks(out) == [(10, 0x63)] and out["errs"] == [0]
    assert [(c["wr_id"], c["status"]) for c in out["cqes"]] == [(0, WcStatus.LOC_QP_OP_ERR.value)]
    items = [event(0, QpState.RTS, 20),
             pkt(Op.FETCH_ADD, 0, 20, va=0x400, rkey=K0, swap_add=5)]
    out = sim_fail(items, fail)
    assert naks(out) == [(20, 0x63)] and out["errs"] == [0]
    assert not any(m["opcode"] == Op.ATOMIC_ACKNOWLEDGE.value for m, _ in out["tx"])
    assert out["mem"][0x400:0x408] == out["mem0"][0x400:0x408]


# ---------------------------------------------------------------------------------------
# atomics in flight (hw/rnic/atomic.py: several at once, serialised per address)

def test_atomics_overlap_their_dma_latency():
    """16 FETCH_ADDs on 16 addresses over four QPs, with a 40-cycle host round trip: with
    four atomics in flight the responder waits for the host about once per four atomics,
    with one (atomic_inflight=1) once per atomic (a read and a write round trip each). The
    responses and memory are the model's (sequential execution) either way."""
    qs = (0, 1, 3, 3)                  # QP 2 grants no remote atomics
    items = [event(q, QpState.RTS, 0) for q in (0, 1, 3)]
    psn = {q: 0 for q in qs}
    for k in range(16):
        q = qs[k % 4]
        items.append(pkt(Op.FETCH_ADD, q, psn[q], va=0x600 + 8 * k, rkey=K0, swap_add=k + 1))
        psn[q] += 1
    cycles = {}
    for inflight in (1, 4):
        out = run(items, cfg=replace(CFG, atomic_inflight=inflight), rd_latency=40)
        cycles[inflight] = out["first_tx"], out["cycles"]
        assert sum(m["opcode"] == Op.ATOMIC_ACKNOWLEDGE.value for m, _ in out["tx"]) == 16
    assert cycles[1][1] > 16 * 80, cycles
    assert 2 * cycles[4][1] < cycles[1][1], cycles


@pytest.mark.parametrize("bp", [False, True])
def test_write_and_read_after_atomic_keep_order(bp):
    """Requests of one QP after an atomic still in flight, on its address: a READ returns
    what the atomic wrote, a WRITE lands after it (the model executes them in order; its
    memory and READ responses are the reference). Atomics of other QPs on one address are
    serialised (each sees the previous one's result). (A request *after a READ* may execute
    before the READ's data is read, as IBA 9.5 allows: the READs here have addresses of
    their own.)"""
    items = [event(0, QpState.RTS, 0), event(1, QpState.RTS, 0), event(3, QpState.RTS, 0)]
    psn = 0
    for rep in range(3):
        a, b = 0x600 + 16 * rep, 0x608 + 16 * rep
        items += [pkt(Op.FETCH_ADD, 0, psn, va=a, rkey=K0, swap_add=5),
                  pkt(Op.READ_REQUEST, 0, psn + 1, va=a, rkey=K0, dma_len=8),
                  pkt(Op.FETCH_ADD, 0, psn + 2, va=b, rkey=K0, swap_add=3),
                  pkt(Op.WRITE_ONLY, 0, psn + 3, rnd(8, rep), ackreq=1, va=b, rkey=K0,
                      dma_len=8)]
        items += [pkt(Op.COMPARE_SWAP, 1, 2 * rep, va=0x700, rkey=K0, compare=0, swap_add=9),
                  pkt(Op.FETCH_ADD, 3, rep, va=0x700, rkey=K0, swap_add=1),
                  pkt(Op.FETCH_ADD, 1, 2 * rep + 1, va=0x700, rkey=K0, swap_add=1)]
        psn += 4
    run(items, bp=bp, seed=3, rd_latency=30)


def test_write_of_another_qp_passes_atomics_in_flight():
    """Ordering is per QP (IBA 9.5): a WRITE of QP 1 behind two atomics of QP 0 lands while
    they are still waiting for the (slow) host; a WRITE of QP 0 behind them lands after their
    writes. Memory and responses are the model's."""
    items = [event(0, QpState.RTS, 0), event(1, QpState.RTS, 0)]
    items += [pkt(Op.FETCH_ADD, 0, 0, va=0x600, rkey=K0, swap_add=5),
              pkt(Op.COMPARE_SWAP, 0, 1, va=0x608, rkey=K0, compare=0, swap_add=7),
              pkt(Op.WRITE_ONLY, 1, 0, rnd(8, 1), ackreq=1, va=0x800, rkey=K0, dma_len=8),
              pkt(Op.WRITE_ONLY, 0, 2, rnd(8, 2), ackreq=1, va=0x808, rkey=K0, dma_len=8)]
    out = run(items, rd_latency=60)
    at = {a: c for c, a, n in out["writes"] if a in (0x600, 0x608)}
    w = {a: c for c, a, n in out["writes"] if a in (0x800, 0x808)}
    assert 0x600 in at and set(w) == {0x800, 0x808}, out["writes"]
    assert w[0x800] < min(at.values()), out["writes"]          # QP 1: not held
    assert w[0x808] > max(at.values()), out["writes"]          # QP 0: after its atomics


def test_failed_atomic_among_several_in_flight():
    """Three atomics of three QPs in flight; the host fails the read of the middle one: only
    its QP gets the NAK (remote operational error) and goes to ERR; the others are
    acknowledged with their original values and applied."""
    fail = lambda a, n, w: not w and a == 0x608
    items = [event(q, QpState.RTS, 0) for q in (0, 1, 3)]
    items += [pkt(Op.FETCH_ADD, q, 0, va=0x600 + 8 * i, rkey=K0, swap_add=1 + i)
              for i, q in enumerate((0, 1, 3))]
    out = sim_fail(items, fail, bp=False)
    assert naks(out) == [(0, 0x63)] and out["errs"] == [1]
    acks = [(m["dest_qpn"], m["orig"]) for m, _ in out["tx"]
            if m["opcode"] == Op.ATOMIC_ACKNOWLEDGE.value]
    mem0 = out["mem0"]
    orig = [int.from_bytes(mem0[0x600 + 8 * i:0x608 + 8 * i], "little") for i in (0, 2)]
    assert sorted(o for _, o in acks) == sorted(orig) and len(acks) == 2
    for i in (0, 2):
        assert int.from_bytes(out["mem"][0x600 + 8 * i:0x608 + 8 * i], "little") == \
            (int.from_bytes(mem0[0x600 + 8 * i:0x608 + 8 * i], "little") + 1 + i) % (1 << 64)
    assert out["mem"][0x608:0x610] == mem0[0x608:0x610]
