"""Precision variants: int8 (QDQ, calibrated) and fp16 chains, the accuracy gate, the layer-by-layer
divergence, and their errors. Real onnxruntime and IREE on a small CNN built here with a fixed
seed; images written with Pillow."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, Workspace, ran, require, require_aarch64, sha256

VARIANT = "cnn.int8"
GATE = "gate: {top1_agreement: 0.9, max_abs: 0.1, mean_abs: 0.02, cosine: 0.98}"


# ----------------------------------------------------------------------------- fixtures
def cnn_onnx(path: Path, seed: int = 0) -> Path:
    """Raw pixels x f32[1,3,16,16] -> Sub/Div normalisation -> Conv+Relu -> Conv(stride 2)+Relu
    -> GlobalAveragePool -> Flatten -> Gemm -> Softmax: probs f32[1,4]. Sub and Div are not ops
    onnxruntime quantizes, so the first quantized tensor is the normalised image (node `normalize`)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    arr = lambda name, a: numpy_helper.from_array(np.asarray(a, np.float32), name)
    inits = [arr("mean", np.array([120, 115, 100]).reshape(1, 3, 1, 1)),
             arr("std", np.full((1, 3, 1, 1), 60.0)),
             arr("w1", rng.standard_normal((8, 3, 3, 3)) * 0.3), arr("b1", rng.standard_normal(8) * 0.1),
             arr("w2", rng.standard_normal((16, 8, 3, 3)) * 0.2), arr("b2", rng.standard_normal(16) * 0.1),
             arr("gw", rng.standard_normal((4, 16))), arr("gb", rng.standard_normal(4) * 0.1)]
    nodes = [helper.make_node("Sub", ["x", "mean"], ["xs"], name="center"),
             helper.make_node("Div", ["xs", "std"], ["xn"], name="normalize"),
             helper.make_node("Conv", ["xn", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1],
                              strides=[2, 2]),
             helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
             helper.make_node("GlobalAveragePool", ["r2"], ["p"], name="pool"),
             helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
             helper.make_node("Gemm", ["f", "gw", "gb"], ["logits"], name="classifier", transB=1),
             helper.make_node("Softmax", ["logits"], ["probs"], name="softmax", axis=1)]
    graph = helper.make_graph(nodes, "cnn",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [1, 4])],
                              initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(model.SerializeToString(deterministic=True))
    return path


