"""`doit build` searches the configs of a model with no pin (stages/search_configs.py), within
search=SECONDS, records the ranking as a measurement restored from the store, and builds with
the winner; search=0 (the test workspaces' default, tests/conftest.py) builds with the base
flags and says so. A tiny model on a host registry of three configs keeps it short."""
from __future__ import annotations

import json
import shutil

import yaml

from pipeline.core.layout import Layout
from pipeline.core.timings import record_path
from tests.conftest import REPO, add_tiny_model, ran

CONFIGS = ("o3", "im2col", "dw-slices")


def _registry(folder, configs=CONFIGS):
    """host.yaml with its IREE CPU ABI only and `configs` of it (by default three: dw-slices changes
    nothing in a model without a depthwise Conv: the search records it as the same build as default)."""
    doc = yaml.safe_load((REPO / "pipeline/targets/host.yaml").read_text())
    abi = doc["abis"]["cpu-x86_64"]
    abi["configs"] = [c for c in abi["configs"] if c["name"] in configs]
    doc["abis"], doc["fallback"] = {"cpu-x86_64": abi}, ["cpu-x86_64"]
    doc.pop("ship", None)
    folder.mkdir()
    (folder / "host.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return folder


def _compiled(workspace, model="tiny"):
    manifest = json.loads((workspace.artifacts / "host" / "manifest.json").read_text())
    return manifest["models"][model]["artifacts"]["cpu-x86_64"]["compile"]


def _ranking(workspace):
    return workspace.artifacts / "host/tiny/cpu-x86_64/search_configs/ranking.json"


def test_search_ranks_builds_the_winner_and_is_restored(workspace, tmp_path):
    add_tiny_model(workspace.models, "tiny")
    targets = _registry(tmp_path / "targets")
    first = workspace.build("target=host", f"targets={targets}", "search=150")
    assert "search_configs:host/tiny/cpu-x86_64" in ran(first)
    doc = json.loads(_ranking(workspace).read_text())
    assert doc["order"] == ["default", "dw-slices", "o3", "im2col"]  # PRIORITY's order
    assert doc["candidates"]["dw-slices"]["status"] == "same-as"
    assert doc["candidates"]["dw-slices"]["same_as"] == "default"
    assert doc["not_tried"] == [] and doc["onnxruntime"]["p50_ms"] > 0
    assert set(doc["ranking"]) == {"default", "o3", "im2col"}
    assert doc["config"] == doc["ranking"][0]
    best = doc["candidates"][doc["config"]]
    assert best["p50_ms"] == min(doc["candidates"][n]["p50_ms"] for n in doc["ranking"])
    compiled = _compiled(workspace)
    assert compiled["config"]["from"] == "search" and compiled["config"]["name"] == doc["config"]
    assert compiled["config"]["searched"] == "host/cpu-x86_64"
    assert compiled["config"]["ratio_to_onnxruntime"] == best["ratio_to_onnxruntime"]
    for flag in best["flags"]:
        assert flag in compiled["flags"]

    again = workspace.build("target=host", f"targets={targets}", "search=150")
    assert not [t for t in ran(again) if t.startswith(("search_configs", "iree_compile"))]

    # a clean artifacts folder with the store kept: the ranking is restored, not measured again
    saved = _ranking(workspace).read_bytes()
    shutil.rmtree(workspace.artifacts / "host")
    workspace.build("target=host", f"targets={targets}", "search=150")
    assert _ranking(workspace).read_bytes() == saved
    timing = record_path(Layout(workspace.artifacts).log("search_configs", "host/tiny/cpu-x86_64"))
    assert json.loads(timing.read_text())["how"] == "restored"


def test_search_0_builds_the_base_flags_and_a_spent_budget_says_so(workspace, tmp_path):
    add_tiny_model(workspace.models, "tiny")
    targets = _registry(tmp_path / "targets")
    off = workspace.build("target=host", f"targets={targets}")  # MODELYARD_SEARCH=0 (conftest)
    assert not [t for t in ran(off) if t.startswith("search_configs")]
    config = _compiled(workspace)["config"]
    assert config["from"] == "base" and config["name"] == "default" and "search=0" in config["why"]

    # search=1: the default build is stopped after 1 s with its compiler, nothing else is tried
    workspace.build("target=host", f"targets={targets}", "search=1")
    doc = json.loads(_ranking(workspace).read_text())
    assert doc["ranking"] == [] and doc["config"] is None and doc["spent_s"] < 20
    assert doc["not_tried"] == ["default", "dw-slices", "o3", "im2col"]
    assert doc["candidates"]["default"]["status"] == "not-finished"
    assert "the budget of 1 s ran out while default was building" in doc["candidates"]["o3"]["why"]
    config = _compiled(workspace)["config"]
    assert config["from"] == "base" and config["not_tried"] == doc["not_tried"]
    assert "used its budget of 1 s before a candidate was built" in config["why"]


UNPINNED_CONFIGS = ("loops", "dw-chunks-loops", "dw-chunks-loops-conv1d")


def test_the_config_of_a_model_without_a_pin_is_capped_and_checked_else_the_base_flags(
        workspace, tmp_path, monkeypatch):
    """search=0: the config UNPINNED names is built (its flags, compile.json `from: default`) and
    checked against golden in the compile step; a compile past the cap ($MODELYARD_DEFAULT_CONFIG_CAP_S)
    and an artifact off golden each build the base flags instead, and compile.json says which and why
    (a failed compile takes the same path: `failed-compile`)."""
    from pipeline.compilers import config_choice
    from pipeline.core.steps import execute
    from pipeline.graph import load_project
    from pipeline.stages import iree_compile
    assert config_choice.UNPINNED in UNPINNED_CONFIGS
    loops = ["--iree-llvmcpu-loop-vectorization", "--iree-llvmcpu-loop-unrolling",
             "--iree-llvmcpu-loop-interleaving"]
    add_tiny_model(workspace.models, "tiny")
    targets = _registry(tmp_path / "targets", UNPINNED_CONFIGS)
    assert workspace.doit("static", "golden").returncode == 0
    project = load_project(workspace.models, workspace.artifacts, "host", targets, search="0")
    (step,) = [s for s in iree_compile.steps(project) if s.name == "host/tiny/cpu-x86_64"]
    assert "golden.json" in step.inputs and step.cfg.check["tolerance"]["max_abs"] == 1.0e-4
    out = step.out_dir / "compile.json"
    assert execute(step) == "ran"  # the config, checked against golden here
    compiled = json.loads(out.read_text())
    assert compiled["config"]["from"] == "default" and compiled["config"]["name"] == config_choice.UNPINNED
    assert all(f in compiled["flags"] for f in loops) and "default_tried" not in compiled["config"]

    def again(step, **env):
        shutil.rmtree(workspace.artifacts / ".store")  # what the cap decided is in no key
        step.record.unlink()
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        assert execute(step) == "ran"
        return json.loads(out.read_text())

    # past the cap: stopped, the base flags
    report = again(step, MODELYARD_DEFAULT_CONFIG_CAP_S="0.05")
    tried = report["config"]["default_tried"]
    assert report["config"]["from"] == "base" and report["config"]["name"] == "default"
    assert tried["status"] == "over-cap" and tried["cap_s"] == 0.05 and tried["name"] == config_choice.UNPINNED
    assert "search=0" in report["config"]["why"] and "ran past its cap of 0.05 s" in report["config"]["why"]
    assert not any(f in report["flags"] for f in loops) and report["flags"] == compiled["flags"][:-3]
    monkeypatch.delenv("MODELYARD_DEFAULT_CONFIG_CAP_S")

    # an artifact off golden (golden's output moved by 1): the base flags, and why
    import numpy as np
    golden = step.inputs["golden:output_0.npy"]
    np.save(golden, np.load(golden) + 1.0)
    report = again(step)
    tried = report["config"]["default_tried"]
    assert tried["status"] == "failed-validation" and "differ from golden" in tried["why"]
    assert report["config"]["from"] == "base" and not any(f in report["flags"] for f in loops)
