"""A small runtime helper for apps and tests: pick the artifact the present device can run, run it.

    from pipeline.run.app import Runner
    runner = Runner.open("artifacts/rk3588/manifest.json", "ppocr_det")   # or prefer=/vulkan_driver=
    runner = Runner.open("artifacts/rk3588/manifest.json", "ppocr_cls", variant="int8")
                                       # a precision variant (the manifest's "ppocr_cls.int8")
    print(runner.choice.explain())     # which artifact, and why each one before it was passed over
    (probs,) = runner.run(image)       # numpy in, numpy out; the module is loaded once

The target's fallback order (manifest `target.fallback`) is walked in order; the first artifact
whose requirements the present machine meets is loaded:
  * Vulkan artifacts: a Vulkan device must exist and meet the artifact's recorded requirements
    (API/SPIR-V version, features, subgroup size). The loader's first device is used, but a
    software rasterizer (lavapipe) is never picked on its own: `vulkan_driver="lavapipe"` pins
    the Mesa software driver (headless CI, tests).
  * CPU artifacts: native when built for this machine's architecture; an aarch64 artifact on an
    x86_64 machine runs under qemu-user when `allow_emulation` (slow, for checks only).
`prefer="abi-name"` overrides the order: that artifact or a clear error, never a silent switch.
Where the manifest's `choice` says another compiler's artifact ships for the same device (a
slot), the others are passed over ("not the shipped choice"), unless named by `prefer`.
NPU artifacts (RKNN `.rknn`, first in the RK3588's order) load only where the machine has a
Rockchip NPU and rknn-toolkit-lite2 (librknnrt): elsewhere, such as on this build host, they are
passed over with that reason and the next ABI is tried; `prefer=` one is then a clear error.
TVM artifacts (`format: tvm-so`) load in TVM's runtime: in-process when native, through
pipeline/run/tvm_run.py on the aarch64 TVM runtime under qemu-user when emulated.

Vulkan readback works around iree-base-runtime 3.13's `to_host()` failure on drivers with
VK_EXT_external_memory_host (`minImportedHostPointerAlignment 4096`, TOOLCHAIN.md): results are
copied through a host-visible staging buffer allocated by the device itself.
"""
from __future__ import annotations

import json
import os
import platform
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from . import rknn_run, tvm_run, vulkan
from ..core.errors import PipelineError
from ..core.layout import Layout
from ..core.store import sha256_file
from ..core.tools import aarch64_runtime, aarch64_tvm, qemu_aarch64, qemu_argv, run_tool

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


