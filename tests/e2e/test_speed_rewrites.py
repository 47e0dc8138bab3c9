"""Graph rewrites for speed (pipeline/stages/abi_rewrites.py), each checked against onnxruntime
on the original graph, and compiled by IREE for the host and compared again; plus the IREE bug
that decides how the ConvTranspose rewrite is written (DepthToSpace mode CRD imported wrong)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pipeline.stages.abi_rewrites import conv_transpose_as_depth_to_space

BIN = Path(sys.executable).parent
HOST = ["--iree-hal-target-device=local", "--iree-hal-local-target-device-backends=llvm-cpu",
        "--iree-llvmcpu-target-triple=x86_64-linux-gnu", "--iree-llvmcpu-target-cpu=x86-64-v3"]


def upsampling_model(kernel: int, bias: bool, seed: int = 0, **attrs):
    """x[1, 8, 5, 7] -> Relu -> ConvTranspose(8 -> 6, kernel x kernel) -> Relu"""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 6, kernel, kernel)).astype(np.float32), "W")]
    inputs = ["r", "W"]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(6).astype(np.float32), "B"))
        inputs.append("B")
    attrs = {"kernel_shape": [kernel, kernel], "strides": [kernel, kernel], **attrs}
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("ConvTranspose", inputs, ["t"], name="up", **attrs),
             helper.make_node("Relu", ["t"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 5, 7])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", "c", "h", "w"])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model)
    return model


def ort_run(model, x):
    import onnxruntime as ort
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def iree_run(model, x, folder: Path):
    import iree.runtime as rt
    import onnx
    onnx.save(model, folder / "m.onnx")
    subprocess.run([BIN / "iree-import-onnx", folder / "m.onnx", "--opset-version", "17", "-o",
                    folder / "m.mlir"], check=True, capture_output=True)
    subprocess.run([BIN / "iree-compile", folder / "m.mlir", *HOST, "-o", folder / "m.vmfb"],
                   check=True, capture_output=True)
    module = rt.load_vm_flatbuffer_file(str(folder / "m.vmfb"), driver="local-sync")
    return np.asarray(module.g(x).to_host())


X = np.random.default_rng(7).standard_normal((1, 8, 5, 7)).astype(np.float32)


@pytest.mark.parametrize("kernel,bias", [(2, True), (2, False), (3, True)])
def test_conv_transpose_as_depth_to_space_is_the_same_function(kernel, bias, tmp_path):
    model = upsampling_model(kernel, bias)
    expected = ort_run(model, X)
    assert conv_transpose_as_depth_to_space(model) == ["up"]
    assert [n.op_type for n in model.graph.node] == ["Relu", "Conv", "DepthToSpace", "Relu"]
    assert np.abs(ort_run(model, X) - expected).max() <= 1e-5 * np.abs(expected).max()
    # and IREE compiles the rewritten graph right (the DCR form, see the next test)
    assert np.abs(iree_run(model, X, tmp_path) - expected).max() <= 1e-5 * np.abs(expected).max()


@pytest.mark.parametrize("attrs", [{"pads": [1, 1, 1, 1]}, {"group": 2}, {"output_padding": [1, 1]},
                                   {"strides": [1, 1]}])
def test_other_conv_transposes_are_left_alone(attrs):
    kernel = 2
    if "group" in attrs:   # a grouped ConvTranspose has in/group input channels per filter
        model = upsampling_model(kernel, True)
        model.graph.node[1].attribute.append(__import__("onnx").helper.make_attribute("group", 2))
    else:
        model = upsampling_model(kernel, True, **attrs)
    before = model.SerializeToString()
    assert conv_transpose_as_depth_to_space(model) == []
    assert model.SerializeToString() == before


def test_iree_still_imports_depth_to_space_crd_wrong(tmp_path):
    """Why the rewrite emits DCR: IREE 3.13 computes DepthToSpace mode=CRD as DCR. When this
    fails, IREE fixed it (either mode would then do)."""
    import onnx
    from onnx import TensorProto, helper
    x = np.random.default_rng(0).standard_normal((1, 16, 5, 7)).astype(np.float32)
    errors = {}
    for mode in ("CRD", "DCR"):
        node = helper.make_node("DepthToSpace", ["x"], ["y"], blocksize=2, mode=mode)
        graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 5, 7])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 10, 14])])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
        onnx.checker.check_model(model)
        folder = tmp_path / mode
        folder.mkdir()
        errors[mode] = float(np.abs(iree_run(model, x, folder) - ort_run(model, x)).max())
    assert errors["DCR"] == 0.0
    assert errors["CRD"] > 1.0, errors


def depthwise_model(kernel: int, strides, bias: bool, auto_pad: str | None = None, seed: int = 0):
    """x[1, 8, 9, 11] -> Relu -> depthwise Conv (kernel x kernel) -> Relu"""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 1, kernel, kernel)).astype(np.float32), "W")]
    inputs = ["r", "W"]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "B"))
        inputs.append("B")
    pad = {"auto_pad": auto_pad} if auto_pad else {"pads": [kernel // 2, kernel // 2 - 1 + kernel % 2, kernel // 2, 0]}
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Conv", inputs, ["t"], name="dw", group=8, kernel_shape=[kernel, kernel],
                              strides=list(strides), **pad),
             helper.make_node("Relu", ["t"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 9, 11])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", "c", "h", "w"])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model)
    return model


DW_X = np.random.default_rng(8).standard_normal((1, 8, 9, 11)).astype(np.float32)


@pytest.mark.parametrize("rewrite", ["depthwise_conv_as_slices", "depthwise_conv_as_dense"])
@pytest.mark.parametrize("kernel,strides,bias,auto_pad", [(3, (1, 1), True, None), (3, (2, 1), False, None),
                                                          (5, (2, 2), True, None), (3, (2, 2), True, "SAME_UPPER"),
                                                          (5, (1, 2), False, "SAME_LOWER"), (3, (1, 1), True, "VALID")])
def test_depthwise_rewrites_are_the_same_function(rewrite, kernel, strides, bias, auto_pad, tmp_path):
    """The depthwise forms (the baseline Vulkan workaround; the Slice form is also a CPU speed
    candidate): onnxruntime and IREE's host build of the rewritten graph agree with the Conv,
    explicit, asymmetric and automatic padding alike."""
    from pipeline.stages.abi_rewrites import REWRITES
    model = depthwise_model(kernel, strides, bias, auto_pad)
    expected = ort_run(model, DW_X)
    assert REWRITES[rewrite](model) == ["dw"]
    ops = {n.op_type for n in model.graph.node}
    assert ("Slice" in ops and "Sum" in ops) if rewrite.endswith("slices") else ("Conv" in ops)
    conv = [n for n in model.graph.node if n.op_type == "Conv"]
    assert all(a.i == 1 for n in conv for a in n.attribute if a.name == "group")
    assert not [a for n in conv for a in n.attribute if a.name == "pads" and any(a.ints)]  # borders by Concat
    tol = 1e-5 * np.abs(expected).max()
    assert np.abs(ort_run(model, DW_X) - expected).max() <= tol
    assert np.abs(iree_run(model, DW_X, tmp_path) - expected).max() <= tol


def test_depthwise_conv3x3_as_slices_leaves_larger_kernels_alone():
    from pipeline.stages.abi_rewrites import depthwise_conv3x3_as_slices
    model = depthwise_model(5, (1, 1), True)
    before = model.SerializeToString()
    assert depthwise_conv3x3_as_slices(model) == []
    assert model.SerializeToString() == before
    assert depthwise_conv3x3_as_slices(depthwise_model(3, (1, 1), True)) == ["dw"]
