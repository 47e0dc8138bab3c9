"""The IREE backend: iree-compile -> a `.vmfb` for a CPU (llvm-cpu) or a Vulkan GPU (vulkan-spirv),
run by IREE's runtime. Its command lines: iree_compiler.py; its Vulkan facts: iree_targets.py;
its compile stage: pipeline/stages/iree_compile.py; its ABI schema: spec/target.py (CpuAbiDoc,
VulkanAbiDoc).
"""
from __future__ import annotations

import platform
from pathlib import Path

from ..core.errors import PipelineError
from ..core.tools import (SETUP_HINT, aarch64_runtime, distribution_version, python_module_argv,
                          qemu_argv)
from ..run import iree_run, vulkan
from ..run.iree_load import IreeLoader
from ..run.timing import IreeCpuRunner
from ..spec.target import CpuAbiDoc, VulkanAbiDoc
from .backend import Backend

NAME = "iree"
FORMAT = iree_run.FORMAT
ARTIFACT = "model.vmfb"


def runner_argv(run: dict, entry: str, vmfb, inputs: list, outputs: list, where: dict,
                shader_cache: Path | None = None) -> tuple[list, dict, dict | None]:
    """The command that runs `vmfb`, a description of where and how it ran, and its environment
    (shader_cache: where a Vulkan driver keeps the kernels it compiled, see vulkan.driver_env)."""
    if run["via"] in ("vulkan", "twin"):
        env = vulkan.driver_env(run["driver"], shader_cache=shader_cache)
        devices, why = vulkan.query_devices(env)
        if not devices:
            raise PipelineError(f"cannot run Vulkan artifacts here: {why}", hint=SETUP_HINT, **where)
        argv = python_module_argv("pipeline.run.iree_run", "--module", str(vmfb), "--function",
                                  entry, "--device", "vulkan",
                                  *[a for p in inputs for a in ("--input", str(p))],
                                  *[a for p in outputs for a in ("--output", str(p))])
        executed = {"runtime": f"iree-base-runtime {distribution_version('iree-base-runtime')} (Python)",
                    "device": devices[0].describe(), "emulated": False,
                    "where": f"Vulkan driver {run['driver']} on the {platform.machine()} build host"}
        return argv, executed, env
    if run["via"] == "python":
        argv = python_module_argv("pipeline.run.iree_run", "--module", str(vmfb), "--function",
                                  entry, "--device", run["device"],
                                  *[a for p in inputs for a in ("--input", str(p))],
                                  *[a for p in outputs for a in ("--output", str(p))])
        executed = {"runtime": f"iree-base-runtime {distribution_version('iree-base-runtime')} (Python)",
                    "device": run["device"], "emulated": False,
                    "where": f"{platform.machine()} build host, natively"}
        return argv, executed, None
    rt = aarch64_runtime(**where)
    argv = qemu_argv(run["qemu_cpu"], rt.run_module, f"--device={run['device']}",
                     f"--module={vmfb}", f"--function={entry}",
                     *[f"--input=@{p}" for p in inputs], *[f"--output=@{p}" for p in outputs],
                     **where)
    executed = {"runtime": f"iree-run-module {rt.version} (aarch64 wheel)",
                "device": run["device"], "emulated": True,
                "where": f"qemu-aarch64-static -cpu {run['qemu_cpu']} on the "
                         f"{platform.machine()} build host"}
    return argv, executed, None


def validation_tools(run: dict) -> tuple:
    via = run["via"]
    return {"python": ("iree-base-runtime", "numpy"),
            "qemu": ("iree-runtime-aarch64", "qemu-aarch64-static", "numpy"),
            "vulkan": ("iree-base-runtime", "numpy", f"vulkan-driver:{run.get('driver')}",
                       *(f"vulkan-driver:{d}" for d in run.get("also", ()))),
            "twin": ("iree-base-runtime", "numpy", f"vulkan-driver:{run.get('driver')}",
                     *(f"vulkan-driver:{d}" for d in run.get("also", ())))}[via]


def compile_fields(report: dict) -> dict:
    """The flags it was built with, and the pinned config (doit search, docs/configs.md) and
    workarounds when it had them."""
    return {"flags": report["flags"],
            **{k: report[k] for k in ("workarounds", "config") if k in report}}


def requires(report: dict, tools: dict) -> dict:
    """What compile.json recorded the device must offer (Vulkan: API, features, subgroups)."""
    return report.get("requires", {})


def release_runtime(art: dict) -> dict:
    """A .vmfb loads in the IREE runtime of its compiler's version, on the HAL driver it was built for."""
    iree = art["compile"]["tools"]["iree-base-compiler"]
    return {"iree_runtime": {"package": "iree-base-runtime", "version": iree,
                             "install": f"pip install iree-base-runtime=={iree}"},
            "hal_driver": "vulkan" if art.get("requires", {}).get("vulkan") else art["abi"]["run"]["device"]}


IREE = Backend(
    name=NAME, format=FORMAT, artifact=ARTIFACT, compile_stage="iree_compile", tune_stage=None,
    stage_docs=(("iree_compile", "compile the static model with IREE for each target ABI"),),
    made_by="iree-base-compiler", vias=("python", "qemu", "vulkan", "twin"),
    abi_schema=(CpuAbiDoc, VulkanAbiDoc), variants=True, configs=True,
    compile_fields=compile_fields, requires=requires,
    runner=runner_argv, validation_tools=validation_tools, what="artifact",
    run_hint="read the log; an INCOMPATIBLE error means the artifact was built for another "
             "device than the one running it",
    wrong_hint="the compiled artifact is numerically wrong for this tolerance: try without "
               "the ABI's optional flags, or report it to IREE",
    app=IreeLoader(),
    timer=IreeCpuRunner, runner_key=lambda device: device, release_runtime=release_runtime)
