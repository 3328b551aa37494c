"""What every exported-program backend (ExecuTorch .pte, ONNX folder) shares: the policy around its runner.

The sidecar carries the model config, norm stats and tokenizer file, so the processor is the very one the
eager policy of the same checkpoint uses, and the noise the pipeline draws for a seed is the same too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from omni_ros.policy import families
from omni_ros.policy.methods import SampleFn, StagePlan
from omni_ros.policy.pipeline import InferencePipeline, Runner
from omni_ros.policy.rtc import RtcPlan, per_token_times, rtc_sample
from omni_ros.policy.sampler import euler_sample
from omni_ros.policy.tokenizer import make_tokenizer


def exported_policy(
    sidecar: Any,
    runner: Runner,
    base_dir: Path,
    *,
    fused: bool,
    seed: int | None,
    num_steps: int | None,
    name: str | None,
    domain_id: int | None = None,
) -> InferencePipeline:
    """The pipeline of an exported program: the family's processor (tokenizer file beside the program).
    `domain_id` (policy.domain_id) is the embodiment of an observation without one (X-VLA programs, which take
    the domain as an input); None: the checkpoint's saved default."""
    cfg = sidecar.model
    if domain_id is not None:
        try:
            cfg = with_domain(cfg, domain_id, base_dir)
        except ValueError:
            close = getattr(runner, "close", None)  # the loaded program is not kept by a policy that fails
            if close is not None:
                close()
            raise
    tokenizer_cfg = cfg.tokenizer
    if sidecar.tokenizer_file:
        tokenizer_cfg = type(tokenizer_cfg)(tokenizer_cfg.kind, sidecar.tokenizer_file, tokenizer_cfg.max_tokens)
    tokenizer = make_tokenizer(tokenizer_cfg, base_dir=base_dir)
    # The family (pi0, smolvla, ...) the program was exported from picks its processor.
    processor = families.get(sidecar.family).build_processor(cfg, sidecar.norm_stats, tokenizer)
    steps = num_steps or (sidecar.num_steps if fused else cfg.num_steps)
    return InferencePipeline(processor, runner, num_steps=steps, seed=seed, name=name or sidecar.name)


def with_domain(cfg: Any, domain_id: int, source: Path) -> Any:
    """`cfg` with its default domain set, refused (as the eager loader refuses it) where the model has no such
    domain or no domains at all."""
    from dataclasses import replace

    from omni_ros.typed_config import ConfigError

    domains = getattr(getattr(cfg, "head", None), "num_domains", None)
    if domains is None:
        raise ConfigError(f"{source}: policy.domain_id is for cross-embodiment (X-VLA) programs only")
    if not 0 <= int(domain_id) < domains:
        raise ConfigError(f"{source}: policy.domain_id {domain_id} is not one of its domains 0..{domains - 1}")
    return replace(cfg, domain_id=int(domain_id))


def takes_per_token_times(sidecar: Any) -> bool:
    """Whether the exported denoise_step takes times per action token (B, H): a model trained with
    training-time RTC, whose clean prefix has t = 0; otherwise one time per sample (B,)."""
    step = sidecar.methods.get("denoise_step")
    times = [s for s in step.inputs if s.name == "t"] if step is not None else []
    return bool(times) and len(times[0].shape) == 2


def staged_sampler(
    plan: StagePlan,
    cfg: Any,
    noise: torch.Tensor,
    num_steps: int,
    rtc: RtcPlan | None,
    *,
    per_token: bool,
    guided: bool,
) -> SampleFn:
    """The sampler a runtime hands its family's `run_staged`: plain Euler steps, or real-time chunking around the
    exported denoise_step (hard inpainting; guided with the exported guided step where `guided`). A model trained
    with training-time RTC takes per-token times (`per_token`). A family whose step is no velocity (X-VLA) brings
    its own (`StagePlan.sampler`)."""
    if plan.sampler is not None:
        return plan.sampler(cfg, noise, num_steps, rtc)
    horizon = cfg.action_horizon

    def sample(velocity, guided_call) -> torch.Tensor:
        def denoise(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
            return velocity(x, per_token_times(t, horizon, per_token))

        def guided_step(x, t, target, weights, weight):
            return guided_call(x, per_token_times(t, horizon, per_token), target, weights, weight)

        if rtc is None or rtc.target is None:  # (runners refuse a plan without its target before sampling)
            return euler_sample(denoise, noise, num_steps, getattr(cfg, "euler_time", "exact"))
        # An exported guided step is the only gradient here: there is no eager autograd to fall back on.
        clean = getattr(cfg, "rtc_max_delay", 0) > 0
        step = guided_step if guided else None
        return rtc_sample(denoise, noise, num_steps, rtc.target, rtc.request, clean, guided_step=step)

    return sample
