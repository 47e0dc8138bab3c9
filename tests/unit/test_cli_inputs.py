"""Nothing silent, nothing lost (issue 38, part A): what a user types wrong is refused in one
line that says what to do, and leaves the artifacts folder as it was.

The same cases through `doit` itself: tests/e2e/test_cli_refusals.py.
"""
from __future__ import annotations

import errno
import io
import os
import re
import signal
import sys
import time
from pathlib import Path

import pytest
from doit.exceptions import TaskFailed, UnmetDependency
from doit.task import Task

from pipeline.core import lock, reporter, variables
from pipeline.core.errors import PipelineError
from pipeline.graph.project import load_project, model_folders
from pipeline.graph.scaffold import bind, new_model, parse_shapes
from pipeline.spec.common import read_yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
from conftest import add_tiny_model, tiny_onnx  # noqa: E402


# ----------------------------------------------------------------------------- variables
def test_a_misspelt_variable_is_refused_naming_the_closest():
    err = variables.check(["build", "target=host", "modles=/tmp/m"])
    assert err.render() == ("unknown variable modles=: did you mean models=?\n"
                            "  next: `doit help build` lists the variables build takes")
    err = variables.check(["-f", "dodo.py", "bench", "iteratons=5"])
    assert "did you mean iterations=?" in err.render() and "doit help bench" in err.render()
    assert variables.check(["build", "zzzzzz=1"]).render().startswith("unknown variable zzzzzz=\n")
    assert variables.check(["-f", "dodo.py", "build", "target=host", "models=m", "-n", "2"]) is None
    assert variables.check(["new", "shape=a:1x2", "shape=b:3", "--db-file=x"]) is None


def _variables_read_by_the_code() -> set[str]:
    names = set()
    for path in [REPO / "dodo.py", *sorted((REPO / "pipeline").rglob("*.py"))]:
        text = path.read_text()
        names |= set(re.findall(r"get_var\(\"([a-z_]+)\"", text))
        for group in re.findall(r"^VARS = \(([^)]*)\)", text, re.M):
            names |= set(re.findall(r"\"([a-z_]+)\"", group))
    return names


def test_the_table_holds_every_variable_the_code_reads():
    read = _variables_read_by_the_code()
    assert {"models", "revalidate", "budget", "iterations", "points", "abi"} <= read
    # else `doit CMD name=...` is refused as unknown: a new variable is a row of the table
    assert read <= variables.NAMES, f"read but not in core/variables.py: {sorted(read - variables.NAMES)}"


def _readme_rows() -> list[tuple[set[str], set[str]]]:
    text = (REPO / "README.md").read_text()
    table = text.split("Variables (`name=value` after the command):", 1)[1].split("\n\n", 2)[1]
    rows = []
    for line in table.splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split(" | ")]
        rows.append((set(re.findall(r"(?:^|[\s`])([a-z_]+)=", cells[0])),
                     {c.strip() for c in cells[1].split(",")}))
    return rows


def test_readme_variables_agree_with_the_table():
    rows = _readme_rows()
    assert len(rows) >= 10
    for names, commands in rows:
        for name in names:
            assert name in variables.NAMES, f"README names {name}=, the table does not"
            taken = {c for r in variables.VARIABLES if name in r.names for c in r.commands}
            for command in commands:
                want = variables.ALL if command == "all" else command
                assert want in taken, f"README: {name}= for {command}; the table: {sorted(taken)}"


def test_help_lists_the_variables_of_the_command_then_those_of_all():
    text = variables.help_text("build")
    assert text.startswith("\nvariables (name=value after `doit build`):\n  executor=dask")
    assert "\n  revalidate=1            run validation here" in text
    assert "and those of every command:\n  target=NAME" in text and "models=DIR" in text
    assert "warmup=" not in text  # bench's
    assert "shape=INPUT:1x3x224x224" in variables.help_text("new")
    assert variables.help_topic(["-f", "/repo/dodo.py", "help", "build"]) == "build"
    assert variables.help_topic(["help", "validate:host/m/cpu"]) == "validate"
    assert variables.help_topic(["help"]) is None and variables.help_topic(["build"]) is None


