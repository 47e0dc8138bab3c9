"""The RK3588 NPU backend end to end, with the real RKNN-Toolkit2 (setup.sh's .tools/rknn-venv):
a small CNN with an int8 and an fp16 variant, built for rk3588's `npu` ABI (and its IREE CPU ABI,
the fallback): fp16 and int8 `.rknn` files, validated in the toolkit's simulator against golden
with the ABI's per-precision tolerance, listed as simulated; the int8 build's per-layer analysis by
RKNN, printed by `doit accuracy`; rebuilt in another folder, the same bytes; the runner passes the NPU over on this machine (it has none) and falls back.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import Workspace, require, require_aarch64, sha256, target_registry
from test_quantize import FP16, INT8, add_cnn


def _npu_and_cpu(body: dict) -> bool:
    return body.get("compiler") == "rknn" or body.get("backend") == "llvm-cpu"


def _toolkit():
    from pipeline.core.tools import rknn_toolkit
    require(rknn_toolkit(required=False) is not None,
            "RKNN-Toolkit2 is not installed in .tools/rknn-venv (run ./setup.sh)")


def _build(root, targets=None):
    ws = Workspace(root)
    add_cnn(ws.models, INT8 + FP16)
    targets = targets or target_registry(root / "targets", _npu_and_cpu)
    ws.build("target=rk3588", f"targets={targets}")
    return ws, targets


@pytest.fixture(scope="module")
def npu_build(tmp_path_factory):
    _toolkit()
    require_aarch64()
    return _build(tmp_path_factory.mktemp("npu") / "ws")


def _manifest(ws) -> dict:
    return json.loads((ws.artifacts / "rk3588" / "manifest.json").read_text())


def test_npu_artifacts_are_built_simulated_and_listed_first(npu_build):
    ws, _ = npu_build
    doc = _manifest(ws)
    assert doc["target"]["fallback"][0] == "npu"
    npu = doc["models"]["cnn"]["artifacts"]["npu"]
    path = ws.artifacts / npu["path"]
    assert path.name == "model.rknn" and npu["format"] == "rknn"
    assert sha256(path) == npu["sha256"]
    assert npu["compile"]["precision"] == "fp16" and npu["compile"]["target_platform"] == "rk3588"
    assert npu["compile"]["toolkit"].startswith("rknn-toolkit2 ")
    assert npu["compile"]["tools"]["rknn-toolkit2"] == npu["compile"]["toolkit"].split()[1]
    assert npu["requires"]["npu"]["librknnrt"] == "2.5.0"
    # the toolkit's layer table, read from its output: the convolutions on the NPU, the reshape
    # before the softmax on its CPU fallback; that fact is in the manifest's coverage table
    said = npu["compile"]["messages"]
    assert said["layers"]["NPU"] >= 3
    assert "Reshape" in [f["op"] for f in said["cpu_fallbacks"]]
    assert doc["coverage"]["cnn"]["reported"]["npu"]["cpu_fallbacks"] == said["cpu_fallbacks"]
    assert "RKNN SDK License" in npu["requires"]["npu"]["licence"]
    # validated in the simulator, labelled so, against the ABI's fp16 tolerance (not the model's 1e-4)
    val = npu["validation"]
    assert val["status"] == "passed" and val["simulated"] is True
    assert val["shipped_bytes_executed"] is False
    assert val["executed"]["simulated"] is True and val["executed"]["emulated"] is True
    assert "librknnrt" in val["executed"]["not_checked"]
    assert val["tolerance_from"] == "the npu ABI's tolerance.fp16 (target YAML)"
    assert val["tolerance"]["max_abs"] == 0.1
    row = val["outputs"][0]
    assert 0 < row["max_abs"] <= 0.1 and row["cosine"] >= 0.999  # fp16: not bit-exact, close
    # the simulator ran on the golden input files, and the file it exported is the one shipped
    golden_in = ws.artifacts / "models" / "cnn" / "golden" / "input_0.npy"
    assert npu["compile"]["simulated"]["inputs"][0]["sha256"] == sha256(golden_in)
    # the IREE CPU fallback is still there, unchanged in kind
    assert doc["models"]["cnn"]["artifacts"]["cpu-aarch64"]["format"] != "rknn"


def test_int8_variant_is_quantized_by_rknn_on_its_calibration_and_fp16_variant_is_not_built(npu_build):
    ws, _ = npu_build
    doc = _manifest(ws)
    int8 = doc["models"]["cnn.int8"]["artifacts"]["npu"]
    assert int8["compile"]["precision"] == "int8"
    assert int8["compile"]["calibration"]["samples"] == 16
    assert int8["validation"]["tolerance_from"] == "the npu ABI's tolerance.int8 (target YAML)"
    fp16 = doc["models"]["cnn.fp16"]
    assert "npu" not in fp16["artifacts"]
    assert "already fp16" in fp16["skipped"]["npu"]
    validation = json.loads((ws.artifacts / "rk3588" / "cnn.int8" / "npu" / "validate"
                             / "validation.json").read_text())
    assert validation["vs_fp32"]["outputs"][0]["cosine"] >= 0.98   # held to the variant's gate
    fp32 = doc["models"]["cnn"]["artifacts"]["npu"]["sha256"]
    assert int8["sha256"] != fp32


def test_int8_npu_build_carries_rknns_per_layer_analysis_and_doit_accuracy_prints_it(npu_build):
    """RKNN's accuracy_analysis, run in the int8 step's own process: a per-layer table of the
    shipped file's model, naming the CNN's layers; its worst layer in the manifest; `doit
    accuracy` prints the worst layers under the variant's gate. fp16 builds have none."""
    ws, targets = npu_build
    doc = _manifest(ws)
    art = doc["models"]["cnn.int8"]["artifacts"]["npu"]
    shipped = ws.artifacts / art["path"]
    record = json.loads((shipped.parent / "accuracy_analysis.json").read_text())
    assert record["artifact"] == {"file": "model.rknn", "sha256": sha256(shipped)}
    golden_in = ws.artifacts / "models" / "cnn.int8" / "golden" / "input_0.npy"
    assert record["inputs"] == [{"file": "input_0.npy", "sha256": sha256(golden_in)}]
    rows = {r["layer"]: r for r in record["layers"]}
    # the CNN's own tensors (RKNN keeps their names; Sub becomes an Add, the Convs fuse their Relus)
    assert {"x", "xs", "c1", "r1", "c2", "r2", "probs"} <= set(rows)
    assert rows["c1"]["op"] == rows["c2"]["op"] == "Conv" and rows["r1"]["op"] == "Relu"
    figures = [r[w] for r in record["layers"] for w in ("single", "entire") if r[w] is not None]
    assert len(figures) >= 10 and all(-1.0 <= f["cosine"] <= 1.0 and f["euclidean"] >= 0
                                      for f in figures)
    assert any(f["cosine"] < 1.0 for f in figures)   # int8: not the fp32 run itself
    worst = record["layers"][record["worst_first"]["single"][0]]
    summary = art["compile"]["accuracy_analysis"]
    assert summary["worst_single"] == {"layer": worst["layer"], "op": worst["op"],
                                       "cosine": worst["single"]["cosine"]}
    assert summary["layers"] == len(record["layers"])
    fp16 = doc["models"]["cnn"]["artifacts"]["npu"]
    assert "accuracy_analysis" not in fp16["compile"]
    assert not ((ws.artifacts / fp16["path"]).parent / "accuracy_analysis.json").exists()

    result = ws.doit("accuracy", "target=rk3588", f"targets={targets}")
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "cnn.int8: int8 vs fp32" in out
    assert (f"NPU rk3588/npu: RKNN's own per-layer analysis of the last build's model.rknn "
            f"(sha256 {sha256(shipped)[:12]}") in out
    lines = out.splitlines()
    first = lines[next(i for i, l in enumerate(lines) if "by cosine single" in l) + 2].split()
    assert first[:2] == [str(worst["index"]), worst["layer"]]    # the worst layer, first
    assert first[3] == f"{worst['single']['cosine']:.5f}"
    assert "cnn.fp16: fp16 vs fp32" in out and out.count("NPU rk3588/npu") == 1  # fp16: not built


