"""The TFLite route on real MediaPipe graphs (issue 13, item 1): fused activations, sparse weights
(DENSIFY) and MediaPipe's custom op Convolution2DTransposeBias, each a small graph cut from the
models of ../shared/models (tests/fixtures/tflite_mediapipe/make_fixtures.py), converted by the
import stage's route (pipeline/rewrite/sources.py, tflite_rewrite.py, nnef_fixes.py) and compared
with LiteRT on the original."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from conftest import FIXTURES, REPO, sha256, target_registry
from pipeline.rewrite import sources as conversion
from pipeline.rewrite import tflite_rewrite

FIX = FIXTURES / "tflite_mediapipe"


def _schema():
    from ai_edge_litert import schema_py_generated as S
    return S


def _edit(data: bytes, change) -> bytes:
    """The TFLite model after `change(model)` (object API), packed again."""
    import flatbuffers
    model = _schema().ModelT.InitFromPackedBuf(data, 0)
    change(model)
    b = flatbuffers.Builder(len(data) + 1024)
    b.Finish(model.Pack(b), file_identifier=b"TFL3")
    return bytes(b.Output())


def _ops(data: bytes) -> list[str]:
    S = _schema()
    names = {v: k for k, v in vars(S.BuiltinOperator).items() if not k.startswith("_")}
    model = S.ModelT.InitFromPackedBuf(data, 0)
    out = []
    for op in model.subgraphs[0].operators:
        code = model.operatorCodes[op.opcodeIndex]
        b = max(code.builtinCode, code.deprecatedBuiltinCode)
        out.append(code.customCode.decode() if b == 32 else names[b])
    return out


def _input(path: Path, seed: int = 1) -> dict:
    from pipeline.spec.sources import read_signature
    rng = np.random.default_rng(seed)
    return {i["name"]: rng.uniform(0, 1, i["dims"]).astype(np.float32) for i in read_signature(path)["inputs"]}


def _onnx_vs_litert(tflite: Path, tmp_path: Path) -> tuple[float, float, list, list]:
    """Convert through the import route; (max abs error vs LiteRT, LiteRT's max abs, the rewrites,
    the ONNX op types)."""
    import onnx
    import onnxruntime as ort
    out = tmp_path / (tflite.stem + ".onnx")
    rewrites = conversion.to_onnx(tflite, "tflite", out, log=tmp_path / "convert.log")["rewrites"]
    x = _input(tflite)
    want = conversion.tflite_run(tflite, x)
    sess = ort.InferenceSession(str(out))
    got = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, x)))
    assert sorted(got) == sorted(want)
    err = max(float(np.abs(got[k] - want[k]).max()) for k in want)
    scale = max(float(np.abs(want[k]).max()) for k in want)
    return err, scale, rewrites, sorted({n.op_type for n in onnx.load(str(out)).graph.node})


# ----------------------------------------------------------------------------- fused activations
def test_fused_relu6_converts_and_matches_litert(tmp_path):
    """hand_landmark_full's convolutions with fused RELU6: nnef-tools wrote an NNEF `relu6` it could
    not read back ("shape inference function is not defined for operation 'relu6'"); the route now
    decomposes it into clamp (ONNX Clip). No rewrite of the TFLite graph is needed."""
    err, scale, rewrites, ops = _onnx_vs_litert(FIX / "hand_relu6.tflite", tmp_path)
    assert rewrites == []
    assert "Clip" in ops and "Conv" in ops
    assert scale > 1 and err < 1e-4  # 9.8e-6 measured, outputs up to 11


@pytest.mark.parametrize("activation", [2, 3, 4])  # RELU_N1_TO_1, RELU6, TANH
def test_every_fused_activation_survives_the_conversion(tmp_path, activation):
    """The sparse face-detection cut with its convolutions' and its ADD's fused activation set to
    each kind: convolutions keep theirs (nnef-tools converts them, RELU_N1_TO_1 through a fragment
    added by nnef_fixes), the ADD's is moved into an op of its own (nnef-tools drops an ADD's fused
    activation without a word), and the ONNX model still equals LiteRT on the original."""
    def set_activation(model):
        for op in model.subgraphs[0].operators:
            if hasattr(op.builtinOptions, "fusedActivationFunction"):
                op.builtinOptions.fusedActivationFunction = activation
    source = tmp_path / "model.tflite"
    source.write_bytes(_edit((FIX / "face_detection_sparse.tflite").read_bytes(), set_activation))
    err, scale, rewrites, ops = _onnx_vs_litert(source, tmp_path)
    rules = {r["rule"]: r for r in rewrites}
    name = {2: "RELU_N1_TO_1", 3: "RELU6", 4: "TANH"}[activation]
    if activation == 4:  # LiteRT's kernels ignore a fused TANH here: dropped, as LiteRT computes
        assert rules["drop-ignored-activation"]["by_op"] == {
            "ADD+TANH": 1, "CONV_2D+TANH": 3, "DEPTHWISE_CONV_2D+TANH": 2}
        assert "unfuse-activation" not in rules and "Tanh" not in ops
    else:
        assert rules["unfuse-activation"]["by_op"] == {f"ADD+{name}": 1}
        assert "Clip" in ops
    assert all(r["check"].get("model_outputs_max_abs") == 0.0 for r in rewrites)
    assert err < 1e-4 * max(1.0, scale)


# ----------------------------------------------------------------------------- sparse weights
def test_sparse_weights_are_densified_at_load_and_checked_against_litert(tmp_path):
    """face_detection_full_range_sparse: nnef-tools read the sparse fp16 buffers as dense ones
    ("cannot reshape array of size 96 into shape (16,1,1,24)"). Densified at load, each constant
    equals what LiteRT's own DENSIFY makes of it, bit for bit; the model converts and matches."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType
    source = FIX / "face_detection_sparse.tflite"
    data = source.read_bytes()
    assert _ops(data).count("DENSIFY") == 2
    rewritten, rewrites = tflite_rewrite.rewrite(data)
    assert "DENSIFY" not in _ops(rewritten) and "ADD" in _ops(rewritten) and "RELU" in _ops(rewritten)
    model = _schema().ModelT.InitFromPackedBuf(rewritten, 0)
    assert all(t.sparsity is None for t in model.subgraphs[0].tensors)
    (densify,) = [r for r in rewrites if r["rule"] == "densify"]
    assert densify["count"] == 2

    # independently of tflite_rewrite.check: LiteRT's DENSIFY outputs of the original model
    interp = Interpreter(model_content=data, experimental_preserve_all_tensors=True,  # no XNNPACK
                         experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    interp.allocate_tensors()
    interp.set_tensor(interp.get_input_details()[0]["index"], next(iter(_input(source).values())))
    interp.invoke()
    original = _schema().ModelT.InitFromPackedBuf(data, 0)
    sub = original.subgraphs[0]
    densify_outputs = [int(op.outputs[0]) for op in sub.operators
                       if max(original.operatorCodes[op.opcodeIndex].builtinCode,
                              original.operatorCodes[op.opcodeIndex].deprecatedBuiltinCode) == 124]
    new_sub = model.subgraphs[0]
    by_name = {t.name: t for t in new_sub.tensors}
    for index in densify_outputs:
        tensor = by_name[sub.tensors[index].name]
        ours = np.frombuffer(np.asarray(model.buffers[tensor.buffer].data, np.uint8).tobytes(), np.float16)
        litert = interp.get_tensor(index)
        assert litert.dtype == np.float16 and ours.size == litert.size
        np.testing.assert_array_equal(ours.reshape(litert.shape), litert)

    checked = tflite_rewrite.check(data, rewritten, rewrites)
    assert checked[0]["check"]["max_abs"] == 0.0 and checked[0]["check"]["model_outputs_max_abs"] == 0.0

    err, scale, _, ops = _onnx_vs_litert(source, tmp_path)
    assert scale > 1 and err < 1e-4  # 9.5e-6 measured, outputs up to 36
    assert "Relu" in ops  # the ADD's fused ReLU: without unfuse-activation it was lost (error 28)


def test_densify_handles_blocks_and_dense_levels():
    """densify_values on a hand-made block-sparse tensor (TFLite's BCSR: 2x2 blocks of a 4x6 matrix,
    traversal [0, 1, 2, 3], block_map [0, 1]) against the matrix it stands for."""
    from types import SimpleNamespace as NS
    dense = np.zeros((4, 6), np.float32)
    dense[0:2, 2:4] = [[1, 2], [3, 4]]
    dense[2:4, 0:2] = [[5, 6], [7, 8]]
    dense[2:4, 4:6] = [[9, 10], [11, 12]]
    levels = [NS(format=0, denseSize=2),                                     # block rows
              NS(format=1, arraySegments=NS(values=[0, 1, 3]), arrayIndices=NS(values=[1, 0, 2])),
              NS(format=0, denseSize=2), NS(format=0, denseSize=2)]          # inside a block
    sparsity = NS(traversalOrder=[0, 1, 2, 3], blockMap=[0, 1], dimMetadata=levels)
    values = np.arange(1, 13, dtype=np.float32)
    np.testing.assert_array_equal(tflite_rewrite.densify_values(values, [4, 6], sparsity), dense)


# ----------------------------------------------------------------------------- MediaPipe custom op
def _mediapipe_loop(x, w, bias, padding, stride_h, stride_w):
    """MediaPipe's TransposeConvBias (transpose_conv_bias.cc), loop for loop."""
    n, h, wd, cin = x.shape
    o, kh, kw, _ = w.shape
    total_h = max(0, kh - (h - 1) % stride_h - 1) if padding == "SAME" else 0
    total_w = max(0, kw - (wd - 1) % stride_w - 1) if padding == "SAME" else 0
    oh, ow = stride_h * (h - 1) + kh - total_h, stride_w * (wd - 1) + kw - total_w
    out = np.broadcast_to(bias, (n, oh, ow, o)).astype(np.float64).copy()
    for b in range(n):
        for iy in range(h):
            for ix in range(wd):
                for fy in range(kh):
                    for fx in range(kw):
                        y, xx = iy * stride_h - total_h // 2 + fy, ix * stride_w - total_w // 2 + fx
                        if 0 <= y < oh and 0 <= xx < ow:
                            out[b, y, xx] += w[:, fy, fx, :] @ x[b, iy, ix]
    return out


@pytest.mark.parametrize("padding,stride,size,kernel", [("SAME", 2, (5, 6), (3, 2)), ("SAME", 1, (4, 4), (2, 3)),
                                                         ("VALID", 2, (3, 5), (3, 3)), ("SAME", 3, (4, 3), (2, 2))])
def test_numpy_reference_is_mediapipes_loop(padding, stride, size, kernel):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, *size, 3)).astype(np.float32)
    w = rng.standard_normal((4, *kernel, 3)).astype(np.float32)
    bias = rng.standard_normal(4).astype(np.float32)
    params = {"padding": padding, "stride_h": stride, "stride_w": stride}
    got = tflite_rewrite.transpose_conv_bias_reference(x, w, bias, params)
    want = _mediapipe_loop(x, w, bias, padding, stride, stride)
    assert got.shape == want.shape
    assert np.abs(got - want).max() < 1e-5