def write_images(folder: Path, count: int, seed: int, constant: int | None = None) -> Path:
    """Smooth random RGB images, 24x20 (WxH: the preprocessing stretches them to 16x16)."""
    from PIL import Image
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        if constant is not None:
            pixels = np.full((20, 24, 3), constant, np.uint8)
        else:
            coarse = Image.fromarray(rng.integers(0, 256, (5, 6, 3), dtype=np.uint8))
            smooth = np.asarray(coarse.resize((24, 20), Image.Resampling.BILINEAR), np.float32)
            pixels = np.clip(smooth + rng.normal(0, 8, smooth.shape), 0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(folder / f"{i:03d}.png")
    return folder


def add_cnn(models: Path, variants: str, name: str = "cnn", calib_constant: int | None = None,
            preprocessing: str | None = None) -> Path:
    folder = models / name
    onnx_path = cnn_onnx(folder / "model.onnx")
    write_images(folder / "calibration", 16, seed=1, constant=calib_constant)
    write_images(folder / "evaluation", 16, seed=2)
    pre = preprocessing or ("preprocessing:\n  x: {color: rgb, resize: stretch, scale: 1.0, "
                            "mean: 0.0, std: 1.0, layout: NCHW}\n")
    (folder / "model.yaml").write_text(
        f"description: a small CNN classifier\nsource:\n  path: model.onnx\n  sha256: "
        f"{sha256(onnx_path)}\ninputs:\n  x:\n    shape: [1, 3, 16, 16]\n    dtype: float32\n"
        f"    test_data:\n      random: {{seed: 0, low: 0.0, high: 255.0}}\n"
        f"tolerance: {{max_abs: 1.0e-4, mean_abs: 1.0e-5, cosine: 0.99999}}\n{pre}variants:\n"
        + variants)
    return folder / "model.yaml"


INT8 = f"""  int8:
    calibration: {{data: calibration, method: minmax, per_channel: true}}
    evaluation: evaluation
    {GATE}
    tolerance: {{max_abs: 1.0e-6, mean_abs: 1.0e-7, cosine: 0.999999}}
"""
FP16 = """  fp16:
    evaluation: evaluation
    gate: {top1_agreement: 0.9, max_abs: 0.01, mean_abs: 0.002, cosine: 0.999}
    tolerance: {max_abs: 5.0e-3, mean_abs: 1.0e-3, cosine: 0.9999}
"""


def manifest(ws: Workspace, target: str) -> dict:
    return json.loads((ws.artifacts / target / "manifest.json").read_text())


@pytest.fixture(scope="module")
def host_build(tmp_path_factory):
    """The CNN with an int8 variant, built for the host (the shared, slow part of several tests)."""
    ws = Workspace(tmp_path_factory.mktemp("quant") / "ws")
    add_cnn(ws.models, INT8)
    first = ws.build("target=host")
    return ws, first


# ----------------------------------------------------------------------------- spec and data
def test_variant_specs_are_checked_strictly_and_all_problems_reported(tmp_path):
    from pipeline.core.errors import SpecError
    from pipeline.spec import load_models
    models = tmp_path / "models"
    spec = add_cnn(models, """  int8:
    calibration: {data: missing, method: kl, per_channel: 1, bins: 3}
    evaluation: evaluation
    gate: {max_abs: 0.1, cosine: 1.5}
    colour: x
  half:
    precision: fp16
    calibration: {data: calibration}
    evaluation: calibration
    gate: {max_abs: 0.1, mean_abs: 0.1, cosine: 0.9}
  again:
    precision: int8
    calibration: {data: calibration}
    evaluation: mixed
    gate: {max_abs: 0.1, mean_abs: 0.1, cosine: 0.9}
""", preprocessing="preprocessing:\n  x: {color: gray, layout: NHWC, mean: [1, 2]}\n  y: {}\n")
    (models / "cnn" / "mixed").mkdir()
    shutil.copy(models / "cnn" / "calibration" / "000.png", models / "cnn" / "mixed" / "a.png")
    np.save(models / "cnn" / "mixed" / "b.npy", np.zeros((1, 3, 16, 16), np.float32))
    with pytest.raises(SpecError) as err:
        load_models(models)
    text = str(err.value)
    for problem in (
            "preprocessing.x: color gray gives 1 channel(s), input x (NHWC) has 16",
            "preprocessing.y: the model has no input named 'y'",
            "variants.int8.calibration: unknown key 'bins'",
            "variants.int8.calibration.data: folder not found",
            "variants.int8.calibration.method: 'kl' is not one of minmax, entropy, percentile",
            "variants.int8.calibration.per_channel: expected true or false",
            "variants.int8: unknown key 'colour'",
            "variants.int8.gate: missing required key 'mean_abs'",
            "variants.int8.gate.cosine: at most 1, got 1.5",
            "variants.half.calibration: only int8 variants are calibrated",
            "variants.again.evaluation: ",
            "mixes image and npy files; one kind per data set"):
        assert problem in text, (problem, text)
    assert str(spec) in text or "model.yaml" in text


def test_evaluation_must_not_share_samples_with_calibration(tmp_path):
    from pipeline.core.errors import SpecError
    from pipeline.spec import load_models
    models = tmp_path / "models"
    add_cnn(models, INT8)
    shutil.copy(models / "cnn" / "calibration" / "003.png", models / "cnn" / "evaluation" / "x.png")
    with pytest.raises(SpecError, match=r"variants.int8.evaluation: 1 sample\(s\) also in the "
                                        r"calibration set \(x.png\)"):
        load_models(models)
    empty = models / "cnn" / "calibration"
    shutil.rmtree(empty)
    empty.mkdir()
    (empty / "README.md").write_text("where the images come from\n")
    with pytest.raises(SpecError, match="variants.int8.calibration.data: .*calibration: empty data set"):
        load_models(models)


def test_preprocessing_resizes_normalises_and_lays_out(tmp_path):
    from PIL import Image
    from pipeline.spec.calibration import Preprocessing, SampleError, image_to_input, load_sample
    Image.fromarray(np.full((10, 40, 3), (255, 0, 51), np.uint8)).save(tmp_path / "wide.png")
    pre = Preprocessing("x", color="bgr", resize="keep_ratio", pad=-9.0, scale=1 / 255,
                        mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5), layout="NCHW")
    x = image_to_input(tmp_path / "wide.png", pre, [1, 3, 8, 48], "float32")
    assert x.shape == (1, 3, 8, 48) and x.dtype == np.float32
    # 40x10 -> height 8 keeps the ratio: 32 wide, the other 16 columns are padding
    np.testing.assert_allclose(x[0, :, :, :32].reshape(3, -1).mean(1), [-0.6, -1.0, 1.0], atol=1e-6)
    assert np.all(x[0, :, :, 32:] == -9.0)
    gray = Preprocessing("x", color="gray", resize="stretch", layout="NHWC", scale=1.0)
    g = image_to_input(tmp_path / "wide.png", gray, [1, 4, 4, 1], "float16")
    assert g.shape == (1, 4, 4, 1) and g.dtype == np.float16
    with pytest.raises(SampleError, match=r"wide.png: image is 40x10 \(WxH\), input x takes 48x8 "
                                          r"and preprocessing.resize is none"):
        image_to_input(tmp_path / "wide.png", Preprocessing("x"), [1, 3, 8, 48], "float32")
    (tmp_path / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    with pytest.raises(SampleError, match="broken.png: cannot read the image"):
        image_to_input(tmp_path / "broken.png", pre, [1, 3, 8, 48], "float32")
    np.save(tmp_path / "one.npy", np.zeros((3, 8, 48), np.float32))  # the batch dim may be left out
    spec = [{"name": "x", "shape": [1, 3, 8, 48], "dtype": "float32"}]
    assert load_sample(tmp_path / "one.npy", "npy", spec, {})["x"].shape == (1, 3, 8, 48)
    np.save(tmp_path / "bad.npy", np.zeros((3, 8, 40), np.float32))
    with pytest.raises(SampleError, match=r"bad.npy: input x is float32\[3, 8, 40\], the model "
                                          r"takes float32\[1, 3, 8, 48\]"):
        load_sample(tmp_path / "bad.npy", "npy", spec, {})


# ----------------------------------------------------------------------------- the int8 chain
def test_int8_variant_is_quantized_gated_compiled_validated_and_listed(host_build):
    import onnx
    ws, first = host_build
    done = ran(first)
    for task in ("quantize:cnn.int8", "accuracy:cnn.int8", "golden:cnn.int8",
                 "iree_compile:host/cnn.int8/cpu-x86_64", "validate:host/cnn.int8/cpu-x86_64",
                 "iree_compile:host/cnn/cpu-x86_64", "choose:host/cnn.int8", "manifest:host"):
        assert task in done, (task, done)
    doc = manifest(ws, "host")
    assert sorted(doc["models"]) == ["cnn", VARIANT]
    fp32, int8 = doc["models"]["cnn"], doc["models"][VARIANT]
    assert (int8["variant_of"], int8["precision"]) == ("cnn", "int8")
    assert int8["io"] == fp32["io"]  # QDQ keeps float32 inputs and outputs
    assert int8["source"] == fp32["source"]

    # quantize: QDQ with standard ops only, calibrated on the declared data (by content hash)
    q = int8["quantization"]
    calib = sorted((ws.models / "cnn" / "calibration").iterdir())
    from pipeline.core.store import canonical_json, sha256_text
    assert q["calibration"]["sha256"] == sha256_text(canonical_json([[p.name, sha256(p)] for p in calib]))
    assert (q["format"], q["calibration"]["samples"], q["calibration"]["method"]) == ("QDQ", 16, "minmax")
    model_path = ws.artifacts / int8["static_model"]["path"]
    assert sha256(model_path) == int8["static_model"]["sha256"]
    model = onnx.load(str(model_path))
    assert {n.domain for n in model.graph.node} <= {"", "ai.onnx"}
    int8_ops = {n.op_type for n in model.graph.node}
    assert {"QuantizeLinear", "DequantizeLinear", "Conv", "Gemm"} <= int8_ops
    assert sum(1 for t in model.graph.initializer if t.data_type == onnx.TensorProto.INT8) >= 3
    ranges = json.loads((model_path.parent / "calibration.json").read_text())
    assert "xn" in json.dumps(ranges)  # the normalised image is a calibrated tensor

    # the gate, on the evaluation set, passed and is recorded with its thresholds
    acc = int8["accuracy"]
    assert acc["passed"] is True and acc["gate"]["top1_agreement"] == 0.9
    assert acc["evaluation"]["samples"] == 16
    row = acc["outputs"][0]
    assert row["name"] == "probs" and row["top1_agreement"] >= 0.9
    assert row["max_abs"] <= 0.1 and row["cosine_min"] >= 0.98 and row["max_abs"] > 1e-4

    # the artifact: its own bytes ran, matched the int8 graph exactly, and fp32 within the gate
    art = int8["artifacts"]["cpu-x86_64"]
    assert art["precision"] == "int8" and sha256(ws.artifacts / art["path"]) == art["sha256"]
    assert art["path"].startswith("host/cnn.int8/cpu-x86_64/")
    val = art["validation"]
    assert val["status"] == "passed" and val["outputs"][0]["max_abs"] == 0.0
    assert val["vs_fp32"]["tolerance"] == {"max_abs": 0.1, "mean_abs": 0.1, "cosine": 0.98}
    assert 0 < val["vs_fp32"]["outputs"][0]["max_abs"] <= 0.1
    assert art["compile"]["step_key"] != fp32["artifacts"]["cpu-x86_64"]["compile"]["step_key"]
    assert "precision" not in fp32["artifacts"]["cpu-x86_64"]

    # whether it pays, measured by the build (its choose step): the four p50s side by side
    pays = art["pays"]
    assert pays["measured"] is True and pays["rounds"] >= 1
    assert all(pays[k] > 0 for k in ("p50_ms", "fp32_p50_ms", "onnxruntime_p50_ms",
                                     "onnxruntime_fp32_p50_ms"))
    assert pays["speedup"] == float(f"{pays['fp32_p50_ms'] / pays['p50_ms']:.4g}")
    assert pays["pays"] is (pays["speedup"] >= 1)
    assert ("next" in pays) is (not pays["pays"]) and ("why" in pays) is (not pays["pays"])
    assert int8["pays"].startswith("cpu-x86_64: ") and f"{pays['speedup']:.2f}x" in int8["pays"]
    choice = json.loads((ws.artifacts / "host" / VARIANT / "choose" / "choice.json").read_text())
    assert choice["pays"]["cpu-x86_64"] == pays and choice["reason"] == int8["pays"]

    assert ran(ws.build("target=host")) == []


def test_a_variant_slower_than_fp32_says_so_with_the_four_figures_and_next():
    """run/variant_speed.py: the record the choice, the manifest and `doit bench` carry."""
    from pipeline.run.variant_speed import build_text, not_measured, reason, record
    slow = record("int8", 4.79, 1.08, 3.17, 2.10, where="here")
    assert (slow["pays"], slow["speedup"]) == (False, 0.2255)
    assert slow["why"] == ("the int8 artifact is SLOWER than its fp32 build here: p50 4.790 ms vs "
                           "1.080 ms (0.23x): it does not pay on this ABI")
    assert slow["next"].startswith("ship the fp32 build on this ABI")
    said = reason("int8", {"cpu-x86_64": slow, "cpu-aarch64": not_measured("under qemu")})
    assert said == ("cpu-aarch64: not measured (under qemu); cpu-x86_64: " + slow["why"]
                    + " (artifact p50 4.790 ms, fp32 artifact 1.080 ms (speedup 0.23x); "
                    "onnxruntime on the variant's model 3.170 ms, on fp32 2.100 ms); next: "
                    + slow["next"])
    assert "does NOT pay; next: ship the fp32" in build_text(slow)
    fast = record("int8", 1.0, 1.5, None, 2.0, where="here")
    assert fast["pays"] is True and "next" not in fast and "why" not in fast
    assert "pays, 1.50x its fp32 build's speed" in reason("int8", {"a": fast})
    assert "onnxruntime on the variant's model n/a" in build_text(fast)


def test_runtime_helper_opens_a_variant(host_build):
    ws, _ = host_build
    golden = ws.artifacts / "models" / VARIANT / "golden"
    prog = ("import sys, numpy as np\n"
            f"sys.path.insert(0, {str(REPO)!r})\n"
            "from pipeline.app import Runner\n"
            "from pipeline.core.errors import PipelineError\n"
            f"M = {str(ws.artifacts / 'host/manifest.json')!r}\n"
            f"r = Runner.open(M, 'cnn', variant='int8')\n"
            f"x = np.load({str(golden / 'input_0.npy')!r})\n"
            f"y = np.load({str(golden / 'output_0.npy')!r})\n"
            "print('CHOICE', r.choice.abi, r.choice.path.parents[2].name)\n"
            "print('ERR', float(np.abs(r.run(x)[0] - y).max()))\n"
            "try:\n    Runner.open(M, 'cnn', variant='fp16')\nexcept PipelineError as e:\n"
            "    print('MISSING', e)\n")
    out = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "CHOICE cpu-x86_64 cnn.int8" in out.stdout and "ERR 0.0" in out.stdout
    assert "no model 'cnn.fp16'" in out.stdout and "passed its accuracy gate" in out.stdout


def test_doit_accuracy_prints_the_gate_and_the_layer_table(host_build):
    ws, _ = host_build
    out = ws.doit("accuracy", "model=cnn")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "cnn.int8: int8 vs fp32 on 16 evaluation samples (image, sha256 " in text
    assert "gate PASSED" in text and "no layer beyond tolerance" in text
    layer_rows = [l.split() for l in text.splitlines() if l.strip()[:1].isdigit()]
    assert [r[1] for r in layer_rows][:3] == ["(input", "center", "normalize"]
    div = json.loads((ws.artifacts / "models" / VARIANT / "accuracy" / "divergence.json").read_text())
    assert [l["node"] for l in div["layers"]][:3] == ["(input x)", "center", "normalize"]
    assert div["layers"][2]["matched"] == "xn_DequantizeLinear_Output"  # as the int8 conv1 sees it
    assert all(l["cosine"] >= 0.98 for l in div["layers"]) and div["first_divergent"] is None
    wrong = ws.doit("accuracy", "model=nope")
    assert wrong.returncode != 0
    assert "no variant named 'nope'; variants: cnn.int8" in wrong.stdout + wrong.stderr


def test_release_and_bench_carry_the_variant_next_to_fp32(host_build):
    ws, _ = host_build
    key = ws.root / "keys" / "k.pem"
    assert ws.doit("keygen", f"key={key}").returncode == 0
    rel = ws.doit("release", "target=host", "version=1.0.0", f"key={key}", "runtime=0")
    assert rel.returncode == 0, rel.stdout + rel.stderr
    bundle = ws.artifacts / "releases" / "host" / "1.0.0"
    doc = json.loads((bundle / "release.json").read_text())
    assert sorted(doc["models"]) == ["cnn", VARIANT]
    entry = doc["models"][VARIANT]
    assert (entry["variant_of"], entry["precision"], entry["accuracy"]["passed"]) == ("cnn", "int8", True)
    art = entry["artifacts"]["cpu-x86_64"]
    assert art["file"] == "models/cnn.int8/cpu-x86_64/model.vmfb"
    assert sha256(bundle / art["file"]) == art["sha256"]
    assert ws.doit("verify", f"bundle={bundle}", f"pubkey={key}.pub").returncode == 0
    import base64
    envelope = json.loads((bundle / "provenance.intoto.jsonl").read_text())
    deps = {d["name"]: d.get("digest", {}).get("sha256") for d in json.loads(
        base64.b64decode(envelope["payload"]))["predicate"]["buildDefinition"]["resolvedDependencies"]}
    for data in ("calibration/000.png", "evaluation/000.png"):  # same file name, both listed
        assert deps[f"models/cnn/{data}"] == sha256(ws.models / "cnn" / data)

    out = ws.doit("bench", "target=host", "iterations=5", "seconds=0", "warmup=1")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "precision variants vs fp32" in out.stdout
    (row,) = json.loads((ws.artifacts / "host" / "bench.json").read_text())["variants"]
    man = manifest(ws, "host")["models"]
    assert (row["model"], row["variant"], row["precision"], row["abi"]) == ("cnn", VARIANT, "int8",
                                                                           "cpu-x86_64")
    assert row["size"] == man[VARIANT]["artifacts"]["cpu-x86_64"]["size"]
    assert row["fp32_size"] == man["cnn"]["artifacts"]["cpu-x86_64"]["size"]
    assert row["p50_ms"] > 0 and row["fp32_p50_ms"] > 0
    assert row["speedup"] == pytest.approx(row["fp32_p50_ms"] / row["p50_ms"], rel=1e-3)
    line = next(l for l in out.stdout.splitlines() if " int8 " in l and "KiB" in l)
    assert "KiB" in line and f"{row['speedup']:.2f}x" in line


# ----------------------------------------------------------------------------- keys
def test_calibration_content_is_part_of_the_key_and_quantization_is_reproducible(tmp_path):
    one, two = Workspace(tmp_path / "one"), Workspace(tmp_path / "two")
    for ws in (one, two):
        add_cnn(ws.models, INT8)
        out = ws.doit("quantize")
        assert out.returncode == 0, out.stdout + out.stderr
    q = lambda ws, name: ws.artifacts / "models" / VARIANT / "quantize" / name
    for name in ("model.onnx", "calibration.json", "quantize.json"):
        assert sha256(q(one, name)) == sha256(q(two, name)), name
    from PIL import Image
    first = sha256(q(one, "model.onnx"))
    summary = lambda: json.loads(q(one, "quantize.json").read_text())["summary"]["calibration"]["sha256"]
    before = summary()
    image = one.models / "cnn" / "calibration" / "007.png"
    original = image.read_bytes()
    edge = np.zeros((20, 24, 3), np.uint8)  # same name, other content: a sharp black/white edge,
    edge[:, 12:] = 255                      # whose conv responses widen the calibrated ranges
    Image.fromarray(edge).save(image)
    again = one.doit("quantize")
    assert ran(again) == ["quantize:cnn.int8"]  # the static model and golden did not rerun
    assert summary() != before and sha256(q(one, "model.onnx")) != first
    image.write_bytes(original)
    back = one.doit("quantize")
    assert ran(back) == ["quantize:cnn.int8"] and sha256(q(one, "model.onnx")) == first
    assert summary() == before


# ----------------------------------------------------------------------------- the gate failing
def test_gate_fails_on_constant_calibration_and_names_the_first_bad_layer(tmp_path):
    ws = Workspace(tmp_path / "ws")
    add_cnn(ws.models, INT8, calib_constant=128)  # every calibration image one flat grey
    out = ws.build("target=host", check=False)
    text = out.stdout + out.stderr
    assert out.returncode != 0
    assert "[model=cnn.int8 stage=accuracy] the int8 variant fails its accuracy gate" in text
    assert "gate FAILED" in text and "FAILED: output 'probs': cosine" in text
    assert "first beyond tolerance: #2 normalize (Div, tensor xn, cosine" in text
    assert "normalize" in next(l for l in text.splitlines() if "<-- first beyond tolerance" in l)
    report = ws.artifacts / "reports" / "accuracy" / VARIANT
    assert f"full report: {report / 'accuracy.txt'}" in text
    div = json.loads((report / "divergence.json").read_text())
    first = div["first_divergent"]
    assert (first["node"], first["op"], first["tensor"]) == ("normalize", "Div", "xn")
    assert first["cosine"] < div["cosine_tolerance"] == 0.98
    assert not any(l["beyond_tolerance"] for l in div["layers"][:first["index"]])
    acc = json.loads((report / "accuracy.json").read_text())
    assert acc["passed"] is False and acc["outputs"][0]["cosine_min"] < 0.98
    # nothing after the gate ran for the variant, nothing of it is left, no manifest: not shippable
    done = ran(out)
    assert "iree_compile:host/cnn/cpu-x86_64" in done and "validate:host/cnn/cpu-x86_64" in done
    assert not [t for t in done if "cnn.int8" in t and not t.startswith(("quantize", "accuracy"))]
    assert not (ws.artifacts / "models" / VARIANT / "accuracy").exists()
    assert not (ws.artifacts / "host" / "manifest.json").exists()


# ----------------------------------------------------------------------------- bad input
def _quantize_error(tmp_path, variants: str, prepare=None, **kw) -> str:
    ws = Workspace(tmp_path / "ws")
    add_cnn(ws.models, variants, **kw)
    if prepare:
        prepare(ws.models / "cnn")
    out = ws.doit("quantize")
    assert out.returncode != 0
    return out.stdout + out.stderr


def test_unreadable_or_misshapen_calibration_samples_are_named(tmp_path):
    def garbage(folder):
        (folder / "calibration" / "005.png").write_bytes(b"not an image at all")
    text = _quantize_error(tmp_path / "a", INT8, garbage)
    assert "[model=cnn.int8 stage=quantize] calibration sample 005.png: cannot read the image" in text

    def arrays(folder):
        shutil.rmtree(folder / "calibration")
        (folder / "calibration").mkdir()
        np.save(folder / "calibration" / "000.npy", np.zeros((1, 3, 8, 8), np.float32))
    text = _quantize_error(tmp_path / "b", INT8, arrays)
    assert ("[model=cnn.int8 stage=quantize] calibration sample 000.npy: input x is "
            "float32[1, 3, 8, 8], the model takes float32[1, 3, 16, 16]") in text

    def small(folder):
        shutil.rmtree(folder / "calibration")
        write_images(folder / "calibration", 2, seed=5)
    nores = "preprocessing:\n  x: {scale: 1.0}\n"  # resize: none, and the images are 24x20
    text = _quantize_error(tmp_path / "c", INT8, small, preprocessing=nores)
    assert ("calibration sample 000.png: image is 24x20 (WxH), input x takes 16x16 and "
            "preprocessing.resize is none") in text


def test_missing_or_empty_calibration_set_is_a_spec_error(tmp_path):
    def missing(folder):
        shutil.rmtree(folder / "calibration")
    text = _quantize_error(tmp_path / "a", INT8, missing)
    assert "[stage=spec]" in text and "variants.int8.calibration.data: folder not found" in text
    assert "nothing was built" in text

    def empty(folder):
        shutil.rmtree(folder / "calibration")
        (folder / "calibration").mkdir()
    text = _quantize_error(tmp_path / "b", INT8, empty)
    assert "variants.int8.calibration.data: " in text and "empty data set: no sample files" in text


def test_a_model_that_cannot_be_quantized_is_a_clear_error(tmp_path):
    text = _quantize_error(tmp_path / "a", INT8.replace("evaluation: evaluation",
                                                        "exclude_nodes: [conv9]\n    evaluation: evaluation"))
    assert "[model=cnn.int8 stage=quantize] exclude_nodes: no node named 'conv9' in the static model" in text

    import onnx
    from onnx import TensorProto, helper, numpy_helper
    ws = Workspace(tmp_path / "b")
    folder = ws.models / "norm"
    mean = numpy_helper.from_array(np.full((1, 3, 1, 1), 0.5, np.float32), "mean")
    graph = helper.make_graph([helper.make_node("Sub", ["x", "mean"], ["s"], name="center"),
                               helper.make_node("Tanh", ["s"], ["y"], name="squash")], "norm",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 16, 16])],
                              initializer=[mean])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    folder.mkdir(parents=True)
    onnx.save(model, str(folder / "model.onnx"))
    write_images(folder / "calibration", 4, seed=1)
    write_images(folder / "evaluation", 4, seed=2)
    (folder / "model.yaml").write_text(
        f"source: {{path: model.onnx, sha256: {sha256(folder / 'model.onnx')}}}\n"
        "inputs: {x: {shape: [1, 3, 16, 16], dtype: float32}}\n"
        "tolerance: {max_abs: 1.0e-5, mean_abs: 1.0e-6, cosine: 0.99999}\n"
        "preprocessing: {x: {resize: stretch}}\nvariants:\n" + INT8)
    out = ws.doit("quantize")
    assert out.returncode != 0
    assert ("[model=norm.int8 stage=quantize] nothing was quantized: onnxruntime found no op it "
            "quantizes") in out.stdout + out.stderr


