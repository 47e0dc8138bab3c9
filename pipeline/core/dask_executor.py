"""The `dask` executor: the steps a build must run go to a Dask distributed cluster; their inputs
and outputs go through the remote cache (core/remote.py), the cluster's data plane.

Client (the `doit build executor=dask scheduler=tcp://HOST:8786` process):
  * at start, connects to the scheduler and admits the workers whose pipeline code, Python,
    Python packages and tools match this machine's, each running one step at a time
    (`--nthreads 1`); any other worker is refused with one line saying what differs;
  * for each step that must run (core/steps.py decided it, exactly as for a local build): sends
    the inputs the cache lacks to its CAS, then submits the Action (core/executor.py) under the
    step key as the Dask key (two builds asking for one step share one computation), restricted
    to the admitted workers that offer the resources the step needs (RESOURCES);
  * when the ActionResult comes back: copies the worker's log into artifacts/logs/ (its first
    line says which worker ran it), then restores the outputs from the cache as a cache hit
    does, or raises the worker's error as the step's own.

Worker (`dask worker tcp://HOST:8786 --nthreads 1 --no-nanny [--resources "qemu=1 vulkan=1"]`,
started in a checkout with the same code and `./setup.sh`; THREAD_VARS says why without the
nanny): `run_action` places each input in a workspace of its own by sha256 (from its disk or
the cache), makes the same Step, checks that its key is the client's (same code, tools and
inputs: else it refuses the step, saying what differs), runs it through the same code path as a
local build (core/steps.py execute: its own store and the cache first), pushes the outputs and
their record to the cache, and returns the record. A worker killed midway pushed no record: the
scheduler gives the step to another worker. `run_call` runs a piece of a job that runs on the
client (a `doit tune` candidate build) the same way, one at a time.

`distributed` is imported only here, and this module only when a build asks for a cluster.
"""
from __future__ import annotations

import atexit
import hashlib
import json
import logging
import os
import socket
import sys
import threading
import time
from pathlib import Path

import distributed

from . import codehash, executor, steps, store
from .errors import PipelineError
from .executor import Action, ActionResult, at, error_fields
from .layout import Layout
from .remote import RemoteFault
from .store import Store, sha256_file, sha256_text, step_key
from .tools import BINARIES, DISTRIBUTIONS, versions

# What a worker may offer (`dask worker --resources "qemu=1 vulkan=1"`) and what needs it.
RESOURCES = {
    "qemu": "runs aarch64 programs under qemu-user: validation of aarch64 artifacts",
    "vulkan": "has a Vulkan driver: validation of Vulkan artifacts (Mesa lavapipe, or a GPU)",
    "tune": "may tune: MetaSchedule tuning steps (a budget with `in_build: true`)",
}
# Tools a worker may lack (it then offers no resource that needs them); any other difference
# with the client refuses the worker.
OPTIONAL_TOOLS = BINARIES + ("iree-runtime-aarch64", "tvm-aarch64", "vulkan-driver:lavapipe")
TOPIC = "modelyard-steps"   # the Dask event topic of steps starting on workers
DEFAULT_TIMEOUT = 5.0       # seconds to reach the scheduler
WAIT_S = 5.0                # how often a waiting client checks that a worker can still run its step
# Environment variables that set how many threads numpy's BLAS and OpenMP code use. Dask's nanny
# sets the first three to 1 in every worker it spawns (distributed.nanny.pre-spawn-environ): a
# float64 dot product then sums in another order, and validation's cosine differs in its last
# digits from a local build's (measured: bench/cluster.py, 13 files of 122). A worker must run
# with the client's values.
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "TVM_NUM_THREADS")
CLUSTER_SUFFIX = ".cluster.json"  # beside a step's log: where and when it ran (bench/cluster.py)
START_HINT = ("start one (`dask scheduler`, see docs/cluster.md), or build here with "
              "executor=local (executor=auto falls back to it by itself)")


def needs(step) -> dict:
    """The worker resources a step needs (RESOURCES), from the tools it calls and its stage."""
    out = {}
    if "qemu-aarch64-static" in step.tools:
        out["qemu"] = 1
    if any(t.startswith("vulkan-driver:") for t in step.tools):
        out["vulkan"] = 1
    if step.stage == "tvm_tune" and getattr(step.action, "keywords", {}).get("allow_tuning"):
        out["tune"] = 1
    return out


