"""DmaReadMerge and DmaWriteMerge (hw/lib/dma_merge.py) against a model: every input gets the
data and answers of its own requests, in its order, whatever the back-pressure; writes are
never interleaved; ``depth`` bounds what is outstanding."""

import random

import pytest
from amaranth.sim import Simulator

from hw.lib.dma_merge import DmaReadMerge, DmaWriteMerge

W = 8


def run_reads(n, depth, seed, n_reqs=12, p_ready=0.6):
    rng = random.Random(seed)
    dut = DmaReadMerge(W, n, depth)
    # per input: (addr, len, tag)
    reqs = [[(k << 20 | i << 8, rng.randint(1, 4 * W), rng.randrange(1 << 16))
             for i in range(n_reqs)] for k in range(n)]
    got = [[] for _ in range(n)]        # per input: (tag, [data of each beat])
    most = [0]

    async def tb(ctx):
        pos = [0] * n
        offering = [False] * n
        queue = []                      # host side: requests taken, in order
        beat = 0                        # next beat of queue[0]
        delay = 0
        cur = [[] for _ in range(n)]
        for _ in range(4000):
            for k in range(n):
                if not offering[k] and pos[k] < n_reqs and rng.random() < 0.5:
                    offering[k] = True
                ctx.set(dut.i[k].req.valid, offering[k])
                if offering[k]:
                    a, ln, t = reqs[k][pos[k]]
                    ctx.set(dut.i[k].req.payload, {"addr": a, "len": ln, "tag": t})
                ctx.set(dut.i[k].rd.ready, rng.random() < p_ready)
            ctx.set(dut.o.req.ready, rng.random() < 0.7)
            # host: answers in request order, a few cycles after the request
            answering = bool(queue) and delay == 0 and rng.random() < 0.8
            if answering:
                a, ln, t = queue[0]
                nbeats = (ln + W - 1) // W
                ctx.set(dut.o.rd.valid, 1)
                ctx.set(dut.o.rd.payload, {"data": a + beat, "nbytes": W, "tag": t,
                                           "last": beat == nbeats - 1, "err": 0})
            else:
                ctx.set(dut.o.rd.valid, 0)
            vals = [dut.o.req.valid, dut.o.req.ready, dut.o.req.payload,
                    dut.o.rd.valid, dut.o.rd.ready, dut.outstanding]
            for k in range(n):
                vals += [dut.i[k].req.valid, dut.i[k].req.ready,
                         dut.i[k].rd.valid, dut.i[k].rd.ready, dut.i[k].rd.payload]
            _, _, ov, ordy, op, rv, rrdy, outst, *iv = await ctx.tick().sample(*vals)
            most[0] = max(most[0], outst)
            if ov and ordy:
                queue.append((int(op.addr), int(op.len), int(op.tag)))
                delay = rng.randint(1, 3) if len(queue) == 1 else delay
            for k in range(n):
                v, r, dv, dr, dp = iv[5 * k:5 * k + 5]
                if v and r:
                    pos[k] += 1
                    offering[k] = False
                if dv and dr:
                    cur[k].append(int(dp.data))
                    if dp.last:
                        got[k].append((int(dp.tag), cur[k]))
                        cur[k] = []
            if rv and rrdy:
                a, ln, t = queue[0]
                beat += 1
                if beat == (ln + W - 1) // W:
                    queue.pop(0)
                    beat = 0
                    delay = rng.randint(0, 3)
            elif delay:
                delay -= 1
            if all(len(g) == n_reqs for g in got):
                break

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()
    for k in range(n):
        exp = [(t, [a + b for b in range((ln + W - 1) // W)]) for a, ln, t in reqs[k]]
        assert got[k] == exp, f"input {k}"
    return most[0]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_read_merge_each_input_gets_its_data(seed):
    run_reads(3, 8, seed)


def test_read_merge_depth_bounds_outstanding():
    # a slow consumer: requests pile up until the FIFO of sources is full, never beyond
    assert run_reads(2, 2, 7, p_ready=0.2) <= 2


def test_read_merge_one_input():
    run_reads(1, 4, 5)


def run_writes(n, depth, seed, n_writes=10):
    rng = random.Random(seed)
    dut = DmaWriteMerge(W, n, depth)
    writes = [[(rng.randrange(1 << 16), rng.randint(1, 4)) for _ in range(n_writes)]
              for _ in range(n)]                  # (tag, beats)
    seen = []                                       # merged beats: (input, write, beat, last)
    done = [[] for _ in range(n)]
    most = [0]

    async def tb(ctx):
        pos = [0] * n
        beat = [0] * n
        offering = [False] * n
        pending = []                                # host: tags of whole writes to answer
        for _ in range(4000):
            for k in range(n):
                if not offering[k] and pos[k] < n_writes and rng.random() < 0.6:
                    offering[k] = True
                ctx.set(dut.i[k].wr.valid, offering[k])
                if offering[k]:
                    t, nb = writes[k][pos[k]]
                    ctx.set(dut.i[k].wr.payload, {"addr": k, "len": nb * W, "tag": t,
                                                  "data": (k << 12) | (pos[k] << 4) | beat[k],
                                                  "nbytes": W, "last": beat[k] == nb - 1})
            ctx.set(dut.o.wr.ready, rng.random() < 0.7)
            answer = bool(pending) and rng.random() < 0.3
            ctx.set(dut.o.done.valid, answer)
            if answer:
                ctx.set(dut.o.done.payload, {"tag": pending[0], "err": 0})
            vals = [dut.o.wr.valid, dut.o.wr.ready, dut.o.wr.payload, dut.outstanding]
            for k in range(n):
                vals += [dut.i[k].wr.valid, dut.i[k].wr.ready, dut.i[k].done.valid,
                         dut.i[k].done.payload]
            _, _, ov, ordy, op, outst, *iv = await ctx.tick().sample(*vals)
            most[0] = max(most[0], outst)
            if answer:
                pending.pop(0)
            if ov and ordy:
                d = int(op.data)
                seen.append((d >> 12, (d >> 4) & 0xFF, d & 0xF, int(op.last)))
                if op.last:
                    pending.append(int(op.tag))
            for k in range(n):
                v, r, dv, dp = iv[4 * k:4 * k + 4]
                if v and r:
                    beat[k] += 1
                    offering[k] = False
                    if beat[k] == writes[k][pos[k]][1]:
                        beat[k] = 0
                        pos[k] += 1
                if dv:
                    done[k].append(int(dp.tag))
            if all(len(d) == n_writes for d in done):
                break

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()
    # a write's beats are consecutive on the merged port, in order
    i = 0
    while i < len(seen):
        k, w, b, _ = seen[i]
        nb = writes[k][w][1]
        assert [s[:3] for s in seen[i:i + nb]] == [(k, w, j) for j in range(nb)]
        assert seen[i + nb - 1][3] == 1
        i += nb
    for k in range(n):
        assert done[k] == [t for t, _ in writes[k]], f"input {k}"
    return most[0]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_write_merge_whole_writes_and_answers(seed):
    run_writes(3, 8, seed)


def test_write_merge_depth_bounds_outstanding():
    assert run_writes(2, 2, 4) <= 2


def test_merge_parameters_checked():
    with pytest.raises(ValueError, match=r"n must be an integer in \[1, 16\], not 0"):
        DmaReadMerge(W, 0)
    with pytest.raises(ValueError, match=r"depth must be a power of two in \[2, 256\], not 3"):
        DmaWriteMerge(W, 2, 3)
