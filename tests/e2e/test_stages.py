"""Each stage on real models, run directly (no doit): import, golden, static, iree_compile, validate."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from conftest import (add_default_model, add_fixture_model, add_tiny_model, require_aarch64)
from pipeline import graph
from pipeline.stages import iree_compile, validate
from pipeline.core.errors import PipelineError
from pipeline.core.steps import execute


def project(tmp_path, target=None):
    return graph.load_project(tmp_path / "models", tmp_path / "artifacts", target)


def run_stages(proj, model, *stages, target=None, abi=None):
    spec = next(m for m in proj.models if m.name == model)
    steps = []
    for stage in stages:
        if stage in ("iree_compile", "validate"):
            t = next(t for t in proj.targets if t.name == target)
            a = next(a for a in t.abis if a.name == abi) if abi else t.abis[0]
            make = iree_compile.compile_step if stage == "iree_compile" else validate.validate_step
            steps.append(make(proj.layout, spec, t, a))
        else:
            steps.append(next(s for s in proj.steps(stage) if s.name == model))
    for step in steps:
        execute(step)
    return steps


def test_import_normalises_old_paddle_opset(tmp_path):
    add_default_model(tmp_path / "models", "ppocr_cls")
    proj = project(tmp_path, "host")
    (step,) = run_stages(proj, "ppocr_cls", "import")
    report = json.loads((step.out_dir / "import.json").read_text())
    assert (report["source_opset"], report["opset"]) == (11, 17)
    model = onnx.load(str(step.out_dir / "model.onnx"))
    onnx.checker.check_model(model)
    assert max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) == 17


def test_static_binds_dynamic_hw_of_the_detector(tmp_path):
    add_default_model(tmp_path / "models", "ppocr_det")
    proj = project(tmp_path, "host")
    steps = run_stages(proj, "ppocr_det", "import", "golden", "static")
    golden_doc = json.loads((steps[1].out_dir / "golden.json").read_text())
    assert golden_doc["outputs"][0]["shape"] == [1, 1, 480, 640]
    out = np.load(steps[1].out_dir / "output_0.npy")
    assert 0.0 <= out.min() and out.max() <= 1.0  # a probability map
    report = json.loads((steps[2].out_dir / "static.json").read_text())
    assert report["inputs"] == [{"name": "x", "shape": [1, 3, 480, 640]}]
    assert report["outputs"][0]["shape"] == [1, 1, 480, 640]
    assert report["vs_original"]["passed"] and report["vs_original"]["outputs"][0]["max_abs"] < 1e-4
    model = onnx.load(str(steps[2].out_dir / "model.onnx"))
    assert model.graph.name == "main"
    from pipeline.stages.static import dynamic_tensors
    assert dynamic_tensors(model) == []


def test_static_rejects_a_shape_the_model_cannot_take(tmp_path):
    models = tmp_path / "models"
    add_default_model(models, "ppocr_det")
    spec = models / "ppocr_det" / "model.yaml"
    spec.write_text(spec.read_text().replace("[1, 3, 480, 640]", "[1, 3, 470, 640]"))
    proj = project(tmp_path, "host")
    with pytest.raises(PipelineError) as info:
        run_stages(proj, "ppocr_det", "import", "golden", "static")
    assert info.value.model == "ppocr_det" and info.value.stage in ("golden", "static")


def test_compile_and_validate_host_and_rk3588_on_the_classifier(tmp_path):
    require_aarch64()
    add_default_model(tmp_path / "models", "ppocr_cls")
    proj = project(tmp_path)
    run_stages(proj, "ppocr_cls", "import", "golden", "static")
    for target, abi in (("host", "cpu-x86_64"), ("rk3588", "cpu-aarch64")):
        compiled, checked = run_stages(proj, "ppocr_cls", "iree_compile", "validate", target=target,
                                       abi=abi)
        vmfb = compiled.out_dir / "model.vmfb"
        assert vmfb.stat().st_size > 100_000
        report = json.loads((checked.out_dir / "validation.json").read_text())
        assert report["status"] == "passed"
        assert report["executed"]["emulated"] is (target == "rk3588")
        row = report["outputs"][0]
        assert row["shape"] == [1, 2] and row["max_abs"] < 1e-5 and row["cosine"] > 0.999999
        flags = json.loads((compiled.out_dir / "compile.json").read_text())["flags"]
        assert "--iree-llvmcpu-target-cpu=" + ("cortex-a55" if target == "rk3588" else "x86-64-v3") in flags


def test_validate_fails_on_a_mismatch_and_leaves_nothing(tmp_path):
    add_tiny_model(tmp_path / "models", "alpha", seed=4)
    proj = project(tmp_path, "host")
    steps = run_stages(proj, "alpha", "import", "golden", "static", "iree_compile", "validate",
                       target="host")
    checked = steps[-1]
    assert (checked.out_dir / "validation.json").is_file()
    golden_out = steps[1].out_dir / "output_0.npy"
    wrong = np.load(golden_out) + 0.01
    golden_out.unlink()  # the store keeps its own copy; the hard-won golden file is replaced
    np.save(golden_out, wrong)
    with pytest.raises(PipelineError) as info:
        execute(checked)
    err = info.value
    assert (err.stage, err.model, err.target) == ("validate", "alpha", "host/cpu-x86_64")
    assert "outputs differ from golden" in err.what and "max_abs 0.01 is above the tolerance 0.0001" in err.what
    assert not checked.out_dir.exists()


def test_gru_encoder_names_the_unsupported_op(tmp_path):
    """The static stage unrolls the encoder's bidirectional GRUs (test_static_rewrites.py); handed
    the GRUs as they are, iree_compile names the op it cannot lower."""
    import dataclasses
    add_fixture_model(tmp_path / "models", "romanizer_encoder")
    proj = project(tmp_path, "host")
    imported, = run_stages(proj, "romanizer_encoder", "import")
    spec = next(m for m in proj.models if m.name == "romanizer_encoder")
    host = next(t for t in proj.targets if t.name == "host")
    step = iree_compile.compile_step(proj.layout, spec, host, host.abis[0])
    step = dataclasses.replace(step, inputs={"model": imported.out_dir / "model.onnx"})
    with pytest.raises(PipelineError) as info:
        execute(step)
    assert "cannot compile these ONNX ops: GRU" in info.value.what
    assert info.value.log.endswith("host_romanizer_encoder_cpu-x86_64.log")

