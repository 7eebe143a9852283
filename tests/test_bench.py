"""sim/bench.py's pure-Python parts: the occupancy table that locates the peak's bound."""

from hw.regmap import Counter
from sim.bench import OCCUPANCY, SEND_WAITS, STALLS, occupancy


def test_occupancy_names_real_counters():
    names = {c.name for c in Counter}
    assert set(OCCUPANCY.values()) <= names
    assert set(SEND_WAITS.values()) <= names and set(STALLS.values()) <= names


def test_occupancy_shares():
    c = {name: 0 for name in OCCUPANCY.values()}
    a = dict(c, BUSY_REQ_SEND=800, BUSY_RSP=250, TX_BEATS=1000)
    occ = occupancy({"a": a, "b": dict(c, BUSY_RSP=900)}, 1000, n_pus=4)
    # the requester's engines are summed over its units: 800 of 4 x 1000 unit-cycles
    assert occ["a"]["req_send"] == 0.2
    assert occ["a"]["responder"] == 0.25 and occ["a"]["tx_link"] == 1.0
    assert occ["b"]["responder"] == 0.9 and occ["b"]["req_resp"] == 0.0
