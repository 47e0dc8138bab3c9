"""A slot with `build: shipped` builds only the ABI that ships when that is known before building
(pipeline/compilers/builds.py `not_needed`): rk3588's TVM CPU build is not made for a model whose IREE
build ships by policy prefer, and the manifest and the choice say why; a model that IREE cannot
take, an explicit choice, a tuning budget, or `build: all` builds it as before.

TVM is still the slot's *fallback* (builds.fallback_pair): its steps are in the graph, gated
(graph/fallback.py), and build only when IREE's compile or validation fails; choose and
manifest read both candidates' attempt records. tests/e2e/test_fallback.py builds it."""
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


def gated(proj) -> dict:
    """doit task name -> its gate's role, for ppocr_cls's gated steps (the preferred's and the
    fallback's compile and validate)."""
    out = {}
    for stage in ("iree_compile", "tvm_compile", "validate"):
        for s in proj.steps(stage):
            if s.gate is not None and s.name.startswith("rk3588/ppocr_cls/"):
                out[f"{stage}:{s.name}"] = s.gate.role
    return out


def test_build_shipped_builds_irees_cpu_artifact_and_tvm_only_as_its_fallback(tmp_path):
    proj = project(tmp_path)
    assert tvm_steps(proj) == {"rk3588/ppocr_cls/cpu-aarch64-tvm"}  # in the graph, gated
    assert gated(proj) == {"iree_compile:rk3588/ppocr_cls/cpu-aarch64": "preferred",
                           "validate:rk3588/ppocr_cls/cpu-aarch64": "preferred",
                           "tvm_compile:rk3588/ppocr_cls/cpu-aarch64-tvm": "fallback",
                           "validate:rk3588/ppocr_cls/cpu-aarch64-tvm": "fallback"}
    assert TVM_ABI not in skipped_in_manifest(proj)  # decided by the attempts, when the manifest runs
    (manifest,) = proj.steps("manifest")
    entry = next(m for m in manifest.cfg.models if m.name == "ppocr_cls")
    why = entry.fallbacks["cpu"]["why"]
    assert why.startswith("not built: cpu-aarch64 ships (slot cpu: policy prefer)") and "build: all" in why
    assert "built when cpu-aarch64 is skipped for the model or fails" in why
    assert entry.fallbacks["cpu"]["preferred"] == "cpu-aarch64"
    assert not any(k.startswith("ppocr_cls:cpu-aarch64") and not k.endswith(":attempt")
                   for k in manifest.inputs)  # neither candidate's files: they may not exist
    slot = choice_slot(proj)
    assert slot.candidates == ("cpu-aarch64",) and TVM_ABI not in slot.skipped
    assert slot.fallback == {"preferred": "cpu-aarch64", "fallback": TVM_ABI, "why": why}
    assert "rk3588/ppocr_cls/cpu-aarch64" in {s.name for s in proj.steps("validate")}


def test_the_gated_tasks_wait_on_attempt_records_not_on_artifacts(tmp_path):
    """The doit tasks of the pair: the fallback's compile waits on the preferred's validation
    attempt; a validation waits on its compile's attempt instead of its artifact (which a failed
    or unneeded compile does not make); the fallback's targets are its attempt alone (its
    artifact is not made when not needed, and a no-op build must find it up to date); the steps'
    keys are unchanged (their configs and inputs are the ungated steps')."""
    from pipeline.core.steps import doit_task
    proj = project(tmp_path)
    root = proj.layout.target_dir("rk3588") / "ppocr_cls"
    steps = {f"{st}:{s.name}": s for st in ("iree_compile", "tvm_compile", "validate")
             for s in proj.steps(st) if s.name.startswith("rk3588/ppocr_cls/")}
    spare = doit_task(steps[f"tvm_compile:rk3588/ppocr_cls/{TVM_ABI}"])
    assert str(root / "cpu-aarch64/validate.attempt.json") in spare["file_dep"]
    assert spare["targets"] == [str(root / TVM_ABI / "tvm_compile.attempt.json")]
    check = doit_task(steps[f"validate:rk3588/ppocr_cls/{TVM_ABI}"])
    assert str(root / TVM_ABI / "tvm_compile.attempt.json") in check["file_dep"]
    assert not any("/tvm_compile/" in d for d in check["file_dep"])
    mine = doit_task(steps["validate:rk3588/ppocr_cls/cpu-aarch64"])
    assert str(root / "cpu-aarch64/iree_compile.attempt.json") in mine["file_dep"]
    assert str(root / "cpu-aarch64/validate/validation.json") in mine["targets"]
    plain = dataclasses.replace(steps["validate:rk3588/ppocr_cls/cpu-aarch64"], gate=None)
    assert doit_task(plain)["uptodate"][0]._calc_digest() == mine["uptodate"][0]._calc_digest()
    assert root / "cpu-aarch64/iree_compile/model.vmfb" in plain.inputs.values()


