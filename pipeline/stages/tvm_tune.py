"""Stage `tvm_tune`: MetaSchedule auto-scheduling (XGBoost cost model) of a model for a TVM ABI.

The tuning database is an artifact like any other, keyed by what decides it: the static
model's sha256, the TVM target dict, the TVM/tvm-ffi/xgboost versions, and the budget.

    models/<m>/model.yaml
      tvm:
        tune:                        # MetaSchedule budget per target (absent or 0: untuned)
          host: {trials: 64, per_task: 8}          # per_task: at most this many per task
          rk3588: {trials: 256, per_task: 16, in_build: true}
        database:                    # optional: a database pinned in the repo, per target
          host: tuning/host          # database_workload.json, database_tuning_record.json, tune.json

Where a database comes from, in a build:
  * pinned   verified against the same identity (model, target, TVM version, budget) and used;
             refused, with the reason, when it was tuned for something else;
  * the store  a database `doit tune` (or an earlier build) produced under this key: restored
             in well under a second, 0 trials spent;
  * neither  `doit build` does not tune (hours on a CPU): it fails and says to run
             `doit tune target=T`, unless the spec says `in_build: true` (small budgets).
`doit tune target=T [model=M] [tracker=HOST:PORT key=KEY] [emulated=1] [pin=1]` tunes, printing
progress (tasks, trials, best latency) as it goes. Tuning runs in a child process, in the step's
scratch folder: a run killed midway publishes nothing, so no half-written database is applied.

Cross targets (aarch64) are measured on boards through the TVM RPC tracker: each candidate is
cross-compiled here (aarch64-linux-gnu-g++), uploaded, timed on a free board of the key. An
emulated board (qemu, see tvm_farm.py) proves the plumbing; its timings are recorded as such
and never shown as performance.
"""
from __future__ import annotations

import functools
import json
import os
import shutil
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ..core.errors import PipelineError
from ..core.steps import StageConfig, Step
from ..core.store import pretty_json, sha256_file
from ..core.tools import cpu_model, distribution_version, python_module_argv, run_tool
from ..spec.tvm import DATABASE
from .plan import (abi_step_name, budget, compiler_of, proxy_pairs, skipped, static_model, tvm_abis,
                   where)
from .tvm_compile import Budget

VERSION = 1
OUTPUTS = (*DATABASE, "tune.json")
TOOLS = ("apache-tvm", "apache-tvm-ffi", "xgboost-cpu", "onnx")
TRIALS_PER_ITER = 8
BUILDER_TIMEOUT_S = 300  # a single kernel builds in ~2 s, but a loaded 2-core machine needs slack
SEED = 0
PROGRESS = "[tune] "  # the tuning child's progress lines start with it


@dataclass(frozen=True)
class Config(StageConfig):
    target: dict            # the TVM target dict (TvmAbi.target_dict)
    target_name: str        # the target's name, for `doit tune target=...`
    budget: Budget
    linker: str             # the C++ driver candidates are linked with (g++, aarch64-linux-gnu-g++)
    cross: bool             # the ABI's artifacts run elsewhere: candidates are timed on boards
    pinned: str | None      # the pinned database's folder, as the model spec names it

    def problems(self):
        if self.target.get("kind") != "llvm":
            yield f"target must be an LLVM target dict, got {self.target!r}"
        if not isinstance(self.cross, bool):
            yield f"cross must be true or false, got {self.cross!r}"

    @classmethod
    def from_key(cls, key: dict) -> "Config":
        return cls(**{**key, "budget": Budget.from_key(key["budget"])})


def identity(static_sha256: str, target: dict, budget: Budget) -> dict:
    """What a database is for: a pinned one must match this exactly to be applied."""
    return {"static_model_sha256": static_sha256, "target": target,
            "tvm": {d: distribution_version(d) for d in ("apache-tvm", "apache-tvm-ffi")},
            "trials": budget.trials, "per_task": budget.per_task}


