"""A step: one stage applied to one model (and target ABI), run under a content-addressed key.

Deciding whether to run is kept apart from running:
  * doit decides cheaply, from its own record: the input files (mtime, then md5) and the
    step's static fingerprint (stage version, config, tool versions);
  * when doit says "run", `execute` computes the full key (that fingerprint plus the sha256 of
    every input); if the outputs already on disk carry that key nothing happens; if the store
    has the key its outputs are restored; otherwise the stage runs in a scratch folder.

Publishing is ordered so that a step killed midway is never mistaken for done: the old
`step.json` is removed first, outputs are renamed into place, `step.json` is written last.
A failed step removes its outputs: nothing stale stays behind under its name.
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .errors import PipelineError
from .layout import Layout
from .store import Store, pretty_json, sha256_file, step_key, atomic_write_text
from .tools import versions

RECORD = "step.json"


@dataclass(frozen=True)
class Step:
    stage: str
    name: str                      # unique within the stage, e.g. "rk3588/ppocr_det/cpu-aarch64"
    version: int                   # the stage's VERSION: bump when outputs change for the same inputs
    config: dict                   # JSON-able: everything besides the inputs that decides the outputs
    inputs: dict                   # logical name -> Path of a file another step (or the user) made
    outputs: tuple                 # file names written into out_dir
    out_dir: Path
    tools: tuple                   # tools whose versions decide the outputs
    action: Callable               # stage function: action(ctx) writes ctx.output(name) for each output
    layout: Layout
    doc: str
    where: dict = field(default_factory=dict)  # model=, target= for error messages
    owns_dir: bool = True          # the step owns out_dir entirely (stray files are removed)
    after: tuple = ()              # doit tasks that must succeed first, without being inputs

    def static_fingerprint(self) -> dict:
        """What doit compares between runs, besides the input files themselves."""
        return {"stage": self.stage, "version": self.version, "config": self.config,
                "tools": versions(*self.tools)}

    def key_parts(self) -> dict:
        parts = self.static_fingerprint()
        parts["inputs"] = {name: sha256_file(path) for name, path in sorted(self.inputs.items())}
        return parts

    @property
    def record(self) -> Path:
        return self.out_dir / RECORD

    @property
    def log(self) -> Path:
        return self.layout.log(self.stage, self.name)


@dataclass
class StepContext:
    step: Step
    scratch: Path

    @property
    def config(self) -> dict:
        return self.step.config

    @property
    def log(self) -> Path:
        return self.step.log

    def input(self, name: str) -> Path:
        return Path(self.step.inputs[name])

    def output(self, name: str) -> Path:
        return self.scratch / name

    def error(self, what: str, hint: str | None = None, log: bool = False) -> PipelineError:
        return PipelineError(what, stage=self.step.stage, hint=hint,
                             log=str(self.log) if log else None, **self.step.where)


def read_record(step: Step) -> dict | None:
    try:
        return json.loads(step.record.read_text())
    except (OSError, ValueError):
        return None


def is_done(step: Step, key: str) -> bool:
    """True when out_dir holds exactly the outputs recorded under `key`."""
    record = read_record(step)
    if not record or record.get("key") != key:
        return False
    for name, meta in record["outputs"].items():
        path = step.out_dir / name
        if not path.is_file() or sha256_file(path) != meta["sha256"]:
            return False
    return True


def execute(step: Step) -> str:
    """Bring step.out_dir up to date; returns how ("fresh", "restored", "ran")."""
    parts = step.key_parts()
    key = step_key(parts)
    if is_done(step, key):
        return "fresh"
    store = Store(step.layout.store)
    scratch = step.layout.scratch(step.stage, step.name)
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    try:
        cached = store.lookup(key)
        if cached is not None:
            store.restore(cached, scratch)
            outputs, how = cached, "restored"
        else:
            step.log.parent.mkdir(parents=True, exist_ok=True)
            step.log.write_text(f"# {step.stage} {step.name} key={key}\n")
            step.action(StepContext(step, scratch))
            missing = [o for o in step.outputs if not (scratch / o).is_file()]
            if missing:
                raise RuntimeError(f"stage {step.stage} did not write {missing}")  # a bug, not user error
            outputs = store.put(key, step.stage, {o: scratch / o for o in step.outputs})
            how = "ran"
        _publish(step, scratch, key, parts, outputs)
        return how
    except BaseException:
        unpublish(step)
        raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _publish(step: Step, scratch: Path, key: str, parts: dict, outputs: dict) -> None:
    step.out_dir.mkdir(parents=True, exist_ok=True)
    step.record.unlink(missing_ok=True)
    if step.owns_dir:
        for stray in step.out_dir.iterdir():
            if stray.name not in outputs and stray.name != RECORD:
                shutil.rmtree(stray) if stray.is_dir() else stray.unlink()
    for name in outputs:
        dest = step.out_dir / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(scratch / name, dest)
    record = {"stage": step.stage, "name": step.name, "key": key, "key_parts": parts,
              "outputs": outputs}
    atomic_write_text(step.record, pretty_json(record))


def unpublish(step: Step) -> None:
    """Remove a step's outputs (after a failure): nothing stale may pass for this run's result."""
    step.record.unlink(missing_ok=True)
    if step.owns_dir:
        shutil.rmtree(step.out_dir, ignore_errors=True)
    else:
        for name in step.outputs:
            (step.out_dir / name).unlink(missing_ok=True)


def doit_action(step: Step):
    """The python-action doit calls: a PipelineError becomes a one-paragraph TaskFailed."""
    from doit.exceptions import TaskFailed
    try:
        execute(step)
    except PipelineError as err:
        return TaskFailed(err.render())
    return None


def doit_call(fn: Callable, *args):
    """A python-action for commands that are not steps (release, verify): prints what `fn`
    returns; a PipelineError becomes a one-paragraph TaskFailed."""
    from doit.exceptions import TaskFailed
    try:
        print(fn(*args))
    except PipelineError as err:
        return TaskFailed(err.render())
    return None


def doit_task(step: Step) -> dict:
    from doit.tools import config_changed
    return {
        "name": step.name,
        "doc": step.doc,
        "actions": [(doit_action, [step])],
        "file_dep": sorted(str(p) for p in step.inputs.values()),
        "targets": [str(step.out_dir / o) for o in step.outputs] + [str(step.record)],
        "uptodate": [config_changed(step.static_fingerprint())],
        "task_dep": list(step.after),
        "clean": [(unpublish, [step])],
    }
