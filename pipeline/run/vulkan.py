"""Vulkan facts: what a compiled artifact requires, what a present device offers, and whether they meet.

Requirements come from the compiler itself: the `iree_gpu.target<...>` attribute IREE stamps on
every executable it compiles (dumped during the real compile), never from a hand-written table.
Device capabilities come from the IREE runtime's own device dump (`iree-run-module
--dump_devices=vulkan`), which exists wherever the runtime wheel is installed (board included).

The rule that matters most: an artifact whose kernels use subgroup operations assumes one
subgroup size (valhall 16, ampere 32, llvmpipe 8). On a device with another size it runs
without any error and returns wrong numbers (see TOOLCHAIN.md), so it must not be chosen.
"""
from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from ..core.errors import PipelineError
from ..core.tools import ICD_DIR, icd_file, run_tool, vulkan_driver_fingerprint

SUBGROUP_OPS = {"shuffle": 0x10, "arithmetic": 0x4}  # VkSubgroupFeatureFlagBits


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split("."))


@dataclass(frozen=True)
class VulkanDevice:
    name: str
    api: str
    type: str
    driver: str
    features: dict = field(default_factory=dict)   # feature name -> bool
    subgroup_size: int = 0
    min_subgroup_size: int = 0
    max_subgroup_size: int = 0
    subgroup_operations: int = 0

    def describe(self) -> str:
        return f"{self.name} (Vulkan {self.api}, {self.type}, driver {self.driver})"


def parse_device_dump(text: str) -> list[VulkanDevice]:
    devices = []
    for block in re.split(r"^# --device=", text, flags=re.M)[1:]:
        get = lambda key: (re.search(rf"^{key}: (.*)$", block, re.M) or [None, ""])[1].strip()
        features = dict(re.findall(r"(\w+)=(yes|no)", get("features")))
        sub = get("subgroup")
        num = lambda key: int((re.search(rf"{key}=(0x[0-9a-f]+|\d+)", sub) or [0, "0"])[1], 0)
        devices.append(VulkanDevice(
            name=get("name"), api=get("api"), type=get("type"), driver=get("driver"),
            features={k: v == "yes" for k, v in features.items()}, subgroup_size=num("size"),
            min_subgroup_size=num("minSubgroupSize"), max_subgroup_size=num("maxSubgroupSize"),
            subgroup_operations=num("operations")))
    return devices


def meets(req: dict, device: VulkanDevice) -> list[str]:
    """Why `device` cannot run an artifact with requirements `req` (empty: it can)."""
    why = []
    if _version_tuple(device.api)[:2] < _version_tuple(req["vulkan_api"]):
        why.append(f"needs Vulkan {req['vulkan_api']} (SPIR-V {req['spirv_version']}), "
                   f"device has {device.api}")
    for feat in req["device_features"]:
        if not device.features.get(feat, False):
            why.append(f"needs {feat}")
    for op in req["subgroup_operations"]:
        if device.subgroup_operations and not device.subgroup_operations & SUBGROUP_OPS.get(op, 0):
            why.append(f"needs subgroup {op} operations")
    if req["subgroup_size"]:
        sizes = req["subgroup_size"]
        native = device.subgroup_size in sizes
        controllable = device.features.get("subgroupSizeControl") and any(
            device.min_subgroup_size <= s <= device.max_subgroup_size for s in sizes)
        if not (native or controllable):
            why.append(f"compiled for subgroup size {sizes}, device offers "
                       f"{device.min_subgroup_size}..{device.max_subgroup_size} "
                       f"(it would run and return wrong numbers)")
    return why


def driver_env(driver: str | None, base: dict | None = None, shader_cache: Path | None = None) -> dict:
    """Environment for a child that must use exactly `driver` (None: whatever the loader finds).

    shader_cache: a folder for Mesa's on-disk shader cache (lavapipe compiles every SPIR-V kernel
    with LLVM when a pipeline is made: 30 s for the small ppocr_cls fixture, 2.4 s from the
    cache). The validate stage keeps it in the workspace, one folder per driver build (Mesa keys
    its entries by shader and driver too), so that CI can keep it between runs."""
    env = dict(os.environ if base is None else base)
    if shader_cache is not None and driver:
        folder = Path(shader_cache) / vulkan_driver_fingerprint(driver).removeprefix("sha256:")[:16]
        folder.mkdir(parents=True, exist_ok=True)
        env["MESA_SHADER_CACHE_DIR"] = str(folder)
        env["MESA_SHADER_CACHE_DISABLE"] = "false"
    if not env.get("XDG_RUNTIME_DIR"):
        runtime_dir = Path(tempfile.gettempdir()) / f"modelyard-xdg-{os.getuid()}"
        runtime_dir.mkdir(mode=0o700, exist_ok=True)
        env["XDG_RUNTIME_DIR"] = str(runtime_dir)
    if driver:
        icd = icd_file(driver)
        if icd is None:
            raise PipelineError(f"Vulkan driver {driver!r}: no ICD manifest {ICD_DIR}/"
                                f"{driver}*_icd.*.json", hint="run ./setup.sh (installs "
                                "mesa-vulkan-drivers)")
        env["VK_DRIVER_FILES"] = env["VK_ICD_FILENAMES"] = str(icd)
    return env


def run_module_tool() -> Path:
    """The host IREE runtime's iree-run-module (ships in the iree-base-runtime wheel)."""
    import iree.runtime  # iree.runtime: 1.5 s, not needed by doit list
    return Path(iree.runtime.__file__).resolve().parent.parent / "_runtime_libs" / "iree-run-module"


def query_devices(env: dict | None = None, tool: Path | None = None) -> tuple[list[VulkanDevice], str]:
    """The Vulkan devices the IREE runtime sees, and the reason when there are none."""
    tool = tool or run_module_tool()
    try:
        result = run_tool([tool, "--dump_devices=vulkan"], log=None, what="iree-run-module "
                          "--dump_devices=vulkan", env=env, timeout=120, check=False)
    except PipelineError as exc:
        return [], f"cannot query Vulkan devices: {exc.what}"
    if result.timed_out:
        return [], "cannot query Vulkan devices: iree-run-module --dump_devices=vulkan timed out after 120 s"
    devices = parse_device_dump(result.output)
    if devices:
        return devices, ""
    # the tool's own error: the last line that is not part of its (empty) dump
    err = ([l for l in result.output.splitlines() if l.strip() and not l.startswith("#")]
           or ["no Vulkan device found"])[-1]
    err = re.sub(r"\x1b\[[0-9;]*m", "", err)
    return [], f"no usable Vulkan driver: {err}"
