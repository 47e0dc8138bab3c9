"""The TFLite routes on generated graph families (issue 28, item 5; tests/families/tflite.py): each
member converted and compared with LiteRT on the original; the routes tried in order, each attempt
recorded with the op and reason of a refusal; a few members built through the pipeline to a
compiler. Figures measured: docs/measurements/2026-12-02-tflite-routes.md."""
from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import FIXTURES, REPO, sha256, target_registry
from families import tflite as fam
from families import tflite_state as fam_state
from pipeline.spec.sources import DIRECT_TFLITE, NNEF_TOOLS_TFLITE, read_signature
from pipeline.rewrite import sources as conversion
from pipeline.rewrite import tflite_onnx, tflite_state

MEMBERS = {f"{family}/{name}": data for family, name, data in fam.members()}


def _write(tmp_path, key: str):
    path = tmp_path / (key.replace("/", "_") + ".tflite")
    path.write_bytes(MEMBERS[key])
    return path


def _run_onnx(model, arrays: dict) -> dict:
    import onnxruntime as ort
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, arrays)))


# ----------------------------------------------------------------------------- the direct route
@pytest.mark.parametrize("key", sorted(MEMBERS))
def test_direct_route_matches_litert_on_every_member(tmp_path, key):
    """tflite_onnx on each member: valid ONNX with the source's interface (names, dtypes, batch -1
    kept as a free dim), onnxruntime's outputs equal LiteRT's: bit for bit on the full-integer
    members (QDQ, integer I/O), to float rounding on the others (2.4e-7..9.5e-7 measured)."""
    import onnx
    source = _write(tmp_path, key)
    model = tflite_onnx.convert(source.read_bytes())
    onnx.checker.check_model(model, full_check=True)
    signature = read_signature(source)
    arrays = conversion.check_inputs(signature, seed=3)
    want = conversion.tflite_run(source, arrays)
    got = _run_onnx(model, arrays)
    for kind, infos in (("inputs", model.graph.input), ("outputs", model.graph.output)):
        assert [i.name for i in infos] == [t["name"] for t in signature[kind]]
        for info, t in zip(infos, signature[kind]):
            assert onnx.helper.tensor_dtype_to_np_dtype(info.type.tensor_type.elem_type) == np.dtype(t["dtype"])
            dims = [d.dim_value if d.HasField("dim_value") else None for d in info.type.tensor_type.shape.dim]
            assert dims == t["dims"]
    for name, ref in want.items():
        assert got[name].dtype == ref.dtype and got[name].shape == ref.shape
        if key.startswith("quantized/") and ref.dtype.kind in "iu":
            np.testing.assert_array_equal(got[name], ref)
        else:
            assert np.abs(got[name] - ref).max() <= 2e-6 * max(1.0, float(np.abs(ref).max()))
    ops = {n.op_type for n in model.graph.node}
    if key.startswith("quantized/"):  # integer kept: the compilers see QDQ, not dequantized floats
        assert {"QuantizeLinear", "DequantizeLinear", "Conv", "Gemm"} <= ops
        assert any(i.data_type in (onnx.TensorProto.INT8, onnx.TensorProto.UINT8) for i in model.graph.initializer)
    if key.startswith("resize/"):
        assert "Resize" in ops


def test_full_integer_model_on_its_whole_input_range(tmp_path):
    """The uint8 member over 8 random frames spanning 0..255: outputs equal LiteRT's, bit for bit."""
    source = _write(tmp_path, "quantized/uint8")
    model = tflite_onnx.convert(source.read_bytes())
    rng = np.random.default_rng(11)
    for _ in range(8):
        x = {"input": rng.integers(0, 256, (1, 12, 12, 3)).astype(np.uint8)}
        np.testing.assert_array_equal(_run_onnx(model, x)["probs"], conversion.tflite_run(source, x)["probs"])


@pytest.mark.parametrize("path", [REPO / "models" / "face_landmark" / "face_landmark.tflite",
                                  *sorted((FIXTURES / "tflite_mediapipe").glob("*.tflite"))], ids=lambda p: p.stem)
