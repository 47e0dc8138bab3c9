"""The search in the build (stages/search_configs.py, compilers/config_choice.py): which models
get a search step, in which order the candidates go, how the budget stops them, and what the
compile step applies from a ranking. No toolchain runs here."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from pipeline.bench.config_search import bounded, fits
from pipeline.bench.measure import variant_rows, variant_table
from pipeline.bench.report import verdicts_html
from pipeline.compilers import config_choice
from pipeline.core.layout import coverage_file
from pipeline.core.errors import PipelineError
from pipeline.graph import load_project
from pipeline.stages import iree_compile, search_configs
from pipeline.stages.search_configs import PRIORITY, ordered, parse_budget
from tests.conftest import REPO, add_tiny_model


def _project(models: Path, artifacts: Path, target: str, search: float | None = None):
    """the product's defaults, whatever conftest put in the environment for the other tests"""
    return dataclasses.replace(load_project(models, artifacts, target, untuned="0"), search=search)


def test_candidates_go_default_first_then_most_likely_to_pay():
    host = load_project(REPO / "models", REPO / "artifacts", "host").targets[0]
    abi = next(a for a in host.abis if a.name == "cpu-x86_64")
    names = [c["name"] for c in ordered(abi)]
    assert names[0] == "default"
    assert names[1:] == [n for n in PRIORITY if abi.config(n)] + \
        [c["name"] for c in abi.configs if c["name"] not in PRIORITY]
    assert names[1] == "loops" and names[-1] == "conv-dt"  # flags only: the cheapest to try
    assert ordered(abi)[1] == {"name": "loops", "flags": list(abi.config("loops")["flags"]),
                               "rewrites": []}


def test_the_budget_keeps_the_timing_window():
    # 100 s spent, the slowest candidate 30 s, 15 s timing (x2 reserved): 160 <= 180 fits
    assert fits(100.0, [20.0, 30.0], 180.0, 15.0)
    assert not fits(125.0, [20.0, 30.0], 180.0, 15.0)    # 185 > 180
    assert fits(0.0, [], 30.0, 15.0) and not fits(1.0, [], 30.0, 15.0)


def test_a_candidate_is_stopped_with_its_tools_when_the_budget_runs_out(tmp_path):
    pid = tmp_path / "pid"

    def slow():
        proc = subprocess.Popen(["sleep", "60"])
        pid.write_text(str(proc.pid))
        proc.wait()
        return "late"

    began = time.monotonic()
    assert bounded(slow, 1.5) == (False, None)
    assert time.monotonic() - began < 10
    time.sleep(0.2)
    assert not Path(f"/proc/{pid.read_text()}").exists() or \
        "Z" in Path(f"/proc/{pid.read_text()}/stat").read_text().split()[2]  # killed (or a zombie)
    assert bounded(lambda: {"status": "validated"}, 30) == (True, {"status": "validated"})
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        bounded(lambda: 1 / 0, 30)


def test_search_variable_is_a_number_of_seconds():
    assert parse_budget(None) is None and parse_budget("0") == 0.0 and parse_budget("90") == 90.0
    for bad in ("ten", "-5", "nan"):
        with pytest.raises(PipelineError) as err:
            parse_budget(bad)
        assert f"search={bad!r}" in err.value.what and "search=0" in err.value.hint


def test_the_default_models_have_pins_and_do_no_search(tmp_path):
    for target in ("host", "rk3588"):
        project = _project(REPO / "models", tmp_path / "artifacts", target)
        assert search_configs.steps(project) == []
        cpu = [s for s in iree_compile.steps(project) if "/cpu-" in s.name and "." not in s.name]
        assert cpu and all(s.cfg.search is None and s.cfg.config for s in cpu), \
            [(s.name, s.cfg.search) for s in cpu]
        assert all(s.config["config"]["pin"] == "host" for s in cpu)


