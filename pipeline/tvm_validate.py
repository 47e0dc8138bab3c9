"""Stage `validate` for TVM artifacts: run the shipped `model.so` on the golden inputs and compare.

How it runs is the ABI's `run.via`, as for IREE artifacts:
  python  this machine's TVM runtime, in a child process (x86_64 artifacts);
  qemu    the aarch64 TVM runtime (the aarch64 wheel, on an aarch64 Python that setup.sh
          unpacks) under qemu-user-static: the shipped bytes, emulated -- correct numerics,
          meaningless timings.
Both run pipeline/tvm_run.py, which loads only TVM's runtime library, as a board would.
validation.json has the same schema as IREE's; a mismatch fails the step and leaves nothing.
"""
from __future__ import annotations

import json
import os
import platform
import sys
from pathlib import Path

from .tools import aarch64_tvm, distribution_version, qemu_aarch64

VERSION = 1
OUTPUTS = ("validation.json",)
RUNNER = Path(__file__).resolve().parent / "tvm_run.py"


def runner_argv(config: dict, so: Path, inputs: list, outputs: list,
                where: dict) -> tuple[list, dict, dict]:
    """The command that runs `so`, where and how it ran, and its environment."""
    args = [str(RUNNER), "--module", str(so), "--entry", config["entry"],
            *[a for p in inputs for a in ("--input", str(p))],
            *[a for p in outputs for a in ("--output", str(p))]]
    env = {**os.environ, "TVM_USE_RUNTIME_LIB": "1"}
    run = config["run"]
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


def run(ctx) -> None:
    from .validate import run_and_compare
    _, _, _, executed, result = run_and_compare(
        ctx, ctx.input("model.so"), runner_argv, what="TVM artifact",
        run_hint="read the log; SIGILL means the artifact uses CPU features the executing CPU lacks",
        wrong_hint="the TVM artifact is numerically wrong for this tolerance: compare with the "
                   "untuned build (tuning budget 0), or report it to TVM")
    report = {"status": "passed", "executed": executed, "tolerance": ctx.config["tolerance"],
              "outputs": result["outputs"], "shipped_bytes_executed": True}
    ctx.output("validation.json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
