#!/usr/bin/env python3
"""Legacy-checkpoint fixtures produced by the real LeRobot 0.3.3 (pi0, SmolVLA), the last release before the
processor pipelines: folders of `config.json` + `model.safetensors` with the normalization statistics inside the
weights (`normalize_inputs.buffer_*`, `normalize_targets.*`, `unnormalize_outputs.*`).

Runs in the LeRobot 0.3.3 venv (`make reference-fixtures` creates it with scripts/lerobot03_venv.sh), never in
the product venv, and imports nothing from omni_ros. It builds tiny random policies with non-trivial statistics
(MIN_MAX state, MEAN_STD actions, a camera named `wrist_cam`), saves them with 0.3.3's own `save_pretrained`,
reloads them with its `from_pretrained` and runs fixed observations and noise through its own inference calls
(pi0: `select_action` until the chunk is drained; SmolVLA: `predict_action_chunk`).

0.3.3's pi0 computes in bfloat16. The reference (`actions`) is the same code with its bfloat16 casts turned into
float32 (weights as saved, bf16 values, cast up); the native bf16 actions are kept beside it (`actions_bf16`).

    /work/venv-lerobot03/bin/python scripts/make_legacy_fixtures.py --out test/fixtures/legacy

A second mode runs in the LeRobot 0.6.1 venv on folders `omni-ros checkpoint migrate` wrote, to show that
LeRobot 0.6.1's own `from_pretrained` + `make_pre_post_processors` load them and give the same actions:

    /work/venv-lerobot/bin/python scripts/make_legacy_fixtures.py --verify-migrated test/fixtures/legacy

The tiny tokenizers are the committed ones of test/fixtures/reference (made by make_reference_fixtures.py).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import math
import os
import shutil
import sys
import time
import types
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "test" / "fixtures" / "reference"
PALIGEMMA_TOKENIZER = REFERENCE / "pi0_3cam"  # tokenizer.json + tokenizer_config.json
SMOLVLM_TOKENIZER = REFERENCE / "smolvla_3cam" / "vlm" / "tokenizer.json"
PALIGEMMA_NAME = "google/paligemma-3b-pt-224"
SMOLVLM_DIRNAME = "vlm"

# The sizes of make_reference_fixtures.py's tiny pi0 (so LeRobot 0.6.1 rebuilds the migrated folder with that
# script's patches): VLM width 24, expert 16, 2 layers each, 8 query heads / 1 KV head of 8; SigLIP 32 wide.
PI_VLM = dict(hidden_size=24, intermediate_size=48, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=1,
              head_dim=8)  # fmt: skip
PI_EXPERT = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=8,
                 num_key_value_heads=1, head_dim=8)  # fmt: skip
PI_SIGLIP = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=16, patch_size=8)
PI_IMAGE = 32
SMOL_VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, image_size=32,
                   patch_size=4, layer_norm_eps=1e-6, hidden_act="gelu_pytorch_tanh")  # fmt: skip
SMOL_TEXT = dict(model_type="llama", hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=1, head_dim=8, rms_norm_eps=1e-5, rope_theta=100000.0,
                 max_position_embeddings=512, hidden_act="silu", tie_word_embeddings=False)  # fmt: skip

# (key, height, width) of the frames the robot sends; `wrist_cam` has an underscore (LeRobot's migration script
# turns it into `wrist.cam`), the frames are not square (resize and left/top padding show).
CAMERAS = [("observation.images.top", 48, 64), ("observation.images.wrist_cam", 40, 30)]
SQUARE = [("observation.images.top", 64, 64), ("observation.images.wrist_cam", 32, 32)]
PROMPT = "Pick up the RED cube, then place it on the tray!"
LONG_PROMPT = (
    "Pick up the RED cube and the BLUE block, then open the drawer, put the cup inside, close it, "
    "and push the button twice!"
)

# name -> (frames, present camera keys, prompt, obs seed, noise seed, checked through LeRobot 0.6.1 after migrate)
CASES = {
    "pi0": {
        "all_cameras": (CAMERAS, ["top", "wrist_cam"], PROMPT, 11, 21, False),
        "missing_wrist_cam": (CAMERAS, ["top"], PROMPT, 12, 22, False),
        "long_prompt": (CAMERAS, ["top", "wrist_cam"], LONG_PROMPT, 11, 23, False),
        # Square frames: no padding, where 0.3's left/top and 0.6's centred padding agree (the migrate check).
        "square": (SQUARE, ["top", "wrist_cam"], PROMPT, 13, 24, True),
        "square_missing_top": (SQUARE, ["wrist_cam"], PROMPT, 14, 25, True),
    },
    "smolvla": {
        "all_cameras": (CAMERAS, ["top", "wrist_cam"], PROMPT, 31, 41, True),
        "missing_wrist_cam": (CAMERAS, ["top"], PROMPT, 32, 42, True),
        "long_prompt": (CAMERAS, ["top", "wrist_cam"], LONG_PROMPT, 31, 43, False),
    },
}
# name -> (family, state dim, action dim, chunk_size, n_action_steps, weight seed, stats seed)
FIXTURES = {
    "pi0_legacy": ("pi0", 7, 6, 12, 10, 5000, 500),
    "smolvla_legacy": ("smolvla", 6, 7, 8, 8, 6000, 600),
}
MAPPING = {"VISUAL": "IDENTITY", "STATE": "MIN_MAX", "ACTION": "MEAN_STD"}


@contextlib.contextmanager
def quiet():
    with contextlib.redirect_stdout(io.StringIO()) as buf:
        yield buf


def stats_for(seed: int, state_dim: int, action_dim: int) -> dict[str, dict[str, torch.Tensor]]:
    rng = np.random.default_rng(seed)
    out = {}
    for key, dim in (("observation.state", state_dim), ("action", action_dim)):
        mean, std = rng.normal(0.0, 1.0, dim), rng.uniform(0.2, 2.0, dim)
        low = mean - rng.uniform(1.5, 3.0, dim) * std
        high = mean + rng.uniform(1.5, 3.0, dim) * std
        out[key] = {"mean": mean, "std": std, "min": low, "max": high}
    return {k: {s: torch.tensor(v, dtype=torch.float32) for s, v in d.items()} for k, d in out.items()}


def observation(frames, present: list[str], seed: int, stats) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    obs = {}
    for key, h, w in frames:
        image = rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
        if key.removeprefix("observation.images.") in present:
            obs[key] = image
    s = stats["observation.state"]
    state = s["min"].numpy() + (s["max"] - s["min"]).numpy() * rng.uniform(0.05, 0.95, s["min"].shape)
    obs["observation.state"] = state.astype(np.float32)
    return obs


def randomize_parameters(model: nn.Module, seed: int) -> None:
    """Every parameter drawn again from `seed` (HF leaves RMSNorm weights at zero, which hides conventions)."""
    gen = torch.Generator().manual_seed(seed)
    seen: set[int] = set()
    for mname, mod in model.named_modules():
        cls = type(mod).__name__
        for pname, p in mod.named_parameters(recurse=False):
            if id(p) in seen:
                continue
            seen.add(id(p))
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float64)
            if isinstance(mod, nn.LayerNorm) or cls.endswith("LayerNorm"):
                value = 1 + 0.2 * noise if pname == "weight" else 0.1 * noise
            elif "RMSNorm" in cls and pname == "weight":
                value = 0.2 * noise if cls.startswith("Gemma") else 1 + 0.2 * noise
            elif isinstance(mod, nn.Embedding):
                value = (0.5 if "position" in f"{mname}.{pname}" else 1 / math.sqrt(p.shape[-1])) * noise
            elif p.ndim >= 2:
                value = noise / math.sqrt(int(np.prod(p.shape[1:])))
            else:
                value = 0.1 * noise
            with torch.no_grad():
                p.copy_(value.to(p.dtype))


def to_batch(obs: dict[str, np.ndarray], prompt: str) -> dict:
    """What LeRobot 0.3's robot loop hands the policy: float images (1, 3, H, W) in [0, 1], state (1, D)."""
    batch: dict = {"task": [prompt]}
    for key, value in obs.items():
        t = torch.from_numpy(value.copy())
        batch[key] = (t.permute(2, 0, 1).float() / 255.0)[None] if t.ndim == 3 else t[None]
    return batch


