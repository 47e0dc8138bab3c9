"""`doit tune target=T [model=M] [pin=1|model] [executor=dask]`: run the tvm_tune steps of a
target with tuning allowed, here, and pin what they tuned (docs/tuning.md)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from ..compilers.builds import built_abis
from ..compilers.tvm_backend import TVM
from ..compilers.tvm_tuning import child_summary, database_identity, identity_problems
from ..core.errors import PipelineError
from ..core.steps import Step, execute
from ..core.tools import python_module_argv, run_tool
from ..spec.tvm import budget, shared_database
from ..stages.tvm_tune import OUTPUTS, tune_step


PIN_MODES = {"0": None, "false": None, "no": None, "1": "shared", "true": "shared",
             "yes": "shared", "shared": "shared", "model": "model"}


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
    argv = python_module_argv("pipeline.compilers.tvm_tuner", "--merge-into", str(folder),
                              "--merge", str(step.out_dir), "--identity",
                              json.dumps(database_identity(step.cfg.target), sort_keys=True))
    result = run_tool(argv, log=step.log, what="pinning the tuning database", stage="tvm_tune",
                      **step.where)
    added = child_summary(result)
    out = [f"  pinned into {folder}: {added['workloads_added']} workload(s) and "
           f"{added['records_added']} trial(s) added (shared by every model of "
           f"{target_name}/{abi}); commit the folder"]
    if model.tvm.get("database", {}).get(target_name):
        out.append(f"  the shared pin covers {model_name}: remove tvm.database.{target_name} from "
                   f"its model.yaml (and its own pinned folder)")
    return out


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
