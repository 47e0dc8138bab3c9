"""The static stage's graph surgery (pipeline/rewrite/static_rewrites.py) and its second simplifier.

Each rewrite class on a small graph built with onnx.helper, checked against onnxruntime on the
original graph; then through the stage itself (static.json records it, golden still checked)
on a tiny model and on the public models where that is cheap.
"""
from __future__ import annotations

import json
import shutil

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from conftest import FIXTURES, add_fixture_model, sha256
from pipeline import graph
from pipeline.core.errors import PipelineError
from pipeline.core.steps import execute
from pipeline.rewrite import static_rewrites as rewrites
from pipeline.stages import static
from pipeline.rewrite.static_rewrites import Facts

RNG = np.random.default_rng(0)


def _run(model, feeds: dict) -> list:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"]).run(None, feeds)


def _model(nodes, inputs, outputs, inits=(), opset=17, extra_opsets=()):
    g = h.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return h.make_model(g, opset_imports=[h.make_opsetid("", opset), *extra_opsets])


def _w(*shape, scale=0.3):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def _spec(folder, source: str, inputs: dict, tolerance="{max_abs: 1.0e-4, mean_abs: 1.0e-5, cosine: 0.99999}"):
    lines = ["description: static rewrite test", "source:", f"  path: {source}",
             f"  sha256: {sha256(folder / source)}", "inputs:"]
    for name, (shape, dtype, low, high) in inputs.items():
        lines += [f"  {name}:", f"    shape: {shape}", f"    dtype: {dtype}",
                  f"    test_data: {{random: {{seed: 0, low: {low}, high: {high}}}}}"]
    lines.append(f"tolerance: {tolerance}")
    (folder / "model.yaml").write_text("\n".join(lines) + "\n")


def _static(tmp_path, name: str):
    """Run import, golden and static for one model of tmp_path/models; static.json and model."""
    proj = graph.load_project(tmp_path / "models", tmp_path / "artifacts", "host")
    for stage in ("import", "golden", "static"):
        step = next(s for s in proj.steps(stage) if s.name == name)
        execute(step)
    return json.loads((step.out_dir / "static.json").read_text()), onnx.load(str(step.out_dir / "model.onnx"))


def _ops(model) -> set[str]:
    return {n.op_type for n in model.graph.node}


# ----------------------------------------------------------------------------- If / Where
def _if_on_rate():
    """y = If(sr == 16000) then Relu(x * w) [1, 4] else Concat(x, x) [1, 8]: the branches differ
    in shape, so without folding the output keeps a dynamic dim. The then branch reads an outer
    initializer (w) and an outer input (x); both branches define `t`, inlined under a prefix."""
    then = h.make_graph([h.make_node("Mul", ["x", "w"], ["t"]), h.make_node("Relu", ["t"], ["r"])],
                        "then", [], [h.make_tensor_value_info("r", T.FLOAT, [1, 4])])
    els = h.make_graph([h.make_node("Concat", ["x", "x"], ["t"], axis=1)], "else", [],
                       [h.make_tensor_value_info("t", T.FLOAT, [1, 8])])
    nodes = [h.make_node("Identity", ["sr"], ["k"]),
             h.make_node("Equal", ["k", "rate"], ["cond"]),
             h.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=els)]
    return _model(nodes, [h.make_tensor_value_info("x", T.FLOAT, [1, 4]),
                          h.make_tensor_value_info("sr", T.INT64, [])],
                  [h.make_tensor_value_info("y", T.FLOAT, ["rows", "cols"])],
                  [nh.from_array(np.array(16000, np.int64), "rate"), nh.from_array(_w(1, 4), "w")])


def test_fold_if_inlines_the_branch_the_bound_input_takes():
    model = _if_on_rate()
    x = _w(1, 4)
    expected = _run(model, {"x": x, "sr": np.array(16000, np.int64)})[0]
    touched = rewrites.fold_constant_branches(model, Facts(constants={"sr": np.array(16000, np.int64)}))
    assert touched == ["y (If: then taken, sr bound by the spec)"]
    assert "If" not in _ops(model)
    np.testing.assert_array_equal(_run(model, {"x": x, "sr": np.array(16000, np.int64)})[0], expected)
    # without a bound input there is nothing to fold
    other = _if_on_rate()
    assert rewrites.fold_constant_branches(other, Facts()) == [] and "If" in _ops(other)