def _with_transpose_conv_options(data: bytes, padding: int, stride: int) -> bytes:
    """The selfie cut with other custom options (TfLiteTransposeConvParams) and the output shape
    MediaPipe's Prepare gives for them."""
    import struct

    def change(model):
        sub = model.subgraphs[0]
        op = sub.operators[-1]
        op.customOptions = np.frombuffer(struct.pack("<3i", padding, stride, stride), np.uint8)
        x, w = (list(sub.tensors[int(i)].shape) for i in op.inputs[:2])
        params = tflite_rewrite.transpose_conv_bias_params(struct.pack("<3i", padding, stride, stride))
        oh, ow = tflite_rewrite.transpose_conv_bias_shape(x[1:3], w[1:3], params)
        sub.tensors[int(op.outputs[0])].shape = [x[0], oh, ow, w[0]]
    return _edit(data, change)


@pytest.mark.parametrize("padding,stride", [(1, 2), (1, 1), (2, 1)])  # as in the model; odd SAME pad; VALID
def test_mediapipe_transpose_conv_bias_becomes_builtins_checked_against_its_definition(tmp_path, padding, stride):
    """selfie_segmentation_landscape's Convolution2DTransposeBias (with the conv + HARD_SWISH before
    it): rewritten into TRANSPOSE_CONV + ADD in the TFLite graph, LiteRT runs it (golden), the op's
    output equals the numpy reference of MediaPipe's definition, and the ONNX conversion equals LiteRT."""
    from pipeline.spec.sources import custom_ops
    source = tmp_path / "selfie_tconv.tflite"
    data = (FIX / "selfie_tconv.tflite").read_bytes()
    source.write_bytes(data if (padding, stride) == (1, 2) else _with_transpose_conv_options(data, padding, stride))
    assert custom_ops(source) == ["Convolution2DTransposeBias"]
    rewritten, rewrites = tflite_rewrite.rewrite(source.read_bytes())
    assert _ops(rewritten) == ["DEQUANTIZE", "DEQUANTIZE", "CONV_2D", "HARD_SWISH", "DEQUANTIZE", "DEQUANTIZE",
                               "TRANSPOSE_CONV", "ADD"]
    (rule,) = tflite_rewrite.check(source.read_bytes(), rewritten, rewrites)
    assert rule["rule"] == "Convolution2DTransposeBias->TRANSPOSE_CONV+ADD" and rule["count"] == 1
    assert rule["instances"][0]["padding"] == {1: "SAME", 2: "VALID"}[padding]
    assert rule["check"]["max_abs"] < 1e-4  # 3.8e-6 measured (outputs up to 46)

    err, scale, again, ops = _onnx_vs_litert(source, tmp_path)
    assert again == [rule] and "ConvTranspose" in ops
    assert scale > 1 and err < 1e-4 * scale  # 1.4e-5 measured on the model's own options


