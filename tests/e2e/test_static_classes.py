"""Three classes of real models the static stage met (issue 40), on generated families
(tests/families/static_classes.py): graph inputs that are also initializers, tf.map_fn Loops
whose trip count is 2^63 - 1 and whose end is the body's condition, and transformer shape
chains onnx's own inference leaves unshaped.

The contract, as for the fold families: the static model gives what onnxruntime gives on the
ORIGINAL graph, every shape static, no Loop left; static.json says what was done and why. A
model of each class goes through `doit build target=host` (IREE and TVM, each artifact run and
checked against golden).
"""
from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from conftest import sha256
from families import static_classes as sc
from pipeline import graph
from pipeline.core.steps import execute
from pipeline.stages import static


def _run(model, feeds: dict) -> list:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.log_severity_level = 3   # the original's "initializer appears in graph inputs" warnings
    return ort.InferenceSession(model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"]).run(None, feeds)


def _made_static(case, atol=1e-6):
    original = case.model()
    onnx.checker.check_model(original)
    expected = _run(original, case.feeds())
    model, made = static.make_static(case.model(), case.inputs(), case.constants())
    assert static.dynamic_tensors(model) == []
    got = _run(model, case.feeds())
    assert [g.shape for g in got] == [e.shape for e in expected]
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=atol)
    return model, made


def _rule(made, name) -> list[str]:
    return next((r["nodes"] for r in made["rewrites"] if r["rule"] == name), [])


# ----------------------------------------------------------------------------- initializer inputs
@pytest.mark.parametrize("case", sc.init_input_cases(), ids=lambda c: c.name)
def test_initializer_inputs_are_constants_unless_the_spec_declares_them(case):
    model, made = _made_static(case)
    assert [i.name for i in model.graph.input] == [i["name"] for i in case.inputs()]
    weights = ["conv.weight", "conv.bias", "bn.weight", "bn.bias", "bn.running_mean",
               "bn.running_var", "bn.num_batches_tracked"]
    want = [f"{w} (a constant: its initializer)" for w in weights]
    want.append("scale (an input: the spec declares it; its initializer dropped)" if case.declared
                else "scale (a constant: its initializer)")
    if case.ir < 4:
        want.append("IR version 3 -> 4 (initializers that are not inputs: IR 4's form, read by "
                    "shape inference)")
    assert _rule(made, "initializer-inputs-as-constants") == want
    assert made["rewrites"][0]["rule"] == "initializer-inputs-as-constants"   # first, as the stage runs it
    if case.declared:   # the spec's value, not the default, is what the static model computes
        feeds = case.feeds()
        doubled = _run(model, {**feeds, "scale": feeds["scale"] * 2})[0]
        np.testing.assert_allclose(doubled, _run(model, feeds)[0] * 2, rtol=1e-6)


def test_a_model_without_initializer_inputs_is_left_as_it_is():
    case = sc.MapFnCase("shape")
    _, made = _made_static(case)
    assert _rule(made, "initializer-inputs-as-constants") == []


# ----------------------------------------------------------------------------- tf.map_fn
@pytest.mark.parametrize("case", sc.map_fn_cases(), ids=lambda c: c.name)
def test_a_while_loop_unrolls_when_its_condition_ends_it(case):
    """Trip count 2^63 - 1: the iterations are those until `i < n` turns false, n known once
    the inputs are bound and folded (a shape, a bound input, the body's constant)."""
    model, made = _made_static(case)
    assert "Loop" not in {n.op_type for n in model.graph.node}
    origin = {"shape": " (the shape of x)", "bound": " (n bound by the spec)", "body": ""}[case.n]
    assert _rule(made, "unroll-loop") == [
        f"while (Loop: {sc.MAP_X[0]} iterations, until its condition turned false{origin}, "
        f"before its trip count {sc.INT64_MAX})"]


def test_a_while_loop_on_data_fails_naming_it():
    case = sc.MapFnCase("data")
    with pytest.raises(static.Refusal) as info:
        static.make_static(case.model(), case.inputs(), case.constants())
    assert ("Loop 'while': its condition 'cond_0' depends on data at run time (the values of "
            "input x, through Cast, ReduceSum, Max, Less)") in info.value.what