# ----------------------------------------------------------------------------- identity
def package_digest() -> str:
    """sha256 over every file of the `pipeline` package (code and data): two machines with the
    same digest compute the same step keys from the same inputs."""
    lines = []
    for path in sorted(codehash.ROOT.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            lines.append(f"{path.relative_to(codehash.ROOT).as_posix()} {digest}\n")
    return sha256_text("".join(lines))


def identity() -> dict:
    """What must match between the client and a worker: the code, Python, Dask, the tools."""
    return {"code": package_digest(), "python": sys.version.split()[0],
            "distributed": distributed.__version__,
            "tools": versions(*DISTRIBUTIONS, *OPTIONAL_TOOLS),
            "threads": {var: os.environ.get(var) for var in THREAD_VARS}}


def differences(ours: dict, theirs: dict) -> list[str]:
    """Why a worker with identity `theirs` cannot run this client's steps (empty: it can)."""
    out = []
    if theirs.get("code") != ours["code"]:
        out.append(f"its pipeline code differs (sha256 {str(theirs.get('code'))[:12]} there, "
                   f"{ours['code'][:12]} here: another checkout, or local edits)")
    for name in ("python", "distributed"):
        if theirs.get(name) != ours[name]:
            out.append(f"{name} {theirs.get(name)} there, {ours[name]} here")
    threads = theirs.get("threads", {})
    for var, value in sorted(ours.get("threads", {}).items()):
        if threads.get(var) != value:
            out.append(f"{var}={threads.get(var) if threads.get(var) is not None else '(unset)'} there, "
                       f"{value if value is not None else '(unset)'} here (Dask's nanny sets the "
                       f"thread counts to 1: start the worker with --no-nanny)")
    have = theirs.get("tools", {})
    for tool, version in sorted(ours["tools"].items()):
        got = have.get(tool, "missing")
        if got != version and not (tool in OPTIONAL_TOOLS and got == "missing"):
            out.append(f"{tool} {short(got)} there, {short(version)} here")
    return out


def short(version: str) -> str:
    return version[:19] if version.startswith("sha256:") else version


def key_differences(ours: dict, theirs: dict) -> list[str]:
    """Which parts of a step key differ between this worker (`ours`) and the client."""
    out = []
    if ours["code"] != theirs["code"]:
        out.append(f"the code of stage {ours['stage']} (sha256 {ours['code'][:12]} here, "
                   f"{theirs['code'][:12]} on the client)")
    for tool in sorted(set(ours["tools"]) | set(theirs["tools"])):
        if ours["tools"].get(tool) != theirs["tools"].get(tool):
            out.append(f"{tool} {short(str(ours['tools'].get(tool)))} here, "
                       f"{short(str(theirs['tools'].get(tool)))} on the client")
    out += [f"the step's {part}" for part in ("stage", "version", "config", "inputs")
            if ours[part] != theirs[part]]
    return out


# ----------------------------------------------------------------------------- worker side
_ONE_STEP = threading.Lock()   # one step at a time in a worker process (it uses every core)
_RUNNING: dict[str, tuple[str, float]] = {}   # key -> (stage:name, started): `doit cluster status`
_CONFIGURED: dict[str, str] = {}


def worker_identity(dask_worker) -> dict:
    """identity() of the worker process this runs in, and where it works (Client.run passes
    the worker)."""
    return {**identity(), "workspace": str(_base(dask_worker)),
            "cache": os.environ.get("MODELYARD_CACHE"), "pid": os.getpid()}


def running_steps() -> dict:
    """The steps this worker process runs now: {key: [stage:name, seconds so far]}."""
    now = time.time()
    return {k: [label, round(now - t, 1)] for k, (label, t) in list(_RUNNING.items())}


def _base(worker) -> Path:
    """$MODELYARD_WORKER_DIR/<worker name>, else a folder in the worker's local directory."""
    name = "".join(c if c.isalnum() or c in "-_." else "_" for c in str(worker.name))
    configured = os.environ.get("MODELYARD_WORKER_DIR")
    return Path(configured) / name if configured else Path(worker.local_directory) / "modelyard"


def _workspace(action: Action, worker) -> tuple[Path, str]:
    """The workspace for the action's cache (one per cache: their stores stay apart), with this
    process's store set to that cache. The worker reads the cache the client names, unless
    MODELYARD_CACHE says where that cache is from here (say, file:///mnt/cache for http://...)."""
    url = os.environ.get("MODELYARD_CACHE") or action.cache
    root = _base(worker) / sha256_text(url)[:16]
    remote = store.configured_remote()
    if _CONFIGURED.get("url") != url or remote is None or remote.down:  # a fault is forgotten
        store.configure(root / "artifacts", url=url, push=False,
                        pubkey=os.environ.get("MODELYARD_CACHE_PUBKEY") or None,
                        signing_key=os.environ.get("MODELYARD_CACHE_KEY") or None,
                        timeout=store.timeout_setting(os.environ.get("MODELYARD_CACHE_TIMEOUT")))
        store.use_memo(root / "artifacts" / ".cache" / "hashes.json")
        _CONFIGURED["url"] = url
    return root, url


def run_action(action: Action) -> ActionResult:
    """Run one Action on this worker (the function the client submits); see the module doc."""
    worker = distributed.get_worker()
    me = {"worker": worker.address, "worker_name": str(worker.name), "host": socket.gethostname()}
    with _ONE_STEP:
        started = time.time()
        _RUNNING[action.key] = (action.label, started)
        worker.log_event(TOPIC, {"key": action.key, "step": action.label, **me})
        root, url = _workspace(action, worker)
        layout = Layout(root / "artifacts")
        log = layout.log(action.stage, action.name)
        try:
            how, outputs, info = _run(action, root, url, layout, me)
        except PipelineError as err:
            return ActionResult(key=action.key, how="failed", log=_text(log), error=error_fields(err),
                                started=started, finished=time.time(), **me)
        finally:
            _RUNNING.pop(action.key, None)
        return ActionResult(key=action.key, how=how, log=_text(log), outputs=outputs, started=started,
                            finished=time.time(), info=info, **me)


def run_call(label: str, fn, *args) -> dict:
    """Run fn(*args) on this worker as one unit of work, like a step (one at a time, shown by
    `doit cluster status`): a piece of a larger job that runs on the client, such as one
    MetaSchedule candidate build of `doit tune` (stages/tvm_tune.py). Returns its value and
    where and how long it ran; an exception is the caller's to read (fn returns errors it
    expects as values)."""
    worker = distributed.get_worker()
    with _ONE_STEP:
        started = time.time()
        token = f"{label}@{started}"
        _RUNNING[token] = (label, started)
        try:
            value = fn(*args)
        finally:
            _RUNNING.pop(token, None)
    return {"value": value, "worker": worker.address, "worker_name": str(worker.name),
            "host": socket.gethostname(), "started": started, "finished": time.time()}


def _run(action: Action, root: Path, url: str, layout: Layout, me: dict) -> tuple[str, dict, dict]:
    remote = store.configured_remote()
    where = dict(stage=action.stage, **action.where)
    inputs = {name: _place_input(name, meta, root, layout, remote, where)
              for name, meta in action.inputs.items()}
    step = steps.Step(stage=action.stage, name=action.name, version=action.version,
                      config=action.parts["config"], config_type=action.config_type,
                      inputs=inputs, outputs=action.outputs, out_dir=at(root, action.out_dir),
                      tools=action.tools, action=action.run, layout=layout, doc=action.doc,
                      where=action.where, owns_dir=action.owns_dir)
    ours = step.key_parts()
    if step_key(ours) != action.key:
        raise PipelineError(
            f"dask worker {me['worker_name']} ({me['worker']}, host {me['host']}) refused the step: "
            f"its key here differs from the client's: " + "; ".join(key_differences(ours, action.parts)),
            hint="start the workers from the same checkout as the client and run ./setup.sh there; "
                 "`doit cluster status` compares each worker with this machine", **where)
    wall = time.perf_counter()
    how = steps.execute(step)          # the local code path: its own disk, its store, the cache
    wall = time.perf_counter() - wall
    outputs = steps.read_record(step)["outputs"]
    files = {meta["sha256"]: step.out_dir / name for name, meta in outputs.items()}
    try:   # objects first, the record last: a worker killed here leaves no record behind
        remote.push(action.key, action.stage, outputs, files.__getitem__, strict=True)
    except RemoteFault as fault:
        raise PipelineError(f"the worker {me['worker_name']} ran the step but cannot push its "
                            f"outputs to the cache {url}: {fault}",
                            hint="check that the workers can write to the cache", **where) from None
    return how, outputs, {"wall_s": round(wall, 3)}


def _place_input(name: str, meta: dict, root: Path, layout: Layout, remote, where: dict) -> Path:
    """The input at its place in the workspace, checked against its sha256: already there, or
    copied from this worker's store, or pulled from the cache's CAS."""
    dest = at(root, meta["place"])
    digest, size = meta["sha256"], meta["size"]
    if dest.is_file() and dest.stat().st_size == size and sha256_file(dest) == digest:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    try:
        local = Store(layout.store).object_path(digest)
        ok = False
        if local.is_file() and local.stat().st_size == size:
            tmp.write_bytes(local.read_bytes())
            ok = hashlib.sha256(tmp.read_bytes()).hexdigest() == digest
        if not ok:
            ok = remote.fetch(digest, size, tmp)
        if not ok:
            raise PipelineError(
                f"input {name} (sha256 {digest[:16]}, {size} bytes) cannot be had from the cache "
                f"{remote.url}", hint="the client sends every input before it submits a step: "
                "check that the client and the workers use the same cache (MODELYARD_CACHE on a "
                "worker says where it is from there)", **where)
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def _text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


# ----------------------------------------------------------------------------- client side
def warn(line: str) -> None:
    """A line on the console. doit -P thread swaps sys.stderr for the running task's capture,
    which would file these lines under whichever step is running: the real stream takes them."""
    print(f"modelyard: {line}", file=sys.__stderr__ or sys.stderr, flush=True)


class Cluster:
    """A client of a Dask scheduler and the workers it admits: those whose pipeline code,
    Python, Dask, Python packages and tools match this machine's, each running one thing at a
    time. A build's executor (DaskExecutor) and `doit tune`'s candidate builds
    (stages/tvm_tune.py) both submit through one."""

    def __init__(self, scheduler: str, timeout: float | None = None, name: str = "modelyard-build"):
        logging.getLogger("distributed").setLevel(logging.ERROR)  # its own lines: ours say it
        self.scheduler = scheduler
        self.timeout = timeout or DEFAULT_TIMEOUT
        try:
            self.client = distributed.Client(scheduler, timeout=self.timeout, set_as_default=False,
                                             name=name)
        except (OSError, TimeoutError) as exc:
            raise PipelineError(f"cannot reach the Dask scheduler {scheduler}: "
                                f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}",
                                stage="cluster", hint=START_HINT) from None
        self.identity = identity()
        self.workers: dict[str, dict] = {}      # admitted: address -> name, host, resources, lacks
        self.refused: dict[str, list[str]] = {}  # address -> why
        self._lock = threading.Lock()
        atexit.register(self.close)
        self._admit()
        if not self.workers:
            why = "".join(f"\n  {a}: {'; '.join(w)}" for a, w in sorted(self.refused.items()))
            self.close()
            raise PipelineError(f"the Dask scheduler {scheduler} has no worker that can run this "
                                f"build's steps" + (f"; refused:{why}" if why else " (it has none)"),
                                stage="cluster",
                                hint="start workers from this checkout (same code, ./setup.sh) "
                                     "with --nthreads 1: docs/cluster.md")

    # ---- workers ------------------------------------------------------------------------------
    def _admit(self) -> None:
        """Check the workers not seen yet; admit those that match this machine, warn about the others."""
        with self._lock:
            info = self.client.scheduler_info()["workers"]
            new = [a for a in info if a not in self.workers and a not in self.refused]
            if not new:
                return
            found = self.client.run(worker_identity, workers=new, on_error="return")
            for address in new:
                w, theirs = info[address], found.get(address)
                if isinstance(theirs, BaseException) or theirs is None:
                    problems = [f"it cannot run modelyard's code ({type(theirs).__name__}: {theirs})"]
                else:
                    problems = differences(self.identity, theirs)
                if w.get("nthreads", 1) != 1:
                    problems.append(f"it runs {w['nthreads']} threads: a step uses every core, start "
                                    f"it with --nthreads 1 (several worker processes for several)")
                if problems:
                    self.refused[address] = problems
                    warn(f"refusing dask worker {w.get('name')} ({address}): " + "; ".join(problems))
                else:
                    lacks = sorted(t for t, v in theirs.get("tools", {}).items() if v == "missing")
                    self.workers[address] = {"name": str(w.get("name")), "host": w.get("host"),
                                             "resources": dict(w.get("resources") or {}),
                                             "lacks": lacks}

    def able(self, wanted: dict, tools: tuple = ()) -> list[str]:
        """The admitted workers, alive now, that offer every resource in `wanted` and have every
        tool in `tools` (an optional tool a worker may lack, such as a cross compiler)."""
        self._admit()
        alive = set(self.client.scheduler_info()["workers"])
        return sorted(a for a, w in self.workers.items() if a in alive
                      and all(w["resources"].get(r, 0) >= n for r, n in wanted.items())
                      and not set(tools) & set(w["lacks"]))

    def wait(self, future, wanted: dict, where: dict, what: str = "the step", tools: tuple = (),
             deadline: float | None = None):
        """The future's result; a clear error when every worker that could run it has gone (for
        longer than the connection timeout), or when it killed worker after worker. With a
        `deadline` (time.monotonic()), None once it has passed, the future cancelled."""
        gone_since = None
        while True:
            try:
                return future.result(timeout=WAIT_S if deadline is None else
                                     max(0.01, min(WAIT_S, deadline - time.monotonic())))
            except distributed.TimeoutError:
                if deadline is not None and time.monotonic() >= deadline:
                    future.cancel()
                    return None
            except distributed.KilledWorker as exc:
                raise PipelineError(f"{what} was running on workers that died one after another "
                                    f"({exc}); the scheduler gave up on it",
                                    hint="look at the workers' logs and memory (a step that takes "
                                         "more memory than a worker has kills it)", **where) from None
            if self.able(wanted, tools):
                gone_since = None
            elif gone_since is None:
                gone_since = time.monotonic()
            elif time.monotonic() - gone_since > self.timeout:
                future.cancel()
                raise PipelineError(f"every worker of {self.scheduler} that could run {what} has "
                                    f"left the cluster", hint="start workers again (docs/cluster.md) "
                                    "and run the command again: what was done is kept", **where)

    def close(self) -> None:
        client, self.client = getattr(self, "client", None), None
        if client is not None:
            try:
                client.close(timeout=self.timeout)
            except (OSError, TimeoutError, RuntimeError):
                pass


