"""Graph rewrites for speed (pipeline/rewrite/abi_rewrites.py), each checked against onnxruntime
on the original graph, and compiled by IREE for the host and compared again; plus the IREE bug
that decides how the ConvTranspose rewrite is written (DepthToSpace mode CRD imported wrong)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from families.conv1d import CASES as CONV1D_CASES
from families.conv1d import IREE_CASES as CONV1D_IREE_CASES
from families.conv1d import other_convs
from pipeline.rewrite.abi_rewrites import conv_transpose_as_depth_to_space, nearest_resize_as_expand

BIN = Path(sys.executable).parent
HOST = ["--iree-hal-target-device=local", "--iree-hal-local-target-device-backends=llvm-cpu",
        "--iree-llvmcpu-target-triple=x86_64-linux-gnu", "--iree-llvmcpu-target-cpu=x86-64-v3"]


def relu_op_relu(x_shape, op_type: str, inputs: list[str], inits: dict, **attrs):
    """x[x_shape] -> Relu -> r -> op_type("r", *inputs) named "op" -> Relu -> y, where inputs
    name arrays of inits (or are "", an omitted input), opset 13."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node(op_type, ["r", *inputs], ["t"], name="op", **attrs),
             helper.make_node("Relu", ["t"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", "c", "h", "w"])],
                              [numpy_helper.from_array(array, name) for name, array in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model)
    return model


def weights(shape, bias: int | None, seed: int = 0) -> dict:
    """Random weights W of shape (and a bias B of that many channels)."""
    rng = np.random.default_rng(seed)
    found = {"W": rng.standard_normal(shape).astype(np.float32)}
    if bias:
        found["B"] = rng.standard_normal(bias).astype(np.float32)
    return found


def upsampling_model(kernel: int, bias: bool, seed: int = 0, **attrs):
    """x[1, 8, 5, 7] -> Relu -> ConvTranspose(8 -> 6, kernel x kernel) -> Relu"""
    inits = weights((8, 6, kernel, kernel), 6 if bias else None, seed)
    attrs = {"kernel_shape": [kernel, kernel], "strides": [kernel, kernel], **attrs}
    return relu_op_relu([1, 8, 5, 7], "ConvTranspose", list(inits), inits, **attrs)


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
    assert conv_transpose_as_depth_to_space(model) == ["op"]
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
        from onnx import helper
        model.graph.node[1].attribute.append(helper.make_attribute("group", 2))
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
    inits = weights((8, 1, kernel, kernel), 8 if bias else None, seed)
    pad = {"auto_pad": auto_pad} if auto_pad else {"pads": [kernel // 2, kernel // 2 - 1 + kernel % 2, kernel // 2, 0]}
    return relu_op_relu([1, 8, 9, 11], "Conv", list(inits), inits, group=8, kernel_shape=[kernel, kernel],
                        strides=list(strides), **pad)


DW_X = np.random.default_rng(8).standard_normal((1, 8, 9, 11)).astype(np.float32)


@pytest.mark.parametrize("rewrite", ["depthwise_conv_as_slices", "depthwise_conv_as_slice_chunks",
                                     "depthwise_conv_as_dense"])
@pytest.mark.parametrize("kernel,strides,bias,auto_pad", [(3, (1, 1), True, None), (3, (2, 1), False, None),
                                                          (5, (2, 2), True, None), (3, (2, 2), True, "SAME_UPPER"),
                                                          (5, (1, 2), False, "SAME_LOWER"), (3, (1, 1), True, "VALID")])
def test_depthwise_rewrites_are_the_same_function(rewrite, kernel, strides, bias, auto_pad, tmp_path):
    """The depthwise forms (the baseline Vulkan workaround; the Slice form is also a CPU speed
    candidate): onnxruntime and IREE's host build of the rewritten graph agree with the Conv,
    explicit, asymmetric and automatic padding alike."""
    from pipeline.rewrite.abi_rewrites import REWRITES
    model = depthwise_model(kernel, strides, bias, auto_pad)
    expected = ort_run(model, DW_X)
    assert REWRITES[rewrite](model) == ["op"]
    ops = {n.op_type for n in model.graph.node}
    assert ("Slice" in ops and "Sum" in ops) if "slice" in rewrite else ("Conv" in ops)
    assert ("ReduceSum" in ops) == (rewrite.endswith("chunks") and kernel > 3)
    conv = [n for n in model.graph.node if n.op_type == "Conv"]
    assert all(a.i == 1 for n in conv for a in n.attribute if a.name == "group")
    assert not [a for n in conv for a in n.attribute if a.name == "pads" and any(a.ints)]  # padded before, not by the Conv
    tol = 1e-5 * np.abs(expected).max()
    assert np.abs(ort_run(model, DW_X) - expected).max() <= tol
    assert np.abs(iree_run(model, DW_X, tmp_path) - expected).max() <= tol


@pytest.mark.parametrize("opset", [11, 13])
def test_slice_chunks_sum_a_5x5_kernel_in_chunks_of_7_and_keep_3x3_as_one_sum(opset):
    """A 5x5 kernel's 25 taps + bias in 4 Sums of at most 7 terms (IREE fuses at most 16
    operands into one op, two per tap), stacked and reduced; a 3x3 kernel exactly as
    depthwise_conv_as_slices writes it; axes as attributes below opset 13."""
    from pipeline.rewrite.abi_rewrites import depthwise_conv_as_slice_chunks, depthwise_conv_as_slices
    model = depthwise_model(5, (1, 1), True)
    model.opset_import[0].version = opset
    expected = ort_run(model, DW_X)
    assert depthwise_conv_as_slice_chunks(model) == ["op"]
    sums = [n for n in model.graph.node if n.op_type == "Sum"]
    assert sorted(len(n.input) for n in sums) == [5, 7, 7, 7]
    reduce, = [n for n in model.graph.node if n.op_type == "ReduceSum"]
    assert (len(reduce.input) == 1) == (opset < 13)  # axes: an attribute before 13, an input since
    assert np.abs(ort_run(model, DW_X) - expected).max() <= 1e-5 * np.abs(expected).max()
    small, same = depthwise_model(3, (2, 1), True), depthwise_model(3, (2, 1), True)
    assert depthwise_conv_as_slice_chunks(small) == depthwise_conv_as_slices(same) == ["op"]
    assert small.SerializeToString(deterministic=True) == same.SerializeToString(deterministic=True)


def test_depthwise_conv3x3_as_slices_leaves_larger_kernels_alone():
    from pipeline.rewrite.abi_rewrites import REWRITES, depthwise_conv3x3_as_slices
    model = depthwise_model(5, (1, 1), True)
    before = model.SerializeToString()
    assert depthwise_conv3x3_as_slices(model) == []
    assert model.SerializeToString() == before
    model = depthwise_model(3, (1, 1), True)
    assert depthwise_conv3x3_as_slices(model) == ["op"]
    # the Vulkan workaround pads by Concat (a Pad meets IREE's pad-fusion bug there); the CPU
    # speed form by one Pad, which IREE fuses on CPUs where the Concat is a copy
    ops = [n.op_type for n in model.graph.node]
    assert "Concat" in ops and "Pad" not in ops
    model = depthwise_model(3, (1, 1), True)
    assert REWRITES["depthwise_conv_as_slices"](model) == ["op"]
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("Pad") == 1 and "Concat" not in ops


def resize_model(scales=None, sizes=None, **attrs):
    """x[1, 8, 5, 7] -> Relu -> Resize (by scales or to sizes) -> Relu"""
    inits = {"scales": np.array(scales, np.float32)} if scales else {"sizes": np.array(sizes, np.int64)}
    inputs = ["", "scales"] if scales else ["", "", "sizes"]
    return relu_op_relu([1, 8, 5, 7], "Resize", inputs, inits, **attrs)


NEAREST = {"mode": "nearest"}


@pytest.mark.parametrize("scales,sizes,attrs", [
    ([1, 1, 2, 2], None, {**NEAREST, "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}),
    ([1, 1, 8, 4], None, {**NEAREST, "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}),
    ([1, 1, 3, 1], None, NEAREST),   # ONNX's defaults: half_pixel, round_prefer_floor
    (None, [1, 8, 20, 14], {**NEAREST, "coordinate_transformation_mode": "pytorch_half_pixel",
                            "nearest_mode": "round_prefer_ceil"}),
    ([1, 2, 2, 2], None, {**NEAREST, "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}),
])
def test_nearest_resize_as_expand_is_the_same_function(scales, sizes, attrs, tmp_path):
    """A nearest upsampling by whole factors (ppocr_det's FPN: x2, x4, x8) as Reshape + Expand +
    Reshape copies the very elements: equal to onnxruntime's Resize, bit for bit, and IREE's build
    of the rewritten graph too."""
    model = resize_model(scales, sizes, **attrs)
    expected = ort_run(model, X)
    assert nearest_resize_as_expand(model) == ["op"]
    assert [n.op_type for n in model.graph.node] == ["Relu", "Reshape", "Expand", "Reshape", "Relu"]
    assert np.array_equal(ort_run(model, X), expected)
    assert np.array_equal(iree_run(model, X, tmp_path), expected)


@pytest.mark.parametrize("scales,attrs", [
    ([1, 1, 2, 2], {"mode": "linear"}),
    ([1, 1, 4, 4], {**NEAREST, "coordinate_transformation_mode": "asymmetric"}),  # round_prefer_floor of i/4
    ([1, 1, 2, 2], {**NEAREST, "coordinate_transformation_mode": "align_corners"}),
    ([1, 1, 1.5, 2], NEAREST),     # not a whole factor
    ([1, 1, 0.5, 1], NEAREST),     # shrinking
])
def test_other_resizes_are_left_alone(scales, attrs):
    """Modes whose source index is not floor(i / factor), and factors that are not whole."""
    model = resize_model(scales, **attrs)
    before = model.SerializeToString()
    assert nearest_resize_as_expand(model) == []
    assert model.SerializeToString() == before


def dense_model(kernel: int, strides, bias: bool, group: int = 1, **pad):
    """x[1, 8, 9, 11] -> Relu -> Conv (8 -> 8, kernel x kernel, group) -> Relu"""
    inits = weights((8, 8 // group, kernel, kernel), 8 if bias else None)
    return relu_op_relu([1, 8, 9, 11], "Conv", list(inits), inits, group=group, kernel_shape=[kernel, kernel],
                        strides=list(strides), **pad)


@pytest.mark.parametrize("kernel,strides,bias,pad", [(3, (2, 2), True, {"pads": [1, 1, 1, 1]}),
                                                     (2, (2, 2), False, {"auto_pad": "SAME_UPPER"}),
                                                     (3, (2, 1), True, {"pads": [1, 0, 0, 1]})])
def test_strided_conv_as_im2col_is_the_same_function(kernel, strides, bias, pad, tmp_path):
    """A strided dense Conv as Pad + one Slice per tap + Concat + 1x1 Conv: onnxruntime and IREE's
    host build of the rewritten graph agree with the Conv."""
    from pipeline.rewrite.abi_rewrites import strided_conv_as_im2col
    model = dense_model(kernel, strides, bias, **pad)
    expected = ort_run(model, DW_X)
    assert strided_conv_as_im2col(model) == ["op"]
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("Slice") == kernel * kernel and ops.count("Concat") == 1 and ops.count("Conv") == 1
    conv = next(n for n in model.graph.node if n.op_type == "Conv")
    assert [list(a.ints) for a in conv.attribute if a.name == "kernel_shape"] == [[1, 1]]
    tol = 1e-5 * np.abs(expected).max()
    assert np.abs(ort_run(model, DW_X) - expected).max() <= tol
    assert np.abs(iree_run(model, DW_X, tmp_path) - expected).max() <= tol


@pytest.mark.parametrize("kernel,strides,group", [(3, (1, 1), 1), (1, (2, 2), 1), (3, (2, 2), 8)])
def test_strided_conv_as_im2col_leaves_the_others_alone(kernel, strides, group):
    """Stride 1 (IREE's own code is the faster there), 1x1 (already a matrix product), depthwise."""
    from pipeline.rewrite.abi_rewrites import strided_conv_as_im2col
    model = dense_model(kernel, strides, True, group, pads=[kernel // 2] * 4)
    before = model.SerializeToString()
    assert strided_conv_as_im2col(model) == []
    assert model.SerializeToString() == before


# ----------------------------------------------------------------------------- 1-D convolutions


def _conv1d_rewritten(case):
    """(expected output by onnxruntime on the case's graph, the graph rewritten, its input)."""
    from pipeline.rewrite.abi_rewrites import conv1d_as_matmul
    model, x = case.model(), case.input()
    expected = ort_run(model, x)
    assert conv1d_as_matmul(model) == ["conv"]
    return expected, model, x


@pytest.mark.parametrize("case", CONV1D_CASES, ids=lambda c: c.id)
def test_conv1d_as_matmul_is_the_same_function(case):
    """Every Conv along one axis of the family (kernels 1-15 and 64, strides, dilations, groups,
    depthwise, auto_pad, NCW / TensorFlow's NWC through a 2-D Conv / a line along H, a batch of
    2) becomes im2col along the line (one Gather) + one MatMul (a depthwise one: weighted
    Slices, summed in Sums of at most 7 terms and one more), and onnxruntime gives the Conv's
    numbers."""
    expected, model, x = _conv1d_rewritten(case)
    ops = [n.op_type for n in model.graph.node]
    assert "Conv" not in ops
    depthwise = case.group == case.cin == case.cout
    if depthwise:
        assert "MatMul" not in ops and ops.count("Mul") == case.kernel
        assert all(len(n.input) <= 2 * 7 for n in model.graph.node if n.op_type == "Sum")
    else:  # the columns by one Gather of the padded line
        assert ops.count("MatMul") == 1 and ops.count("Gather") == 1 and "Slice" not in ops
    assert np.abs(ort_run(model, x) - expected).max() <= 1e-5 * np.abs(expected).max()


def test_conv1d_as_matmul_compiles_to_the_same_function_with_iree(tmp_path):
    """IREE's host build of the rewritten family (one graph, one case per form: dense, strided
    SAME_UPPER, grouped, depthwise, batched, a 64-tap STFT, TensorFlow's NWC) gives onnxruntime's numbers on
    the Convs."""
    import iree.runtime as rt
    import onnx
    import onnxruntime as ort
    from families.conv1d import combined
    from pipeline.rewrite.abi_rewrites import conv1d_as_matmul
    model = combined(CONV1D_IREE_CASES)
    xs = [case.input(seed=i) for i, case in enumerate(CONV1D_IREE_CASES)]
    feeds = {f"x{i}": x for i, x in enumerate(xs)}
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    assert conv1d_as_matmul(model) == [f"c{i}/conv" for i in range(len(xs))]
    onnx.save(model, tmp_path / "m.onnx")
    subprocess.run([BIN / "iree-import-onnx", tmp_path / "m.onnx", "-o", tmp_path / "m.mlir"],
                   check=True, capture_output=True)
    subprocess.run([BIN / "iree-compile", tmp_path / "m.mlir", *HOST, "--iree-opt-data-tiling",
                    "-o", tmp_path / "m.vmfb"], check=True, capture_output=True)
    module = rt.load_vm_flatbuffer_file(str(tmp_path / "m.vmfb"), driver="local-sync")
    got = module.conv1d_family(*xs)
    for case, want, have in zip(CONV1D_IREE_CASES, expected, got):
        have = np.asarray(have.to_host())
        assert have.shape == want.shape, case.id
        assert np.abs(have - want).max() <= 1e-5 * np.abs(want).max(), case.id


@pytest.mark.parametrize("name,model,x", other_convs(), ids=lambda v: v if isinstance(v, str) else "")
def test_conv1d_as_matmul_leaves_the_others_alone(name, model, x):
    """2-D Convs over an image (a 1xk kernel included), a kernel across the unit axis, weights
    computed in the graph, a depthwise kernel above 32 taps: not rewritten, the same bytes (the
    config builds the default's)."""
    from pipeline.rewrite.abi_rewrites import conv1d_as_matmul
    before = model.SerializeToString()
    assert conv1d_as_matmul(model) == []
    assert model.SerializeToString() == before


# ----------------------------------------------------------------------------- 1x1 Convs
def pointwise_model(cin: int, cout: int, bias: bool, batch: int = 1, **attrs):
    """x[batch, cin, 6, 9] -> Relu -> Conv (cin -> cout, 1x1) -> Relu"""
    inits = weights((cout, cin, 1, 1), cout if bias else None, seed=cin + cout)
    return relu_op_relu([batch, cin, 6, 9], "Conv", list(inits), inits, kernel_shape=[1, 1], **attrs)


@pytest.mark.parametrize("cin,cout,bias,batch", [(8, 12, True, 1), (16, 4, False, 1), (5, 7, True, 2)])
def test_pointwise_conv_as_matmul_is_the_same_function(cin, cout, bias, batch, tmp_path):
    """A 1x1 Conv as Reshape to [C, H*W] + MatMul (+ bias) + Reshape: onnxruntime gives the Conv's
    numbers (a batch of 2 included), and so does IREE's host build of the first case."""
    from pipeline.rewrite.abi_rewrites import pointwise_conv_as_matmul
    model = pointwise_model(cin, cout, bias, batch)
    x = np.random.default_rng(cin).standard_normal((batch, cin, 6, 9)).astype(np.float32)
    expected = ort_run(model, x)
    assert pointwise_conv_as_matmul(model) == ["op"]
    ops = [n.op_type for n in model.graph.node]
    assert "Conv" not in ops and ops.count("MatMul") == 1 and ops.count("Add") == int(bias)
    tol = 1e-5 * np.abs(expected).max()
    assert np.abs(ort_run(model, x) - expected).max() <= tol
    if (cin, cout) == (8, 12):
        assert np.abs(iree_run(model, x, tmp_path) - expected).max() <= tol


@pytest.mark.parametrize("attrs", [{"strides": [2, 2]}, {"pads": [1, 1, 1, 1]}, {"group": 2}],
                         ids=["strided", "padded", "grouped"])
def test_pointwise_conv_as_matmul_leaves_the_others_alone(attrs):
    """Strided, padded and grouped 1x1 Convs, and every larger kernel: not rewritten."""
    from pipeline.rewrite.abi_rewrites import pointwise_conv_as_matmul
    group = attrs.get("group", 1)
    inits = weights((8, 8 // group, 1, 1), 8)
    model = relu_op_relu([1, 8, 6, 9], "Conv", list(inits), inits, kernel_shape=[1, 1], **attrs)
    larger = dense_model(3, (1, 1), True, pads=[1, 1, 1, 1])
    for m in (model, larger):
        before = m.SerializeToString()
        assert pointwise_conv_as_matmul(m) == []
        assert m.SerializeToString() == before
