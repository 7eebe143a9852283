"""AnswerPorts (hw/lib/answer_ports.py): every answer reaches its client exactly once and
in the cycle it arrives when the client is ready, a client that is not ready holds no
other client's answer, one request outstanding per client, parameters checked."""

import random

import pytest
from amaranth.lib import data
from amaranth.sim import Simulator

from hw.lib.answer_ports import AnswerPorts

LAYOUT = data.StructLayout({"v": 16})


def run(n, rounds, seed, p_ready):
    """Clients ask whenever free; a model block answers each request 1 to 6 cycles later,
    in any order, on the shared stream (plus stray answers for id n, to be dropped).
    Returns per client the (cycle, value) answers it took, the requests it made, and the
    cycles at which an answer arrived and was taken at once."""
    dut = AnswerPorts(LAYOUT, n, 4)
    rng = random.Random(seed)
    got = [[] for _ in range(n)]
    asked = [[] for _ in range(n)]
    same_cycle = []

    async def tb(ctx):
        pending = []            # (due cycle, client, value)
        seq = 0
        for cycle in range(rounds):
            free = ctx.get(dut.free)
            taken = 0
            for k in range(n):
                if (free >> k) & 1 and rng.random() < 0.5:
                    taken |= 1 << k
                    pending.append((cycle + rng.randint(1, 6), k, seq))
                    asked[k].append(seq)
                    seq += 1
            ctx.set(dut.taken, taken)
            due = [p for p in pending if p[0] <= cycle]
            ans = rng.choice(due) if due else None
            stray = ans is None and rng.random() < 0.2
            if ans is not None:
                pending.remove(ans)
                ctx.set(dut.i.payload, {"id": ans[1], "data": {"v": ans[2]}})
            elif stray:
                ctx.set(dut.i.payload, {"id": n, "data": {"v": 0xFFFF}})
            ctx.set(dut.i.valid, ans is not None or stray)
            readies = [rng.random() < p_ready for _ in range(n)]
            for k in range(n):
                ctx.set(dut.o[k].ready, readies[k])
            samples = await ctx.tick().sample(dut.i.ready, *[x for o in dut.o
                                                             for x in (o.valid, o.payload)])
            assert samples[2] == 1                      # the shared stream is always ready
            for k in range(n):
                valid, payload = samples[3 + 2 * k], samples[4 + 2 * k]
                if valid and readies[k]:
                    got[k].append(int(payload.v))
                    if ans is not None and ans[1] == k and int(payload.v) == ans[2]:
                        same_cycle.append(cycle)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()
    return got, asked, same_cycle


@pytest.mark.parametrize("seed", range(4))
def test_each_answer_once_to_its_client(seed):
    n = 3
    got, asked, _ = run(n, 600, seed, p_ready=0.4)
    for k in range(n):
        # one outstanding request per client: answers come in the order asked; at most
        # the last request is still unanswered when the run stops
        assert got[k] == asked[k][:len(got[k])] and len(asked[k]) - len(got[k]) <= 1
        assert len(got[k]) > 20


def test_ready_client_gets_its_answer_in_the_arrival_cycle():
    got, asked, same = run(2, 300, 7, p_ready=1.0)
    assert len(same) == sum(map(len, got)) > 50


@pytest.mark.parametrize("kw, msg", [
    (dict(n=0), r"n must be an integer in \[1, 64\], not 0"),
    (dict(n=4, id_bits=1), r"id_bits must be an integer in \[2, 16\], not 1"),
])
def test_bad_parameters(kw, msg):
    args = dict(layout=LAYOUT, n=2, id_bits=4)
    args.update(kw)
    with pytest.raises(ValueError, match=msg):
        AnswerPorts(**args)
