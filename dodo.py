"""doit wiring for modelyard: DOIT_CONFIG and one task_<stage>() per stage. Logic lives in pipeline/.

    doit build target=rk3588        build, validate and list every model of models/ for a target
    doit bench target=host          time the target's runnable artifacts against onnxruntime
    doit accuracy [model=NAME]      each precision variant's gate and layer-by-layer divergence
    doit tune target=host           MetaSchedule-tune the TVM artifacts that have a budget (slow)
    doit list                       the stages; `doit list --all` every step
    doit release target=rk3588 version=1.2.0 key=PATH   a signed bundle in artifacts/releases/
    doit verify bundle=PATH [pubkey=PATH] [into=DIR]    check (and unpack) a release bundle, signed
                                    by the pinned key (pubkey=, $MODELYARD_VERIFY_KEY or verify_key
                                    in pyproject.toml); integrity_only=1: without one, integrity only
    doit keygen key=PATH            a new Ed25519 signing key pair (PATH and PATH.pub)
    doit cache status|push|gc|verify  the build cache: hit rates, upload, prune, check
    doit cluster status             the Dask cluster's workers: resources, versions, running steps
    doit bisect model=NAME target=T abi=A   the first node a build gets wrong, and a repro
    doit new source=PATH name=NAME [shape=INPUT:1x3x224x224 ...] [license=PATH]
                                    a new models/NAME/ (source copied, model.yaml written, checked)
Variables (name=value after the command): `doit help COMMAND` lists those it takes, from the
one table in pipeline/core/variables.py; a name no command takes is refused.
"""
import atexit
import functools
import sys
import threading
import time

from doit import create_after, get_var

from pipeline.core import noop, reporter, variables

reporter.install()  # Ctrl-C: one line naming the step, not a traceback (nor an abort in an import)

# A variable no command takes is refused before anything else, the no-op fast path included
# (doit ignores it: `modles=DIR` would answer for models/). The table: pipeline/core/variables.py.
_UNKNOWN = variables.check(sys.argv[1:])
if _UNKNOWN:
    print(f"modelyard: {_UNKNOWN.render()}", file=sys.stderr)
    raise SystemExit(2)

# A no-op `doit build` answers from the last successful build's snapshot of its graph, when
# nothing it was made from changed and doit's own check finds every step up to date
# (pipeline/core/noop.py); otherwise the project is loaded as below.
if noop.up_to_date(__file__, sys.argv[1:]):
    raise SystemExit(0)
_LOADED_FINGERPRINT = noop.loaded(__file__, sys.argv[1:])

from pipeline.bench import config_search, measure as bench, profile, tuning_curve
from pipeline.core import lock, store
from pipeline.core.errors import PipelineError
from pipeline.core.layout import coverage_file
from pipeline.core.settings import flag, setting
from pipeline.core.steps import doit_call, doit_task, rerun_stages
from pipeline.diagnose import bisect
from pipeline.graph import STAGES, coverage_report, load_project, timeline, tune_command
from pipeline.graph.scaffold import new_model
from pipeline.release import cache, release, signing, verify
from pipeline.stages import accuracy

try:
    PROJECT = load_project(models=get_var("models", "models"),
                           artifacts=get_var("artifacts", "artifacts"),
                           target=get_var("target", None),
                           targets_dir=get_var("targets", None),
                           farm={"tracker": get_var("tracker", None), "key": get_var("key", None),
                                 "emulated": get_var("emulated", "0") in ("1", "true", "yes")},
                           need_models=variables.needs_models(sys.argv[1:]),
                           # search=SECONDS: the time a model with no pin may spend ranking its
                           # configs (stages/search_configs.py); untuned=1: build the untuned TVM
                           # artifacts that cannot win too (compilers/builds.py cannot_win)
                           search=get_var("search", None), untuned=get_var("untuned", None))
except PipelineError as err:
    print(f"modelyard: {err.render()}", file=sys.stderr)
    raise SystemExit(2)

