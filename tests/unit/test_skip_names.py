"""A `skip:` pattern that matches no ABI of any target skipped nothing, silently (issue 38): it
is a spec error naming the file and key, the closest ABI name and every target's ABIs, reported
with the other problems at once, for the model's own `skip:` and for a variant's."""
from __future__ import annotations

import pytest
import yaml

from conftest import REPO, add_default_model, add_tiny_model
from pipeline.core.errors import SpecError
from pipeline.graph import load_project

HOST_ABIS = "host: cpu-x86_64, cpu-x86_64-tvm"


def _append(spec, text: str) -> None:
    spec.write_text(spec.read_text() + text)


def test_a_skip_naming_no_abi_is_a_spec_error_listing_the_abis(tmp_path):
    models = tmp_path / "models"
    tiny = add_tiny_model(models, "tiny")
    _append(tiny, "skip:\n  cpu-x86-64: a typo of cpu-x86_64\n  'vulkan-*': a real pattern\n")
    cls = add_default_model(models, "ppocr_cls")
    cls.write_text(cls.read_text().replace("    skip:\n      'vulkan-*':", "    skip:\n      'vulkn-*':"))
    with pytest.raises(SpecError) as info:
        load_project(models, tmp_path / "artifacts", "host")
    problems = info.value.problems
    assert len(problems) == 2, problems
    own = next(p for p in problems if p.startswith(f"{tiny}: skip.cpu-x86-64: "))
    assert "matches no ABI of any target, so nothing would be skipped" in own
    assert "did you mean 'cpu-x86_64'?" in own
    assert HOST_ABIS in own and "rk3588: npu, vulkan-mali-g610, vulkan-baseline" in own
    variant = next(p for p in problems if p.startswith(f"{cls}: variants.int8.skip.vulkn-*: "))
    assert "nothing would be skipped" in variant and HOST_ABIS in variant


def test_skips_naming_an_abi_of_any_known_target_are_fine(tmp_path):
    """A model spec is not written for one registry: 'vulkan-*' and `npu` stand while building
    host only, and with a registry of one's own that lacks them (the project's targets know them);
    an ABI that only that registry has may be skipped too."""
    models = tmp_path / "models"
    spec = add_tiny_model(models, "tiny")
    _append(spec, "skip:\n  npu: no NPU build\n  'vulkan-*': no GPU build\n")
    assert load_project(models, tmp_path / "artifacts", "host").models[0].skip_reason("npu")
    _append(spec, "  board-cpu: not this one\n")
    registry = tmp_path / "targets"
    registry.mkdir()
    doc = yaml.safe_load((REPO / "pipeline/targets/host.yaml").read_text())
    doc["abis"] = {"board-cpu": doc["abis"]["cpu-x86_64"]}
    doc.pop("fallback", None), doc.pop("ship", None)
    (registry / "board.yaml").write_text(yaml.safe_dump(doc))
    project = load_project(models, tmp_path / "artifacts", "board", targets_dir=registry)
    assert project.models[0].skip_reason("board-cpu") == "not this one"
