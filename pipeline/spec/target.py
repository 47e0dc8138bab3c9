"""Target registry (pipeline/targets/*.yaml) -> frozen, validated TargetSpecs.

Every problem found is collected and reported at once, naming the file and the key.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal, Optional, Union

from pydantic import ConfigDict, Field

from ..core.errors import PipelineError, SpecError
from ..core.store import sha256_file
from .common import CLOSED, NAME_RE, Doc, Says, check_via, display, given, read_yaml, validate
from .ship import SlotDoc
from .ship import parse_target as parse_ship
from .tvm import TvmAbiDoc
from .tvm import parse_abi as parse_tvm_abi

TARGETS_DIR = Path(__file__).resolve().parents[1] / "targets"
# ----------------------------------------------------------------------------- targets
@dataclass(frozen=True)
class AbiSpec:
    """One compiled form of a model for a target: a compiler backend, a device, how to run it.

    backend llvm-cpu:     arch, triple, cpu, cpu_features; run.via python (this machine) | qemu
    backend vulkan-spirv: vulkan_target, vulkan_features (replaces the target's SPIR-V version
                          and capabilities, e.g. for Vulkan 1.1 drivers); run.via vulkan (run the
                          artifact itself on run.driver) | twin (the artifact cannot run here:
                          validate a twin compiled for run.twin from the same static model)
    """
    name: str
    compiler: str
    backend: str
    flags: tuple[str, ...]
    run: dict
    arch: str | None = None
    triple: str | None = None
    cpu: str | None = None
    cpu_features: tuple[str, ...] = ()
    vulkan_target: str | None = None
    vulkan_features: str | None = None
    fallbacks: tuple[dict, ...] = ()  # {drop, add, why}: flag sets tried in order when a build fails
    workarounds: tuple[dict, ...] = ()  # {name, flags, rewrites, why}: compiler bugs worked around

    def compile_config(self) -> dict:
        extra = {"fallbacks": [dict(f) for f in self.fallbacks]} if self.fallbacks else {}
        if self.workarounds:
            extra["workarounds"] = [{**w, "flags": list(w["flags"]), "rewrites": list(w["rewrites"])}
                                    for w in self.workarounds]
        if self.backend == "vulkan-spirv":
            return {"compiler": self.compiler, "backend": self.backend,
                    "vulkan_target": self.vulkan_target, "vulkan_features": self.vulkan_features,
                    "flags": list(self.flags), **extra}
        return {"compiler": self.compiler, "backend": self.backend, "arch": self.arch,
                "triple": self.triple, "cpu": self.cpu, "cpu_features": list(self.cpu_features),
                "flags": list(self.flags), **extra}

    def twin_config(self) -> dict:
        """The compile config of the runnable twin: same flags, the twin's Vulkan target."""
        return {**self.compile_config(), "vulkan_target": self.run["twin"], "vulkan_features": None}


@dataclass(frozen=True)
class TargetSpec:
    name: str
    description: str
    abis: tuple[AbiSpec, ...]
    fallback: tuple[str, ...]   # the order an app tries the ABIs in
    path: Path
    sha256: str
    tvm_abis: tuple = ()        # tvm_compile.TvmAbi: `compiler: tvm` ABIs (abis holds IREE's)
    ship: tuple = ()            # choice.parse_target(): slots of ABIs, one of which ships

    @property
    def all_abis(self) -> tuple:
        return self.abis + self.tvm_abis


_ARCHES = {"aarch64": "aarch64-linux-gnu", "x86_64": "x86_64-linux-gnu"}
BACKENDS = ("llvm-cpu", "vulkan-spirv")


class CpuRunDoc(Doc):
    """How the artifact is run here to validate it."""
    via: Literal["python", "qemu"]
    """python: this machine's IREE runtime (x86_64); qemu: the target's own runtime under qemu-user"""
    device: str = "local-task"
    """the IREE device"""
    qemu_cpu: str = None
    """qemu's -cpu (default max)"""


class VulkanRunDoc(Doc):
    """How the artifact is validated here."""
    via: Literal["vulkan", "twin"]
    """vulkan: run the artifact itself on the driver; twin: it cannot run here, validate a twin
    compiled for run.twin from the same static model"""
    driver: str = "lavapipe"
    twin: str = None
    """twin only: the IREE Vulkan target of the runnable twin, e.g. llvmpipe"""