def test_build_all_and_the_default_build_every_candidate(tmp_path):
    for build in ("all", None):  # untuned=1: an untuned TVM build is not left out (builds.cannot_win)
        proj = dataclasses.replace(project(tmp_path / str(build), slot_build=build), untuned=True)
        assert tvm_steps(proj) == {"rk3588/ppocr_cls/cpu-aarch64-tvm"}, build
        assert TVM_ABI not in skipped_in_manifest(proj)
        assert choice_slot(proj).candidates == ("cpu-aarch64", TVM_ABI)
        assert gated(proj) == {}  # both built: no fallback


def test_when_iree_cannot_take_the_model_tvm_is_built(tmp_path):
    proj = project(tmp_path, iree_skipped=True)
    assert tvm_steps(proj) == {"rk3588/ppocr_cls/cpu-aarch64-tvm"}
    assert choice_slot(proj).candidates == (TVM_ABI,)
    assert gated(proj) == {} and choice_slot(proj).fallback is None  # built, not a fallback


def test_an_explicit_choice_builds_only_the_chosen(tmp_path):
    proj = project(tmp_path, spec_edit=lambda d: d.setdefault("ship", {}).update(
        {"rk3588": {"cpu": TVM_ABI}}))
    assert tvm_steps(proj) == {"rk3588/ppocr_cls/cpu-aarch64-tvm"}
    why = skipped_in_manifest(proj)["cpu-aarch64"]
    assert "the model's spec ships cpu-aarch64-tvm" in why
    assert "rk3588/ppocr_cls/cpu-aarch64" not in {s.name for s in proj.steps("iree_compile")}
    assert gated(proj) == {}  # the user's choice fails as it is


def test_a_tuning_budget_keeps_tvm_built(tmp_path):
    proj = project(tmp_path, spec_edit=lambda d: d.setdefault("tvm", {}).setdefault(
        "tune", {}).update({"rk3588": {"trials": 8}}))
    assert "rk3588/ppocr_cls/cpu-aarch64-tvm" in tvm_steps(proj)


def test_an_untuned_tvm_that_cannot_win_is_the_fallback_too(tmp_path):
    """`build: all` with no tuning budget: TVM is left out because it cannot win
    (builds.cannot_win), and is still the fallback of IREE's build."""
    proj = dataclasses.replace(project(tmp_path, slot_build="all"), untuned=False)  # conftest: 1
    assert tvm_steps(proj) == {"rk3588/ppocr_cls/cpu-aarch64-tvm"}
    assert gated(proj)[f"tvm_compile:rk3588/ppocr_cls/{TVM_ABI}"] == "fallback"
    why = choice_slot(proj).fallback["why"]
    assert why.startswith("not built: an untuned TVM build cannot win") and "built when cpu-aarch64 fails" in why


def test_a_variant_choice_says_which_abis_it_times_and_why_not_the_others(tmp_path):
    """Whether an int8 artifact pays is measured by the variant's choose step (stages/choose.py
    variant_step) where its artifacts run natively; rk3588's run under qemu or in the NPU's
    simulator, so its choice says why they are not timed (manifest: pays.measured false)."""
    proj = project(tmp_path)
    (step,) = [s for s in proj.steps("choose") if s.name == "rk3588/ppocr_cls.int8"]
    assert step.cfg.timed == () and step.cfg.variant_of == "ppocr_cls"
    assert set(step.cfg.untimed) == {"npu", "cpu-aarch64"}
    assert "run qemu here, not natively" in step.cfg.untimed["cpu-aarch64"]
    assert "`doit build target=host`" in step.cfg.untimed["cpu-aarch64"]
