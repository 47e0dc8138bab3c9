"""Stage `tvm_tune`: MetaSchedule auto-scheduling (XGBoost cost model) of a model for a TVM ABI.

Tuning records belong to kernels (MetaSchedule's workloads: fused TIR functions), not to
models: they live in one shared database per TVM ABI, so that a kernel measured for one model
is not measured again for another (docs/tuning.md):

    artifacts/tuning/<target>/<abi>/<tvm version>/   the working database: every `doit tune` of
                                         the ABI reads it and appends to it, trial by trial
    models/.tuning/<target>/<abi>/       the shared pinned database: what `doit tune ... pin=1`
                                         committed; builds apply it

    models/<m>/model.yaml
      tvm:
        tune:                        # MetaSchedule budget per target (absent or 0: untuned)
          host: {trials: 64, per_task: 8}          # per_task: at most this many per task
          rk3588: {trials: 256, per_task: 16, in_build: true}
        database:                    # optional, older: a database pinned for this model alone
          host: tuning/host          # database_workload.json, database_tuning_record.json, tune.json

A budget is covered when the records of each task's workload, counted up to `per_task`, add up
to `trials` (tuning_db.Plan); `doit tune` spends only what is missing. The step's output is the
model's part of a database (its kernels' records), keyed by the static model's sha256, the TVM
target dict, the TVM/tvm-ffi/xgboost versions, the budget, and the shared pin's content. Where
it comes from, in a build:
  * a model pin    (tvm.database) verified against the same identity and copied; refused, with
                   the reason, when it was tuned for something else;
  * the shared pin  its part for the model, when it covers the budget: 0 trials;
  * the store      what `doit tune` (or an earlier build) produced under this key;
  * none of these  `doit build` does not tune (hours on a CPU): it fails and says to run
                   `doit tune target=T`, unless the spec says `in_build: true` (small budgets).
`doit tune target=T [model=M] [tracker=HOST:PORT key=KEY] [emulated=1] [pin=1]` tunes in a child
process, printing progress (per batch: the task, its trials and best latency, the budget done,
elapsed time and an estimate of the time left). A run killed midway publishes nothing, and
keeps in the working database every trial measured so far (a line cut short by the kill is
dropped, with a warning): the next `doit tune` says "resuming: 40 of 108 trials already
measured" and tunes the rest. `pin=1` appends the model's part to the shared pin.

Cross targets (aarch64) are measured on boards through the TVM RPC tracker: each candidate is
cross-compiled here (aarch64-linux-gnu-g++), uploaded, timed on a free board of the key. An
emulated board (qemu, see tvm_farm.py) proves the plumbing; its timings are recorded as such
and never shown as performance.
"""
from __future__ import annotations

import argparse
import functools
import hashlib
import importlib
import json
import math
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
import types
from dataclasses import dataclass
from pathlib import Path

from ..compilers import tuning_db
from ..compilers.builds import built_abis, proxy_abis
from ..compilers.tvm_backend import TVM
from ..compilers.tvm_relax import Budget, import_onnx
from ..core.errors import PipelineError
from ..core.layout import static_model
from ..core.steps import StageConfig, Step, abi_step_name, execute, where
from ..core.store import pretty_json, sha256_file
from ..core.tools import (cpu_model, describe_exit, distribution_version, python_module_argv,
                          run_tool, tail)
from ..spec.tvm import DATABASE, SHARED_DATABASE_DIR, SHARED_DATABASE_FILES, budget, shared_database

VERSION = 1
OUTPUTS = (*DATABASE, "tune.json")
TOOLS = ("apache-tvm", "apache-tvm-ffi", "xgboost-cpu", "onnx")
TRIALS_PER_ITER = 8
BUILDER_TIMEOUT_S = 300  # a single kernel builds in ~2 s, but a loaded 2-core machine needs slack
SEED = 0
# MetaSchedule's evolutionary search samples a population of candidate schedules per task and
# evolves it with the cost model before measuring the best few; its default, 512, is sized for
# hundreds of trials per task. For the few trials per task of these budgets it costs minutes per
# trial on 2 cores (a ppocr_det kernel: 30 s to sample 512, then ~40 s per evolution round):
# the population scales with the per-task budget instead, within MetaSchedule's default.
POPULATION_PER_TRIAL, POPULATION_MIN, POPULATION_MAX = 32, 64, 512
PROGRESS = "[tune] "  # the tuning child's progress lines start with it
NOT_COVERED = 4       # the child's exit code: the pinned database does not cover the budget
CLUSTER_FAILED = 5    # the child's exit code: the Dask cluster could not build the candidates
PIN_MODES = {"0": None, "false": None, "no": None, "1": "shared", "true": "shared",
             "yes": "shared", "shared": "shared", "model": "model"}


@dataclass(frozen=True)
class Config(StageConfig):
    target: dict            # the TVM target dict (TvmAbi.target_dict)
    target_name: str        # the target's name, for `doit tune target=...`
    budget: Budget
    linker: str             # the C++ driver candidates are linked with (g++, aarch64-linux-gnu-g++)
    cross: bool             # the ABI's artifacts run elsewhere: candidates are timed on boards
    pinned: str | None      # the model's own pinned database folder, as the model spec names it
    shared: str | None = None   # the shared pinned database (models/.tuning/<target>/<abi>), if any

    def problems(self):
        if self.target.get("kind") != "llvm":
            yield f"target must be an LLVM target dict, got {self.target!r}"
        if not isinstance(self.cross, bool):
            yield f"cross must be true or false, got {self.cross!r}"
        if self.pinned and self.shared:
            yield "a model's own pinned database and the shared one are exclusive"

    @classmethod
    def from_key(cls, key: dict) -> "Config":
        return cls(**{**key, "budget": Budget.from_key(key["budget"])})


def tvm_versions() -> dict:
    return {d: distribution_version(d) for d in ("apache-tvm", "apache-tvm-ffi")}


def identity(static_sha256: str, target: dict, budget: Budget) -> dict:
    """What a database is for: a model's pinned one must match this exactly to be applied."""
    return {"static_model_sha256": static_sha256, "target": target, "tvm": tvm_versions(),
            "trials": budget.trials, "per_task": budget.per_task}


def database_identity(target: dict) -> dict:
    """What a shared database is for: the records of every model of one TVM target and version."""
    return {"target": target, "tvm": tvm_versions()}


def identity_problems(have: dict, want: dict) -> list[str]:
    labels = {"static_model_sha256": "static model", "target": "TVM target", "tvm": "TVM version",
              "trials": "trial budget", "per_task": "per-task budget"}
    return [f"{labels[key]}: the database has {json.dumps(have.get(key), sort_keys=True)}, this "
            f"build needs {json.dumps(want[key], sort_keys=True)}"
            for key in want if have.get(key) != want[key]]


