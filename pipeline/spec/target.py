"""Target registry (pipeline/targets/*.yaml) -> frozen, validated TargetSpecs; and the pins of
the compiler configurations `doit search` chose among an ABI's `configs:` (docs/configs.md).

Every problem found is collected and reported at once, naming the file and the key.
"""
from __future__ import annotations

import difflib
import fnmatch
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal, Optional, Union, get_args, get_origin

from pydantic import ConfigDict, Field

from ..core.errors import PipelineError, SpecError
from ..core.store import sha256_file
from ..core.tools import distribution_version
from .common import CLOSED, NAME_RE, Doc, Says, check_via, display, given, read_yaml, validate
from .npu import NpuAbiDoc
from .npu import parse_abi as parse_npu_abi
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
    configs: tuple[dict, ...] = ()    # {name, flags, rewrites, why}: `doit search`'s candidates
    configs_from: str | None = None   # TARGET/ABI whose pinned config this ABI is built with

    def config(self, name: str) -> dict | None:
        """The declared config of that name as {name, flags, rewrites}: "default" adds none."""
        if name == DEFAULT_CONFIG:
            return {"name": DEFAULT_CONFIG, "flags": (), "rewrites": ()}
        return next(({"name": c["name"], "flags": c["flags"], "rewrites": c["rewrites"]}
                     for c in self.configs if c["name"] == name), None)

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
    abis: tuple                 # every ABI, as listed: AbiSpec (IREE), TvmAbi, NpuAbi; `compiler` names its backend
    fallback: tuple[str, ...]   # the order an app tries the ABIs in
    path: Path
    sha256: str
    ship: tuple = ()            # choice.parse_target(): slots of ABIs, one of which ships


_ARCHES = {"aarch64": "aarch64-linux-gnu", "x86_64": "x86_64-linux-gnu"}
IREE_BACKENDS = ("llvm-cpu", "vulkan-spirv")   # IREE's HAL backends (an ABI's `backend`)
DEFAULT_CONFIG = "default"   # the config that adds no flag to the ABI's own: always a candidate


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
    also: list[Literal["swiftshader", "lavapipe"]] = []
    """other software drivers that run the same bytes too, each compared with golden: two
    independent drivers must agree (SwiftShader: builds without subgroup ops or fp16, e.g.
    vp_android_baseline_2022)"""


class FallbackDoc(Doc):
    """Flags to retry an IREE build with when it fails with the ABI's own flags."""
    drop: list[str] = []
    """flags of the ABI's `flags` left out of this attempt"""
    add: list[str] = []
    """flags added for this attempt"""
    why: Annotated[str, Field(min_length=1)]
    """the known failure this works around, and what the artifact loses (recorded in compile.json)"""


# Graph rewrites an ABI may declare as workarounds (pipeline/rewrite/abi_rewrites.py: REWRITES)
ABI_REWRITES = ("depthwise_conv_as_dense", "depthwise_conv3x3_as_slices", "depthwise_conv_as_slices",
                "depthwise_conv_as_slice_chunks", "conv_transpose_as_depth_to_space",
                "nearest_resize_as_expand", "strided_conv_as_im2col", "conv1d_as_matmul",
                "pointwise_conv_as_matmul")


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


class ConfigDoc(Doc):
    """A named set of iree-compile flags added to the ABI's own `flags`, and/or graph rewrites for
    speed applied to the static model first: one candidate of `doit search` (docs/configs.md). A
    build uses the one the model's pin names (none: no config)."""
    name: Annotated[str, Field(pattern=NAME_RE.pattern), Says(
        f"a config name must match {NAME_RE.pattern}, got {{input}}")]
    """a short name, e.g. o3 or im2col ("default", no extra flag, is always a candidate)"""
    flags: list[Annotated[str, Field(pattern=r"^--"), Says(
        "expected an iree-compile flag (starting with --), got {input}")]] = []
    """iree-compile flags added to the ABI's `flags` (before its workarounds' flags)"""
    rewrites: list[Literal[ABI_REWRITES]] = []
    """graph rewrites (pipeline/rewrite/abi_rewrites.py) applied to the static model, after the
    ABI's workarounds' ones"""
    why: Annotated[str, Field(min_length=1)]
    """what it changes, and where it was seen to help"""


