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

test:
	$(PY) -m pytest -m "not slow" -q

test-slow:
	$(PY) -m pytest -m slow -q

# make sim EXP=<name> [KEY=value ...]: every variable given on the command line is passed on
sim:
	$(PY) -m sim.run $(EXP) $(foreach v,$(filter-out EXP,$(.VARIABLES)),$(if $(filter command line,$(origin $(v))),$(v)=$($(v))))

synth:
	$(PY) -m fpga.synth

bench:
	$(PY) -m sim.bench

clean:
	rm -rf build results
