"""The spec files' structure is typed (pydantic, pipeline/spec/*.py) and exported as JSON Schema
(docs/schema/): the committed schemas are current, every spec in the repository validates, a bad
one does not, and loading a spec reports every problem at once, with file and key.

Self-contained and fast: no conftest fixtures, no toolchain runs. After a spec change, run
    python -m pipeline.spec.schema --write
"""
from __future__ import annotations

import copy
import json
import shutil
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from pipeline.core.errors import SpecError
from pipeline.spec import load_models, load_target, schema
from pipeline.spec.common import validate
from pipeline.spec.model import ModelDoc
from pipeline.spec.target import TargetDoc

WRITE = "run `python -m pipeline.spec.schema --write` and commit docs/schema/"
MODEL_SPECS = sorted([*REPO.glob("models/*/model.yaml"), *REPO.glob("tests/fixtures/*/model.yaml")])
TARGETS = sorted(REPO.glob("pipeline/targets/*.yaml"))
FIXTURE = REPO / "tests" / "fixtures" / "ppocr_cls_vulkan_bug"  # a small ONNX model and its spec


def validator(name: str) -> jsonschema.Draft202012Validator:
    doc = json.loads((REPO / "docs" / "schema" / name).read_text())
    jsonschema.Draft202012Validator.check_schema(doc)
    return jsonschema.Draft202012Validator(doc)


def test_committed_schemas_are_what_the_code_generates():
    for name, doc in schema.SCHEMAS.items():
        path = REPO / "docs" / "schema" / name
        assert path.is_file(), f"{path} missing: {WRITE}"
        assert path.read_text() == schema.render(doc), f"{path} is not current: {WRITE}"
    assert schema.stale() == []
    text = schema.render(ModelDoc)
    assert text.endswith("}\n") and text == schema.render(ModelDoc)  # deterministic


def test_the_schemas_carry_help_for_editors():
    model = json.loads(schema.render(ModelDoc))
    assert model["title"] == "model.yaml" and model["additionalProperties"] is False
    assert set(model["required"]) == {"source", "inputs", "tolerance"}
    props = model["properties"]
    assert "description" in props["license"] and "description" in props["skip"]
    tolerance = model["$defs"]["ToleranceDoc"]["properties"]
    assert tolerance["cosine"]["maximum"] == 1 and "cosine similarity" in tolerance["cosine"]["description"]
    assert model["$defs"]["InputDoc"]["properties"]["dtype"]["enum"][0] == "float32"
    target = json.loads(schema.render(TargetDoc))
    abi = target["properties"]["abis"]
    assert abi["additionalProperties"] is False and abi["minProperties"] == 1
    cpu = target["$defs"]["CpuAbiDoc"]["properties"]
    assert cpu["backend"]["const"] == "llvm-cpu" and "description" in cpu["cpu"]
    assert "default" not in cpu["triple"]  # may be left out, may not be null