def test_the_variable_check_comes_before_the_noop_fast_path():
    dodo = (REPO / "dodo.py").read_text()
    assert dodo.index("variables.check(") < dodo.index("noop.up_to_date(")


# ----------------------------------------------------------------------------- models=DIR
def test_models_folder_empty_missing_or_a_model_folder_is_refused(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(PipelineError) as info:
        load_project(empty, tmp_path / "artifacts", "host", need_models=True)
    assert info.value.render() == (
        f"[stage=spec] no model folders ({empty}/<name>/model.yaml) under {empty}\n"
        "  next: give models=DIR the folder that holds one folder per model (default models/), "
        "or start one with doit new source=PATH name=NAME")
    assert load_project(empty, tmp_path / "artifacts", "host").models == ()  # doit new starts here

    models = tmp_path / "models"
    add_tiny_model(models, "pitch")
    with pytest.raises(PipelineError) as info:
        model_folders(models / "pitch")
    assert info.value.render() == (
        f"[stage=spec] no model folders ({models}/pitch/<name>/model.yaml) under {models}/pitch: "
        f"this is a model folder: use models=its parent\n  next: give models={models}")
    with pytest.raises(PipelineError, match=r"models=.*/nope: no such folder"):
        model_folders(tmp_path / "nope")
    assert model_folders(models) == models


# ----------------------------------------------------------------------------- read-only artifacts
def test_a_read_only_artifacts_folder_is_one_line(tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(tmp_path / "artifacts" / ".lock"))
    monkeypatch.setattr(lock.os, "open", refuse)
    with pytest.raises(PipelineError) as info:
        lock.acquire(tmp_path / "artifacts")
    assert info.value.render() == (
        f"[stage=lock] cannot write to the artifacts folder {tmp_path / 'artifacts'} (Read-only "
        "file system)\n  next: give artifacts=DIR a folder you can write to, or make this one "
        "writable (doit list and doit info only read it)")


def test_writable_looks_at_the_nearest_existing_folder(tmp_path):
    assert lock.writable(tmp_path / "not" / "yet")
    assert not lock.writable(Path("/proc/1/nowhere"))


# ----------------------------------------------------------------------------- YAML
@pytest.mark.parametrize("text, expected", [
    ("description: x\nsource:\n  path: a\n   sha256: b\n",
     "line 4, column 10: YAML syntax: mapping values are not allowed in this context (a ':' where "
     "no key may start: is the line indented deeper than the key above it, or does a value need "
     "quotes?) at 'sha256: b'"),
    ("a: 1\nb: [1, 2\nc: 3\n",
     "line 3, column 2: YAML syntax: did not find expected ',' or ']' at 'c: 3' (while parsing a "
     "flow sequence, from line 2, column 4)"),
    ("a:\n\t- 1\n", "line 2, column 1: YAML syntax: found character that cannot start any token "
                    "(a tab: YAML indents with spaces) at '- 1' (while scanning for the next token)"),
])
def test_a_yaml_syntax_error_names_line_column_and_what_was_expected(tmp_path, text, expected):
    path = tmp_path / "model.yaml"
    path.write_text(text)
    problems = []
    assert read_yaml(path, problems) is None
    assert problems == [f"{path}: {expected}"]


# ----------------------------------------------------------------------------- doit new
def test_shape_names_end_at_the_last_colon():
    assert parse_shapes(["serving_default_input_2:0:1x224x224x3", "x:", "a:1x2,b:3"]) == {
        "serving_default_input_2:0": [1, 224, 224, 3], "x": [], "a": [1, 2], "b": [3]}
    inputs = [{"name": "serving_default_input_2:0", "dims": ["N", 224, 224, 3], "dtype": "float32"}]
    assert bind(inputs, parse_shapes(["serving_default_input_2:0:1x224x224x3"])) == (
        {"serving_default_input_2:0": [1, 224, 224, 3]}, [])
    _, problems = bind(inputs, parse_shapes(["serving_default_input_2:0"]))
    assert problems[0].endswith("(inputs: serving_default_input_2:0; named dims: N): is "
                                "'serving_default_input_2:0' the input? then give its shape after "
                                "it: shape=serving_default_input_2:0:1x...")
    _, problems = bind(inputs, parse_shapes(["serving_default_input_2:1x224x224x3"]))
    assert problems[0].endswith("did you mean 'serving_default_input_2:0'?")


def test_new_without_a_licence_warns_naming_the_model(tmp_path, capsys):
    source = tiny_onnx(tmp_path / "src" / "tiny.onnx")
    new_model(str(source), "tiny", [], None, tmp_path / "models")
    folder = tmp_path / "models" / "tiny"
    assert capsys.readouterr().err == (
        f"modelyard: warning: [model=tiny stage=new] no licence given: {folder}/model.yaml lists "
        "none, so no release can say under which terms tiny may be shipped\n"
        f"  next: copy its licence file into {folder}/ and add `license: FILE` to model.yaml (or "
        "run doit new again with license=PATH)\n")
    (tmp_path / "LICENSE").write_text("MIT\n")
    new_model(str(source), "tiny2", [], str(tmp_path / "LICENSE"), tmp_path / "models")
    assert "warning" not in capsys.readouterr().err


# ----------------------------------------------------------------------------- reporter
def _task(name: str, actions=True) -> Task:
    task = Task(name, [(lambda: None, ())] if actions else None)
    task.executed = True
    return task


def test_a_failure_then_one_line_for_what_it_held_back():
    out = io.StringIO()
    rep = reporter.Reporter(out, {})
    rep.add_failure(_task("golden:m"), TaskFailed("[model=m stage=golden] it broke\n  next: fix it"))
    rep.add_failure(_task("static:m"), UnmetDependency("golden:m"))
    rep.add_failure(_task("coverage:host/m"), UnmetDependency("static:m"))
    rep.add_failure(_task("coverage", actions=False), UnmetDependency("coverage:host/m"))  # a group
    rep.add_failure(_task("_snapshot"), UnmetDependency("coverage"))  # private
    rep.add_failure(_task("validate:host/m/cpu"), UnmetDependency("coverage:host/m static:m"))
    rep.complete_run()
    assert out.getvalue() == ("[model=m stage=golden] it broke\n  next: fix it\n"
                              "modelyard: 3 steps not run because golden:m failed\n")


def test_held_back_groups_by_the_failures_behind():
    held = {"a": frozenset({"x"}), "b": frozenset({"x"}), "c": frozenset({"x", "y"})}
    assert reporter.held_back(held) == ["2 steps not run because x failed",
                                        "1 step not run because x and y failed"]


def test_ctrl_c_is_one_line_naming_the_running_step(capsys, monkeypatch):
    monkeypatch.setattr(reporter, "_running", {"static:m"})
    reporter.excepthook(KeyboardInterrupt, KeyboardInterrupt(), None)
    assert capsys.readouterr().err == ("\nmodelyard: interrupted at step static:m; run the same "
                                       "command to resume\n")
    monkeypatch.setattr(reporter, "_running", set())
    monkeypatch.setattr(reporter, "_started", False)
    reporter.excepthook(KeyboardInterrupt, KeyboardInterrupt(), None)
    assert "interrupted before any step ran" in capsys.readouterr().err


def test_ctrl_c_inside_an_import_is_held_until_the_import_is_done(tmp_path, monkeypatch):
    """A nanobind module's init (onnx) calls back into Python: KeyboardInterrupt raised there
    aborts the process in C++. The handler lets the import finish, then interrupts."""
    (tmp_path / "slow_native_init.py").write_text(
        "import os, signal, time\n"
        "os.kill(os.getpid(), signal.SIGINT)\n"
        "for _ in range(30):\n"
        "    time.sleep(0.01)\n"      # the handler runs here, between bytecodes, inside the import
        "DONE = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    previous = signal.signal(signal.SIGINT, reporter.on_sigint)
    try:
        with pytest.raises(KeyboardInterrupt):
            import slow_native_init  # noqa: F401
            time.sleep(2)  # the held-back interrupt arrives 50 ms after the import
        assert sys.modules["slow_native_init"].DONE
    finally:
        signal.signal(signal.SIGINT, previous)
        sys.modules.pop("slow_native_init", None)


def test_ctrl_c_outside_an_import_interrupts_at_once():
    previous = signal.signal(signal.SIGINT, reporter.on_sigint)
    try:
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(2)
    finally:
        signal.signal(signal.SIGINT, previous)