# ----------------------------------------------------------------------------- the step
def action(allow_tuning: bool, farm: dict | None = None, sources: tuple = ()):
    """The step action: `allow_tuning` is False in `doit build` unless the spec says in_build;
    `sources` are further databases (models' own pins) merged into the working one first."""
    return functools.partial(run, allow_tuning=allow_tuning, farm=farm or {}, sources=tuple(sources))


def run(ctx, allow_tuning: bool, farm: dict, sources: tuple = ()) -> None:
    cfg = ctx.cfg
    want = identity(sha256_file(ctx.input("model")), cfg.target, cfg.budget)
    if cfg.pinned:
        _apply_pinned(ctx, want)
        return
    pin = _shared_pin(ctx)
    if allow_tuning:
        _tune(ctx, want, farm, pin, sources)
        return
    covers, missing = "", cfg.budget.trials
    if pin is not None:
        result = _run_child(ctx, pin=pin, work=None, sources=(), farm={})
        if result.returncode not in (0, NOT_COVERED):
            raise ctx.error(f"reading the shared pinned database {cfg.shared} failed "
                            f"({describe_exit(result.returncode)}):\n{tail(result.output)}",
                            log=True, hint="read the log")
        summary = _summary(result)
        if result.returncode == 0:
            _publish(ctx, want, summary, measured_on=None)
            return
        covers = f"; the shared pinned database {cfg.shared} has {summary['plan']}"
        missing = summary["remaining"]
    raise ctx.error(
        f"a TVM tuning budget of {cfg.budget.trials} trials is set for this model and target, "
        f"and no database was tuned for it yet (the store has none under this key{covers})",
        hint=f"run `doit tune target={cfg.target_name}` first (MetaSchedule; roughly "
             f"{missing * 20 // 60 + 1} min on 2 cores for {missing} trials, at 15-30 s a trial), "
             f"or pin a database (`doit tune target={cfg.target_name} pin=1`), or set "
             f"tvm.tune.{cfg.target_name} to 0 (untuned), or `in_build: true` to let the build tune")


def _apply_pinned(ctx, want: dict) -> None:
    meta = json.loads(ctx.input("pinned:tune.json").read_text())
    problems = identity_problems(meta.get("identity", {}), want)
    if problems:
        raise ctx.error(f"the pinned tuning database {ctx.input('pinned:tune.json').parent} was "
                        f"tuned for something else, refused: " + "; ".join(problems),
                        hint=f"re-tune: doit tune target={ctx.cfg.target_name} "
                             f"model={ctx.step.where['model']} pin=1 (it tunes what the shared "
                             f"database lacks and pins it there), then remove "
                             f"tvm.database.{ctx.cfg.target_name}")
    for name in DATABASE:
        shutil.copyfile(ctx.input(f"pinned:{name}"), ctx.output(name))
    report = {**meta, "source": "pinned", "pinned_at": ctx.cfg.pinned}
    ctx.output("tune.json").write_text(pretty_json(report))


def _shared_pin(ctx) -> Path | None:
    """The shared pinned database's folder, once its identity is checked (None: there is none)."""
    if not ctx.cfg.shared:
        return None
    meta_file = ctx.input(f"shared:{tuning_db.META}")
    try:
        have = json.loads(meta_file.read_text()).get("identity", {})
    except ValueError:
        have = {}
    problems = identity_problems(have, database_identity(ctx.cfg.target))
    if problems:
        raise ctx.error(f"the shared pinned tuning database {meta_file.parent} was tuned for "
                        f"something else, refused: " + "; ".join(problems),
                        hint=f"move {meta_file.parent} away, then re-tune and pin: doit tune "
                             f"target={ctx.cfg.target_name} pin=1")
    return meta_file.parent


def work_database(layout, target_name: str, abi: str, target: dict, where: dict,
                  emulated: bool = False) -> Path:
    """The shared working database of a TVM ABI and version, made on first use; a folder made
    for another target dict (the ABI's YAML changed) is refused rather than mixed. Trials timed
    on emulated boards get a folder of their own: they must never pass for real ones."""
    want = database_identity(target)
    folder = layout.tuning_database(target_name, abi, want["tvm"]["apache-tvm"]
                                    + ("-emulated" if emulated else ""))
    meta_file = folder / tuning_db.META
    if meta_file.is_file():
        have = json.loads(meta_file.read_text()).get("identity", {})
        problems = identity_problems(have, want)
        if problems:
            raise PipelineError(f"the shared tuning database {folder} holds trials measured for "
                                f"something else: " + "; ".join(problems), **where,
                                hint=f"move {folder} away (or delete it) to tune afresh")
    else:
        folder.mkdir(parents=True, exist_ok=True)
        meta_file.write_text(pretty_json({"identity": want}))
    return folder


def _run_child(ctx, pin: Path | None, work: Path | None, sources: tuple, farm: dict):
    """The child that selects (work=None: from the pin only) or tunes, into scratch/result."""
    cfg = ctx.cfg
    where = dict(stage=ctx.step.stage, **ctx.step.where)
    argv = python_module_argv(
        "pipeline.stages.tvm_tune", "--model", str(ctx.input("model")),
        "--out", str(ctx.scratch / "result"), "--logs", str(ctx.scratch / "work"),
        "--target", json.dumps(cfg.target, sort_keys=True), "--linker", cfg.linker,
        "--trials", str(cfg.budget.trials), "--per-task", str(cfg.budget.per_task),
        "--per-iter", str(TRIALS_PER_ITER), "--seed", str(SEED))
    if pin is not None:
        argv += ["--pin", str(pin)]
    if work is None:
        return run_tool(argv, log=ctx.log, what="reading the shared tuning database",
                        on_line=_print_progress, check=False, **where)
    argv += ["--work-db", str(work)]
    for source in sources:
        argv += ["--merge", str(source)]
    if farm.get("tracker"):
        argv += ["--tracker", farm["tracker"], "--key", farm["key"]]
        argv += ["--emulated"] if farm.get("emulated") else []
    if farm.get("scheduler"):   # the candidates are built on this Dask cluster's workers
        argv += ["--scheduler", farm["scheduler"]]
    scheduler_log = ctx.scratch / "work" / "logs" / "tvm.s_tir.meta_schedule.logging.task_scheduler.log"
    return _run_following(argv, ctx.log, scheduler_log, where)


def _summary(result) -> dict:
    return json.loads([l for l in result.output.splitlines() if l.startswith("{")][-1])


