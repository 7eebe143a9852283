"""sim/bench.py's pure-Python parts: the occupancy table that locates the peak's bound."""

from hw.regmap import Counter
from sim.bench import OCCUPANCY, QUEUES, SEND_WAITS, STALLS, occupancy, queues


def test_occupancy_names_real_counters():
    names = {c.name for c in Counter}
    assert set(OCCUPANCY.values()) <= names
    assert set(SEND_WAITS.values()) <= names and set(STALLS.values()) <= names
    assert {n for pair in QUEUES.values() for n in pair if n} <= names


def test_occupancy_shares():
    c = {name: 0 for name in OCCUPANCY.values()}
    a = dict(c, BUSY_REQ_SEND=800, BUSY_RSP=250, TX_BEATS=1000)
    occ = occupancy({"a": a, "b": dict(c, BUSY_RSP=900)}, 1000, n_pus=4)
    # the requester's engines are summed over its units: 800 of 4 x 1000 unit-cycles
    assert occ["a"]["req_send"] == 0.2
    assert occ["a"]["responder"] == 0.25 and occ["a"]["tx_link"] == 1.0
    assert occ["b"]["responder"] == 0.9 and occ["b"]["req_resp"] == 0.0


def test_queues_by_littles_law():
    c = {name: 0 for pair in QUEUES.values() for name in pair if name}
    # 1,000 cycles, 200 operations, 50 WQE fetches: 10 READs outstanding on average -> 50
    # cycles each; 2 batches in flight -> 40 cycles per fetch; the empty queues left out
    a = dict(c, Q_REQ_RD_OUT=10_000, Q_REQ_FETCH=2_000, RD_WQE_REQS=50)
    q = queues({"a": a, "b": dict(c, Q_RSP_QUEUE=500)}, 1000, 200)
    assert q["a"] == {"rd_outstanding": {"mean": 10.0, "cycles_each": 50.0},
                      "fetch_batches": {"mean": 2.0, "cycles_each": 40.0}}
    assert q["b"] == {"rsp_queue": {"mean": 0.5, "cycles_each": 2.5}}
