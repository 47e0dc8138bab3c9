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
    assert rk.fallback == ("npu", "vulkan-mali-g610", "vulkan-baseline", "cpu-aarch64",
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


def test_spec_paths_stay_inside_the_model_folder(tmp_path):
    """Licenses ship in signed releases and every named file is hashed into keys: an absolute
    path, a `..` out of the folder or a symbolic link out of it is a spec error, all at once."""
    import numpy as np
    models = tmp_path / "models"
    secret = tmp_path / "secret.txt"
    secret.write_text("not the model's\n")
    (tmp_path / "outside_eval").mkdir()
    np.save(tmp_path / "outside_eval" / "e.npy", np.zeros((1, 3, 16, 16), np.float32))
    a = models / "a"
    spec = add_tiny_model(models, "a")
    (a / "LICENSE").write_text("license\n")
    (a / "LINK").symlink_to(secret)
    (a / "calib").mkdir()
    (a / "calib" / "s.npy").symlink_to(tmp_path / "outside_eval" / "e.npy")
    (a / "eval_link").symlink_to(tmp_path / "outside_eval")
    spec.write_text(spec.read_text().replace("random: {seed: 0, low: -1.0, high: 1.0}",
                                             "file: ../x.npy")
                    + "license: [/etc/hostname, ../secret.txt, LINK, data/../LICENSE]\n"
                      "variants:\n  int8:\n    calibration: {data: calib}\n"
                      "    evaluation: eval_link\n"
                      "    gate: {max_abs: 0.1, mean_abs: 0.01, cosine: 0.99}\n"
                      f"tvm:\n  tune: {{host: 8}}\n  database: {{host: {tmp_path}}}\n")
    b = models / "b"
    b.mkdir()
    write_spec(b, str(a / "model.onnx"), sha256(a / "model.onnx"))
    c = models / "c"  # an NNEF folder, one of whose tensors is a link out
    (c / "c.nnef").mkdir(parents=True)
    (c / "c.nnef" / "graph.nnef").write_text("version 1.0;\n")
    (c / "c.nnef" / "w.dat").symlink_to(secret)
    write_spec(c, "c.nnef", "0" * 64)

    with pytest.raises(SpecError) as info:
        load_models(models, memo_dir=tmp_path / "memo")
    problems = info.value.problems
    copy = "copy the file into {}/ and name it relative to that folder"
    expected = [
        f"a/model.yaml: license: '/etc/hostname' is an absolute path; paths in a model spec are "
        f"relative to the model folder: {copy.format(a)}",
        f"a/model.yaml: license: '../secret.txt' leads out of the model folder with '..': "
        f"{copy.format(a)}",
        f"a/model.yaml: license: 'LINK' is or passes through a symbolic link to {secret}, outside "
        f"the model folder: {copy.format(a)}",
        f"a/model.yaml: inputs.x.test_data.file: '../x.npy' leads out of the model folder with "
        f"'..': {copy.format(a)}",
        f"a/model.yaml: variants.int8.calibration.data: {a / 'calib'}: s.npy is a symbolic link to "
        f"{tmp_path / 'outside_eval' / 'e.npy'}, outside the model folder: copy the file into {a}/ "
        f"instead",
        f"a/model.yaml: variants.int8.evaluation: 'eval_link' is or passes through a symbolic link "
        f"to {tmp_path / 'outside_eval'}, outside the model folder: {copy.format(a)}",
        f"a/model.yaml: tvm.database.host: '{tmp_path}' is an absolute path; paths in a model spec "
        f"are relative to the model folder: {copy.format(a)}",
        f"b/model.yaml: source.path: '{a / 'model.onnx'}' is an absolute path; paths in a model "
        f"spec are relative to the model folder: {copy.format(b)}",
        f"c/model.yaml: source.path: w.dat is a symbolic link to {secret}, outside the model "
        f"folder: copy the file into {c}/ instead",
    ]
    for line in expected:
        assert any(p.endswith(line) for p in problems), f"missing: {line}\n" + "\n".join(problems)
    assert len(problems) == len(expected), "\n".join(problems)


def test_paths_that_stay_inside_the_model_folder_are_fine(tmp_path):
    """`..` that stays inside and a link to another file of the folder are legitimate layouts."""
    models = tmp_path / "models"
    spec = add_tiny_model(models, "a")
    (models / "a" / "legal").mkdir()
    (models / "a" / "legal" / "LICENSE.txt").write_text("license\n")
    (models / "a" / "LICENSE").symlink_to("legal/LICENSE.txt")
    spec.write_text(spec.read_text() + "license: [LICENSE, legal/../legal/LICENSE.txt]\n")
    (model,) = load_models(models)
    assert model.licenses == (models / "a" / "legal" / "LICENSE.txt",) * 2


def test_external_data_locations_are_found_wherever_onnx_finds_them(tmp_path):
    """Initializers, Constant attributes, a subgraph's tensors and a model function's: the
    protobuf walk (no onnx import) lists the same files as onnx's own loader."""
    import numpy as np
    import onnx
    from onnx import TensorProto, external_data_helper, helper, numpy_helper
    from pipeline.spec.onnx_signature import external_data, read_signature

    def const(name, value):
        return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(
            np.full((8,), value, np.float32), f"{name}_t"))
    branch = helper.make_graph([const("k", 3.0)], "then", [],
                               [helper.make_tensor_value_info("k", TensorProto.FLOAT, [8])])
    other = helper.make_graph([const("m", 4.0)], "else", [],
                              [helper.make_tensor_value_info("m", TensorProto.FLOAT, [8])])
    fn = helper.make_function("local", "AddC", ["a"], ["b"],
                              [const("c", 5.0), helper.make_node("Add", ["a", "c"], ["b"])],
                              [helper.make_opsetid("", 17)])
    nodes = [const("one", 1.0), helper.make_node("Add", ["x", "w"], ["s"]),
             helper.make_node("Add", ["s", "one"], ["t"]),
             helper.make_node("ReduceSum", ["t"], ["r"], keepdims=0),
             helper.make_node("Greater", ["r", "zero"], ["g"]),
             helper.make_node("If", ["g"], ["i"], then_branch=branch, else_branch=other),
             helper.make_node("AddC", ["i"], ["y"], domain="local")]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8])],
        initializer=[numpy_helper.from_array(np.ones(8, np.float32), "w"),
                     numpy_helper.from_array(np.zeros((), np.float32), "zero")])
    model = helper.make_model(graph, functions=[fn], opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid("local", 1)])
    path = tmp_path / "m.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=False,
                    size_threshold=0, convert_attribute=True)
    loaded = onnx.load(str(path), load_external_data=False)
    want = sorted({external_data_helper.ExternalDataInfo(t).location
                   for t in external_data_helper._get_all_tensors(loaded)
                   if external_data_helper.uses_external_data(t)})
    assert want == sorted(["w", "zero", "one_t", "k_t", "m_t", "c_t"])
    assert external_data(path) == want
    assert "error" not in read_signature(path)
    tiny_onnx(tmp_path / "inline.onnx")
    assert external_data(tmp_path / "inline.onnx") == []
