"""How far omni_ros's actions are from LeRobot 0.6.1's on every committed reference fixture (eager, float32).

    .venv/bin/python bench/lerobot_agreement.py [--out bench/results/lerobot_agreement.json]
    .venv/bin/python bench/lerobot_agreement.py --rtc [--out bench/results/lerobot_agreement_rtc.json]

The fixtures (test/fixtures/reference, `make reference-fixtures`) are tiny random LeRobot / openpi pi0, pi0.5 and
SmolVLA checkpoints with LeRobot's own actions for fixed observations and noise. Each case is loaded with
`omni_ros.policy.load` and run with the case's noise; the report holds the max abs difference (robot units) per
case, per fixture and over all of them (the figure README quotes).

--rtc: the guided real-time-chunking cases of test/fixtures/reference/rtc.json (LeRobot 0.6.1's own RTCProcessor
on the pi0 and SmolVLA fixtures), run with the mapped `RtcRequest`: ours as served against LeRobot with the
model's Jacobian kept (`actions_guided_vjp`), ours with the model's input detached against LeRobot as shipped
(`actions_guided`, whose correction drops the Jacobian), ours unguided against LeRobot unguided, and the gaps
that show the comparisons can fail (guided - unguided, LeRobot shipped - LeRobot with the Jacobian). Robot units.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Iterator
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


@contextlib.contextmanager
def jacobian_dropped(model: Any) -> Iterator[None]:
    """The model's velocity a constant in x_t (dx0/dx_t = I), what LeRobot 0.6.1's RTCProcessor differentiates."""
    denoise_step = model.denoise_step
    model.denoise_step = lambda cache, mask, state, x, t: denoise_step(cache, mask, state, x.detach(), t)
    try:
        yield
    finally:
        del model.denoise_step


def rtc_agreement(np: Any, load_file: Any) -> dict[str, Any]:
    """Max abs differences per guided-RTC case (see the module docstring); the mapping is docs/rtc.md's."""
    import omni_ros.policy
    from omni_ros.policy.rtc import RtcRequest

    doc = json.loads((REFERENCE / "rtc.json").read_text())
    policies: dict[str, Any] = {}
    cases: dict[str, Any] = {}
    for key, info in sorted(doc["cases"].items()):
        fixture, lr = info["fixture"], info["lerobot"]
        if fixture not in policies:
            policies[fixture] = omni_ros.policy.load(REFERENCE / fixture)
        policy = policies[fixture]
        data = {k: v.numpy() for k, v in load_file(str(REFERENCE / info["file"])).items()}
        saved = {k: v.numpy() for k, v in load_file(str(REFERENCE / info["observation_from"])).items()}
        obs = case_observation({}, {"prompt": info["prompt"]}, saved)
        request = RtcRequest(
            data["prev_actions"],
            inference_delay=lr["inference_delay"],
            execution_horizon=info["chunk_size"] - lr["execution_horizon"],
            schedule=lr["prefix_attention_schedule"].lower(),
            max_guidance_weight=lr["max_guidance_weight"],
            method="guided",
        )
        noise = data["noise"][0]
        unguided = policy.infer(obs, noise=noise)["actions"]
        guided = policy.infer(obs, noise=noise, rtc=request)["actions"]
        with jacobian_dropped(policy.runner.model):
            dropped = policy.infer(obs, noise=noise, rtc=request)["actions"]

        def gap(a: Any, b: Any) -> float:
            return float(np.abs(np.asarray(a) - np.asarray(b)).max())

        cases[key] = {
            "guided_vs_lerobot_jacobian_kept": gap(guided, data["actions_guided_vjp"][0]),
            "guided_jacobian_dropped_vs_lerobot_shipped": gap(dropped, data["actions_guided"][0]),
            "unguided_vs_lerobot_unguided": gap(unguided, data["actions_unguided"][0]),
            "guided_minus_unguided": gap(guided, unguided),
            "lerobot_shipped_minus_jacobian_kept": gap(data["actions_guided"], data["actions_guided_vjp"]),
        }
    agreement = ("guided_vs_lerobot_jacobian_kept", "guided_jacobian_dropped_vs_lerobot_shipped")
    return {
        "reference": doc["generator"],
        "cases": cases,
        "max_abs_over_all": max(c[k] for c in cases.values() for k in (*agreement, "unguided_vs_lerobot_unguided")),
        "min_guided_minus_unguided": min(c["guided_minus_unguided"] for c in cases.values()),
        "min_lerobot_shipped_minus_jacobian_kept": min(
            c["lerobot_shipped_minus_jacobian_kept"] for c in cases.values()
        ),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="also write the JSON here")
    parser.add_argument("--rtc", action="store_true", help="the guided-RTC cases (rtc.json) instead")
    args = parser.parse_args(argv)

    import numpy as np
    import torch
    from safetensors.torch import load_file

    import omni_ros.policy

    torch.set_num_threads(1)
    if args.rtc:
        emit(
            {
                "benchmark": "lerobot_agreement_rtc",
                "backend": "torch-cpu float32 (eager)",
                **rtc_agreement(np, load_file),
            },
            args.out,
        )
        return 0
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