# ----------------------------------------------------------------------------------------------------------------
# LeRobot 0.3.3
# ----------------------------------------------------------------------------------------------------------------


class _Float32Torch(types.ModuleType):
    """`torch` with `bfloat16` meaning float32: swapped into 0.3.3's pi0 modules, its bf16 casts become fp32."""

    def __init__(self) -> None:
        super().__init__("torch")

    def __getattr__(self, name):
        return torch.float32 if name == "bfloat16" else getattr(torch, name)


def install_pi0_patches(tokenizer_dir: Path) -> None:
    from lerobot.policies.pi0 import modeling_pi0, paligemma_with_expert
    from transformers import AutoTokenizer

    original = paligemma_with_expert.PaliGemmaWithExpertConfig
    vocab = len(AutoTokenizer.from_pretrained(str(tokenizer_dir)))

    def tiny_config(**kwargs):
        cfg = original(**kwargs)
        pali = cfg.paligemma_config
        for k, v in PI_VLM.items():
            setattr(pali.text_config, k, v)
        pali.text_config.vocab_size = vocab
        pali._vocab_size = vocab
        pali.image_token_index = vocab - 1
        pali.hidden_size = PI_VLM["hidden_size"]
        pali.projection_dim = PI_VLM["hidden_size"]
        for k, v in PI_SIGLIP.items():
            setattr(pali.vision_config, k, v)
        pali.vision_config.image_size = PI_IMAGE
        pali.vision_config.projection_dim = PI_VLM["hidden_size"]
        for k, v in PI_EXPERT.items():
            setattr(cfg.gemma_expert_config, k, v)
        cfg.gemma_expert_config.vocab_size = vocab
        return cfg

    modeling_pi0.PaliGemmaWithExpertConfig = tiny_config

    class LocalTokenizer:
        @staticmethod
        def from_pretrained(name, *args, **kwargs):
            folder = tokenizer_dir if name == PALIGEMMA_NAME else name
            return AutoTokenizer.from_pretrained(str(folder), *args, **kwargs)

    modeling_pi0.AutoTokenizer = LocalTokenizer


