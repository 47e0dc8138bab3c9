"""An input bound to one value (issue 40: silero-vad's `sr`): `doit new ... value=sr:16000` and
the spec's `inputs.NAME.value`. A model that checks such an input (a sample rate) does not run on
doit new's default random integers; given its value it does, the spec says `value:`, and the
static stage folds the If the value drives (`fold-constant-if`)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from pipeline.core.errors import PipelineError
from pipeline.graph.scaffold import new_model
from pipeline.spec.model import load_model


def _vad_like(path):
    """x f32[1, 4], sr i64 scalar -> y: If(sr == 16000) then x * 2 else Reshape(x, [1, 3]) (fails at
    run time, as silero's else branch fails on a rate it does not take)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    then = helper.make_graph([helper.make_node("Mul", ["x", "two"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, [1, 4])])
    other = helper.make_graph([helper.make_node("Reshape", ["x", "three"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", TensorProto.FLOAT, [1, "n"])])
    graph = helper.make_graph(
        [helper.make_node("Equal", ["sr", "rate"], ["ok"]),
         helper.make_node("If", ["ok"], ["y"], then_branch=then, else_branch=other, name="If_0")],
        "vad_like",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4]),
         helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "n"])],
        initializer=[numpy_helper.from_array(np.array(16000, np.int64), "rate"),
                     numpy_helper.from_array(np.float32(2.0), "two"),
                     numpy_helper.from_array(np.array([1, 3], np.int64), "three")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_new_binds_an_input_to_a_value_and_static_folds_its_if(workspace, tmp_path):
    source = _vad_like(tmp_path / "vad_like.onnx")
    with pytest.raises(PipelineError, match=r"(?s)does not run on the test inputs.*value=NAME:NUMBER"):
        new_model(str(source), "plain", [], None, workspace.models)
    assert not (workspace.models / "plain").exists()
    made = workspace.doit("new", f"source={source}", "name=vad", "value=sr:16000")
    assert made.returncode == 0, made.stdout + made.stderr
    assert "sr int64 [] = 16000" in made.stdout
    text = (workspace.models / "vad" / "model.yaml").read_text()
    assert "  \"sr\":\n    shape: []\n    dtype: int64\n    value: 16000\n" in text
    (spec,), problems = load_model(workspace.models / "vad" / "model.yaml")
    assert not problems
    sr = {i.name: i for i in spec.inputs}["sr"]
    assert (sr.test_data.kind, sr.test_data.low, sr.test_data.high) == ("random", 16000, 16000)
    static = workspace.doit("static:vad")
    assert static.returncode == 0, static.stdout + static.stderr
    doc = json.loads((workspace.artifacts / "models" / "vad" / "static" / "static.json").read_text())
    folded = [r for r in doc["rewrites"] if r["rule"] == "fold-constant-if"]
    assert folded and "If_0" in folded[0]["nodes"][0] and "sr bound by the spec" in folded[0]["nodes"][0]
    assert "If" not in doc["ops"]


@pytest.mark.parametrize("values, message", [
    (["sr:16000.5"], "value=sr:16000.5: 'sr' is int64, 16000.5 is not an integer"),
    (["rate:16000"], "value=rate:16000: the model has no input 'rate' (inputs: sr, x)"),
    (["sr=16000"], "value=sr=16000: expected NAME:NUMBER"),
])
def test_new_refuses_a_value_it_cannot_bind_and_writes_nothing(tmp_path, values, message):
    source = _vad_like(tmp_path / "vad_like.onnx")
    with pytest.raises(PipelineError) as refused:
        new_model(str(source), "vad", [], None, tmp_path / "models", values=values)
    assert message in str(refused.value) and "stage=new" in str(refused.value)
    assert "next: give an input's one value as value=NAME:NUMBER" in str(refused.value)
    assert not (tmp_path / "models" / "vad").exists()


@pytest.mark.parametrize("body, message", [
    ("    value: 16000\n    test_data:\n      random: {seed: 0, low: 0, high: 9}\n",
     "inputs.sr: give value or test_data, not both"),
    ("    value: 1.5\n", "inputs.sr.value: 1.5 is not an integer, the input is int64"),
    ("    value: fast\n", "inputs.sr.value"),
])
def test_a_spec_value_that_cannot_bind_is_a_spec_error(tmp_path, body, message):
    from conftest import sha256
    (tmp_path / "models" / "vad").mkdir(parents=True)
    source = _vad_like(tmp_path / "models" / "vad" / "m.onnx")
    (tmp_path / "models" / "vad" / "model.yaml").write_text(
        f"source:\n  path: m.onnx\n  sha256: {sha256(source)}\ninputs:\n"
        f"  x:\n    shape: [1, 4]\n  sr:\n    shape: []\n    dtype: int64\n{body}"
        f"tolerance: {{max_abs: 1.0e-4, mean_abs: 1.0e-5, cosine: 0.9999}}\n")
    specs, problems = load_model(tmp_path / "models" / "vad" / "model.yaml")
    assert any(message in p for p in problems), problems