# The build cache (pipeline/core/store.py): the local store, and a remote one when a URL is set
# (cache=URL, $MODELYARD_CACHE or [tool.modelyard] cache in pyproject.toml). Pull-only unless
# cache_push=1; records must be signed by cache_pubkey when one is set; cache_key signs pushes.
try:
    store.configure(
        PROJECT.layout.root,
        url=setting("cache", get_var("cache", None), env="MODELYARD_CACHE"),
        push=flag("cache_push", get_var("cache_push", None), env="MODELYARD_CACHE_PUSH"),
        pubkey=setting("cache_pubkey", get_var("cache_pubkey", None), env="MODELYARD_CACHE_PUBKEY",
                       path=True),
        signing_key=setting("cache_key", get_var("cache_key", None), env="MODELYARD_CACHE_KEY",
                            path=True),
        timeout=store.timeout_setting(setting("cache_timeout", get_var("cache_timeout", None))))
except PipelineError as err:
    print(f"modelyard: {err.render()}", file=sys.stderr)
    raise SystemExit(2)
if flag("revalidate", get_var("revalidate", None)):
    rerun_stages({"validate"})  # validation results from a cache are measured again, here

DOIT_CONFIG = {
    "default_tasks": ["build"],
    "continue": True,  # a model that fails does not stop the others; the exit code is still non-zero
    # a read-only artifacts folder without doit's database: `doit list` and `info` read an empty one
    "dep_file": (str(PROJECT.layout.doit_db) if lock.writable(PROJECT.layout.root)
                 or PROJECT.layout.doit_db.exists() else ":memory:"),
    "backend": "sqlite3",
    "action_string_formatting": "new",
    # `-n N` runs N steps side by side, in threads of this process (each mostly waits on its
    # tool; a lavapipe validation waits to run alone: core/steps.py). One at a time by default:
    # on the 2-core machine rk3588's cold build at -n 2 was not faster (1,289 s, of which 953 s
    # the lavapipe runs, each alone; the rest as at -n 1: docs/measurements/2026-12-02-build-time.md).
    # executor=dask sets its own.
    "par_type": "thread",
    "reporter": reporter.Reporter,  # a failure in its own words; what it held back in one line
}


def _tasks(stage: str):
    for step in PROJECT.steps(stage):
        yield doit_task(step)


# One task per stage of the table (pipeline/graph/stages.py), in its order. The stages after
# `coverage` read its verdicts (which compiler can take which model): their tasks are made once
# the coverage tasks have run, so that loading the project (and `doit list`) runs no tool.
def _stage_task(stage):
    def creator():
        yield from _tasks(stage.name)
        if stage.name == "accuracy":
            yield _accuracy_report()
        if stage.name == "coverage" and _asked_for_coverage():
            yield _coverage_report()
    creator.__doc__ = stage.doc
    return creator


def _at_the_end(fn):
    """A teardown that runs once, when the command ends: with -P thread (executor=dask) doit runs
    the teardowns in each thread as it runs out of tasks, and again in the main thread at the
    end; only that last one is at the end."""
    def teardown(*args):
        if threading.current_thread() is threading.main_thread():
            return fn(*args)
        return None
    return teardown


def _asked_for_coverage() -> bool:
    """`doit coverage` (or coverage:report, or a command that lists tasks): not `doit build`,
    which runs the whole coverage task before making the steps after it."""
    words = [a for a in sys.argv[1:] if not a.startswith("-") and "=" not in a]
    return any(w.split(":")[0] in ("coverage", "list", "info", "help") for w in words)


def _coverage_report() -> dict:
    return {"name": "report", "doc": "print per model which stage or compiler stopped it and why, "
                                     "the rewrites applied and the ABIs that shipped",
            # a teardown runs once every other task of the command has: the table then shows
            # what this run's coverage steps (and the last build) left on disk
            "actions": [], "teardown": [(_at_the_end(doit_call), [coverage_report.doit_report, PROJECT,
                                                     [s.name for s in STAGES], get_var("target", None)])],
            "uptodate": [False], "verbosity": 2}