# ----------------------------------------------------------------------------- the step
def action(allow_tuning: bool, farm: dict | None = None):
    """The step action: `allow_tuning` is False in `doit build` unless the spec says in_build."""
    return functools.partial(run, allow_tuning=allow_tuning, farm=farm or {})


def run(ctx, allow_tuning: bool, farm: dict) -> None:
    cfg = ctx.cfg
    static_sha = sha256_file(ctx.input("model"))
    want = identity(static_sha, cfg.target, cfg.budget)
    if cfg.pinned:
        _apply_pinned(ctx, want)
        return
    if not allow_tuning:
        raise ctx.error(
            f"a TVM tuning budget of {cfg.budget.trials} trials is set for this model and "
            f"target, and no database was tuned for it yet (the store has none under this key)",
            hint=f"run `doit tune target={cfg.target_name}` first (MetaSchedule; roughly "
                 f"{cfg.budget.trials * 3 // 60 + 1} min on 2 cores), or pin a database "
                 f"(tvm.database in model.yaml), or set tvm.tune.{cfg.target_name} to 0 "
                 f"(untuned), or `in_build: true` to let the build tune")
    report = _tune(ctx, want, farm)
    ctx.output("tune.json").write_text(pretty_json(report))


def _apply_pinned(ctx, want: dict) -> None:
    meta = json.loads(ctx.input("pinned:tune.json").read_text())
    have = meta.get("identity", {})
    problems = []
    for key, label in (("static_model_sha256", "static model"), ("target", "TVM target"),
                       ("tvm", "TVM version"), ("trials", "trial budget"),
                       ("per_task", "per-task budget")):
        if have.get(key) != want[key]:
            problems.append(f"{label}: the database has {json.dumps(have.get(key), sort_keys=True)},"
                            f" this build needs {json.dumps(want[key], sort_keys=True)}")
    if problems:
        raise ctx.error(f"the pinned tuning database {ctx.input('pinned:tune.json').parent} was "
                        f"tuned for something else, refused: " + "; ".join(problems),
                        hint=f"re-tune: doit tune target={ctx.cfg.target_name} "
                             f"model={ctx.step.where['model']} pin=1 (it replaces the pinned "
                             f"files), or remove tvm.database.{ctx.cfg.target_name}")
    for name in DATABASE:
        shutil.copyfile(ctx.input(f"pinned:{name}"), ctx.output(name))
    report = {**meta, "source": "pinned", "pinned_at": ctx.cfg.pinned}
    ctx.output("tune.json").write_text(pretty_json(report))


def _tune(ctx, want: dict, farm: dict) -> dict:
    cfg = ctx.cfg
    where = dict(stage=ctx.step.stage, **ctx.step.where)
    work = ctx.scratch / "work"
    argv = python_module_argv(
        "pipeline.stages.tvm_tune", "--model", str(ctx.input("model")), "--work-dir", str(work),
        "--target", json.dumps(cfg.target, sort_keys=True), "--linker", cfg.linker,
        "--trials", str(cfg.budget.trials), "--per-task", str(cfg.budget.per_task),
        "--per-iter", str(TRIALS_PER_ITER), "--seed", str(SEED))
    if cfg.cross or farm.get("tracker"):
        tracker, key = farm.get("tracker"), farm.get("key")
        if not tracker or not key:
            raise ctx.error("tuning for this target measures on boards through a TVM RPC tracker, "
                            "and none was given",
                            hint="say tracker=HOST:PORT key=KEY (or set tune.tracker/tune.key of "
                                 "the ABI in the target's YAML); start boards with `python -m "
                                 "tvm.exec.rpc_server --tracker HOST:PORT --key KEY`")
        check_tracker(tracker, key, where, wait_s=farm.get("wait_s", 60))
        argv += ["--tracker", tracker, "--key", key] + (["--emulated"] if farm.get("emulated") else [])
        measured_on = {"runner": "rpc", "tracker": tracker, "key": key,
                       "emulated": bool(farm.get("emulated"))}
    else:
        measured_on = {"runner": "local", "machine": cpu_model(), "emulated": False}
    started = time.time()
    scheduler_log = work / "logs" / "tvm.s_tir.meta_schedule.logging.task_scheduler.log"
    result = _run_following(argv, ctx.log, scheduler_log, where)
    summary = json.loads([l for l in result.output.splitlines() if not l.startswith(PROGRESS)][-1])
    for name in DATABASE:
        shutil.copyfile(work / name, ctx.output(name))
    report = {"identity": want, "source": "tuned", "measured_on": measured_on,
              "seconds": round(time.time() - started, 1), "cost_model": "xgb",
              "xgboost": distribution_version("xgboost-cpu"), **summary}
    if measured_on["emulated"]:
        report["latencies_note"] = ("measured on an emulated board (qemu): they prove the "
                                    "plumbing only and are no performance figure")
    return report