@pytest.mark.parametrize("path", MODEL_SPECS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_model_spec_validates_against_the_schema(path):
    errors = list(validator("model.schema.json").iter_errors(yaml.safe_load(path.read_text())))
    assert not errors, [e.message for e in errors]


@pytest.mark.parametrize("path", TARGETS, ids=lambda p: p.stem)
def test_every_target_validates_against_the_schema(path):
    errors = list(validator("target.schema.json").iter_errors(yaml.safe_load(path.read_text())))
    assert not errors, [e.message for e in errors]


def _set(doc: dict, path: tuple, value) -> dict:
    doc = copy.deepcopy(doc)
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return doc


GATE = {"max_abs": 1, "mean_abs": 1, "cosine": 1}
MODEL_BREAKS = [(("licence",), "LICENSE"), (("tolerance", "max_abs"), "small"), (("opset",), 9),
                (("inputs", "conv2d_58.tmp_0", "shape"), [1, 0, 12, 96]), (("source", "sha256"), None),
                (("description",), 5), (("skip",), {"vulkan-*": ""}),
                (("variants",), {"fp32": {"evaluation": "e", "gate": GATE}}),
                (("variants",), {"x": {"evaluation": "e", "gate": {**GATE, "cosine": 2}}})]


@pytest.mark.parametrize("path, value", MODEL_BREAKS, ids=lambda v: ".".join(v) if isinstance(v, tuple) else None)
def test_a_bad_model_spec_fails_the_schema_and_the_loader(path, value):
    _fails_both(FIXTURE / "model.yaml", "model.schema.json", ModelDoc, path, value)


def _fails_both(good_file, schema: str, doc_type, path, value) -> None:
    """The good document passes the JSON Schema; with `value` at `path` both the schema and the
    loader refuse it, the loader naming the file in every problem."""
    good = yaml.safe_load(good_file.read_text())
    bad = _set(good, path, value)
    assert not list(validator(schema).iter_errors(good))
    assert list(validator(schema).iter_errors(bad))
    problems = []
    validate(doc_type, bad, good_file.name, problems)
    assert problems and all(p.startswith(f"{good_file.name}: ") for p in problems)


TARGET_BREAKS = [(("colour",), "red"), (("abis", "cpu-aarch64", "cpu"), 5),
                 (("abis", "cpu-aarch64", "arch"), "riscv"), (("abis", "cpu-aarch64", "backend"), "metal"),
                 (("abis", "cpu-aarch64", "compiler"), "gcc"), (("abis", "cpu-aarch64-tvm", "num_cores"), 0),
                 (("abis", "cpu-aarch64-tvm", "cpu_features"), ["neon"]),
                 (("ship", "cpu", "abis"), ["cpu-aarch64"]), (("ship", "cpu", "policy"), "random"),
                 (("abis", "Bad"), {"compiler": "tvm", "arch": "x86_64", "cpu": "x", "run": {"via": "python"}})]


@pytest.mark.parametrize("path, value", TARGET_BREAKS, ids=lambda v: ".".join(v) if isinstance(v, tuple) else None)
def test_a_bad_target_fails_the_schema_and_the_loader(path, value):
    _fails_both(REPO / "pipeline/targets/rk3588.yaml", "target.schema.json", TargetDoc, path, value)


def test_a_model_spec_with_many_problems_reports_them_all(tmp_path):
    """Structure (pydantic) and what needs the files (license, sha256, the model's inputs,
    data sets) in one run, each with file and key; valid parts are still checked."""
    folder = tmp_path / "models" / "bug"
    shutil.copytree(FIXTURE, folder)
    text = (folder / "model.yaml").read_text()
    text = (text.replace("license: [LICENSE", "licence: x\nlicense: [MISSING, LICENSE")
            .replace("sha256: 5ad5", "sha256: 0ad5")
            .replace("max_abs: 1.0e-4", "max_abs: small")
            .replace("dtype: float32", "dtype: float33")
            .replace("seed: 0, low: -1.0", "seed: -2, low: -1.0")
            + "opset: seventeen\n"
            "release:\n  waiver: []\n  waivers: [{abi: cpu, why: x}]\n"
            "variants:\n  int8:\n    calibration: {data: nowhere, method: kl}\n"
            "    evaluation: nowhere\n    gate: {max_abs: 0.1, cosine: 1.5}\n"
            "tvm:\n  tune: {host: -1}\n  database: {host: tuning}\n"
            "shapes:\n  Wide: {inputs: {x: {shape: [1]}}}\n")
    (folder / "model.yaml").write_text(text)
    with pytest.raises(SpecError) as info:
        load_models(tmp_path / "models")
    problems = info.value.problems
    where = str(folder / "model.yaml")
    assert all(p.startswith(where + ": ") for p in problems), problems
    got = [p[len(where) + 2:] for p in problems]
    expected = [
        "unknown key 'licence' (allowed: description, inputs, "
        "license, npu, opset, postprocess, preprocessing, release, shapes, ship, skip, source, tolerance, tvm, variants)",
        "inputs.conv2d_58.tmp_0.dtype: 'float33' is not one of float32, float16, float64, int64, "
        "int32, int8, uint8, bool",
        "inputs.conv2d_58.tmp_0.test_data.random.seed: must be >= 0, got -2",
        "tolerance.max_abs: expected a number, got 'small'",
        "opset: expected an integer, got 'seventeen'",
        "release: unknown key 'waiver' (allowed: io, waivers)",
        "release.waivers[0]: unknown key 'why' (allowed: abi, reason, status, target)",
        "release.waivers[0].reason: required, a non-empty string",
        "variants.int8.calibration.method: 'kl' is not one of minmax, entropy, percentile",
        "variants.int8.gate: missing required key 'mean_abs'",
        "variants.int8.gate.cosine: at most 1, got 1.5",
        "shapes.Wide: a shape name must match ^[a-z0-9][a-z0-9_-]*$ (e.g. 480x640)",
        "tvm.tune.host: must be >= 0, got -1",
        "source.sha256: mismatch for model.onnx",
        f"license: file not found: {folder / 'MISSING'}",
        f"variants.int8.calibration.data: folder not found: {folder / 'nowhere'}",
        f"variants.int8.evaluation: folder not found: {folder / 'nowhere'}",
        f"tvm.database.host: {folder / 'tuning'} lacks database_workload.json",
    ]
    for fragment in expected:
        assert any(fragment in p for p in got), f"missing: {fragment}\n" + "\n".join(got)
    assert len(problems) == len(expected), "\n".join(got)


def test_a_target_with_many_problems_reports_them_all(tmp_path):
    doc = yaml.safe_load((REPO / "pipeline/targets/rk3588.yaml").read_text())
    doc["colour"] = "red"
    doc["abis"]["cpu-aarch64"].update(arch="riscv", cpu_features="+neon")
    doc["abis"]["vulkan-baseline"]["backend"] = "metal"
    doc["abis"]["vulkan-mali-g610"]["run"] = {"via": "twin"}
    doc["abis"]["cpu-aarch64-tvm"].update(num_cores=0, run={"via": "python"})
    doc["ship"]["cpu"]["abis"].append("gpu")
    (tmp_path / "board.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    with pytest.raises(SpecError) as info:
        load_target("board", tmp_path)
    where = str(tmp_path / "board.yaml")
    got = [p[len(where) + 2:] for p in info.value.problems]
    assert sorted(got) == sorted([
        "unknown key 'colour' (allowed: abis, description, fallback, ship)",
        "abis.cpu-aarch64.arch: 'riscv' is not one of aarch64, x86_64",
        "abis.cpu-aarch64.cpu_features: expected a list, got '+neon'",
        "abis.vulkan-baseline.backend: expected one of llvm-cpu, vulkan-spirv, got 'metal'",
        "abis.cpu-aarch64-tvm.num_cores: must be >= 1, got 0",
        "abis.vulkan-mali-g610.run.twin: name the Vulkan target of the runnable twin (e.g. llvmpipe)",
        "abis.cpu-aarch64-tvm.run.via: python runs this machine's (x86_64) artifacts only",
        "ship.cpu.abis: no ABI 'gpu' in this target (it has: npu, vulkan-mali-g610, vulkan-baseline, "
        "cpu-aarch64, cpu-aarch64-tvm)",
    ]), "\n".join(got)


def test_the_parsed_specs_are_typed_documents_turned_into_the_frozen_specs():
    target = load_target("rk3588")
    cpu = {a.name: a for a in target.abis}["cpu-aarch64"]
    assert cpu.run == {"via": "qemu", "device": "local-task", "qemu_cpu": "cortex-a76"}
    assert cpu.triple == "aarch64-linux-gnu" and cpu.flags == ("--iree-opt-data-tiling",)
    assert [(a.name, a.compiler) for a in target.abis] == [
        ("npu", "rknn"), ("vulkan-mali-g610", "iree"), ("vulkan-baseline", "iree"), ("cpu-aarch64", "iree"),
        ("cpu-aarch64-tvm", "tvm")]  # every ABI in one map, as the YAML lists them
    tvm = target.abis[-1]
    assert (tvm.num_cores, tvm.tune, tvm.run) == (4, {"key": "rk3588"},
                                                  {"via": "qemu", "device": "cpu", "qemu_cpu": "cortex-a76"})
    assert target.ship == ({"name": "cpu", "abis": ["cpu-aarch64", "cpu-aarch64-tvm"],
                            "policy": "prefer", "proxies": {}, "build": "shipped"},)