# ----------------------------------------------------------------------------- every ABI of rk3588
@pytest.fixture(scope="module")
def rk3588_variants(tmp_path_factory):
    from pipeline.run import vulkan
    require_aarch64()
    devices, why = vulkan.query_devices(vulkan.driver_env("lavapipe"))
    require(bool(devices), f"lavapipe missing (./setup.sh installs mesa-vulkan-drivers): {why}")
    ws = Workspace(tmp_path_factory.mktemp("rk") / "ws")
    add_cnn(ws.models, INT8 + FP16)
    ws.build("target=rk3588")
    return ws


def test_variants_go_through_every_rk3588_abi_fp16_only_where_16bit_storage_exists(rk3588_variants):
    ws = rk3588_variants
    doc = manifest(ws, "rk3588")
    assert sorted(doc["models"]) == ["cnn", "cnn.fp16", VARIANT]
    int8 = doc["models"][VARIANT]["artifacts"]
    assert sorted(int8) == ["cpu-aarch64", "npu", "vulkan-baseline", "vulkan-mali-g610"]
    base = int8["vulkan-baseline"]["validation"]
    assert base["status"] == "passed" and base["shipped_bytes_executed"] is True  # on lavapipe
    assert int8["vulkan-mali-g610"]["validation"]["status"] == "twin-passed"
    assert int8["cpu-aarch64"]["validation"]["executed"]["emulated"] is True
    for abi, art in int8.items():
        if abi == "npu":
            continue  # RKNN quantizes with its own scheme: tests/e2e/test_npu.py
        assert art["validation"]["outputs"][0]["max_abs"] <= 1e-6  # the int8 graph, as onnxruntime runs it
        assert art["validation"]["vs_fp32"]["outputs"][0]["max_abs"] <= 0.1

    fp16 = doc["models"]["cnn.fp16"]
    assert sorted(fp16["artifacts"]) == ["cpu-aarch64", "vulkan-mali-g610"]
    why = fp16["skipped"]["vulkan-baseline"]
    assert why.startswith("fp16 variant not built: IREE's vp_android_baseline_2022 target declares "
                          "no shaderFloat16 / storageBuffer16BitAccess")
    mali = fp16["artifacts"]["vulkan-mali-g610"]
    assert {"shaderFloat16", "storageBuffer16BitAccess"} <= set(mali["requires"]["vulkan"]["device_features"])
    assert mali["validation"]["status"] == "twin-passed"
    assert fp16["io"]["inputs"][0]["dtype"] == "float32"  # io_dtype float32: Casts at the boundary
    casts = fp16["quantization"]["casts"]
    assert [(c["from"], c["dtype"]) for c in casts] == [("x", "float16"), (casts[1]["from"], "float32")]
    assert casts[1]["to"] == "probs"


def test_compiling_fp16_for_a_target_without_16bit_storage_fails_loudly(rk3588_variants):
    import dataclasses
    from pipeline.core.errors import PipelineError
    from pipeline.graph import load_project
    from pipeline.core.steps import execute
    from pipeline.spec.variants import variant_model
    ws = rk3588_variants
    project = load_project(ws.models, ws.artifacts, "rk3588")
    (model,) = project.models
    (target,) = project.targets
    abi = next(a for a in target.abis if a.name == "vulkan-baseline")
    fp16 = next(v for v in model.variants if v.precision == "fp16")
    from pipeline.stages.iree_compile import compile_step
    step = compile_step(project.layout, variant_model(model, fp16), target, abi)
    step = dataclasses.replace(step, inputs={"model": ws.artifacts / "models/cnn.fp16/quantize/model.onnx"},
                               config={**step.config, "precision": "fp16"})
    with pytest.raises(PipelineError) as err:
        execute(step)
    assert ("fp16 model compiled for vp_android_baseline_2022, which declares no shaderFloat16 / "
            "storageBuffer16BitAccess") in str(err.value)
    assert not step.out_dir.exists()