SCHEDULER_NEWS = ("picks Task", "Sending", "Build errors", "has finished")


def _follow(path: Path, prefix: str, done) -> None:
    """Print the task scheduler's news (task picked, batch built, batch measured) as it logs
    them: MetaSchedule runs the measure callbacks only when it joins a task's results, which
    can be at the very end, so its log is the live view."""
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
    import threading
    done = threading.Event()
    watcher = threading.Thread(target=_follow, args=(follow, PROGRESS, done), daemon=True)
    watcher.start()
    try:
        return run_tool(argv, log=log, what="MetaSchedule tuning", on_line=_print_progress,
                        hint="read the log; nothing was published, so no partial database is "
                             "ever applied", **where)
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
    import tvm.rpc
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
def command(project, target: str | None, model: str | None, farm: dict, pin: bool) -> str:
    """`doit tune`: run every tuning step of a target (or of one model) with tuning allowed."""
    from ..core.steps import execute
    where = {"stage": "tvm_tune", "target": target}
    if not target:
        raise PipelineError("tuning is for one target: say target=NAME", stage="tvm_tune",
                            hint=f"known targets: {', '.join(t.name for t in project.targets)}")
    steps = tune_steps(project, target, model, farm=farm, allow_tuning=True,
                                 ignore_pins=pin)
    if not steps:
        raise PipelineError(f"nothing to tune: no model{' ' + model if model else ''} has a TVM "
                            f"tuning budget for {target}", **where,
                            hint=f"set tvm.tune.{target}: {{trials: 64, per_task: 8}} in a "
                                 f"model.yaml")
    lines = []
    for step in steps:
        if step.cfg.pinned:
            lines.append(f"{step.name}: a pinned database ({step.cfg.pinned}) is in use; "
                         f"`pin=1` tunes again and replaces it")
            continue
        print(f"[tune] {step.name}: {step.cfg.budget.trials} trials "
              f"(at most {step.cfg.budget.per_task} per task)", flush=True)
        how = execute(step)
        report = json.loads((step.out_dir / "tune.json").read_text())
        if how == "ran":
            lines.append(f"{step.name}: tuned, {report['trials_spent']} trials over "
                         f"{len(report['tasks'])} tasks in {report['seconds']} s")
        else:
            lines.append(f"{step.name}: already tuned under this key ({how}), 0 trials spent")
        if pin:
            folder = pin_folder(project, step)
            folder.mkdir(parents=True, exist_ok=True)
            for name in OUTPUTS:
                shutil.copyfile(step.out_dir / name, folder / name)
            lines.append(f"  pinned at {folder}: set tvm.database.{target} to its folder in "
                         f"model.yaml (relative to the model), then commit it")
    lines.append(f"the next `doit build target={target}` applies the database(s), 0 trials")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- steps