def test_unknown_custom_op_is_named_with_the_rules_known():
    def rename(model):
        for code in model.operatorCodes:
            if code.customCode:
                code.customCode = b"MyTransposeConv"
    data = _edit((FIX / "selfie_tconv.tflite").read_bytes(), rename)
    with pytest.raises(tflite_rewrite.RewriteError) as err:
        tflite_rewrite.rewrite(data)
    assert "custom op(s) MyTransposeConv: no rewrite into builtin TFLite ops is known" in str(err.value)
    assert "known: Convolution2DTransposeBias" in str(err.value)


def test_models_needing_no_rewrite_are_converted_from_their_own_bytes():
    """face_landmark (a default model): nothing to rewrite, so the very same bytes go to nnef-tools."""
    data = (REPO / "models" / "face_landmark" / "face_landmark.tflite").read_bytes()
    out, rewrites = tflite_rewrite.rewrite(data)
    assert out is data and rewrites == []
    assert tflite_rewrite.pending(data) == {"rules": {}, "unknown": []}


# ----------------------------------------------------------------------------- through the build
def test_rewritten_models_build_validate_and_list_their_rewrites(workspace):
    """The custom-op and the sparse cuts as models, built for the host CPU (IREE): golden from LiteRT
    (the custom op rewritten), artifacts validated, and the checked rewrites in import.json and in
    the manifest entry."""
    for name, tol in (("selfie_tconv", "1.0e-3"), ("face_detection_sparse", "1.0e-3")):
        folder = workspace.models / name
        folder.mkdir()
        shutil.copy(FIX / f"{name}.tflite", folder / f"{name}.tflite")
        shutil.copy(FIX / "LICENSE", folder / "LICENSE")
        shape = [1, 144, 256, 3] if name == "selfie_tconv" else [1, 192, 192, 3]
        (folder / "model.yaml").write_text(
            f"description: {name}\nsource:\n  path: {name}.tflite\n  sha256: {sha256(folder / f'{name}.tflite')}\n"
            f"license: [LICENSE]\ninputs:\n  input_1:\n    shape: {shape}\n    dtype: float32\n"
            f"    test_data:\n      random: {{seed: 3, low: 0.0, high: 1.0}}\n"
            f"tolerance:\n  max_abs: {tol}\n  mean_abs: 1.0e-4\n  cosine: 0.99999\n")
    targets = target_registry(workspace.root / "targets",
                              lambda abi: abi.get("backend") == "llvm-cpu" and abi.get("compiler", "iree") == "iree")
    workspace.build("target=host", f"targets={targets}")
    doc = json.loads((workspace.artifacts / "host" / "manifest.json").read_text())
    a = workspace.artifacts / "models"
    for name, rules in (("selfie_tconv", ["Convolution2DTransposeBias->TRANSPOSE_CONV+ADD"]),
                        ("face_detection_sparse", ["densify", "unfuse-activation"])):
        imported = json.loads((a / name / "import" / "import.json").read_text())
        assert [r["rule"] for r in imported["rewrites"]] == rules
        assert all("check" in r for r in imported["rewrites"])
        entry = doc["models"][name]
        assert entry["rewrites"] == imported["rewrites"]
        (art,) = entry["artifacts"].values()
        assert art["validation"]["status"] == "passed"
    # golden of the custom-op model: LiteRT on the rewritten graph, which is what tflite_run runs
    x = np.load(a / "selfie_tconv" / "golden" / "input_0.npy")
    (golden,) = conversion.tflite_run(workspace.models / "selfie_tconv" / "selfie_tconv.tflite",
                                      {"input_1": x}).values()
    np.testing.assert_array_equal(np.load(a / "selfie_tconv" / "golden" / "output_0.npy"), golden)