def _accuracy_report() -> dict:
    steps = PROJECT.steps("accuracy")
    return {"name": "report", "doc": "print each variant's gate and layer-by-layer divergence",
            "actions": [(doit_call, [accuracy.doit_report, PROJECT.layout, steps,
                                     get_var("model", None)])],
            "task_dep": [f"accuracy:{s.name}" for s in steps], "uptodate": [False],
            "verbosity": 2}


for _stage in STAGES:
    if not _stage.after_coverage:
        globals()[f"task_{_stage.name}"] = _stage_task(_stage)


# doit makes delayed tasks only for commands that run tasks. The commands that only read the
# graph (list, info, clean, forget...) get them at once, from the coverage verdicts on disk (or
# every ABI, before coverage ever ran): `doit list --all` and `doit info TASK` see every step.
_READ_ONLY = {"list", "info", "clean", "forget", "ignore", "dumpdb", "help", "tabcompletion"}
_READ_ONLY_COMMAND = any(a in _READ_ONLY for a in sys.argv[1:])  # no task is named like these

# One build at a time per artifacts folder (pipeline/core/lock.py): every command that may write
# there takes the lock; those that only read it, and verify/keygen, do not. wait=0: fail at once.
_NO_LOCK_COMMANDS = {"list", "info", "dumpdb", "help", "tabcompletion", "strace"}
_NO_LOCK_TASKS = {"verify", "keygen", "timings"}
_WORDS = [a for a in sys.argv[1:] if not a.startswith("-") and "=" not in a]
_READS_ONLY = (set(_WORDS) & _NO_LOCK_COMMANDS or (_WORDS and set(_WORDS) <= _NO_LOCK_TASKS | {"run"})
               or _WORDS[-2:] == ["cache", "status"] or _WORDS[:1] == ["cluster"])
if not _READS_ONLY:
    try:
        lock.acquire(PROJECT.layout.root, wait=get_var("wait", "1") not in ("0", "false", "no"))
    except PipelineError as err:
        print(f"modelyard: {err.render()}", file=sys.stderr)
        raise SystemExit(2)

# Where the steps that must run run (pipeline/core/executor.py): here (executor=local, the
# default) or on a Dask cluster, their bytes going through the remote cache (executor=dask
# scheduler=tcp://HOST:8786; executor=auto: the cluster when it can be used, else here after one
# warning). doit then runs several steps at once in threads, each waiting on a worker.
_EXECUTOR = setting("executor", get_var("executor", None), env="MODELYARD_EXECUTOR") or "local"
_SCHEDULER = setting("scheduler", get_var("scheduler", None), env="MODELYARD_SCHEDULER")
# `doit tune` runs its steps here (the working database is here): executor=dask sends only
# MetaSchedule's candidate builds to the workers (compilers/tvm_cluster_builds.py).
_RUNS_NO_STEP = {"cluster", "cache", "timings", "verify", "keygen", "new", "tune"}
if _EXECUTOR != "local" and not (_READ_ONLY_COMMAND or _READS_ONLY or set(_WORDS) & _RUNS_NO_STEP):
    from pipeline.core import dask_executor, executor  # imports distributed (1.2 s): only here
    try:
        _RUNNER = dask_executor.start(_EXECUTOR, _SCHEDULER, store.configured_remote())
        if _RUNNER is not None and dask_executor.process_parallel(sys.argv[1:]):
            _RUNNER.close()
            raise PipelineError("executor=dask runs several steps at once in threads of this "
                                "process, each waiting on a worker", stage="cluster",
                                hint="leave out -P process (-n N alone is fine)")
    except PipelineError as err:
        print(f"modelyard: {err.render()}", file=sys.stderr)
        raise SystemExit(2)
    if _RUNNER is not None:
        executor.use(_RUNNER)
        DOIT_CONFIG.update(_RUNNER.doit_config())