def steps(project) -> list:
    """A database step for each TVM ABI of a model that has a tuning budget for the target."""
    out = []
    for model in project.models:
        for target in project.targets:
            if budget(model, target):
                out += [tune_step(project, model, target, a) for a in tvm_abis(project, model, target)]
        for target, abi in proxy_pairs(project):
            if (compiler_of(abi) == "tvm" and "tvm" not in skipped(project, model, target)
                    and budget(model, target)):
                out.append(tune_step(project, model, target, abi))
    return out


def tune_step(project, model, target, abi, allow_tuning=None, farm=None,
              ignore_pins=False) -> Step:
    layout = project.layout
    tuning = budget(model, target)
    pinned = None if ignore_pins else model.tvm.get("database", {}).get(target.name)
    inputs = {"model": static_model(layout, model)}
    if pinned:
        for name in OUTPUTS:
            inputs[f"pinned:{name}"] = pinned / name
    given = farm if farm is not None else project.farm
    farm = {**abi.tune, **{k: v for k, v in given.items() if v is not None}}
    if allow_tuning is None:
        allow_tuning = tuning["in_build"]
    return Step(stage="tvm_tune", name=abi_step_name(model, target, abi), version=VERSION,
                config=Config(target=abi.target_dict(), target_name=target.name,
                              budget=Budget(tuning["trials"], tuning["per_task"]),
                              linker=abi.cross_compiler, cross=abi.run["via"] != "python",
                              pinned=_relative(pinned, model) if pinned else None),
                inputs=inputs, outputs=OUTPUTS,
                out_dir=layout.artifact_stage(target.name, model.name, abi.name, "tvm_tune"),
                tools=TOOLS, action=action(allow_tuning, farm), layout=layout,
                doc=f"MetaSchedule database ({tuning['trials']} trials) for {abi.cpu}",
                where=where(model, target, abi), after=(f"coverage:{target.name}/{model.name}",))


def _relative(path: Path, model) -> str:
    try:
        return f"models/{model.name}/{path.relative_to(model.dir).as_posix()}"
    except ValueError:
        return str(path)


def tune_steps(project, target_name: str, model_name: str | None, farm: dict,
               allow_tuning: bool, ignore_pins: bool) -> list[Step]:
    """The tuning steps `doit tune` runs, with its tracker settings and permission to tune."""
    out = []
    for target in [t for t in (*project.targets, *project.proxies) if t.name == target_name]:
        for model in project.models:
            if model_name and model.name != model_name or not budget(model, target):
                continue
            out += [tune_step(project, model, target, a, allow_tuning=allow_tuning, farm=farm,
                              ignore_pins=ignore_pins) for a in tvm_abis(project, model, target)]
    return out


def pin_folder(project, step: Step) -> Path:
    """Where `doit tune pin=1` copies a database: the declared pin, or models/<m>/tuning/<t>."""
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
    import importlib
    import types
    import tvm.s_tir
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
    from tvm.driver import build
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock
    return build(RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod), target=target)


def export_aarch64(mod) -> str:
    """The builder's export for aarch64 candidates: a .so a board's runtime loads (module-level
    so that MetaSchedule's builder processes can import it)."""
    import tempfile
    from tvm.support import cc
    path = os.path.join(tempfile.mkdtemp(prefix="modelyard-tune-"), "candidate.so")
    mod.export_library(path, fcompile=cc.cross_compiler("aarch64-linux-gnu-g++"))
    return path


