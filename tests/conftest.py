"""Shared pytest set-up.

Amaranth warns (UnusedElaboratable) when an Elaboratable is created but never elaborated,
which is exactly what a constructor that rejects a bad parameter does. Those tests are meant
to create unused objects, so the warning is silenced for the test session.
"""

from amaranth.hdl import Elaboratable

Elaboratable._MustUse__silence = True