def _tune(ctx, want: dict, farm: dict, pin: Path | None, sources: tuple) -> None:
    cfg = ctx.cfg
    where = dict(stage=ctx.step.stage, **ctx.step.where)
    builds = {"scheduler": farm["scheduler"]} if farm.get("scheduler") else {}
    if cfg.cross or farm.get("tracker"):
        tracker, key = farm.get("tracker"), farm.get("key")
        if not tracker or not key:
            raise ctx.error("tuning for this target measures on boards through a TVM RPC tracker, "
                            "and none was given",
                            hint="say tracker=HOST:PORT key=KEY (or set tune.tracker/tune.key of "
                                 "the ABI in the target's YAML); start boards with `python -m "
                                 "tvm.exec.rpc_server --tracker HOST:PORT --key KEY`")
        check_tracker(tracker, key, where, wait_s=farm.get("wait_s", 60))
        farm = {**farm, "tracker": tracker, "key": key, **builds}
        measured_on = {"runner": "rpc", "tracker": tracker, "key": key,
                       "emulated": bool(farm.get("emulated"))}
    else:
        farm = builds
        measured_on = {"runner": "local", "machine": cpu_model(), "emulated": False}
    work = work_database(ctx.step.layout, cfg.target_name, abi_of(ctx.step), cfg.target, where,
                         emulated=measured_on["emulated"])
    started = time.time()
    summary = _summary(_run_child(ctx, pin=pin, work=work, sources=sources, farm=farm))
    if summary["source"] == "pinned":
        _publish(ctx, want, summary, measured_on=None)
        return
    _publish(ctx, want, summary, measured_on=measured_on,
             extra={"seconds": round(time.time() - started, 1), "cost_model": "xgb",
                    "search": {"strategy": "evolutionary", "scheduler": "round-robin",
                               "population": search_population(cfg.budget.per_task)},
                    "xgboost": distribution_version("xgboost-cpu"),
                    "database": ctx.step.layout.relative(work)})


def _publish(ctx, want: dict, summary: dict, measured_on: dict | None, extra: dict | None = None) -> None:
    """The model's part of a database (the child wrote it into scratch/result) and tune.json."""
    for name in DATABASE:
        shutil.copyfile(ctx.scratch / "result" / name, ctx.output(name))
    if measured_on is None:  # from the shared pin: where its trials were measured
        measured_on = pinned_measured_on(json.loads(ctx.input(f"shared:{tuning_db.META}").read_text()))
    report = {"identity": want, "measured_on": measured_on, **summary, **(extra or {})}
    if summary["source"] == "pinned":
        report["pinned_at"] = ctx.cfg.shared
    if measured_on.get("emulated"):
        report["latencies_note"] = ("measured on an emulated board (qemu): they prove the "
                                    "plumbing only and are no performance figure")
    report.pop("plan", None)
    ctx.output("tune.json").write_text(pretty_json(report))


def pinned_measured_on(meta: dict) -> dict:
    """Where a shared pin's trials were measured: the one place, or every place it lists."""
    places = meta.get("measured_on", [])
    if len(places) == 1:
        return places[0]
    return {"runner": "several", "places": places,
            "emulated": any(p.get("emulated") for p in places)}


def abi_of(step: Step) -> str:
    return step.name.split("/")[2]


SCHEDULER_NEWS = ("picks Task", "Sending", "Build errors", "has finished")


def _follow(path: Path, prefix: str, done) -> None:
    """Print the task scheduler's news (task picked, batch built, batch measured) as it logs
    them: between two measured batches, its log is the live view."""
    offset = 0
    while not done.wait(1.0):
        try:
            with open(path, errors="replace") as f:
                f.seek(offset)
                chunk = f.read()
                offset = f.tell()
        except OSError:
            continue
        for line in chunk.splitlines():
            if any(k in line for k in SCHEDULER_NEWS):
                print(f"{prefix}{line.split('] ', 2)[-1].strip()}", flush=True)


def _run_following(argv: list[str], log: Path, follow: Path, where: dict):
    """Run the tuning child (run_tool, streaming): its `[tune] ` lines are progress, printed as
    they come, as are the news of the scheduler's log `follow`; everything goes to `log`."""
    done = threading.Event()
    watcher = threading.Thread(target=_follow, args=(follow, PROGRESS, done), daemon=True)
    watcher.start()
    try:
        return run_tool(argv, log=log, what="MetaSchedule tuning", on_line=_print_progress,
                        hint="read the log; the trials measured so far are kept in the shared "
                             "database, and the next `doit tune` resumes from them", **where)
    finally:
        done.set()


def _print_progress(line: str) -> None:
    if line.startswith(PROGRESS):
        print(line, flush=True)


# ----------------------------------------------------------------------------- the farm
def check_tracker(address: str, key: str, where: dict, wait_s: float = 60) -> dict:
    """Fail clearly, before any tuning, when the tracker is unreachable or has no free board."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=5):
            pass
    except (OSError, ValueError) as exc:
        raise PipelineError(f"cannot reach the TVM RPC tracker at {address}: {exc}",
                            hint="start it (python -m tvm.exec.rpc_tracker --host 0.0.0.0 --port "
                                 f"{port or 9190}) or give the right tracker=HOST:PORT",
                            **where) from None
    import tvm.rpc  # tvm: 2.8 s, not needed by doit list
    deadline = time.time() + wait_s
    while True:
        summary = tvm.rpc.connect_tracker(host, int(port)).summary()
        queue = summary.get("queue_info", {})
        if key not in queue:
            known = ", ".join(f"{k} ({v.get('free', 0)} free)" for k, v in sorted(queue.items()))
            raise PipelineError(f"the tracker at {address} has no board with key {key!r} "
                                f"(it has: {known or 'no boards at all'})",
                                hint=f"start a board's server with --key {key}, or give the key "
                                     f"the boards registered with", **where)
        if queue[key].get("free", 0) > 0:
            return queue[key]
        if time.time() > deadline:
            raise PipelineError(f"no free board with key {key!r} at {address} within {wait_s:g} s "
                                f"(busy: {queue[key]})", hint="wait for the running session to end,"
                                " or add boards with that key", **where)
        time.sleep(2)


# ----------------------------------------------------------------------------- doit tune
def pin_mode(value) -> str | None:
    """`pin=`: 1 (or shared) appends to the shared pinned database, `model` copies into the
    model's own folder (the older, per-model pin), 0 pins nothing."""
    mode = str(value if value is not None else "0").lower()
    if mode not in PIN_MODES:
        raise PipelineError(f"pin={value} is not a pin mode", stage="tvm_tune",
                            hint="pin=1 (the shared pinned database, models/.tuning/<target>/<abi>/), "
                                 "pin=model (models/<m>/tuning/<target>/), or pin=0")
    return PIN_MODES[mode]


