"""`doit build` end to end through the repo's dodo.py: incrementality, reproducibility, failures."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path


from conftest import (REPO, Workspace, add_fixture_model, add_tiny_model, ran, require_aarch64,
                      sha256, write_spec)


def manifest(ws: Workspace, target: str) -> dict:
    return json.loads((ws.artifacts / target / "manifest.json").read_text())


def check_manifest_hashes(ws: Workspace, target: str) -> dict:
    doc = manifest(ws, target)
    for model in doc["models"].values():
        for art in model["artifacts"].values():
            path = ws.artifacts / art["path"]
            assert sha256(path) == art["sha256"]
            assert path.stat().st_size == art["size"]
            assert art["validation"]["status"] == "passed"
            assert len(art["compile"]["step_key"]) == 64
    return doc


def test_cold_then_noop_then_one_model_edit(workspace):
    add_tiny_model(workspace.models, "alpha", seed=1)
    spec_b = add_tiny_model(workspace.models, "beta", seed=2)
    first = workspace.build("target=host")
    assert "iree_compile:host/alpha/cpu-x86_64" in ran(first)
    assert "validate:host/beta/cpu-x86_64" in ran(first)
    doc = check_manifest_hashes(workspace, "host")
    assert sorted(doc["models"]) == ["alpha", "beta"]
    art = doc["models"]["alpha"]["artifacts"]["cpu-x86_64"]
    assert art["validation"]["executed"]["emulated"] is False
    assert art["validation"]["outputs"][0]["max_abs"] < 1e-4
    assert doc["models"]["alpha"]["io"]["inputs"] == [{"name": "x", "shape": [1, 3, 16, 16],
                                                       "dtype": "float32"}]

    start = time.perf_counter()
    second = workspace.build("target=host")
    noop = time.perf_counter() - start
    assert ran(second) == [], second.stdout
    print(f"no-op build: {noop:.2f} s")

    # A new test-input seed for beta: beta's chain reruns, alpha's does not.
    spec_b.write_text(spec_b.read_text().replace("seed: 0", "seed: 5"))
    third = workspace.build("target=host")
    # beta's IREE CPU compile too: beta has no pin, and its compile step checks the config of a
    # model without one against golden (compilers/config_choice.UNPINNED): golden is its input
    assert ran(third) == ["choose:host/beta", "golden:beta", "iree_compile:host/beta/cpu-x86_64",
                          "manifest:host", "static:beta", "validate:host/beta/cpu-x86_64",
                          "validate:host/beta/cpu-x86_64-tvm"]


def test_target_flag_change_reruns_compile_and_validate_of_that_target_only(workspace, tmp_path):
    require_aarch64()
    targets = tmp_path / "targets"
    shutil.copytree(REPO / "pipeline" / "targets", targets)
    add_tiny_model(workspace.models, "alpha", seed=1)
    workspace.build(f"targets={targets}")
    host = targets / "host.yaml"
    host.write_text(host.read_text().replace("flags: [--iree-opt-data-tiling]", "flags: []"))
    again = workspace.build(f"targets={targets}")
    # choose: the compiler choice reads the new artifact's validation. coverage: its key holds
    # the CPU ABI's flags (it compiles with them when it must confirm that IREE fails); it
    # predicts again (about a second) and writes the same coverage.json, which no step reads
    # as an input: nothing after it runs again because of it
    assert ran(again) == ["choose:host/alpha", "coverage:host/alpha",
                          "iree_compile:host/alpha/cpu-x86_64", "manifest:host",
                          "validate:host/alpha/cpu-x86_64"]
    flags = manifest(workspace, "host")["models"]["alpha"]["artifacts"]["cpu-x86_64"]["compile"]["flags"]
    assert "--iree-opt-data-tiling" not in flags


def test_two_clean_builds_are_byte_identical(tmp_path):
    require_aarch64()
    outputs = []
    for name in ("one", "other-place"):
        ws = Workspace(tmp_path / name)
        add_tiny_model(ws.models, "alpha", seed=3)
        ws.build()  # every target: host and rk3588
        files = {}
        for path in sorted(ws.artifacts.rglob("*")):
            rel = path.relative_to(ws.artifacts).as_posix()
            if path.is_file() and not rel.startswith((".", "logs/")):
                files[rel] = sha256(path)
        outputs.append(files)
    assert outputs[0] == outputs[1]
    assert "rk3588/manifest.json" in outputs[0] and "host/manifest.json" in outputs[0]
    assert "rk3588/alpha/cpu-aarch64/iree_compile/model.vmfb" in outputs[0]


def test_store_restores_outputs_without_rerunning_the_tool(workspace):
    add_tiny_model(workspace.models, "alpha", seed=1)
    workspace.build("target=host")
    vmfb = workspace.artifacts / "host/alpha/cpu-x86_64/iree_compile/model.vmfb"
    digest = sha256(vmfb)
    shutil.rmtree(vmfb.parent)
    (workspace.artifacts / ".doit.db").unlink()
    log = workspace.artifacts / "logs/iree_compile/host_alpha_cpu-x86_64.log"
    log.unlink()
    workspace.build("target=host")
    assert sha256(vmfb) == digest
    assert not log.exists(), "the compiler ran although the store held the key"


def col2im_model(models: Path) -> None:
    """Relu -> Col2Im: TVM has no converter for Col2Im, IREE 3.13 cannot lower it (the GRU
    encoder once played this part; the static stage now unrolls its GRUs)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    f = TensorProto.FLOAT
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Col2Im", ["r", "im", "blk"], ["y"])],
        "main", [helper.make_tensor_value_info("x", f, [1, 4, 9])],
        [helper.make_tensor_value_info("y", f, [1, 1, 4, 4])],
        [numpy_helper.from_array(np.array([4, 4], np.int64), "im"),
         numpy_helper.from_array(np.array([2, 2], np.int64), "blk")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    folder = models / "col2im"
    folder.mkdir(parents=True)
    onnx.save(model, str(folder / "model.onnx"))
    write_spec(folder, "model.onnx", sha256(folder / "model.onnx"), inputs={"x": ([1, 4, 9], "float32", 0)})


def test_model_that_no_compiler_can_take_fails_clearly_while_others_build(workspace):
    add_tiny_model(workspace.models, "alpha", seed=1)
    col2im_model(workspace.models)
    result = workspace.build("target=host", check=False)
    assert result.returncode != 0
    out = result.stdout + result.stderr
    # TVM is left out by op coverage (no converter), found before compiling; IREE is tried and
    # fails with its own diagnostics (each of its attempts), not an IR dump
    coverage = json.loads((workspace.artifacts / "host/col2im/coverage/coverage.json").read_text())
    assert coverage["compilers"]["tvm"]["status"] == "skipped"
    assert coverage["compilers"]["tvm"]["unsupported"][0]["op"] == "Col2Im"
    assert "[model=col2im target=host/cpu-x86_64 stage=iree_compile] iree-compile failed" in out
    assert "error: failed to legalize operation" in out
    log = workspace.artifacts / "logs/iree_compile/host_col2im_cpu-x86_64.log"
    assert f"log: {log}" in out
    assert "Traceback" not in out
    # nothing left behind for the failed step; the other model is built and validated
    assert not (workspace.artifacts / "host/col2im/cpu-x86_64/iree_compile").exists()
    assert (workspace.artifacts / "host/alpha/cpu-x86_64/validate/validation.json").is_file()
    assert not (workspace.artifacts / "host/manifest.json").exists()


def test_garbage_onnx_gives_one_line_error(workspace):
    folder = workspace.models / "junk"
    folder.mkdir()
    (folder / "model.onnx").write_bytes(os.urandom(4096))
    write_spec(folder, "model.onnx", sha256(folder / "model.onnx"))
    result = workspace.build("target=host", check=False)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr + result.stdout
    problems = [l for l in result.stderr.splitlines() if l.strip().startswith("- ")]
    assert len(problems) == 1 and "model.yaml: source.path: model.onnx is not a readable ONNX model" in problems[0]
    assert not workspace.artifacts.joinpath("models").exists()


def test_unknown_target_lists_known_ones(workspace):
    add_tiny_model(workspace.models, "alpha")
    result = workspace.build("target=rk3399", check=False)
    assert result.returncode != 0
    assert "unknown target 'rk3399'; known targets: host, rk3588, rpi5" in result.stderr


def test_killed_step_leaves_nothing_mistaken_for_done(workspace):
    add_tiny_model(workspace.models, "alpha", seed=1)
    argv = [sys.executable, "-m", "doit", "-f", str(REPO / "dodo.py"), "build", "target=host",
            f"models={workspace.models}", f"artifacts={workspace.artifacts}"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    scratch = workspace.artifacts / ".tmp"  # .tmp/<pid>/<stage>/<step>/
    deadline = time.time() + 120
    while time.time() < deadline and not any(scratch.glob("*/iree_compile/*/model.mlir")):
        time.sleep(0.05)
    assert any(scratch.glob("*/iree_compile/*/model.mlir")), "never saw the compile step start"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    compiled = workspace.artifacts / "host/alpha/cpu-x86_64/iree_compile"
    assert not (compiled / "step.json").exists() and not (compiled / "model.vmfb").exists()
    result = workspace.build("target=host")
    assert "iree_compile:host/alpha/cpu-x86_64" in ran(result)
    check_manifest_hashes(workspace, "host")
