"""The TVM backend: TVM Relax -> a shared library (`model.so`) for an LLVM CPU target, run by TVM's
runtime (Relax VM). Its ONNX op coverage: tvm_ops.py; its stages: pipeline/stages/tvm_tune.py
(a MetaSchedule database, when a model has a budget) and tvm_compile.py; its ABI schema:
spec/tvm.py (TvmAbiDoc).
"""
from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

from ..core.tools import aarch64_tvm, distribution_version, qemu_aarch64
from ..run.tvm_timing import TvmCpuRunner
from ..run.tvm_load import TvmLoader
from ..run.tvm_run import FORMAT, RUNNER
from ..spec.tvm import TvmAbiDoc
from .backend import Backend

NAME = "tvm"
ARTIFACT = "model.so"
KIND = "llvm"   # TVM's target kind: the `backend` of its ABIs


def runner_argv(run: dict, entry: str, so: Path, inputs: list, outputs: list,
                where: dict, shader_cache: Path | None = None) -> tuple[list, dict, dict]:
    """The command that runs `so`, where and how it ran, and its environment (TVM artifacts
    run on the CPU: shader_cache is not used)."""
    args = [str(RUNNER), "--module", str(so), "--entry", entry,
            *[a for p in inputs for a in ("--input", str(p))],
            *[a for p in outputs for a in ("--output", str(p))]]
    env = {**os.environ, "TVM_USE_RUNTIME_LIB": "1"}
    if run["via"] == "python":
        executed = {"runtime": f"apache-tvm {distribution_version('apache-tvm')} runtime "
                               f"(Relax VM, Python)",
                    "device": run["device"], "emulated": False,
                    "where": f"{platform.machine()} build host, natively"}
        return [sys.executable, *args], executed, env
    qemu_aarch64(**where)  # the wrapper needs it on PATH: fail here with the setup hint
    tv = aarch64_tvm(**where)
    env["QEMU_CPU"] = run["qemu_cpu"]
    executed = {"runtime": f"apache-tvm {tv.version} runtime (Relax VM, aarch64 wheel, Python 3.11)",
                "device": run["device"], "emulated": True,
                "where": f"qemu-aarch64-static -cpu {run['qemu_cpu']} on the "
                         f"{platform.machine()} build host"}
    return [str(tv.python), *args], executed, env


def validation_tools(run: dict) -> tuple:
    return ("apache-tvm", "numpy") if run["via"] == "python" else \
        ("tvm-aarch64", "qemu-aarch64-static", "numpy")


def compile_fields(report: dict) -> dict:
    """The TVM target dict and the linker (TVM takes no flags)."""
    return {"flags": [], "target": report["target"], "linker": report["linker"]}


def requires(report: dict, tools: dict) -> dict:
    """The TVM runtime of the compiler's version (a .so loads in that runtime only)."""
    return {"tvm_runtime": {"package": "apache-tvm", "version": tools["apache-tvm"],
                            "ffi": tools["apache-tvm-ffi"],
                            "install": f"pip install apache-tvm=={tools['apache-tvm']} "
                                       f"apache-tvm-ffi=={tools['apache-tvm-ffi']}",
                            "libraries": "or only libtvm_runtime.so + libtvm_ffi.so "
                                         "from that wheel (C++ loader)"}}


def release_runtime(art: dict) -> dict:
    """A TVM .so loads in the TVM runtime of its compiler's version."""
    return {"tvm_runtime": art["requires"]["tvm_runtime"], "device": art["abi"]["run"]["device"]}


TVM = Backend(
    name=NAME, format=FORMAT, artifact=ARTIFACT, compile_stage="tvm_compile", tune_stage="tvm_tune",
    stage_docs=(("tvm_tune", "apply a model's MetaSchedule database (pinned or tuned by `doit tune`)"),
                ("tvm_compile", "compile the static model with TVM (Relax) for each TVM ABI")),
    made_by="apache-tvm",
    abi_schema=(TvmAbiDoc,), variants=False, configs=False,
    compile_fields=compile_fields, requires=requires,
    runner=runner_argv, validation_tools=validation_tools, what="TVM artifact",
    run_hint="read the log; SIGILL means the artifact uses CPU features the executing CPU lacks",
    wrong_hint="the TVM artifact is numerically wrong for this tolerance: compare with the "
               "untuned build (tuning budget 0), or report it to TVM",
    app=TvmLoader(),
    timer=TvmCpuRunner, runner_key=lambda device: f"tvm:{device}", release_runtime=release_runtime)
