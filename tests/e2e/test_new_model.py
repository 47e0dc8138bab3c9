"""`doit new` (pipeline/graph/scaffold.py): a model folder from a file, then `doit build` ships it,
or `doit build` / `doit coverage` say which stage, compiler and op stopped it."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from conftest import target_registry, tiny_onnx
from pipeline.core.errors import PipelineError
from pipeline.graph.scaffold import bind, new_model
from pipeline.compilers.coverage_table import manifest_table, render, rewrites_of
from pipeline.spec import load_models

REPO = Path(__file__).resolve().parents[2]
# the repo's copies of ../shared/models files (the same bytes): a clean clone has no ../shared
CLS = REPO / "models/ppocr_cls/ch_ppocr_mobile_v2.0_cls_infer.onnx"   # rapidocr-onnxruntime 1.4.4
VAD = REPO / "tests/fixtures/silero_vad/silero_vad.onnx"              # silero_vad_op18_ifless


def host_iree(root: Path) -> Path:
    """The real host target with its IREE CPU ABI only (the build stays short)."""
    return target_registry(root / "targets", lambda v: v.get("compiler") == "iree"
                           and v.get("backend") == "llvm-cpu")


def test_new_then_build_ships_a_real_model(workspace, tmp_path):
    """The PP-OCR classifier (literal -1 batch, '?' H and W) at a small shape, from its file to a
    validated artifact in two commands; the license is copied and listed."""
    license = tmp_path / "LICENSE"
    license.write_text("Apache-2.0\n")
    made = workspace.doit("new", f"source={CLS}", "name=cls", "shape=x:1x3x48x96",
                          f"license={license}")
    assert made.returncode == 0, made.stdout + made.stderr
    assert "wrote " in made.stdout and "x float32 [1, 3, 48, 96]" in made.stdout
    folder = workspace.models / "cls"
    assert sorted(p.name for p in folder.iterdir()) == sorted(["LICENSE", CLS.name, "model.yaml"])
    (spec,) = load_models(workspace.models)
    assert [(i.name, i.shape, i.dtype) for i in spec.inputs] == [("x", (1, 3, 48, 96), "float32")]
    assert spec.inputs[0].test_data.as_dict() == {"random": {"seed": 0, "low": 0.0, "high": 1.0}}
    assert spec.source_sha256 == __import__("hashlib").sha256(CLS.read_bytes()).hexdigest()
    assert [p.name for p in spec.licenses] == ["LICENSE"]
    # outputs are probabilities (at most 1): the floor of the scaled tolerance
    assert (spec.tolerance.max_abs, spec.tolerance.mean_abs, spec.tolerance.cosine) == (1e-4, 1e-5, 0.9999)

    targets = host_iree(workspace.root)
    workspace.build("target=host", f"targets={targets}")
    manifest = json.loads((workspace.artifacts / "host/manifest.json").read_text())
    art = manifest["models"]["cls"]["artifacts"]["cpu-x86_64"]
    assert art["validation"]["status"] == "passed"
    assert max(o["max_abs"] for o in art["validation"]["outputs"]) <= 1e-4
    assert manifest["coverage"]["cls"]["status"] == "shipped"
    assert manifest["coverage"]["cls"]["shipped"] == ["cpu-x86_64"]

    # a second `doit new` with the same name is refused; nothing changes
    before = (folder / "model.yaml").read_bytes()
    again = workspace.doit("new", f"source={CLS}", "name=cls", "shape=x:1x3x48x192")
    assert again.returncode != 0
    assert "already exists: doit new never overwrites a model" in again.stdout + again.stderr
    assert (folder / "model.yaml").read_bytes() == before


def test_an_unbound_dim_is_named_and_nothing_is_written(workspace):
    result = workspace.doit("new", f"source={CLS}", "name=cls")
    out = result.stdout + result.stderr
    assert result.returncode != 0
    assert "cannot bind every input dim, nothing was written" in out
    assert "- input 'x' [?, 3, ?, ?]: cannot bind dim 2 ('?'), dim 3 ('?')" in out
    assert "shape=x:1x3x224x224" in out  # how to say it
    assert list(workspace.models.iterdir()) == []
    wrong = workspace.doit("new", f"source={CLS}", "name=cls", "shape=x:1x4x48x96")
    assert "input 'x' dim 1: the model fixes it to 3, not 4" in wrong.stdout + wrong.stderr
    assert list(workspace.models.iterdir()) == []


def test_named_dims_bind_by_name_and_scalars_and_integers_get_test_data(tmp_path):
    """Silero VAD: `batch` (leading: 1) binds `state`'s dim too; `sequence` is given by name;
    `sr` is an int64 scalar."""
    models = tmp_path / "models"
    models.mkdir()
    with __import__("pytest").raises(PipelineError) as err:
        new_model(str(VAD), "vad", [], None, models)
    assert "input 'input' [batch, sequence]: cannot bind dim 1 ('sequence')" in str(err.value)
    assert "state" not in str(err.value)  # batch is bound where it leads
    new_model(str(VAD), "vad", ["sequence:512", "sr:"], None, models)
    (spec,) = load_models(models)
    got = {i.name: (i.shape, i.dtype, i.test_data.as_dict()["random"]) for i in spec.inputs}
    assert got == {"input": ((1, 512), "float32", {"seed": 0, "low": 0.0, "high": 1.0}),
                   "sr": ((), "int64", {"seed": 0, "low": 0, "high": 9}),
                   "state": ((2, 1, 128), "float32", {"seed": 0, "low": 0.0, "high": 1.0})}
    shapes, problems = bind([{"name": "m", "dims": ["b", 16]}, {"name": "x", "dims": ["b", None]}],
                            {"x": [2, 7]})
    assert (shapes, problems) == ({"m": [2, 16], "x": [2, 7]}, [])
    _, problems = bind([{"name": "x", "dims": [1]}], {"nope": [3]})
    assert problems == ["shape=nope:...: the model has no input and no named dim 'nope' (inputs: x)"]


def strided_conv(path: Path) -> Path:
    """A Conv1d IREE 3.13 cannot compile (stride 2, a 1-long output with input left over)."""
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 2, 3)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], strides=[2])], "main",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, 1])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_a_model_no_compiler_takes_names_the_op_stage_and_compiler(workspace, tmp_path):
    """`doit new` on a file, `doit build` fails at coverage naming IREE and the Conv; `doit
    coverage` prints the same in its table (and the tiny model beside it ships)."""
    src = strided_conv(tmp_path / "sconv.onnx")
    assert workspace.doit("new", f"source={src}", "name=sconv").returncode == 0
    assert workspace.doit("new", f"source={tiny_onnx(tmp_path / 't.onnx')}", "name=tiny").returncode == 0
    targets = host_iree(workspace.root)
    result = workspace.build("target=host", f"targets={targets}", check=False)
    out = result.stdout + result.stderr
    assert result.returncode != 0
    why = ("[model=sconv target=host stage=coverage] no compiler of this target can take the model: "
           "IREE cannot take Conv (stride 2 on a 4-long axis gives 1 output and leaves 1 input "
           "element(s) over)")
    assert why in out
    report = workspace.doit("coverage", "target=host", f"targets={targets}")
    lines = report.stdout.splitlines()  # (exit 1: its coverage step fails again)
    assert "coverage of target host: 1 of 2 model(s) ship" in lines
    assert next(l for l in lines if l.startswith("  sconv ")).split() == ["sconv", "stopped", "-", "coverage", "-"]
    assert next(l for l in lines if l.startswith("  tiny ")).split() == ["tiny", "shipped", "cpu-x86_64", "-", "-"]
    assert "  stopped by coverage:host/sconv:" in lines
    assert "    " + why in lines


def test_the_table_lists_rewrites_fallbacks_and_skipped_compilers():
    """The manifest's table from its model entries, and its text (pure functions)."""
    models = {"vad": {"artifacts": {"cpu-x86_64": {}, "cpu-x86_64-tvm": {}},
                      "coverage": {"iree": {"status": "ok", "unsupported": []},
                                   "tvm": {"status": "skipped", "unsupported": [
                                       {"op": "Loop", "why": "no converter in TVM's ONNX frontend"}]}},
                      "choice": {"cpu": {"ships": "cpu-x86_64"}}}}
    fallback = {"drop": ["--iree-opt-data-tiling"], "add": [], "why": "i1 data tiling",
                "after": "1 failed attempt(s); the first: model.mlir:3:4: error: boom"}
    rewrites = rewrites_of(("import", None),
                           ("static", {"rewrites": [{"rule": "fold-if", "nodes": ["If_0"], "why": "sr bound"},
                                                    {"rule": "fold-if", "nodes": ["If_1"], "why": "sr bound"}]}))
    table = manifest_table(models, {"vad": {"cpu-x86_64": {"fallback": fallback}}}, {"vad": rewrites})
    assert table["vad"] == {"status": "shipped", "shipped": ["cpu-x86_64", "cpu-x86_64-tvm"],
                            "stopped": None, "compilers": {"iree": "ok", "tvm": "skipped: Loop (no "
                                                           "converter in TVM's ONNX frontend)"},
                            "rewrites": [{"stage": "static", "rule": "fold-if", "nodes": ["If_0"], "why": "sr bound"},
                                         {"stage": "static", "rule": "fold-if", "nodes": ["If_1"], "why": "sr bound"}],
                            "fallbacks": {"cpu-x86_64": fallback}, "choice": {"cpu": "cpu-x86_64"}}
    text = render("host", table).splitlines()
    assert text[0] == "coverage of target host: 1 of 1 model(s) ship"
    assert text[2].split() == ["vad", "shipped", "cpu-x86_64", "(fallback),", "cpu-x86_64-tvm", "-",
                               "static:fold-if", "x2"]
    assert "  TVM skipped: Loop (no converter in TVM's ONNX frontend)" in text
    assert "  rewrite static:fold-if: sr bound" in text
    assert ("  cpu-x86_64 built with fallback flags (without --iree-opt-data-tiling): i1 data "
            "tiling; after 1 failed attempt(s); the first: model.mlir:3:4: error: boom") in text


def test_new_scales_the_tolerance_to_the_outputs(workspace):
    """A model whose outputs are in the hundreds gets bounds in proportion (1e-5 / 1e-6 of the
    largest output), said in the spec; float32 rounding grows with the values."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "k"], ["y"])], "main",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [numpy_helper.from_array(np.array(300.0, np.float32), "k")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    source = workspace.root / "scale.onnx"
    onnx.save(model, str(source))
    made = workspace.doit("new", f"source={source}", "name=scaled")
    assert made.returncode == 0, made.stdout + made.stderr
    text = (workspace.models / "scaled/model.yaml").read_text()
    top = float(text.split("(outputs reach ")[1].split()[0])
    assert 10 < top < 300  # 300 times random inputs in [0, 1)
    (spec,) = load_models(workspace.models)
    assert 1e-5 * top <= spec.tolerance.max_abs <= 1e-5 * top * 2
    assert spec.tolerance.mean_abs == spec.tolerance.max_abs / 10
