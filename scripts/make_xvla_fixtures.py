"""Tiny X-VLA reference fixtures made by LeRobot 0.6.1 itself (DESIGN.md 8d), offline.

Runs in the LeRobot venv (`make reference-fixtures`):

    /work/venv-lerobot/bin/python scripts/make_xvla_fixtures.py --out test/fixtures/reference

Each fixture is a folder LeRobot's `save_pretrained` wrote (config.json with the Florence-2 config inline,
model.safetensors, processor files, the tiny BART-shaped tokenizer.json this script makes) and cases run
observation -> LeRobot preprocessor -> XVLAPolicy.predict_action_chunk -> postprocessor. LeRobot draws the
flow-matching noise inside `generate_actions` (it ignores a `noise` argument): each case seeds the global
generator, records the draw it will make, and checks that the model's first step saw exactly that noise.
LeRobot takes the domain only from its preprocessor's saved step: a second domain is run by setting that step.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import lerobot
import make_reference_fixtures as ref  # installs the local-tokenizer stand-in inside LeRobot's tokenizer step
import numpy as np
import tokenizers
import torch
import transformers
from lerobot.configs import FeatureType, PolicyFeature
from lerobot.policies import factory as policy_factory
from lerobot.policies.utils import prepare_observation_for_inference
from lerobot.policies.xvla.configuration_xvla import XVLAConfig
from lerobot.policies.xvla.modeling_xvla import XVLAPolicy
from lerobot.policies.xvla.processor_xvla import XVLAAddDomainIdProcessorStep, make_xvla_pre_post_processors
from safetensors.torch import load_file, save_file

MANIFEST = "xvla.json"
BART_NAME = "facebook/bart-large"  # LeRobot's default tokenizer_name for X-VLA
BART_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>"]  # BART's ids 0..3
CAMERAS = [
    ("observation.images.top", 48, 64),
    ("observation.images.wrist", 40, 40),
    ("observation.images.side", 60, 44),
]


def bart_like_tokenizer() -> transformers.PreTrainedTokenizerFast:
    """A byte-level BPE with BART's special tokens and its `<s> ... </s>` template, trained on the tiny corpus."""
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=BART_SPECIALS,
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([ref.CORPUS] * 4, trainer=trainer)
    tok.post_processor = tokenizers.processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", 0), ("</s>", 2)]
    )
    return ref.wrap_tokenizer(
        tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>", padding_side="right"
    )


