"""Builds on a real Dask cluster on loopback: a `dask scheduler` and `dask worker` processes
(one step at a time each, different resources), with nginx as the remote cache the inputs and
outputs travel through. Tiny models for `host` and for `rk3588`'s aarch64 CPU and portable Vulkan
ABIs, compared byte for byte with a local build; validation under qemu and on lavapipe only on
workers that offer `qemu` and `vulkan`. `doit tune executor=dask`: MetaSchedule's candidates
built on the workers, measured here, one worker killed midway.

Faults: a worker killed mid-step (its step runs again on the other one, same bytes, nothing
half-written in the cache); no scheduler at start (a clear error, or `executor=auto` builds
here after one warning); a step failing on a worker (the build fails as it does locally, with
the worker's log copied); a worker started from other code (refused).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import distributed
import pytest

from cache_server import Nginx, free_port, wait_listening
from conftest import REPO, Workspace, add_tiny_model, ran, sha256, target_registry
from pipeline.core import dask_executor
from pipeline.core.executor import at, place
from pipeline.graph import load_project
from test_build import col2im_model


class Cluster:
    """A scheduler on a free loopback port, workers started on demand, nginx as the cache."""

    def __init__(self, root: Path):
        self.root = root
        self.nginx = Nginx(root / "nginx")
        self.port = free_port()
        self.procs: dict[str, subprocess.Popen] = {}
        self._start("scheduler", ["distributed.cli.dask_scheduler", "--host", "127.0.0.1",
                                  "--port", str(self.port), "--no-dashboard"])
        wait_listening(self.port)

    @property
    def address(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    def _start(self, name: str, argv: list[str], cwd: Path = REPO, env: dict | None = None):
        log = open(self.root / f"{name}.log", "w")
        self.procs[name] = subprocess.Popen([sys.executable, "-m", *argv], cwd=cwd,
                                            env={**os.environ, **(env or {})}, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True)
        log.close()

    def worker(self, name: str, resources: str = "", code: Path = REPO) -> None:
        """A worker running one step at a time, its code imported from the folder `code`."""
        argv = ["distributed.cli.dask_worker", self.address, "--nthreads", "1", "--no-nanny",
                "--name", name, "--no-dashboard", "--local-directory", str(self.root / "dask")]
        env = {"MODELYARD_WORKER_DIR": str(self.workers), "PYTHONPATH": str(code)}
        self._start(name, argv + (["--resources", resources] if resources else []), code, env)

    def wait_for(self, n: int) -> None:
        with distributed.Client(self.address, timeout=30, set_as_default=False) as client:
            client.wait_for_workers(n, timeout=60)

    @property
    def workers(self) -> Path:
        return self.root / "workers"

    def kill(self, name: str) -> None:
        """SIGKILL a worker, and the tool it was running (a compiler in a group of its own)."""
        import psutil
        proc = self.procs[name]
        children = psutil.Process(proc.pid).children(recursive=True)
        os.killpg(proc.pid, signal.SIGKILL)
        for child in children:
            try:
                child.kill()
            except psutil.NoSuchProcess:
                pass
        proc.wait(timeout=30)

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
        self.nginx.stop()

    def build_argv(self, ws: Workspace, *args: str) -> list[str]:
        return [sys.executable, "-m", "doit", "-f", str(REPO / "dodo.py"), *args,
                f"models={ws.models}", f"artifacts={ws.artifacts}", "executor=dask",
                f"scheduler={self.address}", f"cache={self.nginx.url}"]


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path / "cluster")
    yield c
    c.stop()


def outputs(ws: Workspace) -> dict[str, str]:
    """sha256 of every file a build made, but its logs and its own bookkeeping."""
    return {p.relative_to(ws.artifacts).as_posix(): sha256(p) for p in sorted(ws.artifacts.rglob("*"))
            if p.is_file() and not p.relative_to(ws.artifacts).as_posix().startswith((".", "logs/"))}


def other_checkout(tmp_path: Path) -> Path:
    """A copy of the code with one stage edited: another version of the pipeline."""
    folder = tmp_path / "old-checkout"
    shutil.copytree(REPO / "pipeline", folder / "pipeline",
                    ignore=shutil.ignore_patterns("__pycache__"))
    stage = folder / "pipeline" / "stages" / "validate.py"
    stage.write_text(stage.read_text() + "\n# an older version of this stage\n")
    return folder


# What each worker of the build test offers (`--resources`): c offers neither qemu nor vulkan.
OFFERS = {"a": {"qemu", "vulkan"}, "b": {"qemu", "vulkan"}, "c": {"tune"}}


def iree_cpu_and_portable_vulkan(abi: dict) -> bool:
    """IREE only (the suite's time goes to the cluster, not to a second compiler): host's CPU
    ABI, and rk3588's aarch64 CPU ABI (validated under qemu) and portable Vulkan ABI (validated
    on lavapipe), whose validate steps need a worker's `qemu` and `vulkan`."""
    return abi["compiler"] == "iree" and (abi.get("arch") in ("x86_64", "aarch64")
                                          or abi.get("vulkan_target") == "vp_android_baseline_2022")


