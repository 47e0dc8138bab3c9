"""Running external tools: argv, exit code, stderr tail, log path; and what version each tool is.

Every tool run appends its command line and full output to a log file; on failure the error
carries the exit code, the tail of the output and that log's path.
"""
from __future__ import annotations

import glob
import importlib.metadata
import os
import shlex
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from .errors import PipelineError
from .layout import REPO
from .store import sha256_file

# Python distributions whose version is part of a step key when the step uses them.
DISTRIBUTIONS = ("onnx", "onnxsim", "onnxruntime", "numpy", "iree-base-compiler",
                 "iree-base-runtime", "pillow", "nnef-tools", "nnef", "tflite", "ai-edge-litert",
                 "apache-tvm", "apache-tvm-ffi", "xgboost-cpu")
# External binaries identified by the sha256 of their (resolved) file.
BINARIES = ("qemu-aarch64-static", "g++", "aarch64-linux-gnu-g++")

ICD_DIR = Path("/usr/share/vulkan/icd.d")  # where Mesa installs its Vulkan drivers' manifests
SETUP_HINT = "run ./setup.sh (it installs every tool the pipeline needs)"


def distribution_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "missing"


def versions(*names: str) -> dict[str, str]:
    """Versions of Python distributions and external binaries, for step keys and manifests.

    Binaries are identified by the sha256 of their file (memoised), which changes with any
    upgrade, whatever the binary prints as its version.
    """
    out = {}
    for name in names:
        if name in DISTRIBUTIONS:
            out[name] = distribution_version(name)
        elif name in BINARIES:
            exe = shutil.which(name)
            out[name] = f"sha256:{sha256_file(Path(exe).resolve())}" if exe else "missing"
        elif name.startswith("vulkan-driver:"):
            out[name] = vulkan_driver_fingerprint(name.split(":", 1)[1])
        elif name == "iree-runtime-aarch64":
            rt = aarch64_runtime(required=False)
            out[name] = rt.version if rt else "missing"
        elif name == "tvm-aarch64":
            tv = aarch64_tvm(required=False)
            out[name] = tv.version if tv else "missing"
        else:
            raise ValueError(f"unknown tool {name!r}")
    return out


def vulkan_driver_fingerprint(driver: str) -> str:
    """The sha256 of the driver library a Mesa ICD manifest points at (memoised)."""
    import json
    icd = icd_file(driver)
    if icd is None:
        return "missing"
    library = Path(json.loads(icd.read_text())["ICD"]["library_path"])
    if not library.is_absolute():
        library = icd.parent / library
    return f"sha256:{sha256_file(library)}" if library.is_file() else "missing"


def icd_file(driver: str) -> Path | None:
    """The ICD manifest of a Mesa driver by short name: lavapipe -> lvp_icd.*.json."""
    prefix = {"lavapipe": "lvp", "llvmpipe": "lvp"}.get(driver, driver)
    found = sorted(glob.glob(str(ICD_DIR / f"{prefix}_icd.*.json")))
    return Path(found[0]) if found else None


def tail(text: str, lines: int = 25) -> str:
    kept = text.strip().splitlines()[-lines:]
    return "\n".join("    " + line for line in kept)


@dataclass
class ToolRun:
    argv: list[str]
    returncode: int
    output: str
    log: Path


