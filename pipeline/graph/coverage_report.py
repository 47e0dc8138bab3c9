"""`doit coverage [target=NAME]`: the coverage table of each loaded target, read from disk.

Each step's state (done, failed, todo, waiting) under its current key, the first failed step
of a model re-run to say why; the rows and their text are compilers/coverage_table.py's.
"""
from __future__ import annotations

import json
from pathlib import Path

from ..compilers.builds import attempt_status
from ..compilers.coverage_table import compilers_text, render, rewrites_of, row
from ..compilers.iree_backend import IREE
from ..core.errors import PipelineError
from ..core.steps import execute, read_record
from ..core.store import step_key


def _read(path: Path) -> dict | None:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def _state(step) -> str:
    """done (outputs on disk under the current key), failed (its last run with the current key
    failed: the log's first line names the key, no record does), todo, or waiting (an input is
    missing: an earlier step did not make it)."""
    try:
        key = step_key(step.key_parts())
    except OSError:
        return "waiting"
    record = read_record(step)
    if record and record.get("key") == key:
        return "done"
    try:
        with open(step.log) as f:
            first = f.readline()
    except OSError:
        return "todo"
    return "failed" if first.strip().endswith(f"key={key}") else "todo"


def _why(step) -> str:
    """Why a failed step failed: it runs again (a failure is never cached), and says it."""
    try:
        execute(step)
    except PipelineError as err:
        return err.render()
    return "it succeeded when run again for this report (a flaky step?): build again"


def disk_table(project, stage_names: list[str], target) -> dict:
    """Per model (and precision variant) of the project: its row for `target`, from the steps'
    states on disk. The first step (in stage order) whose last run failed stopped the model;
    it is run again to say why."""
    layout = project.layout
    mine = [(stage, step) for stage in stage_names if stage != "manifest"
            for step in project.steps(stage)]
    names = [(m, m.name) for m in project.models] + [
        (m, f"{m.name}.{v.name}") for m in project.models for v in m.variants]
    table = {}
    for model, name in names:
        def ours(stage, step):
            if step.where.get("model") not in (name, model.base if stage == "import" else name):
                return False
            t = step.where.get("target")
            return t is None or t == target.name or t.startswith(f"{target.name}/")
        steps = [(stage, step) for stage, step in mine if ours(stage, step)]
        stopped, built, shipped, fallbacks = None, True, [], {}
        for stage, step in steps:
            if step.gate is not None and attempt_status(step.gate.attempt) in ("not-needed", "failed"):
                continue  # a slot's fallback not needed, or a preferred that failed: its fallback says
            state = _state(step)
            if state == "failed" and stopped is None:
                stopped = {"stage": stage, "step": f"{stage}:{step.name}", "why": _why(step)}
            elif state == "todo" and stopped is None:
                built = False
            elif state == "done" and stage == "validate":
                shipped.append(step.where["target"].split("/", 1)[1])
            elif state == "done" and stage == IREE.compile_stage and not step.name.endswith("/twin"):
                fb = (_read(step.out_dir / "compile.json") or {}).get("fallback")
                if fb:
                    fallbacks[step.where["target"].split("/", 1)[1]] = fb
        report = _read(layout.target_model_stage(target.name, name, "coverage") / "coverage.json")
        choice = _read(layout.target_model_stage(target.name, name, "choose") / "choice.json")
        rewrites = rewrites_of(("import", _read(layout.model_stage(model.base, "import") / "import.json")),
                               ("static", _read(layout.model_stage(name, "static") / "static.json")))
        table[name] = row(sorted(set(shipped)), compilers_text(report), rewrites, fallbacks,
                          stopped=stopped, built=built and bool(steps),
                          choice={s: c["ships"] for s, c in ((choice or {}).get("slots") or {}).items()})
    return table


def doit_report(project, stage_names: list[str], only: str | None) -> str:
    """`doit coverage [target=NAME]`: the coverage table of each loaded target, from disk."""
    out = []
    for target in project.targets:
        if only in (None, target.name):
            out.append(render(target.name, disk_table(project, stage_names, target)))
    return "\n\n".join(out)