class FallbackDoc(Doc):
    """Flags to retry an IREE build with when it fails with the ABI's own flags."""
    drop: list[str] = []
    """flags of the ABI's `flags` left out of this attempt"""
    add: list[str] = []
    """flags added for this attempt"""
    why: Annotated[str, Field(min_length=1)]
    """the known failure this works around, and what the artifact loses (recorded in compile.json)"""


# Graph rewrites an ABI may declare as workarounds (pipeline/stages/abi_rewrites.py: REWRITES)
ABI_REWRITES = ("depthwise_conv_as_dense",)


class WorkaroundDoc(Doc):
    """A compiler bug worked around for this ABI: flags added to every build of it, and/or graph
    rewrites applied to the static model before it is compiled. Each is recorded in compile.json
    and the manifest; tests/e2e/test_workarounds.py shows the bug still reproduces without it."""
    name: Annotated[str, Field(min_length=1)]
    """a short name, e.g. pad-fusion"""
    flags: list[str] = []
    """iree-compile flags added to every build of the ABI (and its twin)"""
    rewrites: list[Literal[ABI_REWRITES]] = []
    """graph rewrites applied to the static model first"""
    why: Annotated[str, Field(min_length=1)]
    """the bug: what goes wrong without it, and where it was found"""


class CpuAbiDoc(Doc):
    """An ABI built by IREE for a CPU."""
    compiler: Literal["iree"]
    backend: Literal["llvm-cpu"]
    arch: Literal[tuple(_ARCHES)]
    triple: str = None
    """default from arch"""
    cpu: str
    """LLVM CPU name, e.g. cortex-a55 (never one newer than the device's)"""
    cpu_features: list[str] = []
    flags: list[str] = []
    """more iree-compile flags"""
    fallbacks: list[FallbackDoc] = []
    """tried in order, each on its own, when iree-compile fails with `flags`"""
    workarounds: list[WorkaroundDoc] = []
    """compiler bugs worked around for this ABI (flags, graph rewrites)"""
    run: CpuRunDoc


class VulkanAbiDoc(Doc):
    """An ABI built by IREE for a Vulkan GPU (SPIR-V)."""
    compiler: Literal["iree"]
    backend: Literal["vulkan-spirv"]
    vulkan_target: Annotated[str, Field(min_length=1)]
    """an IREE Vulkan target name, e.g. valhall3 for the Mali-G610"""
    vulkan_features: str = None
    """replaces the target's SPIR-V version and capabilities, e.g. spirv:v1.3,cap:Shader"""
    flags: list[str] = []
    """more iree-compile flags"""
    fallbacks: list[FallbackDoc] = []
    """tried in order, each on its own, when iree-compile fails with `flags`"""
    workarounds: list[WorkaroundDoc] = []
    """compiler bugs worked around for this ABI (flags, graph rewrites)"""
    run: VulkanRunDoc


Abi = Annotated[Union[Annotated[Union[CpuAbiDoc, VulkanAbiDoc], Field(discriminator="backend")],
                      TvmAbiDoc], Field(discriminator="compiler")]


class TargetDoc(Doc):
    """pipeline/targets/<name>.yaml: a device, the ABIs built for it, the order an app tries them."""
    model_config = ConfigDict(title="target")
    description: str = ""
    """one line for people"""
    abis: Annotated[dict[Annotated[str, Field(pattern=NAME_RE.pattern), Says(
        f"ABI name must match {NAME_RE.pattern}")], Abi], Field(min_length=1, json_schema_extra=CLOSED)]
    """ABI name -> how it is compiled and run"""
    fallback: list[str] = None
    """every ABI exactly once, in the order an app tries them (default: as listed)"""
    ship: Optional[dict[str, SlotDoc]] = None
    """slot name -> ABIs that stand for one device, one of which ships per model"""


def known_targets(targets_dir: Path = TARGETS_DIR) -> list[str]:
    return sorted(p.stem for p in Path(targets_dir).glob("*.yaml"))


