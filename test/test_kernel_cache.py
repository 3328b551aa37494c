"""The per-checkpoint kernel cache of `int8_kernel: xnnpack`: built on the first load, reused by the next, rebuilt
for other weights or another CPU, and a corrupt file is rebuilt with a warning, never loaded."""

from __future__ import annotations

import json
import logging
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from omni_ros import cpu_features
from omni_ros.cpu_features import CpuFeatures
from omni_ros.policy.precision import PrecisionChoice, apply_precision, xnnpack_linears

pytestmark = pytest.mark.usefixtures("torch_one_thread")
VNNI = CpuFeatures("x86_64", "test xeon", frozenset({"avx2", "avx512f", "avx512_vnni"}))
VNNI_BF16 = CpuFeatures("x86_64", "test xeon", frozenset({"avx2", "avx512f", "avx512_vnni", "avx512_bf16"}))
# int8 per token against float32, on a random tiny model (it amplifies rounding more than a trained one).
INT8_REL_L2 = 0.04


@pytest.fixture
def builds(monkeypatch):
    """Counts the XNNPACK programs written (each is a build)."""
    calls = []
    real = xnnpack_linears._write_program

    def counted(linears, folder, *args):
        calls.append(folder)
        return real(linears, folder, *args)

    monkeypatch.setattr(xnnpack_linears, "_write_program", counted)
    monkeypatch.setattr(cpu_features, "detect", lambda: VNNI)
    return calls


def _rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


class _Two(torch.nn.Module):
    """Two linears and glue between them: a model whose kernels build in seconds."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.up, self.down = torch.nn.Linear(64, 96), torch.nn.Linear(96, 48, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.nn.functional.gelu(self.up(x)))


def _swapped(cache, seed=0):
    model = _Two(seed)
    x = torch.randn(300, 64, generator=torch.Generator().manual_seed(2))  # more rows than a method takes at once
    with torch.no_grad():
        reference = model(x)
        applied = apply_precision(
            model, PrecisionChoice("int8", "test", kernel="xnnpack"), cache_dir=cache, label="two"
        )
        out = model(x)
    assert _rel(out.numpy(), reference.numpy()) < INT8_REL_L2
    return applied.cache, out


@pytest.fixture(scope="module")
def first_build(tmp_path_factory):
    """One build of `_Two(0)` for the module (each build lowers in a child process, about 12 s on 2 cores): the
    tests that rebuild start from a copy of its cache. Returns (cache folder, its entry's name, the output)."""
    cache = tmp_path_factory.mktemp("first_build")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cpu_features, "detect", lambda: VNNI)
        folder, out = _swapped(cache)
    return cache, folder.name, out


def _copy_of(first_build, tmp_path):
    """A cache holding the module's first build; the path its entry has there."""
    cache, name, out = first_build
    shutil.copytree(cache, tmp_path / "cache")
    return tmp_path / "cache", tmp_path / "cache" / "kernels" / name, out


def test_other_weights_or_another_cpu_rebuild(tmp_path, first_build, builds, monkeypatch):
    cache, folder, out = _copy_of(first_build, tmp_path)
    manifest = json.loads((folder / "manifest.json").read_text())
    assert set(manifest["files"]) == {"linears.pte"} and manifest["cpu"] == VNNI.key() and len(manifest["methods"]) == 2
    reused, again = _swapped(cache)
    assert reused == folder and builds == []  # the second load reads the first's kernels
    torch.testing.assert_close(again, out, rtol=0, atol=0)
    other, _ = _swapped(cache, seed=1)  # other weights
    assert len(builds) == 1 and other != folder
    monkeypatch.setattr(cpu_features, "detect", lambda: VNNI_BF16)  # another CPU
    moved, again = _swapped(cache)
    assert len(builds) == 2 and moved not in (folder, other)
    torch.testing.assert_close(again, out, rtol=0, atol=0)


def test_a_corrupt_program_is_rebuilt_with_a_warning(tmp_path, first_build, builds, caplog):
    cache, folder, out = _copy_of(first_build, tmp_path)
    program = folder / "linears.pte"
    data = bytearray(program.read_bytes())
    data[len(data) // 2] ^= 0xFF
    program.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="omni_ros.policy"):
        rebuilt, again = _swapped(cache)
    assert len(builds) == 1 and rebuilt == folder
    assert any(
        "is corrupt (linears.pte does not match its sha256): rebuilding" in r.getMessage() for r in caplog.records
    )
    torch.testing.assert_close(again, out, rtol=0, atol=0)


