"""Stage `validate`: run the very artifact that ships on the golden inputs and compare.

How an artifact runs is the ABI's `run.via`:
  python  this machine's IREE Python runtime, in a child process (x86_64 artifacts);
  qemu    the target's own IREE runtime (aarch64 wheel) under qemu-user-static -- the shipped
          bytes, emulated: correct numerics, meaningless timings.
validation.json records what ran, where and how, and the error figures against the tolerance.
A mismatch fails the step and leaves no validation.json behind.
"""
from __future__ import annotations

import json
import platform

from . import golden, vulkan
from .errors import PipelineError
from .store import sha256_file
from .numerics import compare, describe_failures, summary
from .tools import (SETUP_HINT, aarch64_runtime, distribution_version, python_module_argv,
                    qemu_aarch64, run_tool)

VERSION = 1
OUTPUTS = ("validation.json",)


def runner_argv(config: dict, vmfb, inputs: list, outputs: list, where: dict) -> tuple[list, dict, dict | None]:
    """The command that runs `vmfb`, a description of where and how it ran, and its environment."""
    run = config["run"]
    if run["via"] in ("vulkan", "twin"):
        env = vulkan.driver_env(run["driver"])
        devices, why = vulkan.query_devices(env)
        if not devices:
            raise PipelineError(f"cannot run Vulkan artifacts here: {why}", hint=SETUP_HINT, **where)
        argv = python_module_argv("pipeline.iree_run", "--module", str(vmfb), "--function",
                                  config["entry"], "--device", "vulkan",
                                  *[a for p in inputs for a in ("--input", str(p))],
                                  *[a for p in outputs for a in ("--output", str(p))])
        executed = {"runtime": f"iree-base-runtime {distribution_version('iree-base-runtime')} (Python)",
                    "device": devices[0].describe(), "emulated": False,
                    "where": f"Vulkan driver {run['driver']} on the {platform.machine()} build host"}
        return argv, executed, env
    if run["via"] == "python":
        argv = python_module_argv("pipeline.iree_run", "--module", str(vmfb), "--function",
                                  config["entry"], "--device", run["device"],
                                  *[a for p in inputs for a in ("--input", str(p))],
                                  *[a for p in outputs for a in ("--output", str(p))])
        executed = {"runtime": f"iree-base-runtime {distribution_version('iree-base-runtime')} (Python)",
                    "device": run["device"], "emulated": False,
                    "where": f"{platform.machine()} build host, natively"}
        return argv, executed, None
    rt = aarch64_runtime(**where)
    argv = [qemu_aarch64(**where), "-L", "/usr/aarch64-linux-gnu", "-cpu", run["qemu_cpu"],
            str(rt.run_module), f"--device={run['device']}", f"--module={vmfb}",
            f"--function={config['entry']}",
            *[f"--input=@{p}" for p in inputs], *[f"--output=@{p}" for p in outputs]]
    executed = {"runtime": f"iree-run-module {rt.version} (aarch64 wheel)",
                "device": run["device"], "emulated": True,
                "where": f"qemu-aarch64-static -cpu {run['qemu_cpu']} on the "
                         f"{platform.machine()} build host"}
    return argv, executed, None


def run_and_compare(ctx, executable, runner_argv, what: str, run_hint: str, wrong_hint: str):
    """Run an artifact on the golden inputs through `runner_argv` (this module's, or TVM's) and
    compare with golden; returns (doc, actual, names, executed, result). Fails the step when the
    run fails or the outputs are beyond the tolerance."""
    import numpy as np

    doc, _, expected = golden.load(ctx)
    inputs = [ctx.input(f"golden:{e['file']}") for e in doc["inputs"]]
    outputs = [ctx.scratch / f"actual_{k}.npy" for k in range(len(doc["outputs"]))]
    where = dict(stage=ctx.step.stage, **ctx.step.where)
    argv, executed, env = runner_argv(ctx.config, executable, inputs, outputs, where)
    run_tool(argv, log=ctx.log, what=f"running the {what} ({executed['where']})", env=env,
             hint=run_hint, timeout=3600, **where)
    actual = [np.load(p, allow_pickle=False) for p in outputs]
    for p in outputs:
        p.unlink()
    names = [o["name"] for o in doc["outputs"]]
    result = compare(actual, expected, names, ctx.config["tolerance"])
    if not result["passed"]:
        raise ctx.error(f"outputs differ from golden: {describe_failures(result)} "
                        f"({summary(result)})", hint=wrong_hint)
    return doc, actual, names, executed, result


def run(ctx) -> None:
    import numpy as np

    twin = ctx.config["run"]["via"] == "twin"
    doc, actual, names, executed, result = run_and_compare(
        ctx, ctx.input("twin.vmfb" if twin else "vmfb"), runner_argv,
        what="twin" if twin else "artifact",
        run_hint="read the log; an INCOMPATIBLE error means the artifact was built for another "
                 "device than the one running it",
        wrong_hint="the compiled artifact is numerically wrong for this tolerance: try without "
                   "the ABI's optional flags, or report it to IREE")
    vs_fp32 = None
    if "reference_tolerance" in ctx.config:  # a precision variant: also against fp32, within its gate
        reference = [np.load(ctx.input(f"golden:{e['file']}"), allow_pickle=False)
                     for e in doc["reference"]]
        vs_fp32 = compare([a.astype(r.dtype) for a, r in zip(actual, reference)], reference, names,
                          ctx.config["reference_tolerance"])
        if not vs_fp32["passed"]:
            raise ctx.error(f"the {ctx.config['precision']} artifact differs from fp32 beyond the "
                            f"variant's gate: {describe_failures(vs_fp32)} ({summary(vs_fp32)})",
                            hint="the variant passed its gate in onnxruntime; the compiled form "
                                 "does not: compare with its own golden (validation.json)")
    report = {"status": "passed", "executed": executed, "tolerance": ctx.config["tolerance"],
              "outputs": result["outputs"], "shipped_bytes_executed": not twin}
    if vs_fp32 is not None:
        report["vs_fp32"] = {"tolerance": ctx.config["reference_tolerance"],
                             "outputs": vs_fp32["outputs"]}
    if twin:
        # The shipped bytes were not run: say exactly what was, and what is still owed.
        report["status"] = "twin-passed"
        report["twin"] = {"vulkan_target": ctx.config["run"]["twin"],
                          "sha256": sha256_file(ctx.input("twin.vmfb")),
                          "shipped_sha256": sha256_file(ctx.input("vmfb")),
                          "why": "the shipped artifact assumes a device this machine does not "
                                 "have (its kernels would run here and return wrong numbers)",
                          "still_needed": "run the shipped artifact on the board and compare with "
                                          "golden before relying on it"}
    ctx.output("validation.json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