def test_direct_route_on_real_graphs(path):
    """face_landmark (PRELU, fp16 weights through DEQUANTIZE) and the MediaPipe cuts (fused RELU6,
    sparse weights, the custom transposed convolution), after tflite_rewrite as the import does:
    tflite_onnx matches LiteRT on the original (face_landmark 4.6e-5 on outputs up to 158)."""
    from pipeline.rewrite import tflite_rewrite
    rewritten, _ = tflite_rewrite.rewrite(path.read_bytes())
    arrays = conversion.check_inputs(read_signature(path), seed=5)
    want = conversion.tflite_run(path, arrays)
    got = _run_onnx(tflite_onnx.convert(rewritten), arrays)
    for name, ref in want.items():
        assert np.abs(got[name] - ref).max() <= 2e-5 * max(1.0, float(np.abs(ref).max()))


def test_direct_route_names_the_op_and_reason_it_refuses():
    g = fam.Graph()
    x = g.tensor("x", [1, 4, 4, 2])
    y = g.tensor("y", [1, 4, 4, 2])
    g.op(fam._op("MIRROR_PAD"), [x, g.const("pads", np.array([[0, 0], [1, 1], [1, 1], [0, 0]], np.int32))],
         [g.tensor("padded", [1, 6, 6, 2])], g.options("MirrorPadOptions", mode=1), "MirrorPadOptions")
    g.op(fam._op("CUMSUM"), [x, g.const("axis", np.array(1, np.int32))], [y], g.options("CumsumOptions"),
         "CumsumOptions")
    with pytest.raises(tflite_onnx.Unsupported, match=r"op MIRROR_PAD \(operator #0\): SYMMETRIC mirror padding"):
        tflite_onnx.convert(g.finish([x], [y]))


# ----------------------------------------------------------------------------- routes tried in order
@pytest.mark.parametrize("key,refusal", [
    ("quantized/uint8", "AssertionError at nnef/shapes.py:"),
    ("resize/33to257_align_corners",
     "Conversion of operator 'RESIZE_BILINEAR' is not possible: bilinear resize must be integer up-sample"),
    ("l2norm/rank2", "Conversion of operator 'l2_normalization' is not possible: axes must be of length 1"),
    ("dilated/d2_same_m1", "onnxruntime cannot run the conversion: ")])
def test_a_refused_model_takes_the_next_route_and_records_why(tmp_path, key, refusal):
    """The classes the private corpus lost (nnef-tools' shape assertion on a full-integer model, a
    non-integer bilinear upsampling with align_corners, L2_NORMALIZATION) and a conversion
    onnxruntime refuses (dilated SAME): the first route's refusal is recorded with its op and
    reason, not the converter's last output line, and the second route is used, checked against
    LiteRT."""
    source = _write(tmp_path, key)
    out = tmp_path / "model.onnx"
    result = conversion.to_onnx(source, "tflite", out, log=tmp_path / "import.log")
    first, second = result["attempts"]
    assert first["route"] == NNEF_TOOLS_TFLITE and first["status"] == "failed"
    assert first["reason"].startswith(refusal), first["reason"]
    assert "output-shapes" not in first["reason"]
    assert result["route"] == second["route"] == DIRECT_TFLITE and second["status"] == "used"
    assert second["check"]["against"] == "litert (source)"
    assert second["check"]["max_abs"] <= 1e-6 * max(1.0, second["check"]["max_ref"])
    assert out.is_file()
    log = (tmp_path / "import.log").read_text()
    assert f"route {NNEF_TOOLS_TFLITE} failed: {first['reason']}" in log


def test_a_model_the_first_route_takes_stays_on_it(tmp_path):
    """The dynamic-batch SHAPE -> STRIDED_SLICE -> PACK -> RESHAPE chain: nnef-tools takes it (its
    shape ops folded), so it is used and the second route is not tried."""
    source = _write(tmp_path, "shape_chain/batch_-1")
    result = conversion.to_onnx(source, "tflite", tmp_path / "model.onnx")
    assert [(a["route"], a["status"]) for a in result["attempts"]] == [(NNEF_TOOLS_TFLITE, "used")]
    assert result["attempts"][0]["check"]["max_abs"] < 1e-5


