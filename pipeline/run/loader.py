"""The app-side loader of a backend's artifacts: the interface each backend's loader answers.

A backend exports one loader (`Backend.app`: iree_load.py, tvm_load.py, rknn_load.py) and
pipeline/app's Runner asks it three questions about a manifest's artifact entry, never its name:
  * `why_not(art, ctx)`: why this machine cannot run it (None: it can);
  * `choice(abi, art, path, ctx, considered)`: the `Choice`, the device it will run on;
  * `load(choice, art, n_outputs, ctx, where)`: a module, called with numpy arrays, returning
    a list of numpy arrays (one per model output).
Beside it what the loaders share: the CPU artifacts' rules (native, or aarch64 under qemu-user)
and the emulated module (an argv per call, .npy files in and out).
"""
from __future__ import annotations

import os
import platform
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol

from ..core.tools import run_tool

STAGE = "runtime"
EMULATED_CPU = "cortex-a76"  # the qemu CPU model emulated artifacts run on


@dataclass
class Choice:
    abi: str
    path: Path
    backend: str
    device: str
    emulated: bool
    considered: list = field(default_factory=list)  # (abi, reason it was passed over)

    def explain(self) -> str:
        lines = [f"chose {self.abi} ({self.path.name}) on {self.device}"
                 + (" [emulated: correct numbers, meaningless speed]" if self.emulated else "")]
        lines += [f"  passed over {abi}: {why}" for abi, why in self.considered]
        return "\n".join(lines)


@dataclass
class Context:
    """What the app asked for (Runner.open's options), and what the loaders learned of this
    machine while choosing (`memo`: a Vulkan device query runs once per Runner.open)."""
    vulkan_driver: str | None = None   # pin a Vulkan driver ("lavapipe"); None: the loader's first GPU
    allow_emulation: bool = True       # an aarch64 artifact may run under qemu-user here
    _memo: dict = field(default_factory=dict, repr=False)

    def memo(self, key: str, compute: Callable):
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]


class AppLoader(Protocol):
    def why_not(self, art: dict, ctx: Context) -> str | None: ...

    def choice(self, abi: str, art: dict, path: Path, ctx: Context, considered: list) -> Choice: ...

    def load(self, choice: Choice, art: dict, n_outputs: int, ctx: Context, where: dict): ...


class CpuLoader:
    """CPU artifacts: native when built for this machine's architecture; an aarch64 artifact on
    another machine under qemu-user when the app allows emulation and the aarch64 runtime is there."""
    runtime = ""        # how messages name the runtime: IREE, TVM
    native_device = ""  # the runtime a native artifact runs in: "IREE local-task"

    def aarch64_runtime(self):
        """The aarch64 runtime setup.sh unpacks, or None."""
        raise NotImplementedError

    def why_not(self, art: dict, ctx: Context) -> str | None:
        abi, machine = art["abi"], platform.machine()
        if abi["arch"] == machine:
            return None
        if abi["arch"] == "aarch64" and ctx.allow_emulation:
            if shutil.which("qemu-aarch64-static") and self.aarch64_runtime():
                return None
            return (f"aarch64 artifact; qemu-aarch64-static or the aarch64 {self.runtime} "
                    f"runtime is missing")
        return f"built for {abi['arch']}, this machine is {machine}"

    def choice(self, abi: str, art: dict, path: Path, ctx: Context, considered: list) -> Choice:
        emulated = art["abi"]["arch"] != platform.machine()
        device = ("qemu-aarch64-static (emulated aarch64)" if emulated
                  else f"{platform.machine()} CPU ({self.native_device})")
        return Choice(abi, path, art["abi"]["backend"], device, emulated, considered)


class EmulatedModule:
    """An artifact run under qemu-user, one command per call: the inputs and outputs go through
    .npy files, passed as `arg("input", path)` / `arg("output", path)`; `env` is added to ours."""

    def __init__(self, argv: list, n_outputs: int, where: dict,
                 arg: Callable[[str, str], list], env: dict | None = None):
        self.argv, self.n_outputs, self.where, self.arg, self.env = argv, n_outputs, where, arg, env

    def __call__(self, *inputs) -> list:
        import numpy as np  # numpy: 0.2 s, not needed by doit list
        with tempfile.TemporaryDirectory(prefix="modelyard-run-") as tmp:
            ins = [f"{tmp}/in{i}.npy" for i in range(len(inputs))]
            outs = [f"{tmp}/out{k}.npy" for k in range(self.n_outputs)]
            for path, array in zip(ins, inputs):
                np.save(path, np.asarray(array))
            argv = self.argv + [a for p in ins for a in self.arg("input", p)] \
                + [a for o in outs for a in self.arg("output", o)]
            env = {**os.environ, **self.env} if self.env else None
            run_tool(argv, log=None, what="emulated run", env=env, stage=STAGE, **self.where)
            return [np.load(o) for o in outs]