class DaskExecutor(Cluster, executor.Executor):
    """Runs steps on the admitted workers of a Dask cluster (see the module's docstring)."""

    name = "dask"

    def __init__(self, scheduler: str, remote, timeout: float | None = None):
        self.remote = remote
        self._sent: set[str] = set()            # objects known to be in the cache's CAS
        self._mine: set[str] = set()            # keys this build has in flight
        super().__init__(scheduler, timeout, name="modelyard-build")
        self.client.subscribe_topic(TOPIC, self._on_event)

    def doit_config(self) -> dict:
        """doit runs as many steps at once as there are admitted workers, in threads, each
        waiting on its step (-n on the command line overrides it). One more would only queue a
        step behind a busy worker that Dask picks at submission, while another may free up
        first (bench/cluster.py measured it: docs/cluster.md)."""
        return {"num_process": max(1, len(self.workers)), "par_type": "thread"}

    # ---- one step -------------------------------------------------------------------------------
    def run(self, step, key: str, parts: dict, scratch: Path, store_: Store) -> dict:
        wanted = needs(step)
        where = dict(stage=step.stage, **step.where)
        able = self.able(wanted)
        if not able:
            offered = ", ".join(f"{r} ({RESOURCES[r]})" for r in sorted(wanted))
            raise PipelineError(f"no admitted worker of the Dask cluster {self.scheduler} offers "
                                f"{offered or 'to run steps'}",
                                hint=f"start a worker with --resources \"{' '.join(f'{r}=1' for r in sorted(wanted))}\" "
                                     f"on a machine that has it (docs/cluster.md)", **where)
        self._send_inputs(step, parts, where)
        action = Action.of(step, key, parts, self.remote.url, wanted)
        self._mine.add(key)
        submitted = time.time()
        future = self.client.submit(run_action, action, key=key, workers=able,
                                    resources=wanted or None, allow_other_workers=False, pure=False)
        try:
            result = self.wait(future, wanted, where)
        finally:
            future.release()
            self._mine.discard(key)
        returned = time.time()
        self._write_log(step, result, submitted)
        result.raise_error(step.log)
        self._sent.update(m["sha256"] for m in result.outputs.values())
        outputs = store_.lookup(key)   # from the cache, every object checked, as a cache hit
        if outputs is None:
            raise PipelineError(f"worker {result.worker_name} pushed the outputs to the cache "
                                f"{self.remote.url}, yet they cannot be pulled from it here",
                                hint="the first warning above says why; `doit cache status`", **where)
        store_.restore(outputs, scratch)
        self._write_record(step, result, submitted, returned, time.time())
        warn(f"{step.stage}:{step.name} {result.how} on worker {result.worker_name} "
             f"({result.host}) in {result.finished - result.started:.1f} s "
             f"(+{result.started - submitted:.2f} s to start, {time.time() - result.finished:.2f} s back)")
        return outputs

    def _send_inputs(self, step, parts: dict, where: dict) -> None:
        """Put every input the cache's CAS lacks there (workers read inputs from nowhere else)."""
        for name, path in sorted(step.inputs.items()):
            digest = parts["inputs"][name]
            if digest in self._sent:
                continue
            try:
                self.remote.put_object(digest, Path(path).stat().st_size, Path(path))
            except RemoteFault as fault:
                raise PipelineError(f"cannot send the input {name} to the cache {self.remote.url}, "
                                    f"where the workers read it: {fault}",
                                    hint="the cluster needs a cache this machine can write to", **where) from None
            self._sent.add(digest)

    def _write_log(self, step, result: ActionResult, submitted: float) -> None:
        """The worker's log of the step, as the step's log here, headed by where it ran."""
        step.log.parent.mkdir(parents=True, exist_ok=True)
        step.log.write_text(f"# ran on dask worker {result.worker_name} ({result.worker}, host "
                            f"{result.host}): {result.how}, {result.finished - result.started:.2f} s "
                            f"there, {result.started - submitted:.2f} s from submission to start\n"
                            + result.log)

    def _write_record(self, step, result: ActionResult, submitted: float, returned: float,
                      restored: float) -> None:
        doc = {"stage": step.stage, "name": step.name, "how": result.how, "worker": result.worker,
               "worker_name": result.worker_name, "host": result.host, "submitted": submitted,
               "started": result.started, "finished": result.finished, "returned": returned,
               "restored": restored}
        path = cluster_record(step.log)
        path.write_text(json.dumps(doc, sort_keys=True) + "\n")

    def _on_event(self, event) -> None:
        msg = event[1]
        if isinstance(msg, dict) and msg.get("key") in self._mine:
            warn(f"{msg['step']} started on worker {msg['worker_name']} ({msg['host']})")