def test_fold_where_picks_the_operand_and_keeps_the_broadcast_shape():
    nodes = [h.make_node("Greater", ["mode", "zero"], ["c"]), h.make_node("Where", ["c", "x", "b"], ["y"])]
    model = _model(nodes, [h.make_tensor_value_info("x", T.FLOAT, [1, 4]),
                           h.make_tensor_value_info("mode", T.INT64, [1])],
                   [h.make_tensor_value_info("y", T.FLOAT, None)],
                   [nh.from_array(np.array([0], np.int64), "zero"), nh.from_array(_w(3, 1), "b")])
    x, mode = _w(1, 4), np.array([0], np.int64)
    expected = _run(model, {"x": x, "mode": mode})[0]
    assert rewrites.fold_constant_branches(model, Facts(constants={"mode": mode})) == [
        "y (Where: Y taken, mode bound by the spec)"]
    assert "Where" not in _ops(model)
    got = _run(model, {"x": x, "mode": mode})[0]
    assert got.shape == expected.shape == (3, 4)
    np.testing.assert_array_equal(got, expected)


def test_static_stage_folds_if_on_a_constant_input_and_records_it(tmp_path):
    folder = tmp_path / "models" / "rate"
    folder.mkdir(parents=True)
    onnx.save(_if_on_rate(), folder / "model.onnx")
    _spec(folder, "model.onnx", {"x": ([1, 4], "float32", -1.0, 1.0),
                                 "sr": ([], "int64", 16000, 16000)})
    report, model = _static(tmp_path, "rate")
    (rule,) = report["rewrites"]
    assert rule["rule"] == "fold-constant-if" and rule["nodes"] == ["y (If: then taken, sr bound by the spec)"]
    assert report["outputs"] == [{"name": "y", "shape": [1, 4]}]
    assert report["vs_original"]["passed"] and report["vs_original"]["outputs"][0]["max_abs"] == 0.0
    assert [i.name for i in model.graph.input] == ["x", "sr"]   # the interface stays
    # the same model with sr drawn at random is not folded: the error names the If and why
    _spec(folder, "model.onnx", {"x": ([1, 4], "float32", -1.0, 1.0),
                                 "sr": ([], "int64", 8000, 16000)})
    shutil.rmtree(tmp_path / "artifacts")
    with pytest.raises(PipelineError) as info:
        _static(tmp_path, "rate")
    assert "control flow that depends on data remains" in info.value.what
    assert "its condition 'cond' depends on data at run time (the values of input sr" in info.value.what
    assert "its output y has no static shape" in info.value.what


def test_only_integer_inputs_with_one_possible_value_are_constants():
    assert static.constant_value({"random": {"seed": 0, "low": 16000, "high": 16000}}, "int64") == 16000
    assert static.constant_value({"random": {"seed": 0, "low": 15999.5, "high": 16000.4}}, "int32") == 16000
    assert static.constant_value({"random": {"seed": 0, "low": 8000, "high": 16000}}, "int64") is None
    assert static.constant_value({"random": {"seed": 0, "low": 0.0, "high": 0.0}}, "float32") is None
    assert static.constant_value({"file": "sr.npy"}, "int64") is None


def test_silero_ifless_folds_its_sample_rate_if():
    """The public silero op18 model: its If on `sr` goes once the spec binds sr to 16000."""
    model = onnx.load(str(FIXTURES / "silero_vad" / "silero_vad.onnx"))
    static.bind_inputs(model, {"input": [1, 576], "sr": [], "state": [2, 1, 128]})
    static.localize_subgraphs(model.graph)
    feeds = {"input": _w(1, 576), "sr": np.array(16000, np.int64), "state": _w(2, 1, 128, scale=0.1)}
    expected = _run(model, feeds)
    touched = rewrites.fold_constant_branches(model, Facts(constants={"sr": feeds["sr"]}))
    assert len(touched) == 1 and "then taken" in touched[0] and "If" not in _ops(model)
    for a, b in zip(_run(model, feeds), expected):
        np.testing.assert_allclose(a, b, atol=1e-6)