class Runner:
    def __init__(self, choice: Choice, fn, entry: str, emulated_argv=None, n_outputs: int = 1,
                 where: dict | None = None):
        self.choice, self._fn, self.entry = choice, fn, entry
        self._emulated_argv, self._n_outputs = emulated_argv, n_outputs
        self._where = where or {}

    # -------------------------------------------------------------------------- choosing
    @classmethod
    def open(cls, manifest: str | Path, model: str, *, variant: str | None = None,
             prefer: str | None = None, vulkan_driver: str | None = None,
             allow_emulation: bool = True, base: str | Path | None = None) -> "Runner":
        manifest = Path(manifest)
        doc = json.loads(manifest.read_text())
        layout = Layout(Path(base)) if base else Layout.of_manifest(manifest)
        target = doc["target"]["name"]
        if variant not in (None, "fp32"):  # a precision variant: its own manifest entry
            model = f"{model}.{variant}"
        where = {"model": model, "target": target}
        if model not in doc["models"]:
            raise PipelineError(f"no model {model!r} in {manifest} (it has: "
                                f"{', '.join(doc['models'])})", stage=STAGE, **where,
                                hint="a precision variant is listed only when it passed its "
                                     "accuracy gate; see `doit accuracy`")
        entry_doc = doc["models"][model]
        artifacts = entry_doc["artifacts"]
        order = [a for a in doc["target"].get("fallback", list(artifacts)) if a in artifacts]
        not_shipped = {abi: f"not the shipped choice ({slot['ships']} ships: {slot['reason']})"
                       for slot in entry_doc.get("choice", {}).values()
                       for abi in slot["candidates"] if abi != slot["ships"]}
        if prefer is not None:
            if prefer not in artifacts:
                raise PipelineError(f"no artifact {prefer!r} for {model} (it has: "
                                    f"{', '.join(order)})", stage=STAGE, **where)
            order = [prefer]
        considered, vk_cache = [], {}
        if prefer is None:
            considered += [(abi, f"not built for this model: {why}")
                           for abi, why in sorted(entry_doc.get("skipped", {}).items())]
        for abi in order:
            art = artifacts[abi]
            why = None if prefer else not_shipped.get(abi)
            why = why or cls._why_not(art, vulkan_driver, allow_emulation, vk_cache)
            if why is None:
                path = layout.resolve(art["path"])
                choice = cls._choice(abi, art, path, vulkan_driver, vk_cache, considered)
                n_out = len(entry_doc["io"]["outputs"])
                runner = cls._load(choice, art, n_out, vulkan_driver, {**where, "target": f"{target}/{abi}"})
                runner._declared = [o.get("dtype") for o in entry_doc["io"]["outputs"]]
                return runner
            considered.append((abi, why))
        reasons = "; ".join(f"{abi}: {why}" for abi, why in considered)
        raise PipelineError(f"no artifact of {model} can run on this machine ({reasons})",
                            stage=STAGE, hint="build for this machine's target, or install the "
                            "missing driver", **where)

    @staticmethod
    def _vk_devices(driver, cache):
        if "devices" not in cache:
            cache["devices"], cache["why"] = vulkan.query_devices(vulkan.driver_env(driver))
        return cache["devices"], cache["why"]

    @classmethod
    def _why_not(cls, art, driver, allow_emulation, cache) -> str | None:
        abi = art["abi"]
        if art.get("format") == rknn_run.FORMAT:  # the NPU: a device of its own, never emulated
            return rknn_run.why_no_npu()
        if abi["backend"] == "vulkan-spirv":
            devices, why = cls._vk_devices(driver, cache)
            if not devices:
                return why
            if devices[0].type == "cpu" and driver is None:
                return (f"the only Vulkan device is {devices[0].name}, a software rasterizer, "
                        f"not a GPU (pass vulkan_driver='lavapipe' to use it anyway)")
            problems = vulkan.meets(art["requires"]["vulkan"], devices[0])
            return f"{devices[0].name}: " + "; ".join(problems) if problems else None
        machine = platform.machine()
        if abi["arch"] == machine:
            return None
        if abi["arch"] == "aarch64" and allow_emulation:
            tvm = art.get("format") == tvm_run.FORMAT
            if shutil.which("qemu-aarch64-static") and (
                    aarch64_tvm(required=False) if tvm else aarch64_runtime(required=False)):
                return None
            return (f"aarch64 artifact; qemu-aarch64-static or the aarch64 "
                    f"{'TVM' if tvm else 'IREE'} runtime is missing")
        return f"built for {abi['arch']}, this machine is {machine}"

    @classmethod
    def _choice(cls, abi, art, path, driver, cache, considered) -> Choice:
        backend = art["abi"]["backend"]
        if art.get("format") == rknn_run.FORMAT:
            return Choice(abi, path, backend, f"{art['abi']['target_platform']} NPU (librknnrt)",
                          False, considered)
        if backend == "vulkan-spirv":
            dev = cls._vk_devices(driver, cache)[0][0]
            return Choice(abi, path, backend, dev.describe(), False, considered)
        emulated = art["abi"]["arch"] != platform.machine()
        runtime = "TVM runtime" if art.get("format") == tvm_run.FORMAT else "IREE local-task"
        device = ("qemu-aarch64-static (emulated aarch64)" if emulated
                  else f"{platform.machine()} CPU ({runtime})")
        return Choice(abi, path, backend, device, emulated, considered)

    @classmethod
    def _load(cls, choice: Choice, art: dict, n_outputs: int, driver, where) -> "Runner":
        entry = art["entry"]
        if not choice.path.is_file():
            raise PipelineError(f"artifact file missing: {choice.path}", stage=STAGE, **where)
        if sha256_file(choice.path) != art["sha256"]:
            raise PipelineError(f"{choice.path} does not match its manifest sha256",
                                stage=STAGE, hint="rebuild, or restore the released file", **where)
        if art.get("format") == tvm_run.FORMAT:
            return cls._load_tvm(choice, entry, n_outputs, where)
        if art.get("format") == rknn_run.FORMAT:  # numpy in, numpy out, like TVM
            runner = cls(choice, rknn_run.RknnModule(str(choice.path)), entry, n_outputs=n_outputs)
            runner._numpy = True
            return runner
        if choice.emulated:
            rt_ = aarch64_runtime(stage=STAGE, **where)
            argv = qemu_argv(EMULATED_CPU, rt_.run_module, "--device=local-task",
                             f"--module={choice.path}", f"--function={entry}", stage=STAGE, **where)
            return cls(choice, None, entry, emulated_argv=argv, n_outputs=n_outputs, where=where)
        if choice.backend == "vulkan-spirv":
            env = vulkan.driver_env(driver)
            for key in ("VK_DRIVER_FILES", "VK_ICD_FILENAMES", "XDG_RUNTIME_DIR"):
                if key in env:
                    os.environ[key] = env[key]  # read by the Vulkan loader when IREE creates it
            fn = load_module(choice.path, "vulkan", entry, where)
        else:
            fn = load_module(choice.path, "local-task", entry, where)
        return cls(choice, fn, entry, n_outputs=n_outputs)

    @classmethod
    def _load_tvm(cls, choice: Choice, entry: str, n_outputs: int, where) -> "Runner":
        if not choice.emulated:
            module = tvm_run.TvmModule(str(choice.path), entry)
            return cls(choice, module, entry, n_outputs=n_outputs)
        qemu_aarch64(stage=STAGE, **where)
        tv = aarch64_tvm(stage=STAGE, **where)
        argv = [str(tv.python), str(tvm_run.RUNNER), "--module", str(choice.path), "--entry", entry]
        runner = cls(choice, None, entry, emulated_argv=argv, n_outputs=n_outputs, where=where)
        runner._tvm = True
        return runner

    _tvm = False
    _numpy = False   # the loaded module takes and returns numpy arrays (RKNN)
    _declared: list = []  # the outputs' dtypes in the manifest's io

    def _as_declared(self, outputs: list) -> list:
        """IREE's integers are signless: a uint8 output comes back as int8 with the same bytes.
        Read such an output as the dtype the manifest declares (as validation did)."""
        import numpy as np  # numpy: 0.2 s, not needed by doit list
        fixed = []
        for k, out in enumerate(outputs):
            want = np.dtype(self._declared[k]) if k < len(self._declared) and self._declared[k] else None
            if want is not None and out.dtype != want and out.dtype.kind in "iu" and \
                    want.kind in "iu" and out.dtype.itemsize == want.itemsize:
                out = out.view(want)
            fixed.append(out)
        return fixed

    # -------------------------------------------------------------------------- running
    def run(self, *inputs):
        """Run on numpy arrays; returns a list of numpy arrays (one per model output)."""
        import numpy as np  # numpy: 0.2 s, not needed by doit list
        if self._emulated_argv:
            with tempfile.TemporaryDirectory(prefix="modelyard-run-") as tmp:
                ins = [f"{tmp}/in{i}.npy" for i in range(len(inputs))]
                outs = [f"{tmp}/out{k}.npy" for k in range(self._n_outputs)]
                for path, array in zip(ins, inputs):
                    np.save(path, np.asarray(array))
                if self._tvm:  # the TVM runner script on the aarch64 Python
                    argv = self._emulated_argv + [a for p in ins for a in ("--input", p)] \
                        + [a for o in outs for a in ("--output", o)]
                    env = {**os.environ, "TVM_USE_RUNTIME_LIB": "1", "QEMU_CPU": EMULATED_CPU}
                else:  # iree-run-module
                    argv = self._emulated_argv + [f"--input=@{p}" for p in ins] \
                        + [f"--output=@{o}" for o in outs]
                    env = None
                run_tool(argv, log=None, what="emulated run", env=env, stage=STAGE, **self._where)
                return self._as_declared([np.load(o) for o in outs])
        if self.choice.backend == "llvm" or self._numpy:  # TVM, RKNN: numpy in, numpy out
            return self._fn(*inputs)
        results = self._fn(*inputs)
        if not isinstance(results, (tuple, list)):
            results = (results,)
        return self._as_declared([to_host(r) for r in results])
