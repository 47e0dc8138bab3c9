"""Running external tools: argv, exit code, stderr tail, log path; and what version each tool is.

Every child process the pipeline starts is started here: by run_tool (to completion; command
line and output appended to the step's log as the output comes, and line by line to a callback
when asked: tuning's progress) or by start_service (a server, until stop_services). On failure
the error carries the exit code, the tail of the output and that log's path.
"""
from __future__ import annotations

import contextlib
import functools
import glob
import importlib.metadata
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .errors import PipelineError
from .layout import REPO
from .store import sha256_file
from .timings import note_child, own_peak_kb

# Python distributions whose version is part of a step key when the step uses them.
DISTRIBUTIONS = ("onnx", "onnxsim", "onnxruntime", "numpy", "iree-base-compiler",
                 "iree-base-runtime", "pillow", "nnef-tools", "nnef", "tflite", "ai-edge-litert",
                 "apache-tvm", "apache-tvm-ffi", "xgboost-cpu", "cmake", "ninja")
# External binaries identified by the sha256 of their (resolved) file.
BINARIES = ("qemu-aarch64-static", "g++", "aarch64-linux-gnu-g++", "gcc", "aarch64-linux-gnu-gcc",
            "patch")

# The exit code of our own runners (pipeline/run/*_run.py) when they cannot write an output
# (sysexits' EX_CANTCREAT), after one line "cannot write PATH: REASON": run_tool reports that line,
# not a failure of the tool or of the artifact it ran.
CANNOT_WRITE = 73
WRITE_HINT = ("make that folder writable for this user (remount it read-write, chmod u+w or chown "
              "it), or build into another folder (artifacts=DIR); then build again")
ICD_DIR = Path("/usr/share/vulkan/icd.d")  # where Mesa installs its Vulkan drivers' manifests
SETUP_HINT = "run ./setup.sh (it installs every tool the pipeline needs)"


@functools.lru_cache(maxsize=None)
def distribution_version(name: str) -> str:
    """An installed package's version, read once per process (step keys ask for it per step)."""
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
        elif name == "rknn-toolkit2":
            tk = rknn_toolkit(required=False)
            out[name] = tk.version if tk else "missing"
        else:
            raise ValueError(f"unknown tool {name!r}")
    return out


def vulkan_driver_fingerprint(driver: str) -> str:
    """The sha256 of the driver library a Mesa ICD manifest points at (memoised)."""
    icd = icd_file(driver)
    if icd is None:
        return "missing"
    library = Path(json.loads(icd.read_text())["ICD"]["library_path"])
    if not library.is_absolute():
        library = icd.parent / library
    return f"sha256:{sha256_file(library)}" if library.is_file() else "missing"


# Software Vulkan drivers installed elsewhere than Mesa's folder: SwiftShader (Subzero JIT, a
# driver independent of Mesa) comes with Debian's chromium, which setup.sh installs
OTHER_ICDS = {"swiftshader": (Path("/usr/lib/chromium/vk_swiftshader_icd.json"),
                              ICD_DIR / "vk_swiftshader_icd.json")}


def icd_file(driver: str) -> Path | None:
    """The ICD manifest of a Vulkan driver by short name: lavapipe -> lvp_icd.*.json;
    swiftshader -> chromium's vk_swiftshader_icd.json."""
    if driver in OTHER_ICDS:
        return next((p for p in OTHER_ICDS[driver] if p.is_file()), None)
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
    output: str               # stdout and stderr, interleaved as the tool wrote them
    log: Path | None
    timed_out: bool = False