def test_a_for_loop_of_2_63_iterations_is_declined_at_once():
    """A body whose condition only passes its input on is ended by the trip count alone: 2^63 - 1
    iterations are refused without unrolling any."""
    case = sc.MapFnCase("shape")
    model = case.model()
    body = next(n for n in model.graph.node if n.op_type == "Loop").attribute[0].g
    for node in body.node:
        if "cond_out" in node.output:
            node.CopyFrom(onnx.helper.make_node("Identity", ["cond_in"], ["cond_out"]))
    with pytest.raises(static.Refusal) as info:
        static.make_static(model, case.inputs(), case.constants())
    assert (f"Loop 'while': its trip count {sc.INT64_MAX} asks for {sc.INT64_MAX} iterations of "
            f"{len(body.node)} nodes; at most") in info.value.what


# ----------------------------------------------------------------------------- the stage, IREE
RANGES = {"ids": (0, sc.ENC["vocab"] - 1), "mask": (0, 1)}   # token ids, a 0/1 mask


def _spec(folder, case) -> None:
    bound = {c["name"]: c["value"] for c in case.constants()}
    lines = ["description: generated static-class case", "source:", "  path: model.onnx",
             f"  sha256: {sha256(folder / 'model.onnx')}", "inputs:"]
    for i in case.inputs():
        lo, hi = (bound[i["name"]],) * 2 if i["name"] in bound else RANGES.get(i["name"], (-1.0, 1.0))
        lines += [f"  {i['name']}:", f"    shape: {i['shape']}", f"    dtype: {i['dtype']}",
                  f"    test_data: {{random: {{seed: 0, low: {lo}, high: {hi}}}}}"]
    lines.append("tolerance: {max_abs: 1.0e-5, mean_abs: 1.0e-6, cosine: 0.99999}")
    (folder / "model.yaml").write_text("\n".join(lines) + "\n")


def test_doit_builds_and_validates_one_of_each_class_for_the_host(workspace):
    """`doit build target=host` on one model of each class: each artifact (IREE and TVM)
    validated against golden, the manifest naming the static rewrite that made it possible."""
    cases = {"initinputs": (sc.InitInputCase(False, 4, 9), "initializer-inputs-as-constants"),
             "mapfn": (sc.MapFnCase("shape", "carried", "and", 13), "unroll-loop"),
             "encoder": (sc.EncoderCase("unbind", "int64", 1, 18), "fold-sequences")}
    for name, (case, _) in cases.items():
        folder = workspace.models / name
        folder.mkdir()
        onnx.save(case.model(), folder / "model.onnx")
        _spec(folder, case)
    workspace.build("target=host")
    manifest = json.loads((workspace.artifacts / "host" / "manifest.json").read_text())
    for name, (case, rule) in cases.items():
        entry = manifest["models"][name]
        assert rule in [r["rule"] for r in entry["static_rewrites"]], name
        assert sorted(entry["artifacts"]) == ["cpu-x86_64", "cpu-x86_64-tvm"], name
        for abi, art in entry["artifacts"].items():
            checked = art["validation"]
            assert checked["status"] == "passed" and checked["shipped_bytes_executed"], (name, abi)
            assert max(o["max_abs"] for o in checked["outputs"]) < 1e-5, (name, abi)
        assert [i["name"] for i in entry["io"]["inputs"]] == [i["name"] for i in case.inputs()]


def test_a_declared_initializer_input_is_an_input_through_the_stage(tmp_path):
    """The spec may declare an input that has an initializer (its default): it stays an input
    of the static model, fed by golden's test data; the undeclared ones are constants."""
    case = sc.InitInputCase(True, 4, 9)
    folder = tmp_path / "models" / "case"
    folder.mkdir(parents=True)
    onnx.save(case.model(), folder / "model.onnx")
    _spec(folder, case)
    proj = graph.load_project(tmp_path / "models", tmp_path / "artifacts", "host")
    for stage in ("import", "golden", "static"):
        step = next(s for s in proj.steps(stage) if s.name == "case")
        execute(step)
    report = json.loads((step.out_dir / "static.json").read_text())
    assert report["inputs"] == [{"name": "x", "shape": [1, 3, 8, 8]}, {"name": "scale", "shape": [1]}]
    assert report["vs_original"]["passed"]
    assert "scale (an input: the spec declares it; its initializer dropped)" in report["rewrites"][0]["nodes"]
    # undeclared, `num_batches_tracked` is no input; declared where the model has no such name, an error
    (folder / "model.yaml").write_text((folder / "model.yaml").read_text().replace("  scale:", "  scales:"))
    with pytest.raises(Exception, match="the model has no input named 'scales'"):
        graph.load_project(tmp_path / "models", tmp_path / "artifacts", "host")