TargetAbiRef = Annotated[str, Field(pattern=r"^[^/]+/[^/]+$"), Says(
    "expected TARGET/ABI (e.g. host/cpu-x86_64), got {input}")]


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
    configs: list[ConfigDoc] = []
    """named flag sets `doit search` builds, validates and times per model, besides "default"
    (no extra flag); the winner is pinned in models/<m>/configs/<target>.yaml and builds use it"""
    configs_from: TargetAbiRef = None
    """an ABI that cannot be timed here (aarch64) takes the config pinned for this host ABI
    (e.g. host/cpu-x86_64): same config names, its own flags"""
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


def _iree_abi(name: str, doc, where: str, problems: list) -> AbiSpec | None:
    """An IREE ABI of the target (CPU or Vulkan) as AbiSpec, or None (problems appended)."""
    if doc.run is None:
        return None
    run = doc.run
    fallbacks = _fallbacks(doc, where, problems)
    workarounds = tuple({"name": w.name, "flags": tuple(w.flags), "rewrites": tuple(w.rewrites),
                         "why": w.why} for w in (doc.workarounds or ()))
    for k, w in enumerate(workarounds):
        if not (w["flags"] or w["rewrites"]):
            problems.append(f"{where}.workarounds[{k}]: give flags or rewrites (what works around {w['name']!r})")
    if isinstance(doc, CpuAbiDoc):
        configs = _configs(doc, where, problems)
        if not check_via(doc.arch, run.via, where, problems) or doc.cpu is None:
            return None
        return AbiSpec(name=name, compiler="iree", backend=doc.backend, flags=tuple(doc.flags or ()),
                       arch=doc.arch, triple=doc.triple or _ARCHES[doc.arch], cpu=doc.cpu,
                       cpu_features=tuple(doc.cpu_features or ()), fallbacks=fallbacks,
                       workarounds=workarounds, configs=configs, configs_from=doc.configs_from,
                       run={"via": run.via, "device": run.device,
                            **({"qemu_cpu": run.qemu_cpu or "max"} if run.via == "qemu" else {})})
    if run.via == "twin" and run.twin is None:
        problems.append(f"{where}.run.twin: name the Vulkan target of the runnable twin (e.g. llvmpipe)")
        return None
    return AbiSpec(name=name, compiler="iree", backend=doc.backend, flags=tuple(doc.flags or ()),
                   vulkan_target=doc.vulkan_target, vulkan_features=doc.vulkan_features,
                   fallbacks=fallbacks, workarounds=workarounds,
                   run={"via": run.via, "driver": run.driver,
                        **({"twin": run.twin} if run.via == "twin" else {}),
                        **({"also": list(run.also)} if run.also else {})})


# The ABI documents a target YAML may hold, one row per backend (the `compiler:` they give): the
# document (a union of them where the backend has several kinds of ABI) and what reads one into
# the ABI spec its backend builds. A new backend is its document in a module of spec/ and a row.
ABI_SCHEMAS = (
    (Annotated[Union[CpuAbiDoc, VulkanAbiDoc], Field(discriminator="backend")], _iree_abi),
    (TvmAbiDoc, parse_tvm_abi),
    (NpuAbiDoc, parse_npu_abi),
)
Abi = Annotated[Union[tuple(doc for doc, _ in ABI_SCHEMAS)], Field(discriminator="compiler")]


def documents(schema) -> tuple[type, ...]:
    """The document classes of a row's schema (a class, or an Annotated union of them)."""
    if get_origin(schema) is Annotated:
        return documents(get_args(schema)[0])
    if get_origin(schema) is Union:
        return tuple(c for a in get_args(schema) for c in documents(a))
    return (schema,)


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
    return TargetSpec(name, doc.description, tuple(abis), tuple(fallback), path, sha256_file(path),
                      ship=ship)


