"""Recurrent and streaming models (LSTM/GRU) and Einsum, generated as exporters emit them
(tests/families/recurrent.py), through the static stage's `unroll-recurrent` and the compilers.

Every recurrent case is unrolled as the static stage does it (the ops `static.lacking_ops()`
names: TVM 0.27 has neither) and compared with onnxruntime on the original. A handful, side by
side in one model with the Einsum forms, is built as a user's model is: import, golden, static,
coverage, IREE (llvm-cpu) and TVM (llvm) compile of the host target, and validation of the
shipped bytes against golden; batch-first (layout=1) sources likewise with IREE. What IREE 3.13
does with the ops as they are (silently wrong with sequence_lens, peepholes, HardSigmoid; no
compile with clip, input_forget) and that Einsum needs no rewrite: docs/stages.md#the-static-stage.
"""
from __future__ import annotations

import itertools
import json
from dataclasses import replace

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from conftest import sha256
from families import recurrent
from pipeline import graph
from pipeline.core.errors import PipelineError
from pipeline.core.steps import execute
from pipeline.stages import static
from pipeline.rewrite.graph_edit import Facts, _dims
from pipeline.rewrite.recurrent import activation_functions, unroll_recurrent

CASES = recurrent.recurrent_cases()
TOLERANCE = "{max_abs: 1.0e-5, mean_abs: 1.0e-6, cosine: 0.99999}"


def _run(model, feeds: dict) -> list:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"]).run(None, feeds)


def _shapes(model) -> dict:
    g = model.graph
    return {vi.name: _dims(vi) for vi in list(g.input) + list(g.value_info) + list(g.output)}


def _ops(model) -> set[str]:
    return {n.op_type for n in model.graph.node}


def _unrolled(case):
    """The case's model after the static stage's rewrite, with what the product knows."""
    model = case.model()
    lacking, nowhere = static.lacking_ops()
    facts = Facts(shapes=_shapes(model), lacking=lacking, nowhere=nowhere)
    touched = unroll_recurrent(model, facts)
    return model, touched, facts


# ----------------------------------------------------------------------------- every case, onnxruntime
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_unrolled_case_matches_onnxruntime_on_the_original(case):
    feeds = case.feeds()
    expected = _run(case.reference(), feeds)
    model, touched, facts = _unrolled(case)
    steps = f"{case.seq} steps"
    assert touched and touched[0].startswith(f"rnn ({case.op}, {case.direction}, {steps}")
    assert not facts.declined and not {"LSTM", "GRU"} & _ops(model)
    assert [i.name for i in model.graph.input] == [i.name for i in case.model().graph.input]
    got = _run(model, feeds)
    for name, a, b in zip(case.outputs, got, expected):
        assert a.shape == b.shape, name
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0, err_msg=f"{case.name}: {name}")


def test_the_family_varies_what_exporters_vary():
    """Each value of each axis meets each op and direction (a family that silently lost an axis
    would prove nothing about it)."""
    for op in ("LSTM", "GRU"):
        for direction in ("forward", "reverse", "bidirectional"):
            mine = [c for c in CASES if (c.op, c.direction) == (op, direction)]
            assert {c.layout for c in mine} == {0, 1} and {c.batch for c in mine} == {1, 3}
            assert {c.state for c in mine} == {"input", "none", "zeros"}
            assert {c.opset for c in mine} == {13, 18} and {c.lens for c in mine} == {True, False}
            assert {c.clip is None for c in mine} == {True, False}
            assert any(c.activations for c in mine) and any(c.weights == "computed" for c in mine)
            outputs = recurrent.OUTPUTS[op]
            assert {c.outputs for c in mine} == {
                s for n in range(1, len(outputs) + 1) for s in itertools.combinations(outputs, n)}
            if op == "LSTM":
                assert any(c.peepholes for c in mine) and any(c.input_forget for c in mine)
            else:
                assert {c.linear_before_reset for c in mine} == {0, 1}
        names = {a for c in CASES if c.op == op for a in c.activations}
        assert len(names) >= 6, names


