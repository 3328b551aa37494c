# The two commands of README.md. Both set everything up first (idempotent:
# seconds when nothing changed), then run.
VENV ?= .venv
DURATION ?= 30
# The simulator of `make demo`: planar (the fast default) or so101 (the SO-101 arm in MuJoCo).
SIM ?= planar

.PHONY: setup demo test lint bench

setup:
	bash scripts/setup.sh

# The main job on the built-in default: the whole stack on the simulated robot.
demo: setup
	$(VENV)/bin/omni-ros up --sim $(SIM) --duration $(DURATION)

# The whole test suite (what CI runs).
test: setup
	$(VENV)/bin/python -m pytest

lint: setup
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .
