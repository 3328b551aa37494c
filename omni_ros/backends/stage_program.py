"""`policy.int8_kernel: program`: the policy's stages as one XNNPACK int8 program, built on first load and cached.

The `xnnpack` kernel hands each int8 linear (or MLP) to an XNNPACK method and keeps attention, norms and glue in
torch: a step's hundreds of hand-offs between torch and XNNPACK's pools, each on its own threads. Exporting the
stages whole (vision, prefill, denoising step: `omni-ros export --quantize int8-dynamic`, the same int8 recipe)
puts the attention and glue inside XNNPACK's graph too, on one pool; on the AMD EPYC with VNNI (2 vCPUs) the edge
pi0's chunk took 158 ms that way at 2 threads and 261 at one (0.20x / 0.30x LeRobot's time in that run,
bench/results/vs_lerobot_program_vnni.json), against 268 / 290 ms with the per-linear methods (another run,
vs_lerobot_vnni.json). So this kernel runs exactly what `omni-ros export` makes,
without the user running it:

    <cache_dir>/kernels/<label>-stages-<checkpoint hash>-<cpu hash>/stages.pte + its sidecar + manifest.json

The cache key is the checkpoint folder's files (every file's sha256: weights, config, normalization stats,
tokenizer), the methods, the recipe, the versions of omni_ros, torch, ExecuTorch and torchao, the source of the
code that defines and exports the models (`builder_source_hash`: an upgrade that changes the program rebuilds it
even where omni_ros's version string stayed) and the CPU (kernel_cache.py): a changed checkpoint, tool or CPU
builds anew, a corrupt file is rebuilt with a warning. The
export runs in a child process (the lowering leaves the serving process slower and larger: xnnpack_build.py), its
progress in this log.

`int8_kernel: auto` picks it where `auto`'s kernel would be XNNPACK per linear on an x86 CPU (VNNI, no AMX) and
the load allows it (`auto_program_refusal`: a pi0 / pi0.5 / SmolVLA / X-VLA folder, no `policy.compile`, no
tokenizer outside the folder). A caller under guided real-time chunking (the node with `control.rtc.method:
guided`) gets the program with its guided step too (export/rtc_step.py: the backward pass traced and its products
int8 as well; X-VLA's in its x0 form), a cache entry of its own; without it the program serves RTC by inpainting.
The first load exports the whole model (about 50 s for a tiny fixture, 139 s for the
edge pi0 on that CPU, about 5 minutes for a full-size SmolVLA, 6 for X-VLA; the per-linear kernels took 163 and 355 s
to build there for the first two). ExecuTorch's Python binding holds the GIL
while a method runs, so where a control loop shares the process (the policy node) the program runs in a child
process (`program_process`, omni_ros/backends/program_process.py): in the node's own process the full-size
SmolVLA's 50 Hz loop fell to 13 commands a second, 43 with it in the child (bench/results/realtime_program_vnni.json).
"""

from __future__ import annotations

import hashlib
import json
import logging
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

from omni_ros import cpu_features
from omni_ros.cpu_features import CpuFeatures
from omni_ros.export.sidecar import runtime_versions
from omni_ros.file_hash import file_sha256
from omni_ros.policy.layouts.common import CheckpointError
from omni_ros.policy.methods import GUIDED_STEP, StagePlan
from omni_ros.policy.pipeline import InferencePipeline
from omni_ros.policy.precision.choice import PrecisionChoice, PrecisionError
from omni_ros.policy.precision.kernel_cache import CacheEntry, builder_source_hash, cache_root

logger = logging.getLogger("omni_ros.policy")
PROGRAM = "stages.pte"
RECIPE = "int8-dynamic"
# The families whose stages export to an int8 program (tested on the committed LeRobot fixtures).
PROGRAM_FAMILIES = {"pi0": "pi0 / pi0.5", "smolvla": "SmolVLA", "xvla": "X-VLA"}


def checkpoint_hash(folder: Path, extra: dict[str, Any]) -> str:
    """sha256 of every file under `folder` (relative name and content) and of `extra` (build settings)."""
    digest = hashlib.sha256(json.dumps(extra, sort_keys=True).encode())
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(f"{path.relative_to(folder).as_posix()}|{file_sha256(path)}\n".encode())
    return digest.hexdigest()