@contextlib.contextmanager
def pi0_in_float32():
    from lerobot.policies.pi0 import modeling_pi0, paligemma_with_expert

    saved = modeling_pi0.torch, paligemma_with_expert.torch
    modeling_pi0.torch = paligemma_with_expert.torch = _Float32Torch()
    try:
        yield
    finally:
        modeling_pi0.torch, paligemma_with_expert.torch = saved


def write_paligemma_tokenizer(folder: Path) -> None:
    """The reference fixtures' tiny PaliGemma-style tokenizer, saved by this transformers (its config format)."""
    from transformers import PreTrainedTokenizerFast

    PreTrainedTokenizerFast(
        tokenizer_file=str(PALIGEMMA_TOKENIZER / "tokenizer.json"),
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        padding_side="right",
        truncation_side="right",
    ).save_pretrained(str(folder))


def write_smolvlm_folder(folder: Path) -> None:
    from transformers import (
        PreTrainedTokenizerFast,
        SmolVLMConfig,
        SmolVLMImageProcessor,
        SmolVLMProcessor,
    )

    folder.mkdir(parents=True, exist_ok=True)
    tok = PreTrainedTokenizerFast(
        tokenizer_file=str(SMOLVLM_TOKENIZER),
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|im_end|>",
        unk_token="<|endoftext|>",
        padding_side="right",
        truncation_side="left",
        extra_special_tokens={
            "fake_image_token": "<fake_token_around_image>",
            "image_token": "<image>",
            "global_image_token": "<global-img>",
            "end_of_utterance_token": "<end_of_utterance>",
        },
    )
    text = dict(SMOL_TEXT, vocab_size=len(tok), pad_token_id=tok.pad_token_id)
    SmolVLMConfig(
        vision_config=dict(SMOL_VISION),
        text_config=text,
        scale_factor=2,
        image_token_id=tok.convert_tokens_to_ids("<image>"),
        tie_word_embeddings=False,
    ).save_pretrained(folder)
    side = SMOL_VISION["image_size"]
    # transformers 4.52's SmolVLM processor takes an image processor with the video settings as its video one.
    video = SmolVLMImageProcessor(size={"longest_edge": side}, max_image_size={"longest_edge": side})
    video.video_sampling = {"video_size": {"longest_edge": side}, "max_frames": 1, "fps": 1}
    SmolVLMProcessor(
        image_processor=SmolVLMImageProcessor(size={"longest_edge": side}, max_image_size={"longest_edge": side}),
        tokenizer=tok,
        video_processor=video,
        image_seq_len=(side // SMOL_VISION["patch_size"]) ** 2 // 4,
    ).save_pretrained(folder)


def make_policy(family: str, folder: Path, dims, stats):
    from lerobot.configs.types import FeatureType, NormalizationMode, PolicyFeature

    _, state_dim, action_dim, chunk, steps, _, _ = dims
    inputs = {k: PolicyFeature(type=FeatureType.VISUAL, shape=(3, h, w)) for k, h, w in CAMERAS}
    inputs["observation.state"] = PolicyFeature(type=FeatureType.STATE, shape=(state_dim,))
    outputs = {"action": PolicyFeature(type=FeatureType.ACTION, shape=(action_dim,))}
    common = dict(
        input_features=inputs,
        output_features=outputs,
        chunk_size=chunk,
        n_action_steps=steps,
        normalization_mapping={k: NormalizationMode(v) for k, v in MAPPING.items()},
        device="cpu",
    )
    if family == "pi0":
        from lerobot.policies.pi0.configuration_pi0 import PI0Config
        from lerobot.policies.pi0.modeling_pi0 import PI0Policy

        config = PI0Config(**common, resize_imgs_with_padding=(PI_IMAGE, PI_IMAGE), proj_width=PI_EXPERT["hidden_size"])
        return PI0Policy, PI0Policy(config, dataset_stats=stats)
    from lerobot.policies.smolvla.configuration_smolvla import SmolVLAConfig
    from lerobot.policies.smolvla.modeling_smolvla import SmolVLAPolicy

    config = SmolVLAConfig(
        **common,
        vlm_model_name=SMOLVLM_DIRNAME,
        load_vlm_weights=False,
        num_vlm_layers=3,
        expert_width_multiplier=0.5,
        resize_imgs_with_padding=(SMOL_VISION["image_size"],) * 2,
    )
    return SmolVLAPolicy, SmolVLAPolicy(config, dataset_stats=stats)


def run_lerobot03(policy, family: str, obs, prompt: str, noise: torch.Tensor) -> torch.Tensor:
    """0.3.3's own inference: pi0 `select_action` until its queue of n_action_steps is drained (the chunk it
    executes), SmolVLA `predict_action_chunk`."""
    policy.reset()
    if family == "smolvla":
        return policy.predict_action_chunk(to_batch(obs, prompt), noise=noise.clone()).float()
    steps = [policy.select_action(to_batch(obs, prompt), noise=noise.clone()) for _ in range(noise.shape[1])]
    return torch.stack(steps, dim=1).float()


def build(name: str, out: Path) -> dict:
    family, state_dim, action_dim, chunk, steps, weight_seed, stats_seed = FIXTURES[name]
    folder = out / name
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    stats = stats_for(stats_seed, state_dim, action_dim)
    with contextlib.chdir(folder):
        if family == "pi0":
            write_paligemma_tokenizer(folder)
            install_pi0_patches(folder)
        else:
            write_smolvlm_folder(folder / SMOLVLM_DIRNAME)
        with quiet():
            cls, policy = make_policy(family, folder, FIXTURES[name], stats)
        randomize_parameters(policy.model, weight_seed)
        with quiet():
            policy.save_pretrained(str(folder))
            policy = cls.from_pretrained(str(folder))
        saved = load_file(str(folder / "model.safetensors"))
        live = policy.state_dict()
        for key, value in saved.items():  # from_pretrained may keep random weights when loading fails
            if not torch.equal(live[key].to(value.dtype), value):
                raise RuntimeError(f"{name}: {key} differs after reload")
        policy.eval()
        reference = policy
        if family == "pi0":
            reference = copy.deepcopy(policy).float()
        cases = {}
        (out / "cases").mkdir(exist_ok=True)
        width = policy.config.max_action_dim
        for case, (frames, present, prompt, obs_seed, noise_seed, migrate_check) in CASES[family].items():
            obs = observation(frames, present, obs_seed, stats)
            horizon = steps if family == "pi0" else chunk
            noise = torch.randn((1, horizon, width), generator=torch.Generator().manual_seed(noise_seed))
            tensors = {f"observation/{k}": torch.from_numpy(np.ascontiguousarray(v)) for k, v in obs.items()}
            tensors["noise"] = noise
            if family == "pi0":
                with pi0_in_float32():
                    tensors["actions"] = run_lerobot03(reference, family, obs, prompt, noise)
                tensors["actions_bf16"] = run_lerobot03(policy, family, obs, prompt, noise)
            else:
                tensors["actions"] = run_lerobot03(policy, family, obs, prompt, noise)
            file = f"cases/{name}__{case}.safetensors"
            save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / file))
            entry = {"file": file, "prompt": prompt, "present_cameras": present, "migrate_check": migrate_check}
            if "actions_bf16" in tensors:
                entry["bf16_vs_fp32_max_abs"] = float((tensors["actions_bf16"] - tensors["actions"]).abs().max())
            cases[case] = entry
    return {
        "family": family,
        "path": name,
        "files": sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()),
        "state_dim": state_dim,
        "action_dim": action_dim,
        "chunk_size": chunk,
        "n_action_steps": steps,
        "normalization_mapping": MAPPING,
        "stats_buffers": sorted(k for k in saved if k.startswith(("normalize_", "unnormalize_"))),
        "weights": {k: [list(v.shape), str(v.dtype).removeprefix("torch.")] for k, v in sorted(saved.items())},
        "cases": cases,
    }