def test_when_every_route_fails_the_error_names_each_op_and_reason(tmp_path):
    """An op neither route converts (REVERSE_V2, which LiteRT runs): the error lists both routes,
    each with the op and its reason. And an op whose builtin code is above 127 (CUMSUM): nnef-tools'
    reader reads only the deprecated 8-bit code (127 = "see builtin_code"), which is said as the
    exception and the frame that raised it."""
    def one_op(op, options, extra):
        g = fam.Graph()
        x, y = g.tensor("x", [1, 4, 8]), g.tensor("y", [1, 4, 8])
        g.op(fam._op(op), [x, g.const("axis", np.array(extra, np.int32))], [y], g.options(options), options)
        source = tmp_path / f"{op}.tflite"
        source.write_bytes(g.finish([x], [y]))
        with pytest.raises(conversion.ConversionError) as err:
            conversion.to_onnx(source, "tflite", tmp_path / "model.onnx")
        return str(err.value)
    message = one_op("REVERSE_V2", "ReverseV2Options", [1])
    assert message == (f"[{NNEF_TOOLS_TFLITE}] Conversion of operator 'REVERSE_V2' is not implemented; "
                       f"[{DIRECT_TFLITE}] op REVERSE_V2 (operator #0) has no conversion here")
    message = one_op("CUMSUM", "CumsumOptions", 1)
    assert message.startswith(f"[{NNEF_TOOLS_TFLITE}] KeyError: 127 at lite/reader.py:")
    assert message.endswith(f"[{DIRECT_TFLITE}] op CUMSUM (operator #0) has no conversion here")


def test_a_conversion_that_differs_from_litert_is_refused(tmp_path):
    """match_litert, the gate every route passes: a conversion whose outputs differ (here: the
    bias of the resize member's last convolution changed after conversion) is refused with the
    numbers."""
    import onnx
    from onnx import numpy_helper
    source = _write(tmp_path, "resize/8to16_asymmetric")
    model = tflite_onnx.convert(source.read_bytes())
    (bias,) = [i for i in model.graph.initializer if i.name == "mask_b"]
    bias.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(bias) + 0.5, "mask_b"))
    out = tmp_path / "wrong.onnx"
    onnx.save(model, out)
    with pytest.raises(conversion.ConversionError, match=r"output 'mask' differs from LiteRT by 0\.5"):
        conversion.match_litert(source, out, read_signature(source))


# ----------------------------------------------------------------------------- through the build
def test_refused_classes_build_to_a_compiler_and_record_their_route(workspace):
    """A full-integer int8 classifier (int8 in and out, per-channel weights), a 33 -> 257 align_corners segmentation
    head and an L2_NORMALIZATION embedding as models: imported by the second route (recorded in
    import.json and the manifest with the first route's reason), golden from LiteRT, static model
    checked, compiled by IREE for the host and validated."""
    models = {"kws_l2norm": ("l2norm/rank2", "float32", "{seed: 3, low: -1.0, high: 1.0}", "1.0e-4"),
              "seg_resize": ("resize/33to257_align_corners", "float32", "{seed: 3, low: 0.0, high: 1.0}", "1.0e-4"),
              "cls_int8": ("quantized/int8_per_channel", "int8", "{seed: 3, low: -128, high: 127}", "2.0")}
    for name, (key, dtype, data, tol) in models.items():
        folder = workspace.models / name
        folder.mkdir(parents=True)
        path = folder / f"{name}.tflite"
        path.write_bytes(MEMBERS[key])
        (folder / "LICENSE").write_text("generated by tests/families/tflite.py (modelyard), no rights reserved\n")
        (shape,) = [i["dims"] for i in read_signature(path)["inputs"]]
        (folder / "model.yaml").write_text(
            f"description: {key}\nsource:\n  path: {name}.tflite\n  sha256: {sha256(path)}\n"
            f"license: [LICENSE]\ninputs:\n  input:\n    shape: {shape}\n    dtype: {dtype}\n"
            f"    test_data:\n      random: {data}\n"
            f"tolerance:\n  max_abs: {tol}\n  mean_abs: 1.0\n  cosine: 0.999\n")
    targets = target_registry(workspace.root / "targets",
                              lambda abi: abi.get("backend") == "llvm-cpu" and abi.get("compiler", "iree") == "iree")
    workspace.build("target=host", f"targets={targets}")
    doc = json.loads((workspace.artifacts / "host" / "manifest.json").read_text())
    for name in models:
        imported = json.loads((workspace.artifacts / "models" / name / "import" / "import.json").read_text())
        assert imported["route"] == DIRECT_TFLITE
        assert [(a["route"], a["status"]) for a in imported["attempts"]] == [
            (NNEF_TOOLS_TFLITE, "failed"), (DIRECT_TFLITE, "used")]
        entry = doc["models"][name]
        assert entry["source"]["route"] == DIRECT_TFLITE and entry["source"]["attempts"] == imported["attempts"]
        (art,) = entry["artifacts"].values()
        assert art["validation"]["status"] == "passed", (name, art["validation"])
    assert doc["models"]["cls_int8"]["io"]["inputs"][0]["dtype"] == "int8"
    assert {"QuantizeLinear", "DequantizeLinear"} <= set(doc["models"]["cls_int8"]["static_model"]["ops"])


