"""Lint of the generated Verilog for what Verilator gets wrong (docs/architecture.md,
"Conventions inside the RTL").

A signal (or a slice of one) driven by a non-zero constant alone becomes an ``always @*``
block without inputs, which Verilator never evaluates: the Verilator model sees 0 where
Amaranth's simulator sees the constant, so unit tests pass and the system hangs.
"""

import re

from amaranth.back import verilog

from hw.config import preset
from hw.rnic import Rnic

# "always @*" followed by one assignment of a constant (a slice or the whole signal)
CONST_ALWAYS = re.compile(
    r"^\s*always @\*\s*\n\s*(\\?\S+?)\s*(\[[0-9:]+\])?\s*=\s*[0-9]+'[hbd]([0-9a-fA-F_xz]+);",
    re.M)


def constant_only_blocks(text):
    """``[(signal, slice, value)]`` of every input-less always block with a non-zero constant."""
    return [(m.group(1), m.group(2) or "", m.group(3)) for m in CONST_ALWAYS.finditer(text)
            if set(m.group(3)) - {"0", "_"}]


def test_lint_finds_the_pattern():
    text = ("  always @*\n    dma__req__payload[80:64] = 17'h00020;\n"
            "  always @*\n    x[3:0] = 4'h0;\n")
    assert constant_only_blocks(text) == [("dma__req__payload", "[80:64]", "00020")]


def test_node_has_no_constant_only_block():
    text = verilog.convert(Rnic(preset("small").nic), name="node")
    assert "always @*" in text
    assert constant_only_blocks(text) == []
