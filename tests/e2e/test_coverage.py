"""Op coverage: the IREE rules and TVM's converter map against the real compilers, on tiny models.

Every rule of pipeline/stages/coverage.py's IREE table is reproduced here with the real iree-compile,
and so are the claims that did not reproduce (they must keep compiling, or the table needs
them): a new IREE or TVM that changes either shows up in this file first.
"""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from pipeline.stages import coverage

RNG = np.random.default_rng(0)
H = 8


def T(name, shape, dtype=TP.FLOAT):
    return helper.make_tensor_value_info(name, dtype, shape)


def W(name, shape):
    return numpy_helper.from_array(RNG.standard_normal(shape).astype(np.float32), name)


def model(nodes, inputs, outputs, inits=()):
    graph = helper.make_graph(nodes, "main", inputs, outputs, initializer=list(inits))
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return onnx.shape_inference.infer_shapes(m, strict_mode=True)


def conv1d(length, stride, pad):
    out = (length + 2 * pad - 3) // stride + 1
    return model([helper.make_node("Conv", ["x", "w"], ["y"], strides=[stride], pads=[pad, pad])],
                 [T("x", [1, 4, length])], [T("y", [1, 4, out])], [W("w", (4, 4, 3))])


def conv2d(size, stride, pad):
    out = (size + 2 * pad - 3) // stride + 1
    return model([helper.make_node("Conv", ["x", "w"], ["y"], strides=[stride] * 2, pads=[pad] * 4)],
                 [T("x", [1, 4, size, size])], [T("y", [1, 4, out, out])], [W("w", (4, 4, 3, 3))])


def recurrent(op, direction):
    gates = {"GRU": 3, "LSTM": 4, "RNN": 1}[op]
    d = 2 if direction == "bidirectional" else 1
    return model([helper.make_node(op, ["x", "W", "R"], ["y", "h"], hidden_size=H, direction=direction)],
                 [T("x", [3, 1, 4])], [T("y", [3, d, 1, H]), T("h", [d, 1, H])],
                 [W("W", (d, gates * H, 4)), W("R", (d, gates * H, H))])


def if_model(cond_shape):
    then = helper.make_graph([helper.make_node("Relu", ["x"], ["t"])], "then", [], [T("t", [1, 4])])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [], [T("e", [1, 4])])
    return model([helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)],
                 [T("c", cond_shape, TP.BOOL), T("x", [1, 4])], [T("y", [1, 4])])


def loop_model():
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Add", ["v_in", "one"], ["v_out"])], "body",
        [T("i", [], TP.INT64), T("cond_in", [], TP.BOOL), T("v_in", [1, 4])],
        [T("cond_out", [], TP.BOOL), T("v_out", [1, 4])],
        initializer=[numpy_helper.from_array(np.ones((1, 4), np.float32), "one")])
    return model([helper.make_node("Loop", ["n", "c", "x"], ["y"], body=body)],
                 [T("x", [1, 4])], [T("y", [1, 4])],
                 [numpy_helper.from_array(np.array(3, np.int64), "n"),
                  numpy_helper.from_array(np.array(True), "c")])


def reflect_pad_3d():
    return model([helper.make_node("Pad", ["x", "p"], ["y"], mode="reflect")],
                 [T("x", [1, 4, 8])], [T("y", [1, 4, 12])],
                 [numpy_helper.from_array(np.array([0, 0, 2, 0, 0, 2], np.int64), "p")])


# name -> (model, IREE compiles it?, TVM imports it?)
CASES = {
    "conv1d stride 2, 2 long (1 out, 1 left over)": (lambda: conv1d(2, 2, 1), False, True),
    "conv1d stride 2, 4 long, no pad (1 out, 1 left)": (lambda: conv1d(4, 2, 0), False, True),
    "conv2d stride 3, 5x5 (1 out, 2 left over)": (lambda: conv2d(5, 3, 0), False, True),
    "conv1d stride 2, 4 long, pad 1 (2 out)": (lambda: conv1d(4, 2, 1), True, True),
    "conv1d stride 2, 3 long, no pad (1 out, none left)": (lambda: conv1d(3, 2, 0), True, True),
    "GRU bidirectional": (lambda: recurrent("GRU", "bidirectional"), False, False),
    "GRU forward": (lambda: recurrent("GRU", "forward"), True, False),
    "RNN bidirectional": (lambda: recurrent("RNN", "bidirectional"), False, False),
    "LSTM bidirectional": (lambda: recurrent("LSTM", "bidirectional"), True, False),
    "If with a [1]-shaped condition": (lambda: if_model([1]), True, True),
    "Loop": (loop_model, True, False),
    "reflect Pad on a 3-D tensor": (reflect_pad_3d, True, True),
}