# ----------------------------------------------------------------------------- resource variables
STATEFUL = dict(fam_state.members())


def _ort_calls(model_bytes: bytes, record: dict, calls: list[dict]) -> list[dict]:
    """onnxruntime on the converted model, the state carried from the record's initial values."""
    import onnxruntime as ort
    session = ort.InferenceSession(model_bytes, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    state = tflite_state.initial_arrays(record)
    pairs = [(v["input"], v["output"]) for v in record["variables"] if "input" in v]
    out = []
    for arrays in calls:
        got = dict(zip(names, session.run(None, {**arrays, **state})))
        state = {i: got.pop(o) for i, o in pairs}
        out.append(got)
    return out


@pytest.mark.parametrize("key", sorted(STATEFUL))
def test_resource_variables_become_explicit_state(tmp_path, key):
    """Each streaming member (issue 40: VAR_HANDLE, READ_VARIABLE, ASSIGN_VARIABLE, a CALL_ONCE
    initialiser): one subgraph with each variable an input `<var>` and an output `<var>_out`, the
    interface the spec's signature announces; the initialiser folded into the recorded initial
    values (zeros, the int8 zero point, FILL 0.25 computed by LiteRT, 0.5); LiteRT on the rewrite
    with the state carried by hand equals LiteRT on the original with its variables, bit for bit,
    at each of 3 consecutive calls."""
    data = STATEFUL[key]
    source = tmp_path / f"{key}.tflite"
    source.write_bytes(data)
    explicit, record = tflite_state.explicit_state(data)
    record = tflite_state.check(data, explicit, record)
    assert record["check"]["calls"] == 3 and record["check"]["max_abs"] == 0.0
    assert not tflite_state.stateful(explicit)
    model = fam._schema().ModelT.InitFromPackedBuf(explicit, 0)
    assert len(model.subgraphs) == 1
    fills = {"float_zeros": {"frames": 0.0}, "float_two_vars": {"frames": 0.0, "total": 0.25},
             "int8": {"frames": -3}, "read_twice": {"frames": 0.5}}[key]
    assert {v["input"]: v["initial_fill"] for v in record["variables"]} == fills
    signature = read_signature(source)
    assert signature["state"] == [{"variable": v, "input": v, "output": f"{v}_out"} for v in fills]
    out = tmp_path / "model.onnx"
    result = conversion.to_onnx(source, "tflite", out)
    assert result["rewrites"][0]["rule"] == "explicit-state"
    import onnx
    converted = onnx.load(str(out))
    assert [i.name for i in converted.graph.input] == [i["name"] for i in signature["inputs"]]
    assert [o.name for o in converted.graph.output] == [o["name"] for o in signature["outputs"]]


@pytest.mark.parametrize("key", sorted(STATEFUL))
def test_the_converted_state_matches_litert_over_consecutive_calls(tmp_path, key):
    """The ONNX the import stage makes, run in onnxruntime for 3 calls with the state fed back,
    against LiteRT on the original keeping its variables: float members within 1e-6 of the
    outputs' magnitude, the int8 member bit for bit (state included, through 3 calls)."""
    data = STATEFUL[key]
    source = tmp_path / f"{key}.tflite"
    source.write_bytes(data)
    result = conversion.to_onnx(source, "tflite", tmp_path / "model.onnx")
    record = result["rewrites"][0]
    calls = [tflite_state.step_inputs(
        [{"name": i["name"], "dtype": i["dtype"], "shape": i["dims"]}
         for i in read_signature(source)["inputs"] if i["name"] not in
         {v["input"] for v in record["variables"]}], seed=7, call=k) for k in range(3)]
    want = tflite_state.run_original(data, calls)
    got = _ort_calls((tmp_path / "model.onnx").read_bytes(), record, calls)
    for w, g in zip(want, got):
        for name, ref in w.items():
            if ref.dtype.kind in "iu":
                np.testing.assert_array_equal(g[name], ref)
            else:
                assert np.abs(g[name] - ref).max() <= 1e-6 * max(1.0, float(np.abs(ref).max()))


def test_a_variable_without_initialiser_is_refused_with_its_name(tmp_path):
    g = fam_state.StatefulGraph()
    x = g.tensor("frame", [1, 1, fam_state.FRAME])
    prev = g.read("frames", [1, fam_state.KEEP, fam_state.FRAME])
    _, kept = fam_state._window(g, x, prev)
    g.assign("frames", kept)
    source = tmp_path / "bad.tflite"
    source.write_bytes(g.finish([x], [kept]))
    with pytest.raises(conversion.ConversionError,
                       match="resource variables: variable 'frames' has no initial value"):
        conversion.to_onnx(source, "tflite", tmp_path / "model.onnx")


def test_streaming_models_build_and_carry_state_through_the_shipped_artifact(workspace):
    """The int8 streaming member and the two-variable float one as models: imported with their
    variables explicit (recorded in import.json and the manifest with the initial values), golden
    from LiteRT, compiled by IREE for the host, validated; then the shipped .vmfb, called 3 times
    with its state outputs fed back from the recorded initial values, equals LiteRT on the
    original keeping its variables (int8 to the step, float to 1e-5). The int8 spec gives
    `max_abs: 4` for its int8 outputs (issue 40): validated as 4 steps and recorded so."""
    import iree.runtime as rt
    from pipeline.run.iree_load import to_host
    models = {"kws_int8": ("int8", "int8", "{seed: 3, low: -128, high: 127}", "4"),
              "kws_float": ("float_two_vars", "float32", "{seed: 3, low: -1.0, high: 1.0}", "1.0e-4")}
    for name, (key, dtype, data, tol) in models.items():
        folder = workspace.models / name
        folder.mkdir(parents=True)
        path = folder / f"{name}.tflite"
        path.write_bytes(STATEFUL[key])
        (folder / "LICENSE").write_text("generated by tests/families/tflite_state.py (modelyard), no rights reserved\n")
        inputs = "".join(f"  {i['name']}:\n    shape: {i['dims']}\n    dtype: {dtype}\n"
                         f"    test_data:\n      random: {data}\n" for i in read_signature(path)["inputs"])
        (folder / "model.yaml").write_text(
            f"description: {key}\nsource:\n  path: {name}.tflite\n  sha256: {sha256(path)}\n"
            f"license: [LICENSE]\ninputs:\n{inputs}"
            f"tolerance:\n  max_abs: {tol}\n  mean_abs: 1.0\n  cosine: 0.999\n")
    targets = target_registry(workspace.root / "targets",
                              lambda abi: abi.get("backend") == "llvm-cpu" and abi.get("compiler", "iree") == "iree")
    workspace.build("target=host", f"targets={targets}")
    doc = json.loads((workspace.artifacts / "host" / "manifest.json").read_text())
    for name, (key, *_) in models.items():
        imported = json.loads((workspace.artifacts / "models" / name / "import" / "import.json").read_text())
        (state,) = [r for r in imported["rewrites"] if r["rule"] == "explicit-state"]
        assert state["check"]["calls"] == 3 and doc["models"][name]["rewrites"][0] == state
        entry = doc["models"][name]
        ((abi, art),) = entry["artifacts"].items()
        assert art["validation"]["status"] == "passed", (name, art["validation"])
        vmfb = workspace.artifacts / "host" / name / abi / "iree_compile" / "model.vmfb"
        assert art["sha256"] == sha256(vmfb)  # the shipped bytes
        module = rt.load_vm_flatbuffer_file(str(vmfb), driver="local-task")
        names = [o["name"] for o in entry["io"]["outputs"]]
        order = [i["name"] for i in entry["io"]["inputs"]]
        pairs = [(v["input"], v["output"]) for v in state["variables"]]
        calls = [tflite_state.step_inputs([{"name": "frame", "dtype": dtype, "shape": [1, 1, 8]}
                                           for dtype in [models[name][1]]], seed=11, call=k)
                 for k in range(3)]
        carried = tflite_state.initial_arrays(state)
        want = tflite_state.run_original(STATEFUL[key], calls)
        for k, arrays in enumerate(calls):
            results = module[art["entry"]](*[{**arrays, **carried}[n] for n in order])
            got = dict(zip(names, [to_host(r) for r in results]))
            carried = {i: got.pop(o) for i, o in pairs}
            for out, ref in want[k].items():
                if ref.dtype.kind in "iu":
                    np.testing.assert_array_equal(got[out].view(ref.dtype), ref, err_msg=f"{name} call {k}")
                else:
                    assert np.abs(got[out] - ref).max() <= 1e-5, (name, k, out)
    rows = doc["models"]["kws_int8"]["artifacts"]
    (art,) = rows.values()
    assert all(r["integer_steps"] == 4 and r["integer_steps_from"] == "max_abs"
               for r in art["validation"]["outputs"])


def test_a_variable_only_read_is_a_constant_and_one_only_assigned_is_dropped(tmp_path):
    """`offset` is read and never assigned: its initial value becomes a constant, no state;
    `dead` is assigned and never read: nothing observes it, dropped; both recorded. The signature
    and the rewrite agree (only `frames` is state) and LiteRT agrees over 3 calls."""
    g = fam_state.StatefulGraph()
    g.initialise("frames", np.zeros((1, fam_state.KEEP, fam_state.FRAME), np.float32))
    g.initialise("offset", np.full((1, fam_state.KEEP, fam_state.FRAME), 0.75, np.float32))
    g.initialise("dead", np.zeros((1, fam_state.KEEP, fam_state.FRAME), np.float32))
    x = g.tensor("frame", [1, 1, fam_state.FRAME])
    prev = g.read("frames", [1, fam_state.KEEP, fam_state.FRAME])
    _, kept = fam_state._window(g, x, prev)
    g.assign("frames", kept)
    g.assign("dead", kept)
    offset = g.read("offset", [1, fam_state.KEEP, fam_state.FRAME])
    y = g.tensor("shifted", [1, fam_state.KEEP, fam_state.FRAME])
    g.op(fam._op("ADD"), [kept, offset], [y], g.options("AddOptions"), "AddOptions")
    data = g.finish([x], [y])
    explicit, record = tflite_state.explicit_state(data)
    record = tflite_state.check(data, explicit, record)
    by_var = {v["variable"]: v for v in record["variables"]}
    assert by_var["offset"]["constant"].startswith("read, never assigned")
    assert by_var["dead"]["dropped"].startswith("assigned, never read")
    assert by_var["frames"]["output"] == "frames_out"
    source = tmp_path / "mixed.tflite"
    source.write_bytes(data)
    assert read_signature(source)["state"] == [{"variable": "frames", "input": "frames",
                                                "output": "frames_out"}]
    details = tflite_state._interpreter(explicit)
    assert [d["name"] for d in details.get_input_details()] == ["frame", "frames"]
    assert [d["name"] for d in details.get_output_details()] == ["shifted", "frames_out"]