def load_target(name: str, targets_dir: Path = TARGETS_DIR) -> TargetSpec:
    targets_dir = Path(targets_dir)
    known = known_targets(targets_dir)
    if name not in known:
        raise PipelineError(f"unknown target {name!r}; known targets: {', '.join(known)}",
                            stage="spec", hint=f"say target=NAME with a known name, or add "
                                               f"{display(targets_dir / name)}.yaml")
    path = targets_dir / f"{name}.yaml"
    problems = []
    raw = read_yaml(path, problems)
    where = display(path)
    doc = None if problems else validate(TargetDoc, raw, where, problems)
    abis, fallback, ship = [], (), ()
    if doc is not None:
        for abi_name, body in (doc.abis or {}).items():
            abi = _abi(abi_name, body, f"{where}: abis.{abi_name}", problems)
            if abi:
                abis.append(abi)
        names = list(doc.abis or {})
        fallback = names if doc.fallback is None and not given(doc, "fallback") else doc.fallback
        if fallback is not None and sorted(fallback) != sorted(names):
            problems.append(f"{where}: fallback: must list every ABI exactly once, in the order an "
                            f"app should try them (ABIs: {', '.join(names)}; got {fallback!r})")
        native = {a.name for a in abis if a.run.get("via") in ("python", "vulkan")}
        ship = parse_ship(doc.ship, names, native, where, problems)
    if problems:
        raise SpecError(list(problems))
    return TargetSpec(name, doc.description, tuple(a for a in abis if a.compiler == "iree"),
                      tuple(fallback), path, sha256_file(path),
                      tvm_abis=tuple(a for a in abis if a.compiler == "tvm"), ship=ship)


def _abi(name: str, doc, where: str, problems: list):
    """An ABI of the target as AbiSpec (IREE) or TvmAbi, or None (problems appended)."""
    if isinstance(doc, TvmAbiDoc):
        return parse_tvm_abi(name, doc, where, problems)
    if doc is None or doc.run is None:
        return None
    run = doc.run
    fallbacks = _fallbacks(doc, where, problems)
    workarounds = tuple({"name": w.name, "flags": tuple(w.flags), "rewrites": tuple(w.rewrites),
                         "why": w.why} for w in (doc.workarounds or ()))
    for k, w in enumerate(workarounds):
        if not (w["flags"] or w["rewrites"]):
            problems.append(f"{where}.workarounds[{k}]: give flags or rewrites (what works around {w['name']!r})")
    if isinstance(doc, CpuAbiDoc):
        if not check_via(doc.arch, run.via, where, problems) or doc.cpu is None:
            return None
        return AbiSpec(name=name, compiler="iree", backend=doc.backend, flags=tuple(doc.flags or ()),
                       arch=doc.arch, triple=doc.triple or _ARCHES[doc.arch], cpu=doc.cpu,
                       cpu_features=tuple(doc.cpu_features or ()), fallbacks=fallbacks,
                       workarounds=workarounds, run={"via": run.via, "device": run.device,
                            **({"qemu_cpu": run.qemu_cpu or "max"} if run.via == "qemu" else {})})
    if run.via == "twin" and run.twin is None:
        problems.append(f"{where}.run.twin: name the Vulkan target of the runnable twin (e.g. llvmpipe)")
        return None
    return AbiSpec(name=name, compiler="iree", backend=doc.backend, flags=tuple(doc.flags or ()),
                   vulkan_target=doc.vulkan_target, vulkan_features=doc.vulkan_features,
                   fallbacks=fallbacks, workarounds=workarounds,
                   run={"via": run.via, "driver": run.driver,
                        **({"twin": run.twin} if run.via == "twin" else {})})


def _fallbacks(doc, where: str, problems: list) -> tuple[dict, ...]:
    """The ABI's declared fallbacks as {drop, add, why}; each gives drop or add. A fallback that
    leaves the flags as they are (it drops a flag the ABI no longer has) is kept but never tried
    (iree_compiler.attempts): editing `flags` does not force editing the fallbacks."""
    out = []
    for k, f in enumerate(doc.fallbacks or ()):
        drop, add = list(f.drop or ()), list(f.add or ())
        if not drop and not add:
            problems.append(f"{where}.fallbacks[{k}]: give drop or add (flags to leave out or add)")
        out.append({"drop": drop, "add": add, "why": f.why})
    return tuple(out)
