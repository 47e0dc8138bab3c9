"""The RKNN backend: Rockchip's RKNN-Toolkit2 -> a `.rknn` file for an RK3588-class NPU, validated
in the toolkit's x86_64 simulator, loaded on the board by librknnrt (rknn-toolkit-lite2).
Its compile stage: pipeline/stages/rknn_compile.py (the toolkit runs as a child process in its
own venv, pipeline/run/rknn_driver.py); validation's runner: pipeline/run/rknn_run.py; its ABI
schema: spec/npu.py (NpuAbiDoc). How it works, what it costs, what is simulated: docs/npu.md.
"""
from __future__ import annotations

import platform
from pathlib import Path

from ..core.tools import python_module_argv, rknn_toolkit
from ..run import rknn_run
from ..run.rknn_load import RknnLoader
from ..spec.npu import NpuAbiDoc
from .backend import Backend

NAME = "rknn"
FORMAT = rknn_run.FORMAT
ARTIFACT = "model.rknn"
NOT_CHECKED = ("the board's NPU driver (rknpu) and runtime library (librknnrt), and the shipped "
               "file re-loaded: the simulator ran the model the toolkit built in the same process, "
               "which it then exported as the shipped file (sha256 recorded)")


def simulated_output(k: int) -> str:
    """The compile step's file of the simulator's output k on the golden inputs."""
    return f"simulated_{k}.npy"


def runner_argv(run: dict, entry: str, artifact: Path, inputs: list, outputs: list, where: dict,
                shader_cache: Path | None = None) -> tuple[list, dict, None]:
    """Hand the simulator's outputs (computed in the compile step) to validation, once they are
    checked to belong to this artifact and these inputs (pipeline/run/rknn_run.py)."""
    artifact = Path(artifact)
    tk = rknn_toolkit(**where)
    argv = python_module_argv("pipeline.run.rknn_run", "--artifact", str(artifact),
                              "--compile-json", str(artifact.parent / "compile.json"),
                              *[a for p in inputs for a in ("--input", str(p))],
                              *[a for p in outputs for a in ("--output", str(p))])
    executed = {"runtime": f"rknn-toolkit2 {tk.version} simulator (x86_64)",
                "device": "NPU (simulated)", "emulated": True, "simulated": True,
                "where": f"RKNN-Toolkit2's simulator on the {platform.machine()} build host, in "
                         f"the compile step's process, on the model it built and exported",
                "not_checked": NOT_CHECKED}
    return argv, executed, None


def validation_tools(run: dict) -> tuple:
    return ("rknn-toolkit2", "numpy")


def validation_inputs(compiled: Path, n_outputs: int) -> dict:
    """The simulator's outputs and the compile report they are checked against."""
    return {"compile.json": compiled / "compile.json",
            **{f"simulated:{k}": compiled / simulated_output(k) for k in range(n_outputs)}}


def validation_tolerance(abi, precision: str | None) -> tuple[dict, str]:
    """The ABI's tolerance for the `.rknn`'s precision (an fp16 NPU build cannot meet an fp32
    model's 1e-5), and where it is declared."""
    p = precision or abi.precision
    return abi.tolerance[p], f"the {abi.name} ABI's tolerance.{p} (target YAML)"


def variant_skip(abi, variant) -> str | None:
    if variant.precision == "fp16":
        return (f"not built for the NPU: its {abi.name} build of the model is already fp16 "
                f"(RKNN converts fp32 models to fp16), listed under the model itself")
    return None


def compile_fields(report: dict) -> dict:
    """The platform, precision, what the toolkit reported (CPU fallbacks, unsupported ops), how
    the bytes were made reproducible, and what the simulator ran; int8: the calibration, and the
    worst layers of the toolkit's per-layer accuracy analysis."""
    return {"flags": [], **{k: report[k] for k in ("target_platform", "precision", "toolkit",
                                                     "messages", "reproducibility", "simulated")},
            **{k: report[k] for k in ("calibration", "accuracy_analysis") if k in report}}


def requires(report: dict, tools: dict) -> dict:
    """The board runtime library the artifact needs (the ABI's runtime.librknnrt)."""
    return {"npu": {"target_platform": report["target_platform"],
                    "librknnrt": report["librknnrt"],
                    "install": f"librknnrt.so {report['librknnrt']} (Rockchip's rknn-toolkit2 "
                               f"repository, rknpu2 runtime) and, for Python, "
                               f"pip install rknn-toolkit-lite2=={report['librknnrt']}",
                    "licence": "RKNN SDK License (proprietary, Rockchip)"}}


def release_runtime(art: dict) -> dict:
    """A .rknn loads in librknnrt of the version the ABI declares, on the board's NPU."""
    return {"npu": art["requires"]["npu"], "device": "NPU"}


def _no_timer(artifact, entry, device, threads):
    raise NotImplementedError("RKNN artifacts cannot be timed on this machine (no NPU)")


RKNN = Backend(
    name=NAME, format=FORMAT, artifact=ARTIFACT, compile_stage="rknn_compile", tune_stage=None,
    stage_docs=(("rknn_compile", "build the static model with RKNN-Toolkit2 for each NPU ABI, simulated"),),
    made_by="rknn-toolkit2", vias=("simulator",),
    coverage_basis="no op table: RKNN-Toolkit2's own build is the check; the CPU fallbacks and "
                   "unsupported ops it reports are in its compile.json and the manifest's coverage",
    abi_schema=(NpuAbiDoc,), variants=True, configs=False,
    compile_fields=compile_fields, requires=requires,
    runner=runner_argv, validation_tools=validation_tools, what="NPU artifact (simulated)",
    run_hint="the simulator's outputs do not belong to the shipped file or to the golden "
             "inputs: rebuild (doit build), and report it if it repeats",
    wrong_hint="the NPU build is numerically off for the ABI's tolerance of its precision: read "
               "the toolkit's messages in compile.json (CPU fallbacks), loosen the ABI's "
               "tolerance only with a task metric to back it, or skip the ABI for this model",
    app=RknnLoader(),
    timer=_no_timer, runner_key=lambda device: f"rknn:{device}",
    validation_tolerance=validation_tolerance, validation_inputs=validation_inputs,
    variant_skip=variant_skip, timeable=False, release_runtime=release_runtime)