def run_tool(argv: list[str], *, log: Path, what: str, stage: str, model: str | None = None,
             target: str | None = None, hint: str | None = None, cwd: Path | None = None,
             env: dict | None = None, timeout: float | None = None, check: bool = True) -> ToolRun:
    """Run `argv`, appending command and output to `log`; raise PipelineError on failure."""
    log.parent.mkdir(parents=True, exist_ok=True)
    if not shutil.which(argv[0]) and not Path(argv[0]).is_file():
        raise PipelineError(f"{what}: tool {argv[0]!r} is not installed", stage=stage,
                            model=model, target=target, hint=SETUP_HINT)
    try:
        proc = subprocess.run(argv, cwd=cwd, env=env, timeout=timeout, stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              errors="replace")
        rc, output = proc.returncode, proc.stdout
    except subprocess.TimeoutExpired as exc:
        rc, output = -signal.SIGKILL, (exc.stdout or "") + f"\n(timed out after {timeout} s)"
        if isinstance(output, bytes):
            output = output.decode(errors="replace")
    with open(log, "a") as f:
        f.write(f"$ {shlex.join(str(a) for a in argv)}\n{output}\n[exit code {rc}]\n\n")
    run = ToolRun([str(a) for a in argv], rc, output, log)
    if check and rc != 0:
        raise PipelineError(f"{what} failed ({describe_exit(rc)}):\n{tail(output)}",
                            stage=stage, model=model, target=target, hint=hint, log=str(log))
    return run


def describe_exit(rc: int) -> str:
    """Exit codes people can read; a signal in particular (SIGILL = wrong CPU features)."""
    sig = -rc if rc < 0 else (rc - 128 if rc > 128 else 0)
    if sig and rc != 255:
        try:
            name = signal.Signals(sig).name
        except ValueError:
            return f"exit code {rc}"
        text = f"killed by {name}"
        if name == "SIGILL":
            text += ": the artifact uses CPU instructions the executing CPU lacks"
        return text
    return f"exit code {rc}"


@dataclass(frozen=True)
class Aarch64Runtime:
    """The aarch64 IREE runtime (from its PyPI wheel) run under qemu-user on this machine."""
    root: Path
    version: str

    @property
    def run_module(self) -> Path:
        return self.root / "iree" / "_runtime_libs" / "iree-run-module"


def tools_dir() -> Path:
    return Path(os.environ.get("MODELYARD_TOOLS", REPO / ".tools"))


def aarch64_runtime(required: bool = True, **where) -> Aarch64Runtime | None:
    """Locate the unpacked aarch64 iree-base-runtime matching the host's iree-base-runtime."""
    version = distribution_version("iree-base-runtime")
    root = tools_dir() / f"iree-base-runtime-{version}-aarch64"
    rt = Aarch64Runtime(root, version)
    if rt.run_module.is_file():
        return rt
    if required:
        raise PipelineError(f"the aarch64 IREE runtime {version} is not unpacked at {root}",
                            hint=SETUP_HINT, **where)
    return None


@dataclass(frozen=True)
class Aarch64Tvm:
    """An aarch64 Python with the aarch64 TVM wheel (setup.sh), run under qemu-user here.

    `python` is a wrapper script: it starts the aarch64 python3.11 under qemu-aarch64-static
    (QEMU_CPU picks the CPU model) with the wheel's site folder on its path.
    """
    root: Path
    version: str

    @property
    def python(self) -> Path:
        return self.root / "python"


def aarch64_tvm(required: bool = True, **where) -> Aarch64Tvm | None:
    """Locate the aarch64 Python + TVM of the host's apache-tvm version (unpacked by setup.sh)."""
    version = distribution_version("apache-tvm")
    tv = Aarch64Tvm(tools_dir() / f"tvm-{version}-aarch64", version)
    if tv.python.is_file() and (tv.root / "site" / "tvm").is_dir():
        return tv
    if required:
        raise PipelineError(f"the aarch64 Python with TVM {version} is not unpacked at {tv.root}",
                            hint=SETUP_HINT, **where)
    return None


def qemu_aarch64(**where) -> str:
    exe = shutil.which("qemu-aarch64-static")
    if not exe:
        raise PipelineError("qemu-aarch64-static is not installed (needed to run aarch64 artifacts)",
                            hint=SETUP_HINT, **where)
    return exe


def python_module_argv(module: str, *args: str) -> list[str]:
    """Run one of our own modules in a child Python (a crash there cannot take doit down)."""
    return [sys.executable, "-m", module, *args]
