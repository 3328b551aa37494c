#!/usr/bin/env bash
# Creates (once) the venv that holds LeRobot 0.3.3, the last release before the processor pipelines, used only to
# produce the legacy-checkpoint fixtures (test/fixtures/legacy). It is never the product venv nor the 0.6.1 one.
#   LEROBOT03_VENV   where the venv lives (default .venv-lerobot03 in the repo root)
#   LEROBOT_PYTHON   the Python 3.12 interpreter (default: pyenv's 3.12.1)
set -euo pipefail

LEROBOT_VERSION="0.3.3"
VENV="${LEROBOT03_VENV:-.venv-lerobot03}"

if "$VENV/bin/python" - "$LEROBOT_VERSION" 2>/dev/null <<'PY'
import sys
import lerobot, transformers, pytest  # noqa: F401
from importlib.metadata import version
ok = version("lerobot") == sys.argv[1] and transformers.__version__ == "4.52.4"
sys.exit(0 if ok else 1)
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
    echo "error: $PYTHON is not Python >= 3.12" >&2
    exit 1
fi

# As pip resolves the extras, 0.3.3 gets transformers 4.51.3, with which its pi0 cannot run ("'GemmaForCausalLM'
# object has no attribute 'embed_tokens'"): 4.52.4 works, but the extras pin below it, so it goes in as a second
# step over the resolved set (pip then reports the pin it overrode). Its paligemma_with_expert.py imports pytest.
echo "creating $VENV with $PYTHON and installing lerobot[pi0,smolvla]==$LEROBOT_VERSION (about 6.5 GB, a few minutes)"
"$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
"$VENV/bin/python" -m pip install --quiet "lerobot[pi0,smolvla]==$LEROBOT_VERSION"
"$VENV/bin/python" -m pip install --quiet "transformers==4.52.4" pytest
"$VENV/bin/python" -c "from importlib.metadata import version; print('installed LeRobot', version('lerobot'))"