def command(project, target: str | None, model: str | None, farm: dict, pin="0",
            executor: str = "local", scheduler: str | None = None) -> str:
    """`doit tune`: run every tuning step of a target (or of one model) with tuning allowed, here
    (the working database is this machine's); executor=dask builds the candidates on a cluster."""
    where = {"stage": "tvm_tune", "target": target}
    pin = pin_mode(pin)
    if not target:
        raise PipelineError("tuning is for one target: say target=NAME", stage="tvm_tune",
                            hint=f"known targets: {', '.join(t.name for t in project.targets)}")
    farm = {**farm, "scheduler": candidate_cluster(executor, scheduler)}
    steps = tune_steps(project, target, model, farm=farm, allow_tuning=True,
                       ignore_pins=pin is not None)
    if not steps:
        raise PipelineError(f"nothing to tune: no model{' ' + model if model else ''} has a TVM "
                            f"tuning budget for {target}", **where,
                            hint=f"set tvm.tune.{target}: {{trials: 64, per_task: 8}} in a "
                                 f"model.yaml")
    lines = []
    for step in steps:
        if step.cfg.pinned:
            lines.append(f"{step.name}: its own pinned database ({step.cfg.pinned}) is in use; "
                         f"`pin=1` moves its trials into the shared pinned database")
            continue
        print(f"[tune] {step.name}: {step.cfg.budget.trials} trials "
              f"(at most {step.cfg.budget.per_task} per task)", flush=True)
        how = execute(step)
        report = json.loads((step.out_dir / "tune.json").read_text())
        if how != "ran":
            lines.append(f"{step.name}: already tuned under this key ({how}), 0 trials spent")
        elif report["source"] == "pinned":
            lines.append(f"{step.name}: covered by the shared pinned database "
                         f"{report['pinned_at']}, 0 trials spent")
        else:
            lines.append(f"{step.name}: tuned, {report['trials_run']} trials run, "
                         f"{report['trials_reused']} found in the shared database, over "
                         f"{len(report['tasks'])} tasks in {report['seconds']} s")
        if pin == "model":
            folder = pin_folder(project, step)
            folder.mkdir(parents=True, exist_ok=True)
            for name in OUTPUTS:
                shutil.copyfile(step.out_dir / name, folder / name)
            lines.append(f"  pinned at {folder}: set tvm.database.{target} to its folder in "
                         f"model.yaml (relative to the model), then commit it")
        elif pin == "shared":
            lines += pin_shared(project, step)
    lines.append(f"the next `doit build target={target}` applies the database(s), 0 trials")
    return "\n".join(lines)


def candidate_cluster(mode: str, scheduler: str | None) -> str | None:
    """`doit tune executor=...`: the Dask scheduler whose workers build MetaSchedule's candidates,
    or None (LocalBuilder here). `dask` must reach it and have a worker admitted (same code and
    tools as here: docs/cluster.md), or fails; `auto` then warns once and builds here."""
    if mode in (None, "local") or (mode == "auto" and not scheduler):
        return None
    from ..core import dask_executor  # imports distributed (1.2 s): only when a cluster is asked for
    try:
        if mode not in dask_executor.EXECUTORS:
            raise PipelineError(f"executor={mode!r} is not one of "
                                f"{', '.join(dask_executor.EXECUTORS)}", stage="tvm_tune",
                                hint="executor=dask scheduler=tcp://HOST:8786")
        if not scheduler:
            raise PipelineError("executor=dask needs the scheduler's address", stage="tvm_tune",
                                hint="scheduler=tcp://HOST:8786 (or `scheduler` in [tool.modelyard])")
        dask_executor.Cluster(scheduler, name="modelyard-tune").close()
        return scheduler
    except PipelineError as err:
        if mode != "auto" or err.what.startswith("executor="):
            raise
        dask_executor.warn(f"executor=auto: {err.what}; building the tuning candidates here")
        return None


def pin_shared(project, step: Step) -> list[str]:
    """Append a tuning step's database (the model's part) to the shared pinned database."""
    target_name, model_name, abi = step.name.split("/")
    model = next(m for m in project.models if m.name == model_name)
    folder = shared_database(model.dir.parent, target_name, abi)
    if json.loads((step.out_dir / "tune.json").read_text())["measured_on"].get("emulated"):
        raise PipelineError(f"{step.name} was tuned on an emulated board: its timings are no "
                            f"basis for a pinned database", stage="tvm_tune", **step.where,
                            hint="tune on real boards (tracker=HOST:PORT key=KEY, without "
                                 "emulated=1), then pin=1")
    argv = python_module_argv("pipeline.stages.tvm_tune", "--merge-into", str(folder),
                              "--merge", str(step.out_dir), "--identity",
                              json.dumps(database_identity(step.cfg.target), sort_keys=True))
    result = run_tool(argv, log=step.log, what="pinning the tuning database", stage="tvm_tune",
                      **step.where)
    added = _summary(result)
    out = [f"  pinned into {folder}: {added['workloads_added']} workload(s) and "
           f"{added['records_added']} trial(s) added (shared by every model of "
           f"{target_name}/{abi}); commit the folder"]
    if model.tvm.get("database", {}).get(target_name):
        out.append(f"  the shared pin covers {model_name}: remove tvm.database.{target_name} from "
                   f"its model.yaml (and its own pinned folder)")
    return out


# ----------------------------------------------------------------------------- steps
def steps(project) -> list:
    """A database step for each TVM ABI of a model that has a tuning budget for the target."""
    out = []
    for model in project.models:
        for target in project.targets:
            if budget(model, target):
                out += [tune_step(project, model, target, a)
                        for a in built_abis(project, model, target, TVM)]
        out += [tune_step(project, model, target, abi)
                for target, abi in proxy_abis(project, model, TVM) if budget(model, target)]
    return out


def tune_step(project, model, target, abi, allow_tuning=None, farm=None,
              ignore_pins=False, sources=()) -> Step:
    layout = project.layout
    tuning = budget(model, target)
    pinned = None if ignore_pins else model.tvm.get("database", {}).get(target.name)
    inputs = {"model": static_model(layout, model)}
    shared = None
    if pinned:
        for name in OUTPUTS:
            inputs[f"pinned:{name}"] = pinned / name
    else:
        folder = shared_database(model.dir.parent, target.name, abi.name)
        if all((folder / name).is_file() for name in SHARED_DATABASE_FILES):
            shared = f"models/{SHARED_DATABASE_DIR}/{target.name}/{abi.name}"
            for name in SHARED_DATABASE_FILES:
                inputs[f"shared:{name}"] = folder / name
    given = farm if farm is not None else project.farm
    farm = {**abi.tune, **{k: v for k, v in given.items() if v is not None}}
    if allow_tuning is None:
        allow_tuning = tuning["in_build"]
    return Step(stage="tvm_tune", name=abi_step_name(model, target, abi), version=VERSION,
                config=Config(target=abi.target_dict(), target_name=target.name,
                              budget=Budget(tuning["trials"], tuning["per_task"]),
                              linker=abi.cross_compiler, cross=abi.run["via"] != "python",
                              pinned=_relative(pinned, model) if pinned else None, shared=shared),
                inputs=inputs, outputs=OUTPUTS,
                out_dir=layout.artifact_stage(target.name, model.name, abi.name, "tvm_tune"),
                tools=TOOLS, action=action(allow_tuning, farm, sources), layout=layout,
                doc=f"MetaSchedule database ({tuning['trials']} trials) for {abi.cpu}",
                where=where(model, target, abi), after=(f"coverage:{target.name}/{model.name}",))