def test_a_model_without_a_pin_is_searched_on_the_host_abi_not_followed_on_aarch64(tmp_path):
    """The in-build search validates its winner on the host only: an aarch64 ABI that follows
    the host (configs_from) keeps its base flags, saying why, until `doit search` (which checks
    the host's candidates under qemu) pins one; so an rk3588 build searches nothing."""
    models = tmp_path / "models"
    add_tiny_model(models, "tiny")
    project = _project(models, tmp_path / "artifacts", "rk3588")
    assert search_configs.steps(project) == []
    (arm,) = [s for s in iree_compile.steps(project) if s.name == "rk3588/tiny/cpu-aarch64"]
    assert arm.cfg.search["from"] == "base" and "under qemu" in arm.cfg.search["why"]
    assert "search" not in arm.inputs
    host = _project(models, tmp_path / "artifacts", "host")
    (step,) = search_configs.steps(host)
    assert step.name == "host/tiny/cpu-x86_64"
    assert step.cfg.budget_s == 180.0 and step.cfg.candidates[0]["name"] == "default"
    assert set(step.inputs) >= {"model", "spec", "target", "golden.json"}
    (x86,) = [s for s in iree_compile.steps(host) if s.name == "host/tiny/cpu-x86_64"]
    assert x86.inputs["search"] == step.out_dir / "ranking.json"
    assert x86.cfg.search["from"] == "search" and x86.cfg.search["source"] == "host/cpu-x86_64"
    # the budget is part of the step's key; search=0: no step, the base flags and why
    assert _project(models, tmp_path / "artifacts", "host", 60).steps("search_configs")[0] \
        .config["budget_s"] == 60.0
    off = _project(models, tmp_path / "artifacts", "host", 0)
    assert off.steps("search_configs") == []
    (host,) = [s for s in iree_compile.steps(off) if s.name == "host/tiny/cpu-x86_64"]
    assert host.cfg.search == {"from": "base", "why": host.cfg.search["why"],  # and UNPINNED's
                               **({"default": config_choice.unpinned(x86_abi(off))}
                                  if config_choice.UNPINNED else {})}
    assert "search=0" in host.cfg.search["why"] and "search" not in host.inputs


def x86_abi(project):
    return next(a for a in project.targets[0].abis if a.name == "cpu-x86_64")


def _ranking(config, order, timed, not_tried=()):
    return {"config": config, "order": order, "ranking": timed, "not_tried": list(not_tried),
            "budget_s": 60.0, "spent_s": 58.0,
            "candidates": {n: {"ratio_to_onnxruntime": 1.5 + k} for k, n in enumerate(order)}}


@pytest.mark.parametrize("ranking,expect", [
    (_ranking("o3", ["default", "o3", "im2col"], ["o3", "default"], ["im2col"]),
     ("search", "o3", ["--iree-opt-level=O3"])),
    (_ranking("default", ["default", "o3", "im2col"], ["default", "o3"]),
     ("search", None, None)),
    (_ranking("default", ["default", "o3", "im2col"], ["default"], ["o3", "im2col"]),
     ("base", None, "used its budget of 60 s before any config besides default")),
    (_ranking(None, ["default", "o3"], []), ("base", None, "validated no candidate")),
    (_ranking(None, ["default", "o3"], [], ["default", "o3"]),
     ("base", None, "used its budget of 60 s before a candidate was built and validated")),
    (_ranking("dw-slices", ["default", "dw-slices"], ["dw-slices"]),
     ("base", None, "ranked dw-slices first, which this ABI does not declare")),
])
def test_the_compile_step_applies_the_ranking(tmp_path, ranking, expect):
    path = tmp_path / "ranking.json"
    path.write_text(json.dumps(ranking))
    cfg = iree_compile.Config(
        compiler="iree", backend="llvm-cpu", flags=("--iree-opt-data-tiling",), entry="main",
        arch="x86_64", triple="x86_64-linux-gnu", cpu="x86-64-v3", cpu_features=(),
        search={"from": "search", "source": "host/cpu-x86_64",
                "configs": [{"name": "o3", "flags": ["--iree-opt-level=O3"], "rewrites": []},
                            {"name": "im2col", "flags": ["--iree-global-opt-use-im2col-for-convs"],
                             "rewrites": []}]})
    ctx = SimpleNamespace(input=lambda name: path)
    chosen, origin = iree_compile._chosen(ctx, cfg)
    source, name, detail = expect
    assert origin["from"] == source and origin["searched"] == "host/cpu-x86_64"
    assert chosen.search is None
    if name:
        assert chosen.config == {"name": name, "flags": detail, "rewrites": [], "pin": "host"}
        assert origin["ratio_to_onnxruntime"] == 2.5
    else:
        assert chosen.config is None
    if source == "base":
        assert detail in origin["why"]


def test_a_search_steps_config_round_trips(tmp_path):
    models = tmp_path / "models"
    add_tiny_model(models, "tiny")
    (step,) = _project(models, tmp_path / "artifacts", "host").steps("search_configs")
    assert step.config == step.cfg.as_key()
    assert search_configs.Config.from_key(step.config) == step.cfg
    with pytest.raises(ValueError, match="candidates are 'default' first"):
        dataclasses.replace(step.cfg, candidates=step.cfg.candidates[1:])