def cluster_record(log: Path) -> Path:
    return log.with_name(log.name[: -len(".log")] + CLUSTER_SUFFIX)


# ----------------------------------------------------------------------------- the build's choice
EXECUTORS = ("local", "dask", "auto")


def start(mode: str, scheduler: str | None, remote, timeout: float | None = None) -> DaskExecutor | None:
    """The executor a build asked for: None for `local`; for `dask` a connected DaskExecutor or
    a PipelineError; for `auto` the same, or None after one warning when the cluster cannot be
    used (no scheduler set, none reachable, no remote cache)."""
    if mode not in EXECUTORS:
        raise PipelineError(f"executor={mode!r} is not one of {', '.join(EXECUTORS)}",
                            stage="cluster", hint="executor=dask scheduler=tcp://HOST:8786")
    if mode == "local" or (mode == "auto" and not scheduler):
        return None
    try:
        if not scheduler:
            raise PipelineError("executor=dask needs the scheduler's address", stage="cluster",
                                hint="scheduler=tcp://HOST:8786 (or `scheduler` in [tool.modelyard])")
        if remote is None:
            raise PipelineError("the cluster moves inputs and outputs through the remote cache, and "
                                "none is set", stage="cluster",
                                hint="cache=URL (one every worker reaches, e.g. http://cache:8080/modelyard)")
        return DaskExecutor(scheduler, remote, timeout)
    except PipelineError as err:
        if mode == "dask":
            raise
        warn(f"executor=auto: {err.what}; building here")
        return None