def _relative(path: Path, model) -> str:
    try:
        return f"models/{model.name}/{path.relative_to(model.dir).as_posix()}"
    except ValueError:
        return str(path)


def tune_steps(project, target_name: str, model_name: str | None, farm: dict,
               allow_tuning: bool, ignore_pins: bool) -> list[Step]:
    """The tuning steps `doit tune` runs, with its tracker settings and permission to tune; the
    models' own pinned databases of the target are merged into the shared one as they tune."""
    out = []
    for target in [t for t in (*project.targets, *project.proxies) if t.name == target_name]:
        for model in project.models:
            if model_name and model.name != model_name or not budget(model, target):
                continue
            for abi in built_abis(project, model, target, TVM):
                out.append(tune_step(project, model, target, abi, allow_tuning=allow_tuning,
                                     farm=farm, ignore_pins=ignore_pins,
                                     sources=model_pins(project, target, abi)))
    return out


def model_pins(project, target, abi) -> list[Path]:
    """The models' own pinned databases for this target that were tuned for this ABI's target
    dict and this TVM: their trials count for every model sharing their kernels."""
    want = database_identity(abi.target_dict())
    out = []
    for model in project.models:
        folder = model.tvm.get("database", {}).get(target.name)
        if not folder:
            continue
        try:
            have = json.loads((folder / "tune.json").read_text()).get("identity", {})
        except (OSError, ValueError):
            continue
        if not identity_problems(have, want):
            out.append(folder)
    return out


def pin_folder(project, step: Step) -> Path:
    """Where `doit tune pin=model` copies a database: the declared pin, or models/<m>/tuning/<t>."""
    target_name, model_name, _abi = step.name.split("/")
    model = next(m for m in project.models if m.name == model_name)
    return model.tvm.get("database", {}).get(target_name) or model.dir / "tuning" / target_name


# ----------------------------------------------------------------------------- the child
def cpu_tensor_intrinsics() -> None:
    """Register only the CPU tensor intrinsics (x86, Arm, RISC-V).

    MetaSchedule's TuneContext and its default builder import `tvm.s_tir.tensor_intrin`, which
    parses every intrinsic TVM has: measured here, 85 s on 2 cores, 60 s of it CUDA's, 12 s
    ROCm's. MetaSchedule's builder re-creates its worker processes for every batch, so each
    batch paid that again (a 4-candidate batch of a tiny conv took ~4 minutes). LLVM CPU
    targets only use the CPU ones: the package is stood in for by a module that loads just those.
    """
    import tvm.s_tir  # tvm: 2.8 s, not needed by doit list
    name = "tvm.s_tir.tensor_intrin"
    if name in sys.modules:
        return
    package = types.ModuleType(name, "CPU tensor intrinsics only (pipeline.stages.tvm_tune)")
    package.__path__ = [str(Path(tvm.s_tir.__file__).parent / "tensor_intrin")]
    sys.modules[name] = package
    for sub in ("x86", "arm_cpu", "riscv_cpu"):
        setattr(package, sub, importlib.import_module(f"{name}.{sub}"))


def build_candidate(mod, target, _params):
    """MetaSchedule's default_build without its import of every tensor intrinsic (see above);
    module-level so that the builder's worker processes can import it."""
    cpu_tensor_intrinsics()
    from tvm.driver import build  # tvm: 2.8 s, not needed by doit list
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock  # tvm: 2.8 s, not needed by doit list
    return build(RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod), target=target)


def export_aarch64(mod) -> str:
    """The builder's export for aarch64 candidates: a .so a board's runtime loads (module-level
    so that MetaSchedule's builder processes can import it)."""
    from tvm.support import cc  # tvm: 2.8 s, not needed by doit list
    path = os.path.join(tempfile.mkdtemp(prefix="modelyard-tune-"), "candidate.so")
    mod.export_library(path, fcompile=cc.cross_compiler("aarch64-linux-gnu-g++"))
    return path


def export_host(mod) -> str:
    """A cluster worker's export of a host candidate: a .so linked there (g++), which this
    machine's runner loads as it is (LocalBuilder's default, a .tar, is linked by the runner)."""
    path = os.path.join(tempfile.mkdtemp(prefix="modelyard-tune-"), "candidate.so")
    mod.export_library(path)
    return path


def remote_build(mod_json: str, target_json: str, params: bytes | None, cross: bool) -> dict:
    """One candidate build on a Dask worker (`doit tune executor=dask`): what LocalBuilder's
    worker process does here (build_candidate, then the export), returning the library's bytes.
    A candidate that does not build is a failed trial, as with LocalBuilder: its error is
    returned, not raised."""
    import tvm  # tvm: 2.8 s, not needed by doit list
    from tvm.runtime import load_param_dict  # tvm: 2.8 s, not needed by doit list
    try:
        built = build_candidate(tvm.ir.load_json(mod_json), tvm.ir.load_json(target_json),
                                load_param_dict(bytearray(params)) if params else None)
        path = Path(export_aarch64(built) if cross else export_host(built))
        data = path.read_bytes()
        shutil.rmtree(path.parent, ignore_errors=True)
        return {"artifact": data, "error": None}
    except Exception as exc:  # noqa: BLE001 (LocalBuilder records any build failure as the trial's)
        return {"artifact": None, "error": f"{type(exc).__name__}: {exc}"}


