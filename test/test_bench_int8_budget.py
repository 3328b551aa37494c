"""bench/int8_budget.py's floors: which GEMM kernel a chunk is set against (the stage program runs XNNPACK's int8
GEMMs), the stages summed as the bench times them, and the int8 attention timings carried beside the floor."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
int8_budget = pytest.importorskip("int8_budget")

CPU = {"model": "Test CPU", "extensions": ["avx512_vnni"]}


def _write(folder: Path, name: str, data: dict) -> None:
    (folder / name).write_text(json.dumps(data))


@pytest.fixture
def results(tmp_path, monkeypatch):
    """One SmolVLA run's files (GEMMs, chunks, attention) in a results folder of their own; no edge pi0 files."""
    monkeypatch.setattr(int8_budget, "RESULTS", tmp_path)
    kernels = {"eager_packed": 3000.0, "eager_bf16": 2000.0, "eager_int8_onednn": 1900.0, "xnnpack_int8": 900.0}
    stages = {
        "vision": {f"{k}_ms": v * 0.3 for k, v in kernels.items()},  # one inference's vision tower (2 cameras)
        "prefill": {f"{k}_ms": v * 0.1 for k, v in kernels.items()},
        "denoise_step": {f"{k}_ms": v * 0.06 for k, v in kernels.items()},  # ten of them: 0.6
    }
    _write(
        tmp_path,
        "gemm_kernels_smolvla.json",
        {"threads": 2, "inference_gemm_ms": kernels, "stages": stages, "cpu": CPU},
    )
    stage_ms = {
        "vision_per_camera": {"median_ms": 300.0},
        "prefill": {"median_ms": 100.0},
        "denoise_step": {"median_ms": 30.0},
    }
    row = {"latency": {"median_ms": 1000.0}, "stages": stage_ms}
    _write(
        tmp_path,
        "smolvla_auto.json",
        {
            "cpu": CPU,
            "model": {"cameras": ["a", "b"], "steps": 10},
            "results": {
                "lerobot": {"latency_ms": 5000.0},
                "omni_ros_eager_int8": row | {"precision": "int8 (program): policy.precision int8, avx512_vnni"},
                "omni_ros_eager_bf16": row | {"precision": "bf16: policy.precision bf16"},
            },
        },
    )
    attention = {"fp32_inference_ms": 50.0}
    rows = ("siglip_smolvla_full", "smolvla_full_prefix", "smolvla_full_denoise_self", "smolvla_full_denoise_cross")
    _write(
        tmp_path,
        "precision_kernels_2threads.json",
        {
            "cpu": CPU,
            "threads": 2,
            "attention": dict.fromkeys(rows, attention),
            "int8_attention": {
                "shape": "siglip_smolvla_full",
                "fp32_flash_ms": 40.0,
                "executorch_int8_sdpa_ms": 800.0,
                "executorch_int8_sdpa_over_fp32_flash": 20.0,
                "executorch_int8_sdpa_rel_l2": 0.01,
            },
        },
    )
    return tmp_path


def test_the_program_is_set_against_xnnpacks_int8_gemms_and_the_rest_against_their_own(results, capsys):
    assert int8_budget.main(["--smolvla", "smolvla_auto.json", "--out", str(results / "out.json")]) == 0
    report = json.loads((results / "out.json").read_text())
    assert "skipped" in report["models"]["pi0_edge"]  # its files are absent: said, not computed
    smolvla = report["models"]["smolvla"]
    int8, bf16 = smolvla["chunk_over_gemm_floor"]["int8"], smolvla["chunk_over_gemm_floor"]["bf16"]
    # 1000 ms over XNNPACK's 900 (not oneDNN's 1900), bf16's over the bf16 GEMMs' 2000.
    assert int8["kernel"] == "xnnpack_int8" and int8["over_floor"] == pytest.approx(1000 / 900, abs=0.005)
    assert bf16["kernel"] == "eager_bf16" and bf16["over_floor"] == pytest.approx(0.5, abs=0.005)
    # Stages as an inference runs them: vision per camera x 2, ten steps; floors from the same kernel's stages.
    assert int8["stages"]["embed_prefix_ms"]["ms"] == pytest.approx(600.0)
    assert int8["stages"]["denoise_ms"]["ms"] == pytest.approx(300.0)
    assert int8["stages"]["denoise_ms"]["gemm_ms"] == pytest.approx(900 * 0.06 * 10, abs=0.1)
    # Attention: one row each for vision and prefill, two for the steps: 4 x 50 ms on top of the GEMMs.
    assert int8["gemm_and_attention_floor_ms"] == pytest.approx(1100.0)
    assert int8["over_gemm_and_attention_floor"] == pytest.approx(1000 / 1100, abs=0.005)
    # The int8 attention timings ride along with the floor whose attention they would replace.
    carried = smolvla["int8_attention_over_fp32_flash"]
    assert carried == {
        "shape": "siglip_smolvla_full",
        "executorch_int8_sdpa_over_fp32_flash": 20.0,
        "executorch_int8_sdpa_rel_l2": 0.01,
    }


def test_results_of_two_cpus_are_not_set_against_each_other(results):
    data = json.loads((results / "smolvla_auto.json").read_text())
    data["cpu"] = {"model": "Other CPU", "extensions": []}
    (results / "smolvla_auto.json").write_text(json.dumps(data))
    assert int8_budget.main(["--smolvla", "smolvla_auto.json", "--out", str(results / "out.json")]) == 0
    report = json.loads((results / "out.json").read_text())
    assert "not from one recorded CPU" in report["models"]["smolvla"]["skipped"]


def test_attention_products_at_each_kernels_rate_give_the_ideal_attention_floor(results):
    # One inference's attention products timed at each GEMM kernel (keys and values as weights), same CPU.
    products = {"eager_bf16": 400.0, "xnnpack_int8": 270.0}
    _write(results, "gemm_kernels_smolvla_attention.json", {"threads": 2, "inference_gemm_ms": products, "cpu": CPU})
    assert int8_budget.main(["--smolvla", "smolvla_auto.json", "--out", str(results / "out.json")]) == 0
    rows = json.loads((results / "out.json").read_text())["models"]["smolvla"]["chunk_over_gemm_floor"]
    # Each row adds its own kernel's products: 900 + 270 for the program, 2000 + 400 for bf16.
    assert rows["int8"]["gemm_and_attention_products_floor_ms"] == pytest.approx(1170.0)
    assert rows["int8"]["gemm_and_attention_products_over_gemm_floor"] == pytest.approx(1.3)
    assert rows["bf16"]["gemm_and_attention_products_floor_ms"] == pytest.approx(2400.0)
    # A result of another thread count is not used.
    _write(results, "gemm_kernels_smolvla_attention.json", {"threads": 1, "inference_gemm_ms": products, "cpu": CPU})
    assert int8_budget.main(["--smolvla", "smolvla_auto.json", "--out", str(results / "out.json")]) == 0
    rows = json.loads((results / "out.json").read_text())["models"]["smolvla"]["chunk_over_gemm_floor"]
    assert "gemm_and_attention_products_floor_ms" not in rows["int8"]
