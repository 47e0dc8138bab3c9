"""The project: the layout, the validated specs, the loaded targets; and its steps per stage.

Loading reads files only (the specs, the targets, the recorded compiler facts, the configs
`doit search` pinned in models/<m>/configs/): no compiler or runtime is imported or run. What
needs a tool is a step (op coverage is the `coverage` step).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..compilers import iree_targets
from ..core.errors import PipelineError, SpecError
from ..core.layout import Layout
from ..core.lock import writable
from ..core.settings import flag, setting
from ..core.steps import Step
from ..core.store import use_memo
from ..spec import TARGETS_DIR, ModelSpec, TargetSpec, display, known_targets, load_models, load_target
from ..spec.ship import check_explicit
from ..spec.target import check_skips, load_pins
from ..stages.search_configs import parse_budget
from .stages import BY_NAME


@dataclass(frozen=True)
class Project:
    layout: Layout
    models: tuple[ModelSpec, ...]
    targets: tuple[TargetSpec, ...]
    proxies: tuple = ()       # targets loaded only for their ABIs that proxy another's (choose)
    farm: dict = field(default_factory=dict)       # tracker=, key=, emulated= (doit tune)
    configs: dict = field(default_factory=dict)    # (target, model, abi) -> the pinned config
    pinned_slots: dict = field(default_factory=dict)  # (target, model) -> {slot: the pinned winner}
    search: float | None = None  # search=SECONDS per model and host ABI without a pin (None: the
                                 # default, compilers/config_choice.py; 0: no search in the build)
    untuned: bool = False        # untuned=1: build untuned TVM artifacts that cannot win (builds.cannot_win)

    def steps(self, stage: str) -> list[Step]:
        return BY_NAME[stage].steps(self)


def load_project(models: str | Path, artifacts: str | Path, target: str | None,
                 targets_dir: str | Path | None = None, farm: dict | None = None,
                 need_models: bool = False, search: str | None = None,
                 untuned: str | None = None) -> Project:
    """Specs validated up front (all problems at once); target=None means every known target.
    search, untuned: the doit variables as given; unset, $MODELYARD_SEARCH / $MODELYARD_UNTUNED or
    [tool.modelyard] decide, for `doit` and for code that loads a project itself alike.
    need_models: a models folder without a model is an error (dodo.py: for the commands that
    read the models; not for `doit new`, `verify`...). A models folder that is missing, or is a
    model's own folder, is one for every command."""
    models_dir = model_folders(models, need_models)  # before anything is written
    layout = Layout(Path(artifacts).resolve())
    memo = layout.cache if writable(layout.root) else None  # read-only: memoise in memory only
    if memo:
        use_memo(memo / "hashes.json")
    targets_dir = Path(targets_dir).resolve() if targets_dir else TARGETS_DIR
    names = [target] if target else known_targets(targets_dir)
    targets = tuple(load_target(n, targets_dir) for n in names)
    specs = load_models(models_dir, memo_dir=memo)
    problems = check_explicit(specs, targets) + check_skips(specs, targets_dir)
    loaded = {t.name for t in targets}
    wanted = sorted({p.split("/")[0] for t in targets for s in t.ship
                     for p in s["proxies"].values()} - loaded)
    proxies = tuple(load_target(n, targets_dir) for n in wanted)
    problems += [p for t in targets + proxies for p in iree_targets.check_target(t)]
    problems += check_configs_from(targets + proxies, targets_dir)
    warnings: list[str] = []
    configs, pinned_slots = load_pins(specs, targets + proxies, problems, warnings)
    if problems:
        raise SpecError(problems)
    for line in warnings:
        print(f"modelyard: warning: {line}", file=sys.stderr)
    return Project(layout, specs, targets, proxies=proxies, farm=dict(farm or {}),
                   configs=configs, pinned_slots=pinned_slots,
                   search=parse_budget(setting("search", search, env="MODELYARD_SEARCH")),
                   untuned=flag("untuned", untuned, env="MODELYARD_UNTUNED"))


_MODELS_HINT = ("give models=DIR the folder that holds one folder per model (default models/), "
                "or start one with doit new source=PATH name=NAME")


def model_folders(models: str | Path, need_models: bool = False) -> Path:
    """The models folder given, resolved: an error when it is missing, is itself a model's
    folder (models=models/pitch for models=models) or, with need_models, holds no model."""
    folder = Path(models).resolve()
    if not folder.is_dir():
        raise PipelineError(f"models={models}: no such folder ({folder})", stage="spec",
                            hint=_MODELS_HINT)
    none = f"no model folders ({display(folder)}/<name>/model.yaml) under {display(folder)}"
    if (folder / "model.yaml").is_file():
        raise PipelineError(f"{none}: this is a model folder: use models=its parent", stage="spec",
                            hint=f"give models={display(folder.parent)}")
    if need_models and not any(folder.glob("*/model.yaml")):
        raise PipelineError(none, stage="spec", hint=_MODELS_HINT)
    return folder


def check_configs_from(targets, targets_dir: Path) -> list[str]:
    """An ABI that follows another's pinned config (`configs_from: TARGET/ABI`) names an IREE
    ABI of a known target that declares configs of the same names."""
    problems, loaded = [], {t.name: t for t in targets}
    for target in targets:
        for abi in [a for a in target.abis if a.configs_from]:
            where = f"{display(target.path)}: abis.{abi.name}.configs_from"
            name, abi_name = abi.configs_from.split("/")
            if name not in loaded:
                if name not in known_targets(targets_dir):
                    problems.append(f"{where}: no target {name!r} (known: "
                                    f"{', '.join(known_targets(targets_dir))})")
                    continue
                loaded[name] = load_target(name, targets_dir)
            source = next((a for a in loaded[name].abis if a.name == abi_name), None)
            if source is None:
                problems.append(f"{where}: target {name} has no IREE ABI {abi_name!r}")
                continue
            mine, theirs = [c["name"] for c in abi.configs], [c["name"] for c in source.configs]
            if sorted(mine) != sorted(theirs):
                problems.append(f"{where}: its configs ({', '.join(mine) or 'none'}) must have the "
                                f"names of {abi.configs_from}'s ({', '.join(theirs) or 'none'}): "
                                f"it is built with whichever of them the search pins there")
    return problems
