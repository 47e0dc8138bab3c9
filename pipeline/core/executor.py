"""Where a step that must run runs: here (`local`, the default) or elsewhere, shaped like Bazel's
remote execution API (REAPI: an Action goes out, an ActionResult comes back).

The build decides which steps run exactly as it always does (core/steps.py: doit's check, then
the key, then the store and the remote cache); only a step that none of them can bring up to
date reaches an executor, which returns the outputs it produced as {name: {sha256, size}} and
leaves their bytes in the step's scratch folder.

    Action        what a step was asked to do, named by content: its key (the sha256 over the
                  stage, its version, the code digest, the config, the tool versions and the
                  sha256 of every input), the parts of that key, and what another machine needs
                  to make the same Step there: the stage function and config type (by reference:
                  that machine runs its own copy of the code), the input and output places
    ActionResult  what came back: the outputs by sha256 and size (the record the remote cache
                  holds under the key), how the step came up to date there, which worker, its
                  log, and when it started and ended; or the error that stopped it

Input and output bytes never travel in either: they go through the remote cache's CAS by
sha256 (core/remote.py), which is the cluster's data plane. A place is a path relative to a
workspace: `artifacts/<path under the artifacts folder>` (so that what a stage writes relative
to the artifacts folder, the manifest's paths, comes out the same) or `files/<absolute path>`
for a file outside it (a model's source).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Callable

from .errors import PipelineError


class Executor:
    """Runs a step that must run: `run` fills `scratch` with the step's outputs (and the store
    with them under `key`) and returns {name: {sha256, size}}, or raises PipelineError."""

    name = "executor"

    def run(self, step, key: str, parts: dict, scratch: Path, store) -> dict:
        raise NotImplementedError

    def close(self) -> None:
        """Let go of what the executor holds (connections); steps then run here again."""


_current: Executor | None = None


def use(executor: Executor | None) -> None:
    """Run this process's steps with `executor` from now on (None: here, the default)."""
    global _current
    if _current is not None and _current is not executor:
        _current.close()
    _current = executor


def current() -> Executor | None:
    """The executor set by use(); None means the step runs here (steps.LocalExecutor)."""
    return _current


# ----------------------------------------------------------------------------- places
def place(path: Path, artifacts: Path) -> str:
    """Where the file `path` of this workspace goes in another: `artifacts/<relative path>` for
    a file under the artifacts folder, `files/<absolute path>` for any other file."""
    path = Path(path).absolute()
    try:
        return "artifacts/" + path.relative_to(Path(artifacts).absolute()).as_posix()
    except ValueError:
        return "files/" + path.as_posix().lstrip("/")


def at(root: Path, where: str) -> Path:
    """The path of a place in the workspace `root`; a place that would leave it is a bug."""
    rel = PurePosixPath(where)
    if rel.is_absolute() or ".." in rel.parts or rel.parts[:1] not in (("artifacts",), ("files",)):
        raise ValueError(f"{where!r} is not a workspace place")
    return Path(root) / rel


# ----------------------------------------------------------------------------- action, result
@dataclass(frozen=True)
class Action:
    key: str                 # the step key: the action's digest
    parts: dict              # what the key is the sha256 of (core/steps.py Step.key_parts)
    stage: str
    name: str
    version: int
    run: Callable            # the stage function (by reference; a partial keeps its arguments)
    config_type: type        # the stage's Config: config_type.from_key(parts["config"])
    inputs: dict             # logical name -> {"sha256", "size", "place"}
    outputs: tuple           # file names the stage writes
    out_dir: str             # place of the step's folder
    tools: tuple
    doc: str
    where: dict
    owns_dir: bool
    cache: str               # the remote cache the inputs are in and the outputs go to
    resources: dict = field(default_factory=dict)  # what a worker must offer (dask resources)

    @classmethod
    def of(cls, step, key: str, parts: dict, cache: str, resources: dict | None = None) -> "Action":
        artifacts = step.layout.root
        inputs = {name: {"sha256": parts["inputs"][name], "size": Path(path).stat().st_size,
                         "place": place(path, artifacts)}
                  for name, path in sorted(step.inputs.items())}
        return cls(key=key, parts=parts, stage=step.stage, name=step.name, version=step.version,
                   run=step.action, config_type=step.config_type, inputs=inputs,
                   outputs=tuple(step.outputs), out_dir=place(step.out_dir, artifacts),
                   tools=tuple(step.tools), doc=step.doc, where=dict(step.where),
                   owns_dir=step.owns_dir, cache=cache, resources=dict(resources or {}))

    @property
    def label(self) -> str:
        return f"{self.stage}:{self.name}"


@dataclass(frozen=True)
class ActionResult:
    key: str
    how: str                       # ran, restored (from the cache there), fresh (on its disk), failed
    worker: str                    # the worker's address
    worker_name: str
    host: str
    log: str                       # the step's log, as the worker wrote it
    outputs: dict | None = None    # name -> {sha256, size}; None when the step failed
    error: dict | None = None      # a PipelineError's fields: what, stage, model, target, hint, log
    started: float = 0.0           # epoch seconds on the worker: the action began, ended
    finished: float = 0.0
    info: dict = field(default_factory=dict)  # wall/CPU seconds there, anything worth a line

    def raise_error(self, log: Path | None) -> None:
        """Raise the worker's PipelineError here, its log being the copy at `log`."""
        if self.error is None:
            return
        fields: dict[str, Any] = dict(self.error)
        had_log = fields.pop("log", None)
        raise PipelineError(fields.pop("what"), log=str(log) if had_log and log else None, **fields)


def error_fields(err: PipelineError) -> dict:
    """A PipelineError as plain fields (to cross a process boundary and be raised again)."""
    return {"what": err.what, "stage": err.stage, "model": err.model, "target": err.target,
            "hint": err.hint, "log": err.log}