def program_entry(
    checkpoint: Path,
    methods: tuple[str, ...],
    *,
    cache_dir: str | None,
    label: str,
    cpu: CpuFeatures,
    builder: str | None = None,
) -> CacheEntry:
    """The cache folder of `checkpoint`'s stage program on this CPU (`builder`: `builder_source_hash()`, where
    the caller has it)."""
    # The builder's source too: the exporter and the models decide what the program computes (kernel_cache.py).
    extra = {
        "recipe": RECIPE,
        "methods": list(methods),
        "versions": runtime_versions(),
        "builder": builder or builder_source_hash(),
    }
    key = checkpoint_hash(checkpoint, extra)
    variant = f"{RECIPE} program: {' '.join(methods)}"
    return CacheEntry(
        cache_root(cache_dir), f"{label}-stages", key, cpu, source=str(checkpoint.resolve()), variant=variant
    )


def stage_program(
    checkpoint: Path, methods: tuple[str, ...], *, cache_dir: str | None, label: str, cpu: CpuFeatures
) -> Path:
    """The path of `checkpoint`'s cached stage program, exported first where there is none (or a corrupt one)."""
    from omni_ros.policy.precision.xnnpack_build import KernelBuildError, run_child

    builder = builder_source_hash()  # hashed into the key, and recorded in the manifest (`omni-ros cache prune`)
    entry = program_entry(checkpoint, methods, cache_dir=cache_dir, label=label, cpu=cpu, builder=builder)
    if entry.load() is None:
        # A warning, so that it shows at every log level: a first load pauses for minutes (139 s for the edge pi0).
        logger.warning(
            "int8 program: exporting %s (%s) to %s on its first load on this CPU (a minute or more; progress with "
            "-v); later loads read it",
            checkpoint,
            ", ".join(methods),
            entry.folder,
        )

        def write(tmp: Path) -> dict[str, Any]:
            start = time.perf_counter()
            module = "omni_ros.backends.stage_program"
            run_child(
                [sys.executable, "-m", module, str(checkpoint), str(tmp / PROGRAM), *methods],
                "exporting the int8 program",
            )
            if not (tmp / PROGRAM).is_file():
                raise KernelBuildError(f"exporting {checkpoint} wrote no {PROGRAM}")
            seconds = round(time.perf_counter() - start, 1)
            return {"recipe": RECIPE, "methods": list(methods), "build_seconds": seconds, "builder": builder}

        manifest = entry.build(write)
        logger.info("int8 program: built in %.0f s", manifest["build_seconds"])
    return entry.folder / PROGRAM


def load_checkpoint(
    path: str | Path, *, program_process: bool = False, rtc_method: str | None = None, **options: Any
) -> InferencePipeline:
    """`omni_ros.policy.load(path, **options)`, with the int8 program kernel served here: the checkpoint's cached
    stage program on the ExecuTorch runner (what the node, `serve` and `eval` load through the backend factory).

    `program_process`: that program runs in a child process (program_process.py: the policy node's control loop
    keeps the GIL). `rtc_method`: the real-time-chunking method the caller will ask for; "guided" exports the
    program with its guided step (a traced backward pass: export/rtc_step.py), a cache entry of its own.
    """
    from omni_ros.policy.loading import load, resolve_precision

    choice = resolve_precision(
        options.get("precision"),
        device=options.get("device", "cpu"),
        dtype=options.get("dtype", "float32"),
        int8_kernel=options.get("int8_kernel", "auto"),
    )
    if choice.kernel == "xnnpack" and options.get("int8_kernel", "auto") == "auto":
        plan = _stage_plan(Path(path))
        why_not = auto_program_refusal(plan.family, cpu_features.detect(), options, rtc_method)
        if why_not is not None:
            logger.info("int8 kernel: XNNPACK per linear, not the int8 program: %s", why_not)
            return load(path, **options)
        from omni_ros.policy.precision.xnnpack_build import KernelBuildError

        try:
            program = replace(choice, kernel="program")
            return _program_policy(Path(path), plan, program, options, program_process, rtc_method)
        except KernelBuildError as exc:
            # Chosen by `auto`, not asked for: a checkpoint whose export fails is still served, per linear.
            logger.warning(
                "int8 program: %s; serving the checkpoint with XNNPACK's kernels per linear instead "
                "(policy.int8_kernel: xnnpack skips the program)",
                exc,
            )
            return load(path, **options)
    if choice.kernel != "program":
        return load(path, **options)
    if options.get("compile"):
        raise CheckpointError(
            "policy.int8_kernel program runs an exported program, which policy.compile cannot compile; set one of them"
        )
    if options.get("tokenizer") is not None:
        raise CheckpointError(
            "policy.int8_kernel program exports the checkpoint folder as it is; a policy.tokenizer beside it is not "
            "exported: put the tokenizer in the folder, or set policy.int8_kernel auto"
        )
    return _program_policy(Path(path), _stage_plan(Path(path)), choice, options, program_process, rtc_method)


