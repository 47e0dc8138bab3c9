"""Tuning that survives a kill and is shared across models (pipeline/stages/tvm_tune.py), with
real MetaSchedule runs on two tiny MLPs whose first layer is the same kernel:

    mlp_a: x[1,32] -> MatMul 32x32 + Add -> Relu -> MatMul 32x16 + Add     (2 tasks)
    mlp_b: x[1,32] -> MatMul 32x32 + Add -> Relu -> MatMul 32x8 + Add      (shares the first)

Budgets of 4 trials, 2 per task. `doit tune` is killed once the first task's trials are in the
shared database; a torn line is added, as a kill midway through a write leaves; the next
`doit tune` drops it with a warning, counts what is there and tunes only the rest. Then the
second model finds its shared kernel measured and tunes only its own. Each kernel's batch of
2 trials takes ~10 s on 2 cores.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, Workspace, sha256, write_spec

BUDGET = "tvm:\n  tune:\n    host: {trials: 4, per_task: 2}\n"
WORK_DB = "tuning/host/cpu-x86_64-tvm/{tvm}"


def mlp(folder: Path, second: int, seed: int) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(seed)
    weights = [numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)
               for name, shape in (("w1", (32, 32)), ("b1", (32,)), ("w2", (32, second)),
                                   ("b2", (second,)))]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["m1"]),
             helper.make_node("Add", ["m1", "b1"], ["a1"]), helper.make_node("Relu", ["a1"], ["r1"]),
             helper.make_node("MatMul", ["r1", "w2"], ["m2"]), helper.make_node("Add", ["m2", "b2"], ["y"])]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, second])],
                              initializer=weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    folder.mkdir(parents=True)
    (folder / "model.onnx").write_bytes(model.SerializeToString(deterministic=True))
    write_spec(folder, "model.onnx", sha256(folder / "model.onnx"),
               inputs={"x": ([1, 32], "float32", 0)}, extra=BUDGET)


def records(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.is_file() else []


@pytest.fixture(scope="module")
def ws(tmp_path_factory) -> tuple[Workspace, Path]:
    from pipeline.core.tools import distribution_version
    ws = Workspace(tmp_path_factory.mktemp("tune"))
    mlp(ws.models / "mlp_a", second=16, seed=1)
    mlp(ws.models / "mlp_b", second=8, seed=2)
    return ws, ws.artifacts / WORK_DB.format(tvm=distribution_version("apache-tvm"))


def test_a_killed_tuning_keeps_its_trials_and_the_next_one_tunes_only_the_rest(ws):
    ws, db = ws
    argv = [sys.executable, "-m", "doit", "-f", str(REPO / "dodo.py"), "tune", "target=host",
            "model=mlp_a", f"models={ws.models}", f"artifacts={ws.artifacts}"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True, cwd=ws.root)
    deadline = time.time() + 600
    while time.time() < deadline and len(records(db / "database_tuning_record.json")) < 2:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)  # the first task's 2 trials are in; the second's are not
    proc.wait()
    measured = records(db / "database_tuning_record.json")
    assert len(measured) == 2, "the first batch never reached the shared database"
    step = ws.artifacts / "host/mlp_a/cpu-x86_64-tvm/tvm_tune"
    assert not (step / "step.json").exists()          # nothing published: the build would not apply it
    with open(db / "database_tuning_record.json", "a") as f:
        f.write(measured[0][:40])                     # what a kill midway through a write leaves

    resumed = ws.doit("tune", "target=host", "model=mlp_a")
    out = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, out
    assert ("[tune] warning: " + str(db / "database_tuning_record.json") + ": dropped its torn "
            "last line (40 characters, cut short by a run that was killed while writing it); the "
            "2 complete line(s) are kept") in out
    assert "[tune] resuming: 2 of 4 trials already measured (1 of 2 tasks need no more)" in out
    progress = [l for l in out.splitlines() if l.startswith("[tune] task ")]
    assert len(progress) == 1 and "| 4/4 trials, " in progress[0] and " left" in progress[0]
    report = json.loads((step / "tune.json").read_text())
    assert (report["trials_reused"], report["trials_run"], report["trials_spent"]) == (2, 2, 4)
    assert report["source"] == "tuned" and report["database"].startswith("tuning/host/cpu-x86_64-tvm/")
    after = records(db / "database_tuning_record.json")
    assert after[:2] == measured and len(after) == 4 and all(json.loads(l) for l in after)
    assert "tuned, 2 trials run, 2 found in the shared database" in resumed.stdout


def test_a_second_model_reuses_the_records_of_a_kernel_it_shares(ws):
    ws, db = ws
    before = records(db / "database_workload.json")
    result = ws.doit("tune", "target=host", "model=mlp_b")
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert "[tune] resuming: 2 of 4 trials already measured (1 of 2 tasks need no more)" in out
    report = json.loads((ws.artifacts / "host/mlp_b/cpu-x86_64-tvm/tvm_tune/tune.json").read_text())
    assert (report["trials_reused"], report["trials_run"], report["trials_spent"]) == (2, 2, 4)
    # one new workload (its own second layer); the shared kernel's line was not added again
    assert len(records(db / "database_workload.json")) == len(before) + 1
    assert len(records(db / "database_tuning_record.json")) == 6


def test_the_shared_pin_covers_both_models_and_a_build_applies_it_without_tuning(ws):
    ws, db = ws
    pin = ws.doit("tune", "target=host", "pin=1")
    assert pin.returncode == 0, pin.stdout + pin.stderr
    folder = ws.models / ".tuning/host/cpu-x86_64-tvm"
    assert "already tuned under this key (fresh), 0 trials spent" in pin.stdout
    assert f"pinned into {folder}: 2 workload(s) and 4 trial(s) added" in pin.stdout
    assert f"pinned into {folder}: 1 workload(s) and 2 trial(s) added" in pin.stdout
    assert len(records(folder / "database_tuning_record.json")) == 6
    meta = json.loads((folder / "database.json").read_text())
    assert meta["identity"]["target"]["mcpu"] == "x86-64-v3" and meta["measured_on"][0]["runner"] == "local"

    from pipeline import graph
    from pipeline.core.steps import execute
    import shutil
    shutil.rmtree(ws.artifacts / "tuning")   # the working database is gone: the pin alone must do
    proj = graph.load_project(ws.models, ws.artifacts, "host")
    steps = {s.name: s for s in proj.steps("tvm_tune")}
    step = steps["host/mlp_b/cpu-x86_64-tvm"]
    assert step.cfg.shared == "models/.tuning/host/cpu-x86_64-tvm" and "shared:database.json" in step.inputs
    assert execute(step) == "ran"
    report = json.loads((step.out_dir / "tune.json").read_text())
    assert (report["source"], report["pinned_at"], report["trials_run"]) == \
        ("pinned", "models/.tuning/host/cpu-x86_64-tvm", 0)
    assert report["trials_spent"] == 4 and "seconds" not in report
    first = (step.out_dir / "database_tuning_record.json").read_bytes()
    shutil.rmtree(step.out_dir)
    (ws.artifacts / ".store").rename(ws.artifacts / "store.old")
    assert execute(step) == "ran" and (step.out_dir / "database_tuning_record.json").read_bytes() == first