# ----------------------------------------------------------------------------- onnxsim crash
def test_onnxsim_crash_falls_back_to_onnx_folding():
    """An If placed before the node whose output its branch reads: onnxruntime runs it, onnxsim
    crashes with "... is not output of any previous nodes" (the class silero exports hit)."""
    then = h.make_graph([h.make_node("Add", ["x", "y"], ["t"])], "then", [],
                        [h.make_tensor_value_info("t", T.FLOAT, [1, 4])])
    els = h.make_graph([h.make_node("Sub", ["x", "y"], ["e"])], "else", [],
                       [h.make_tensor_value_info("e", T.FLOAT, [1, 4])])
    nodes = [h.make_node("If", ["cond"], ["out"], then_branch=then, else_branch=els),
             h.make_node("Size", ["x"], ["s"]), h.make_node("Cast", ["s"], ["sf"], to=T.FLOAT),
             h.make_node("Mul", ["x", "sf"], ["y"])]
    model = _model(nodes, [h.make_tensor_value_info("x", T.FLOAT, [1, 4]),
                           h.make_tensor_value_info("cond", T.BOOL, [])],
                   [h.make_tensor_value_info("out", T.FLOAT, [1, 4])])
    feeds = {"x": _w(1, 4), "cond": np.array(False)}
    expected = _run(model, feeds)[0]
    simplified, how = static.simplify(model, {"x": [1, 4], "cond": []})
    assert how["name"] == "onnx-fold"
    assert "onnxsim failed" in how["why"] and "is not output of any previous nodes" in how["why"]
    onnx.checker.check_model(simplified, full_check=True)
    assert {"Size", "Cast"}.isdisjoint(_ops(simplified))       # folded: x's shape is static
    np.testing.assert_array_equal(_run(simplified, feeds)[0], expected)


def test_constant_outputs_are_shaped_from_their_value():
    """A Constant inference left without a shape is not a dynamic dim."""
    nodes = [h.make_node("Constant", [], ["p2o.helper.constant.141"],
                         value=nh.from_array(np.array([2.0], np.float32))),
             h.make_node("Mul", ["x", "p2o.helper.constant.141"], ["y"])]
    model = _model(nodes, [h.make_tensor_value_info("x", T.FLOAT, [1, 4])],
                   [h.make_tensor_value_info("y", T.FLOAT, [1, 4])])
    model.graph.value_info.append(h.make_tensor_value_info("p2o.helper.constant.141", T.FLOAT, ["?"]))
    assert static.dynamic_tensors(model) == ["p2o.helper.constant.141 ['?']"]
    static.constant_shapes(model)
    assert static.dynamic_tensors(model) == []


# ----------------------------------------------------------------------------- contrib ops
def _lstm_model(direction="bidirectional", seq=5, batch=1, size=6, hidden=8, with_lens=False):
    dirs = 2 if direction == "bidirectional" else 1
    inits = [nh.from_array(_w(dirs, 4 * hidden, size), "W"), nh.from_array(_w(dirs, 4 * hidden, hidden), "R"),
             nh.from_array(_w(dirs, 8 * hidden, scale=0.1), "B")]
    ins = ["x", "W", "R", "B", "lens" if with_lens else "", "h0", "c0"]
    inputs = [h.make_tensor_value_info("x", T.FLOAT, [seq, batch, size]),
              h.make_tensor_value_info("h0", T.FLOAT, [dirs, batch, hidden]),
              h.make_tensor_value_info("c0", T.FLOAT, [dirs, batch, hidden])]
    if with_lens:
        inputs.append(h.make_tensor_value_info("lens", T.INT32, [batch]))
    node = h.make_node("LSTM", ins, ["y", "yh", "yc"], hidden_size=hidden, direction=direction)
    return _model([node], inputs, [h.make_tensor_value_info("y", T.FLOAT, [seq, dirs, batch, hidden]),
                                   h.make_tensor_value_info("yh", T.FLOAT, [dirs, batch, hidden]),
                                   h.make_tensor_value_info("yc", T.FLOAT, [dirs, batch, hidden])], inits)


def _lstm_feeds(seq=5, batch=1, size=6, hidden=8, dirs=2):
    return {"x": _w(seq, batch, size, scale=1.0), "h0": _w(dirs, batch, hidden),
            "c0": _w(dirs, batch, hidden)}


# DynamicQuantizeLSTM / DynamicQuantizeMatMul: tests/e2e/test_contrib_families.py (generated
# families, exact against onnxruntime's own int8 arithmetic)


def test_a_contrib_op_without_a_rewrite_names_the_op(tmp_path):
    folder = tmp_path / "models" / "gelu"
    folder.mkdir(parents=True)
    node = h.make_node("Gelu", ["x"], ["y"], domain="com.microsoft")
    onnx.save(_model([node], [h.make_tensor_value_info("x", T.FLOAT, [1, 4])],
                     [h.make_tensor_value_info("y", T.FLOAT, [1, 4])],
                     extra_opsets=[h.make_opsetid("com.microsoft", 1)]), folder / "model.onnx")
    _spec(folder, "model.onnx", {"x": ([1, 4], "float32", -1.0, 1.0)})
    with pytest.raises(PipelineError) as info:
        _static(tmp_path, "gelu")
    assert info.value.stage == "static"
    assert "com.microsoft Gelu" in info.value.what and "no rewrite into standard ONNX" in info.value.what


