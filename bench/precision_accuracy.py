"""How far each `policy.precision` moves a policy's actions from float32's, on every committed LeRobot fixture.

    .venv/bin/python bench/precision_accuracy.py [--precisions bf16 int8] [--int8-kernel onednn] [--out FILE]

For each fixture of test/fixtures/reference (tiny random-weight pi0 / pi0.5 / SmolVLA folders written by LeRobot
0.6.1, each case with LeRobot's noise): the relative L2 distance of the chunk from the float32 chunk, max over the
fixture's cases, and float32's max abs difference from LeRobot's actions. test/test_precision_accuracy.py
asserts the bounds (bf16 1%, int8 4%, float32 1e-4); this writes the figures docs/precision.md quotes.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
from common import cpu_facts, emit

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "test" / "fixtures" / "reference"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--precisions", nargs="+", default=["bf16", "int8"])
    parser.add_argument("--int8-kernel", default="onednn", help="policy.int8_kernel of the int8 rows")
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args()

    import torch

    sys.path.insert(0, str(ROOT / "test"))
    from test_reference_checkpoints import MANIFEST, TOKENIZER, observation, tensors

    import omni_ros.policy

    torch.set_num_threads(1)
    report: dict[str, Any] = {"benchmark": "precision_accuracy", "machine": cpu_facts(), "fixtures": {}}
    for fixture, info in MANIFEST["fixtures"].items():
        tokenizer = TOKENIZER if info["layout"] == "openpi" else None
        policies = {
            p: omni_ros.policy.load(
                REFERENCE / fixture, tokenizer=tokenizer, precision=p, int8_kernel=args.int8_kernel, cpu_linear="packed"
            )
            for p in ["fp32", *args.precisions]
        }
        row: dict[str, Any] = {"family": info["family"], "layout": info["layout"], "cases": len(info["cases"])}
        worst = dict.fromkeys(policies, 0.0)
        for case in info["cases"]:
            data, obs = tensors(fixture, case), observation(fixture, case)
            out = {p: pol.infer(obs, noise=data["noise"][0])["actions"] for p, pol in policies.items()}
            worst["fp32"] = max(worst["fp32"], float(np.abs(out["fp32"] - data["actions"][0]).max()))
            for p in args.precisions:
                rel = float(np.linalg.norm(out[p] - out["fp32"]) / np.linalg.norm(out["fp32"]))
                worst[p] = max(worst[p], rel)
        row["fp32_max_abs_vs_lerobot"] = worst["fp32"]
        for p in args.precisions:
            row[f"{p}_rel_l2_vs_fp32"] = round(worst[p], 5)
            row[f"{p}_described"] = policies[p].metadata.precision
        report["fixtures"][fixture] = row
        print(f"[accuracy] {fixture}: {json.dumps(row)}", file=sys.stderr, flush=True)
    report["max"] = {
        key: max(r[key] for r in report["fixtures"].values())
        for key in ["fp32_max_abs_vs_lerobot", *(f"{p}_rel_l2_vs_fp32" for p in args.precisions)]
    }
    emit(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
