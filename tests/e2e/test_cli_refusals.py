"""Nothing silent, nothing lost (issue 38, part A), through `doit` as a user runs it: a wrong
input is refused with a non-zero exit and one clear `modelyard:` line (and its `next:`), no
traceback, and the artifacts folder byte for byte as it was (logs aside).

The pieces alone: tests/unit/test_cli_inputs.py.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import REPO, Workspace, add_tiny_model, require, sha256, write_spec


def files(folder: Path) -> dict:
    """Every file under the artifacts folder but the logs: path -> sha256."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and p.relative_to(folder).parts[0] != "logs"}


@pytest.fixture
def built(workspace) -> Workspace:
    """A workspace whose artifacts folder holds a manifest and a store (what a wrong command
    must leave alone; their content does not matter to a refusal at load time)."""
    add_tiny_model(workspace.models, "pitch")
    art = workspace.artifacts
    (art / "host").mkdir(parents=True)
    (art / "host" / "manifest.json").write_text('{"models": {"pitch": {}}, "target": "host"}\n')
    (art / ".store" / "ab").mkdir(parents=True)
    (art / ".store" / "ab" / "abcdef").write_bytes(b"object")
    return workspace


def doit(ws: Workspace, *args: str, models: Path | None = None) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "doit", "-f", str(REPO / "dodo.py"), *args,
            f"models={models or ws.models}", f"artifacts={ws.artifacts}"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=ws.root)


def refused(result: subprocess.CompletedProcess) -> str:
    out = result.stdout + result.stderr
    assert result.returncode != 0, out
    assert "Traceback" not in out, out
    return result.stderr


@pytest.mark.parametrize("case", ["empty", "model folder", "missing"])
def test_a_models_folder_without_models_is_refused_and_the_manifest_kept(built, case):
    before = files(built.artifacts)
    folder = {"empty": built.root / "empty", "model folder": built.models / "pitch",
              "missing": built.root / "nope"}[case]
    if case == "empty":
        folder.mkdir()
    err = refused(doit(built, "build", "target=host", models=folder))
    expected = {
        "empty": f"modelyard: [stage=spec] no model folders ({folder}/<name>/model.yaml) under {folder}\n"
                 "  next: give models=DIR the folder that holds one folder per model (default "
                 "models/), or start one with doit new source=PATH name=NAME\n",
        "model folder": f"modelyard: [stage=spec] no model folders ({folder}/<name>/model.yaml) "
                        f"under {folder}: this is a model folder: use models=its parent\n"
                        f"  next: give models={built.models}\n",
        "missing": f"modelyard: [stage=spec] models={folder}: no such folder ({folder})\n"
                   "  next: give models=DIR the folder that holds one folder per model (default "
                   "models/), or start one with doit new source=PATH name=NAME\n"}[case]
    assert err == expected
    assert files(built.artifacts) == before


def test_a_misspelt_variable_is_refused_before_anything_is_built(built):
    before = files(built.artifacts)
    argv = [sys.executable, "-m", "doit", "-f", str(REPO / "dodo.py"), "build", "target=host",
            f"modles={built.models}", f"artifacts={built.artifacts}"]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=built.root)
    assert refused(result) == ("modelyard: unknown variable modles=: did you mean models=?\n"
                               "  next: `doit help build` lists the variables build takes\n")
    assert files(built.artifacts) == before


def test_help_of_a_command_lists_its_variables(built):
    result = doit(built, "help", "build")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("build  build every model for target=NAME")
    assert "variables (name=value after `doit build`):" in lines
    assert any(l.startswith("  revalidate=1 ") for l in lines)
    assert any(l.startswith("  models=DIR ") for l in lines)
    assert "warmup=" not in result.stdout  # bench's, not build's


def _unwritable(ws: Workspace, *args: str) -> subprocess.CompletedProcess:
    """doit with the artifacts folder on a read-only bind mount (a mount namespace of its own:
    chmod does not stop root)."""
    require(shutil.which("unshare") is not None and os.geteuid() == 0,
            "a read-only bind mount needs root and unshare")
    argv = [sys.executable, "-m", "doit", "-f", str(REPO / "dodo.py"), *args,
            f"models={ws.models}", f"artifacts={ws.artifacts}"]
    script = f'mount --bind -o ro "$1" "$1" && shift && exec "$@"'
    return subprocess.run(["unshare", "-m", "sh", "-c", script, "sh", str(ws.artifacts), *argv],
                          capture_output=True, text=True, timeout=600, cwd=ws.root)