def abi_names(targets_dir: Path = TARGETS_DIR) -> dict[str, list[str]]:
    """target -> the names of its ABIs, as its YAML lists them (read, not checked: a broken target
    file is reported by load_target when it is built; here it has no ABIs)."""
    out = {}
    for name in known_targets(targets_dir):
        raw = read_yaml(Path(targets_dir) / f"{name}.yaml", [])
        abis = raw.get("abis") if isinstance(raw, dict) else None
        out[name] = [str(a) for a in abis] if isinstance(abis, dict) else []
    return out


def check_skips(models, targets_dir: Path = TARGETS_DIR) -> list[str]:
    """A `skip:` pattern (a model's, or one of its precision variants') that names no ABI of any
    known target skips nothing: most likely a typo (`cpu-x86-64` for `cpu-x86_64`), and the build
    would go on as if the skip were not there. One problem per such pattern, listing every
    target's ABIs (and the closest name). Known: the targets of the registry in use and the
    project's own (pipeline/targets/), as a model spec is not written for one registry."""
    known = abi_names(TARGETS_DIR)
    if Path(targets_dir).resolve() != TARGETS_DIR:
        for target, names in abi_names(targets_dir).items():
            known[target] = names + [a for a in known.get(target, []) if a not in names]
    every = sorted({a for names in known.values() for a in names})
    listed = "; ".join(f"{t}: {', '.join(n)}" for t, n in sorted(known.items()) if n)
    problems = []
    for model in models:
        if model.shape_of is not None:
            continue  # a shape variant has its model's skips: reported once, for the model
        sections = [("skip", model.skip)] + [(f"variants.{v.name}.skip", v.skip)
                                             for v in model.variants]
        for key, skips in sections:
            for pattern, _ in skips:
                if any(fnmatch.fnmatchcase(a, pattern) for a in every):
                    continue
                close = difflib.get_close_matches(pattern, every, n=1)
                problems.append(f"{display(model.spec_path)}: {key}.{pattern}: matches no ABI of "
                                f"any target, so nothing would be skipped; "
                                f"{'did you mean ' + repr(close[0]) + '? ' if close else ''}"
                                f"name an ABI (or an fnmatch pattern matching one) of "
                                f"{listed or 'no target'}")
    return problems


def _abi(name: str, doc, where: str, problems: list):
    """An ABI of the target as its backend's spec (AbiSpec, TvmAbi, NpuAbi, ...), or None
    (problems appended)."""
    for schema, parse in ABI_SCHEMAS:
        if isinstance(doc, documents(schema)):
            return parse(name, doc, where, problems)
    return None  # no document: reported by the target document's check


def _configs(doc: CpuAbiDoc, where: str, problems: list) -> tuple[dict, ...]:
    """The ABI's candidate configs as {name, flags, why}: names unique and not "default", each a
    flag set of its own, none repeating a flag the ABI's `flags` already give."""
    out, names, sets = [], {}, {}
    for k, c in enumerate(doc.configs or ()):
        if c is None or None in (c.name, c.flags, c.rewrites, c.why):
            continue  # reported by the document's check
        cw = f"{where}.configs[{k}]"
        if not (c.flags or c.rewrites):
            problems.append(f"{cw}: give flags or rewrites (what config {c.name!r} changes)")
            continue
        if c.name == DEFAULT_CONFIG:
            problems.append(f"{cw}.name: {DEFAULT_CONFIG!r} is the config without extra flags, "
                            f"always a candidate: give this one another name")
        elif c.name in names:
            problems.append(f"{cw}.name: duplicate config {c.name!r} (also configs[{names[c.name]}])")
        names.setdefault(c.name, k)
        same = (sorted(set(c.flags)), list(c.rewrites))
        if same in sets.values():
            other = next(n for n, f in sets.items() if f == same)
            problems.append(f"{cw}: the same flags and rewrites as config {other!r}")
        sets.setdefault(c.name, same)
        again = [f for f in c.flags if f in (doc.flags or ())]
        if again:
            problems.append(f"{cw}.flags: {', '.join(again)} already in the ABI's flags (a config "
                            f"adds flags to them)")
        out.append({"name": c.name, "flags": tuple(c.flags), "rewrites": tuple(c.rewrites),
                    "why": " ".join(c.why.split())})
    if doc.configs_from and not out:
        problems.append(f"{where}.configs_from: declare the configs it follows (configs:, the "
                        f"same names as {doc.configs_from}'s, with this ABI's flags)")
    return tuple(out)


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