def test_a_build_cut_short_leaves_no_entry(tmp_path, monkeypatch):
    monkeypatch.setattr(cpu_features, "detect", lambda: VNNI)

    def broken(linears, folder, *args):
        (folder / "linears.pte").write_bytes(b"half a program")
        raise KeyboardInterrupt

    monkeypatch.setattr(xnnpack_linears, "_write_program", broken)
    with pytest.raises(KeyboardInterrupt):
        _swapped(tmp_path)
    assert not [p for p in (tmp_path / "kernels").iterdir()]  # neither the entry nor its temporary folder


def test_int8_layers_follow_gradients_for_guided_rtc():
    """Guided real-time chunking differentiates through a denoising step: int8 and bf16 layers give gradients."""
    from omni_ros.policy.precision.bf16_linear import Bf16Linear
    from omni_ros.policy.precision.int8_linear import Int8Linear

    torch.manual_seed(0)
    linear = torch.nn.Linear(32, 16)
    x = torch.randn(4, 32, requires_grad=True)
    (reference,) = torch.autograd.grad(linear(x).square().sum(), x)
    for layer, tol in ((Int8Linear(linear), 0.04), (Bf16Linear(linear), 0.02)):
        (grad,) = torch.autograd.grad(layer(x).square().sum(), x)
        assert _rel(grad.numpy(), reference.numpy()) < tol, type(layer).__name__


def test_emulated_int8_is_the_int8_product():
    """Without an int8 dot product the same int8 operands go through a float32 GEMM: the integer kernels' result
    (oneDNN's qlinear from a reordered weight, `_int_mm`) up to float32 rounding of the sums. All three against
    the exact int8 sums (float64 holds them); on a CPU without the instructions every layer is the emulated one
    (the integer kernels would saturate there, int8_linear.integer_products_exact)."""
    from helpers.int8_reference import exact_int8_product
    from omni_ros.policy.precision.int8_linear import Int8Linear, integer_products_exact, qlinear_pays

    torch.manual_seed(0)
    linear = torch.nn.Linear(256, 96)
    x = torch.randn(3, 7, 256)
    native, int_mm = Int8Linear(linear), Int8Linear(linear)
    int_mm.packed = None  # the build without oneDNN's int8 linear: torch._int_mm on the plain int8 weight
    with torch.no_grad():
        integer, emulated, integer_mm = native(x), Int8Linear(linear, emulate=True)(x), int_mm(x)
        exact = exact_int8_product(native, x)
    assert Int8Linear(linear, emulate=True).kernel == "emulated"
    # oneDNN's qlinear where it is the fast product and the sums are exact
    assert (native.packed is not None) == (qlinear_pays() and integer_products_exact())
    for got in (emulated, integer, integer_mm):
        torch.testing.assert_close(got, exact, rtol=1e-5, atol=1e-5)
    assert 1e-4 < _rel(integer.numpy(), linear(x).detach().numpy()) < INT8_REL_L2  # int8, not float32 again


class _Attention(torch.nn.Module):
    """q / k / v read one tensor (declared, as the families' layers declare it), o reads another."""

    shared_input_linears = (("q", "k", "v"),)

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.q, self.k, self.v = torch.nn.Linear(64, 32), torch.nn.Linear(64, 16, bias=False), torch.nn.Linear(64, 16)
        self.o = torch.nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.o(torch.cat([self.q(x), self.k(x), self.v(x)], dim=-1))


class _Undeclared(_Attention):
    shared_input_linears = ()


def test_linears_reading_one_input_are_one_method_with_their_own_numbers(tmp_path, builds):
    """q / k / v become one XNNPACK method (one lowering, one call per input); each member's output is what its
    own method gives (per channel weights, per token activations: the same numbers, to float32 rounding), also
    when a member is called with another tensor than the one the group last saw."""
    x, y = torch.randn(200, 64), torch.randn(5, 64)  # 200: more rows than a method takes at once
    choice = PrecisionChoice("int8", "test", kernel="xnnpack")
    with torch.no_grad():
        grouped, alone = _Attention(), _Undeclared()
        reference = grouped(x)
        applied = [apply_precision(m, choice, cache_dir=tmp_path, label=type(m).__name__) for m in (grouped, alone)]
        folders = [a.cache for a in applied]
        methods = [json.loads((f / "manifest.json").read_text())["methods"] for f in folders]
        assert sorted(map(sorted, methods[0].values())) == [["k", "q", "v"], ["o"]] and len(methods[1]) == 4
        assert len(builds) == 2
        torch.testing.assert_close(grouped(x), alone(x), rtol=1e-5, atol=1e-5)
        assert _rel(grouped(x).numpy(), reference.numpy()) < INT8_REL_L2
        grouped.q(x)  # the group now holds x's output; k asked about y must not answer with it
        torch.testing.assert_close(grouped.k(y), alone.k(y), rtol=1e-5, atol=1e-5)


