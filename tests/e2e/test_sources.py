"""TFLite and NNEF sources (pipeline/spec/sources.py; their conversion, pipeline/rewrite/sources.py)
and shape variants (pipeline/spec/shapes.py)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from conftest import (FIXTURES, REPO, add_default_model, add_fixture_model, add_tiny_model,
                      require_aarch64, sha256, target_registry)
from pipeline.spec import sources
from pipeline.rewrite import sources as conversion
from pipeline.core.errors import SpecError
from pipeline.graph import load_project
from pipeline.spec import load_models

NNEF_FIXTURE = FIXTURES / "ppocr_cls_nnef"
CLS_ONNX = REPO / "models" / "ppocr_cls" / "ch_ppocr_mobile_v2.0_cls_infer.onnx"


def custom_op_tflite(path: Path, op: str = "MyCustomOp") -> Path:
    """A valid one-op TFLite flatbuffer y = op(x), x, y f32[1, 4], whose op is a custom one."""
    import flatbuffers
    b = flatbuffers.Builder(1024)

    def ints(xs):
        b.StartVector(4, len(xs), 4)
        for x in reversed(xs):
            b.PrependInt32(x)
        return b.EndVector()

    def offsets(xs):
        b.StartVector(4, len(xs), 4)
        for x in reversed(xs):
            b.PrependUOffsetTRelative(x)
        return b.EndVector()

    tensors = []
    for name in ("x", "y"):  # Tensor: shape(0), type(1), buffer(2), name(3)
        n, shape = b.CreateString(name), ints([1, 4])
        b.StartObject(4)
        b.PrependUOffsetTRelativeSlot(0, shape, 0)
        b.PrependInt8Slot(1, 0, 1)  # FLOAT32
        b.PrependUOffsetTRelativeSlot(3, n, 0)
        tensors.append(b.EndObject())
    op_in, op_out = ints([0]), ints([1])
    b.StartObject(3)  # Operator: opcode_index(0), inputs(1), outputs(2)
    b.PrependUOffsetTRelativeSlot(1, op_in, 0)
    b.PrependUOffsetTRelativeSlot(2, op_out, 0)
    operator = b.EndObject()
    tv, ov, g_in, g_out = offsets(tensors), offsets([operator]), ints([0]), ints([1])
    b.StartObject(4)  # SubGraph: tensors(0), inputs(1), outputs(2), operators(3)
    for slot, value in enumerate((tv, g_in, g_out, ov)):
        b.PrependUOffsetTRelativeSlot(slot, value, 0)
    subgraph = b.EndObject()
    custom = b.CreateString(op)
    b.StartObject(4)  # OperatorCode: deprecated_builtin_code(0), custom_code(1), version(2), builtin_code(3)
    b.PrependInt8Slot(0, 32, 0)  # CUSTOM
    b.PrependUOffsetTRelativeSlot(1, custom, 0)
    b.PrependInt32Slot(2, 1, 0)
    b.PrependInt32Slot(3, 32, 0)
    code = b.EndObject()
    b.StartObject(0)
    empty_buffer = b.EndObject()
    codes, subgraphs, buffers = offsets([code]), offsets([subgraph]), offsets([empty_buffer])
    b.StartObject(5)  # Model: version(0), operator_codes(1), subgraphs(2), description(3), buffers(4)
    b.PrependUint32Slot(0, 3, 0)
    b.PrependUOffsetTRelativeSlot(1, codes, 0)
    b.PrependUOffsetTRelativeSlot(2, subgraphs, 0)
    b.PrependUOffsetTRelativeSlot(4, buffers, 0)
    b.Finish(b.EndObject(), file_identifier=b"TFL3")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(bytes(b.Output()))
    return path


def spec_for(folder: Path, source: str, sha: str, inputs: dict, tolerance: str, extra: str = "") -> None:
    lines = [f"description: {folder.name}", "source:", f"  path: {source}", f"  sha256: {sha}", "inputs:"]
    for name, (shape, seed, low, high) in inputs.items():
        lines += [f"  {name}:", f"    shape: {shape}", "    dtype: float32", "    test_data:",
                  f"      random: {{seed: {seed}, low: {low}, high: {high}}}"]
    (folder / "model.yaml").write_text("\n".join(lines) + "\ntolerance:\n" + tolerance + extra)


# ----------------------------------------------------------------------------- TFLite
def test_tflite_source_golden_from_the_interpreter_and_nhwc_conversion(workspace):
    """face_landmark.tflite: golden = LiteRT itself; the ONNX route keeps NHWC and matches it."""
    add_default_model(workspace.models, "face_landmark")
    result = workspace.doit("static")
    assert result.returncode == 0, result.stdout + result.stderr
    a = workspace.artifacts / "models" / "face_landmark"
    imported = json.loads((a / "import" / "import.json").read_text())
    assert imported["format"] == "tflite" and imported["route"] == sources.NNEF_TOOLS_TFLITE
    assert set(imported["ops"]) >= {"Conv", "PRelu", "Transpose"}  # NHWC kept at the boundary

    golden = json.loads((a / "golden" / "golden.json").read_text())
    assert [o["name"] for o in golden["outputs"]] == ["conv2d_21", "conv2d_31"]
    x = np.load(a / "golden" / "input_0.npy")
    assert x.shape == (1, 192, 192, 3) and 0 <= x.min() and x.max() <= 1
    again = conversion.tflite_run(REPO / "models" / "face_landmark" / "face_landmark.tflite", {"input_1": x})
    for k, name in enumerate(["conv2d_21", "conv2d_31"]):  # golden is the interpreter, bit for bit
        np.testing.assert_array_equal(np.load(a / "golden" / f"output_{k}.npy"), again[name])

    static = json.loads((a / "static" / "static.json").read_text())
    assert static["inputs"] == [{"name": "input_1", "shape": [1, 192, 192, 3]}]
    assert static["outputs"][0]["shape"] == [1, 1, 1, 1404]
    rows = {r["name"]: r for r in static["vs_original"]["outputs"]}
    assert rows["conv2d_21"]["max_abs"] < 2e-4  # 3e-5 measured, on landmarks up to ~190 px
    assert rows["conv2d_21"]["cosine"] > 0.999999


def test_tflite_custom_op_is_a_clear_import_error(workspace):
    folder = workspace.models / "custom"
    source = custom_op_tflite(folder / "custom.tflite")
    spec_for(folder, "custom.tflite", sha256(source), {"x": ([1, 4], 0, -1, 1)},
             "  max_abs: 1.0e-5\n  mean_abs: 1.0e-6\n  cosine: 0.99999\n")
    result = workspace.doit("import")
    assert result.returncode != 0
    out = result.stdout + result.stderr
    assert "[model=custom stage=import]" in out
    assert "custom op(s) MyCustomOp" in out and "builtin TFLite ops" in out


# ----------------------------------------------------------------------------- NNEF
def test_nnef_fixture_round_trip_matches_the_original_onnx(tmp_path):
    """The committed NNEF graph (made from models/ppocr_cls by make_fixture.py) -> ONNX == the original."""
    import onnxruntime as ort
    out = tmp_path / "back.onnx"
    conversion.to_onnx(NNEF_FIXTURE / "cls.nnef", "nnef", out)
    x = np.random.default_rng(7).uniform(-1, 1, (1, 3, 48, 192)).astype(np.float32)
    (want,) = ort.InferenceSession(str(CLS_ONNX)).run(None, {"x": x})
    back = ort.InferenceSession(str(out))
    assert [i.name for i in back.get_inputs()] == ["x"]  # weights are not inputs any more
    (got,) = back.run(None, {"x": x})
    assert got.shape == want.shape == (1, 2)
    assert np.abs(got - want).max() < 1e-6  # 2.4e-7 measured
    assert (NNEF_FIXTURE / "LICENSE").is_file() and (NNEF_FIXTURE / "MODEL_LICENSES.md").is_file()


def test_nnef_source_builds_through_the_onnx_stages(workspace):
    folder = workspace.models / "cls_nnef"
    shutil.copytree(NNEF_FIXTURE / "cls.nnef", folder / "cls.nnef")
    spec_for(folder, "cls.nnef", sources.source_sha256(folder / "cls.nnef"),
             {"x": ([1, 3, 48, 192], 1, -1.0, 1.0)},
             "  max_abs: 1.0e-5\n  mean_abs: 1.0e-6\n  cosine: 0.999999\n")
    result = workspace.doit("static")
    assert result.returncode == 0, result.stdout + result.stderr
    a = workspace.artifacts / "models" / "cls_nnef"
    assert json.loads((a / "import" / "import.json").read_text())["route"] == "nnef->onnx (nnef-tools)"
    assert json.loads((a / "static" / "static.json").read_text())["outputs"][0]["shape"] == [1, 2]
    # the golden (onnxruntime on the conversion) agrees with the original ONNX model on its inputs
    import onnxruntime as ort
    x = np.load(a / "golden" / "input_0.npy")
    (want,) = ort.InferenceSession(str(CLS_ONNX)).run(None, {"x": x})
    assert np.abs(np.load(a / "golden" / "output_0.npy") - want).max() < 1e-6


def test_nnef_folder_without_graph_file_is_a_spec_error(tmp_path):
    folder = tmp_path / "models" / "broken_nnef"
    shutil.copytree(NNEF_FIXTURE / "cls.nnef", folder / "cls.nnef")
    (folder / "cls.nnef" / "graph.nnef").unlink()
    spec_for(folder, "cls.nnef", sources.source_sha256(folder / "cls.nnef"),
             {"x": ([1, 3, 48, 192], 1, -1.0, 1.0)}, "  max_abs: 1.0\n  mean_abs: 1.0\n  cosine: 0.9\n")
    with pytest.raises(SpecError) as err:
        load_models(tmp_path / "models")
    text = err.value.render()
    assert "[stage=spec]" in text and "broken_nnef/model.yaml" in text
    assert "NNEF folder cls.nnef/ has no graph.nnef" in text


# ----------------------------------------------------------------------------- variants
VARIANTS = """shapes:   # the tiny model has a dynamic batch (16x16 is fixed)
  b2:
    inputs:
      x: {shape: [2, 3, 16, 16]}
  b4:
    inputs:
      x: {shape: [4, 3, 16, 16]}
