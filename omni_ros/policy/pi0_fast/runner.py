"""The eager PyTorch runner of pi0-FAST: the KV-cached greedy decode loop, then the FAST detokenizer.

`sample` returns the decoded, still normalized chunk (the processor un-normalizes it), the generated tokens of
each row up to its end marker as `action_tokens` (for debugging a policy), and its timings: `prefill_ms` (image
tokens, prefix and first token: the time to first token, also `time_to_first_token_ms`), `decode_ms` (the other
tokens) and `tokens_per_s` (decode-phase rate, tokens after the first per second).
"""

from __future__ import annotations

from typing import cast

import numpy as np
import torch
from torch import nn

from omni_ros.policy.inputs import ModelInputs
from omni_ros.policy.pi0_fast.fast import FastDetokenizer
from omni_ros.policy.pi0_fast.modeling import Generated, Pi0FastModel
from omni_ros.policy.pi0_fast.processing import RTC_REASON
from omni_ros.policy.pipeline import Sampled
from omni_ros.policy.precision import PrecisionChoice
from omni_ros.policy.rtc import RtcError, RtcPlan
from omni_ros.policy.torch_runner import TorchRunner, compact


class Pi0FastTorchRunner(TorchRunner):
    rtc_methods: tuple[str, ...] = ()
    stages_compilable = False  # a token decoder, no denoising step
    rtc_refusal = RTC_REASON  # why `control.blending: rtc` is refused at configure

    def __init__(
        self,
        model: nn.Module,
        detokenizer: FastDetokenizer,
        device: str = "cpu",
        dtype: str = "float32",
        cpu_linear: str = "dense",
        precision: PrecisionChoice | None = None,
        cache_dir: str | None = None,
        label: str = "model",
        compile: bool = False,
        source: str | None = None,
    ) -> None:
        super().__init__(
            model,
            device,
            dtype,
            cpu_linear=cpu_linear,
            precision=precision,
            cache_dir=cache_dir,
            label=label,
            compile=compile,
            source=source,
        )
        self.detokenizer = detokenizer

    def sample(
        self, inputs: ModelInputs, noise: torch.Tensor | None, num_steps: int | None, rtc: RtcPlan | None = None
    ) -> Sampled:
        if rtc is not None:
            raise RtcError(f"real-time chunking does not apply: {RTC_REASON}")
        generated = self.generate(inputs)
        return decoded(self.detokenizer, generated.tokens, generated.prefill_ms, generated.decode_ms)

    def generate(self, inputs: ModelInputs) -> Generated:
        """The token loop alone, as `sample` runs it (not detokenized), like the exported runners' `generate`."""
        model = cast(Pi0FastModel, self.model)
        # The decode steps on the torch threads their timing chose, as the flow families' denoising steps: one
        # token a step is a row of products that a second thread of passive waiting can slow down.
        run_step = self.step_threads.step if self.step_threads is not None else None
        with torch.inference_mode():
            return model.generate(compact(inputs) if self.compact else inputs, sync=self._sync, run_step=run_step)


def decoded(detokenizer: FastDetokenizer, generated: torch.Tensor, prefill_ms: float, decode_ms: float) -> Sampled:
    """Generated tokens (B, n) -> what every pi0-FAST runner returns: the FAST-decoded normalized chunks, each
    row's tokens up to its end marker as `action_tokens`, and the decoder's timings."""
    cfg = detokenizer.cfg
    tokens = generated.cpu().numpy()
    chunks, extras = [], []
    for row in tokens:
        ids = row.tolist()
        cut = ids.index(cfg.end_id) + 1 if cfg.end_id in ids else len(ids)
        extras.append({"action_tokens": np.asarray(ids[:cut], dtype=np.int64)})
        chunks.append(detokenizer.decode(ids, cfg.action_horizon, cfg.action_dim))
    steps = tokens.shape[1]
    decode_s = decode_ms / 1e3
    stage_ms = {
        "prefill_ms": prefill_ms,
        "decode_ms": decode_ms,
        "time_to_first_token_ms": prefill_ms,
        "tokens_per_s": (steps - 1) / decode_s if steps > 1 and decode_s > 0 else 0.0,
        "decode_steps": float(steps),
    }
    return Sampled(np.stack(chunks).astype(np.float32), stage_ms, extras)