class ClusterBuilds:
    """`doit tune executor=dask`: MetaSchedule's candidate builds go to the admitted workers of a
    Dask cluster (core/dask_executor.py: same code and tools as here), as many at once as there
    are workers; the measuring (LocalRunner here, or the boards of the RPC tracker) and the
    working database stay on this machine, the only writer of the records.

    A candidate travels as TVM's JSON of its IRModule and target (a few kB); the worker builds it
    with the function LocalBuilder calls here (build_candidate), exports a shared library (linked
    for aarch64 by the cross compiler, for boards) and returns its bytes, which are written under
    `folder` (a folder per candidate, which the runner removes once it is measured). Each build
    prints where it ran into the step's log. A worker killed mid-build: the scheduler gives the
    build to another worker. Every worker gone (or a build that killed three): `fatal` says so,
    and the tuning stops with that error; the trials already measured stay in the working
    database (the next `doit tune` resumes)."""

    def __init__(self, scheduler: str, cross: bool, folder: Path):
        from ..core import dask_executor  # imports distributed (1.2 s): only for a cluster
        self.dask, self.cross, self.folder = dask_executor, cross, folder
        self.cluster = dask_executor.Cluster(scheduler, name="modelyard-tune")
        self.tools = ("aarch64-linux-gnu-g++",) if cross else ("g++",)
        self.built_on: dict[str, int] = {}
        self.fatal: PipelineError | None = None
        self.where = {"stage": "tvm_tune"}
        if not self.cluster.able({}, self.tools):
            self.cluster.close()
            raise PipelineError(f"no admitted worker of the Dask cluster {scheduler} has "
                                f"{self.tools[0]}, which builds the tuning candidates",
                                hint="run ./setup.sh on the workers (it installs it), or tune "
                                     "with executor=local", **self.where)

    def builder(self):
        """The MetaSchedule builder object (a PyBuilder) that calls build()."""
        from tvm.ir.utils import derived_object  # tvm: 2.8 s, not needed by doit list
        from tvm.s_tir import meta_schedule as ms  # tvm: 2.8 s, not needed by doit list
        builds = self

        @derived_object
        class DaskBuilder(ms.builder.PyBuilder):
            def build(self, build_inputs):
                return builds.build(build_inputs)

        return DaskBuilder()

    def build(self, build_inputs: list) -> list:
        from tvm.s_tir import meta_schedule as ms  # tvm: 2.8 s, not needed by doit list
        try:
            return [ms.builder.BuilderResult(path, error) for path, error in self._build(build_inputs)]
        except PipelineError as err:   # MetaSchedule would pass it on as a bare RuntimeError
            self.fatal = err
            raise

    def _build(self, build_inputs: list) -> list[tuple[str | None, str | None]]:
        import tvm  # tvm: 2.8 s, not needed by doit list
        from tvm.runtime import save_param_dict  # tvm: 2.8 s, not needed by doit list
        this = importlib.import_module(__spec__.name if __spec__ else __name__)  # never __main__
        able = self.cluster.able({}, self.tools)
        if not able:
            raise PipelineError(f"no worker of the Dask cluster {self.cluster.scheduler} that could "
                                f"build tuning candidates is left", hint="start workers again "
                                "(docs/cluster.md) and run `doit tune` again: it resumes from the "
                                "trials measured so far", **self.where)
        started = time.monotonic()
        # a batch of builds waits for the slowest worker's share, each build within the timeout
        deadline = started + BUILDER_TIMEOUT_S * math.ceil(len(build_inputs) / len(able))
        jobs = []
        for one in build_inputs:
            mod, target = tvm.ir.save_json(one.mod), tvm.ir.save_json(one.target)
            params = bytes(save_param_dict(one.params)) if one.params is not None else None
            digest = hashlib.sha256("\0".join((mod, target, str(self.cross))).encode()
                                    + (params or b"")).hexdigest()
            jobs.append((digest, self.cluster.client.submit(
                self.dask.run_call, f"tvm_tune candidate {digest[:12]}", this.remote_build, mod,
                target, params, self.cross, key=f"modelyard-tune-build-{digest}", workers=able,
                allow_other_workers=False, pure=False)))
        out, batch = [], {}
        for digest, future in jobs:
            what = f"the tuning candidate build {digest[:12]}"
            try:
                done = self.cluster.wait(future, {}, self.where, what=what, tools=self.tools,
                                         deadline=deadline)
            finally:
                future.release()
            if done is None:
                print(f"candidate {digest[:12]}: not built within {BUILDER_TIMEOUT_S} s on the "
                      f"cluster", flush=True)
                out.append((None, f"DaskBuilder: not built within {BUILDER_TIMEOUT_S} s"))
                continue
            name, result = done["worker_name"], done["value"]
            batch[name] = batch.get(name, 0) + 1
            print(f"candidate {digest[:12]} built on dask worker {name} ({done['worker']}, host "
                  f"{done['host']}) in {done['finished'] - done['started']:.1f} s"
                  + (f": {result['error'].splitlines()[0][:200]}" if result["error"] else ""), flush=True)
            if result["error"]:
                out.append((None, f"DaskBuilder on worker {name}: {result['error']}"))
                continue
            path = self.folder / digest / "candidate.so"  # a folder each: the runner removes it
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(result["artifact"])
            out.append((str(path), None))
        for name, n in batch.items():
            self.built_on[name] = self.built_on.get(name, 0) + n
        print(f"{PROGRESS}built {len(build_inputs)} candidates on dask workers "
              + ", ".join(f"{w} ({n})" for w, n in sorted(batch.items()))
              + f" in {time.monotonic() - started:.1f} s", flush=True)
        return out

    def describe(self) -> dict:
        """What tune.json records of the builds: where they ran."""
        return {"kind": "dask", "scheduler": self.cluster.scheduler,
                "built_on": dict(sorted(self.built_on.items()))}

    def close(self) -> None:
        self.cluster.close()


class Progress:
    """What the tuning child prints per measured batch: the task, its trials and best latency,
    the budget done (what the database already had, plus this run), the time since the run
    started and an estimate of the time left, from this run's measured rate."""

    def __init__(self, names: list[str], have: list[int], trials: int, already: int,
                 planned: int, emulated: bool, clock=time.time):
        self.names, self.trials = names, list(have)   # per task: its trials, the database's included
        self.budget, self.already, self.planned = trials, already, planned
        self.emulated, self.clock = emulated, clock
        self.best: dict[int, float] = {}
        self.run, self.started = 0, clock()
        self.members: list[int] = []    # the tasks of the running batch group, by its task ids

    def batch(self, task_id: int, latencies_s: list[float], failed: int) -> str:
        task = self.members[task_id]
        n = len(latencies_s) + failed
        self.trials[task] += n
        self.run += n
        if latencies_s:
            self.best[task] = min([*latencies_s, self.best.get(task, float("inf"))])
        best = self.best.get(task)
        note = " (emulated board: not a performance figure)" if self.emulated else ""
        elapsed = self.clock() - self.started
        left = elapsed / self.run * max(0, self.planned - self.run)
        return (f"[tune] task {task + 1}/{len(self.names)} {self.names[task]}: {self.trials[task]} "
                f"trials{f', best {best * 1e6:.1f} us{note}' if best is not None else ', no valid run yet'}"
                f"{f', {failed} failed' if failed else ''} | {self.already + self.run}/{self.budget} "
                f"trials, {elapsed:.0f} s, about {duration(left)} left")


def duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


def _progress_callback(progress: Progress):
    from tvm.ir.utils import derived_object  # tvm: 2.8 s, not needed by doit list
    from tvm.s_tir import meta_schedule as ms  # tvm: 2.8 s, not needed by doit list

    @derived_object
    class ProgressCallback(ms.measure_callback.PyMeasureCallback):
        def apply(self, task_scheduler, task_id, measure_candidates, builder_results,
                  runner_results):
            ok = [float(sum(r.run_secs) / len(r.run_secs)) for r in runner_results
                  if r.error_msg is None and r.run_secs]
            print(progress.batch(task_id, ok, len(runner_results) - len(ok)), flush=True)

    return ProgressCallback()


