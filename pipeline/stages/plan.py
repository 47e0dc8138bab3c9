"""What the stages' step builders ask of the project: which ABIs a model is built for, and where
the files of the steps they read live.

Every stage module has `steps(project) -> list[Step]`; the project (pipeline/graph) holds the
layout, the model specs, the loaded targets, the targets loaded as proxies, and the tuning farm
settings. The questions they share are answered here, once.

Which compiler can take a model is a fact of the `coverage` step (its coverage.json), not of
loading: the steps after it are made once it has run (dodo.py creates them after `coverage`).
Before that (`doit list`), every ABI of the target is listed.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from ..compilers.backends import backend_named, backend_of
from ..core.store import atomic_write_text, canonical_json, sha256_text
from ..spec.variants import FP16_FEATURES, full_name
from .model_files import (ENTRY, golden_files, outputs_for, static_model,  # noqa: F401 (callers' names)
                          variant_inputs, variant_preprocessing, variant_tools)


def compilers(target) -> dict:
    """compiler -> the target's ABI names built by it."""
    out: dict = {}
    for abi in target.abis:
        out.setdefault(abi.compiler, []).append(abi.name)
    return out


# ----------------------------------------------------------------------------- coverage
def coverage_file(layout, target_name: str, model_name: str) -> Path:
    return layout.target_model_stage(target_name, model_name, "coverage") / "coverage.json"


_VERDICTS: dict = {}  # (path, mtime_ns, size) -> coverage.json: every stage asks, per ABI


def coverage(project, model, target) -> dict | None:
    """The coverage step's verdict per compiler, or None while it has not run."""
    path = coverage_file(project.layout, target.name, model.name)
    try:
        st = path.stat()
        key = (str(path), st.st_mtime_ns, st.st_size)
        if key not in _VERDICTS:
            _VERDICTS[key] = json.loads(path.read_text())
        return _VERDICTS[key]
    except (OSError, ValueError):
        return None


def skipped(project, model, target) -> set:
    """The backends the coverage step found unable to take the model (none while unknown)."""
    report = coverage(project, model, target)
    if report is None:
        return set()
    return {backend_named(c) for c, entry in report["compilers"].items()
            if entry["status"] == "skipped"}


def unsupported(project, model, target, backend) -> list[dict]:
    report = coverage(project, model, target) or {"compilers": {}}
    return report["compilers"].get(backend.name, {}).get("unsupported", [])


def built(project, model, target, abi) -> bool:
    """False when the spec skips the ABI, op coverage says its compiler cannot take the model, or
    another ABI of its slot is known to ship (`not_needed`)."""
    return can_build(project, model, target, abi) and not not_needed(project, model, target, abi)


def can_build(project, model, target, abi) -> bool:
    """Neither the spec nor op coverage leaves the ABI out for this model."""
    return (not model.skip_reason(abi.name)
            and backend_of(abi) not in skipped(project, model, target))


def not_needed(project, model, target, abi) -> str | None:
    """Why the ABI is not built although it could be: it is in a slot with `build: shipped`
    whose artifact that ships is known before anything is built (the model's explicit `ship:`
    choice, or policy prefer: the first candidate, since a failed validation fails the build),
    and it is not that one. A pin of `doit search` (which compares the bytes of every candidate)
    or a tuning budget for the ABI (the user asked for it) keeps every candidate built."""
    slot = next((s for s in target.ship if abi.name in s["abis"]), None)
    if slot is None or slot.get("build", "all") != "shipped":
        return None
    if slot["name"] in project.pinned_slots.get((target.name, model.name), {}):
        return None
    if backend_of(abi).tune_stage and budget(model, target):
        return None
    by_name = {a.name: a for a in target.abis}
    candidates = [n for n in slot["abis"] if can_build(project, model, target, by_name[n])]
    explicit = model.ship.get(target.name, {}).get(slot["name"])
    if explicit:
        ships, why = explicit, f"the model's spec ships {explicit} (ship.{target.name}.{slot['name']})"
    elif slot["policy"] == "prefer" and candidates:
        ships, why = candidates[0], f"{candidates[0]} ships (slot {slot['name']}: policy prefer)"
    else:
        return None
    if abi.name == ships or abi.name not in candidates:
        return None
    return (f"not built: {why}, and the slot builds only what ships (build: shipped in the "
            f"target); it is built when {ships} is skipped for the model, or with build: all")


def built_abis(project, model, target, backend) -> list:
    """The target's ABIs of this backend that the model is built for."""
    return [a for a in target.abis if backend.builds(a) and built(project, model, target, a)]


def proxy_abis(project, model, backend):
    """(target, abi) of the host proxies of this backend the model is built for (op coverage)."""
    for target, abi in proxy_pairs(project):
        if backend.builds(abi) and backend not in skipped(project, model, target):
            yield target, abi


def budget(model, target) -> dict | None:
    return model.tvm.get("tune", {}).get(target.name)


def proxy_pairs(project):
    """(target, abi) of the proxy targets that some loaded target's slots name."""
    names = {p for t in project.targets for s in t.ship for p in s["proxies"].values()}
    for target in project.proxies:
        for abi in target.abis:
            if f"{target.name}/{abi.name}" in names:
                yield target, abi


# ----------------------------------------------------------------------------- files


def abi_step_name(model, target, abi) -> str:
    return f"{target.name}/{model.name}/{abi.name}"


def where(model, target, abi=None) -> dict:
    return {"model": model.name, "target": f"{target.name}/{abi.name}" if abi else target.name}


# ----------------------------------------------------------------------------- variants
def variant_model(model, variant):
    """The ModelSpec the fp32 step builders see for a variant's chain (its name, its tolerance)."""
    return dataclasses.replace(model, name=full_name(model, variant), tolerance=variant.tolerance,
                               variants=())


def variant_abis(target) -> list:
    """The target's ABIs whose backend builds precision variants."""
    return [a for a in target.abis if backend_of(a).variants]


def variant_skip_reason(model, variant, abi, memo_dir: Path | None) -> str | None:
    """The spec's skip; and for an fp16 variant, a Vulkan target without 16-bit support."""
    why = (model.skip_reason(abi.name) or variant.skip_reason(abi.name)
           or backend_of(abi).variant_skip(abi, variant))
    if why or variant.precision != "fp16" or abi.backend != "vulkan-spirv":
        return why
    record = vulkan_target_record(abi.vulkan_target, abi.vulkan_features, memo_dir)
    missing = [f for f in FP16_FEATURES if f not in record["device_features"]]
    if missing:
        return (f"fp16 variant not built: IREE's {abi.vulkan_target} target declares no "
                f"{' / '.join(missing)} (its kernels would run fp16 graphs and return wrong "
                f"numbers, with no error)")
    return None


def vulkan_target_record(target: str, features: str | None, memo_dir: Path | None) -> dict:
    """What IREE compiles for a Vulkan target (its iree_gpu.target record: device features,
    subgroups): the recorded table (compilers/iree_targets.py); for a pair it lacks (features of
    the user's own), a one-op probe compile, memoised per IREE version."""
    from ..compilers.iree_targets import lookup, probe
    from ..core.tools import distribution_version
    version = distribution_version("iree-base-compiler")
    recorded = lookup(target, features, version)
    if recorded is not None:
        return recorded
    key = sha256_text(canonical_json({"iree": version, "target": target, "features": features,
                                      "record": 2}))
    memo = memo_dir / "vulkan_target_records" / f"{key}.json" if memo_dir else None
    if memo and memo.is_file():
        return json.loads(memo.read_text())
    record = probe(target, features)
    if memo:
        atomic_write_text(memo, canonical_json(record))
    return record