# ----------------------------------------------------------------------------- pins
PIN_FORMAT = "modelyard.configs/1"


def pin_path(model_dir: Path, target: str) -> Path:
    """Where `doit search target=T` pins the configs of a model folder's models (the model and
    its shape variants, each an entry of its own)."""
    return Path(model_dir) / "configs" / f"{target}.yaml"


class SearchedDoc(Doc):
    """When, where and with what the search ran."""
    date: str
    machine: dict
    tools: dict[str, str]
    """the versions of the compilers and runtimes timed: a build warns when its compiler differs"""
    window: dict
    onnxruntime: Optional[dict] = None
    """onnxruntime's p50 in the same rounds (the ratios' denominator)"""


class PinnedAbiDoc(Doc):
    """What `doit search` chose for one ABI of the model, and every candidate's figures."""
    follows: Optional[str] = None
    """(followers only) the TARGET/ABI whose candidates, fastest first, this ABI tried"""
    config: Optional[str]
    """the pinned config: builds add its flags (must still be declared, with the same flags);
    null when no candidate validated (builds then add none)"""
    flags: list[str]
    """its flags, as the ABI declared them when searched"""
    rewrites: list[str] = []
    """its graph rewrites, as declared when searched"""
    candidates: dict[str, dict]
    """per candidate: its flags, status, and figures (p50, ratio to onnxruntime, max abs), or
    where and why it failed"""


class PinnedSlotDoc(Doc):
    """The fastest validated ABI of a slot of the target, as measured."""
    ships: str
    reason: str
    """the figures in words (the choose stage quotes it)"""
    sha256: dict[str, str]
    """ABI -> the artifact timed: the pin applies only to builds of those very bytes"""
    figures: dict[str, dict]


class PinnedModelDoc(Doc):
    searched: SearchedDoc
    abis: dict[str, PinnedAbiDoc] = {}
    slots: dict[str, PinnedSlotDoc] = {}
    followers: dict[str, PinnedAbiDoc] = {}
    """TARGET/ABI -> the config pinned for an ABI that follows one of these (configs_from): the
    fastest here that validated there"""


class PinDoc(Doc):
    """models/<m>/configs/<target>.yaml, written by `doit search target=<target>`."""
    format: Literal[PIN_FORMAT]
    target: str
    models: dict[str, PinnedModelDoc]


def read_pin(path: Path, target: str, problems: list) -> PinDoc | None:
    """A pin file, checked; None (and problems) when it is not one for `target`."""
    where = display(path)
    raw = read_yaml(path, problems)
    doc = None if raw is None else validate(PinDoc, raw, where, problems)
    if doc is not None and doc.target is not None and doc.target != target:
        problems.append(f"{where}: target: {doc.target!r}, but the file is the pin of {target!r}")
        return None
    return doc if doc is not None and doc.models is not None else None