def test_npu_builds_are_byte_reproducible_in_another_folder(npu_build, tmp_path):
    """The toolkit writes host addresses into .rknn files: the same inputs, built in a folder of
    another path length (the NPU ABI alone), give the same bytes all the same."""
    ws, _ = npu_build
    root = tmp_path / "another-folder-of-another-length"
    again, _ = _build(root, target_registry(root / "targets", lambda body: body.get("compiler") == "rknn"))
    first, second = (_manifest(w)["models"] for w in (ws, again))
    a, b = (m["cnn"]["artifacts"]["npu"]["sha256"] for m in (first, second))
    assert a == b, "fp16: the .rknn differs between two builds of the same inputs"
    # int8: identical, or differing only where the step's own second build said it may
    arts = [m["cnn.int8"]["artifacts"]["npu"] for m in (first, second)]
    said = [r for art in arts for r in art["compile"]["reproducibility"]["rebuilt_in_this_step"]["ranges"]]
    assert all(art["compile"]["reproducibility"]["rebuilt_in_this_step"]["simulated_outputs_identical"]
               for art in arts)
    x, y = ((w.artifacts / art["path"]).read_bytes() for w, art in zip((ws, again), arts))
    assert len(x) == len(y)
    stray = [i for i in range(len(x)) if x[i] != y[i] and not any(s <= i < e for s, e in said)]
    assert stray == [], f"int8: bytes differ outside the ranges the manifest lists: {stray[:20]}"