def florence_config(vocab: int, remote_form: bool) -> dict:
    """A tiny Florence-2 (two DaViT stages, a 2-layer BART): the remote-code form checkpoints carry, or native."""
    vision = {
        "depths": [1, 1],
        "patch_size": [7, 3],
        "patch_stride": [4, 2],
        "patch_padding": [3, 1],
        "patch_prenorm": [False, True],
        "num_heads": [2, 4],
        "num_groups": [2, 4],
        "window_size": 3,
        "drop_path_rate": 0.0,
        "projection_dim": 32,
    }
    if remote_form:
        vision.update(
            model_type="davit",
            dim_embed=[16, 32],
            image_pos_embed={"type": "learned_abs_2d", "max_pos_embeddings": 16},
            visual_temporal_embedding={"type": "COSINE", "max_temporal_embeddings": 4},
            image_feature_source=["spatial_avg_pool", "temporal_avg_pool"],
        )
    else:
        vision.update(embed_dim=[16, 32], max_position_embeddings=16, max_temporal_embeddings=4)
    text = {
        "vocab_size": vocab,
        "d_model": 32,
        "encoder_layers": 2,
        "decoder_layers": 1,
        "encoder_attention_heads": 2,
        "decoder_attention_heads": 2,
        "encoder_ffn_dim": 64,
        "decoder_ffn_dim": 64,
        "max_position_embeddings": 128,
        "dropout": 0.0,
        "attention_dropout": 0.0,
        "activation_dropout": 0.0,
        "scale_embedding": False,
        "pad_token_id": 1,
        "bos_token_id": 0,
        "eos_token_id": 2,
    }
    if remote_form:
        text["model_type"] = "florence2_language"
    return {"vision_config": vision, "text_config": text, "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2}


@dataclass
class XCase:
    name: str
    prompt: str
    present: list[str]
    obs_seed: int
    noise_seed: int
    domain_id: int


@dataclass
class XSpec:
    name: str
    num_cameras: int
    state_dim: int
    action_dim: int
    action_mode: str
    remote_form: bool
    weight_seed: int
    saved_domain: int
    extra: dict = field(default_factory=dict)
    cases: list[XCase] = field(default_factory=list)


def specs() -> list[XSpec]:
    top, wrist, side = (c[0] for c in CAMERAS)
    one = XSpec("xvla_1cam", 1, 20, 20, "ee6d", True, 11, saved_domain=1)
    one.cases = [
        XCase("pick_domain1", "pick up the red cube", [top], 1, 101, 1),
        XCase("pick_domain2", "pick up the red cube", [top], 1, 101, 2),
        XCase("stack_domain1", "stack the blue block on the green one", [top], 2, 102, 1),
    ]
    three = XSpec("xvla_3cam", 3, 8, 7, "auto", False, 12, saved_domain=0, extra={"use_hetero_proj": True})
    three.cases = [
        XCase("all_domain0", "open the drawer", [top, wrist, side], 3, 103, 0),
        XCase("all_domain2", "open the drawer", [top, wrist, side], 3, 103, 2),
        XCase("missing_wrist", "put the cup inside", [top, side], 4, 104, 0),
        XCase("missing_top", "push the button", [wrist, side], 5, 105, 0),
    ]
    return [one, three]


def randomize(policy: XVLAPolicy, seed: int) -> None:
    """Every parameter drawn afresh (LeRobot's init leaves LayerNorms at 1/0 and biases and soft prompts near 0,
    which would hide wrong offsets and scales), small enough that the tiny model stays well conditioned."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(policy.named_parameters()):
            if p.ndim == 1 and ("norm" in name or "layernorm" in name) and name.endswith("weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            else:
                fan_in = p.shape[-1] if p.ndim > 1 else 8
                p.copy_(torch.randn(p.shape, generator=gen) / max(fan_in, 8) ** 0.5)


def build(spec: XSpec, out: Path, tok) -> tuple[XVLAPolicy, object, object, Path]:
    folder = out / spec.name
    if folder.exists():
        import shutil

        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    tok.save_pretrained(str(folder))
    ref._LocalAutoTokenizer.folders[BART_NAME] = folder
    inputs = {k: PolicyFeature(type=FeatureType.VISUAL, shape=(3, h, w)) for k, h, w in CAMERAS[: spec.num_cameras]}
    inputs["observation.state"] = PolicyFeature(type=FeatureType.STATE, shape=(spec.state_dim,))
    outputs = {"action": PolicyFeature(type=FeatureType.ACTION, shape=(spec.action_dim,))}
    config = XVLAConfig(
        input_features=inputs,
        output_features=outputs,
        device="cpu",
        florence_config=florence_config(len(tok), spec.remote_form),
        tokenizer_name=BART_NAME,
        hidden_size=32,
        depth=2,
        num_heads=2,
        num_domains=3,
        len_soft_prompts=4,
        dim_time=8,
        max_len_seq=256,
        action_mode=spec.action_mode,
        resize_imgs_with_padding=(40, 48),
        **spec.extra,
    )
    with ref.quiet():
        policy = XVLAPolicy(config)
    randomize(policy, spec.weight_seed)
    pre, post = make_xvla_pre_post_processors(config, dataset_stats=None)
    for step in pre.steps:
        if isinstance(step, XVLAAddDomainIdProcessorStep):
            step.domain_id = spec.saved_domain
    with ref.quiet():
        policy.save_pretrained(str(folder))
    pre.save_pretrained(str(folder))
    post.save_pretrained(str(folder))
    saved = load_file(str(folder / "model.safetensors"))
    with ref.quiet():
        policy = XVLAPolicy.from_pretrained(str(folder))
    policy.eval()
    pre, post = policy_factory.make_pre_post_processors(policy.config, pretrained_path=str(folder))
    ref.assert_same_weights(saved, policy, spec.name)
    return policy, pre, post, folder


def observation(seed: int, cameras, state_dim: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    obs = {key: rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8) for key, h, w in cameras}
    obs["observation.state"] = rng.normal(0.0, 1.0, state_dim).astype(np.float32)
    return obs


def run(policy, pre, post, obs: dict, prompt: str, noise_seed: int, domain: int) -> dict[str, torch.Tensor]:
    for step in pre.steps:
        if isinstance(step, XVLAAddDomainIdProcessorStep):
            step.domain_id = domain
    policy.reset()
    frame = prepare_observation_for_inference(
        {k: v.copy() for k, v in obs.items()}, torch.device("cpu"), task=prompt, robot_type=""
    )
    batch = pre(frame)
    shape = (1, policy.config.chunk_size, policy.model.dim_action)
    noise = torch.randn(shape, generator=torch.Generator().manual_seed(noise_seed))
    seen: list[torch.Tensor] = []
    orig = policy.model.transformer.forward

    def forward(**kwargs):
        seen.append(kwargs["action_with_noise"].detach().clone())
        return orig(**kwargs)

    policy.model.transformer.forward = forward
    torch.manual_seed(noise_seed)  # the one draw generate_actions makes is `noise`
    try:
        normalized = policy.predict_action_chunk(batch)
    finally:
        del policy.model.transformer.forward
    _, expected_first = policy.model.action_space.preprocess(torch.zeros(1, 32), noise.clone())
    assert torch.equal(seen[0], expected_first), "the captured noise is not the draw LeRobot made"
    actions = post(normalized.clone())
    images, masks = policy._prepare_images(batch)
    tensors = {f"observation/{k}": torch.from_numpy(np.ascontiguousarray(v)) for k, v in obs.items()}
    tensors.update(
        noise=noise,
        actions=actions.float().contiguous(),
        domain_id=torch.tensor([domain]),
        **{
            "debug/images": images.float().contiguous(),
            "debug/image_masks": masks.contiguous(),
            "debug/tokens": batch["observation.language.tokens"].to(torch.int64).contiguous(),
            "debug/actions_normalized": normalized.float().contiguous(),
        },
    )
    return tensors


def write(out: Path, threads: int) -> dict:
    torch.set_num_threads(threads)
    tok = bart_like_tokenizer()
    (out / "cases").mkdir(parents=True, exist_ok=True)
    for old in (out / "cases").glob("xvla_*.safetensors"):
        old.unlink()
    fixtures = {}
    for spec in specs():
        t0 = time.perf_counter()
        policy, pre, post, folder = build(spec, out, tok)
        cameras = CAMERAS[: spec.num_cameras]
        entries = {}
        for case in spec.cases:
            obs = observation(case.obs_seed, [c for c in cameras if c[0] in case.present], spec.state_dim)
            tensors = run(policy, pre, post, obs, case.prompt, case.noise_seed, case.domain_id)
            fname = f"cases/{spec.name}__{case.name}.safetensors"
            save_file(tensors, str(out / fname))
            entries[case.name] = {
                "file": fname,
                "prompt": case.prompt,
                "present_cameras": case.present,
                "domain_id": case.domain_id,
                "tensors": ref.describe(tensors),
            }
        fixtures[spec.name] = {
            "layout": "lerobot",
            "family": "xvla",
            "path": spec.name,
            "cameras": [c[0] for c in cameras],
            "state_dim": spec.state_dim,
            "action_dim": spec.action_dim,
            "action_mode": spec.action_mode,
            "florence_config_form": "remote-code" if spec.remote_form else "native",
            "saved_domain_id": spec.saved_domain,
            "param_count": sum(p.numel() for p in policy.parameters()),
            "files": sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()),
            "cases": entries,
        }
        print(f"  {spec.name}: {len(spec.cases)} cases in {time.perf_counter() - t0:.1f} s", flush=True)
    doc = {
        "format": 1,
        "generator": {
            "script": "scripts/make_xvla_fixtures.py",
            "lerobot": lerobot.__version__,
            "torch": torch.__version__.split("+")[0],
            "transformers": transformers.__version__,
            "threads": threads,
        },
        "pipeline": (
            "prepare_observation_for_inference(obs, cpu, task=prompt) -> preprocessor (its xvla_add_domain_id step "
            "set to the case's domain) -> XVLAPolicy.predict_action_chunk(batch) after torch.manual_seed(noise_seed)"
            " -> postprocessor; noise = randn((1, chunk, dim_action), Generator(noise_seed)), checked against the "
            "first transformer call"
        ),
        "fixtures": fixtures,
    }
    (out / MANIFEST).write_text(json.dumps(doc, indent=1) + "\n")
    return doc


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("test/fixtures/reference"))
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    t0 = time.perf_counter()
    write(args.out.resolve(), args.threads)
    print(f"done in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
