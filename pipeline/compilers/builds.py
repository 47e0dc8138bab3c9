"""Which of a target's ABIs a model (or precision variant) is built for: the spec's skips, each
backend's own refusals, the coverage step's verdicts, and the ship slots that build only what
ships.

The compile, validate, choose and manifest stages (and `doit search`, `doit tune curve=1`) ask
here. Which compiler can take a model is a fact of the `coverage` step (its coverage.json, read
back here), not of loading: the steps after it are made once it has run (dodo.py creates them
after `coverage`). Before that (`doit list`), every ABI of the target is listed.

Kept out of stages/coverage.py, which writes the verdicts, so that the code digest of a compile
step does not take in the coverage stage's own imports (the static stage, TVM's importer).
"""
from __future__ import annotations

import json

from ..core.layout import coverage_file
from ..spec.tvm import budget
from ..spec.variants import FP16_FEATURES
from .backends import backend_named, backend_of
from .iree_targets import vulkan_target_record

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
    """Why the ABI is not built although it could be: the slot builds only what ships
    (`_not_shipped`), or it is an untuned build that cannot win (`cannot_win`)."""
    return _not_shipped(project, model, target, abi) or cannot_win(project, model, target, abi)


def cannot_win(project, model, target, abi) -> str | None:
    """An ABI of a backend that needs tuning (TVM: untuned CPU code ran 12-80x onnxruntime,
    ../shared/TOOLCHAIN.md) with no tuning budget or pinned database for the target, in a slot
    where another compiler's ABI is built for the model: it would lose, so it is not built.
    Built anyway with the model's explicit `ship:` choice of it, a pin of `doit search` for the
    slot (which timed it), or `untuned=1` (Project.untuned)."""
    backend = backend_of(abi)
    slot = next((s for s in target.ship if abi.name in s["abis"]), None)
    if (slot is None or backend.tune_stage is None or getattr(project, "untuned", False)
            or budget(model, target) or model.tvm.get("database", {}).get(target.name)
            or model.ship.get(target.name, {}).get(slot["name"]) == abi.name
            or slot["name"] in project.pinned_slots.get((target.name, model.name), {})):
        return None
    by_name = {a.name: a for a in target.abis}
    others = [n for n in slot["abis"] if backend_of(by_name[n]) is not backend
              and can_build(project, model, target, by_name[n])
              and not _not_shipped(project, model, target, by_name[n])]
    if not others:
        return None
    return (f"not built: an untuned {backend.title} build cannot win (untuned CPU code ran 12-80x "
            f"onnxruntime's time) and {others[0]} is built for slot {slot['name']}; the model has no "
            f"tuning budget or database for {target.name} (tvm.tune.{target.name} in its "
            f"model.yaml); built with one, with ship.{target.name}.{slot['name']}: {abi.name}, "
            f"or with untuned=1")


def _not_shipped(project, model, target, abi) -> str | None:
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


def proxy_pairs(project):
    """(target, abi) of the proxy targets that some loaded target's slots name."""
    names = {p for t in project.targets for s in t.ship for p in s["proxies"].values()}
    for target in project.proxies:
        for abi in target.abis:
            if f"{target.name}/{abi.name}" in names:
                yield target, abi


# ----------------------------------------------------------------------------- variants
def variant_abis(target) -> list:
    """The target's ABIs whose backend builds precision variants."""
    return [a for a in target.abis if backend_of(a).variants]


def variant_skip_reason(model, variant, abi, memo_dir) -> str | None:
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
