"""`policy.int8_kernel: program`: a checkpoint's stages exported whole to one XNNPACK int8 program on the first
load, cached per checkpoint and CPU, and served by the ExecuTorch runner (omni_ros/backends/stage_program.py).

One real export of the smallest committed LeRobot fixture (about a minute) serves the module; the cache decisions
(reuse, rebuild on corruption, a new key for a changed checkpoint or CPU) are checked against it without a second
export: the child that would export is replaced by one that records that it was asked.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
from test_reference_checkpoints import MANIFEST, REFERENCE, observation, policy, tensors

import omni_ros.policy
from omni_ros.backends import stage_program
from omni_ros.backends.stage_program import load_checkpoint
from omni_ros.cpu_features import CpuFeatures, detect
from omni_ros.policy.layouts.common import CheckpointError
from omni_ros.policy.precision.choice import PrecisionError
from omni_ros.policy.precision.kernel_cache import builder_source_hash
from omni_ros.policy.precision.xnnpack_build import KernelBuildError

FIXTURE = "pi0_1cam"
INT8_BOUND = 0.04  # the issue's int8 bound: relative L2 from float32's actions


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("program_cache")


@pytest.fixture(scope="module")
def program(cache):
    # With the guided RTC step (a caller that asks for guided RTC): one export serves every test of the module.
    return load_checkpoint(
        REFERENCE / FIXTURE, precision="int8", int8_kernel="program", cache_dir=str(cache), rtc_method="guided"
    )


class _Asked(Exception):
    pass


@pytest.fixture
def no_export(monkeypatch):
    """The export child replaced by a recorder: a load that would export raises _Asked."""
    from omni_ros.policy.precision import xnnpack_build

    asked: list[list[str]] = []

    def record(command, what, progress="[omni_ros"):
        asked.append(command)
        raise _Asked(what)

    monkeypatch.setattr(xnnpack_build, "run_child", record)
    return asked


def _entry(cache, folder=REFERENCE / FIXTURE, cpu=None, label=FIXTURE):
    methods = ("encode_images", "prefill", "denoise_step", "guided_step")
    return stage_program.program_entry(folder, methods, cache_dir=str(cache), label=label, cpu=cpu or detect())


def test_the_program_serves_every_case_within_the_int8_bound(program):
    assert program.metadata.precision.startswith("int8 (program): policy.precision int8")
    assert program.runner.backend.startswith("executorch-xnnpack-int8")
    for case in MANIFEST["fixtures"][FIXTURE]["cases"]:
        data, obs = tensors(FIXTURE, case), observation(FIXTURE, case)
        fp32 = policy(FIXTURE).infer(obs, noise=data["noise"][0])["actions"]
        out = program.infer(obs, noise=data["noise"][0])["actions"]
        assert out.shape == fp32.shape and np.isfinite(out).all()
        assert 1e-5 < _rel(out, fp32) < INT8_BOUND, (case, _rel(out, fp32))


# Guided RTC through int8 against float32's guided RTC: the guidance (weight up to 5) amplifies int8's rounding,
# measured 1.3% here (eager int8 through oneDNN: 1.1%).
GUIDED_INT8_BOUND = 0.05


def test_the_program_serves_guided_rtc_through_its_int8_guided_step(program):
    from omni_ros.export.sidecar import read_sidecar
    from omni_ros.policy.rtc import RtcRequest

    assert program.rtc_methods == ("guided", "inpaint")
    # The traced backward's products too run as XNNPACK int8 (the forward's and the transposed ones).
    report = read_sidecar(program.runner.pte).delegation
    guided, step = report["guided_step"], report["denoise_step"]["delegated"]
    linears = guided["delegated"].get("linear", 0)
    assert linears == guided["delegated"].get("torchao.choose_qparams_affine.default") and linears > step["linear"]
    assert not {"mm", "addmm", "linear"} & set(guided["portable"])  # no float product left outside XNNPACK
    # Nor the backward's float glue (export/backward_ops.py: 17 XNNPACK calls before, here 2; the sum, expand and
    # pow left portable are the forward's own, on the integer mask and the rotary frequencies, as in denoise_step).
    assert not {"slice_scatter", "alias_copy", "mul", "div"} & set(guided["portable"]), guided["portable"]
    assert guided["delegated_subgraphs"] <= report["denoise_step"]["delegated_subgraphs"], guided
    eager = policy(FIXTURE)
    for case in MANIFEST["fixtures"][FIXTURE]["cases"]:
        data, obs = tensors(FIXTURE, case), observation(FIXTURE, case)
        noise = data["noise"][0]
        plan = eager.infer(obs, noise=noise)["actions"][2:] + 0.3  # an old plan the new chunk must bend towards
        request = RtcRequest(plan, inference_delay=2, max_guidance_weight=5.0)
        fp32 = eager.infer(obs, noise=noise, rtc=request)["actions"]
        guided = program.infer(obs, noise=noise, rtc=request)["actions"]
        plain = program.infer(obs, noise=noise)["actions"]
        assert _rel(guided, fp32) < GUIDED_INT8_BOUND, (case, _rel(guided, fp32))
        assert np.abs(guided[:2] - plan[:2]).mean() < 0.25 * np.abs(plain[:2] - plan[:2]).mean()


def test_a_second_load_reads_the_cache(program, cache, no_export, caplog):
    with caplog.at_level(logging.INFO, "omni_ros.policy"):
        again = load_checkpoint(
            REFERENCE / FIXTURE, precision="int8", int8_kernel="program", cache_dir=str(cache), rtc_method="guided"
        )
    assert no_export == []
    assert "holds Python's GIL while a stage runs" in caplog.text  # in this process: said at every load
    # The entry says what it was built from (`omni-ros cache list`; a rebuild of this folder replaces it).
    manifest = json.loads((_entry(cache).folder / "manifest.json").read_text())
    assert manifest["source"] == str((REFERENCE / FIXTURE).resolve()) and "prefill" in manifest["variant"]
    case = next(iter(MANIFEST["fixtures"][FIXTURE]["cases"]))
    data, obs = tensors(FIXTURE, case), observation(FIXTURE, case)
    np.testing.assert_array_equal(
        again.infer(obs, noise=data["noise"][0])["actions"], program.infer(obs, noise=data["noise"][0])["actions"]
    )


def test_a_corrupt_program_is_rebuilt_never_loaded(program, cache, tmp_path, no_export, caplog):
    copy = tmp_path / "cache"
    shutil.copytree(cache, copy)
    pte = _entry(copy).folder / stage_program.PROGRAM
    data = bytearray(pte.read_bytes())
    data[len(data) // 2] ^= 0xFF
    pte.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, "omni_ros.policy"), pytest.raises(_Asked):
        load_checkpoint(
            REFERENCE / FIXTURE, precision="int8", int8_kernel="program", cache_dir=str(copy), rtc_method="guided"
        )
    assert len(no_export) == 1 and "stages.pte does not match its sha256" in caplog.text
    assert not pte.exists()  # the corrupt folder is gone, not kept beside a new build


def test_a_changed_checkpoint_or_another_cpu_gets_its_own_program(program, cache, tmp_path):
    built = _entry(cache).folder
    assert (built / stage_program.PROGRAM).is_file()
    edited = tmp_path / FIXTURE
    shutil.copytree(REFERENCE / FIXTURE, edited)
    config = edited / "config.json"
    config.write_text(config.read_text() + "\n")  # the same model, but not the same files
    assert _entry(cache, edited).folder != built
    assert _entry(cache, REFERENCE / FIXTURE).folder == built
    other = CpuFeatures(arch="x86_64", model="another CPU", flags=frozenset({"avx2", "fma", "avx512_vnni"}))
    assert _entry(cache, cpu=other).folder != built


def test_a_change_to_the_code_that_builds_the_program_gets_its_own_program(program, cache, tmp_path, monkeypatch):
    """omni_ros's version string stays while its exporter changes what a program computes (the guided step's
    backward rewrite did): the key hashes the source that defines and exports the models, not the rest."""
    built = _entry(cache).folder
    manifest = json.loads((built / "manifest.json").read_text())
    assert manifest["builder"] == builder_source_hash()  # what `omni-ros cache prune` compares
    package = Path(stage_program.__file__).resolve().parent.parent
    copy = tmp_path / "omni_ros"
    shutil.copytree(package, copy, ignore=shutil.ignore_patterns("__pycache__"))
    before = builder_source_hash(copy)
    assert before == builder_source_hash()  # the copy hashes as the package does
    (copy / "nodes" / "policy_node.py").write_text("# not a builder\n")
    assert builder_source_hash(copy) == before
    rtc_step = copy / "export" / "rtc_step.py"
    rtc_step.write_text(rtc_step.read_text() + "\n# changed\n")
    changed = builder_source_hash(copy)
    assert changed != before
    monkeypatch.setattr(stage_program, "builder_source_hash", lambda: changed)
    assert _entry(cache).folder != built


def test_a_failed_export_is_an_error_that_leaves_no_program(tmp_path, monkeypatch):
    import sys

    monkeypatch.setattr(sys, "executable", shutil.which("false"))  # a child that fails at once
    with pytest.raises(KernelBuildError, match="exporting the int8 program failed"):
        load_checkpoint(REFERENCE / FIXTURE, precision="int8", int8_kernel="program", cache_dir=str(tmp_path))
    assert not list((tmp_path / "kernels").glob("*/manifest.json"))


def test_what_the_program_kernel_refuses_at_load(tmp_path):
    with pytest.raises(CheckpointError, match=r"policy\.compile"):
        load_checkpoint(
            REFERENCE / FIXTURE, precision="int8", int8_kernel="program", compile=True, cache_dir=str(tmp_path)
        )
    with pytest.raises(CheckpointError, match="checkpoint folder"):
        omni_ros.policy.from_preset("tiny", precision="int8", int8_kernel="program")
    with pytest.raises(PrecisionError, match="cannot be exported to an int8 program"):  # refused before any export
        load_checkpoint(REFERENCE / "pi0fast_1cam", precision="int8", int8_kernel="program", cache_dir=str(tmp_path))
    assert not (tmp_path / "kernels").exists()
    # The torch loader does not serve an exported program: it names the loader that does.
    with pytest.raises(PrecisionError, match="load_checkpoint"):
        omni_ros.policy.load(REFERENCE / FIXTURE, precision="int8", int8_kernel="program")


VNNI = CpuFeatures(arch="x86_64", model="test epyc", flags=frozenset({"avx2", "fma", "avx512f", "avx512_vnni"}))


def test_auto_picks_the_program_where_it_serves_the_checkpoint_and_the_caller(monkeypatch, tmp_path, no_export):
    from omni_ros import cpu_features
    from omni_ros.policy import loading

    refusal = stage_program.auto_program_refusal
    assert refusal("pi0", VNNI, {}) is None and refusal("smolvla", VNNI, {}) is None
    assert refusal("xvla", VNNI, {}) is None and refusal("xvla", VNNI, {}, "inpaint") is None
    assert refusal("pi0", VNNI, {}, "guided") is None  # its program carries the guided step
    assert refusal("xvla", VNNI, {}, "guided") is None  # X-VLA's, in its x0 form
    arm = CpuFeatures(arch="aarch64", model="test arm", flags=frozenset({"asimddp"}))
    assert "x86" in refusal("pi0", arm, {})
    assert "does not export" in refusal("pi0_fast", VNNI, {})
    assert "compile" in refusal("pi0", VNNI, {"compile": True})
    assert "tokenizer" in refusal("pi0", VNNI, {"tokenizer": "tok.json"})

    monkeypatch.setattr(cpu_features, "detect", lambda: VNNI)
    # Through the loader: `auto` on this CPU exports the checkpoint's program (the recorder stands in for the
    # minute-long export child) ...
    with pytest.raises(_Asked):
        load_checkpoint(REFERENCE / FIXTURE, precision="auto", cache_dir=str(tmp_path))
    assert len(no_export) == 1 and "omni_ros.backends.stage_program" in no_export[0]
    assert no_export[0][-3:] == ["encode_images", "prefill", "denoise_step"]
    # ... with the guided RTC step where the caller will ask for guided RTC ...
    with pytest.raises(_Asked):
        load_checkpoint(REFERENCE / FIXTURE, precision="auto", cache_dir=str(tmp_path), rtc_method="guided")
    assert len(no_export) == 2 and no_export[1][-1] == "guided_step"
    # ... an X-VLA checkpoint's too ...
    with pytest.raises(_Asked):
        load_checkpoint(REFERENCE / "xvla_1cam", precision="auto", cache_dir=str(tmp_path), rtc_method="inpaint")
    assert len(no_export) == 3 and no_export[2][-2:] == ["encode", "denoise_step"]
    with pytest.raises(_Asked):
        load_checkpoint(REFERENCE / "xvla_1cam", precision="auto", cache_dir=str(tmp_path), rtc_method="guided")
    assert len(no_export) == 4 and no_export[3][-3:] == ["encode", "denoise_step", "guided_step"]
    # ... and hands a load the program cannot serve (policy.compile) to the per-linear kernels.
    asked: list[dict] = []
    monkeypatch.setattr(loading, "load", lambda path, **options: asked.append(options) or "per-linear")
    assert load_checkpoint(REFERENCE / "xvla_1cam", precision="auto", compile=True) == "per-linear"
    assert [o.get("int8_kernel", "auto") for o in asked] == ["auto"] and len(no_export) == 4
    assert loading.resolve_precision("auto", int8_kernel="auto").kernel == "xnnpack"  # the torch layer's own


def test_an_auto_chosen_program_whose_export_fails_falls_back_to_the_per_linear_kernels(monkeypatch, tmp_path, caplog):
    import sys

    from omni_ros import cpu_features
    from omni_ros.policy import loading

    monkeypatch.setattr(cpu_features, "detect", lambda: VNNI)
    monkeypatch.setattr(sys, "executable", shutil.which("false"))  # an export child that fails at once
    monkeypatch.setattr(loading, "load", lambda path, **options: "per-linear")
    with caplog.at_level(logging.WARNING, "omni_ros.policy"):
        assert load_checkpoint(REFERENCE / FIXTURE, precision="auto", cache_dir=str(tmp_path)) == "per-linear"
    assert "serving the checkpoint with XNNPACK's kernels per linear instead" in caplog.text
    # Asked for by name, the same failure is the error it is.
    with pytest.raises(KernelBuildError):
        load_checkpoint(REFERENCE / FIXTURE, precision="int8", int8_kernel="program", cache_dir=str(tmp_path))
