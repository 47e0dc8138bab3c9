"""The edit matrix of the code digests (issue 41 item 1): a one-line edit of a backend's module
or a stage's changes the code digest (hence the key) of exactly the steps that run it, and no
other. Shown on the steps of the default models for every registered target (what `doit list`
makes), with the digests of a copy of the package that holds the edit: no build runs. The real
`doit build` check is tests/e2e/test_edit_matrix.py."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from conftest import REPO
from pipeline.compilers import backends
from pipeline.core import codehash
from pipeline.core.errors import PipelineError
from pipeline.graph import STAGES, load_project

# Each backend's own modules (its row's module, its runner and app loader, its stages), each with
# the stages whose steps of that backend must all re-run when it changes.
OWN = {
    "iree": {"compilers/iree_backend.py": ("iree_compile", "validate"), "run/iree_run.py": ("validate",),
             "run/iree_load.py": ("validate",), "stages/iree_compile.py": ("iree_compile",)},
    "tvm": {"compilers/tvm_backend.py": ("tvm_compile", "validate"), "run/tvm_run.py": ("validate",),
            "run/tvm_load.py": ("validate",), "run/tvm_timing.py": ("validate",),
            "stages/tvm_compile.py": ("tvm_compile",), "stages/tvm_tune.py": ("tvm_tune",),
            # what the TVM stages share, and the tuning's modules (issue 41 item 4)
            "compilers/tvm_relax.py": ("tvm_compile", "tvm_tune"), "compilers/tvm_tuning.py": ("tvm_tune",),
            "compilers/tvm_tuner.py": ("tvm_tune",), "compilers/tvm_candidates.py": ("tvm_tune",),
            "compilers/tvm_cluster_builds.py": ("tvm_tune",), "compilers/tvm_tune_progress.py": ("tvm_tune",),
            "run/tvm_tracker.py": ("tvm_tune",)},
    "rknn": {"compilers/rknn_backend.py": ("rknn_compile", "validate"),
             "run/rknn_run.py": ("validate",), "run/rknn_load.py": ("validate",),
             "run/rknn_driver.py": ("rknn_compile",), "stages/rknn_compile.py": ("rknn_compile",)},
}
PER_ABI = {"iree_compile", "tvm_compile", "rknn_compile", "tvm_tune", "validate", "search_configs"}
PER_MODEL = {"import", "golden", "static", "quantize", "accuracy"}

@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    """edit(path under pipeline/) -> {(stage, step name)} whose code digest the edit changes."""
    project = load_project(REPO / "models", tmp_path_factory.mktemp("artifacts"), None)
    steps = [s for stage in STAGES for s in project.steps(stage.name)]
    before = {(s.stage, s.name): s.static_fingerprint()["code"] for s in steps}
    copy = tmp_path_factory.mktemp("checkout") / "pipeline"
    shutil.copytree(codehash.ROOT, copy, ignore=shutil.ignore_patterns("__pycache__"))
    real = codehash.ROOT

    def edit(rel: str) -> set:
        path = copy / rel
        old = path.read_bytes()
        path.write_bytes(old + b"\nEDIT_MATRIX = 1\n")  # a one-line change
        codehash.forget()
        codehash.ROOT = copy
        try:
            return {k for k, s in zip(before, steps) if s.static_fingerprint()["code"] != before[k]}
        finally:
            path.write_bytes(old)
            codehash.ROOT = real
            codehash.forget()

    edit.steps = {(s.stage, s.name): s for s in steps}
    return edit


def backend_of_step(step) -> str | None:
    """The backend a per-ABI step runs (its config's compiler; tvm_tune: TVM's)."""
    return "tvm" if step.stage == "tvm_tune" else step.config.get("compiler")


def target_of(step) -> str | None:
    target = step.where.get("target")
    return target.split("/")[0] if target else None


@pytest.mark.parametrize("backend", sorted(OWN))
def test_a_backends_edit_reruns_its_steps_and_no_per_abi_step_of_another_backend(matrix, backend):
    steps = matrix.steps
    assert {backend_of_step(s) for s in steps.values() if s.stage in PER_ABI} >= set(OWN)
    for rel in OWN[backend]:
        changed = matrix(rel)
        others = sorted(k for k in changed if k[0] in PER_ABI and backend_of_step(steps[k]) != backend)
        assert not others, f"editing {rel} re-runs another backend's steps: {others}"
        model_level = sorted(k for k in changed if k[0] in PER_MODEL)
        assert not model_level, f"editing {rel} re-runs steps that run no backend: {model_level}"
        for stage in OWN[backend][rel]:
            own = {k for k, s in steps.items() if k[0] == stage and backend_of_step(s) == backend}
            assert own and own <= changed, (rel, stage, sorted(own - changed))


def test_editing_the_rknn_backend_reruns_no_host_step(matrix):
    for rel in OWN["rknn"]:
        host = sorted(k for k in matrix(rel) if target_of(matrix.steps[k]) in ("host", None))
        assert not host, f"editing {rel} re-runs host (or model) steps: {host}"


def test_editing_the_tvm_backend_reruns_no_iree_step(matrix):
    iree = {k for k, s in matrix.steps.items() if backend_of_step(s) == "iree"}
    assert any(k[0] == "iree_compile" for k in iree) and any(k[0] == "validate" for k in iree)
    for rel in OWN["tvm"]:
        assert not sorted(iree & matrix(rel)), rel


@pytest.mark.parametrize("stage", sorted(p.stem for p in (codehash.ROOT / "stages").glob("*.py")
                                         if p.stem != "__init__"))
def test_a_stages_edit_reruns_its_steps_and_no_other_stages(matrix, stage):
    """The stages are peers (issue 41 item 3; tests/unit/test_architecture.py: no stage imports
    another): editing one re-runs its own steps, and `doit search`'s, whose child runs some."""
    name = {s.module.__name__.rsplit(".", 1)[1]: s.name for s in STAGES}.get(stage, stage)
    changed = matrix(f"stages/{stage}.py")
    mine = {k for k in matrix.steps if k[0] == name}
    assert mine <= changed, sorted(mine - changed)
    allowed = {name}
    if stage == "validate" or stage == "iree_compile" or stage == "tvm_tune" or stage == "choose":
        allowed |= {"search_configs"}  # `doit search`'s child builds, validates and times with them
    stray = sorted(k for k in changed if k[0] not in allowed)
    assert not stray, f"editing stages/{stage}.py re-runs other stages' steps: {stray}"