class _Key:
    """A workload's identity as MetaSchedule's JSON database sees it: structural hash, then
    structural equality."""

    def __init__(self, mod):
        import tvm_ffi  # tvm_ffi: 1.5 s, not needed by doit list
        self.mod, self.hash = mod, tvm_ffi.structural_hash(mod)

    def __hash__(self):
        return self.hash

    def __eq__(self, other):
        import tvm_ffi  # tvm_ffi: 1.5 s, not needed by doit list
        return self.hash == other.hash and bool(tvm_ffi.structural_equal(self.mod, other.mod))


def workload_keys(lines: list[str]) -> list[_Key]:
    from tvm.s_tir import meta_schedule as ms  # tvm: 2.8 s, not needed by doit list
    return [_Key(ms.database.Workload.from_json(json.loads(line)).mod) for line in lines]


def _read(folder: Path) -> tuning_db.Database:
    try:
        db = tuning_db.Database.read(folder)
    except tuning_db.DatabaseError as err:
        print(f"{err}", file=sys.stderr)
        raise SystemExit(3) from None
    for warning in db.warnings:
        print(f"{PROGRESS}warning: {warning}", flush=True)
    return db


def source_meta(folder: Path, db: tuning_db.Database) -> dict:
    """A database folder's metadata: its database.json, or for a step's output (or a model's own
    pin) what its tune.json says: where it was measured, which workloads ran dry."""
    if (folder / tuning_db.META).is_file():
        return db.meta
    report = json.loads((folder / "tune.json").read_text())
    if "exhausted_workloads" in report:
        dry = report["exhausted_workloads"]
    elif report["trials_spent"] < report["trials_budget"]:  # finished with budget left
        dry = [i for i, n in enumerate(db.counts()) if n < report["per_task"]]
    else:
        dry = []
    counts = db.counts()
    return {"exhausted": {str(i): counts[i] for i in dry}, "measured_on": [report["measured_on"]]}


def merge_into(folder: Path, source: Path, identity_: dict) -> dict:
    """Append a database (a step's output, a model's own pin) to a pinned one, rewriting it
    atomically: added workloads and records go last, nothing already there moves."""
    dst = _read(folder) if (folder / tuning_db.META).is_file() else tuning_db.Database([], [], {})
    problems = identity_problems(dst.meta.get("identity") or identity_, identity_)
    if problems:
        print(f"{folder} was pinned for something else: " + "; ".join(problems), file=sys.stderr)
        raise SystemExit(3)
    src = _read(source)
    src.meta = source_meta(source, src)
    merged = tuning_db.merge(dst, workload_keys(dst.workloads), src, workload_keys(src.workloads))
    places = list(dst.meta.get("measured_on", []))
    places += [p for p in src.meta.get("measured_on", []) if p not in places]
    meta = {**dst.meta, "identity": identity_, "measured_on": places,
            "exhausted": {**dst.meta.get("exhausted", {}), **merged.exhausted}}
    tuning_db.Database(dst.workloads + merged.workload_lines, dst.records + merged.records,
                       meta).write(folder)
    return {"workloads_added": len(merged.workload_lines), "records_added": len(merged.records)}


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    if args.merge_into:
        added = {"workloads_added": 0, "records_added": 0}
        for source in args.merge:
            for k, v in merge_into(Path(args.merge_into), Path(source),
                                   json.loads(args.identity)).items():
                added[k] += v
        print(json.dumps(added, sort_keys=True))
        return 0
    tasks = _extract_tasks(args)
    task_keys = [_Key(t.dispatched[0]) for t in tasks]
    if args.pin:
        pin = _read(Path(args.pin))
        pin_keys = workload_keys(pin.workloads)
        plan = _plan(pin, pin_keys, task_keys, args)
        if plan.covered:
            print(f"[tune] the shared pinned database covers the budget: {plan.describe()}",
                  flush=True)
            return _finish(pin, pin_keys, tasks, task_keys, args, "pinned", plan, run=0)
        if not args.work_db:
            print(json.dumps({"plan": plan.describe(), "remaining": plan.remaining}), flush=True)
            return NOT_COVERED
    work = Path(args.work_db)
    db, keys = _open_work(work, [s for s in (args.pin, *args.merge) if s])
    plan = _plan(db, keys, task_keys, args)
    if plan.already:
        print(f"[tune] resuming: {plan.describe()}", flush=True)
    if plan.covered:
        print("[tune] the shared database already covers the budget: 0 trials to run", flush=True)
        return _finish(db, keys, tasks, task_keys, args, "tuned", plan, run=0)
    builds = None
    try:
        if args.scheduler:
            builds = ClusterBuilds(args.scheduler, cross=args.linker != "g++",
                                   folder=Path(args.out).parent / "candidates")
        dry, progress = _tune_groups(work, tasks, plan, args, builds)
    except Exception as exc:  # MetaSchedule hands a builder's exception back as a RuntimeError
        failure = exc if isinstance(exc, PipelineError) else builds and builds.fatal
        if not failure:
            raise
        print(failure.render(), file=sys.stderr, flush=True)
        return CLUSTER_FAILED
    finally:
        if builds is not None:
            builds.close()
    db = _read(work)
    keys += workload_keys(db.workloads[len(keys):])  # the workloads MetaSchedule added
    index = _first_index(keys)
    marks = {str(index[task_keys[t]]): progress.trials[t] for t in dry if task_keys[t] in index}
    if marks:
        tuning_db.append(work, tuning_db.Merge([], [], marks, []), db.meta)
        db = _read(work)
    return _finish(db, keys, tasks, task_keys, args, "tuned", plan, run=progress.run,
                   builder=builds.describe() if builds is not None else None)


def _parser():
    parser = argparse.ArgumentParser(prog="python -m pipeline.stages.tvm_tune")
    for name in ("--model", "--out", "--logs", "--target", "--linker"):
        parser.add_argument(name)
    for name in ("--trials", "--per-task", "--per-iter", "--seed"):
        parser.add_argument(name, type=int)
    parser.add_argument("--pin", help="a pinned database: when it covers the budget, its part is "
                                      "the result and nothing is tuned")
    parser.add_argument("--work-db", help="the working database to tune into (absent: select "
                                          "from --pin only, exit 4 when it does not cover)")
    parser.add_argument("--merge", action="append", default=[],
                        help="a database merged into the working one (or into --merge-into) first")
    parser.add_argument("--merge-into", help="only merge the --merge databases into this pinned one")
    parser.add_argument("--identity", help="with --merge-into: the pinned database's identity (JSON)")
    parser.add_argument("--tracker")
    parser.add_argument("--key")
    parser.add_argument("--emulated", action="store_true", help="the boards are emulators")
    parser.add_argument("--scheduler", help="a Dask scheduler whose workers build the candidates")
    return parser