# ----------------------------------------------------------------------------- TVM that cannot win
def _tvm(project, target="host", model="tiny"):
    """(the slot, whether TVM is built unconditionally); TVM as the slot's fallback is a gated
    step built only when IREE fails (compilers/builds.py fallback_pair), not counted as built."""
    (choose,) = [s for s in project.steps("choose") if s.name == f"{target}/{model}"]
    steps = project.steps("tvm_compile") + project.steps("validate")
    built = {s.name for s in steps if s.gate is None}
    return choose.cfg.slots[0], f"{target}/{model}/cpu-x86_64-tvm" in built


def _tvm_is_the_fallback(project, target="host", model="tiny") -> bool:
    gated = {s.name for s in project.steps("tvm_compile") if s.gate is not None}
    return f"{target}/{model}/cpu-x86_64-tvm" in gated


def test_an_untuned_tvm_build_that_cannot_win_is_not_built_and_says_why(tmp_path):
    models = tmp_path / "models"
    spec = add_tiny_model(models, "tiny")
    slot, built = _tvm(_project(models, tmp_path / "a", "host"))
    assert not built and slot.candidates == ("cpu-x86_64",)
    assert _tvm_is_the_fallback(_project(models, tmp_path / "a", "host"))  # if IREE fails
    assert slot.fallback["preferred"] == "cpu-x86_64" and slot.fallback["fallback"] == "cpu-x86_64-tvm"
    why = slot.fallback["why"]  # the choice lists it under `skipped` when IREE shipped
    assert why.startswith("not built: an untuned TVM build cannot win") and "12-80x" in why
    assert "cpu-x86_64 is built for slot cpu" in why and "untuned=1" in why
    assert "built when cpu-x86_64 fails" in why
    # overridden: untuned=1, a tuning budget, or the model's explicit choice of it
    assert _tvm(dataclasses.replace(_project(models, tmp_path / "b", "host"), untuned=True))[1]
    text = spec.read_text()
    spec.write_text(text + "tvm:\n  tune:\n    host: {trials: 8, per_task: 2}\n")
    assert _tvm(_project(models, tmp_path / "c", "host"))[1]
    spec.write_text(text + "ship:\n  host: {cpu: cpu-x86_64-tvm}\n")
    slot, built = _tvm(_project(models, tmp_path / "d", "host"))
    assert built and slot.explicit == "cpu-x86_64-tvm"


def test_a_model_iree_cannot_take_still_builds_tvm(tmp_path):
    models = tmp_path / "models"
    add_tiny_model(models, "tiny")
    project = _project(models, tmp_path / "a", "host")
    path = coverage_file(project.layout, "host", "tiny")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"compilers": {
        "iree": {"status": "skipped", "unsupported": [{"op": "Foo", "why": "no converter"}]},
        "tvm": {"status": "ok"}}}))
    slot, built = _tvm(_project(models, tmp_path / "a", "host"))
    assert built and slot.candidates == ("cpu-x86_64-tvm",)


# ----------------------------------------------------------------------------- int8 that pays or says so
def test_a_variant_slower_than_fp32_says_so_in_the_bench_summary():
    row = lambda m, p50: {"model": m, "abi": "cpu-x86_64", "p50_ms": p50,
                          "onnxruntime": {"p50_ms": 1.0}}
    art = lambda size: {"artifacts": {"cpu-x86_64": {"size": size}}}
    manifest = {"models": {"m": art(400), "m.int8": {**art(100), "variant_of": "m",
                                                      "precision": "int8"}}}
    (slow,) = variant_rows([row("m", 2.0), row("m.int8", 2.5)], [], manifest)
    assert slow["speedup"] == 0.8 and slow["pays"] is False
    assert slow["verdict"].startswith("the int8 artifact is SLOWER than its fp32 build here: "
                                      "p50 2.500 ms vs 2.000 ms (0.80x)")
    assert any(slow["verdict"] in line for line in variant_table([slow]))
    (fast,) = variant_rows([row("m", 2.0), row("m.int8", 1.0)], [], manifest)
    assert fast["pays"] is True and "verdict" not in fast
    assert not [l for l in variant_table([fast]) if "SLOWER" in l]
    assert "SLOWER than its fp32 build" in verdicts_html([slow, fast])
    assert verdicts_html([fast]) == ""


