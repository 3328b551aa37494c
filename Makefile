# The two commands of README.md. Both set everything up first (idempotent:
# seconds when nothing changed), then run.
VENV ?= .venv
DURATION ?= 30
# The simulator of `make demo`: planar (the fast default) or so101 (the SO-101 arm in MuJoCo).
SIM ?= planar

.PHONY: setup jazzy-venv demo test test-avx2 lint bench reference-fixtures

setup:
	bash scripts/setup.sh

# The main job on the built-in default: the whole stack on the simulated robot.
demo: setup
	$(VENV)/bin/omni-ros up --sim $(SIM) --duration $(DURATION)

# The ROS 2 Jazzy robot of test/test_jazzy_interop.py: its own Python 3.12 venv of Jazzy wheels, never the
# product venv (about 50 s the first time, then instant; without a Python 3.12 it warns and the test skips).
JAZZY_VENV ?= .venv-jazzy
jazzy-venv:
	JAZZY_VENV=$(JAZZY_VENV) bash scripts/jazzy_venv.sh

# The whole test suite (what CI runs). A worker that dies (a test past its timeout, a crash) is not replaced:
# pytest-xdist's per-module scheduling sent the dead worker's test to the other one and then waited forever for
# work no worker held; this way the run ends, naming the test.
PYTEST ?= $(VENV)/bin/python -m pytest -n 2 --max-worker-restart=0
test: setup jazzy-venv
	OMNI_ROS_JAZZY_VENV=$(JAZZY_VENV) $(PYTEST)

# The whole suite as an AVX2-only CPU computes it (CI machines differ: some have no AVX-512 and no int8 dot
# product), on any x86 machine: oneDNN and ATen held to AVX2, the hardware read as AVX2-only (test/conftest.py).
test-avx2: setup jazzy-venv
	ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 OMNI_ROS_TEST_HARDWARE=avx2 \
		OMNI_ROS_JAZZY_VENV=$(JAZZY_VENV) $(PYTEST)

lint: setup
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check . && $(VENV)/bin/python -m mypy

# Reference outputs of the real LeRobot 0.6.1 (pi0, pi0.5, SmolVLA) for the checkpoint-loading tests, and what LeRobot
# reads from `omni-ros dataset export` (plus a tiny dataset LeRobot wrote) for the dataset tests. LeRobot lives
# in its own venv (Python 3.12, never the product venv); the fixtures are committed, so only regenerating needs it.
LEROBOT_VENV ?= .venv-lerobot
# Checkpoints saved before LeRobot 0.4 (statistics inside the weights) come from LeRobot 0.3.3 in a venv of its own.
LEROBOT03_VENV ?= .venv-lerobot03

reference-fixtures: setup
	LEROBOT_VENV=$(LEROBOT_VENV) bash scripts/lerobot_venv.sh
	$(LEROBOT_VENV)/bin/python scripts/make_reference_fixtures.py --out test/fixtures/reference
	$(LEROBOT_VENV)/bin/python scripts/make_reference_fixtures.py --out test/fixtures/reference --pi0fast-only
	$(LEROBOT_VENV)/bin/python scripts/make_xvla_fixtures.py --out test/fixtures/reference
	$(LEROBOT_VENV)/bin/python scripts/make_dataset_fixtures.py --out test/fixtures/dataset
	LEROBOT03_VENV=$(LEROBOT03_VENV) bash scripts/lerobot03_venv.sh
	$(LEROBOT03_VENV)/bin/python scripts/make_legacy_fixtures.py --out test/fixtures/legacy
	for f in pi0_legacy smolvla_legacy; do \
		$(VENV)/bin/omni-ros checkpoint migrate test/fixtures/legacy/$$f --out test/fixtures/legacy/$${f}_migrated --force; \
	done
	$(LEROBOT_VENV)/bin/python scripts/make_legacy_fixtures.py --verify-migrated test/fixtures/legacy
