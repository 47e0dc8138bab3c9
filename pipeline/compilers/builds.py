"""Which of a target's ABIs a model (or precision variant) is built for: the spec's skips, each
backend's own refusals, the coverage step's verdicts, and the ship slots that build only what
ships.

The compile, validate, choose and manifest stages (and `doit search`, `doit tune curve=1`) ask
here. Which compiler can take a model is a fact of the `coverage` step (its coverage.json, read
back here), not of loading: the steps after it are made once it has run (dodo.py creates them
after `coverage`). Before that (`doit list`), every ABI of the target is listed.

A slot that builds one candidate has a *fallback*: the next ABI of another compiler that could
build the model but is left out (`build: shipped`, or an untuned build that cannot win). Its
steps are in the graph, gated (graph/fallback.py): they build only when the preferred candidate
fails to compile or to validate, and each side leaves an *attempt* record (`attempt`, below)
that choose and manifest read instead of the artifacts, which may not exist.

Kept out of stages/coverage.py, which writes the verdicts, so that the code digest of a compile
step does not take in the coverage stage's own imports (the static stage, TVM's importer).
"""
from __future__ import annotations

import json
from pathlib import Path

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
    (`_not_shipped`), or it is an untuned build that cannot win (`cannot_win`); never for the
    slot's fallback (`fallback_pair`), whose steps build when the preferred candidate fails."""
    if fallback_role(project, model, target, abi):
        return None
    return _left_out(project, model, target, abi)


def _left_out(project, model, target, abi) -> str | None:
    return _not_shipped(project, model, target, abi) or cannot_win(project, model, target, abi)


def fallback_pair(project, model, target, slot: dict) -> dict | None:
    """{preferred, fallback, why} of a slot that builds one candidate while another compiler's
    ABI could build the model but is left out (`_not_shipped`, `cannot_win`): the fallback is
    built and validated only when the preferred fails to compile or validate. None for a slot
    with an explicit choice (the user's choice fails as it is), a pin of `doit search`, more than
    one candidate built, or an ABI validated through a twin (its twin's build is a step of its own)."""
    if model.ship.get(target.name, {}).get(slot["name"]):
        return None
    if slot["name"] in project.pinned_slots.get((target.name, model.name), {}):
        return None
    by_name = {a.name: a for a in target.abis}
    able = [by_name[n] for n in slot["abis"] if can_build(project, model, target, by_name[n])]
    left = {a.name: _left_out(project, model, target, a) for a in able}
    kept = [a for a in able if not left[a.name]]
    if len(kept) != 1 or kept[0].run.get("via") == "twin":
        return None
    preferred = kept[0]
    spare = [a for a in able if left[a.name] and backend_of(a) is not backend_of(preferred)
             and a.run.get("via") != "twin"]
    if not spare:
        return None
    return {"preferred": preferred.name, "fallback": spare[0].name, "why": left[spare[0].name]}


def fallback_role(project, model, target, abi) -> dict | None:
    """The slot's fallback_pair with `role` (preferred | fallback) when the ABI is one of them."""
    for slot in target.ship:
        if abi.name in slot["abis"]:
            pair = fallback_pair(project, model, target, slot)
            if pair and abi.name in (pair["preferred"], pair["fallback"]):
                return {**pair, "slot": slot["name"],
                        "role": "preferred" if abi.name == pair["preferred"] else "fallback"}
    return None


# ----------------------------------------------------------------------------- attempts
ATTEMPT = "{stage}.attempt.json"  # beside the stage's folder: <t>/<m>/<abi>/<stage>.attempt.json


def attempt_file(layout, target_name: str, model_name: str, abi_name: str, stage: str) -> Path:
    """The attempt record of a gated step (the preferred's or the fallback's compile or
    validate): status passed (with the step's key and outputs' sha256s), failed (the preferred's
    error: stage, class, what, hint) or not-needed (the fallback, when the preferred passed)."""
    return layout.artifact_stage(target_name, model_name, abi_name, ATTEMPT.format(stage=stage))


def read_attempt(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def attempt_status(path: Path) -> str | None:
    """An attempt record's status (passed | failed | not-needed), None while there is none."""
    try:
        return read_attempt(path)["status"]
    except (OSError, ValueError, KeyError):
        return None


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
            f"model.yaml); built when {others[0]} fails, with one, with "
            f"ship.{target.name}.{slot['name']}: {abi.name}, or with untuned=1")


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
            f"target); it is built when {ships} is skipped for the model or fails, or with "
            f"build: all")


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