def test_runner_passes_the_npu_over_here_and_prefer_is_a_clear_error(npu_build):
    from pipeline.core.errors import PipelineError
    from pipeline.app import Runner
    ws, _ = npu_build
    manifest = ws.artifacts / "rk3588" / "manifest.json"
    runner = Runner.open(manifest, "cnn")
    assert runner.choice.abi == "cpu-aarch64"
    assert "passed over npu: this machine has no Rockchip NPU" in runner.choice.explain()
    x = np.load(ws.artifacts / "models" / "cnn" / "golden" / "input_0.npy")
    (probs,) = runner.run(x)
    assert probs.shape == (1, 4)
    with pytest.raises(PipelineError, match="npu: this machine has no Rockchip NPU"):
        Runner.open(manifest, "cnn", prefer="npu")


def _boxes_onnx(path):
    """Conv -> Sigmoid -> x320: a detector's box output in pixels of a 320x320 input (0..320)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(7)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    scale = numpy_helper.from_array(np.array(320.0, np.float32), "scale")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["s", "scale"], ["boxes"])],
        "boxes", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("boxes", TensorProto.FLOAT, [1, 4, 16, 16])],
        initializer=[w, scale])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(model.SerializeToString(deterministic=True))
    return path


@pytest.fixture(scope="module")
def npu_only(tmp_path_factory):
    """The NPU ABI alone (no aarch64 build): `boxes`, whose output is in pixels, and `slow`, given
    a budget of 1 s (the toolkit takes longer than that to start)."""
    from conftest import add_tiny_model, write_spec
    _toolkit()
    root = tmp_path_factory.mktemp("npu-only") / "ws"
    ws = Workspace(root)
    write_spec(ws.models / "boxes", "model.onnx", sha256(_boxes_onnx(ws.models / "boxes" / "model.onnx")))
    slow = add_tiny_model(ws.models, "slow")
    slow.write_text(slow.read_text() + "npu:\n  budget_s: 1\n")
    targets = target_registry(root / "targets", lambda body: body.get("compiler") == "rknn")
    return ws, ws.build("target=rk3588", f"targets={targets}", check=False)


def test_fp16_tolerance_follows_the_outputs_magnitude_on_the_npu(npu_only):
    """An output in 0..320 built fp16 is off by more than the ABI's absolute 0.1 (fp16 holds 0.25
    at 320): held to 4 x eps(fp16) x its largest magnitude, it validates, the bounds recorded."""
    ws, _ = npu_only
    report = json.loads((ws.artifacts / "rk3588" / "boxes" / "npu" / "validate" / "validation.json")
                        .read_text())
    assert report["status"] == "passed" and report["arithmetic"] == "fp16"
    assert report["tolerance"] == {"max_abs": 0.1, "mean_abs": 0.02, "cosine": 0.999}  # as declared
    row = report["outputs"][0]
    bound = row["tolerance"]
    assert 200 < bound["golden_max_abs"] <= 320 and bound["eps"] == 2.0 ** -10 and bound["k"] == 4
    assert bound["max_abs"] == pytest.approx(4 * 2.0 ** -10 * bound["golden_max_abs"])
    assert 0.1 < row["max_abs"] <= bound["max_abs"]   # the declared 0.1 alone would have failed it
    assert row["cosine"] >= 0.999


def test_an_npu_build_past_its_budget_is_stopped_with_a_clear_line(npu_only):
    ws, result = npu_only
    out = result.stdout + result.stderr
    assert result.returncode != 0 and "Traceback" not in out, out
    line = next(l for l in out.splitlines() if "within the step's budget" in l)
    assert ("[model=slow target=rk3588/npu stage=rknn_compile] RKNN-Toolkit2 2.5.0 did not "
            "finish the fp16 build for rk3588 within the step's budget of 1 s (set by the model "
            "spec, npu: {budget_s: 1}); stopped after ") in line, line
    assert "next: leave the model off the NPU in models/slow/model.yaml (`skip: {npu: <why>}`), or, " \
           "if it is known to need longer, raise its budget there (`npu: {budget_s: 60}`)" in out, out
    assert not (ws.artifacts / "rk3588" / "slow" / "npu" / "rknn_compile").exists()