def test_a_failed_build_is_one_error_with_the_childs_output_and_leaves_no_entry(tmp_path, monkeypatch):
    """The kernels are lowered in a child process: when it fails, loading fails with its exit code and the end of
    its output, the handed-over weights are gone and no cache entry looks complete."""
    from omni_ros.policy.precision import xnnpack_build

    script = tmp_path / "failing_child.py"
    script.write_text("import sys\nprint('lowering went wrong here')\nsys.exit(3)\n")
    # The child is `<python> -m omni_ros.policy.precision.xnnpack_build FOLDER`; this python runs a failing script.
    wrapper = tmp_path / "python"
    wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} {script}\n")
    wrapper.chmod(0o755)
    monkeypatch.setattr(xnnpack_build.sys, "executable", str(wrapper))
    monkeypatch.setattr(cpu_features, "detect", lambda: VNNI)
    with pytest.raises(xnnpack_build.KernelBuildError, match=r"failed \(exit 3\):\nlowering went wrong here"):
        _swapped(tmp_path / "cache")
    assert not list((tmp_path / "cache" / "kernels").iterdir())  # neither an entry nor its temporary folder


def _resident_bytes_of(path) -> int:
    """Resident bytes of this process's mappings of `path` (/proc/self/smaps), the pages a read brought in."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text(encoding="utf-8").splitlines():
        fields = line.split()
        if fields and "-" in fields[0] and len(fields) >= 5:  # a mapping's header line
            inside = len(fields) >= 6 and fields[5] == str(path)
        elif inside and fields[0] == "Rss:":
            total += int(fields[1]) * 1024
    return total


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps")
def test_hashing_a_zero_copy_weight_leaves_its_file_pages_out_of_memory(tmp_path):
    import hashlib

    from safetensors.torch import save_file

    from omni_ros.policy.layouts.weights import SafetensorsFile
    from omni_ros.policy.precision.kernel_cache import tensors_hash

    weight = torch.randn(1024, 2048)  # 8 MiB: thousands of pages, so a resident fraction is measurable
    path = tmp_path / "model.safetensors"
    save_file({"w": weight}, path)
    file = SafetensorsFile(path)
    view = file.view("w")
    size = weight.numel() * weight.element_size()
    float(view.sum())  # a read brings every page of the tensor in
    assert _resident_bytes_of(path) >= size // 2, "the probe must see the pages a read brings in"

    digest = tensors_hash([("w", view)], {"cpu": "x"})

    # The hash read the whole tensor, yet leaves (almost) none of it resident: at most the partial pages at its edges.
    assert _resident_bytes_of(path) <= size // 16
    # Same definition as hashing a bytes copy, so caches written before this change still hit.
    reference = hashlib.sha256(json.dumps({"cpu": "x"}, sort_keys=True).encode())
    reference.update(f"w|{tuple(weight.shape)}|{weight.dtype}".encode())
    reference.update(weight.numpy().tobytes())
    assert digest == reference.hexdigest()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps")
def test_the_builds_inputs_are_written_a_tensor_at_a_time_and_read_back_exactly(tmp_path):
    from safetensors.torch import load_file, save_file

    from omni_ros.policy.layouts.weights import SafetensorsFile, save_float32

    weight = torch.randn(1024, 2048)
    path = tmp_path / "model.safetensors"
    save_file({"w": weight}, path)
    view = SafetensorsFile(path).view("w")
    half = torch.randn(48, 40).to(torch.bfloat16)
    bias = torch.randn(7)

    save_float32([("a.weight", view), ("b.weight", half), ("b.bias", bias)], tmp_path / "inputs.safetensors")

    back = load_file(tmp_path / "inputs.safetensors")  # safetensors' own reader accepts the file
    assert {k: v.dtype for k, v in back.items()} == dict.fromkeys(back, torch.float32)
    torch.testing.assert_close(back["a.weight"], weight, rtol=0, atol=0)
    torch.testing.assert_close(back["b.weight"], half.float(), rtol=0, atol=0)
    torch.testing.assert_close(back["b.bias"], bias, rtol=0, atol=0)
    # Writing read the mapped weight's pages; none of them stay (at most the partial pages at its edges).
    assert _resident_bytes_of(path) <= weight.numel() * 4 // 16