def generate(out: Path) -> int:
    from importlib.metadata import version

    import transformers

    torch.set_num_threads(1)
    out.mkdir(parents=True, exist_ok=True)
    if (out / "cases").exists():
        shutil.rmtree(out / "cases")
    t0 = time.perf_counter()
    fixtures = {name: build(name, out) for name in FIXTURES}
    manifest = {
        "format": 1,
        "generator": {
            "script": "scripts/make_legacy_fixtures.py",
            "lerobot": version("lerobot"),
            "transformers": transformers.__version__,
            "torch": torch.__version__.split("+")[0],
            "threads": 1,
        },
        "reference": (
            "pi0: `actions` from LeRobot 0.3.3's own code with its bfloat16 casts as float32 (the saved bf16 weights "
            "cast up), `actions_bf16` as 0.3.3 runs natively; SmolVLA runs in float32 natively"
        ),
        "fixtures": fixtures,
    }
    previous = out / "manifest.json"
    if previous.exists():  # keep what the 0.6.1 check of the migrated folders recorded
        manifest["migrated"] = json.loads(previous.read_text()).get("migrated", {})
    previous.write_text(json.dumps(manifest, indent=1) + "\n")
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"legacy fixtures in {out} ({size / 1e6:.2f} MB, {time.perf_counter() - t0:.1f} s)")
    for name, entry in fixtures.items():
        for case, info in entry["cases"].items():
            if "bf16_vs_fp32_max_abs" in info:
                print(f"  {name}/{case}: 0.3.3 bf16 vs fp32 max abs {info['bf16_vs_fp32_max_abs']:.3g}")
    return 0


