"""The GPU path's compiler bugs: `doit bisect` finds the first op a build gets wrong, and each
workaround an ABI declares (pipeline/targets/*.yaml `workarounds:`) is shown to be needed (the
bug reproduces without it: when one of these tests fails that way, IREE fixed the bug and the
workaround can go) and to work (the same build validates with it)."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

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


def depthwise_model(models, name="dw", channels=24, kernel=3, strides=(2, 1), pointwise=False,
                    dense=False, h=12) -> None:
    """One depthwise Conv, as in the PP-OCR classifier: the smallest graph the baseline Vulkan
    target computes wrong; `pointwise`: after a 1x1 Conv and a Relu (a MobileNet block); `dense`:
    the same function as a padded dense Conv with block-diagonal weights."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from conftest import sha256, write_spec
    rng = np.random.default_rng(0)
    pad = kernel // 2
    w = 96
    oh, ow = (h + 2 * pad - kernel) // strides[0] + 1, (w + 2 * pad - kernel) // strides[1] + 1
    nodes, weights, x = [], [], "x"
    if pointwise:
        nodes += [helper.make_node("Conv", ["x", "pw"], ["p"], kernel_shape=[1, 1]),
                  helper.make_node("Relu", ["p"], ["r"])]
        weights.append(numpy_helper.from_array(
            (0.3 * rng.standard_normal((channels, channels, 1, 1))).astype(np.float32), "pw"))
        x = "r"
    kernel_weights = rng.standard_normal((channels, 1, kernel, kernel)).astype(np.float32)
    if dense:
        full = np.zeros((channels, channels, kernel, kernel), np.float32)
        full[np.arange(channels), np.arange(channels)] = kernel_weights[:, 0]
        kernel_weights = full
    nodes.append(helper.make_node("Conv", [x, "w", "b"], ["y"], group=1 if dense else channels,
                                  kernel_shape=[kernel, kernel], pads=[pad] * 4, strides=list(strides)))
    graph = helper.make_graph(
        nodes, "main", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, h, w])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels, oh, ow])],
        weights + [numpy_helper.from_array(kernel_weights, "w"),
                   numpy_helper.from_array(rng.standard_normal(channels).astype(np.float32), "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    folder = models / name
    folder.mkdir(parents=True)
    onnx.save(model, str(folder / "model.onnx"))
    write_spec(folder, "model.onnx", sha256(folder / "model.onnx"),
               inputs={"x": ([1, channels, h, w], "float32", 0)})


def _validation(ws, model="dw"):
    path = ws.artifacts / f"gpu/{model}/vk/validate/validation.json"
    return json.loads(path.read_text()) if path.is_file() else None


def declared_workarounds(target="rk3588", abi="vulkan-baseline") -> str:
    """The `workarounds:` block the target registry declares for the ABI, as YAML for gpu_registry."""
    import yaml
    spec = yaml.safe_load((REPO / f"pipeline/targets/{target}.yaml").read_text())
    block = {"workarounds": spec["abis"][abi]["workarounds"]}
    return "".join(f"    {line}\n" for line in yaml.safe_dump(block, sort_keys=False).splitlines())


PAD = (f"    workarounds:\n      - name: pad-fusion\n        flags: [{PAD_FLAG}]\n"
       "        why: padding fused into the producer's store lands at the wrong offsets\n")


@pytest.mark.parametrize("kernel, pointwise", [(3, True), (5, False)])
def test_depthwise_workaround_is_needed_on_the_baseline_target_and_works(tmp_path, lavapipe, kernel, pointwise):
    """rk3588's vulkan-baseline workaround as declared: 3x3 depthwise Convs as Slices (the same
    arithmetic), larger ones as dense Convs (their Slice form is wrong on this target too), both
    padded by zero borders: a padded dense Conv after a 1x1 Conv + Relu is wrong there too."""
    ws = Workspace(tmp_path / "ws")
    channels = 24 if kernel == 3 else 32
    depthwise_model(ws.models, kernel=kernel, channels=channels, pointwise=pointwise)
    bare = ws.build(gpu_registry(tmp_path / "bare", "vp_android_baseline_2022"), check=False)
    assert bare.returncode != 0 and "[model=dw target=gpu/vk stage=validate] outputs differ" in \
        bare.stdout + bare.stderr, "the bug is gone: drop the depthwise workaround"
    if pointwise:  # why the rewrites pad by Concat: the pad-fusion bug meets a padded dense Conv
        other = Workspace(tmp_path / "dense")
        depthwise_model(other.models, name="dwd", channels=32, pointwise=True, dense=True, h=6)
        dense = other.build(gpu_registry(tmp_path / "bare", "vp_android_baseline_2022"), check=False)
        assert dense.returncode != 0 and "[model=dwd target=gpu/vk stage=validate] outputs differ" in \
            dense.stdout + dense.stderr, "a padded dense Conv after 1x1 + Relu is right now: the borders may go"
    fixed = ws.build(gpu_registry(tmp_path / "fixed", "vp_android_baseline_2022", declared_workarounds()))
    assert "iree_compile:gpu/dw/vk" in fixed.stdout
    assert _validation(ws)["status"] == "passed"
    compiled = json.loads((ws.artifacts / "gpu/dw/vk/iree_compile/compile.json").read_text())
    (workaround,) = compiled["workarounds"]
    took = {r["rewrite"]: r["nodes"] for r in workaround["rewrites"]}
    assert bool(took["depthwise_conv3x3_as_slices"]) == (kernel == 3)
    assert bool(took["depthwise_conv_as_dense"]) == (kernel != 3)
    entry = json.loads((ws.artifacts / "gpu/manifest.json").read_text())["models"]["dw"]
    assert entry["artifacts"]["vk"]["compile"]["workarounds"][0]["name"] == workaround["name"]


def test_pad_fusion_workaround_is_needed_on_llvmpipe_and_works(tmp_path, lavapipe):
    """The classifier fixture on IREE's llvmpipe target (the Mali build's twin): wrong without
    the flag, right with it."""
    ws = fixture_workspace(tmp_path)
    bare = ws.build(gpu_registry(tmp_path / "bare", "llvmpipe"), check=False)
    assert bare.returncode != 0 and "[model=cls_part target=gpu/vk stage=validate] outputs differ" in \
        bare.stdout + bare.stderr, "the bug is gone: drop the pad-fusion workaround"
    ws.build(gpu_registry(tmp_path / "fixed", "llvmpipe", PAD))
    assert _validation(ws, "cls_part")["status"] == "passed"
    compiled = json.loads((ws.artifacts / "gpu/cls_part/vk/iree_compile/compile.json").read_text())
    assert PAD_FLAG in compiled["flags"] and compiled["workarounds"][0]["name"] == "pad-fusion"
    shaders = [p for p in Path(os.environ["MODELYARD_SHADER_CACHE"]).rglob("*") if p.is_file()]
    assert shaders, "lavapipe kept no compiled kernel in the shader cache"