"""


def test_variants_fan_out_in_the_task_graph(tmp_path):
    models = tmp_path / "models"
    spec = add_tiny_model(models, "tiny")
    spec.write_text(spec.read_text() + VARIANTS)
    project = load_project(models, tmp_path / "artifacts", "rk3588")
    names = [m.name for m in project.models]
    assert names == ["tiny", "tiny.b2", "tiny.b4"]
    assert [s.name for s in project.steps("import")] == ["tiny"]  # one source, one import
    assert [s.name for s in project.steps("golden")] == names
    static = {s.name: s for s in project.steps("static")}
    assert static["tiny.b4"].config["inputs"][0]["shape"] == [4, 3, 16, 16]
    assert static["tiny.b2"].inputs["model"] == tmp_path / "artifacts/models/tiny/import/model.onnx"
    compiled = [s.name for s in project.steps("iree_compile") if "twin" not in s.name]
    for name in names:
        for abi in ("vulkan-mali-g610", "vulkan-baseline", "cpu-aarch64"):
            assert f"rk3588/{name}/{abi}" in compiled
    (manifest,) = project.steps("manifest")
    cfg = {m["name"]: m for m in manifest.config["models"]}
    assert cfg["tiny"]["shapes"] == ["tiny.b2", "tiny.b4"]
    assert cfg["tiny.b2"]["shape_of"] == "tiny" and cfg["tiny.b2"]["shape"] == "b2"


def test_variant_contradicting_a_fixed_dim_is_a_spec_error(tmp_path):
    models = tmp_path / "models"
    spec = add_tiny_model(models, "tiny")
    spec.write_text(spec.read_text() + "shapes:\n  wide:\n    inputs:\n      x: {shape: [1, 4, 16, 16]}\n"
                    "  bad-dims:\n    inputs:\n      x: {shape: [1, 3, 0]}\n")
    with pytest.raises(SpecError) as err:
        load_models(models)
    text = err.value.render()
    assert "shapes.wide: inputs.x.shape[1]: 4 contradicts the model's fixed dim 3" in text
    assert "shapes.bad-dims.inputs.x.shape: expected a list of positive integers" in text


def test_variant_whose_shape_the_model_rejects_fails_naming_model_variant_stage(workspace):
    """PP-OCR det needs H, W multiples of 32: a 40x40 variant passes the spec, and golden says no."""
    spec = add_default_model(workspace.models, "ppocr_det")
    spec.write_text(spec.read_text() + "shapes:\n  40x40:\n    inputs:\n      x: {shape: [1, 3, 40, 40]}\n")
    result = workspace.doit("golden")
    assert result.returncode != 0
    out = result.stdout + result.stderr
    assert "[model=ppocr_det.40x40 stage=golden]" in out
    assert "cannot run the source model on the test inputs [[1, 3, 40, 40]]" in out
    assert "the model may not accept these shapes" in out
    assert (workspace.artifacts / "models" / "ppocr_det" / "golden" / "golden.json").is_file()


# ----------------------------------------------------------------------------- basic-pitch, two formats
BASIC_PITCH = ("basic_pitch", "basic_pitch_tflite")  # tests/fixtures: nmp.onnx and nmp.tflite


def test_basic_pitch_onnx_and_tflite_sources_build_and_their_artifacts_agree(workspace):
    """The same audio CNN as .onnx and .tflite, built as two models for the host and the RK3588 CPU
    (aarch64, run under qemu): every artifact passes against its own golden (onnxruntime / LiteRT),
    the two goldens agree, and the two sources' artifacts agree with each other and with both goldens.
    Needs: shape-op folding on the TFLite route, NNEF `stack` (pipeline/rewrite/nnef_fixes.py), and the
    static stage's reflect-pad-as-gather rewrite for IREE. Measured on the shared 2-core machine
    (load 2-4): cold build of both models for host + rk3588 CPU 92 s (the ONNX source alone 52 s),
    this whole test ~2 min; too slow for a default model, so the two specs are test fixtures."""
    require_aarch64()
    for name in BASIC_PITCH:
        add_fixture_model(workspace.models, name)
    spec = {n: (FIXTURES / n / "model.yaml").read_text() for n in BASIC_PITCH}
    for name, fmt in zip(BASIC_PITCH, ("onnx", "tflite")):  # the very files of ../shared/models
        assert sha256(FIXTURES / name / f"nmp.{fmt}") in spec[name]
        assert (FIXTURES / name / "LICENSE").read_text().startswith("Copyright 2022 Spotify AB")
    # IREE's CPU ABIs of the real targets: this test is about the sources (TVM: tests/e2e/test_tvm.py)
    targets = target_registry(workspace.root / "targets", lambda abi: abi.get("backend") == "llvm-cpu")
    workspace.build("target=host", f"targets={targets}")
    workspace.build("target=rk3588", f"targets={targets}")

    a = workspace.artifacts / "models"
    assert json.loads((a / "basic_pitch_tflite" / "import" / "import.json").read_text())["route"] == \
        sources.NNEF_TOOLS_TFLITE
    log = (workspace.artifacts / "logs" / "import" / "basic_pitch_tflite.log").read_text()
    assert "folded 8 constant shape op(s): {'PACK': 4, 'STRIDED_SLICE': 4}" in log
    for name in BASIC_PITCH:  # IREE cannot compile basic-pitch's reflect Pads; the Gathers it can
        static = json.loads((a / name / "static" / "static.json").read_text())
        (rewrite,) = static["rewrites"]
        assert rewrite["rule"] == "reflect-pad-as-gather" and len(rewrite["nodes"]) == 9
        assert "Pad" in static["ops"] and "Gather" in static["ops"]  # the constant Pads stay

    x = np.load(a / "basic_pitch" / "golden" / "input_0.npy")
    np.testing.assert_array_equal(x, np.load(a / "basic_pitch_tflite" / "golden" / "input_0.npy"))
    names = [o["name"] for o in json.loads((a / "basic_pitch" / "golden" / "golden.json").read_text())["outputs"]]
    assert names == ["StatefulPartitionedCall:2", "StatefulPartitionedCall:1", "StatefulPartitionedCall:0"]
    golden = {n: [np.load(a / n / "golden" / f"output_{k}.npy") for k in range(3)] for n in BASIC_PITCH}
    for g_onnx, g_tfl in zip(*golden.values()):  # onnxruntime on nmp.onnx vs LiteRT on nmp.tflite
        assert g_onnx.shape == g_tfl.shape and np.abs(g_onnx - g_tfl).max() < 1e-4  # 4.2e-5 measured

    from pipeline.app import Runner
    for target, abi in (("host", "cpu-x86_64"), ("rk3588", "cpu-aarch64")):
        manifest = workspace.artifacts / target / "manifest.json"
        doc = json.loads(manifest.read_text())
        results = {}
        for name in BASIC_PITCH:
            model = doc["models"][name]
            assert sorted(model["artifacts"]) == [abi]
            val = model["artifacts"][abi]["validation"]
            assert val["status"] == "passed" and val["executed"]["emulated"] is (abi == "cpu-aarch64")
            assert all(row["failures"] == [] for row in val["outputs"])
            runner = Runner.open(manifest, name, prefer=abi)
            results[name] = runner.run(x)
        for k, (from_onnx, from_tfl) in enumerate(zip(*results.values())):
            assert from_onnx.shape == from_tfl.shape == golden["basic_pitch"][k].shape
            # measured (IREE 3.13, both ABIs): the two sources' artifacts give identical numbers
            # (max abs 0.0), 5.7e-7 from onnxruntime's golden, 4.3e-5 from LiteRT's
            assert np.abs(from_onnx - from_tfl).max() < 1e-5
            for art in (from_onnx, from_tfl):
                assert np.abs(art - golden["basic_pitch"][k]).max() < 1e-5
                assert np.abs(art - golden["basic_pitch_tflite"][k]).max() < 1e-4


def test_reflect_pad_as_gather_is_exact_and_leaves_other_pads_alone():
    """The static stage's rewrite: reflect Pads (any rank, several axes, opset 18 `axes`) become Gathers
    that give the same values bit for bit; constant Pads are kept."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper
    from pipeline.rewrite.static_rewrites import reflect_pads_as_gathers

    def model(pads, mode, shape, opset, axes=None):
        inits = [numpy_helper.from_array(np.array(pads, np.int64), "p")]
        ins = ["x", "p"]
        if axes is not None:
            inits.append(numpy_helper.from_array(np.array(axes, np.int64), "axes"))
            ins += ["", "axes"]
        graph = helper.make_graph([helper.make_node("Pad", ins, ["y"], mode=mode, name="pad")], "g",
                                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        return onnx.shape_inference.infer_shapes(m, strict_mode=True)

    x = np.random.default_rng(0).standard_normal((1, 3, 200)).astype(np.float32)
    cases = [([0, 0, 128, 0, 0, 64], "reflect", 17, None), ([0, 1, 5, 0, 2, 7], "reflect", 17, None),
             ([128, 2, 64, 1], "reflect", 18, [-1, 1]), ([0, 0, 4, 0, 0, 4], "constant", 17, None)]
    for pads, mode, opset, axes in cases:
        m = model(pads, mode, list(x.shape), opset, axes)
        (want,) = ort.InferenceSession(m.SerializeToString()).run(None, {"x": x})
        replaced = reflect_pads_as_gathers(m)
        assert replaced == ([] if mode == "constant" else ["pad"])
        assert {n.op_type for n in m.graph.node} == ({"Pad"} if mode == "constant" else {"Gather"})
        onnx.checker.check_model(m)
        (got,) = ort.InferenceSession(m.SerializeToString()).run(None, {"x": x})
        np.testing.assert_array_equal(got, want)


def test_a_layout_flip_in_the_conversion_is_named_never_silent():
    nhwc = {"inputs": [{"name": "input_1", "dtype": "float32", "dims": [1, 192, 192, 3]}],
            "outputs": [{"name": "y", "dtype": "float32", "dims": [1, 10]}]}
    nchw = {"inputs": [{"name": "input_1", "dtype": "float32", "dims": [1, 3, 192, 192]}],
            "outputs": [{"name": "y", "dtype": "float32", "dims": [1, 10]}]}
    assert conversion.io_mismatches(nhwc, nhwc) == []
    (problem,) = conversion.io_mismatches(nhwc, nchw)
    assert "input 'input_1': shape [1, 192, 192, 3] became [1, 3, 192, 192]" in problem
    assert "NHWC -> NCHW" in problem


def test_variants_build_validate_and_are_listed_in_the_manifest_for_apps(workspace):
    """Built for the host: each variant has its own artifact; the runtime helper opens it by name."""
    spec = add_tiny_model(workspace.models, "tiny")
    spec.write_text(spec.read_text() + "shapes:\n  b2:\n    inputs:\n      x: {shape: [2, 3, 16, 16]}\n")
    workspace.build("target=host")
    doc = json.loads((workspace.artifacts / "host" / "manifest.json").read_text())
    base, variant = doc["models"]["tiny"], doc["models"]["tiny.b2"]
    assert base["shapes"] == ["tiny.b2"] and "shape_of" not in base
    assert (variant["shape_of"], variant["shape"]) == ("tiny", "b2")
    assert variant["io"]["inputs"][0]["shape"] == [2, 3, 16, 16]
    assert variant["io"]["outputs"][0]["shape"] == [2, 10]
    assert base["source"] == variant["source"]
    a, b = base["artifacts"]["cpu-x86_64"], variant["artifacts"]["cpu-x86_64"]
    assert a["sha256"] != b["sha256"] and b["validation"]["status"] == "passed"
    from pipeline.app import Runner
    runner = Runner.open(workspace.artifacts / "host" / "manifest.json", "tiny.b2")
    x = np.load(workspace.artifacts / "models" / "tiny.b2" / "golden" / "input_0.npy")
    (y,) = runner.run(x)
    golden = np.load(workspace.artifacts / "models" / "tiny.b2" / "golden" / "output_0.npy")
    assert y.shape == (2, 10) and np.abs(y - golden).max() < 1e-4
