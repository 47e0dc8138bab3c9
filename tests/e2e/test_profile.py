"""`doit profile` and the bench report's profile section, through the repo's dodo.py, on a small
CNN built here (dense, depthwise and pointwise convolutions, a residual Add): every dispatch and
kernel maps to nodes of the static model, their times add up to about the whole run, and
onnxruntime's side lists the model's ops. Structure and content only: no timing thresholds."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, Workspace, sha256, write_spec
from pipeline.bench import profile as P

FEW = ("iterations=3", "rounds=2", "warmup=1")


def convs_onnx(path: Path) -> Path:
    """x[1,3,128,128] -> Conv 3x3 s2 (32) -> Relu -> depthwise 3x3 -> Relu -> Conv 1x1 -> Add (the
    first Relu) -> GlobalAveragePool -> Flatten -> Gemm -> y[1,10]; nodes left unnamed."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(7)
    c = 32
    init = lambda name, *shape: numpy_helper.from_array(
        (rng.standard_normal(shape) * 0.3).astype(np.float32), name)
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Relu", ["c0"], ["r0"]),
             helper.make_node("Conv", ["r0", "wd", "bd"], ["d"], pads=[1, 1, 1, 1], group=c),
             helper.make_node("Relu", ["d"], ["r1"]),
             helper.make_node("Conv", ["r1", "wp", "bp"], ["p"]),
             helper.make_node("Add", ["p", "r0"], ["a"]),
             helper.make_node("GlobalAveragePool", ["a"], ["g"]),
             helper.make_node("Flatten", ["g"], ["f"]),
             helper.make_node("Gemm", ["f", "gw", "gb"], ["y"], transB=1)]
    graph = helper.make_graph(
        nodes, "convs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 128, 128])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
        initializer=[init("w0", c, 3, 3, 3), init("b0", c), init("wd", c, 1, 3, 3), init("bd", c),
                     init("wp", c, c, 1, 1), init("bp", c), init("gw", 10, c), init("gb", 10)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(model.SerializeToString(deterministic=True))
    return path


PINNED = "all-rewrites"  # a config of pipeline/targets/host.yaml with graph rewrites


def pin(folder: Path, model: str, config: str) -> list[str]:
    """Pin `config` of the host's cpu-x86_64 for `model`, as `doit search` would have (no
    figures): the build applies its rewrites. Returns them."""
    import importlib.metadata
    import yaml
    declared = yaml.safe_load((REPO / "pipeline/targets/host.yaml").read_text())
    found = next(c for c in declared["abis"]["cpu-x86_64"]["configs"] if c["name"] == config)
    rewrites = list(found.get("rewrites", []))
    doc = {"format": "modelyard.configs/1", "target": "host", "models": {model: {
        "searched": {"date": "2026-12-01", "machine": {}, "window": {},
                     "tools": {"iree-base-compiler": importlib.metadata.version("iree-base-compiler")}},
        "abis": {"cpu-x86_64": {"config": config, "flags": list(found.get("flags", [])),
                                "rewrites": rewrites, "candidates": {}}}}}}
    (folder / "configs").mkdir(parents=True, exist_ok=True)
    (folder / "configs" / "host.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return rewrites


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    """The model built for the host, its IREE build through pinned graph rewrites (the strided
    Conv as im2col, the depthwise one as Slices), then benched with profile=1: the bench's own
    timing (a few iterations), then `doit profile` of each model, then the report."""
    ws = Workspace(tmp_path_factory.mktemp("profile") / "ws")
    folder = ws.models / "convs"
    write_spec(folder, "model.onnx", sha256(convs_onnx(folder / "model.onnx")),
               inputs={"x": ([1, 3, 128, 128], "float32", 0)})
    assert {"strided_conv_as_im2col", "depthwise_conv_as_slices"} <= set(pin(folder, "convs", PINNED))
    ws.build("target=host")
    result = ws.doit("bench", "target=host", "iterations=2", "seconds=0", "warmup=0", "profile=1")
    assert result.returncode == 0, result.stdout + result.stderr
    doc = json.loads((ws.artifacts / "reports/profile/host/convs/profile.json").read_text())
    return ws, result, doc


def static_nodes(ws) -> dict[str, str]:
    """The static model's nodes as the profile names them (unnamed ones get `<op>#<index>`)."""
    import onnx
    model = onnx.load(str(ws.artifacts / "models/convs/static/model.onnx"))
    P.named(model)
    return {n.name: n.op_type for n in model.graph.node if n.op_type != "Constant"}


def test_every_dispatch_and_kernel_maps_to_the_models_nodes(profiled):
    ws, _, doc = profiled
    nodes = static_nodes(ws)
    manifest = json.loads((ws.artifacts / "host/manifest.json").read_text())["models"]["convs"]
    assert doc["schema"] == P.SCHEMA and (doc["target"], doc["model"]) == ("host", "convs")
    assert doc["static_model"]["sha256"] == manifest["static_model"]["sha256"]
    assert list(doc["runtimes"]) == ["cpu-x86_64", "cpu-x86_64-tvm", "onnxruntime"]
    strided, depthwise, pointwise = convs = [n for n, op in nodes.items() if op == "Conv"]
    # the IREE build went through the pinned rewrites: the profile maps what it compiled (its
    # dispatches through the rewritten nodes, `<node>__<part>`, back to the static model's)
    rewritten = manifest["artifacts"]["cpu-x86_64"]["compile"]["config"]["rewritten"]
    assert {r["rewrite"]: r["nodes"] for r in rewritten if r["nodes"]} == {
        "depthwise_conv_as_slices": [depthwise], "strided_conv_as_im2col": [strided]}
    for abi, how in (("cpu-x86_64", {"locations"}), ("cpu-x86_64-tvm", {"values", "dataflow"})):
        side = doc["runtimes"][abi]
        assert side["artifact"]["sha256"] == manifest["artifacts"][abi]["sha256"]
        assert side["entries"], abi
        covered = set()
        for e in side["entries"]:
            mapped = e["onnx_nodes"] + e["fused"]
            assert mapped and set(mapped) <= set(nodes), (abi, e)
            assert set(e["mapped_by"].split("+")) <= how, (abi, e)
            assert e["ms"] >= 0 and e["calls"] >= 1
            covered |= set(mapped)
        assert set(convs) <= covered, abi  # each convolution is in some dispatch / kernel
        cats = {e["category"] for e in side["entries"]}
        assert {"Conv dense", "Conv depthwise", "Conv pointwise"} <= cats, abi
        # the entries' times add up to about the whole run (generous: a tiny model's runtime
        # overhead between kernels is a large part of it)
        assert side["total_ms"] / 10 < side["entries_ms"] < side["total_ms"] * 10, side
        assert sum(e["share"] for e in side["entries"]) == pytest.approx(1.0, abs=1e-3)


def test_onnxruntime_side_lists_the_models_ops(profiled):
    ws, _, doc = profiled
    nodes = static_nodes(ws)
    side = doc["runtimes"]["onnxruntime"]
    mapped = [n for e in side["entries"] for n in e["onnx_nodes"] + e["fused"]]
    assert set(mapped) <= set(nodes)
    assert {nodes[n] for n in mapped} >= {"Conv", "Relu", "Add", "GlobalAveragePool", "Gemm"}
    for e in side["entries"]:  # a node of the model, or one of onnxruntime's own layout reorders
        assert e["onnx_nodes"] or e["category"] == "(onnxruntime layout reorder)", e
    # the comparison holds every category of every side
    by_cat = {c["category"]: c for c in doc["by_category"]}
    for key, s in doc["runtimes"].items():
        for c in s["by_category"]:
            assert by_cat[c["category"]][key] == {"ms": c["ms"], "share": c["share"]}


def test_the_bench_report_shows_the_top_of_the_profile(profiled):
    ws, result, doc = profiled
    out = result.stdout
    assert "profile host/convs: cpu-x86_64, cpu-x86_64-tvm and onnxruntime" in out
    assert "time per ONNX op kind" in out and "cpu-x86_64 (IREE): whole run" in out
    summary = json.loads((ws.artifacts / "host/bench.json").read_text())
    assert summary["profiles"] == {"convs": "reports/profile/host/convs/profile.json"}
    html = (ws.artifacts / "host/report.html").read_text()
    assert "convs: where the time goes" in html and "ONNX op kind" in html
    for key, side in doc["runtimes"].items():
        top = side["entries"][0]
        assert P.display_name(top["name"], 80) in html, (key, top["name"])


def test_one_abi_and_clear_errors(profiled):
    ws, _, _ = profiled
    only = ws.doit("profile", "target=host", "model=convs", "abi=cpu-x86_64-tvm", *FEW)
    assert only.returncode == 0, only.stdout + only.stderr
    doc = json.loads((ws.artifacts / "reports/profile/host/convs/profile.json").read_text())
    assert list(doc["runtimes"]) == ["cpu-x86_64-tvm", "onnxruntime"]
    assert doc["settings"] == {"iterations": 3, "rounds": 2, "warmup": 1}
    cases = {("profile", "target=host"): "say what to profile: doit profile target=T model=NAME",
             ("profile", "target=host", "model=nope"):
                 "host's manifest has no model 'nope'; models: convs",
             ("profile", "target=host", "model=convs", "abi=vulkan-mali-g610"):
                 "convs has no host artifact for ABI 'vulkan-mali-g610'; its ABIs: cpu-x86_64, "
                 "cpu-x86_64-tvm",
             ("profile", "target=host", "model=convs", "rounds=many"):
                 "profile option rounds='many' is not valid"}
    for args, message in cases.items():
        result = ws.doit(*args)
        text = result.stdout + result.stderr
        assert result.returncode != 0 and message in text, (args, text)
        assert "Traceback" not in text
