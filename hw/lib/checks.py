"""Parameter checks shared by the RTL blocks: a bad value raises ``ValueError`` naming the
parameter and its allowed range, before any logic is built."""

__all__ = ["check_int", "check_pow2", "check_number", "check_choice", "check_mtu"]


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


def check_choice(name, value, choices):
    if isinstance(value, bool) or value not in choices:
        listed = ", ".join(str(c) for c in choices)
        raise ValueError(f"{name} must be one of {listed}, not {value!r}")


#: The path MTUs of IBA vol. 1 rel. 1.4, 9.4 (RoCE uses the same values).
MTUS = (256, 512, 1024, 2048, 4096)


def check_mtu(mtu):
    check_choice("mtu", mtu, MTUS)
