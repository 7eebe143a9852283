"""The experiment convention shared by every ``make sim EXP=<name>``.

An experiment writes ``results/<name>/`` with CSV data, PNG plots and ``summary.json``::

    {"experiment": name, "commit": git commit, "config": {...},
     "targets": [{"name", "paper", "model", "unit", "tolerance", "met", "kind"}],
     "sim": {"cycles", "wall_s", "cycles_per_s"}}

and prints its targets as a table, the paper's value beside the model's. A target is met
when the model is within ``tolerance`` (relative) of the paper, or, for a boolean target,
when the model is true. A missed target is reported as missed: nothing is scaled to fit.
A target whose figure a parameter was fitted to says so (``kind`` ``"calibration"``), and the
table prints it beside every target.
"""

import dataclasses
import json
import pathlib
import subprocess

__all__ = ["Target", "results_dir", "git_commit", "write_summary", "format_table", "parse_params"]

ROOT = pathlib.Path(__file__).resolve().parent.parent


KINDS = ("prediction", "calibration")


@dataclasses.dataclass
class Target:
    """One figure of the model beside the paper's.

    ``kind``: ``"prediction"`` (nothing in the model was chosen to reach it) or
    ``"calibration"`` (a parameter was fitted to this figure, so meeting it shows that the fit
    holds, not that the model predicts it). Anything else is a ``ValueError``.
    """
    name: str
    paper: object
    model: object
    unit: str = ""
    tolerance: float = 0.1
    note: str = ""
    kind: str = "prediction"

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, not {self.kind!r}")

    @property
    def met(self):
        """True / False; ``None`` when there is no published figure (reported only)."""
        if self.paper is None:          # no published figure for this setting
            return None
        if isinstance(self.paper, bool):
            return bool(self.model)
        if self.model is None:
            return False
        return abs(float(self.model) - float(self.paper)) <= self.tolerance * abs(float(self.paper))

    def as_dict(self):
        d = {"name": self.name, "paper": self.paper, "model": self.model, "unit": self.unit,
             "tolerance": self.tolerance, "met": self.met, "kind": self.kind}
        if self.note:
            d["note"] = self.note
        return d


HOSTS = ("python", "rtl")


def system_config(preset_name, host):
    """The preset ``preset_name`` with the host model ``host`` (``HOST=python|rtl``)."""
    from hw.config import preset
    if host not in HOSTS:
        raise ValueError(f"host must be one of {', '.join(HOSTS)}, not {host!r}")
    return preset(preset_name).replace(host__kind=host)


def build_system(cfg, *, fast=False, **kw):
    """Build (or reuse) the two-node system of ``cfg`` under Verilator: ``system_<preset>``
    with the Python host, ``system_<preset>_rtl`` with the RTL host. ``fast``: with the clock
    inside the simulation (``InternalClock(compat=False)``: no Python on any clock edge), as
    full-speed runs (``make bench``, the demo) use; otherwise a cocotb ``Clock`` drives it."""
    from hw.system import TwoNodeSystem
    from sim.verilator import InternalClock, build
    suffix = "" if cfg.host.kind == "python" else f"_{cfg.host.kind}"
    if fast:
        kw["clock"] = InternalClock.from_mhz(cfg.nic.clock_mhz, compat=False)
    return build(TwoNodeSystem(cfg), f"system_{cfg.name}{suffix}", **kw)


def results_dir(name):
    path = ROOT / "results" / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def git_commit():
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True).stdout.strip()
        return out + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def write_summary(name, config, targets, sim, extra=None, system=None):
    """``results/<name>/summary.json``: the commit, the experiment's parameters
    (``config``), every field of the system configuration it ran (``system``, a
    :class:`~hw.config.SystemConfig`: structural constants, latencies, host and link), the
    targets, the simulation's speed and ``extra`` results."""
    import dataclasses
    summary = {
        "experiment": name,
        "commit": git_commit(),
        "config": config,
        "system": dataclasses.asdict(system) if system is not None else None,
        "targets": [t.as_dict() for t in targets],
        "sim": sim,
    }
    if extra:
        summary["extra"] = extra
    path = results_dir(name) / "summary.json"
    path.write_text(json.dumps(summary, indent=2, default=str) + "\n")
    return summary


def _fmt(v):
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def format_table(summary):
    rows = [("target", "paper", "model", "unit", "tolerance", "met", "kind")]
    for t in summary["targets"]:
        rows.append((t["name"], _fmt(t["paper"]), _fmt(t["model"]), t["unit"],
                     f"{t['tolerance']:.0%}" if not isinstance(t["paper"], bool) else "-",
                     "n/a" if t["met"] is None else "yes" if t["met"] else "NO",
                     t.get("kind", "prediction")))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    s = summary["sim"]
    lines.append("")
    lines.append(f"simulated {s['cycles']} cycles in {s['wall_s']:.1f} s "
                 f"({s['cycles_per_s']:.0f} cycles/s), commit {summary['commit']}")
    return "\n".join(lines)


def parse_params(defaults, args):
    """``KEY=value`` strings to a dict, typed like ``defaults``; unknown keys raise ValueError."""
    params = dict(defaults)
    for arg in args:
        key, sep, value = arg.partition("=")
        if not sep:
            raise ValueError(f"parameters are KEY=value, not {arg!r}")
        lk = key.lower()
        if lk not in params:
            raise ValueError(f"unknown parameter {key!r}; known: {sorted(k.upper() for k in params)}")
        default = params[lk]
        if isinstance(default, bool):
            params[lk] = value.lower() in ("1", "true", "yes", "on")
        elif isinstance(default, int):
            params[lk] = int(value, 0)
        elif isinstance(default, float):
            params[lk] = float(value)
        else:
            params[lk] = value
    return params
