"""bench/gemm_kernels.py's weight-read floor: each stage's weights read once at this machine's memory rate, per
weight width, and summed over an inference as the GEMM floor is."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import gemm_kernels


def test_each_kernel_is_held_to_the_bytes_it_reads_per_weight():
    # fp32 kernels 4 bytes, bf16 2, every int8 kernel 1: the width its over_weight_read divides by.
    assert set(gemm_kernels.WEIGHT_BYTES) == set(gemm_kernels.EAGER) | set(gemm_kernels.PTE)
    assert {k for k, w in gemm_kernels.WEIGHT_BYTES.items() if w == 1} == {
        "eager_int8", "eager_int8_onednn", "eager_int_mm", "xnnpack_int8",
    }  # fmt: skip
    assert gemm_kernels.WEIGHT_BYTES["eager_bf16"] == 2 and gemm_kernels.WEIGHT_BYTES["eager_packed"] == 4


def test_the_inference_reads_each_stages_weights_as_often_as_it_runs_the_stage():
    shapes, steps = gemm_kernels.stage_shapes("tiny")
    report = {"stages": {}}
    for i, name in enumerate(shapes):
        report["stages"][name] = {
            "eager_packed_ms": 10.0 + i,
            "weight_read_ms": {"4_byte": 2.0 + i, "1_byte": 0.5 + i},
        }
    gemm_kernels.summarize(report, shapes, steps, ["eager_packed"])
    reads = {n: report["stages"][n]["weight_read_ms"] for n in shapes}
    expected = {
        width: sum(reads[n][width] * (steps if n == "denoise_step" else 1) for n in shapes)
        for width in ("4_byte", "1_byte")
    }
    assert steps > 1 and report["inference_weight_read_ms"] == pytest.approx(expected, abs=0.05)


def test_the_read_worker_times_a_buffer_in_a_fresh_process():
    args = argparse.Namespace(preset="tiny", threads=1, runs=2, image_threads=False)
    result = gemm_kernels.run_worker(args, "denoise_step", gemm_kernels.READ, nbytes=8 * 2**20)
    assert result["ms"] > 0


def test_each_kernels_chain_stacks_the_groups_its_product_stacks():
    # The product: int8 stacks q / k / v and gate / up, bf16 and float32 nothing
    # (omni_ros/policy/precision/stacked_linears.py); the weights are the same however they are stacked.
    shapes, _ = gemm_kernels.stage_shapes("pi0_edge")
    step = shapes["denoise_step"]["linears"]
    fp32, bf16, int8 = (gemm_kernels.chain(step, k) for k in ("eager_packed", "eager_bf16", "eager_int8_onednn"))
    layers = 6
    assert (len(fp32), len(bf16), len(int8)) == (7 * layers, 7 * layers, 4 * layers)
    weights = {sum(i * o for i, o in c) for c in (fp32, bf16, int8)}
    assert len(weights) == 1
    assert int8[0] == (256, 8 * 64 + 2 * 64) and int8[2] == (256, 2 * 1024)  # q|k|v, then gate|up
