"""The RK3588 NPU backend end to end, with the real RKNN-Toolkit2 (setup.sh's .tools/rknn-venv):
a small CNN with an int8 and an fp16 variant, built for rk3588's `npu` ABI (and its IREE CPU ABI,
the fallback): fp16 and int8 `.rknn` files, validated in the toolkit's simulator against golden
with the ABI's per-precision tolerance, listed as simulated; rebuilt in another folder, the same
bytes; the runner passes the NPU over on this machine (it has none) and falls back.
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
    from pipeline.run.app import Runner
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
