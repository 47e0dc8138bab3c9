"""Model specs and targets: strict validation, every problem reported at once with file and key."""
from __future__ import annotations

import pytest

from conftest import REPO, add_tiny_model, sha256, tiny_onnx, write_spec
from pipeline.core.errors import PipelineError, SpecError
from pipeline.spec import known_targets, load_models, load_target


def test_default_models_load_with_their_real_signatures(tmp_path):
    specs = {s.name: s for s in load_models(REPO / "models", memo_dir=tmp_path)}
    assert sorted(specs) == ["face_landmark", "ppocr_cls", "ppocr_cls.48x320", "ppocr_det"]
    assert specs["face_landmark"].source_format == "tflite"
    assert specs["face_landmark"].signature["inputs"][0]["dims"] == [1, 192, 192, 3]  # NHWC
    assert specs["ppocr_cls.48x320"].inputs[0].shape == (1, 3, 48, 320)
    det = specs["ppocr_det"]
    assert det.inputs[0].shape == (1, 3, 480, 640)
    assert det.signature["inputs"][0]["dims"] == ["DynamicDimension.0", 3, "DynamicDimension.1",
                                                  "DynamicDimension.2"]
    assert det.signature["opset"] == 11
    assert all(p.is_file() for p in det.licenses)
    # the memo answers the second time without reading the model
    assert list((tmp_path / "signatures").glob("*.json"))


def test_all_problems_are_reported_at_once(tmp_path):
    models = tmp_path / "models"
    # 1: unknown keys, missing license, sha mismatch
    a = models / "a"
    tiny_onnx(a / "model.onnx")
    write_spec(a, "model.onnx", "0" * 64, extra="licence: LICENSE\nlicense: [MISSING]\n")
    # 2: rank mismatch and an unbound dynamic dim (a null in the shape)
    b = models / "b"
    tiny_onnx(b / "model.onnx")
    write_spec(b, "model.onnx", sha256(b / "model.onnx"),
               inputs={"x": ([1, 3, 16], "float32", 0)})
    c = models / "c"
    tiny_onnx(c / "model.onnx")
    spec_c = write_spec(c, "model.onnx", sha256(c / "model.onnx"))
    spec_c.write_text(spec_c.read_text().replace("shape: [1, 3, 16, 16]", "shape: [null, 3, 16, 16]"))
    # 3: the model's input not declared at all, a missing source file, a contradicted fixed dim
    d = models / "d"
    tiny_onnx(d / "model.onnx", dynamic_batch=False)
    write_spec(d, "model.onnx", sha256(d / "model.onnx"), inputs={"z": ([2, 3, 16, 16], "float32", 0)})
    e = models / "e"
    e.mkdir()
    write_spec(e, "nowhere.onnx", "0" * 64)
    f = models / "f"
    tiny_onnx(f / "model.onnx", dynamic_batch=False)
    write_spec(f, "model.onnx", sha256(f / "model.onnx"), inputs={"x": ([2, 3, 16, 16], "float32", 0)})

    with pytest.raises(SpecError) as info:
        load_models(models, memo_dir=tmp_path / "memo")
    text = "\n".join(info.value.problems)
    expected = [
        "a/model.yaml: unknown key 'licence'",
        "a/model.yaml: license: file not found",
        "a/model.yaml: source.sha256: mismatch for model.onnx",
        "b/model.yaml: inputs.x.shape: rank 3 does not match the model's rank 4",
        "c/model.yaml: inputs.x.shape[0]: unbound dynamic dim None",
        "d/model.yaml: inputs.z: the model has no input named 'z'",
        "d/model.yaml: inputs: model input 'x' [1, 3, 16, 16] is not declared",
        "e/model.yaml: source.path: file not found",
        "f/model.yaml: inputs.x.shape[0]: 2 contradicts the model's fixed dim 1",
    ]
    for fragment in expected:
        assert fragment in text, f"missing: {fragment}\n{text}"
    assert len(info.value.problems) == len(expected), text
    assert "nothing was built" in str(info.value)


def test_bad_yaml_types_are_problems_not_crashes(tmp_path):
    models = tmp_path / "models"
    spec = add_tiny_model(models, "a")
    spec.write_text(spec.read_text().replace("max_abs: 1.0e-4", "max_abs: small")
                    .replace("dtype: float32", "dtype: float33")
                    + "opset: seventeen\n")
    with pytest.raises(SpecError) as info:
        load_models(models)
    text = "\n".join(info.value.problems)
    assert "tolerance.max_abs: expected a number, got 'small'" in text
    assert "inputs.x.dtype: 'float33' is not one of" in text
    assert "opset: expected a integer" in text or "opset: expected an integer" in text


def test_a_folder_without_spec_is_reported(tmp_path):
    models = tmp_path / "models"
    add_tiny_model(models, "a")
    (models / "stray").mkdir()
    with pytest.raises(SpecError, match="stray: no model.yaml"):
        load_models(models)


def test_targets_are_data():
    assert known_targets() == ["host", "rk3588", "rpi5"]
    rk = load_target("rk3588")
    assert rk.fallback == ("vulkan-mali-g610", "vulkan-baseline", "cpu-aarch64",
                           "cpu-aarch64-tvm")
    abi = {a.name: a for a in rk.abis}["cpu-aarch64"]
    assert (abi.arch, abi.cpu, abi.triple) == ("aarch64", "cortex-a55", "aarch64-linux-gnu")
    mali = {a.name: a for a in rk.abis}["vulkan-mali-g610"]
    assert (mali.vulkan_target, mali.run["via"], mali.run["twin"]) == ("valhall3", "twin", "llvmpipe")
    assert abi.run == {"via": "qemu", "device": "local-task", "qemu_cpu": "cortex-a76"}
    host = load_target("host")
    assert host.abis[0].run["via"] == "python"


def test_unknown_target_and_bad_target_file(tmp_path):
    with pytest.raises(PipelineError, match="unknown target 'nope'; known targets: host, rk3588, rpi5"):
        load_target("nope")
    (tmp_path / "board.yaml").write_text(
        "abis:\n  cpu:\n    compiler: iree\n    backend: llvm-cpu\n    arch: riscv\n"
        "    cpu: x\n    colour: red\n    run: {via: qemu}\nfallback: [cpu, gpu]\n")
    with pytest.raises(SpecError) as info:
        load_target("board", tmp_path)
    text = "\n".join(info.value.problems)
    assert "abis.cpu: unknown key 'colour'" in text
    assert "abis.cpu.arch: 'riscv' is not one of" in text
    assert "fallback: must list every ABI exactly once" in text


def test_a_number_yaml_reads_as_text_says_how_to_write_it(tmp_path):
    models = tmp_path / "models"
    spec = add_tiny_model(models, "a")
    spec.write_text(spec.read_text().replace("max_abs: 1.0e-4", "max_abs: 1e-4"))
    with pytest.raises(SpecError) as info:
        load_models(models)
    (problem,) = info.value.problems
    assert problem.endswith("tolerance.max_abs: expected a number, got '1e-4' (YAML reads 1e-4 as "
                            "text: write it with a dot and a signed exponent, e.g. 1.0e-5)"), problem
