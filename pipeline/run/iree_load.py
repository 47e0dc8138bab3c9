"""IREE artifacts (`.vmfb`) in this process: loading one on a HAL driver, reading results back,
and the app-side loader of IREE's artifacts (`IreeLoader`, the IREE backend's `app`).

Vulkan readback works around iree-base-runtime 3.13's `to_host()` failure on drivers with
VK_EXT_external_memory_host (`minImportedHostPointerAlignment 4096`, TOOLCHAIN.md): results are
copied through a host-visible staging buffer allocated by the device itself.
"""
from __future__ import annotations

import os
from pathlib import Path

from . import vulkan
from ..core.errors import PipelineError
from ..core.tools import aarch64_runtime, qemu_argv
from .loader import EMULATED_CPU, STAGE, Choice, Context, CpuLoader, EmulatedModule

VULKAN = "vulkan-spirv"   # the `backend` of IREE's Vulkan ABIs


def to_host(device_array):
    """Read an IREE DeviceArray back through a staging buffer (works on every HAL driver)."""
    import numpy as np  # numpy: 0.2 s, not needed by doit list
    import iree.runtime as rt  # iree.runtime: 1.5 s, not needed by doit list

    view, device = device_array._buffer_view, device_array._device
    src = view.get_buffer()
    staging = device.allocator.allocate_buffer(
        memory_type=int(rt.MemoryType.HOST_LOCAL | rt.MemoryType.DEVICE_VISIBLE),
        allowed_usage=int(rt.BufferUsage.TRANSFER_TARGET | rt.BufferUsage.MAPPING_SCOPED),
        allocation_size=src.byte_length())
    sem = device.create_semaphore(0)
    device.queue_copy(src, staging, wait_semaphores=rt.HalFence.create_at(sem, 0),
                      signal_semaphores=rt.HalFence.create_at(sem, 1))
    rt.HalFence.create_at(sem, 1).wait()
    dtype = rt.HalElementType.map_to_dtype(view.element_type)
    return np.array(staging.map().asarray(tuple(view.shape), dtype))


def load_module(path: Path, driver: str, entry: str, where: dict):
    """Load a .vmfb on an IREE driver; an artifact built for another device is a clear error."""
    import iree.runtime as rt  # iree.runtime: 1.5 s, not needed by doit list
    try:
        module = rt.load_vm_flatbuffer_file(str(path), driver=driver)
        return module[entry]
    except (RuntimeError, ValueError) as exc:
        text = str(exc)
        if "INCOMPATIBLE" in text or "not found or unavailable" in text:
            raise PipelineError(f"{path.name} was built for another device than the IREE "
                                f"driver {driver!r} provides: {text.splitlines()[-1][:300]}",
                                stage=STAGE, hint="pick the artifact built for this device "
                                "(see the manifest's abi entries)", **where) from None
        if "UNAVAILABLE" in text or "VK_ERROR" in text:
            raise PipelineError(f"the IREE driver {driver!r} is not usable here: "
                                f"{text.splitlines()[-1][:300]}", stage=STAGE,
                                hint="install a Vulkan driver (mesa-vulkan-drivers for lavapipe) "
                                "or let the runner fall back to CPU", **where) from None
        raise


class IreeModule:
    """A loaded entry function: numpy in, IREE device arrays out, read back with to_host."""

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, *inputs) -> list:
        results = self.fn(*inputs)
        if not isinstance(results, (tuple, list)):
            results = (results,)
        return [to_host(r) for r in results]


class IreeLoader(CpuLoader):
    """Vulkan artifacts: a Vulkan device must exist and meet the artifact's recorded
    requirements (API/SPIR-V version, features, subgroup size); the loader's first device is
    used, but a software rasterizer (lavapipe) only when the app pins it (`vulkan_driver`).
    CPU artifacts: IREE's local-task driver natively, iree-run-module under qemu-user else."""
    runtime, native_device = "IREE", "IREE local-task"

    def aarch64_runtime(self):
        return aarch64_runtime(required=False)

    @staticmethod
    def _devices(ctx: Context):
        return ctx.memo("vulkan", lambda: vulkan.query_devices(vulkan.driver_env(ctx.vulkan_driver)))

    def why_not(self, art: dict, ctx: Context) -> str | None:
        if art["abi"]["backend"] != VULKAN:
            return super().why_not(art, ctx)
        devices, why = self._devices(ctx)
        if not devices:
            return why
        if devices[0].type == "cpu" and ctx.vulkan_driver is None:
            return (f"the only Vulkan device is {devices[0].name}, a software rasterizer, "
                    f"not a GPU (pass vulkan_driver='lavapipe' to use it anyway)")
        problems = vulkan.meets(art["requires"]["vulkan"], devices[0])
        return f"{devices[0].name}: " + "; ".join(problems) if problems else None

    def choice(self, abi: str, art: dict, path: Path, ctx: Context, considered: list) -> Choice:
        if art["abi"]["backend"] != VULKAN:
            return super().choice(abi, art, path, ctx, considered)
        return Choice(abi, path, VULKAN, self._devices(ctx)[0][0].describe(), False, considered)

    def load(self, choice: Choice, art: dict, n_outputs: int, ctx: Context, where: dict):
        entry = art["entry"]
        if choice.emulated:
            rt_ = aarch64_runtime(stage=STAGE, **where)
            argv = qemu_argv(EMULATED_CPU, rt_.run_module, "--device=local-task",
                             f"--module={choice.path}", f"--function={entry}", stage=STAGE, **where)
            return EmulatedModule(argv, n_outputs, where, lambda kind, path: [f"--{kind}=@{path}"])
        if choice.backend != VULKAN:
            return IreeModule(load_module(choice.path, "local-task", entry, where))
        env = vulkan.driver_env(ctx.vulkan_driver)
        for key in ("VK_DRIVER_FILES", "VK_ICD_FILENAMES", "XDG_RUNTIME_DIR"):
            if key in env:
                os.environ[key] = env[key]  # read by the Vulkan loader when IREE creates it
        return IreeModule(load_module(choice.path, "vulkan", entry, where))
