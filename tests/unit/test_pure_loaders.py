"""Loading the project is cheap and pure: the ONNX signature reader needs no onnx, and the
facts about the installed compilers come from committed tables that must match those compilers.

Self-contained: no conftest fixtures. If a table test fails after a compiler upgrade, run
    python -m pipeline.compilers.iree_targets --refresh
    python -m pipeline.compilers.tvm_ops --refresh
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from pipeline.compilers import iree_targets, tvm_ops
from pipeline.spec.onnx_signature import read_signature

IREE_REFRESH = "run `python -m pipeline.compilers.iree_targets --refresh` and commit the table"
TVM_REFRESH = "run `python -m pipeline.compilers.tvm_ops --refresh` and commit the table"
ONNX_DTYPES = {1: "float32", 2: "uint8", 3: "int8", 6: "int32", 7: "int64", 9: "bool",
               10: "float16", 11: "float64"}
MODEL_DIRS = [REPO / "models", REPO / "tests" / "fixtures", REPO.parent / "shared" / "models"]
MODEL_FILES = sorted({p for d in MODEL_DIRS if d.is_dir() for p in d.rglob("*.onnx")})


def onnx_reference(path) -> dict:
    """The signature as the onnx-based reader (spec.read_signature before this change) gave it."""
    import onnx
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # noqa: BLE001 - protobuf raises its own DecodeError, among others
        return {"error": str(exc).splitlines()[0] if str(exc) else type(exc).__name__}
    if model.ir_version <= 0 or not model.graph.node:
        return {"error": "no ONNX graph in the file (ir_version or nodes missing)"}
    initializers = {t.name for t in model.graph.initializer}

    def describe(values, defaults=False):
        out = []
        for v in values:
            if (v.name in initializers) != defaults:
                continue
            tt = v.type.tensor_type
            dims = [int(d.dim_value) if d.HasField("dim_value") and d.dim_value > 0
                    else (d.dim_param or None) for d in tt.shape.dim]
            out.append({"name": v.name, "dtype": ONNX_DTYPES.get(tt.elem_type, f"onnx:{tt.elem_type}"),
                        "dims": dims})
        return out

    opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)
    defaults = describe(model.graph.input, defaults=True)  # inputs with an initializer
    return {"inputs": describe(model.graph.input), "outputs": describe(model.graph.output),
            "opset": int(opset), "graph_name": model.graph.name,
            **({"defaults": defaults} if defaults else {})}


# ----------------------------------------------------------------------------- read_signature
def test_there_are_real_models_to_compare():
    assert len(MODEL_FILES) >= 5, MODEL_FILES


@pytest.mark.parametrize("path", MODEL_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_read_signature_matches_onnx_on_real_models(path):
    expected = onnx_reference(path)
    assert "error" not in expected
    assert read_signature(path) == expected


def _tiny_models():
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    models = {}

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, None, "width"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3, None, "width"])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "dyn graph", [x], [y])
    models["dynamic_dims"] = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])

    # an unnamed dynamic dim (neither value nor param), a 0 and a -1 value
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    x.type.tensor_type.shape.dim.add()
    x.type.tensor_type.shape.dim.add().dim_value = 0
    x.type.tensor_type.shape.dim.add().dim_value = -1
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)  # no shape at all
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "unnamed", [x], [y])
    models["unnamed_dim"] = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])

    w = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    b = numpy_helper.from_array(np.zeros((4,), np.float32), "b")
    inputs = [helper.make_tensor_value_info("w", TensorProto.FLOAT, [4, 4]),
              helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4]),
              helper.make_tensor_value_info("b", TensorProto.FLOAT, [4])]
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])
    graph = helper.make_graph([helper.make_node("Gemm", ["x", "w", "b"], ["y"])], "init_inputs",
                              inputs, [y], initializer=[w, b])
    models["initializers_as_inputs"] = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 11)], ir_version=4)

    inputs = [helper.make_tensor_value_info("mask", TensorProto.BOOL, [1, 8]),
              helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 8]),
              helper.make_tensor_value_info("h", TensorProto.FLOAT16, [1, 8]),
              helper.make_tensor_value_info("odd", TensorProto.BFLOAT16, [1, 8]),
              helper.make_tensor_value_info("s", TensorProto.STRING, [1])]
    outputs = [helper.make_tensor_value_info("o", TensorProto.FLOAT16, [1, 8]),
               helper.make_tensor_value_info("u8", TensorProto.UINT8, ["n"])]
    nodes = [helper.make_node("Identity", ["h"], ["o"]), helper.make_node("Cast", ["ids"], ["u8"], to=2)]
    graph = helper.make_graph(nodes, "dtypes", inputs, outputs)
    models["dtypes"] = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Custom", ["x"], ["y"], domain="com.example")],
                              "custom", [x], [y])
    models["custom_domain"] = helper.make_model(graph, opset_imports=[
        helper.make_opsetid("com.example", 99), helper.make_opsetid("ai.onnx", 15),
        helper.make_opsetid("", 12), helper.make_opsetid("ai.onnx.ml", 3)])

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "no_opset", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("com.example", 1)])
    models["no_standard_opset"] = model

    graph = helper.make_graph([], "empty", [x], [x])
    models["no_nodes"] = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])

    model = onnx.ModelProto()  # no ir_version at all
    model.graph.CopyFrom(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y]))
    models["no_ir_version"] = model
    return {name: m.SerializeToString() for name, m in models.items()}


TINY = ["dynamic_dims", "unnamed_dim", "initializers_as_inputs", "dtypes", "custom_domain",
        "no_standard_opset", "no_nodes", "no_ir_version"]


@pytest.fixture(scope="module")
def tiny_models():
    return _tiny_models()


@pytest.mark.parametrize("name", TINY)
def test_read_signature_matches_onnx_on_tiny_models(name, tiny_models, tmp_path):
    path = tmp_path / f"{name}.onnx"
    path.write_bytes(tiny_models[name])
    expected = onnx_reference(path)
    assert read_signature(path) == expected
    if name in ("no_nodes", "no_ir_version"):
        assert set(expected) == {"error"}


def test_tiny_model_details(tiny_models, tmp_path):
    def read(name):
        path = tmp_path / f"{name}.onnx"
        path.write_bytes(tiny_models[name])
        return read_signature(path)
    assert read("dynamic_dims")["inputs"] == [{"name": "x", "dtype": "float32",
                                               "dims": ["batch", 3, None, "width"]}]
    assert read("dynamic_dims")["graph_name"] == "dyn graph"
    assert read("unnamed_dim")["inputs"][0]["dims"] == [1, 4, None, None, None]
    assert [i["name"] for i in read("initializers_as_inputs")["inputs"]] == ["x"]
    assert [i["dtype"] for i in read("dtypes")["inputs"]] == ["bool", "int64", "float16", "onnx:16",
                                                              "onnx:8"]
    assert read("custom_domain")["opset"] == 15
    assert read("no_standard_opset")["opset"] == 0


@pytest.mark.parametrize("data", [b"\x00\x01\x02garbage\xff\xff\xff", b"\x0a\xff\xff\xff\xff\x0f",
                                  bytes(range(256)) * 4, b""],
                         ids=["garbage", "truncated", "bytes", "empty"])
def test_read_signature_errors_on_unreadable_files(data, tmp_path):
    path = tmp_path / "bad.onnx"
    path.write_bytes(data)
    got, expected = read_signature(path), onnx_reference(path)
    assert set(got) == set(expected) == {"error"}, (got, expected)
    assert got["error"] and "\n" not in got["error"]


def test_read_signature_missing_file(tmp_path):
    path = tmp_path / "absent.onnx"
    assert read_signature(path) == onnx_reference(path)


def test_read_signature_ignores_external_data(tmp_path):
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    w = numpy_helper.from_array(np.ones((64, 64), np.float32), "w")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "ext", [x], [y],
                              initializer=[w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "ext.onnx"
    onnx.save(model, str(path), save_as_external_data=True, location="ext.bin",
              size_threshold=0)
    (tmp_path / "ext.bin").unlink()  # the reader must not need it
    assert read_signature(path) == onnx_reference(path)
    assert read_signature(path)["inputs"] == [{"name": "x", "dtype": "float32", "dims": [1, 64]}]


# ----------------------------------------------------------------------------- purity
def test_importing_the_loaders_imports_no_heavy_toolchain():
    code = ("import sys\n"
            "import pipeline.spec.onnx_signature, pipeline.compilers.iree_targets, "
            "pipeline.compilers.tvm_ops\n"
            "heavy = ('onnx', 'tvm', 'iree', 'numpy', 'google.protobuf')\n"
            "print(sorted(m for m in sys.modules if any(m == h or m.startswith(h + '.') "
            "for h in heavy)))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


# ----------------------------------------------------------------------------- tables
@pytest.fixture(scope="module")
def iree_version():
    version = iree_targets.installed_version()
    assert iree_targets.has_version(version), (
        f"iree_vulkan_targets.json has no entry for the installed IREE {version}: {IREE_REFRESH}")
    return version


def test_iree_table_knows_the_project_targets(iree_version):
    names = iree_targets.known_names(iree_version)
    for name in ("valhall3", "valhall4", "mali-g710", "adreno", "videocore_vii", "llvmpipe",
                 "vp_android_baseline_2022", "ampere", "rdna3"):
        assert name in names, f"{name} missing for IREE {iree_version}: {IREE_REFRESH}"
    assert "mali-g610" not in names and iree_targets.lookup("mali-g610", None, iree_version) is None
    assert iree_targets.lookup("valhall3", None, "0.0.0-never") is None
    assert iree_targets.lookup("valhall3", "spirv:v1.0,cap:Shader", iree_version) is None


CHECKED = [("valhall3", None), ("llvmpipe", None), ("vp_android_baseline_2022", None),
           *iree_targets.FEATURE_PAIRS]


@pytest.mark.parametrize("target,features", CHECKED, ids=lambda v: v or "-")
def test_iree_table_matches_the_live_compiler(target, features, iree_version):
    recorded = iree_targets.lookup(target, features, iree_version)
    assert recorded is not None, f"no record for {target} / {features}: {IREE_REFRESH}"
    assert recorded == iree_targets.probe(target, features), (
        f"the recorded {target} / {features} differs from IREE {iree_version}: {IREE_REFRESH}")


def test_iree_table_records_what_the_project_relies_on(iree_version):
    valhall = iree_targets.lookup("valhall3", None, iree_version)
    base = iree_targets.lookup("vp_android_baseline_2022", None, iree_version)
    assert {"shaderFloat16", "storageBuffer16BitAccess"} <= set(valhall["device_features"])
    assert valhall["subgroup_size"] == [16] and valhall["vulkan_api"] == "1.3"
    assert (base["vulkan_api"], base["subgroup_size"], base["device_features"]) == ("1.1", [], [])


def test_a_bad_name_is_rejected_by_the_live_compiler(iree_version):
    with pytest.raises(iree_targets.TargetRejected, match="mali-g610"):
        iree_targets.probe("mali-g610", None)
    assert "mali-g610" not in iree_targets.known_names(iree_version), IREE_REFRESH


def test_iree_table_is_in_canonical_form():
    text = iree_targets.TABLE.read_text()
    assert text == iree_targets.render(iree_targets.load_table()), IREE_REFRESH


def test_tvm_table_matches_the_live_frontend():
    version = tvm_ops.installed_version()
    recorded = tvm_ops.supported_ops(version)
    assert recorded is not None, f"tvm_onnx_ops.json has no entry for apache-tvm {version}: {TVM_REFRESH}"
    live = tvm_ops.live_ops()
    assert recorded == live, (f"apache-tvm {version}: missing {sorted(live - recorded)}, extra "
                              f"{sorted(recorded - live)}: {TVM_REFRESH}")
    assert {"Conv", "If", "Constant"} <= recorded and "LSTM" not in recorded
    assert tvm_ops.supported_ops("0.0.0-never") is None
    assert tvm_ops.TABLE.read_text() == tvm_ops.render(tvm_ops.load_table()), TVM_REFRESH