def task_after_coverage():
    """(made once `coverage` has run) iree_compile, tvm_tune, tvm_compile, validate, choose, manifest"""
    for stage in STAGES:
        if stage.after_coverage:
            yield {"basename": stage.name, "name": None, "doc": stage.doc}
            for step in PROJECT.steps(stage.name):
                yield {**doit_task(step), "basename": stage.name}


if not _READ_ONLY_COMMAND:
    task_after_coverage = create_after(
        executed="coverage", creates=[s.name for s in STAGES if s.after_coverage])(task_after_coverage)


_STARTED = time.time()


def task_build():
    """build every model for target=NAME (default: all targets) and write its manifest"""
    return {"actions": None, "task_dep": ["_timings", "_snapshot"]}  # the loaded targets' (target=NAME)


def task__timings():
    """(private) at the end of the command, failed or not: time per stage and the slowest steps"""
    return {"actions": [], "teardown": [(_at_the_end(timeline.build_summary), [PROJECT.layout, _STARTED])],
            "uptodate": [False], "verbosity": 2}


def task_timings():
    """where the last build's time went: per stage, the slowest steps, the critical path [target=NAME]"""
    return {"actions": [(doit_call, [timeline.command, PROJECT])], "uptodate": [False],
            "verbosity": 2}


def task__snapshot():
    """(private) after a successful build: the graph snapshot the next no-op build answers from"""
    def write():
        tasks = [{**doit_task(step), "name": f"{stage.name}:{step.name}"}
                 for stage in STAGES if stage.in_build for step in PROJECT.steps(stage.name)]
        verdicts = [coverage_file(PROJECT.layout, t.name, m.name)
                    for t in PROJECT.targets for m in PROJECT.models]
        noop.write(__file__, sys.argv[1:], PROJECT.layout.root, PROJECT.layout.doit_db, tasks,
                   verdicts, _LOADED_FINGERPRINT)
    return {"actions": [write], "task_dep": ["manifest"], "uptodate": [False]}


def task_release():
    """sign and bundle target=NAME's artifacts as version=X.Y.Z (key=PATH or $MODELYARD_SIGNING_KEY)"""
    target = get_var("target", None)
    with_runtime = get_var("runtime", "1") not in ("0", "false", "no")  # the C runtime (docs/runtime.md)
    run = functools.partial(release.run, formats=get_var("format", None))  # tar,deb: release/deb.py
    return {"actions": [(doit_call, [run, PROJECT, target, get_var("version", None),
                                     get_var("key", None), with_runtime, get_var("drop", None)])],
            "task_dep": (["manifest"] + (["runtime"] if with_runtime else [])) if target else [],
            "uptodate": [False], "verbosity": 2}


def task_verify():
    """check a release bundle=PATH (folder or .tar.gz) [pubkey=PATH | integrity_only=1] [into=DIR]"""
    return {"actions": [(doit_call, [verify.verify, get_var("bundle", None), get_var("pubkey", None),
                                     get_var("into", None),
                                     get_var("integrity_only", "0") in ("1", "true", "yes")])],
            "uptodate": [False], "verbosity": 2}


def task_keygen():
    """write a new Ed25519 signing key pair: key=PATH (private, 0600) and PATH.pub"""
    return {"actions": [(doit_call, [signing.keygen, get_var("key", None)])],
            "uptodate": [False], "verbosity": 2}


def task_bench():
    """time target=NAME's runnable artifacts against onnxruntime; write bench.json and report.html"""
    target = get_var("target", None)  # required: without it the action says so, naming the targets
    known = [t.name for t in PROJECT.targets]
    return {"actions": [(bench.doit_action, [PROJECT.layout, target,
                                             {v: get_var(v, None) for v in bench.VARS}, known])],
            "task_dep": ["manifest"] if target else [],
            "uptodate": [False],  # a measurement, never cached
            "verbosity": 2}


def task_profile():
    """time per dispatch / kernel of model=NAME's target=T artifacts, mapped to ONNX ops, beside onnxruntime's [abi=A]"""
    target = get_var("target", None)  # required, as model=: without them the action says so
    return {"actions": [(doit_call, [profile.command, PROJECT.layout, target, get_var("model", None),
                                     {v: get_var(v, None) for v in profile.VARS},
                                     [t.name for t in PROJECT.targets]])],
            "task_dep": ["manifest"] if target else [],
            "uptodate": [False],  # a measurement, never cached
            "verbosity": 2}


