"""The app-side Runner on a manifest it cannot fully read: an artifact whose format no backend of
this modelyard loads (a manifest made by a newer one) is passed over with that reason, and when
nothing else can run, the error names the model, the target and the stage."""
from __future__ import annotations

import json

import pytest

from pipeline.app import Runner
from pipeline.compilers.backends import BY_FORMAT
from pipeline.core.errors import PipelineError


def manifest(tmp_path, fmt: str):
    doc = {"target": {"name": "board", "fallback": ["npu9"]},
           "models": {"m": {"artifacts": {"npu9": {
               "path": "board/m/npu9/x_compile/model.x", "sha256": "0" * 64, "format": fmt,
               "entry": "main", "abi": {"name": "npu9", "compiler": "x", "backend": "x"}}},
               "io": {"outputs": [{"name": "y", "dtype": "float32"}]}}}}
    path = tmp_path / "board" / "manifest.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(doc))
    return path


def test_an_unknown_format_is_passed_over_with_its_reason(tmp_path):
    assert "x-format" not in BY_FORMAT
    with pytest.raises(PipelineError) as err:
        Runner.open(manifest(tmp_path, "x-format"), "m")
    text = str(err.value)
    assert "npu9: its format 'x-format' is not one this modelyard loads" in text, text
    assert (err.value.model, err.value.target, err.value.stage) == ("m", "board", "runtime")
