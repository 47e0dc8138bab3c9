"""A step: one stage applied to one model (and target ABI), run under a content-addressed key.

Deciding whether to run is kept apart from running:
  * doit decides cheaply, from its own record: the input files (mtime, then md5) and the
    step's static fingerprint (stage version, the sha256 of the code that runs it, config, tool
    versions);
  * when doit says "run", `execute` computes the full key (that fingerprint plus the sha256 of
    every input); if the outputs already on disk carry that key nothing happens; if the store
    has the key its outputs are restored; otherwise the stage runs in a scratch folder, here
    or where the build's executor sends it (core/executor.py: a Dask cluster's worker).

Publishing is ordered so that a step killed midway is never mistaken for done: the old
`step.json` is removed first, outputs are renamed into place, `step.json` is written last.
A failed step removes its outputs: nothing stale stays behind under its name.
"""
from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
import shutil
import sys
import threading
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Iterator

from doit.exceptions import TaskFailed
from doit.tools import config_changed

from . import codehash, executor
from .codehash import code_digest
from .errors import PipelineError
from .layout import Layout
from .store import DamagedObject, Store, pretty_json, sha256_file, step_key, atomic_write_text
from .timings import meter, write as write_timing
from .tools import versions

RECORD = "step.json"


class StageConfig:
    """Base of the stages' configs: frozen dataclasses, checked when made.

    A stage module declares `@dataclass(frozen=True) class Config(StageConfig)` with typed fields
    and a `problems()` that yields one sentence per broken rule. `as_key()` is the dict hashed
    into the step key (Step.config): by default every field under its own name, tuples as lists,
    nested configs as their own keys; a config whose key leaves fields out says so in its own
    `as_key`. `from_key` is its inverse: Config.from_key(cfg.as_key()) == cfg. Lists given to a
    field are kept as tuples: a config cannot change once made.
    """

    def __post_init__(self):
        for f in fields(self):
            if isinstance(getattr(self, f.name), list):
                object.__setattr__(self, f.name, tuple(getattr(self, f.name)))
        problems = list(self.problems())
        if problems:
            raise ValueError(f"{type(self).__module__}.{type(self).__qualname__}: "
                             + "; ".join(problems))

    def problems(self) -> Iterator[str]:
        return iter(())

    def as_key(self) -> dict:
        return {f.name: key_value(getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def from_key(cls, key: dict):
        return cls(**key)


def key_value(value):
    """A config value as the step key holds it: plain JSON types, copied."""
    if isinstance(value, StageConfig):
        return value.as_key()
    if isinstance(value, (list, tuple)):
        return [key_value(v) for v in value]
    if isinstance(value, dict):
        return {k: key_value(v) for k, v in value.items()}
    return value


@dataclass(frozen=True)
class Step:
    stage: str
    name: str                      # unique within the stage, e.g. "rk3588/ppocr_det/cpu-aarch64"
    version: int                   # the stage's VERSION: bump when outputs change for the same inputs
    config: Any                    # given: the stage's Config; then its key dict (see __post_init__)
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
    gate: Any = field(default=None, compare=False)  # graph/fallback.py: a step of a slot's
    #                                preferred/fallback pair; its `task(step, task)` gives the doit task
    config_type: type | None = None  # the class of `cfg` (set from `config`)
    cfg: StageConfig = field(init=False, repr=False, compare=False)  # typed: what run(ctx) reads

    def __post_init__(self):
        """`config` is given as the stage's Config, or as its key dict (what
        dataclasses.replace(step, config={...}) passes, made again into a checked Config):
        `cfg` is then the typed config and `config` exactly cfg.as_key(), the part of the key."""
        if isinstance(self.config, StageConfig):
            cfg = self.config
        elif self.config_type is not None:
            cfg = self.config_type.from_key(self.config)
        else:
            raise TypeError(f"step {self.stage}:{self.name}: config must be a StageConfig, "
                            f"got {type(self.config).__name__}")
        object.__setattr__(self, "cfg", cfg)
        object.__setattr__(self, "config_type", type(cfg))
        object.__setattr__(self, "config", cfg.as_key())

    def static_fingerprint(self) -> dict:
        """What doit compares between runs, besides the input files themselves."""
        return {"stage": self.stage, "version": self.version,
                "code": action_code(self.action, self.config),
                "config": self.config, "tools": versions(*self.tools)}

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


def where(model, target, abi=None) -> dict:
    """A step's `where` (model=, target= or target=<target>/<abi>) from its specs."""
    return {"model": model.name, "target": f"{target.name}/{abi.name}" if abi else target.name}


def abi_step_name(model, target, abi) -> str:
    """The name of a step per target ABI: <target>/<model>/<abi>."""
    return f"{target.name}/{model.name}/{abi.name}"


def action_module(action: Callable) -> str:
    """The module that defines a step's action; through functools.partial (tvm_tune's action),
    whose own `__module__` is functools'."""
    while isinstance(action, functools.partial):
        action = action.func
    return getattr(action, "__module__", None) or ""


def action_code(action: Callable, config: dict | None = None) -> str:
    """sha256 of the code a step runs: its stage module, every package module it imports, and
    the backends its config names (codehash.py). An action defined outside the package (a
    test's) counts its own file."""
    module = action_module(action)
    try:
        return code_digest(module, config)
    except KeyError:
        source = getattr(sys.modules.get(module), "__file__", None)
        return sha256_file(Path(source)) if source else module


@dataclass
class StepContext:
    step: Step
    scratch: Path

    @property
    def cfg(self):
        """The step's typed config (its stage's Config)."""
        return self.step.cfg

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


_RERUN: set[str] = set()


class _Gate:
    """doit runs steps side by side in threads of this process (one per core); a part of a step
    that needs the machine to itself (lavapipe compiling kernels: stages/validate.py) waits until
    the steps running beside it have finished, and no other step starts meanwhile."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0       # steps running (each holds the gate shared)
        self._alone = False     # a step part running alone
        self._waiting = 0       # step parts waiting to run alone: no new step starts meanwhile
        self._local = threading.local()

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._alone and not self._waiting)
            self._readers += 1
        self._local.shared = getattr(self._local, "shared", 0) + 1
        try:
            yield
        finally:
            self._local.shared -= 1
            with self._cond:
                self._readers -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def alone(self) -> Iterator[None]:
        held = getattr(self._local, "shared", 0)
        with self._cond:
            self._readers -= held  # this thread's own step does not wait for itself
            self._waiting += 1
            self._cond.notify_all()
            self._cond.wait_for(lambda: not self._alone and self._readers == 0)
            self._waiting -= 1
            self._alone = True
        try:
            yield
        finally:
            with self._cond:
                self._alone = False
                self._readers += held
                self._cond.notify_all()


GATE = _Gate()


def alone():
    """A context in which the calling step runs with no other step beside it (see _Gate)."""
    return GATE.alone()


def rerun_stages(stages) -> None:
    """Run the steps of these stages here, whatever the outputs on disk or in a cache say
    (`revalidate=1` gives {"validate"}: validation results pulled from a shared cache are
    measured again on this machine). Their new outputs replace the stored ones."""
    _RERUN.clear()
    _RERUN.update(stages)


def execute(step: Step) -> str:
    """Bring step.out_dir up to date; returns how ("fresh", "restored", "ran"). How long it
    took is written beside its log (core/timings.py), outside the key and the store."""
    how = "failed"
    try:
        with GATE.shared(), meter() as measured:
            how = _execute(step)
    finally:  # the meter has filled `measured` in once its block is left
        write_timing(step.log, step.stage, step.name, how, measured)
    return how


def _execute(step: Step) -> str:
    parts = step.key_parts()
    key = step_key(parts)
    rerun = step.stage in _RERUN
    if not rerun and is_done(step, key):
        return "fresh"
    store = Store(step.layout.store)
    scratch = step.layout.scratch(step.stage, step.name)
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    try:
        cached = None if rerun else store.lookup(key)
        if cached is not None:
            try:
                store.restore(cached, scratch)
                outputs, how = cached, "restored"
            except DamagedObject:  # evicted by the store, with a warning: make it again
                shutil.rmtree(scratch, ignore_errors=True)
                scratch.mkdir(parents=True)
                cached = None
        if cached is None:  # it must run: here, or where executor.use() said (revalidate: here)
            runner = LOCAL if rerun else (executor.current() or LOCAL)
            outputs = runner.run(step, key, parts, scratch, store)
            how = "ran"
        _publish(step, scratch, key, parts, outputs)
        return how
    except BaseException:
        unpublish(step)
        raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


class LocalExecutor(executor.Executor):
    """Runs the step here, in this process: the stage writes into scratch, the store keeps the
    outputs under the key (and pushes them when the remote cache is set to)."""

    name = "local"

    def run(self, step: Step, key: str, parts: dict, scratch: Path, store: Store) -> dict:
        step.log.parent.mkdir(parents=True, exist_ok=True)
        step.log.write_text(f"# {step.stage} {step.name} key={key}\n")
        with codehash.running(action_module(step.action), step.config, dict(stage=step.stage, **step.where)):
            step.action(StepContext(step, scratch))  # asking for a backend its key lacks: refused
        missing = [o for o in step.outputs if not (scratch / o).is_file()]
        if missing:
            raise RuntimeError(f"stage {step.stage} did not write {missing}")  # a bug, not user error
        return store.put(key, step.stage, {o: scratch / o for o in step.outputs})


LOCAL = LocalExecutor()


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


DISK_FULL = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)


def disk_full(step: Step, err: OSError) -> PipelineError:
    return PipelineError(
        f"{step.name}: no room to write {err.filename or 'its outputs'} ({os.strerror(err.errno)}); "
        "the step's outputs were removed and nothing else was touched",
        stage=step.stage, **step.where,
        hint=f"free space under {step.layout.root} (or raise the file size limit), then build again")


CANNOT_WRITE = {errno.EROFS: "the folder is on a read-only file system",
                errno.EACCES: "permission denied", errno.EPERM: "operation not permitted"}


def cannot_write(step: Step, err: OSError) -> PipelineError:
    """A file of the step's that could not be written (published, removed, or its scratch made),
    named with the reason: not a failure of the step's tool or artifact."""
    path = Path(err.filename)
    return PipelineError(
        f"cannot write {path}: {CANNOT_WRITE[err.errno]} ({os.strerror(err.errno)}); the step's "
        f"outputs were not published", stage=step.stage, **step.where,
        hint=f"make {path.parent} writable for this user (remount it read-write, chmod u+w or "
             f"chown it), or build into another folder (artifacts=DIR); then build again")


def doit_action(step: Step):
    """The python-action doit calls: a PipelineError, a full disk or a file it cannot write
    becomes a one-paragraph TaskFailed."""
    try:
        execute(step)
    except PipelineError as err:
        return TaskFailed(err.render())
    except OSError as err:
        if err.errno in DISK_FULL:
            return TaskFailed(disk_full(step, err).render())
        if err.errno in CANNOT_WRITE and err.filename:
            return TaskFailed(cannot_write(step, err).render())
        raise
    return None


def doit_call(fn: Callable, *args):
    """A python-action for commands that are not steps (release, verify): prints what `fn`
    returns; a PipelineError becomes a one-paragraph TaskFailed."""
    try:
        print(fn(*args))
    except PipelineError as err:
        return TaskFailed(err.render())
    return None


def doit_task(step: Step) -> dict:
    task = {
        "name": step.name,
        "doc": step.doc,
        "actions": [(doit_action, [step])],
        "file_dep": sorted(str(p) for p in step.inputs.values()),
        "targets": [str(step.out_dir / o) for o in step.outputs] + [str(step.record)],
        "uptodate": [False] if step.stage in _RERUN else [config_changed(step.static_fingerprint())],
        "task_dep": list(step.after),
        "clean": [(unpublish, [step])],
    }
    return step.gate.task(step, task) if step.gate is not None else task
