#!/usr/bin/env bash
# Creates (once) the venv that holds the real LeRobot, used only to produce reference fixtures and the LeRobot
# side of benchmarks. It is never the product venv: LeRobot 0.6.1 needs Python >= 3.12 and torch < 2.12.
#   LEROBOT_VENV   where the venv lives (default .venv-lerobot in the repo root)
#   LEROBOT_PYTHON the Python 3.12 interpreter (default: pyenv's 3.12.1)
set -euo pipefail

LEROBOT_VERSION="0.6.1"
VENV="${LEROBOT_VENV:-.venv-lerobot}"

if "$VENV/bin/python" - "$LEROBOT_VERSION" 2>/dev/null <<'PY'
import sys
import lerobot, transformers, tokenizers  # noqa: F401  (the extras pi / smolvla pull transformers)
import datasets, av  # noqa: F401  (the dataset extra: LeRobotDataset's loader and its PyAV decoder)
sys.exit(0 if lerobot.__version__ == sys.argv[1] else 1)
PY
then
    echo "LeRobot $LEROBOT_VERSION already in $VENV"
    exit 0
fi

PYTHON="${LEROBOT_PYTHON:-}"
if [ -z "$PYTHON" ]; then
    if ! command -v pyenv >/dev/null 2>&1; then
        echo "error: pyenv not found; set LEROBOT_PYTHON to a Python 3.12 interpreter" >&2
        exit 1
    fi
    PYTHON="$(pyenv prefix 3.12.1)/bin/python"
fi
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] < (3, 12))' 2>/dev/null; then
    echo "error: $PYTHON is not Python >= 3.12 (LeRobot $LEROBOT_VERSION needs it)" >&2
    exit 1
fi

echo "creating $VENV with $PYTHON and installing lerobot[pi,smolvla,dataset]==$LEROBOT_VERSION (about 5 GB, a few minutes)"
"$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
"$VENV/bin/python" -m pip install --quiet "lerobot[pi,smolvla,dataset]==$LEROBOT_VERSION"
"$VENV/bin/python" -c "import lerobot; print('installed LeRobot', lerobot.__version__)"