def auto_program_refusal(
    family: str, cpu: CpuFeatures, options: dict[str, Any], rtc_method: str | None = None
) -> str | None:
    """Why `int8_kernel: auto` keeps the per-linear XNNPACK kernel instead of the int8 program (None: it need not).

    The program ran the edge pi0's chunk 1.7x faster than the per-linear kernel at 2 threads on an x86 CPU with
    VNNI and no AMX (158 vs 268 ms, bench/results/vs_lerobot_program_vnni.json and vs_lerobot_vnni.json), and
    under guided real-time chunking (its traced guided step against autograd through the per-linear kernels)
    faster still (bench/results/realtime_guided_pi0_edge_vnni.json); the full-size X-VLA's in 0.87x at 2 threads
    and 1.01x at 1, in half the memory (bench/results/xvla_program_vnni.json); on Arm CPUs it is unmeasured, so
    the per-linear kernel stays there."""
    if cpu.arch != "x86_64":
        return f"the program is measured on x86 CPUs only (this one: {cpu.arch})"
    if family not in PROGRAM_FAMILIES:
        return f"a {family} checkpoint does not export to an int8 program"
    from omni_ros.policy.families import stage_plan

    if rtc_method == "guided" and GUIDED_STEP not in stage_plan(family).optional:
        return (
            f"guided real-time chunking asked for, and a {PROGRAM_FAMILIES[family]} program has no guided step "
            "(it serves RTC by inpainting only)"
        )
    if options.get("compile"):
        return "policy.compile compiles the torch stages"
    if options.get("tokenizer") is not None:
        return "policy.tokenizer lies outside the checkpoint folder the program is exported from"
    return None


def _stage_plan(path: Path) -> StagePlan:
    """The checkpoint's family plan: its family and the staged methods its program exports (read once a load)."""
    from omni_ros.policy import layouts
    from omni_ros.policy.families import stage_plan

    return stage_plan(layouts.read(path).config)


def _program_policy(
    path: Path,
    plan: StagePlan,
    choice: PrecisionChoice,
    options: dict[str, Any],
    program_process: bool,
    rtc_method: str | None = None,
) -> InferencePipeline:
    import torch

    from omni_ros.backends.executorch_runner import load_pte

    if plan.family not in PROGRAM_FAMILIES:
        # pi0-FAST decodes tokens in a loop of its own: refused here, not after minutes of exporting.
        raise PrecisionError(
            f"policy.int8_kernel program: a {plan.family} checkpoint cannot be exported to an int8 program (done for "
            f"{', '.join(PROGRAM_FAMILIES.values())}); set policy.int8_kernel auto (its int8 linears run per layer)"
        )
    label = options.get("name") or path.name
    # Guided RTC needs the traced guided step; without it the program serves RTC by inpainting only.
    methods = (*plan.staged, GUIDED_STEP) if rtc_method == "guided" and GUIDED_STEP in plan.optional else plan.staged
    pte = stage_program(path, methods, cache_dir=options.get("cache_dir"), label=label, cpu=cpu_features.detect())
    policy = load_pte(
        pte,
        seed=options.get("seed", 0),
        num_steps=options.get("num_steps"),
        mode="staged",
        num_threads=torch.get_num_threads(),
        name=label,
        domain_id=options.get("domain_id"),
        process=program_process,
    )
    if not program_process:
        # Measured live (bench/results/realtime_program_vnni.json): a node's 50 Hz loop beside it fell to 13 commands/s.
        logger.info(
            "policy.int8_kernel program runs in this process: ExecuTorch holds Python's GIL while a stage runs, so "
            "threads beside it wait (policy.program_process: child runs it in a process of its own)"
        )
    cast(Any, policy.runner).precision = choice.describe()  # what status, metadata and info say: kernel, why
    dt = options.get("action_dt")
    action_dt = policy.metadata.action_dt if dt is None else float(dt)
    policy.metadata = replace(policy.metadata, precision=choice.describe(), action_dt=action_dt)
    return policy


def main(argv: list[str] | None = None) -> int:
    """The child: export CHECKPOINT's METHODS, int8-dynamic for XNNPACK, to OUT."""
    from omni_ros.export.exporter import export_checkpoint

    checkpoint, out, *methods = argv if argv is not None else sys.argv[1:]
    logging.basicConfig(level=logging.INFO, format="[%(name)s] %(message)s", stream=sys.stderr)
    export_checkpoint(checkpoint, out, target="xnnpack", quantize=RECIPE, methods=tuple(methods))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