def run_tool(argv: list, *, log: Path | None, what: str, stage: str | None = None,
             model: str | None = None, target: str | None = None, hint: str | None = None,
             cwd: Path | None = None, env: dict | None = None, timeout: float | None = None,
             check: bool = True, on_line: Callable[[str], None] | None = None,
             progress: str | None = None) -> ToolRun:
    """Run `argv` to completion: the one way the pipeline starts a tool.

    The command line, then the output as it comes, then the exit code are appended to `log`
    (None: a probe outside any step, nothing is written). `on_line` is called with each output
    line as it comes (streaming, e.g. tuning's progress). Past `timeout` seconds the tool and
    its children are killed. With `check`, a failure raises PipelineError with the exit code,
    the tail of the output and the log. `progress` names the run in a line on stderr each
    PROGRESS_EVERY seconds while it lasts longer than that (lavapipe runs, long compiles).
    """
    argv = [str(a) for a in argv]
    where = dict(stage=stage, model=model, target=target)
    if not shutil.which(argv[0]) and not Path(argv[0]).is_file():
        raise PipelineError(f"{what}: tool {argv[0]!r} is not installed", hint=SETUP_HINT, **where)
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
    with open(log if log is not None else os.devnull, "a") as out:
        out.write(f"$ {shlex.join(argv)}\n")
        out.flush()
        start = time.monotonic()
        try:
            with _heartbeat(progress, what):
                rc, output, timed_out, cpu = _stream(argv, out, cwd, env, timeout, on_line)
        except OSError as exc:  # exists, but cannot be executed
            raise PipelineError(f"{what}: cannot start {argv[0]!r}: {exc}", hint=SETUP_HINT,
                                **where) from None
        if timed_out:
            output += f"\n(timed out after {timeout} s)"
            out.write(f"\n(timed out after {timeout} s)")
        out.write(f"\n[exit code {rc}, {time.monotonic() - start:.1f} s wall, {cpu:.1f} s CPU]\n\n")
    run = ToolRun(argv, rc, output, log, timed_out)
    said = rc == CANNOT_WRITE and next((line for line in output.splitlines()
                                        if line.startswith("cannot write ")), None)
    if check and said:  # our own runner could not write its output: not the tool's failure
        raise PipelineError(f"{what}: {said}; the step's outputs were not published",
                            hint=WRITE_HINT, log=str(log) if log is not None else None, **where)
    if check and rc != 0:
        raise PipelineError(f"{what} failed ({describe_exit(rc)}):\n{tail(output)}", hint=hint,
                            log=str(log) if log is not None else None, **where)
    return run


@dataclass(frozen=True)
class Budget:
    """How long a tool may run for one step: `seconds`, and `how` they were derived (in words,
    for the error when the tool runs past them)."""
    seconds: int
    how: str


def step_budget(size_bytes: int, nodes: int, *, floor: int, ceiling: int, per_mb: float,
                per_node: float, base: float = 0.0, factor: float = 1.0,
                override: int | None = None, override_from: str = "the spec") -> Budget:
    """A tool's time budget that follows the model it works on: base + per_mb * MB of the model
    file + per_node * graph nodes, times `factor` (e.g. an int8 build's extra passes), held
    within [floor, ceiling] seconds. A budget the spec gives (`override`) is taken as it is."""
    if override is not None:
        return Budget(int(override), f"set by {override_from}")
    mb = size_bytes / 1e6
    raw = (base + per_mb * mb + per_node * nodes) * factor
    seconds = int(round(min(max(raw, floor), ceiling)))
    bound = (" (the floor)" if raw < floor else " (the ceiling)" if raw > ceiling else "")
    times = f" x {factor:g}" if factor != 1 else ""
    return Budget(seconds, f"({base:g} s + {per_mb:g} s/MB x {mb:.2f} MB + {per_node:g} s/node x "
                           f"{nodes} nodes){times} = {raw:.0f} s, within [{floor}, {ceiling}] s"
                           f"{bound}")


PROGRESS_EVERY = 30.0  # seconds


@contextlib.contextmanager
def _heartbeat(name: str | None, what: str):
    """While the body runs: every PROGRESS_EVERY seconds, one line on stderr saying it still is."""
    if not name:
        yield
        return
    done, start = threading.Event(), time.monotonic()

    def beat() -> None:
        while not done.wait(PROGRESS_EVERY):
            print(f"modelyard: {name}: {what}, still running after "
                  f"{time.monotonic() - start:.0f} s", file=sys.stderr, flush=True)
    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()


