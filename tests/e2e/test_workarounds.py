"""The GPU path's compiler bugs: `doit bisect` finds the first op a build gets wrong, and each
workaround an ABI declares (pipeline/targets/*.yaml `workarounds:`) is shown to be needed (the
bug reproduces without it: when one of these tests fails that way, IREE fixed the bug and the
workaround can go) and to work (the same build validates with it)."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from conftest import REPO, Workspace, require
from pipeline.run import vulkan

FIXTURE = REPO / "tests/fixtures/ppocr_cls_vulkan_bug"  # Relu -> dw 3x3 s[2,1] -> Relu -> 1x1 -> 1x1 -> Relu -> dw 3x3 -> Relu
PAD_FLAG = "--iree-dispatch-creation-enable-fuse-padding-into-linalg-consumer-ops"


def gpu_registry(folder, vulkan_target: str, workarounds: str = "") -> str:
    """A one-ABI target `gpu` that runs its build as is on lavapipe."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "gpu.yaml").write_text(
        "abis:\n  vk:\n    compiler: iree\n    backend: vulkan-spirv\n"
        f"    vulkan_target: {vulkan_target}\n    run: {{via: vulkan, driver: lavapipe}}\n"
        + workarounds)
    return f"targets={folder}"


@pytest.fixture
def lavapipe():
    devices, why = vulkan.query_devices(vulkan.driver_env("lavapipe"))
    require(bool(devices), f"lavapipe missing: {why}")


def fixture_workspace(tmp_path) -> Workspace:
    ws = Workspace(tmp_path / "ws")
    shutil.copytree(FIXTURE, ws.models / "cls_part")
    return ws


def test_bisect_names_the_depthwise_conv_the_baseline_target_gets_wrong(tmp_path, lavapipe):
    ws = fixture_workspace(tmp_path)
    targets = gpu_registry(tmp_path / "targets", "vp_android_baseline_2022")
    result = ws.doit("bisect", "model=cls_part", "target=gpu", "abi=vk", targets)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "node 1 (Conv) is the first whose output is wrong" in result.stdout
    assert '"group": 24, "kernel_shape": [3, 3]' in result.stdout and "[1, 24, 6, 96]" in result.stdout
    folder = ws.artifacts / "reports/bisect/gpu/cls_part/vk"
    report = json.loads((folder / "report.json").read_text())
    node = report["first_wrong_node"]
    assert (node["op"], node["attributes"]["group"], node["attributes"]["strides"]) == ("Conv", 24, [2, 1])
    assert report["window"]["first"] == report["window"]["last"] == 1  # the conv alone is wrong
    assert len(report["probes"]) <= 6  # bisection, not one build per node
    import onnx
    repro = onnx.load(str(folder / "repro.onnx"))
    assert [n.op_type for n in repro.graph.node] == ["Conv"]
    expected, actual = np.load(folder / "expected_0.npy"), np.load(folder / "actual_0.npy")
    assert np.abs(expected - actual).max() > 1.0  # whole regions wrong, not rounding

    right = gpu_registry(tmp_path / "llvmpipe", "llvmpipe", f"    flags: [{PAD_FLAG}]\n")
    clean = ws.doit("bisect", "model=cls_part", "target=gpu", "abi=vk", right)
    assert clean.returncode == 0 and "matches onnxruntime" in clean.stdout, clean.stdout + clean.stderr
