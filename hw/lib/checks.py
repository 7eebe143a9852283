"""Parameter checks shared by the RTL blocks: a bad value raises ``ValueError`` naming the
parameter and its allowed range, before any logic is built."""

__all__ = ["check_int", "check_pow2", "check_number"]


def check_int(name, value, lo, hi):
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise ValueError(f"{name} must be an integer in [{lo}, {hi}], not {value!r}")


def check_pow2(name, value, lo, hi):
    if (not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi
            or value & (value - 1)):
        raise ValueError(f"{name} must be a power of two in [{lo}, {hi}], not {value!r}")


def check_number(name, value, lo, hi):
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not lo <= value <= hi:
        raise ValueError(f"{name} must be a number in [{lo}, {hi}], not {value!r}")
