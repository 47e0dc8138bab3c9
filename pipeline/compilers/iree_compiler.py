"""iree-compile and iree-import-onnx as pure functions: ABI config -> command line; tool output ->
what it means (the ONNX ops IREE could not lower). No IREE import at module level.

What IREE assumes about a Vulkan device per target name: iree_targets.py.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path


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


def unsupported_ops(log_text: str) -> list[str]:
    return sorted(set(_ILLEGAL_OP.findall(log_text)))




def import_argv(model: Path, mlir: Path) -> list[str]:
    """iree-import-onnx in this Python (the wheel's module entry point)."""
    return [sys.executable, "-m", "iree.compiler.tools.import_onnx", str(model), "-o", str(mlir)]


def find_compiler() -> str:
    """The iree-compile of the installed iree-base-compiler wheel."""
    from iree.compiler.tools.binaries import find_tool
    return find_tool("iree-compile")
