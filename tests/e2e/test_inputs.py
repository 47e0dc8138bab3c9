"""Inputs re-checked at run time: the import step reads the source once (a copy in scratch), hashes
the very bytes it loads or converts, and refuses bytes the spec does not pin; ONNX external-data
files are part of the source (pipeline/stages/import_model.py, pipeline/spec/sources.py)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from conftest import FIXTURES, add_default_model, add_tiny_model, ran, sha256, tiny_onnx, write_spec
from pipeline.core.errors import PipelineError, SpecError
from pipeline.core.steps import execute
from pipeline.graph import load_project
from pipeline.spec import load_models, sources

WEIGHTS = "model.weights"


def external_data_model(folder: Path, seed: int = 0) -> Path:
    """The tiny model (tiny_onnx) saved with every tensor in one external-data file beside it."""
    import onnx
    tiny_onnx(folder / "inline.onnx", seed=seed)
    model = onnx.load(str(folder / "inline.onnx"))
    (folder / "inline.onnx").unlink()
    onnx.save_model(model, str(folder / "model.onnx"), save_as_external_data=True,
                    all_tensors_to_one_file=True, location=WEIGHTS, size_threshold=0)
    return folder / "model.onnx"


def add_external_data_model(models: Path, name: str) -> Path:
    folder = models / name
    folder.mkdir(parents=True)
    path = external_data_model(folder)
    write_spec(folder, "model.onnx", sources.source_sha256(path))
    return folder / "model.yaml"


def flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))


def weights(model_path: Path) -> dict:
    import onnx
    from onnx import numpy_helper
    return {t.name: numpy_helper.to_array(t) for t in onnx.load(str(model_path)).graph.initializer}


# ----------------------------------------------------------------------------- external data
def test_external_data_is_part_of_the_source_pin_and_the_import_key(workspace):
    """The weights file beside the .onnx: an input of the import step (in its key), covered by the
    spec's sha256; changing it is a spec error until the pin says so, and the step then re-runs."""
    spec = add_external_data_model(workspace.models, "ext")
    folder = spec.parent
    (model,) = load_models(workspace.models)
    assert model.external_data == (WEIGHTS,)
    assert model.source_sha256 == sources.files_sha256(
        {"source": sha256(folder / "model.onnx"),
         f"source:{WEIGHTS}": sha256(folder / WEIGHTS)})

    first = workspace.doit("import")
    assert first.returncode == 0, first.stdout + first.stderr
    out = workspace.artifacts / "models" / "ext" / "import"
    record = json.loads((out / "step.json").read_text())
    assert sorted(record["key_parts"]["inputs"]) == ["source", f"source:{WEIGHTS}"]
    assert record["key_parts"]["inputs"][f"source:{WEIGHTS}"] == sha256(folder / WEIGHTS)
    before = weights(out / "model.onnx")  # the weights are inside the imported model
    np.testing.assert_array_equal(before["gb"], np.frombuffer(
        (folder / WEIGHTS).read_bytes()[-40:], np.float32))

    # other weights, same .onnx bytes: the old pin no longer holds
    flip_last_byte(folder / WEIGHTS)
    refused = workspace.doit("import")
    text = refused.stdout + refused.stderr
    assert refused.returncode != 0 and "[stage=spec]" in text and "Traceback" not in text
    assert (f"ext/model.yaml: source.sha256: mismatch for model.onnx: spec says "
            f"{model.source_sha256}, file is {sources.source_sha256(folder / 'model.onnx')} (the "
            f"sha256 of an ONNX model with external data covers the .onnx and {WEIGHTS}") in text

    spec.write_text(spec.read_text().replace(model.source_sha256,
                                             sources.source_sha256(folder / "model.onnx")))
    again = workspace.doit("import")
    assert again.returncode == 0, again.stdout + again.stderr
    assert ran(again) == ["import:ext"]
    after = weights(out / "model.onnx")
    assert after["gb"][-1] != before["gb"][-1] and np.array_equal(after["w"], before["w"])


def test_external_data_must_lie_beside_the_model_inside_its_folder(tmp_path):
    models = tmp_path / "models"
    add_external_data_model(models, "missing")
    (models / "missing" / WEIGHTS).unlink()
    add_external_data_model(models, "linked")
    outside = tmp_path / "elsewhere.weights"
    shutil.move(models / "linked" / WEIGHTS, outside)
    (models / "linked" / WEIGHTS).symlink_to(outside)
    with pytest.raises(SpecError) as info:
        load_models(models)
    problems = info.value.problems
    assert problems == [
        f"{models / 'linked/model.yaml'}: source.path: external data of model.onnx: {WEIGHTS} is a "
        f"symbolic link to {outside}, outside the model folder: copy the file into "
        f"{models / 'linked'}/ instead",
        f"{models / 'missing/model.yaml'}: source.path: external data of model.onnx: file not "
        f"found: {models / 'missing' / WEIGHTS}"], "\n".join(problems)


# ----------------------------------------------------------------------------- a change mid-build
def _tiny(models: Path) -> tuple[str, Path]:
    add_tiny_model(models, "tiny")
    return "tiny", models / "tiny" / "model.onnx"


def _external(models: Path) -> tuple[str, Path]:
    add_external_data_model(models, "ext")
    return "ext", models / "ext" / WEIGHTS


def _tflite(models: Path) -> tuple[str, Path]:
    add_default_model(models, "face_landmark")
    return "face_landmark", models / "face_landmark" / "face_landmark.tflite"


def _nnef(models: Path) -> tuple[str, Path]:
    folder = models / "cls_nnef"
    shutil.copytree(FIXTURES / "ppocr_cls_nnef" / "cls.nnef", folder / "cls.nnef")
    write_spec(folder, "cls.nnef", sources.source_sha256(folder / "cls.nnef"),
               inputs={"x": ([1, 3, 48, 192], "float32", 1)})
    return "cls_nnef", sorted((folder / "cls.nnef").glob("*.dat"))[-1]


@pytest.mark.parametrize("make", [_tiny, _external, _tflite, _nnef],
                         ids=["onnx", "onnx-external-data", "tflite", "nnef"])
def test_a_source_changed_after_the_specs_were_read_fails_its_import(tmp_path, make):
    """The specs (and the pin) are read, then a file of the source changes (a `git pull` during
    the build) before the import step reads it: the step refuses, naming both sha256, and
    publishes nothing."""
    name, changed = make(tmp_path / "models")
    project = load_project(tmp_path / "models", tmp_path / "artifacts", "host")
    (spec,) = [m for m in project.models if m.name == name]
    (step,) = [s for s in project.steps("import") if s.name == name]
    assert changed in step.inputs.values()
    if name == "tiny":  # another valid model in its place: only its sha256 tells
        tiny_onnx(changed, seed=5)
    else:
        flip_last_byte(changed)
    now = sources.source_sha256(spec.source, spec.external_data)
    assert now != spec.source_sha256
    with pytest.raises(PipelineError) as info:
        execute(step)
    err = info.value
    assert (err.model, err.stage) == (name, "import")
    assert "the source changed after the specs were read" in err.what
    assert f"have sha256 {now}, the spec pins {spec.source_sha256}" in err.what
    assert "source.sha256 of the model's model.yaml" in err.hint
    assert not step.record.exists() and not (step.out_dir / "model.onnx").exists()
