"""How far omni_ros's actions are from LeRobot 0.6.1's on every committed reference fixture (eager, float32).

    .venv/bin/python bench/lerobot_agreement.py [--out bench/results/lerobot_agreement.json]

The fixtures (test/fixtures/reference, `make reference-fixtures`) are tiny random LeRobot / openpi pi0, pi0.5 and
SmolVLA checkpoints with LeRobot's own actions for fixed observations and noise. Each case is loaded with
`omni_ros.policy.load` and run with the case's noise; the report holds the max abs difference (robot units) per
case, per fixture and over all of them (the figure README quotes).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from common import emit

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "test" / "fixtures" / "reference"
IMAGE_PREFIX = "observation/observation.images."


def case_observation(info: dict[str, Any], case: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
    """The case's raw robot observation under the policy's camera names (openpi's fixed ones for openpi)."""
    to_openpi = {v: k for k, v in info.get("cameras_openpi_to_lerobot", {}).items()}
    present = case.get("present_cameras")
    images = {}
    for key, value in data.items():
        feature = key[len("observation/") :]
        if key.startswith(IMAGE_PREFIX) and (present is None or feature in present):
            images[to_openpi.get(feature, feature.removeprefix("observation.images."))] = value
    return {"images": images, "state": data["observation/observation.state"], "prompt": case["prompt"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args(argv)

    import numpy as np
    import torch
    from safetensors.torch import load_file

    import omni_ros.policy

    torch.set_num_threads(1)
    manifest = json.loads((REFERENCE / "manifest.json").read_text())
    # openpi folders ship no tokenizer: the tests give them the pi0 fixture's, and so does this.
    tokenizer = REFERENCE / "pi0_3cam" / "tokenizer.json"
    fixtures: dict[str, Any] = {}
    for name, info in manifest["fixtures"].items():
        policy = omni_ros.policy.load(
            REFERENCE / info.get("path", name), tokenizer=tokenizer if info["layout"] == "openpi" else None
        )
        cases = {}
        for case_name, case in info["cases"].items():
            data = {k: v.numpy() for k, v in load_file(str(REFERENCE / case["file"])).items()}
            out = policy.infer(case_observation(info, case, data), noise=data["noise"][0])["actions"]
            cases[case_name] = float(np.abs(out - data["actions"][0]).max())
        fixtures[name] = {"family": info["family"], "layout": info["layout"], "max_abs": max(cases.values())}
        fixtures[name]["cases"] = cases
    report = {
        "benchmark": "lerobot_agreement",
        "reference": manifest["generator"],
        "backend": "torch-cpu float32 (eager)",
        "fixtures": fixtures,
        "max_abs_over_all": max(f["max_abs"] for f in fixtures.values()),
        "cases": sum(len(f["cases"]) for f in fixtures.values()),
    }
    emit(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