def test_a_shared_module_reaches_every_step_that_imports_it(matrix):
    """core/numerics.py is used by golden, static, validate...: the key is never too narrow."""
    changed = matrix("core/numerics.py")
    for stage in ("golden", "static", "validate", "iree_compile"):
        assert {k for k in matrix.steps if k[0] == stage} <= changed, stage


def test_a_child_process_module_counts_in_the_key():
    """A module run as `python -m` (its name in quotes) is an edge: validate's IREE steps run
    pipeline/run/iree_run.py in a child process."""
    mods = codehash.code_modules("pipeline.stages.validate", frozenset({"iree"}))
    assert "pipeline.run.iree_run" in mods and "pipeline.compilers.iree_backend" in mods
    assert "pipeline.compilers.rknn_backend" not in mods and "pipeline.compilers.tvm_backend" not in mods
    assert "pipeline.run.iree_run" in codehash.imports_of("pipeline.compilers.iree_backend")


def test_the_registry_is_not_an_edge_and_a_config_names_its_rows():
    assert "pipeline.compilers.backends" in codehash.closure("pipeline.stages.validate")
    assert not {m for m in codehash.closure("pipeline.stages.validate") if m.endswith("_backend")}
    rows = codehash.lazy_rows("pipeline.compilers.backends")
    assert {t for _, t in rows} == {r[2].partition(":")[0] for r in backends.LAZY}
    assert codehash.words({"a": ["x", {"tvm-so": 1}], "b": None}) == {"a", "x", "tvm-so", "b"}
    # no config at all (a child's own digest): every row counts, as before
    every = codehash.code_modules("pipeline.stages.validate", None)
    assert {t for _, t in rows} <= set(every)


def test_a_step_that_asks_for_a_backend_its_key_lacks_is_refused():
    where = {"stage": "validate", "model": "m", "target": "host/cpu-x86_64"}
    with codehash.running("pipeline.stages.validate", {"compiler": "iree"}, where):
        assert backends.backend_named("iree").name == "iree"
        assert "rknn" in backends.BY_NAME  # the names ask nothing of the modules
        with pytest.raises(PipelineError) as err:
            backends.backend_named("rknn")
        assert "model=m" in str(err.value) and "next:" in str(err.value)
        assert "rknn" in str(err.value) and "stage=validate" in str(err.value)
        with pytest.raises(PipelineError):
            backends.BY_FORMAT["tvm-so"]
    assert backends.backend_named("rknn").name == "rknn"  # outside a step: anything
    with codehash.running("tests.not_the_package", {}, where):  # a test's own action: unchecked
        assert backends.backend_named("tvm").name == "tvm"


def test_the_report_prints_a_row_per_stage():
    text = codehash.report()
    assert all(f"\n{p.stem:16} " in text for p in (codehash.ROOT / "stages").glob("*.py")
               if p.stem != "__init__")
    assert "iree_backend" in text and "modules in pipeline/" in text


def test_the_registry_rows_match_their_backends():
    for name, fmt, entry in backends.LAZY:
        b = backends.BY_NAME[name]
        assert (b.name, b.format) == (name, fmt) and backends.BY_FORMAT[fmt] is b
    assert [b.name for b in backends.BACKENDS] == list(backends.NAMES)


def test_editing_quantize_reruns_no_golden_static_validation_compile_or_import(matrix):
    """The variant stages share spec/samples.py, validate and static read golden through
    core/layout.read_golden, golden and static share exact_reference through rewrite/contrib_ops:
    quantize.py is in no key but quantize's own (issue 41: no golden or static step re-runs)."""
    changed = matrix("stages/quantize.py")
    assert {k for k in matrix.steps if k[0] == "quantize"} <= changed
    stray = sorted(k for k in changed if k[0] in PER_ABI | {"import", "accuracy", "golden", "static"})
    assert not stray, stray



def test_the_search_childs_digest_holds_iree_and_what_it_imports_not_rknn():
    """search_configs' config holds its child's digest (bench/config_search.py): the child asks
    the registry for IREE only (CHILD_USES, enforced in the child), so an RKNN edit re-runs no
    host search step."""
    from pipeline.stages import search_configs
    mods = codehash.code_modules(search_configs.CHILD, codehash.words(search_configs.CHILD_USES))
    assert "pipeline.compilers.iree_backend" in mods and "pipeline.run.iree_run" in mods
    assert not {m for m in mods if "rknn" in m}
