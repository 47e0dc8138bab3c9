"""A slot with `build: shipped` builds only the ABI that ships when that is known before building
(pipeline/compilers/builds.py `not_needed`): rk3588's TVM CPU build is not made for a model whose IREE
build ships by policy prefer, and the manifest and the choice say why; a model that IREE cannot
take, an explicit choice, a tuning budget, or `build: all` builds it as before."""
from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import yaml

from pipeline.graph import load_project
from pipeline.core.layout import coverage_file

REPO = Path(__file__).resolve().parents[2]
TVM_ABI = "cpu-aarch64-tvm"


def project(tmp_path, slot_build: str | None = "shipped", spec_edit=None, iree_skipped=False):
    models, targets = tmp_path / "models", tmp_path / "targets"
    shutil.copytree(REPO / "models" / "ppocr_cls", models / "ppocr_cls",
                    ignore=shutil.ignore_patterns("configs"))
    if spec_edit:
        path = models / "ppocr_cls" / "model.yaml"
        doc = yaml.safe_load(path.read_text())
        spec_edit(doc)
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
    targets.mkdir()
    doc = yaml.safe_load((REPO / "pipeline/targets/rk3588.yaml").read_text())
    if slot_build is None:
        doc["ship"]["cpu"].pop("build", None)
    else:
        doc["ship"]["cpu"]["build"] = slot_build
    (targets / "rk3588.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    shutil.copy(REPO / "pipeline/targets/host.yaml", targets / "host.yaml")  # configs_from
    artifacts = tmp_path / "artifacts"
    if iree_skipped:  # the coverage step's verdict: IREE cannot take the model
        proj = load_project(models, artifacts, "rk3588", targets_dir=targets)
        path = coverage_file(proj.layout, "rk3588", "ppocr_cls")
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps({"compilers": {
            "iree": {"status": "skipped", "unsupported": [{"op": "Foo", "why": "no converter"}]},
            "tvm": {"status": "ok"}}}))
    return load_project(models, artifacts, "rk3588", targets_dir=targets)


def tvm_steps(proj) -> set:
    """ppocr_cls's own TVM steps (its shape variant 48x320 follows the same rule)."""
    names = {s.name for s in proj.steps("tvm_compile")} | {
        s.name for s in proj.steps("validate") if s.name.endswith(f"/{TVM_ABI}")}
    return {n for n in names if n.startswith("rk3588/ppocr_cls/")}


def skipped_in_manifest(proj) -> dict:
    (manifest,) = proj.steps("manifest")
    return next(m for m in manifest.config["models"] if m["name"] == "ppocr_cls")["skipped"]


def choice_slot(proj):
    (choose,) = [s for s in proj.steps("choose") if s.name == "rk3588/ppocr_cls"]
    return choose.cfg.slots[0]


def test_build_shipped_builds_only_irees_cpu_artifact(tmp_path):
    proj = project(tmp_path)
    assert tvm_steps(proj) == set()
    why = skipped_in_manifest(proj)[TVM_ABI]
    assert why.startswith("not built: cpu-aarch64 ships (slot cpu: policy prefer)") and "build: all" in why
    slot = choice_slot(proj)
    assert slot.candidates == ("cpu-aarch64",) and slot.skipped[TVM_ABI] == why
    assert "rk3588/ppocr_cls/cpu-aarch64" in {s.name for s in proj.steps("validate")}


def test_build_all_and_the_default_build_every_candidate(tmp_path):
    for build in ("all", None):  # untuned=1: an untuned TVM build is not left out (builds.cannot_win)
        proj = dataclasses.replace(project(tmp_path / str(build), slot_build=build), untuned=True)
        assert tvm_steps(proj) == {"rk3588/ppocr_cls/cpu-aarch64-tvm"}, build
        assert TVM_ABI not in skipped_in_manifest(proj)
        assert choice_slot(proj).candidates == ("cpu-aarch64", TVM_ABI)


def test_when_iree_cannot_take_the_model_tvm_is_built(tmp_path):
    proj = project(tmp_path, iree_skipped=True)
    assert tvm_steps(proj) == {"rk3588/ppocr_cls/cpu-aarch64-tvm"}
    assert choice_slot(proj).candidates == (TVM_ABI,)


def test_an_explicit_choice_builds_only_the_chosen(tmp_path):
    proj = project(tmp_path, spec_edit=lambda d: d.setdefault("ship", {}).update(
        {"rk3588": {"cpu": TVM_ABI}}))
    assert tvm_steps(proj) == {"rk3588/ppocr_cls/cpu-aarch64-tvm"}
    why = skipped_in_manifest(proj)["cpu-aarch64"]
    assert "the model's spec ships cpu-aarch64-tvm" in why
    assert "rk3588/ppocr_cls/cpu-aarch64" not in {s.name for s in proj.steps("iree_compile")}


def test_a_tuning_budget_keeps_tvm_built(tmp_path):
    proj = project(tmp_path, spec_edit=lambda d: d.setdefault("tvm", {}).setdefault(
        "tune", {}).update({"rk3588": {"trials": 8}}))
    assert "rk3588/ppocr_cls/cpu-aarch64-tvm" in tvm_steps(proj)
