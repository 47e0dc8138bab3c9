"""The tuning child (`python -m pipeline.compilers.tvm_tuner`): MetaSchedule on a model's tasks,
appending to the working database, then the model's part of it; or a merge of databases.

The tvm_tune stage runs it (stages/tvm_tune.py), as does `doit tune` (graph/tune_command.py)
for a pin. A crash in TVM is the step's error; the progress lines start with `[tune] `.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import tvm
import tvm_ffi
from tvm import relax
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms

from ..core.errors import PipelineError
from . import tuning_db
from .tvm_candidates import build_candidate, cpu_tensor_intrinsics, export_aarch64
from .tvm_cluster_builds import ClusterBuilds
from .tvm_relax import import_onnx
from .tvm_tune_progress import Progress
from .tvm_tuning import (BUILDER_TIMEOUT_S, CLUSTER_FAILED, NOT_COVERED, PROGRESS, identity_problems,
                         search_population)


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
    parser = argparse.ArgumentParser(prog="python -m pipeline.compilers.tvm_tuner")
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


def progress_callback(progress: Progress):

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
        self.mod, self.hash = mod, tvm_ffi.structural_hash(mod)

    def __hash__(self):
        return self.hash

    def __eq__(self, other):
        return self.hash == other.hash and bool(tvm_ffi.structural_equal(self.mod, other.mod))


def workload_keys(lines: list[str]) -> list[_Key]:
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
                 progress_callback(progress)]
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