# ----------------------------------------------------------------------------- transformer shapes
@pytest.mark.parametrize("case", sc.encoder_cases(), ids=lambda c: c.name)
def test_every_value_of_an_encoder_gets_a_static_shape(case):
    """Embeddings, Range position ids Expanded to the batch, masks Expanded to [B, H, S, S],
    heads split and merged with shapes from Shape->Gather->Unsqueeze->Concat (or Shape's
    start/end), layers sharing weights; TorchScript's unbind/cat as SplitToSequence with
    SequenceAt or ConcatFromSequence (folded: Split, Squeeze, Concat)."""
    model, made = _made_static(case, atol=1e-5)
    ops = {n.op_type for n in model.graph.node}
    assert not ops & {"SplitToSequence", "SequenceAt", "ConcatFromSequence", "Range", "Shape"}
    folded = _rule(made, "fold-sequences")
    if case.heads == "unbind":
        want = [f"l{k}_r{n} (SequenceAt of a sequence of 3 tensors)" for k in range(case.layers)
                for n in "qkv"]
        want += [f"l{k}_y0 (ConcatFromSequence of a sequence of {sc.ENC['heads']} tensors)"
                 for k in range(case.layers)]
        assert sorted(folded) == sorted(want)
    else:
        assert folded == []


def test_split_to_sequence_with_split_lengths_folds():
    """A `split` input (chunks of 4, then 2: a scalar; or explicit lengths) keeps the axis;
    the elements are read by SequenceAt and ConcatFromSequence."""
    from onnx import TensorProto as T
    from onnx import helper as h
    for split in (np.array(4, np.int64), np.array([1, 5], np.int64)):
        nodes = [h.make_node("SplitToSequence", ["x", "split"], ["seq"], axis=1),
                 h.make_node("SequenceAt", ["seq", "one"], ["second"]),
                 h.make_node("Neg", ["second"], ["z"]),
                 h.make_node("ConcatFromSequence", ["seq"], ["y"], axis=1)]
        model = h.make_model(h.make_graph(
            nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, ["N", "T"])],
            [h.make_tensor_value_info("y", T.FLOAT, None), h.make_tensor_value_info("z", T.FLOAT, None)],
            [onnx.numpy_helper.from_array(split, "split"),
             onnx.numpy_helper.from_array(np.array(1, np.int64), "one")]),
            opset_imports=[h.make_opsetid("", 18)])
        x = np.arange(12, dtype=np.float32).reshape(2, 6)
        expected = _run(model, {"x": x})
        folded, made = static.make_static(model, [{"name": "x", "shape": [2, 6], "dtype": "float32"}])
        assert {n.op_type for n in folded.graph.node} <= {"Split", "Concat", "Identity", "Neg", "Slice"}
        for got, want in zip(_run(folded, {"x": x}), expected):
            np.testing.assert_array_equal(got, want)
        assert sorted(_rule(made, "fold-sequences")) == [
            "second (SequenceAt of a sequence of 2 tensors)",
            "y (ConcatFromSequence of a sequence of 2 tensors)"]


def test_where_shape_inference_stops_is_named():
    """An op no inference knows: the values after it are listed, and the op where it stops
    is named with the shapes it reads, rather than only a list of unshaped values."""
    from onnx import TensorProto as T
    from onnx import helper as h
    nodes = [h.make_node("Relu", ["x"], ["r"]),
             h.make_node("Foo", ["r"], ["_v_247"], domain="custom", name="foo"),
             h.make_node("Relu", ["_v_247"], ["y"])]
    model = h.make_model(h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, ["B", 8])],
                                      [h.make_tensor_value_info("y", T.FLOAT, ["B", 8])]),
                         opset_imports=[h.make_opsetid("", 18), h.make_opsetid("custom", 1)])
    with pytest.raises(static.Refusal) as info:
        static.make_static(model, [{"name": "x", "shape": [1, 8], "dtype": "float32"}])
    assert info.value.what == ("dynamic dims remain after binding the inputs and simplifying: "
                               "y (unknown shape), _v_247 (no shape inferred); shape inference "
                               "stops at Foo 'foo' (domain custom) reading r [1, 8]")