# ----------------------------------------------------------------------------------------------------------------
# LeRobot 0.6.1 on the migrated folders
# ----------------------------------------------------------------------------------------------------------------


def verify_migrated(out: Path) -> int:
    """Load every `<fixture>_migrated` folder with LeRobot 0.6.1's from_pretrained + make_pre_post_processors,
    run the cases marked migrate_check, store the actions and their distance to 0.3.3's."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import make_reference_fixtures as ref  # the 0.6.1 tiny-model patches

    manifest = json.loads((out / "manifest.json").read_text())
    ref.install_pi_patches()
    torch.set_num_threads(1)
    results = {}
    for name, entry in manifest["fixtures"].items():
        folder = out / f"{name}_migrated"
        if not folder.is_dir():
            sys.exit(f"{folder}: missing; run `omni-ros checkpoint migrate {out / name} --out {folder}` first")
        family = entry["family"]
        _, policy_cls, _ = ref.policy_classes(family)
        with contextlib.chdir(folder):
            if family == "pi0":
                ref.PI_SIZES.vocab = len(ref.transformers.AutoTokenizer.from_pretrained(str(folder)))
                ref._LocalAutoTokenizer.folders[ref.PALIGEMMA_TOKENIZER_NAME] = folder
            with quiet():
                policy = policy_cls.from_pretrained(str(folder))
            saved = load_file(str(folder / "model.safetensors"))
            ref.assert_same_weights(saved, policy, f"{name}_migrated")
            policy.eval()
            pre, post = ref.policy_factory.make_pre_post_processors(policy.config, pretrained_path=str(folder))
            results[name] = {}
            for case, info in entry["cases"].items():
                if not info["migrate_check"]:
                    continue
                data = load_file(str(out / info["file"]))
                obs = {
                    k.removeprefix("observation/"): v.numpy() for k, v in data.items() if k.startswith("observation/")
                }
                tensors, _, _ = ref.run_case(policy, pre, post, family, obs, info["prompt"], data["noise"])
                file = f"cases/{name}_migrated__{case}.safetensors"
                save_file({"actions": tensors["actions"].contiguous()}, str(out / file))
                diff = float((tensors["actions"] - data["actions"]).abs().max())
                results[name][case] = {"file": file, "lerobot_0.6.1_vs_0.3.3_max_abs": diff}
                print(f"  {name}_migrated/{case}: LeRobot 0.6.1 vs 0.3.3 max abs {diff:.3g}")
    manifest["migrated"] = {"lerobot": ref.lerobot.__version__, "fixtures": results}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "test" / "fixtures" / "legacy")
    parser.add_argument("--verify-migrated", type=Path, metavar="DIR", help="(LeRobot 0.6.1 venv) check DIR/*_migrated")
    args = parser.parse_args()
    if args.verify_migrated:
        return verify_migrated(args.verify_migrated.resolve())
    return generate(args.out.resolve())


if __name__ == "__main__":
    sys.exit(main())