def _extract_tasks(args) -> list:
    """The model's tunable tasks, one per fused kernel (already scheduled ones left out)."""
    import tvm  # tvm: 2.8 s, not needed by doit list
    from tvm import relax  # tvm: 2.8 s, not needed by doit list
    from tvm.s_tir import meta_schedule as ms  # tvm: 2.8 s, not needed by doit list
    cpu_tensor_intrinsics()
    target = tvm.target.Target(json.loads(args.target))
    mod = import_onnx(Path(args.model))
    with target:
        fused = relax.get_pipeline("zero")(mod)  # legalize + fuse: the tasks are fused kernels
    tasks = [t for t in ms.relax_integration.extract_tasks(fused, target)
             if not (t.dispatched[0].attrs or {}).get("tirx.is_scheduled", False)]
    names = [t.task_name for t in tasks]
    print(f"[tune] {len(tasks)} tasks: {', '.join(names[:6])}"
          f"{f' and {len(names) - 6} more' if len(names) > 6 else ''}", flush=True)
    return tasks


def _first_index(keys: list) -> dict:
    index = {}
    for i, key in enumerate(keys):
        index.setdefault(key, i)
    return index


def _plan(db: tuning_db.Database, keys: list, task_keys: list, args) -> tuning_db.Plan:
    index, counts, dry = _first_index(keys), db.counts(), db.exhausted()
    return tuning_db.plan([counts[index[k]] if k in index else 0 for k in task_keys],
                          [k in index and index[k] in dry for k in task_keys],
                          args.trials, args.per_task)


def _open_work(work: Path, sources: list) -> tuple[tuning_db.Database, list]:
    """The working database, a torn last line dropped, the sources' records merged in."""
    for name in (tuning_db.WORKLOADS, tuning_db.RECORDS):
        warning = tuning_db.repair(work / name)
        if warning:
            print(f"{PROGRESS}warning: {warning}", flush=True)
    db = _read(work)
    keys = workload_keys(db.workloads)
    for source in sources:
        src = _read(Path(source))
        src.meta = source_meta(Path(source), src)
        merged = tuning_db.merge(db, keys, src, workload_keys(src.workloads))
        if merged:
            tuning_db.append(work, merged, db.meta)
            print(f"[tune] merged into the shared database from {source}: "
                  f"{len(merged.workload_lines)} workload(s), {len(merged.records)} trial(s)",
                  flush=True)
            keys += merged.keys
            db = _read(work)
    return db, keys


def _tune_groups(work: Path, tasks: list, plan: tuning_db.Plan, args,
                 builds: "ClusterBuilds | None" = None) -> tuple[list[int], Progress]:
    """MetaSchedule on the tasks that need trials, one run per per-task cap, appending to the
    working database; returns the tasks found dry, and the progress (trials per task). The
    candidates are built here (LocalBuilder), or on a Dask cluster's workers (`builds`)."""
    from tvm.s_tir import meta_schedule as ms  # tvm: 2.8 s, not needed by doit list
    cross = args.linker != "g++"
    workers = 1 if cross else max(1, min(2, os.cpu_count() or 1))
    builder = builds.builder() if builds is not None else ms.builder.LocalBuilder(
        timeout_sec=BUILDER_TIMEOUT_S, max_workers=workers, f_build=build_candidate,
        f_export=export_aarch64 if cross else None)
    evaluator = ms.runner.EvaluatorConfig(number=3, repeat=1, min_repeat_ms=0 if args.tracker else 50)
    if args.tracker:
        host, _, port = args.tracker.rpartition(":")
        runner = ms.runner.RPCRunner(
            rpc_config=ms.runner.RPCConfig(tracker_host=host, tracker_port=int(port),
                                           tracker_key=args.key, session_timeout_sec=600),
            evaluator_config=evaluator, max_workers=1)
    else:
        runner = ms.runner.LocalRunner(timeout_sec=120, evaluator_config=evaluator)
    progress = Progress([t.task_name for t in tasks], list(plan.have), args.trials, plan.already,
                        plan.remaining, args.emulated)
    callbacks = [*ms.measure_callback.MeasureCallback.create("default"),
                 _progress_callback(progress)]
    database = ms.database.JSONDatabase(work_dir=str(work))  # appends a line per trial
    left, dry = plan.remaining, []
    for cap, members in plan.batches():
        if left <= 0:
            break
        group_budget = min(left, cap * len(members))
        contexts, weights = ms.relax_integration.extracted_tasks_to_tune_contexts(
            [tasks[i] for i in members], work_dir=args.logs, seed=args.seed,
            strategy=ms.search_strategy.EvolutionarySearch(
                population_size=search_population(args.per_task)))  # cloned per task
        progress.members = members
        before, ran_before = [progress.trials[i] for i in members], progress.run
        # Round robin joins each task's batch as soon as it is measured, so that every trial
        # reaches the database at once (the gradient scheduler joins after a whole round).
        ms.tune.tune_tasks(tasks=contexts, task_weights=weights, work_dir=args.logs,
                           max_trials_global=group_budget, max_trials_per_task=cap,
                           num_trials_per_iter=args.per_iter, builder=builder, runner=runner,
                           database=database, cost_model="xgb", measure_callbacks=callbacks,
                           task_scheduler="round-robin")
        spent = progress.run - ran_before
        left -= spent
        dry += [members[t] for t in tuning_db.exhausted_after(
            group_budget, spent, dict.fromkeys(range(len(members)), cap),
            {t: progress.trials[i] - before[t] for t, i in enumerate(members)})]
    return dry, progress


def search_population(per_task: int) -> int:
    return max(POPULATION_MIN, min(POPULATION_MAX, POPULATION_PER_TRIAL * per_task))


def _finish(db, keys, tasks, task_keys, args, source: str, plan, run: int,
            builder: dict | None = None) -> int:
    """Write the model's part of `db` into --out; print its summary (the last line)."""
    result = tuning_db.select(db, keys, task_keys)
    result.write(Path(args.out))
    best: dict = {}
    for workload, record in result.records:
        run_secs = [float(s) for s in json.loads(record)[1]]
        if run_secs and max(run_secs) < 1e9:  # failed runs are recorded as 1e10 s
            mean = sum(run_secs) / len(run_secs)
            best[workload] = min(best.get(workload, mean), mean)
    print(json.dumps({
        "source": source, "tasks": [{"name": t.task_name, "weight": int(t.weight)} for t in tasks],
        "trials_budget": args.trials, "per_task": args.per_task,
        "trials_spent": len(result.records), "trials_reused": plan.already, "trials_run": run,
        "workloads_tuned": len(best),
        "exhausted_workloads": sorted(int(i) for i in result.meta.get("exhausted", {})),
        "best_latency_us": {str(k): round(v * 1e6, 3) for k, v in sorted(best.items())},
        "plan": plan.describe(), **({"builder": builder} if builder else {})},
        sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
