"""The NPU step's time budget (issue 38): it follows the model (size, node count; an int8 step
three times as long), within a floor and a ceiling, a model spec may set it (`npu: {budget_s}`),
it stays out of the step key unless set, and past it the tool's whole process group is killed."""
from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, add_default_model, add_tiny_model
from pipeline.core.errors import SpecError
from pipeline.core.tools import run_tool, step_budget
from pipeline.graph import load_project
from pipeline.stages import rknn_compile
from pipeline.stages.rknn_compile import BUDGET, budget, graph_nodes

CLS = REPO / "models" / "ppocr_cls" / "ch_ppocr_mobile_v2.0_cls_infer.onnx"


def test_the_budget_follows_size_and_nodes_within_floor_and_ceiling():
    mid = step_budget(2_000_000, 400, **BUDGET)
    assert mid.seconds == 60 + 30 * 2 + 0.5 * 400 == 320
    assert mid.how == "(60 s + 30 s/MB x 2.00 MB + 0.5 s/node x 400 nodes) = 320 s, within [120, 1800] s"
    assert step_budget(2_000_000, 400, **BUDGET, factor=3).seconds == 960
    tiny = step_budget(10_000, 5, **BUDGET)
    assert tiny.seconds == 120 and tiny.how.endswith("(the floor)")
    huge = step_budget(500_000_000, 90_000, **BUDGET)
    assert huge.seconds == 1800 and huge.how.endswith("(the ceiling)")
    assert step_budget(500_000_000, 90_000, **BUDGET, override=7200, override_from="x").seconds == 7200


def _config(**kw):
    base = dict(compiler="rknn", backend="npu", target_platform="rk3588", precision="fp16",
                entry="main", librknnrt="2.5.0", inputs=({"name": "x", "shape": [1], "dtype": "float32"},),
                n_outputs=1)
    return rknn_compile.Config(**{**base, **kw})


def test_an_npu_build_budget_comes_from_its_model_or_from_the_spec():
    assert graph_nodes(CLS) == 566
    derived = budget(_config(), CLS)
    assert derived.seconds == round(60 + 30 * CLS.stat().st_size / 1e6 + 0.5 * 566) == 361
    assert "566 nodes" in derived.how
    assert rknn_compile.INT8_FACTOR == 3  # an int8 step: two builds and the per-layer analysis
    given = budget(_config(budget_s=5), CLS)
    assert (given.seconds, given.how) == (5, "set by the model spec, npu: {budget_s: 5}")


def test_the_budget_is_in_the_key_only_when_the_spec_sets_it():
    plain = _config()
    assert "budget_s" not in plain.as_key()
    assert rknn_compile.Config.from_key(plain.as_key()) == plain
    given = _config(budget_s=90)
    assert given.as_key()["budget_s"] == 90 and rknn_compile.Config.from_key(given.as_key()) == given
    with pytest.raises(ValueError, match="budget_s must be a whole number of seconds, at least 1"):
        _config(budget_s=0)


def test_a_model_spec_sets_the_budget_of_its_npu_steps_and_variants(tmp_path):
    models = tmp_path / "models"
    spec = add_default_model(models, "ppocr_cls")
    spec.write_text(spec.read_text() + "npu:\n  budget_s: 45\n")
    project = load_project(models, tmp_path / "artifacts", "rk3588")
    steps = project.steps("rknn_compile")
    assert {s.name.split("/")[1] for s in steps} >= {"ppocr_cls", "ppocr_cls.48x320", "ppocr_cls.int8"}
    assert all(s.cfg.budget_s == 45 and s.config["budget_s"] == 45 for s in steps)
    spec.write_text(spec.read_text().replace("budget_s: 45", "budget_s: 0"))
    with pytest.raises(SpecError, match=r"npu.budget_s: must be >= 1, got 0"):
        load_project(models, tmp_path / "artifacts", "rk3588")


def test_past_its_budget_a_tool_and_its_children_are_killed(tmp_path):
    child = ("import subprocess, sys, time; p = subprocess.Popen(['sleep', '60']); "
             "print(p.pid, flush=True); time.sleep(60)")
    start = time.monotonic()
    run = run_tool([sys.executable, "-c", child], log=tmp_path / "log", what="sleeper",
                   timeout=1, check=False)
    assert run.timed_out and time.monotonic() - start < 10
    grandchild = Path(f"/proc/{int(run.output.split()[0])}/stat")
    time.sleep(0.2)  # gone, or a zombie left for init to reap: not running
    assert not grandchild.exists() or grandchild.read_text().rsplit(")", 1)[1].split()[0] == "Z"