def task_tune():
    """MetaSchedule-tune target=NAME's TVM artifacts [model=NAME tracker=HOST:PORT key=KEY emulated=1 pin=1|model curve=1]"""
    target = get_var("target", None)
    curve = [(doit_call, [tuning_curve.command, PROJECT, target, get_var("model", None),
                          {v: get_var(v, None) for v in tuning_curve.VARS}])]
    return {"actions": [(doit_call, [tune_command.command, PROJECT, target, get_var("model", None),
                                     {"tracker": get_var("tracker", None), "key": get_var("key", None),
                                      "emulated": get_var("emulated", "0") in ("1", "true", "yes")},
                                     get_var("pin", "0"), _EXECUTOR, _SCHEDULER])]
                       + (curve if get_var("curve", "0") in ("1", "true", "yes") else []),
            "task_dep": [f"static:{m.name}" for m in PROJECT.models]
                        + [f"coverage:{target}/{m.name}" for m in PROJECT.models] if target else [],
            "uptodate": [False], "verbosity": 2}


def task_search():
    """build, validate and time each ABI's declared configs per model; pin the fastest: target=NAME [model=NAME]"""
    target, model = get_var("target", None), get_var("model", None)
    models = [m.name for m in PROJECT.models if model in (None, m.name)]
    return {"actions": [(doit_call, [config_search.command, PROJECT, target, model,
                                     {v: get_var(v, None) for v in config_search.VARS}])],
            "task_dep": [f"{stage}:{m}" for m in models for stage in ("golden", "static")]
                        + [f"coverage:{target}/{m}" for m in models] if target else [],
            "uptodate": [False], "verbosity": 2}


def task_new():
    """write models/NAME/ from source=PATH name=NAME [shape=INPUT:1x3x224x224 ...] [value=INPUT:16000 ...] [license=PATH]"""
    shapes = [a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("shape=")]  # several allowed
    values = [a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("value=")]  # likewise
    return {"actions": [(doit_call, [new_model, get_var("source", None), get_var("name", None),
                                     shapes, get_var("license", None), get_var("models", "models"),
                                     PROJECT.layout.cache, values])],
            "uptodate": [False], "verbosity": 2}


def task_bisect():
    """the first node an ABI's build gets wrong, and a standalone repro: model=NAME target=T abi=A"""
    model = get_var("model", None)
    known = model in {m.name for m in PROJECT.models}  # else the action names the known ones
    return {"actions": [(doit_call, [bisect.command, PROJECT, model, get_var("target", None),
                                     get_var("abi", None)])],
            "task_dep": [f"static:{model}", f"golden:{model}"] if known else [],
            "uptodate": [False], "verbosity": 2}


def task_cluster():
    """the Dask cluster the build can run on: doit cluster status [scheduler=tcp://HOST:8786]"""
    def action(pos):
        from pipeline.core import dask_executor  # imports distributed (1.2 s): only for this command
        return doit_call(dask_executor.command, pos, _SCHEDULER)
    return {"actions": [action], "pos_arg": "pos", "uptodate": [False], "verbosity": 2}


def task_cache():
    """the build cache: doit cache status|push|gc|verify [budget=SIZE] [cache=URL cache_push=1]"""
    def action(pos):
        return doit_call(cache.command, PROJECT.layout.root, pos, get_var("budget", None))
    return {"actions": [action], "pos_arg": "pos", "uptodate": [False], "verbosity": 2}


# `doit help TASK`: after doit's line, the variables the command takes (core/variables.py)
_HELP = variables.help_topic(sys.argv[1:])
if _HELP and (f"task_{_HELP}" in globals() or any(s.name == _HELP for s in STAGES)):
    atexit.register(print, variables.help_text(_HELP))