def iree_compiles(path, tmp_path) -> tuple[bool, str]:
    from iree.compiler.tools.binaries import find_tool
    from pipeline.compilers.iree_compiler import compile_flags
    config = {"backend": "llvm-cpu", "triple": "x86_64-linux-gnu", "cpu": "x86-64-v3",
              "cpu_features": [], "flags": []}
    mlir = tmp_path / "m.mlir"
    steps = [[sys.executable, "-m", "iree.compiler.tools.import_onnx", str(path), "-o", str(mlir)],
             [find_tool("iree-compile"), str(mlir), *compile_flags(config), "-o", str(tmp_path / "m.vmfb")]]
    for argv in steps:
        proc = subprocess.run(argv, capture_output=True, text=True)
        if proc.returncode:
            return False, proc.stderr
    return True, ""


def tvm_imports(path) -> tuple[bool, str]:
    proc = subprocess.run([sys.executable, "-m", "pipeline.stages.coverage", "--tvm-import", str(path)],
                          capture_output=True, text=True)
    return proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("name", list(CASES))
def test_prediction_matches_the_real_compilers(name, tmp_path):
    make, iree_ok, tvm_ok = CASES[name]
    m = make()
    path = tmp_path / "m.onnx"
    onnx.save(m, path)
    predicted = coverage.predict_model(m, coverage.tvm_supported_ops())
    iree_real, iree_log = iree_compiles(path, tmp_path)
    tvm_real, tvm_log = tvm_imports(path)
    assert (iree_real, tvm_real) == (iree_ok, tvm_ok), (iree_log[-800:], tvm_log[-800:])
    assert (not predicted["iree"]) == iree_ok, predicted["iree"]
    assert (not predicted["tvm"]) == tvm_ok, predicted["tvm"]
    if not iree_ok:
        op = m.graph.node[0].op_type
        assert [p["op"] for p in predicted["iree"]] == [op] and "reproduced on IREE" in predicted["iree"][0]["basis"]
        assert ("onnx." + op in iree_log) or ("found 3" in iree_log or "but found" in iree_log)
    if not tvm_ok:
        assert f"not supported for frontend ONNX: {m.graph.node[0].op_type}" in tvm_log


def test_prediction_walks_subgraphs_and_names_the_node():
    inner = helper.make_graph([helper.make_node("GRU", ["x", "W", "R"], ["y", "h"], hidden_size=H,
                                                direction="bidirectional", name="enc")],
                              "then", [], [T("y", [3, 2, 1, H]), T("h", [2, 1, H])],
                              initializer=[W("W", (2, 3 * H, 4)), W("R", (2, 3 * H, H))])
    other = helper.make_graph([helper.make_node("GRU", ["x", "W2", "R2"], ["y2", "h2"], hidden_size=H)],
                              "else", [], [T("y2", [3, 1, 1, H]), T("h2", [1, 1, H])],
                              initializer=[W("W2", (1, 3 * H, 4)), W("R2", (1, 3 * H, H))])
    m = model([helper.make_node("If", ["c"], ["y", "h"], then_branch=inner, else_branch=other,
                                name="pick")],
              [T("c", [], TP.BOOL), T("x", [3, 1, 4])], [T("y", None), T("h", None)])
    predicted = coverage.predict_model(m, coverage.tvm_supported_ops())
    assert [(p["op"], p["node"]) for p in predicted["iree"]] == [("GRU", "pick/then_branch/enc")]
    assert predicted["iree"][0]["why"].endswith("direction=bidirectional")
    assert sorted(p["node"] for p in predicted["tvm"]) == ["pick/else_branch/GRU_0", "pick/then_branch/enc"]
    assert predicted["ops"] == {"GRU": 2, "If": 1}
    assert coverage.ops_text(predicted["tvm"]) == "GRU (2x: no converter in TVM's ONNX frontend)"
