# rnic-model: two commands on a fresh machine, `make install` then `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
EXP    ?= demo

.PHONY: install test test-slow sim synth bench clean

install:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install -e .

# two workers (the machines this runs on have 2 cores), a file at a time: tests/conftest.py
JOBS ?= 2
test:
	$(PY) -m pytest -m "not slow" -q -n $(JOBS) --dist loadfile --no-loadscope-reorder

test-slow:
	$(PY) -m pytest -m slow -q

# make sim EXP=<name> [KEY=value ...]: every variable given on the command line is passed on
# Variables given on the command line, passed on as KEY=value.
CMDLINE_VARS = $(foreach v,$(filter-out EXP,$(.VARIABLES)),$(if $(filter command line,$(origin $(v))),$(v)=$($(v))))

sim:
	$(PY) -m sim.run $(EXP) $(CMDLINE_VARS)

synth:
	$(PY) -m fpga.synth --preset $(or $(PRESET),small) --top $(or $(TOP),system)

bench:
	$(PY) -m sim.bench $(CMDLINE_VARS)

clean:
	rm -rf build results