# ----------------------------------------------------------------------------- unroll LSTM / GRU
@pytest.mark.parametrize("direction,with_lens", [("bidirectional", False), ("reverse", True),
                                                 ("forward", True)])
def test_lstm_unrolls_to_matmul_sigmoid_tanh(direction, with_lens):
    dirs = 2 if direction == "bidirectional" else 1
    model = _lstm_model(direction, batch=2, with_lens=with_lens)
    feeds = _lstm_feeds(batch=2, dirs=dirs)
    if with_lens:
        feeds["lens"] = np.array([5, 3], np.int32)
    expected = _run(model, feeds)
    shapes = {"x": [5, 2, 6]}
    touched = rewrites.unroll_recurrent(model, Facts(shapes=shapes, lacking={"LSTM": "test"}))
    assert touched == [f"y (LSTM, {direction}, 5 steps)"]
    assert "LSTM" not in _ops(model) and {"MatMul", "Sigmoid", "Tanh"} <= _ops(model)
    for a, b in zip(_run(model, feeds), expected):
        np.testing.assert_allclose(a, b, atol=1e-5)
    # where no compiler lacks the op, it stays
    kept = _lstm_model(direction)
    assert rewrites.unroll_recurrent(kept, Facts(shapes=shapes)) == [] and "LSTM" in _ops(kept)


@pytest.mark.parametrize("linear_before_reset", [0, 1])
def test_bidirectional_gru_unrolls(linear_before_reset):
    hidden, size, seq, batch = 8, 6, 4, 2
    inits = [nh.from_array(_w(2, 3 * hidden, size), "W"), nh.from_array(_w(2, 3 * hidden, hidden), "R"),
             nh.from_array(_w(2, 6 * hidden, scale=0.1), "B")]
    node = h.make_node("GRU", ["x", "W", "R", "B", "lens", "h0"], ["y", "yh"], hidden_size=hidden,
                       direction="bidirectional", linear_before_reset=linear_before_reset)
    model = _model([node], [h.make_tensor_value_info("x", T.FLOAT, [seq, batch, size]),
                            h.make_tensor_value_info("lens", T.INT32, [batch]),
                            h.make_tensor_value_info("h0", T.FLOAT, [2, batch, hidden])],
                   [h.make_tensor_value_info("y", T.FLOAT, [seq, 2, batch, hidden]),
                    h.make_tensor_value_info("yh", T.FLOAT, [2, batch, hidden])], inits)
    feeds = {"x": _w(seq, batch, size, scale=1.0), "lens": np.array([4, 2], np.int32),
             "h0": _w(2, batch, hidden)}
    expected = _run(model, feeds)
    rewrites.unroll_recurrent(model, Facts(shapes={"x": [seq, batch, size]}, lacking={"GRU": "test"}))
    assert "GRU" not in _ops(model)
    for a, b in zip(_run(model, feeds), expected):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_a_recurrent_op_that_cannot_be_unrolled_stays_or_fails_naming_it():
    """An LSTM whose peepholes are computed at run time is left for IREE (which takes LSTM) and
    noted; a bidirectional GRU with an activation outside the spec, which no compiler of ours
    takes, fails naming the op, the attribute and the reason. (Constant peepholes, `clip` and
    the spec's activations are unrolled: tests/e2e/test_recurrent_families.py.)"""
    model = _lstm_model("forward")
    model.graph.input.append(h.make_tensor_value_info("P", T.FLOAT, [1, 24]))
    model.graph.node[0].input.append("P")
    facts = Facts(shapes={"x": [5, 1, 6]}, lacking={"LSTM": "TVM has no LSTM"})
    assert rewrites.unroll_recurrent(model, facts) == [] and "LSTM" in _ops(model)
    assert facts.declined == [{"rule": "unroll-recurrent", "node": "y", "why":
                               "its weights ['P'] are not constants after simplifying: left as it "
                               "is, for the compilers that take it"}]
    hidden = 4
    node = h.make_node("GRU", ["x", "W", "R"], ["y"], hidden_size=hidden, direction="bidirectional",
                       activations=["Sigmoid", "Gelu"] * 2, name="enc")
    gru = _model([node], [h.make_tensor_value_info("x", T.FLOAT, [3, 1, 2])],
                 [h.make_tensor_value_info("y", T.FLOAT, [3, 2, 1, hidden])],
                 [nh.from_array(_w(2, 3 * hidden, 2), "W"), nh.from_array(_w(2, 3 * hidden, hidden), "R")])
    with pytest.raises(rewrites.NoRewrite) as info:
        rewrites.unroll_recurrent(gru, Facts(shapes={"x": [3, 1, 2]}, lacking={"GRU": "none takes it"},
                                             nowhere={"GRU:bidirectional"}))
    assert str(info.value).startswith("GRU 'enc': activations ['Gelu', 'Gelu'] are not activation "
                                      "functions of the ONNX spec (Relu, Tanh, Sigmoid")
    assert str(info.value).endswith(", and no compiler of ours takes it as it is (none takes it)")


