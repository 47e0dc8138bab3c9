"""The project: the layout, the validated specs, the loaded targets; and its steps per stage.

Loading reads files only (the specs, the targets, the recorded compiler facts): no compiler or
runtime is imported or run. What needs a tool is a step (op coverage is the `coverage` step).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..compilers import iree_targets
from ..core.errors import SpecError
from ..core.layout import Layout
from ..core.steps import Step
from ..core.store import use_memo
from ..spec import TARGETS_DIR, ModelSpec, TargetSpec, known_targets, load_models, load_target
from ..spec.ship import check_explicit
from .stages import BY_NAME


@dataclass(frozen=True)
class Project:
    layout: Layout
    models: tuple[ModelSpec, ...]
    targets: tuple[TargetSpec, ...]
    proxies: tuple = ()       # targets loaded only for their ABIs that proxy another's (choose)
    farm: dict = field(default_factory=dict)       # tracker=, key=, emulated= (doit tune)

    def steps(self, stage: str) -> list[Step]:
        return BY_NAME[stage].module.steps(self)


def load_project(models: str | Path, artifacts: str | Path, target: str | None,
                 targets_dir: str | Path | None = None, farm: dict | None = None) -> Project:
    """Specs validated up front (all problems at once); target=None means every known target."""
    layout = Layout(Path(artifacts).resolve())
    use_memo(layout.cache / "hashes.json")
    targets_dir = Path(targets_dir).resolve() if targets_dir else TARGETS_DIR
    names = [target] if target else known_targets(targets_dir)
    targets = tuple(load_target(n, targets_dir) for n in names)
    specs = load_models(Path(models).resolve(), memo_dir=layout.cache)
    problems = check_explicit(specs, targets)
    loaded = {t.name for t in targets}
    wanted = sorted({p.split("/")[0] for t in targets for s in t.ship
                     for p in s["proxies"].values()} - loaded)
    proxies = tuple(load_target(n, targets_dir) for n in wanted)
    problems += [p for t in targets + proxies for p in iree_targets.check_target(t)]
    if problems:
        raise SpecError(problems)
    return Project(layout, specs, targets, proxies=proxies, farm=dict(farm or {}))