def process_parallel(argv: list[str]) -> bool:
    """Whether a doit command line asks for steps in processes (-P process)."""
    for i, arg in enumerate(argv):
        value = (argv[i + 1] if arg in ("-P", "--parallel-type") and i + 1 < len(argv) else
                 arg.split("=", 1)[1] if arg.startswith("--parallel-type=") else
                 arg[2:] if arg.startswith("-P") and len(arg) > 2 else None)
        if value == "process":
            return True
    return False


def command(pos: list[str], scheduler: str | None) -> str:
    """`doit cluster status`."""
    if list(pos) != ["status"]:
        raise PipelineError(f"unknown cluster command {' '.join(pos) or '(none)'}", stage="cluster",
                            hint="doit cluster status [scheduler=tcp://HOST:8786]")
    return status(scheduler)


def status(scheduler: str | None, timeout: float | None = None) -> str:
    """`doit cluster status`: the scheduler's workers (resources, whether their code and tools
    match this machine's, what they run now)."""
    if not scheduler:
        raise PipelineError("no scheduler is set", stage="cluster",
                            hint="scheduler=tcp://HOST:8786 (or `scheduler` in [tool.modelyard])")
    logging.getLogger("distributed").setLevel(logging.ERROR)
    try:
        client = distributed.Client(scheduler, timeout=timeout or DEFAULT_TIMEOUT,
                                    set_as_default=False, name="modelyard-status")
    except (OSError, TimeoutError) as exc:
        raise PipelineError(f"cannot reach the Dask scheduler {scheduler}: "
                            f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}",
                            stage="cluster", hint=START_HINT) from None
    try:
        info = client.scheduler_info()["workers"]
        ids = client.run(worker_identity, on_error="return")
        busy = client.run(running_steps, on_error="return")
    finally:
        client.close()
    ours = identity()
    lines = [f"scheduler {scheduler}: {len(info)} worker(s)"]
    for address, w in sorted(info.items(), key=lambda kv: str(kv[1].get("name"))):
        res = " ".join(f"{k}={v:g}" for k, v in sorted((w.get("resources") or {}).items())) or "-"
        lines.append(f"  {w.get('name')}  {address}  host {w.get('host')}  threads "
                     f"{w.get('nthreads')}  resources {res}")
        theirs = ids.get(address)
        if isinstance(theirs, dict):
            problems = differences(ours, theirs)
            if w.get("nthreads", 1) != 1:
                problems.append(f"{w['nthreads']} threads (start it with --nthreads 1)")
            lines.append("    " + ("same code and tools as this machine" if not problems
                                   else "REFUSED by a build from here: " + "; ".join(problems)))
            lines.append(f"    workspace {theirs.get('workspace')}"
                         + (f", cache {theirs['cache']}" if theirs.get("cache") else ""))
        else:
            lines.append(f"    cannot run modelyard's code: {theirs}")
        running = busy.get(address)
        for label, seconds in (running.values() if isinstance(running, dict) else []):
            lines.append(f"    running {label} ({seconds:.0f} s)")
    lines.append(f"this machine: pipeline sha256 {ours['code'][:12]}, python {ours['python']}, "
                 f"distributed {ours['distributed']}")
    return "\n".join(lines)
