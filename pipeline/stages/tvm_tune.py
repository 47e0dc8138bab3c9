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

Modules (one concern each): this stage (its steps and their action); `doit tune`,
graph/tune_command.py; the child that runs MetaSchedule, compilers/tvm_tuner.py, with the
candidate builds (compilers/tvm_candidates.py, on a Dask cluster compilers/tvm_cluster_builds.py)
and the progress display (compilers/tvm_tune_progress.py); what they agree on (identity, exit
codes), compilers/tvm_tuning.py; the RPC tracker's check, run/tvm_tracker.py.
"""
from __future__ import annotations

import functools
import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from ..compilers import tuning_db
from ..compilers.builds import built_abis, proxy_abis
from ..compilers.tvm_backend import TVM
from ..compilers.tvm_relax import Budget
from ..compilers.tvm_tune_progress import print_progress, run_following
from ..compilers.tvm_tuning import (NOT_COVERED, SEED, TRIALS_PER_ITER, child_summary, database_identity,
                                    identity, identity_problems, search_population)
from ..core.errors import PipelineError
from ..core.layout import static_model
from ..core.steps import StageConfig, Step, abi_step_name, where
from ..core.store import pretty_json, sha256_file
from ..core.tools import cpu_model, describe_exit, distribution_version, python_module_argv, run_tool, tail
from ..run.tvm_tracker import check_tracker
from ..spec.tvm import DATABASE, SHARED_DATABASE_DIR, SHARED_DATABASE_FILES, budget, shared_database

CHILD = "pipeline.compilers.tvm_tuner"   # the tuning child (python -m): MetaSchedule runs there
VERSION = 1
OUTPUTS = (*DATABASE, "tune.json")
TOOLS = ("apache-tvm", "apache-tvm-ffi", "xgboost-cpu", "onnx")


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
        summary = child_summary(result)
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
        CHILD, "--model", str(ctx.input("model")),
        "--out", str(ctx.scratch / "result"), "--logs", str(ctx.scratch / "work"),
        "--target", json.dumps(cfg.target, sort_keys=True), "--linker", cfg.linker,
        "--trials", str(cfg.budget.trials), "--per-task", str(cfg.budget.per_task),
        "--per-iter", str(TRIALS_PER_ITER), "--seed", str(SEED))
    if pin is not None:
        argv += ["--pin", str(pin)]
    if work is None:
        return run_tool(argv, log=ctx.log, what="reading the shared tuning database",
                        on_line=print_progress, check=False, **where)
    argv += ["--work-db", str(work)]
    for source in sources:
        argv += ["--merge", str(source)]
    if farm.get("tracker"):
        argv += ["--tracker", farm["tracker"], "--key", farm["key"]]
        argv += ["--emulated"] if farm.get("emulated") else []
    if farm.get("scheduler"):   # the candidates are built on this Dask cluster's workers
        argv += ["--scheduler", farm["scheduler"]]
    scheduler_log = ctx.scratch / "work" / "logs" / "tvm.s_tir.meta_schedule.logging.task_scheduler.log"
    return run_following(argv, ctx.log, scheduler_log, where)


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
    summary = child_summary(_run_child(ctx, pin=pin, work=work, sources=sources, farm=farm))
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


# ----------------------------------------------------------------------------- the farm


# ----------------------------------------------------------------------------- doit tune


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
