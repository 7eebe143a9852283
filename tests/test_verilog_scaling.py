"""The node's logic does not grow with the number of QPs (issue 8: "no logic that is
replicated per QP and evaluated every cycle"; docs/performance.md, "scaling").

Per-QP state lives in memories (rows), read and written at a few indices. What may grow with
``n_qps`` is storage and its initialisation (one ``mem[i] = ...`` line per element in an
``initial`` block, run once) and the width of QP numbers, not the number of statements: a
per-QP register vector written at a variable index, for example, would add about 2.5 lines
per QP and write port (Amaranth lowers such a write into one case per bit), and a scan over
the QPs one or more lines per QP.
"""

import re

from amaranth.back import verilog

from hw.config import preset
from hw.rnic import Rnic

INITIAL = re.compile(r"^\s*initial begin\n.*?^\s*end\n", re.M | re.S)


def logic_lines(text):
    """Lines of Verilog outside the ``initial`` blocks (memory initialisation)."""
    return len(INITIAL.sub("", text).splitlines())


def test_logic_lines_do_not_grow_with_n_qps():
    small, large = (logic_lines(verilog.convert(
        Rnic(preset("connectx6").replace(nic__n_qps=n).nic), name="node", emit_src=False))
        for n in (64, 256))
    # 192 QPs more: one per-QP vector with one write port would add about 480 lines
    assert abs(large - small) <= 48, (small, large)
