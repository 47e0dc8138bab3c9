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


def _registry(folder):
    """host.yaml with its IREE CPU ABI only and three of its configs (dw-slices changes nothing
    in a model without a depthwise Conv: the search records it as the same build as default)."""
    doc = yaml.safe_load((REPO / "pipeline/targets/host.yaml").read_text())
    abi = doc["abis"]["cpu-x86_64"]
    abi["configs"] = [c for c in abi["configs"] if c["name"] in CONFIGS]
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
