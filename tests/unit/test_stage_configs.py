"""Every stage's steps carry a typed, frozen, checked Config; Step.config (what the step key
hashes) is exactly its as_key(), and from_key() makes the same Config back.

Builds every step of the repo's default models for rk3588 and host: no toolchain runs (before
`coverage` has run, the steps after it are made for every ABI of the target).
"""
from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from pipeline.core.steps import StageConfig
from pipeline.core.store import canonical_json
from pipeline.graph import STAGES, load_project

REPO = Path(__file__).resolve().parents[2]
TARGETS = ("rk3588", "host")


@pytest.fixture(scope="module")
def steps(tmp_path_factory) -> dict:
    """(target, stage name) -> the stage's steps for the default models."""
    out = {}
    for target in TARGETS:
        project = load_project(REPO / "models", tmp_path_factory.mktemp(target), target)
        for stage in STAGES:
            out[target, stage.name] = project.steps(stage.name)
    return out


@pytest.mark.parametrize("stage", STAGES, ids=lambda s: s.name)
def test_every_step_config_is_its_stage_config_and_round_trips(steps, stage):
    found = [s for t in TARGETS for s in steps[t, stage.name]]
    if stage.name == "search_configs":  # the default models have pins: they search nothing
        assert not found  # (tests/unit/test_search_budget.py round-trips a search step's config)
        return
    assert found, f"no {stage.name} step for the default models on {', '.join(TARGETS)}"
    for step in found:
        cfg = step.cfg
        assert isinstance(cfg, StageConfig) and dataclasses.is_dataclass(cfg), step.name
        assert type(cfg).__module__ == stage.module.__name__, (step.name, type(cfg))
        assert step.config_type is type(cfg)
        assert step.config == cfg.as_key(), step.name
        again = type(cfg).from_key(step.config)
        assert again == cfg, step.name
        assert canonical_json(again.as_key()) == canonical_json(step.config), step.name
        assert step.static_fingerprint()["config"] is step.config
        field = dataclasses.fields(cfg)[0].name
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(cfg, field, None)


def test_a_typo_is_an_attribute_error_not_a_key_read(steps):
    (step,) = [s for s in steps["host", "import"] if s.name == "ppocr_det"]
    assert step.cfg.opset >= 17
    with pytest.raises(AttributeError):
        step.cfg.opsett


def test_a_broken_rule_is_one_sentence_naming_the_config():
    from pipeline.stages import import_model, tvm_compile
    with pytest.raises(ValueError) as err:
        import_model.Config(opset=0)
    assert str(err.value) == ("pipeline.stages.import_model.Config: opset must be a positive "
                              "integer, got 0")
    with pytest.raises(ValueError, match="trials must be a positive integer, got 0"):
        tvm_compile.Budget(trials=0, per_task=2)


def test_replacing_the_key_dict_makes_a_checked_config(steps):
    """dataclasses.replace(step, config={...}) (as tests do) gives a step whose cfg follows."""
    step = next(s for s in steps["rk3588", "iree_compile"] if s.cfg.backend == "vulkan-spirv")
    assert step.cfg.precision is None and "precision" not in step.config
    fp16 = dataclasses.replace(step, config={**step.config, "precision": "fp16"})
    assert fp16.cfg.precision == "fp16" and fp16.config["precision"] == "fp16"
    assert fp16.cfg.vulkan_target == step.cfg.vulkan_target
    with pytest.raises(ValueError, match="precision must be one of"):
        dataclasses.replace(step, config={**step.config, "precision": "fp8"})
    with pytest.raises(TypeError):
        dataclasses.replace(step, config={**step.config, "vulkan_targett": "x"})


def test_no_stage_reads_its_config_by_string_key():
    """run(ctx) reads ctx.cfg's attributes: there is no ctx.config, and no step.config[...]."""
    found = []
    for path in sorted((REPO / "pipeline" / "stages").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "config" and isinstance(
                    node.value, ast.Name) and node.value.id in ("ctx", "step", "s"):
                found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    assert not found, "\n".join(found)
