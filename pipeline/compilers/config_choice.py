"""Which declared config an IREE CPU ABI of a model is built with, and where that came from.

    pin     models/<m>/configs/<target>.yaml (`doit search`, or the ABI it follows): always wins;
    search  no pin: the ranking of this build's `search_configs` step for the model and the ABI,
            timed here within the build's search budget (`search=SECONDS`); an ABI that follows
            another (`configs_from`, aarch64) takes a config from a pin only, since `doit search`
            validates the host's candidates under qemu before it pins one, and this does not;
    base    no pin and no search (`search=0`): the ABI's own flags, and the reason; on an ABI
            timed here, with `default`: the config UNPINNED names (below), which the compile
            step applies (compile.json: `from: default`) unless it changes nothing in the model.
An ABI that declares no `configs:` has nothing to choose (None).

The compile stage (which reads the ranking) and the search stage (which writes it) both ask
here, so neither imports the other.
"""
from __future__ import annotations

import os
from pathlib import Path

from ..core.errors import PipelineError
from ..spec.target import load_target
from .iree_backend import IREE

SEARCH_STAGE = "search_configs"
RANKING = "ranking.json"
DEFAULT_BUDGET_S = 180.0  # per model and host ABI, when search= is not given
# The declared config a model with no pin is built with on an ABI timed here when this build
# ranked none (search=0, or the search's budget ran out before a config besides default was
# validated), instead of the ABI's base flags; its rewrites are no-ops on a model with nothing to
# rewrite (compile.json then says `base`). None: the base flags. Chosen by the geometric mean of
# bench/iree_defaults.py over public models and generated op-class graphs, side by side with
# onnxruntime (docs/measurements/2026-12-03-iree-defaults.md, docs/configs.md), with 1-D Convs as
# MatMuls too (conv1d_as_matmul: five 1-D models 18.2x -> 1.9x onnxruntime; a model without a 1-D
# Conv gets dw-chunks-loops' bytes: docs/measurements/2026-12-03-conv1d.md).
# The compile step caps its iree-compile (default_cap_s) and checks its artifact against golden
# before keeping it; over the cap, failed or off golden, the base flags instead, and compile.json
# says so (config.default_tried).
UNPINNED: str | None = "dw-chunks-loops-conv1d"
# iree-compile's cap for the config UNPINNED names, in seconds: a rewrite that stalls the compiler
# (dw-chunks on basic-pitch ran past 8 minutes where the base took 37 s) falls back to the base
# flags instead of stalling the build. $MODELYARD_DEFAULT_CONFIG_CAP_S sets it; not in any step's
# key (a machine's speed is no input), and compile.json records the cap a build ran under.
CAP_VARIABLE = "MODELYARD_DEFAULT_CONFIG_CAP_S"
DEFAULT_CAP_S = 300.0
_TARGETS: dict = {}       # (registry folder, name) -> TargetSpec, for the ABIs followed


def has_configs(abi) -> bool:
    """An IREE CPU ABI that declares candidate configs (or follows another's)."""
    return IREE.builds(abi) and abi.backend == "llvm-cpu" and bool(abi.configs)


def timed_here(abi) -> bool:
    """Its artifacts run, and are timed, on this machine."""
    return has_configs(abi) and abi.run["via"] == "python"


def search_source(target, abi) -> tuple | None:
    """(target, ABI) whose search ranks this ABI's configs: itself when it is timed here, the ABI
    it follows (`configs_from: TARGET/ABI`) otherwise; None when neither."""
    if not has_configs(abi):
        return None
    if timed_here(abi):
        return target, abi
    if not abi.configs_from:
        return None
    name, abi_name = abi.configs_from.split("/")
    if name == target.name:
        other = target
    else:
        key = (target.path.parent, name)
        if key not in _TARGETS:
            _TARGETS[key] = load_target(name, target.path.parent)
        other = _TARGETS[key]
    source = next((a for a in other.abis if a.name == abi_name), None)
    return (other, source) if source is not None and timed_here(source) else None


def unpinned(abi) -> dict | None:
    """{name, flags, rewrites} of the config (UNPINNED) a model with no pin gets on this ABI when
    no search ranked one; None: the base flags (no such config declared, or an ABI not timed
    here: a follower's config comes from a pin only)."""
    declared = abi.config(UNPINNED) if UNPINNED and timed_here(abi) else None
    return None if declared is None else {"name": declared["name"], "flags": list(declared["flags"]),
                                          "rewrites": list(declared["rewrites"])}


def default_cap_s() -> float:
    """iree-compile's cap for the config of a model without a pin ($MODELYARD_DEFAULT_CONFIG_CAP_S,
    else DEFAULT_CAP_S)."""
    raw = os.environ.get(CAP_VARIABLE, "").strip()
    if not raw:
        return DEFAULT_CAP_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise PipelineError(f"${CAP_VARIABLE}={raw!r} is not a positive number of seconds",
                            stage="iree_compile",
                            hint=f"e.g. {CAP_VARIABLE}=600 (unset: {DEFAULT_CAP_S:g} s)")
    return value


def _default(abi) -> dict:
    config = unpinned(abi)
    return {"default": config} if config else {}


def budget_of(project) -> float:
    """The build's search budget in seconds per model and host ABI (0: no search)."""
    value = getattr(project, "search", None)
    return DEFAULT_BUDGET_S if value is None else float(value)


def decide(project, model, target, abi) -> dict | None:
    """{"from": "pin", "config": {...}} | {"from": "search", "source": (target, abi),
    "configs": [...]} | {"from": "base", "why": ...}; None: the ABI has no configs."""
    if not has_configs(abi):
        return None
    pinned = project.configs.get((target.name, model.name, abi.name))
    if pinned is not None:
        return {"from": "pin", "config": pinned}
    source = search_source(target, abi)
    if source is not None and not timed_here(abi):
        # A config right on x86 can be beyond the tolerance on aarch64 (docs/configs.md): only a
        # pin, which `doit search` validated under qemu before pinning, carries the host's choice
        # over; the in-build search's winner was validated on the host alone.
        return {"from": "base", "why": f"no pin: this build's search of {abi.configs_from} was "
                                       f"validated on the host only, and an aarch64 build takes a "
                                       f"searched config from a pin (`doit search` checks it "
                                       f"under qemu first)"}
    if source is None:
        return {"from": "base", "why": f"no pin, and {abi.configs_from or 'no ABI timed here'} "
                                       f"cannot be searched on this machine"}
    if budget_of(project) <= 0:
        return {"from": "base", "why": "no pin in the model folder, and search=0: the build "
                                       "searched no config", **_default(abi)}
    return {"from": "search", "source": source,
            "configs": [{"name": c["name"], "flags": list(c["flags"]),
                         "rewrites": list(c["rewrites"])} for c in abi.configs], **_default(abi)}


def ranking_file(layout, target_name: str, model_name: str, abi_name: str) -> Path:
    """Where the search step of (model, host ABI) writes its ranking."""
    return layout.artifact_stage(target_name, model_name, abi_name, SEARCH_STAGE) / RANKING
