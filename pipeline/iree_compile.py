"""Stage `iree_compile`: static ONNX -> MLIR (iree-import-onnx) -> .vmfb for one target ABI.

The command line is a pure function of the ABI's config (`compile_argv`). Reproducibility:
the MLIR is always named model.mlir and source maps and debug symbols are stripped, so the
same model and flags give byte-identical .vmfb files in any folder.
When IREE cannot lower an op, the error lists the ONNX ops it could not legalize.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from .store import canonical_json
from .tools import describe_exit, run_tool, tail

VERSION = 3
OUTPUTS = ("model.vmfb", "compile.json")
REPRODUCIBLE_FLAGS = ("--iree-vm-bytecode-module-strip-source-map",
                      "--iree-llvmcpu-debug-symbols=false")
_ILLEGAL_OP = re.compile(r"failed to legalize operation 'torch\.operator'.*?name = \"onnx\.(\w+)\"")


def compile_flags(config: dict) -> list[str]:
    """The iree-compile flags for an ABI config, without file names."""
    if config["backend"] == "vulkan-spirv":
        flags = ["--iree-hal-target-device=vulkan", f"--iree-vulkan-target={config['vulkan_target']}"]
        if config["vulkan_features"]:
            flags.append(f"--iree-vulkan-target-features={config['vulkan_features']}")
        return flags + [REPRODUCIBLE_FLAGS[0]] + list(config["flags"])
    flags = ["--iree-hal-target-device=local",
             f"--iree-hal-local-target-device-backends={config['backend']}",
             f"--iree-llvmcpu-target-triple={config['triple']}",
             f"--iree-llvmcpu-target-cpu={config['cpu']}"]
    if config["cpu_features"]:
        flags.append(f"--iree-llvmcpu-target-cpu-features={','.join(config['cpu_features'])}")
    return flags + list(REPRODUCIBLE_FLAGS) + list(config["flags"])


def compile_argv(compiler: str, config: dict, mlir: Path, out: Path) -> list[str]:
    return [compiler, str(mlir), *compile_flags(config), "-o", str(out)]


def requirements(text: str) -> dict:
    """Device requirements from the target IREE stamped on the module's executables (all alike)."""
    from .vulkan import TARGET_RE, parse_target_info
    found = {canonical_json(parse_target_info(m.group(0))) for m in TARGET_RE.finditer(text)}
    if len(found) != 1:
        raise RuntimeError(f"expected one Vulkan target among the executables, found {len(found)}")
    return json.loads(found.pop())


def unsupported_ops(log_text: str) -> list[str]:
    return sorted(set(_ILLEGAL_OP.findall(log_text)))


def run(ctx) -> None:
    from iree.compiler.tools.binaries import find_tool

    where = dict(stage=ctx.step.stage, **ctx.step.where)
    mlir = ctx.scratch / "model.mlir"
    run_tool([sys.executable, "-m", "iree.compiler.tools.import_onnx",
              str(ctx.input("model")), "-o", str(mlir)],
             log=ctx.log, what="iree-import-onnx", **where)
    vmfb = ctx.output("model.vmfb")
    # Run in the scratch folder on a relative "model.mlir": some SPIR-V targets (llvmpipe) keep
    # the source file name in the artifact, which must not depend on where the build happens.
    argv = compile_argv(find_tool("iree-compile"), ctx.config, Path(mlir.name), vmfb)
    result = run_tool(argv, log=ctx.log, what="iree-compile", check=False, cwd=ctx.scratch, **where)
    if result.returncode != 0:
        mlir.unlink(missing_ok=True)
        ops = unsupported_ops(result.output)
        if ops:
            raise ctx.error(f"IREE ({ctx.config['backend']}) cannot compile these ONNX ops: "
                            f"{', '.join(ops)}", log=True,
                            hint="replace those ops in the model (or export it differently), or "
                                 "leave the model out of this target")
        if "Unknown Vulkan target" in result.output:
            raise ctx.error(f"IREE does not know the Vulkan target {ctx.config['vulkan_target']!r}",
                            log=True, hint="fix vulkan_target in the target's YAML")
        raise ctx.error(f"iree-compile failed ({describe_exit(result.returncode)}):\n"
                        f"{tail(result.output)}", log=True,
                        hint="read the log; the flags come from the target's ABI definition")
    report = {"compiler": "iree", "flags": compile_flags(ctx.config), "entry": ctx.config["entry"],
              "size": vmfb.stat().st_size}
    if ctx.config["backend"] == "vulkan-spirv":
        # The compiler's own target record, from a cheap second run that stops after creating
        # the executables. (Dumping sources during the real compile would embed their paths.)
        sources = ctx.scratch / "executables.mlir"
        run_tool(argv[:-2] + ["--compile-to=executable-sources", "-o", str(sources)],
                 log=ctx.log, what="iree-compile --compile-to=executable-sources",
                 cwd=ctx.scratch, **where)
        report["requires"] = {"vulkan": requirements(sources.read_text())}
        sources.unlink()
        if ctx.config.get("precision") == "fp16":  # never ship fp16 kernels to a device without fp16
            from .variants import FP16_FEATURES
            missing = [f for f in FP16_FEATURES
                       if f not in report["requires"]["vulkan"]["device_features"]]
            if missing:
                raise ctx.error(f"fp16 model compiled for {ctx.config['vulkan_target']}, which "
                                f"declares no {' / '.join(missing)}: its kernels would return "
                                f"wrong numbers without an error", hint="build fp16 variants for "
                                "Vulkan targets with 16-bit storage only (valhall*, llvmpipe, ...)")
    mlir.unlink(missing_ok=True)
    ctx.output("compile.json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
