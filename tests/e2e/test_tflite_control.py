"""TFLite control flow and dynamic inputs (issue 40, the TFLite classes the public corpus left;
tests/families/tflite_control.py): IF converted into ONNX If with its branch subgraphs (nested,
int8), each branch checked against LiteRT on inputs that take it; WHILE into a Loop the static
stage unrolls; an input whose dims are all
dynamic checked at the spec's shape, LiteRT's refusal at any other a route failure naming the
step, never a traceback; two members built through the pipeline to a validated IREE artifact.
Figures: docs/measurements/2026-12-03-tflite-classes.md."""
from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import sha256, target_registry
from families import tflite_control as fam
from pipeline.rewrite import sources as conversion
from pipeline.rewrite import tflite_onnx
from pipeline.spec.sources import DIRECT_TFLITE, NNEF_TOOLS_TFLITE, read_signature

MEMBERS = dict(fam.members())


def _full(value: float, dtype=np.float32):
    return {"x": np.full((1, fam.N), value, dtype) + np.linspace(-0.05, 0.05, fam.N).astype(dtype)
            if dtype == np.float32 else np.full((1, fam.N), value, dtype)}


# inputs that take each branch: (what is taken, the input); the conditions are MEAN(x) >= t
BRANCHES = {
    "if_data": [("else (the operand passed through)", _full(0.2)), ("then", _full(0.8))],
    "if_nested": [("else", _full(0.2)), ("then, inner else", _full(0.5)), ("then, inner then", _full(0.9))],
    "if_int8": [("else (requantize)", _full(-90, np.int8)), ("then (int8 FULLY_CONNECTED)", _full(90, np.int8))],
}


def _run(model, arrays: dict) -> dict:
    import onnxruntime as ort
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, arrays)))


@pytest.mark.parametrize("key", sorted(BRANCHES))
def test_if_becomes_onnx_if_and_each_branch_matches_litert(tmp_path, key):
    """tflite_onnx on each IF member: valid ONNX (full check) with one If per TFLite IF (the nested
    one inside a branch), the interface the source's; on an input taking each branch, onnxruntime
    equals LiteRT to float rounding (int8: to one step, the requantize's rounding). The branches
    give different values, so a converter that took one branch always would fail here."""
    import onnx
    source = tmp_path / f"{key}.tflite"
    source.write_bytes(MEMBERS[key])
    model = tflite_onnx.convert(MEMBERS[key])
    onnx.checker.check_model(model, full_check=True)
    ifs = [n for n in model.graph.node if n.op_type == "If"]
    assert len(ifs) == 1
    inner = [n for a in ifs[0].attribute for n in a.g.node if n.op_type == "If"]
    assert len(inner) == (1 if key == "if_nested" else 0)
    assert [i.name for i in model.graph.input] == [i["name"] for i in read_signature(source)["inputs"]]
    seen = []
    for taken, arrays in BRANCHES[key]:
        want, got = conversion.tflite_run(source, arrays), _run(model, arrays)
        for name, ref in want.items():
            assert got[name].dtype == ref.dtype and got[name].shape == ref.shape
            err = np.abs(got[name].astype(np.float64) - ref.astype(np.float64)).max()
            assert err <= (1 if ref.dtype.kind in "iu" else 1e-6), (taken, err)
            seen.append(ref.tobytes())
    assert len(set(seen)) == len(seen)  # every branch gave its own values


def test_an_if_model_takes_the_direct_route_and_records_why(tmp_path):
    """nnef-tools refuses any model of several subgraphs; the direct route converts it and is
    checked against LiteRT, both attempts recorded."""
    source = tmp_path / "if_nested.tflite"
    source.write_bytes(MEMBERS["if_nested"])
    record = conversion.to_onnx(source, "tflite", tmp_path / "model.onnx")
    assert record["route"] == DIRECT_TFLITE
    assert [(a["route"], a["status"]) for a in record["attempts"]] == [
        (NNEF_TOOLS_TFLITE, "failed"), (DIRECT_TFLITE, "used")]
    assert "sub-graphs" in record["attempts"][0]["reason"]


def test_while_becomes_a_loop_that_static_unrolls(tmp_path):
    """while_count (a counter i < 3, the body scales, shifts and ReLUs the input): an ONNX Loop
    with no trip count, its first condition the cond subgraph on the initial values and the next
    one computed in the body; equal to LiteRT bit for bit; the static stage unrolls it (3
    iterations, `until its condition turned false`), no Loop left."""
    import collections
    import onnx
    from pipeline.stages.static import make_static
    source = tmp_path / "while_count.tflite"
    source.write_bytes(MEMBERS["while_count"])
    model = tflite_onnx.convert(MEMBERS["while_count"])
    onnx.checker.check_model(model, full_check=True)
    assert [n.op_type for n in model.graph.node].count("Loop") == 1
    for seed in range(3):
        arrays = {"x": np.random.default_rng(seed).uniform(-1, 1, (1, fam.N)).astype(np.float32)}
        np.testing.assert_array_equal(_run(model, arrays)["y"], conversion.tflite_run(source, arrays)["y"])
    static, made = make_static(model, [{"name": "x", "shape": [1, fam.N], "dtype": "float32"}], ())
    (unrolled,) = [r for r in made["rewrites"] if r["rule"] == "unroll-loop"]
    assert "3 iterations" in unrolled["nodes"][0]
    assert collections.Counter(n.op_type for n in static.graph.node) == {"Mul": 3, "Add": 3, "Relu": 3}


