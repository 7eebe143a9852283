"""Test drivers shared by the per-element array tests (tests/hw/test_reg_array.py,
tests/hw/test_mem_array.py)."""


def drive_random_writes(ctx, dut, ports, rng, n, p_write, width):
    """Drive every write port of ``dut`` for one cycle: enabled with probability ``p_write``,
    half the time at one of the first three elements (so that two ports often hit one
    element), data random over ``width`` bits. Returns the enabled ``(addr, value)`` pairs
    in port order (a later port wins)."""
    writes = []
    for p in ports:
        port = getattr(dut, p)
        en = rng.random() < p_write
        addr = rng.randrange(min(n, 3)) if rng.random() < 0.5 else rng.randrange(n)
        val = rng.randrange(1 << width)
        ctx.set(port.en, en)
        ctx.set(port.addr, addr)
        ctx.set(port.data, val)
        if en:
            writes.append((addr, val))
    return writes