def test_a_build_on_workers_is_byte_identical_routes_validation_and_survives_a_killed_worker(tmp_path, cluster):
    registry = target_registry(tmp_path / "targets", iree_cpu_and_portable_vulkan)
    targets = f"targets={registry}"
    local = Workspace(tmp_path / "local")
    add_tiny_model(local.models, "tiny", seed=31)
    reference = local.build(targets)

    for name, offers in OFFERS.items():
        cluster.worker(name, " ".join(f"{r}=1" for r in sorted(offers)))
    cluster.worker("old", code=other_checkout(tmp_path))
    cluster.wait_for(4)
    ws = Workspace(tmp_path / "cluster-ws")
    add_tiny_model(ws.models, "tiny", seed=31)
    build = subprocess.Popen(cluster.build_argv(ws, "build", targets), cwd=ws.root,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # the first compile to start on a worker: that worker is killed as soon as the step's log
    # appears (written when the step starts, seconds before the compiler ends even on a fast
    # machine: no wait that a quick compile could outrun)
    deadline, victim = time.monotonic() + 300, None
    while victim is None and build.poll() is None and time.monotonic() < deadline:
        logs = sorted(cluster.workers.glob("*/*/artifacts/logs/*_compile/*.log"))
        if logs:
            victim = logs[0].relative_to(cluster.workers).parts[0]
            killed_log = logs[0].relative_to(logs[0].parents[1])  # <stage>/<step>.log
            cluster.kill(victim)
        time.sleep(0.05)
    out, err = build.communicate(timeout=600)
    assert victim in OFFERS, (victim, out, err)
    assert build.returncode == 0, out + err

    # every step ran on a worker, the same steps as the local build, the same bytes
    result = subprocess.CompletedProcess([], 0, out, err)
    assert ran(result) == ran(reference)
    assert outputs(ws) == outputs(local)
    assert "host/manifest.json" in outputs(ws)
    assert "host/tiny/cpu-x86_64/iree_compile/model.vmfb" in outputs(ws)
    step_logs = sorted((ws.artifacts / "logs").glob("*/*.log"))
    assert len(step_logs) == len(ran(reference))
    ran_on = {}
    for log in step_logs:
        first = log.read_text().splitlines()[0]
        assert first.startswith("# ran on dask worker "), (log, first)
        ran_on[log.relative_to(ws.artifacts)] = first.split()[5]
        assert first.split()[5] in OFFERS, (log, first)
        record = json.loads(log.with_name(log.name.replace(".log", ".cluster.json")).read_text())
        assert record["how"] == "ran" and record["submitted"] <= record["started"] <= record["restored"]
    # the killed step ran again, on another worker
    again = (ws.artifacts / "logs" / killed_log).read_text()
    assert again.startswith("# ran on dask worker ") and ran_on["logs" / killed_log] != victim
    # validation under qemu and on lavapipe ran on workers that offer them, never elsewhere
    project = load_project(ws.models, ws.artifacts, None, registry)
    needs = {step.log.relative_to(project.layout.root): set(dask_executor.needs(step))
             for stage in ("validate", "iree_compile") for step in project.steps(stage)}
    assert {frozenset(n) for n in needs.values()} == {frozenset(), frozenset({"qemu"}), frozenset({"vulkan"})}
    for log, needed in needs.items():
        assert needed <= OFFERS[ran_on[log]], (log, ran_on[log], needed)
    assert not [p for p in cluster.workers.glob("c/*/artifacts/logs/validate/*.log")
                if needs[Path("logs/validate") / p.name]]
    # the worker with other code was refused, with the reason, and ran nothing
    assert "refusing dask worker old" in err and "its pipeline code differs" in err, err
    assert not list(cluster.workers.glob("old/*/artifacts/logs/*/*.log"))
    # console progress: what runs where
    assert f"{killed_log.parts[0]}:{killed_log.name.split('_')[0]}/tiny/" in err and "started on worker" in err
    # nothing half-written in the cache: every record names objects that are there, intact
    served = cluster.nginx.www / "cache"
    records = sorted((served / "ac").iterdir())
    assert len(records) >= len(ran(reference))
    for path in records:
        for meta in json.loads(path.read_text())["outputs"].values():
            obj = served / "cas" / meta["sha256"]
            assert hashlib.sha256(obj.read_bytes()).hexdigest() == meta["sha256"], path.name

    status = subprocess.run([sys.executable, "-m", "doit", "-f", str(REPO / "dodo.py"), "cluster",
                             "status", f"scheduler={cluster.address}", f"artifacts={ws.artifacts}"],
                            cwd=ws.root, capture_output=True, text=True, timeout=120)
    assert status.returncode == 0, status.stdout + status.stderr
    assert f"scheduler {cluster.address}: 3 worker(s)" in status.stdout, status.stdout
    assert all(f"  {w}  tcp://127.0.0.1:" in status.stdout for w in OFFERS if w != victim)
    assert "same code and tools as this machine" in status.stdout
    assert "REFUSED by a build from here: its pipeline code differs" in status.stdout


def test_no_scheduler_is_a_clear_error_and_auto_builds_here(tmp_path):
    nginx = Nginx(tmp_path / "nginx")
    try:
        ws = Workspace(tmp_path / "ws")
        add_tiny_model(ws.models, "tiny", seed=32)
        nobody = f"tcp://127.0.0.1:{free_port()}"
        started = time.monotonic()
        down = ws.doit("build", "target=host", "executor=dask", f"scheduler={nobody}",
                       f"cache={nginx.url}")
        assert down.returncode == 2, down.stdout + down.stderr
        assert f"[stage=cluster] cannot reach the Dask scheduler {nobody}" in down.stderr
        assert "next: start one (`dask scheduler`, see docs/cluster.md)" in down.stderr
        assert time.monotonic() - started < 60
        assert not (ws.artifacts / "models").exists() and ran(down) == []

        no_cache = ws.doit("build", "executor=dask", f"scheduler={nobody}")
        assert no_cache.returncode == 2
        assert "none is set" in no_cache.stderr and "next: cache=URL" in no_cache.stderr

        auto = ws.doit("import:tiny", "executor=auto", f"scheduler={nobody}", f"cache={nginx.url}")
        assert auto.returncode == 0, auto.stdout + auto.stderr
        warnings = [l for l in auto.stderr.splitlines() if "executor=auto" in l]
        assert len(warnings) == 1 and "building here" in warnings[0], auto.stderr
        assert ran(auto) == ["import:tiny"]
        log = (ws.artifacts / "logs/import/tiny.log").read_text()
        assert log.startswith("# import tiny key=")  # the local header: it ran here
    finally:
        nginx.stop()


def test_a_step_failing_on_a_worker_fails_the_build_as_it_does_here(tmp_path, cluster):
    """The local build pushes what it built to the cache: the cluster build restores those
    steps (the build decides as ever what runs) and runs on the worker the one that fails
    (a failure is never cached)."""
    cluster.worker("solo")
    local = Workspace(tmp_path / "local")
    col2im_model(local.models)
    here = local.build("target=host", f"cache={cluster.nginx.url}", "cache_push=1", check=False)
    cluster.wait_for(1)
    ws = Workspace(tmp_path / "cluster-ws")
    col2im_model(ws.models)
    there = subprocess.run(cluster.build_argv(ws, "build", "target=host"), cwd=ws.root,
                           capture_output=True, text=True, timeout=600)

    def paragraph(result, root: Path) -> list[str]:
        """The failed step's error as doit prints it: where and what, its log, the next step."""
        lines = (result.stdout + result.stderr).replace(str(root), "WS").splitlines()
        return [l for l in lines if l.startswith("[model=") or l.startswith(("  log: ", "  next: "))]

    assert here.returncode == there.returncode != 0, there.stdout + there.stderr
    assert ran(there) == ran(here)
    expected = paragraph(here, local.artifacts)
    assert expected[0].startswith("[model=col2im target=host/cpu-x86_64 stage=iree_compile] "
                                  "iree-compile failed"), expected
    assert "  log: WS/logs/iree_compile/host_col2im_cpu-x86_64.log" in expected
    assert paragraph(there, ws.artifacts) == expected
    worked = sorted(p.parent.name for p in cluster.workers.glob("solo/*/artifacts/logs/*/*.log"))
    assert worked == ["iree_compile"], worked
    assert "error: failed to legalize operation" in there.stdout + there.stderr
    log = (ws.artifacts / "logs/iree_compile/host_col2im_cpu-x86_64.log").read_text()
    assert log.startswith("# ran on dask worker solo ") and "failed to legalize operation" in log
    assert not (ws.artifacts / "host/col2im/cpu-x86_64/iree_compile").exists()
    assert not (ws.artifacts / "host/manifest.json").exists()
    assert "Traceback" not in there.stdout + there.stderr


def test_a_cluster_whose_only_worker_runs_other_code_is_refused(tmp_path, cluster):
    cluster.worker("old", code=other_checkout(tmp_path))
    cluster.wait_for(1)
    ws = Workspace(tmp_path / "ws")
    add_tiny_model(ws.models, "tiny", seed=33)
    result = subprocess.run(cluster.build_argv(ws, "build", "target=host"), cwd=ws.root,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stdout + result.stderr
    assert (f"[stage=cluster] the Dask scheduler {cluster.address} has no worker that can run "
            f"this build's steps; refused:") in result.stderr
    assert "its pipeline code differs" in result.stderr
    assert "next: start workers from this checkout" in result.stderr
    assert ran(result) == [] and not (ws.artifacts / "models").exists()


def test_doit_tune_builds_its_candidates_on_the_workers_and_survives_a_killed_one(tmp_path, cluster):
    """`doit tune executor=dask`: the tuning runs here (its database is this machine's), each
    MetaSchedule candidate is built on a worker and measured here; a worker killed after its
    first build leaves the rest to the other; the records apply in the next build."""
    targets = f"targets={target_registry(tmp_path / 'targets', lambda abi: abi['compiler'] == 'tvm')}"
    cluster.worker("a")
    cluster.worker("b")
    cluster.wait_for(2)
    ws = Workspace(tmp_path / "ws")
    add_tiny_model(ws.models, "alpha", seed=1)
    spec = ws.models / "alpha" / "model.yaml"
    spec.write_text(spec.read_text() + "tvm:\n  tune:\n    host: {trials: 4, per_task: 1}\n")
    argv = [sys.executable, "-m", "doit", "-f", str(REPO / "dodo.py"), "tune", "target=host",
            targets, f"models={ws.models}", f"artifacts={ws.artifacts}", "executor=dask",
            f"scheduler={cluster.address}"]
    started = time.monotonic()
    tune = subprocess.Popen(argv, cwd=ws.root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # the tuning child writes a line per candidate build into the step's log: the worker that
    # built the first one is killed there and then, with the tuning under way
    log = ws.artifacts / "logs/tvm_tune/host_alpha_cpu-x86_64-tvm.log"
    deadline, victim = time.monotonic() + 400, None
    while victim is None and tune.poll() is None and time.monotonic() < deadline:
        built = [l for l in (log.read_text().splitlines() if log.is_file() else [])
                 if " built on dask worker " in l]
        if built:
            victim = built[0].split(" built on dask worker ")[1].split()[0]
            cluster.kill(victim)
        time.sleep(0.05)
    out, err = tune.communicate(timeout=600)
    seconds = time.monotonic() - started
    assert victim in ("a", "b"), (victim, out, err)
    assert tune.returncode == 0, out + err
    survivor = {"a": "b", "b": "a"}[victim]

    # every candidate was built on a worker (the log says which), measured here, into this
    # machine's working database; the console has a line per batch
    text = log.read_text()
    builds = [l for l in text.splitlines() if " built on dask worker " in l]
    assert all(l.startswith("candidate ") for l in builds)
    assert {l.split(" built on dask worker ")[1].split()[0] for l in builds} == {victim, survivor}
    assert any(f" built on dask worker {survivor} " in l for l in builds[1:])  # after the kill too
    batches = [l for l in out.splitlines() if l.startswith("[tune] built ") and "on dask workers" in l]
    assert batches and sum(int(l.split()[2]) for l in batches) == len(builds)
    assert not list(cluster.workers.glob("*/*/artifacts/tuning"))  # no worker keeps a database
    report = json.loads((ws.artifacts / "host/alpha/cpu-x86_64-tvm/tvm_tune/tune.json").read_text())
    assert report["builder"]["kind"] == "dask" and report["builder"]["scheduler"] == cluster.address
    assert sum(report["builder"]["built_on"].values()) == len(builds) >= report["trials_run"] > 0
    assert report["measured_on"]["runner"] == "local" and report["source"] == "tuned"
    # the records are MetaSchedule's own, as a local tuning writes them: the same tasks, every
    # trial measured (a failed build or run is recorded as 1e10 s), and a build applies them
    assert len(report["tasks"]) == 4 and 0 < report["trials_spent"] <= 4
    records = (ws.artifacts / "host/alpha/cpu-x86_64-tvm/tvm_tune/database_tuning_record.json")
    runs = [json.loads(l)[1][1] for l in records.read_text().splitlines()]
    assert len(runs) == report["trials_spent"] and all(max(map(float, r)) < 1e9 for r in runs)
    work = ws.artifacts / "tuning/host/cpu-x86_64-tvm"
    assert sum(1 for _ in next(work.iterdir()).joinpath("database_tuning_record.json").open()) >= len(runs)
    build = ws.build("target=host", targets)
    compiled = json.loads((ws.artifacts / "host/alpha/cpu-x86_64-tvm/tvm_compile/compile.json").read_text())
    assert compiled["tuning_records"] == report["trials_spent"]
    assert "validate:host/alpha/cpu-x86_64-tvm" in ran(build)
    print(f"doit tune on 2 workers, one killed (4 trials, tiny model): {seconds:.0f} s")

    # no cluster: executor=dask fails at once, saying so; executor=auto warns once and tunes
    # here (the budget is covered now: 0 trials)
    nobody = f"tcp://127.0.0.1:{free_port()}"
    down = ws.doit("tune", "target=host", targets, "executor=dask", f"scheduler={nobody}")
    assert down.returncode != 0
    assert f"[stage=cluster] cannot reach the Dask scheduler {nobody}" in down.stdout + down.stderr
    auto = ws.doit("tune", "target=host", targets, "executor=auto", f"scheduler={nobody}")
    assert auto.returncode == 0, auto.stdout + auto.stderr
    warnings = [l for l in auto.stderr.splitlines() if "executor=auto" in l]
    assert len(warnings) == 1 and "building the tuning candidates here" in warnings[0], auto.stderr
    assert "already tuned under this key" in auto.stdout


# ----------------------------------------------------------------------------- the pure parts
def test_what_a_step_needs_of_a_worker(tmp_path):
    ws = Workspace(tmp_path / "ws")
    add_tiny_model(ws.models, "tiny")
    registry = target_registry(tmp_path / "targets", lambda abi: True)
    project = load_project(ws.models, ws.artifacts, "rk3588", registry)
    needs = {s.name: dask_executor.needs(s) for s in project.steps("validate")}
    assert needs["rk3588/tiny/cpu-aarch64"] == {"qemu": 1}
    assert needs["rk3588/tiny/vulkan-baseline"] == {"vulkan": 1}
    assert all(dask_executor.needs(s) == {} for s in project.steps("static"))


def test_differences_say_what_refuses_a_worker():
    ours = {"code": "a" * 64, "python": "3.11.7", "distributed": "2026.8.0",
            "tools": {"onnx": "1.23.2", "qemu-aarch64-static": "sha256:" + "c" * 64}}
    assert dask_executor.differences(ours, ours) == []
    lacking = {**ours, "tools": {"onnx": "1.23.2", "qemu-aarch64-static": "missing"}}
    assert dask_executor.differences(ours, lacking) == []  # it offers no `qemu`, that is all
    other = {**ours, "code": "b" * 64, "tools": {"onnx": "1.22.0"}}
    assert dask_executor.differences(ours, other) == [
        "its pipeline code differs (sha256 bbbbbbbbbbbb there, aaaaaaaaaaaa here: another "
        "checkout, or local edits)", "onnx 1.22.0 there, 1.23.2 here"]
    # a worker spawned by Dask's nanny runs numpy's BLAS on one thread: other float64 sums
    ours = {**ours, "threads": {"OPENBLAS_NUM_THREADS": None}}
    nanny = {**ours, "threads": {"OPENBLAS_NUM_THREADS": "1"}}
    assert dask_executor.differences(ours, nanny) == [
        "OPENBLAS_NUM_THREADS=1 there, (unset) here (Dask's nanny sets the thread counts to 1: "
        "start the worker with --no-nanny)"]


def test_places_keep_paths_under_the_artifacts_folder(tmp_path):
    artifacts = tmp_path / "artifacts"
    assert place(artifacts / "host/m/validate/validation.json", artifacts) == \
        "artifacts/host/m/validate/validation.json"
    assert place(tmp_path / "models/m/model.onnx", artifacts) == \
        "files/" + (tmp_path / "models/m/model.onnx").as_posix().lstrip("/")
    assert at(Path("/w"), "artifacts/a/b") == Path("/w/artifacts/a/b")
    for bad in ("../x", "artifacts/../../x", "/etc/passwd", "other/x"):
        with pytest.raises(ValueError):
            at(Path("/w"), bad)
    assert dask_executor.process_parallel(["-n", "2", "-P", "process"])
    assert dask_executor.process_parallel(["--parallel-type=process"])
    assert not dask_executor.process_parallel(["-n", "4", "-P", "thread", "build"])