def _stream(argv: list[str], out, cwd, env, timeout, on_line) -> tuple[int, str, bool]:
    """Run the child in a process group of its own, copying each output line to `out` (and to
    `on_line`) as it comes; the whole group is killed on timeout or on an exception here
    (Ctrl-C): a compiler's own children do not outlive it. Returns (exit code, output, timed out,
    the child's CPU seconds)."""
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace", process_group=0)
    expired = threading.Event()

    def kill() -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def on_timeout() -> None:
        expired.set()
        kill()

    timer = threading.Timer(timeout, on_timeout) if timeout else None
    lines = []
    try:
        if timer:
            timer.start()
        for line in proc.stdout:
            out.write(line)
            out.flush()
            lines.append(line)
            if on_line:
                on_line(line.rstrip("\n"))
        _, status, usage = os.wait4(proc.pid, 0)  # wait() with the child's rusage (peak memory)
        proc.returncode = rc = os.waitstatus_to_exitcode(status)
        cpu = note_child(usage, own_peak_kb())
    except BaseException:
        kill()
        proc.wait()
        raise
    finally:
        if timer:
            timer.cancel()
        proc.stdout.close()
    return (-signal.SIGKILL if expired.is_set() else rc), "".join(lines), expired.is_set(), cpu


def start_service(argv: list, *, log: Path | None, env: dict | None = None) -> subprocess.Popen:
    """Start a long-running tool (a server: the TVM RPC tracker, a board) in a session of its
    own, its output going to `log`; it runs until stop_services() ends it, children included."""
    argv = [str(a) for a in argv]
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
    with open(log if log is not None else os.devnull, "w") as out:
        out.write(f"$ {shlex.join(argv)}\n")
        out.flush()
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                                stdin=subprocess.DEVNULL, start_new_session=True)


def stop_services(procs: list[subprocess.Popen], grace_s: float = 10) -> None:
    """Stop services started by start_service, the last one first: SIGTERM to each one's process
    group, then SIGKILL to any still running after `grace_s` seconds."""
    for proc in reversed(procs):
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    for proc in reversed(procs):
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


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


@dataclass(frozen=True)
class RknnToolkit:
    """RKNN-Toolkit2 in its own virtual environment (setup.sh: its pins clash with .venv's)."""
    venv: Path
    version: str

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"


def rknn_toolkit(required: bool = True, **where) -> RknnToolkit | None:
    """Locate RKNN-Toolkit2's venv (.tools/rknn-venv) and its version (read, not imported)."""
    venv = tools_dir() / "rknn-venv"
    found = sorted(venv.glob("lib/python3*/site-packages/rknn_toolkit2-*.dist-info"))
    if (venv / "bin" / "python").exists() and found:
        return RknnToolkit(venv, found[-1].name.removesuffix(".dist-info").split("-")[1])
    if required:
        raise PipelineError(f"RKNN-Toolkit2 is not installed in {venv}", hint=SETUP_HINT, **where)
    return None


def qemu_aarch64(**where) -> str:
    exe = shutil.which("qemu-aarch64-static")
    if not exe:
        raise PipelineError("qemu-aarch64-static is not installed (needed to run aarch64 artifacts)",
                            hint=SETUP_HINT, **where)
    return exe


AARCH64_SYSROOT = "/usr/aarch64-linux-gnu"  # the aarch64 libc qemu-user loads programs against


def qemu_argv(cpu: str, *argv, **where) -> list[str]:
    """The command line that runs an aarch64 program here, under qemu-user as CPU model `cpu`."""
    return [qemu_aarch64(**where), "-L", AARCH64_SYSROOT, "-cpu", cpu, *(str(a) for a in argv)]


def cpu_model() -> str:
    """This machine's CPU model, as /proc/cpuinfo names it ("unknown" where it does not)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def python_module_argv(module: str, *args: str) -> list[str]:
    """Run one of our own modules in a child Python (a crash there cannot take doit down)."""
    return [sys.executable, "-m", module, *args]