def test_a_read_only_artifacts_folder_is_one_line_and_list_still_works(built):
    before = files(built.artifacts)
    err = refused(_unwritable(built, "build", "target=host"))
    assert err == (f"modelyard: [stage=lock] cannot write to the artifacts folder {built.artifacts} "
                   "(Read-only file system)\n  next: give artifacts=DIR a folder you can write to, "
                   "or make this one writable (doit list and doit info only read it)\n")
    listed = _unwritable(built, "list")
    assert listed.returncode == 0 and "Traceback" not in listed.stdout + listed.stderr, listed.stderr
    assert "validate " in listed.stdout and listed.stderr == ""
    assert files(built.artifacts) == before


def test_a_yaml_syntax_error_names_file_line_and_column(built):
    spec = built.models / "pitch" / "model.yaml"
    spec.write_text(spec.read_text().replace("  sha256:", "   sha256:"))
    err = refused(doit(built, "build", "target=host"))
    assert (f"  - {spec}: line 4, column 10: YAML syntax: mapping values are not allowed in this "
            "context (a ':' where no key may start: is the line indented deeper than the key "
            "above it, or does a value need quotes?) at 'sha256:") in err


def _reshape_model(models: Path, name: str) -> None:
    """Relu -> Reshape [1, 4] to [3, 3]: a valid graph onnxruntime cannot run (golden fails)."""
    f = TensorProto.FLOAT
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Reshape", ["r", "s"], ["y"])],
        "main", [helper.make_tensor_value_info("x", f, [1, 4])],
        [helper.make_tensor_value_info("y", f, [3, 3])],
        [numpy_helper.from_array(np.array([3, 3], np.int64), "s")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    folder = models / name
    folder.mkdir(parents=True)
    onnx.save(model, str(folder / "model.onnx"))
    write_spec(folder, "model.onnx", sha256(folder / "model.onnx"), inputs={"x": ([1, 4], "float32", 0)})


def test_a_failed_step_then_one_line_for_the_steps_it_held_back(workspace):
    _reshape_model(workspace.models, "broken")
    result = workspace.build("target=host", check=False)
    assert result.returncode != 0
    out = result.stdout + result.stderr
    assert "\n[model=broken stage=golden] onnxruntime cannot run the source model" in result.stdout
    last = result.stdout.rstrip().splitlines()[-1]  # static, coverage, compiles, ..., manifest
    assert re.fullmatch(r"modelyard: \d+ steps not run because golden:broken failed", last), last
    for noise in ("UnmetDependency", "taskid:", "<stdout>:", "#####", "Traceback"):
        assert noise not in out, out


def test_ctrl_c_is_one_line_naming_the_step(workspace):
    add_tiny_model(workspace.models, "pitch")
    argv = [sys.executable, "-m", "doit", "-f", str(REPO / "dodo.py"), "build", "target=host",
            f"models={workspace.models}", f"artifacts={workspace.artifacts}"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=workspace.root, start_new_session=True)
    deadline = time.time() + 120
    while time.time() < deadline and not any(workspace.artifacts.glob(".tmp/*/import/*")):
        time.sleep(0.05)
    assert any(workspace.artifacts.glob(".tmp/*/import/*")), "never saw the import step start"
    os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C: the whole foreground group
    out, err = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert "Traceback" not in out + err and "KeyboardInterrupt" not in out + err, err
    # the step running when the signal lands: import, or the next one when it came during an
    # import of a native module (held until the import is done: reporter.on_sigint)
    assert re.fullmatch(r"modelyard: interrupted at step [a-z_]+:pitch; run the same command to "
                        r"resume", err.splitlines()[-1]), err


def test_new_accepts_an_input_name_with_a_colon_and_warns_without_a_licence(workspace, tmp_path):
    f = TensorProto.FLOAT
    name = "serving_default_input_2:0"
    graph = helper.make_graph([helper.make_node("Relu", [name], ["y"])], "m",
                              [helper.make_tensor_value_info(name, f, ["N", "H", 4])],
                              [helper.make_tensor_value_info("y", f, ["N", "H", 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(tmp_path / "colon.onnx"))
    result = workspace.doit("new", f"source={tmp_path / 'colon.onnx'}", "name=colon",
                            "shape=serving_default_input_2:1x3x4")
    assert result.returncode != 0
    assert "did you mean 'serving_default_input_2:0'?" in result.stdout
    result = workspace.doit("new", f"source={tmp_path / 'colon.onnx'}", "name=colon",
                            f"shape={name}:1x3x4")
    assert result.returncode == 0, result.stdout + result.stderr
    assert '"serving_default_input_2:0":\n    shape: [1, 3, 4]' in (
        workspace.models / "colon" / "model.yaml").read_text()
    folder = workspace.models / "colon"
    assert (f"modelyard: warning: [model=colon stage=new] no licence given: {folder}/model.yaml "
            "lists none, so no release can say under which terms colon may be shipped\n"
            f"  next: copy its licence file into {folder}/") in result.stderr