def load_pins(models, targets, problems: list, warnings: list) -> tuple[dict, dict]:
    """The configs the models' pins choose, checked against the targets' declared configs:
    ({(target, model, abi): {name, flags, rewrites, pin}},
     {(target, model): {slot: {ships, reason, sha256}}}).
    `pin` is the target whose search chose it: the ABI's own, or that of `configs_from`.

    A pinned config that the ABI no longer declares, or declares with other flags, is a problem
    (the build would not be what was measured); a pin searched with another compiler version is
    a warning (its flags still build and are validated, only their ranking may be stale)."""
    docs: dict = {}

    def entry(model, target_name: str):
        path = pin_path(model.dir, target_name)
        if path not in docs:
            docs[path] = read_pin(path, target_name, problems) if path.is_file() else None
        doc = docs[path]
        found = doc.models.get(model.name) if doc is not None else None
        if found is not None and found.searched is not None and (path, model.name) not in docs:
            docs[(path, model.name)] = True  # warned once
            was, now = (found.searched.tools or {}).get("iree-base-compiler"), \
                distribution_version("iree-base-compiler")
            if was != now:
                warnings.append(f"{display(path)}: {model.name} was searched with iree-base-compiler "
                                f"{was}, this is {now}: the pinned configs still build and are "
                                f"validated, but their ranking may be stale (doit search "
                                f"target={target_name} model={model.name})")
        return found

    configs, slots = {}, {}
    for target in targets:
        for model in models:
            own = entry(model, target.name)
            for abi in [a for a in target.abis if isinstance(a, AbiSpec)]:
                source, name = (abi.configs_from.split("/") if abi.configs_from
                                else (target.name, abi.name))
                pinned = entry(model, source) if source != target.name else own
                follower = f"{target.name}/{abi.name}"
                own_pin = pinned is not None and follower in (pinned.followers or {})
                if own_pin:  # what the search validated for this very ABI
                    chosen, key = pinned.followers[follower], f"followers.{follower}"
                else:
                    chosen = (pinned.abis or {}).get(name) if pinned is not None else None
                    key = f"abis.{name}"
                if chosen is None or chosen.config is None:
                    continue
                where = f"{display(pin_path(model.dir, source))}: models.{model.name}.{key}"
                hint = (f"search again (doit search target={source} model={model.name}), or "
                        f"declare it in {display(target.path)}")
                config = abi.config(chosen.config)
                if config is None:
                    declared = ", ".join([DEFAULT_CONFIG] + [c["name"] for c in abi.configs])
                    problems.append(f"{where}.config: {chosen.config!r} is not a config of "
                                    f"{target.name}/{abi.name} (it declares: {declared}): {hint}")
                elif ((source == target.name or own_pin)
                      and (list(config["flags"]), list(config["rewrites"]))
                      != (list(chosen.flags or ()), list(chosen.rewrites or ()))):
                    problems.append(f"{where}.flags: config {chosen.config!r} was measured with "
                                    f"flags {chosen.flags} and rewrites {chosen.rewrites or []}, "
                                    f"{display(target.path)} now declares "
                                    f"{list(config['flags'])} and {list(config['rewrites'])}: the "
                                    f"build would not be what was measured: {hint}")
                else:
                    configs[(target.name, model.name, abi.name)] = {
                        "name": config["name"], "flags": list(config["flags"]),
                        "rewrites": list(config["rewrites"]), "pin": source}
            if own is None:
                continue
            for abi in [a for a in target.abis if not isinstance(a, AbiSpec)]:  # no `configs:`
                chosen = (own.abis or {}).get(abi.name)
                if chosen is not None and chosen.config not in (None, DEFAULT_CONFIG):
                    problems.append(f"{display(pin_path(model.dir, target.name))}: models."
                                    f"{model.name}.abis.{abi.name}.config: a {abi.compiler.upper()} "
                                    f"ABI has no configs, only {DEFAULT_CONFIG!r}")
            known = {s["name"]: s for s in target.ship}
            for slot, body in (own.slots or {}).items():
                sw = f"{display(pin_path(model.dir, target.name))}: models.{model.name}.slots.{slot}"
                if body is None or body.ships is None:
                    continue
                if slot not in known or body.ships not in known[slot]["abis"]:
                    problems.append(f"{sw}: {body.ships!r} is not an ABI of slot {slot!r} of "
                                    f"{target.name} any more: search again (doit search "
                                    f"target={target.name} model={model.name})")
                    continue
                slots.setdefault((target.name, model.name), {})[slot] = {
                    "ships": body.ships, "reason": body.reason, "sha256": dict(body.sha256 or {})}
    return configs, slots
