"""The fallback compiler of a slot, in a static graph: gated steps and their attempt records.

A slot that builds one candidate (`build: shipped`, or an untuned TVM build that cannot win)
has a fallback when another compiler could build the model (compilers/builds.py
`fallback_pair`). Both candidates' compile and validate steps are in the graph; their doit
tasks are gated here, the steps themselves (configs, inputs, keys, outputs) unchanged:

  preferred compile   runs; a PipelineError does not fail the task: its paragraph is printed,
                      and the attempt record says failed (stage, error class, what, hint).
                      Its outputs stay targets: a failed compile is tried again next build.
  preferred validate  after the compile's attempt (not its artifact: there may be none);
                      a failed compile is carried over, a failed validation recorded the same way.
  fallback compile    after the preferred's verdict (its validate attempt): when that passed, it
                      builds nothing (its outputs are removed: nothing stale) and records
                      not-needed; else it builds as any step, and a failure fails the build.
  fallback validate   likewise after the fallback's compile attempt.

Each task writes `<t>/<m>/<abi>/<stage>.attempt.json` (a doit target; file_dep of the next):
passed records the step's key and outputs' sha256s, so choose and manifest, which read the
attempts instead of the artifacts, are keyed as precisely as before. `doit build` fails only
when the fallback fails too: then nothing of the slot can ship.
"""
from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path

from doit.exceptions import TaskFailed

from ..compilers.backends import backend_of
from ..compilers.builds import attempt_file, fallback_role, read_attempt
from ..core.errors import PipelineError
from ..core.steps import (CANNOT_WRITE, DISK_FULL, Step, cannot_write, disk_full, execute,
                          read_record, unpublish)
from ..core.store import atomic_write_text, pretty_json

VALIDATE = "validate"


@dataclass(frozen=True)
class Gate:
    role: str                   # preferred | fallback
    stage: str                  # the step's stage (its backend's compile stage, or validate)
    attempt: Path               # this task's attempt record
    before: Path | None         # the attempt it waits for (None: the preferred's compile)
    unknown: tuple[str, ...]    # inputs that may not exist (a gated compile's outputs): not file_dep
    preferred: str
    fallback: str

    def task(self, step: Step, task: dict) -> dict:
        deps = set(task["file_dep"]) - set(self.unknown)
        if self.before is not None:
            deps.add(str(self.before))
        targets = [str(self.attempt)] + (task["targets"] if self.role == "preferred" else [])
        return {**task, "actions": [(run, [step, self])], "file_dep": sorted(deps),
                "targets": targets, "clean": [(clean, [step, self])]}


def gate(project, steps: list) -> list:
    """The steps of a stage, those of a slot's preferred/fallback pair gated."""
    return [_gated(project, s) for s in steps]


def _gated(project, step: Step) -> Step:
    if step.stage != VALIDATE and not step.stage.endswith("_compile"):
        return step
    parts = step.name.split("/")
    if len(parts) != 3:  # <target>/<model>/<abi> (a twin's step has a fourth part)
        return step
    target = next((t for t in project.targets if t.name == parts[0]), None)
    model = next((m for m in project.models if m.name == parts[1]), None)
    abi = next((a for a in target.abis if a.name == parts[2]), None) if target and model else None
    if abi is None or step.stage not in (VALIDATE, backend_of(abi).compile_stage):
        return step
    role = fallback_role(project, model, target, abi)
    if role is None:
        return step
    layout = project.layout
    compile_stage = backend_of(abi).compile_stage
    if step.stage == VALIDATE:
        before = attempt_file(layout, target.name, model.name, abi.name, compile_stage)
        compiled = layout.artifact_stage(target.name, model.name, abi.name, compile_stage)
        unknown = tuple(str(p) for p in step.inputs.values() if Path(p).parent == compiled)
    elif role["role"] == "fallback":
        before = attempt_file(layout, target.name, model.name, role["preferred"], VALIDATE)
        unknown = ()
    else:
        before, unknown = None, ()
    return dataclasses.replace(step, gate=Gate(
        role=role["role"], stage=step.stage,
        attempt=attempt_file(layout, target.name, model.name, abi.name, step.stage),
        before=before, unknown=unknown, preferred=role["preferred"], fallback=role["fallback"]))


# ----------------------------------------------------------------------------- the task
def error_class(stage: str, what: str) -> str:
    """What kind of failure: the compiler refused (compile-error), the artifact did not run
    (run-error), or it ran and its outputs differ from golden (wrong-outputs)."""
    if stage != VALIDATE:
        return "compile-error"
    return "wrong-outputs" if "differ from" in what else "run-error"


def run(step: Step, gate: Gate):
    """The gated task's action (see the module's doc)."""
    gate.attempt.unlink(missing_ok=True)
    before = read_attempt(gate.before) if gate.before is not None else None
    if gate.role == "fallback" and before["status"] == (
            "passed" if gate.stage != VALIDATE else "not-needed"):  # the preferred's, or its compile's
        unpublish(step)  # nothing stale: the fallback built when the preferred last failed
        return _write(gate, {"status": "not-needed",
                             "because": f"{gate.preferred} compiled and validated"})
    if gate.role == "preferred" and before is not None and before["status"] == "failed":
        unpublish(step)
        return _write(gate, before)  # the compile's failure is the candidate's verdict
    if gate.role == "fallback" and gate.stage != VALIDATE:
        print(f"modelyard: building {gate.fallback}, the fallback of {gate.preferred}, "
              f"which failed ({before['error_class']} in {before['stage']})",
              file=sys.stderr, flush=True)
    try:
        execute(step)
    except PipelineError as err:
        if gate.role == "fallback":
            return TaskFailed(err.render())
        print(f"{err.render()}\n  fallback: {gate.fallback} is built and validated instead "
              f"(ships if it passes)", file=sys.stderr, flush=True)
        stage = err.stage or step.stage
        return _write(gate, {"status": "failed", "stage": stage,
                             "error_class": error_class(stage, err.what),
                             "what": err.what, "hint": err.hint})
    except OSError as err:  # as core/steps.doit_action: one paragraph, the build fails
        if err.errno in DISK_FULL:
            return TaskFailed(disk_full(step, err).render())
        if err.errno in CANNOT_WRITE and err.filename:
            return TaskFailed(cannot_write(step, err).render())
        raise
    record = read_record(step)
    doc = {"status": "passed", "step": f"{step.stage}:{step.name}", "key": record["key"],
           "outputs": {k: v["sha256"] for k, v in sorted(record["outputs"].items())}}
    if before is not None:
        doc["compile"] = before
    return _write(gate, doc)


def _write(gate: Gate, doc: dict):
    gate.attempt.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(gate.attempt, pretty_json(doc))
    return None


def clean(step: Step, gate: Gate) -> None:
    unpublish(step)
    gate.attempt.unlink(missing_ok=True)
