# The two commands of README.md. Both set everything up first (idempotent:
# seconds when nothing changed), then run.
VENV ?= .venv
DURATION ?= 30

.PHONY: setup demo test lint bench

setup:
	bash scripts/setup.sh

# The main job on the built-in default: the whole stack on the simulated robot.
demo: setup
	$(VENV)/bin/omni-ros up --sim --duration $(DURATION)

# The whole test suite (what CI runs).
test: setup
	$(VENV)/bin/python -m pytest

lint: setup
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .
