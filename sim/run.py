"""``make sim EXP=<name> [KEY=value ...]``: run one experiment of sim/experiments/.

Each experiment module defines ``PARAMS`` (defaults, which also give the types) and
``run(params) -> summary`` that writes ``results/<name>/``. This entry point parses the
parameters, runs the experiment and prints its targets as a table.
"""

import importlib
import sys

from .experiment import format_table, parse_params


def main(argv):
    if not argv:
        print("usage: python -m sim.run <experiment> [KEY=value ...]")
        return 2
    name, args = argv[0], argv[1:]
    try:
        module = importlib.import_module(f"sim.experiments.{name}")
    except ModuleNotFoundError as e:
        if e.name != f"sim.experiments.{name}":
            raise
        print(f"unknown experiment {name!r}; see sim/experiments/")
        return 2
    params = parse_params(module.PARAMS, args)
    summary = module.run(params)
    print(format_table(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
