"""What every exported-program backend (ExecuTorch .pte, ONNX folder) shares: the policy around its runner.

The sidecar carries the model config, norm stats and tokenizer file, so the processor is the very one the
eager policy of the same checkpoint uses, and the noise the pipeline draws for a seed is the same too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omni_ros.policy import families
from omni_ros.policy.pipeline import InferencePipeline, Runner
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
) -> InferencePipeline:
    """The pipeline of an exported program: the family's processor (tokenizer file beside the program)."""
    cfg = sidecar.model
    tokenizer_cfg = cfg.tokenizer
    if sidecar.tokenizer_file:
        tokenizer_cfg = type(tokenizer_cfg)(tokenizer_cfg.kind, sidecar.tokenizer_file, tokenizer_cfg.max_tokens)
    tokenizer = make_tokenizer(tokenizer_cfg, base_dir=base_dir)
    # The family (pi0, smolvla, ...) the program was exported from picks its processor.
    processor = families.get(sidecar.family).build_processor(cfg, sidecar.norm_stats, tokenizer)
    steps = num_steps or (sidecar.num_steps if fused else cfg.num_steps)
    return InferencePipeline(processor, runner, num_steps=steps, seed=seed, name=name or sidecar.name)