# ----------------------------------------------------------------------------- no pin, no ranking
def _depthwise_onnx(path: Path, depthwise: bool) -> Path:
    """x[1, 4, 6, 6] -> Conv 3x3 (depthwise: group 4; else dense 4 -> 4) -> y"""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    w = np.ones((4, 1 if depthwise else 4, 3, 3), np.float32)
    node = helper.make_node("Conv", ["x", "W"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                            group=4 if depthwise else 1)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 6, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 6, 6])],
                              [numpy_helper.from_array(w, "W")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    return path


def test_the_unpinned_config_is_declared_where_it_is_set():
    host = load_project(REPO / "models", REPO / "artifacts", "host").targets[0]
    abi = next(a for a in host.abis if a.name == "cpu-x86_64")
    if config_choice.UNPINNED is None:
        assert config_choice.unpinned(abi) is None
    else:
        assert config_choice.unpinned(abi)["name"] == config_choice.UNPINNED


def test_a_model_without_a_pin_gets_the_unpinned_config_and_pinned_models_keep_their_keys(
        tmp_path, monkeypatch):
    """The config a model with no pin gets when no search ranked one (config_choice.UNPINNED):
    on the host ABI only (a follower takes a config from a pin only), in the step's key; the
    default models' compile steps (pinned) are the very same steps with or without it."""
    def keys(project):
        return {s.name: s.config for s in iree_compile.steps(project)}
    pinned_before = {t: keys(_project(REPO / "models", tmp_path / "a", t)) for t in ("host", "rk3588")}
    monkeypatch.setattr(config_choice, "UNPINNED", "dw-slices")
    for target, before in pinned_before.items():
        assert keys(_project(REPO / "models", tmp_path / "a", target)) == before
    models = tmp_path / "models"
    add_tiny_model(models, "tiny")
    off = _project(models, tmp_path / "artifacts", "host", 0)
    (host,) = [s for s in iree_compile.steps(off) if s.name == "host/tiny/cpu-x86_64"]
    assert host.cfg.search["default"] == {"name": "dw-slices", "flags": [],
                                          "rewrites": ["depthwise_conv_as_slices"]}
    on = _project(models, tmp_path / "artifacts", "host")
    (x86,) = [s for s in iree_compile.steps(on) if s.name == "host/tiny/cpu-x86_64"]
    assert x86.cfg.search["from"] == "search" and x86.cfg.search["default"]["name"] == "dw-slices"
    arm_project = _project(models, tmp_path / "artifacts", "rk3588", 0)
    (arm,) = [s for s in iree_compile.steps(arm_project) if s.name == "rk3588/tiny/cpu-aarch64"]
    assert "default" not in arm.cfg.search


DEFAULT = {"name": "dw-slices", "flags": [], "rewrites": ["depthwise_conv_as_slices"]}


def _cfg(search):
    return iree_compile.Config(
        compiler="iree", backend="llvm-cpu", flags=("--iree-opt-data-tiling",), entry="main",
        arch="x86_64", triple="x86_64-linux-gnu", cpu="x86-64-v3", cpu_features=(), search=search)


@pytest.mark.parametrize("depthwise", [True, False])
def test_search_0_builds_the_unpinned_config_where_it_rewrites_something(tmp_path, depthwise):
    model = _depthwise_onnx(tmp_path / "model.onnx", depthwise)
    ctx = SimpleNamespace(input=lambda name: model)
    why = "no pin in the model folder, and search=0: the build searched no config"
    chosen, origin = iree_compile._chosen(ctx, _cfg({"from": "base", "why": why, "default": DEFAULT}))
    assert chosen.search is None
    if depthwise:
        assert chosen.config == {**DEFAULT, "pin": None}
        assert origin == {"from": "default", "why": f"{why}: dw-slices, the config of a model "
                                                    f"without a pin (docs/configs.md)"}
    else:  # nothing to rewrite: the base, as compile.json said before (the same bytes)
        assert chosen.config is None and origin == {"from": "base", "why": why}
    # no default: the base flags
    chosen, origin = iree_compile._chosen(ctx, _cfg({"from": "base", "why": why}))
    assert chosen.config is None and origin == {"from": "base", "why": why}


@pytest.mark.parametrize("ranking,expect", [
    (_ranking("default", ["default", "o3"], ["default"], ["o3"]), "default"),
    (_ranking(None, ["default", "o3"], [], ["default", "o3"]), "default"),
    (_ranking(None, ["default", "o3"], []), "base"),      # nothing validated: the base flags
    (_ranking("o3", ["default", "o3"], ["o3", "default"]), "search"),
])
def test_a_search_out_of_budget_falls_back_to_the_unpinned_config(tmp_path, ranking, expect):
    model = _depthwise_onnx(tmp_path / "model.onnx", True)
    path = tmp_path / "ranking.json"
    path.write_text(json.dumps(ranking))
    ctx = SimpleNamespace(input=lambda name: model if name == "model" else path)
    chosen, origin = iree_compile._chosen(ctx, _cfg({
        "from": "search", "source": "host/cpu-x86_64", "default": DEFAULT,
        "configs": [{"name": "o3", "flags": ["--iree-opt-level=O3"], "rewrites": []}]}))
    assert origin["from"] == expect and chosen.search is None
    assert (chosen.config or {}).get("name") == {"default": "dw-slices", "base": None,
                                                 "search": "o3"}[expect]