def test_romanizer_encoder_gru_unrolled_by_the_stage(tmp_path):
    """The public GRU case: its two bidirectional GRUs are unrolled over 16 steps, and the static
    model matches golden (onnxruntime on the source)."""
    add_fixture_model(tmp_path / "models", "romanizer_encoder")
    report, model = _static(tmp_path, "romanizer_encoder")
    (rule,) = report["rewrites"]
    assert rule["rule"] == "unroll-recurrent" and len(rule["nodes"]) == 2
    assert all("GRU, bidirectional, 16 steps" in n for n in rule["nodes"])
    assert "IREE 3.13 does not lower a bidirectional or reverse GRU" in rule["why"]
    assert "GRU" not in _ops(model)
    assert report["vs_original"]["passed"]
    assert max(o["max_abs"] for o in report["vs_original"]["outputs"]) < 1e-5


def test_text2tashkeel_int8_static_without_contrib_ops(tmp_path):
    """The public DynamicQuantizeLSTM model (onnxruntime's quantizer output), at 24 characters:
    no com.microsoft op left, both LSTMs unrolled with onnxruntime's own int8 arithmetic (uint8
    activations quantized per step, int32 sums), so golden (onnxruntime on the int8 source) is
    met within float rounding, not the int8-activation error a float LSTM makes (0.19-0.23)."""
    add_fixture_model(tmp_path / "models", "static_tashkeel")
    report, model = _static(tmp_path, "static_tashkeel")
    rules = {r["rule"]: r for r in report["rewrites"]}
    assert len(rules["decompose-contrib-ops"]["nodes"]) == 2
    assert "unroll-recurrent" not in rules      # the decomposition unrolls the LSTMs itself
    assert not any(n.domain == "com.microsoft" for n in model.graph.node)
    assert not {"LSTM", "DynamicQuantizeLSTM"} & _ops(model)
    assert report["vs_original"]["passed"]
    assert report["vs_original"]["outputs"][0]["max_abs"] < 1e-5


def test_silero_openvino_lstm_unrolled_and_pad_gathered(tmp_path):
    add_fixture_model(tmp_path / "models", "static_silero_openvino")
    report, model = _static(tmp_path, "static_silero_openvino")
    assert [r["rule"] for r in report["rewrites"]] == ["reflect-pad-as-gather", "unroll-recurrent"]
    assert report["simplifier"]["name"] == "onnxsim"
    assert not {"LSTM", "Pad"} & _ops(model)
    assert max(o["max_abs"] for o in report["vs_original"]["outputs"]) < 1e-5


# ----------------------------------------------------------------------------- the manifest
def test_build_ships_the_folded_model_and_the_manifest_lists_its_static_rewrites(workspace):
    """doit build target=host: the If folded by the static stage compiles with both compilers,
    validates against golden, and the manifest entry says what the static stage rewrote."""
    folder = workspace.models / "rate"
    folder.mkdir(parents=True)
    onnx.save(_if_on_rate(), folder / "model.onnx")
    _spec(folder, "model.onnx", {"x": ([1, 4], "float32", -1.0, 1.0),
                                 "sr": ([], "int64", 16000, 16000)})
    workspace.build("target=host")
    entry = json.loads((workspace.artifacts / "host" / "manifest.json").read_text())["models"]["rate"]
    (rule,) = entry["static_rewrites"]
    assert rule["rule"] == "fold-constant-if" and "sr bound by the spec" in rule["nodes"][0]
    assert "If" not in entry["static_model"]["ops"]
    assert {v["validation"]["status"] for v in entry["artifacts"].values()} == {"passed"}
    assert set(entry["artifacts"]) == {"cpu-x86_64", "cpu-x86_64-tvm"}