def _progress_callback(total_budget: int, emulated: bool):
    from tvm.ir.utils import derived_object
    from tvm.s_tir import meta_schedule as ms

    @derived_object
    class Progress(ms.measure_callback.PyMeasureCallback):
        """One line per measured batch: task, its trials, best latency, the whole budget."""

        def __init__(self):
            self.trials, self.best, self.spent, self.started = {}, {}, 0, time.time()

        def apply(self, task_scheduler, task_id, measure_candidates, builder_results,
                  runner_results):
            tasks = task_scheduler.tasks_
            name = tasks[task_id].ctx.task_name
            ok = [float(sum(r.run_secs) / len(r.run_secs)) for r in runner_results
                  if r.error_msg is None and r.run_secs]
            errors = len(runner_results) - len(ok)
            self.trials[task_id] = self.trials.get(task_id, 0) + len(runner_results)
            self.spent += len(runner_results)
            if ok:
                self.best[task_id] = min([*ok, self.best.get(task_id, float("inf"))])
            best = self.best.get(task_id)
            note = " (emulated board: not a performance figure)" if emulated else ""
            print(f"[tune] task {task_id + 1}/{len(tasks)} {name}: {self.trials[task_id]} trials"
                  f"{f', best {best * 1e6:.1f} us{note}' if best is not None else ', no valid run yet'}"
                  f"{f', {errors} failed' if errors else ''} | {self.spent}/{total_budget} trials, "
                  f"{time.time() - self.started:.0f} s", flush=True)

    return Progress()


def main(argv=None) -> int:
    import argparse
    parser = argparse.ArgumentParser(prog="python -m pipeline.stages.tvm_tune")
    for name in ("--model", "--work-dir", "--target", "--linker"):
        parser.add_argument(name, required=True)
    for name in ("--trials", "--per-task", "--per-iter", "--seed"):
        parser.add_argument(name, type=int, required=True)
    parser.add_argument("--tracker")
    parser.add_argument("--key")
    parser.add_argument("--emulated", action="store_true", help="the boards are emulators")
    args = parser.parse_args(argv)

    import tvm
    from tvm import relax
    from tvm.s_tir import meta_schedule as ms
    from .tvm_compile import import_onnx

    cpu_tensor_intrinsics()
    target = tvm.target.Target(json.loads(args.target))
    mod = import_onnx(Path(args.model))
    with target:
        fused = relax.get_pipeline("zero")(mod)  # legalize + fuse: the tasks are fused kernels
    tasks = ms.relax_integration.extract_tasks(fused, target)
    names = [t.task_name for t in tasks]
    print(f"[tune] {len(tasks)} tasks: {', '.join(names[:6])}"
          f"{f' and {len(names) - 6} more' if len(names) > 6 else ''}", flush=True)
    cross = args.linker != "g++"
    workers = 1 if cross else max(1, min(2, os.cpu_count() or 1))
    builder = ms.builder.LocalBuilder(timeout_sec=BUILDER_TIMEOUT_S, max_workers=workers,
                                      f_build=build_candidate,
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
    callbacks = [*ms.measure_callback.MeasureCallback.create("default"),
                 _progress_callback(args.trials, args.emulated)]
    ms.relax_integration.tune_relax(
        mod=fused, params=None, target=target, work_dir=args.work_dir,
        max_trials_global=args.trials, max_trials_per_task=args.per_task,
        num_trials_per_iter=args.per_iter, builder=builder, runner=runner, cost_model="xgb",
        measure_callbacks=callbacks, seed=args.seed)
    for name in DATABASE:
        if not (Path(args.work_dir) / name).is_file():
            print(f"tuning wrote no {name}", file=sys.stderr)
            return 3
    records = [json.loads(l) for l in
               (Path(args.work_dir) / "database_tuning_record.json").read_text().splitlines() if l]
    best: dict = {}
    for workload, (_trace, run_secs, *_rest) in records:
        secs = [float(s) for s in run_secs]
        if secs and max(secs) < 1e9:  # failed runs are recorded as 1e10 s
            mean = sum(secs) / len(secs)
            best[workload] = min(best.get(workload, mean), mean)
    print(json.dumps({"tasks": [{"name": t.task_name, "weight": int(t.weight)} for t in tasks],
                      "trials_budget": args.trials, "per_task": args.per_task,
                      "trials_spent": len(records),
                      "workloads_tuned": len(best),
                      "best_latency_us": {str(k): round(v * 1e6, 3) for k, v in sorted(best.items())}},
                     sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