def test_activation_parameters_are_consumed_in_order_along_the_list():
    """onnxruntime's reading of activation_alpha/beta: each function takes what it uses, in
    order over both directions, the operator's default when the list runs out."""
    a = {"activations": [b"Sigmoid", b"ScaledTanh", b"LeakyRelu"] * 2,
         "activation_alpha": [1.5, 0.1, 2.0], "activation_beta": [0.7]}
    assert activation_functions("LSTM", a, 2) == [
        [("Sigmoid", None, None), ("ScaledTanh", 1.5, 0.7), ("LeakyRelu", 0.1, None)],
        [("Sigmoid", None, None), ("ScaledTanh", 2.0, 1.0), ("LeakyRelu", 0.01, None)]]
    with pytest.raises(ValueError, match=r"has 2 names, GRU with 2 direction\(s\) takes 4"):
        activation_functions("GRU", {"activations": ["Sigmoid", "Tanh"]}, 2)


# ----------------------------------------------------------------------------- built as a user's model
def _spec(folder, inputs: list) -> None:
    """model.yaml: each input (name, dims, dtype, low, high) with random test data."""
    lines = ["description: recurrent and Einsum families", "source:", "  path: model.onnx",
             f"  sha256: {sha256(folder / 'model.onnx')}", "inputs:"]
    for k, (name, dims, dtype, low, high) in enumerate(inputs):
        lines += [f"  {name}:", f"    shape: {dims}", f"    dtype: {dtype}",
                  f"    test_data: {{random: {{seed: {k}, low: {low}, high: {high}}}}}"]
    lines.append(f"tolerance: {TOLERANCE}")
    (folder / "model.yaml").write_text("\n".join(lines) + "\n")


def _add_model(models, name: str, model, lens_high: dict) -> None:
    folder = models / name
    folder.mkdir(parents=True)
    onnx.save(model, folder / "model.onnx")
    inputs = []
    for vi in model.graph.input:
        dims = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        if vi.type.tensor_type.elem_type == T.INT32:   # sequence_lens: 1..seq
            inputs.append((vi.name, dims, "int32", 1, lens_high[vi.name]))
        else:
            inputs.append((vi.name, dims, "float32", -1.0, 1.0))
    _spec(folder, inputs)


def _build(tmp_path, stages, skip: str | None = None) -> dict:
    """Run the stages for every model of tmp_path/models on the host target (steps whose name
    ends with `skip` left out); {stage:step name: out_dir}."""
    proj = graph.load_project(tmp_path / "models", tmp_path / "artifacts", "host")
    done = {}
    for stage in stages:
        for step in proj.steps(stage):
            if skip and step.name.endswith(skip):
                continue
            execute(step)
            done[f"{stage}:{step.name}"] = step.out_dir
    return done


def _golden(folder) -> tuple[dict, list]:
    """(golden's inputs by name, its outputs): what the golden stage drew and computed."""
    doc = json.loads((folder / "golden.json").read_text())
    return ({i["name"]: np.load(folder / i["file"]) for i in doc["inputs"]},
            [np.load(folder / o["file"]) for o in doc["outputs"]])


def _validation(done: dict, step: str) -> dict:
    return json.loads((done[f"validate:{step}"] / "validation.json").read_text())