def test_an_all_dynamic_input_is_checked_at_the_spec_shape_and_litert_refusals_are_errors(tmp_path):
    """dynamic_conv ([-1, -1] in): at 1x1 LiteRT cannot prepare its CONV_2D; that is a LiteRTError
    (a RuntimeError) naming the step, the shapes and LiteRT's reason (in the import: a failed
    route, see the build test below); checked at the spec's shape the direct route converts it
    and matches."""
    source = tmp_path / "dynamic_conv.tflite"
    source.write_bytes(MEMBERS["dynamic_conv"])
    with pytest.raises(conversion.LiteRTError, match=r"LiteRT cannot allocate \(prepare every op\) "
                       r"dynamic_conv.tflite at the input shapes \{'samples': \[1, 1\]\}: .*CONV_2D.* failed to prepare"):
        conversion.tflite_run(source, {"samples": np.zeros((1, 1), np.float32)})
    record = conversion.to_onnx(source, "tflite", tmp_path / "model.onnx", check_shapes={"samples": [1, 32]})
    assert record["route"] == DIRECT_TFLITE
    (used,) = [a for a in record["attempts"] if a["status"] == "used"]
    assert used["check"]["shapes"] == {"samples": [1, 32]} and used["check"]["max_abs"] < 1e-5
    # with a rewrite (ADD+RELU unfused), whose LiteRT check runs before any route: the same
    relu = tmp_path / "dynamic_conv_add_relu.tflite"
    relu.write_bytes(MEMBERS["dynamic_conv_add_relu"])
    with pytest.raises(conversion.ConversionError, match=r"LiteRT cannot run dynamic_conv_add_relu.tflite "
                       r"to check its TFLite rewrites \(at the input shapes stored in the file\): .*failed to prepare"):
        conversion.to_onnx(relu, "tflite", tmp_path / "relu.onnx")
    record = conversion.to_onnx(relu, "tflite", tmp_path / "relu.onnx", check_shapes={"samples": [1, 32]})
    assert [r["rule"] for r in record["rewrites"]] == ["unfuse-activation"]
    assert record["rewrites"][0]["check"]["model_outputs_max_abs"] == 0.0


def _model(workspace, name: str, key: str, shape: list[int], input_name: str) -> None:
    folder = workspace.models / name
    folder.mkdir(parents=True)
    path = folder / f"{name}.tflite"
    path.write_bytes(MEMBERS[key])
    (folder / "LICENSE").write_text("generated by tests/families/tflite_control.py (modelyard), no rights reserved\n")
    (folder / "model.yaml").write_text(
        f"description: {key}\nsource:\n  path: {name}.tflite\n  sha256: {sha256(path)}\n"
        f"license: [LICENSE]\ninputs:\n  {input_name}:\n    shape: {shape}\n    dtype: float32\n"
        f"    test_data:\n      random: {{seed: 3, low: 0.0, high: 1.0}}\n"
        f"tolerance:\n  max_abs: 1.0e-4\n  mean_abs: 1.0e-5\n  cosine: 0.999\n")


def test_if_and_dynamic_input_models_build_and_a_bad_shape_is_a_pipeline_error(workspace):
    """As models: if_data (a data-dependent If, left in the static model: its branches have one
    shape) and dynamic_conv at [1, 32] are imported by the direct route, golden from LiteRT,
    compiled by IREE for the host and validated; dynamic_conv at [1, 3] (the conv would have width
    -1) stops at import with the model, the stage, LiteRT's reason and a `next:`."""
    _model(workspace, "kws_if", "if_data", [1, fam.N], "x")
    _model(workspace, "mel_ok", "dynamic_conv", [1, 32], "samples")
    targets = target_registry(workspace.root / "targets",
                              lambda abi: abi.get("backend") == "llvm-cpu" and abi.get("compiler", "iree") == "iree")
    workspace.build("target=host", f"targets={targets}")
    doc = json.loads((workspace.artifacts / "host" / "manifest.json").read_text())
    for name in ("kws_if", "mel_ok"):
        entry = doc["models"][name]
        assert entry["source"]["route"] == DIRECT_TFLITE
        (art,) = entry["artifacts"].values()
        assert art["validation"]["status"] == "passed", (name, art["validation"])
    assert "If" in doc["models"]["kws_if"]["static_model"]["ops"]
    _model(workspace, "mel_short", "dynamic_conv", [1, 3], "samples")
    result = workspace.doit("import:mel_short")
    out = result.stdout + result.stderr
    assert result.returncode != 0 and "Traceback" not in out, out[-3000:]
    stopped = out.split("[model=mel_short stage=import]", 1)[1]
    assert "LiteRT cannot allocate (prepare every op)" in stopped and "next:" in stopped, out[-3000:]
