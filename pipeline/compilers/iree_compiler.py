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
    """The iree-compile flags for an ABI config, without file names: the target's, the ABI's own
    `flags`, then those of the pinned config (`doit search`) and of its workarounds."""
    return _target_flags(config) + extra_flags(config)


def extra_flags(config: dict) -> list[str]:
    """The flags added to the ABI's own: its pinned config's (`config`: {name, flags}, see
    docs/configs.md), then its workarounds'."""
    pinned = list((config.get("config") or {}).get("flags") or ())
    return pinned + [f for w in config.get("workarounds") or () for f in w["flags"]]


def _target_flags(config: dict) -> list[str]:
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


def attempts(config: dict) -> list[dict]:
    """The flag sets a build tries, in order: the ABI's own flags, its pinned config's and its
    workarounds' flags, then each declared fallback (`fallbacks:` of the ABI in
    pipeline/targets/*.yaml) applied on its own to them (a fallback may drop a workaround's flag: a model the flag breaks is then built
    without it, and validation decides). Each is {"flags": the extra flags of this attempt,
    the pinned config's and workarounds' included, "fallback": None or {drop, add, why}}; a
    fallback that gives the same flags as an earlier attempt is left out."""
    base = list(config["flags"]) + extra_flags(config)
    out, seen = [], set()
    for fb in [None, *(config.get("fallbacks") or ())]:
        flags = base if fb is None else [f for f in base if f not in fb["drop"]] + list(fb["add"])
        if tuple(flags) not in seen:
            seen.add(tuple(flags))
            out.append({"flags": flags, "fallback": fb})
    return out


_DIAGNOSTIC = re.compile(r"^(?P<loc>\S.*?:\d+:\d+: |<unknown>:0: |)(?P<kind>error|note|warning): (?P<msg>.*)$")


def diagnostics(output: str, width: int = 300, limit: int = 12) -> list[str]:
    """IREE's own diagnostics in a tool's output: each `error:` line with its location, the
    source line it points at (the failing op, e.g. `torch.operator "onnx.Conv"`), and the
    `note:` lines that follow it, each cut to `width` characters; the IR an error note dumps
    ("see current operation: ...") is left out. Also LLVM/MLIR parser errors without a location.
    Empty when the output holds no diagnostic (then show its tail instead)."""
    lines = output.splitlines()
    out: list[str] = []
    for i, line in enumerate(lines):
        m = _DIAGNOSTIC.match(line)
        if not m or m["kind"] == "warning":
            continue
        text = line
        if m["kind"] == "note" and m["msg"].startswith("see current operation"):
            nxt = lines[i + 1].strip() if i + 1 < len(lines) else ""
            op = m["msg"].split(":", 1)[1].strip() or nxt
            text = f"{m['loc']}note: see current operation: {op}"
        elif m["kind"] == "note" and not out:
            continue  # a note before any error belongs to nothing we show
        text = _cut(text, width)
        if text in out:  # IREE repeats a note per pass that saw the op
            continue
        out.append(text)
        if m["kind"] == "error" and i + 1 < len(lines):
            src = lines[i + 1]
            if src.startswith("    ") and not _DIAGNOSTIC.match(src):
                out.append("    " + _cut(src.strip(), width - 4))
        if len([l for l in out if ": error: " in l or l.startswith("error: ")]) >= limit:
            break
    return out


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 3] + "..."


def first_error(output: str) -> str:
    """The first IREE `error:` line of a tool's output (or its last non-empty line)."""
    errors = [l for l in diagnostics(output) if ": error: " in l or l.startswith("error: ")]
    if errors:
        return errors[0]
    rest = [l.strip() for l in output.splitlines() if l.strip()]
    return _cut(rest[-1], 300) if rest else ""




def import_argv(model: Path, mlir: Path) -> list[str]:
    """iree-import-onnx in this Python (the wheel's module entry point)."""
    return [sys.executable, "-m", "iree.compiler.tools.import_onnx", str(model), "-o", str(mlir)]


def find_compiler() -> str:
    """The iree-compile of the installed iree-base-compiler wheel."""
    from iree.compiler.tools.binaries import find_tool  # iree.compiler: 0.15 s, not needed by doit list
    return find_tool("iree-compile")