def test_representative_cases_and_einsum_forms_build_and_validate_on_both_compilers(tmp_path):
    """The product's own path, once for all of them: the static model is unrolled (the state
    stays plain inputs and outputs), both host ABIs compile it, and the shipped bytes match
    golden (onnxruntime on the original)."""
    cases = recurrent.representative()
    forms = [replace(f, opset=17) for f in recurrent.einsum_cases() if f.opset == 13]
    models = [c.model() for c in cases] + [f.model() for f in forms]
    model = recurrent.combined(models, "streaming")
    lens_high = {f"c{k}_sequence_lens": c.seq for k, c in enumerate(cases) if c.lens}
    _add_model(tmp_path / "models", "streaming", model, lens_high)
    done = _build(tmp_path, ("import", "golden", "static", "coverage", "iree_compile",
                             "tvm_compile", "validate"))
    report = json.loads((done["static:streaming"] / "static.json").read_text())
    (rule,) = report["rewrites"]
    assert rule["rule"] == "unroll-recurrent" and len(rule["nodes"]) == len(cases)
    assert rule["nodes"][3].startswith("c3_rnn (LSTM, reverse, 3 steps, clip=2.0, input_forget=1, "
                                       "activations=['HardSigmoid', 'Tanh', 'Tanh'], peepholes)")
    assert [i["name"] for i in report["inputs"]] == [i.name for i in model.graph.input]
    assert [o["name"] for o in report["outputs"]] == [o.name for o in model.graph.output]
    assert report["ops"]["Einsum"] == len(forms) and not {"LSTM", "GRU"} & set(report["ops"])
    for abi in ("cpu-x86_64", "cpu-x86_64-tvm"):
        validation = _validation(done, f"host/streaming/{abi}")
        worst = max(o["max_abs"] for o in validation["outputs"])
        assert all(not o["failures"] for o in validation["outputs"]) and worst < 1e-5, (abi, worst)
        assert len(validation["outputs"]) == len(model.graph.output)


def test_batch_first_sources_build_with_iree(tmp_path):
    """layout=1, which onnxruntime does not run: golden runs the same ops in layout 0 between
    Transposes (the spec's definition), the unrolling takes the batch-first form, and the IREE
    artifact matches golden."""
    cases = recurrent.batch_first()
    model = recurrent.combined([c.model() for c in cases], "batch_first")
    lens_high = {f"c{k}_sequence_lens": c.seq for k, c in enumerate(cases) if c.lens}
    _add_model(tmp_path / "models", "batch_first", model, lens_high)
    done = _build(tmp_path, ("import", "golden", "static", "coverage", "iree_compile", "validate"),
                  skip="-tvm")
    feeds, golden = _golden(done["golden:batch_first"])
    expected = _run(recurrent.combined([c.reference() for c in cases]), feeds)
    for name, a, b in zip([o.name for o in model.graph.output], golden, expected):
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=0, err_msg=name)
    report = json.loads((done["static:batch_first"] / "static.json").read_text())
    assert all(", layout=1" in n for n in report["rewrites"][0]["nodes"])
    validation = _validation(done, "host/batch_first/cpu-x86_64")
    assert all(not o["failures"] and o["max_abs"] < 1e-5 for o in validation["outputs"])


def test_a_gru_no_compiler_takes_and_that_cannot_be_unrolled_fails_naming_it(tmp_path):
    """A bidirectional GRU (IREE 3.13 does not lower it, TVM 0.27 has no GRU) whose recurrent
    weights are a graph input: the static stage fails naming the node, the op and why."""
    hidden = 4
    node = h.make_node("GRU", ["x", "W", "R"], ["y"], hidden_size=hidden, direction="bidirectional",
                       name="encoder_gru")
    w = np.random.default_rng(0).standard_normal((2, 3 * hidden, 2)).astype(np.float32)
    graph_ = h.make_graph([node], "g", [h.make_tensor_value_info("x", T.FLOAT, [3, 1, 2]),
                                        h.make_tensor_value_info("R", T.FLOAT, [2, 3 * hidden, hidden])],
                          [h.make_tensor_value_info("y", T.FLOAT, [3, 2, 1, hidden])],
                          [nh.from_array(w, "W")])
    model = h.make_model(graph_, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    _add_model(tmp_path / "models", "gru", model, {})
    with pytest.raises(PipelineError) as info:
        _build(tmp_path, ("import", "golden", "static"))
    assert info.value.stage == "static"
    assert info.value.what.startswith("GRU 'encoder_gru': its weights ['R'] are not constants "
                                      "after simplifying, and no compiler of ours takes it as it is")
