"""The README's build on the shipped default models: rk3588 (the host: test_default_models_host.py),
every CPU ABI.

The default models' Vulkan artifacts are left to the README's command itself and to the
benchmarks: lavapipe compiles each of the detector's pipelines on first use, which takes minutes
on a 2-core CI machine (small models in tests, big ones in benchmarks). The Vulkan path itself
is tested on lavapipe in tests/e2e/test_vulkan.py with small models; the default models' recorded
Vulkan skips are checked here, from the real specs.
"""
from __future__ import annotations

import json
import subprocess

from conftest import REPO, Workspace, ran, require_aarch64, sha256, target_registry
from test_c_runtime import QEMU
from test_debian_packages import firmware_check, rebuilt_identical, release_with_packages
from pipeline.core.signing import load_public_key
from pipeline.graph import load_project


def cpu_only_registry(tmp_path):
    """The real target files with their Vulkan ABIs taken out (same CPU ABIs, same flags)."""
    return target_registry(tmp_path / "targets", lambda abi: abi.get("backend") != "vulkan-spirv")


def test_default_models_build_and_validate_for_rk3588(tmp_path):
    require_aarch64()
    build_and_check(tmp_path, "rk3588", "cpu-aarch64", emulated=True)


def build_and_check(tmp_path, target: str, cpu: str, emulated: bool) -> None:
    """The default models built for `target`'s CPU ABIs (and rk3588's NPU), every artifact
    validated, a second build running nothing; for rk3588 also its release on the board.
    (The host's build is tests/e2e/test_default_models_host.py: another file, so that pytest-xdist
    runs the two on different workers.)"""
    ws = Workspace(tmp_path)
    ws.models = REPO / "models"
    targets = cpu_only_registry(tmp_path)
    ws.build(f"target={target}", f"targets={targets}")
    doc = json.loads((ws.artifacts / target / "manifest.json").read_text())
    assert doc["target"]["name"] == target
    assert sorted(doc["models"]) == ["face_landmark", "ppocr_cls", "ppocr_cls.48x320",
                                     "ppocr_cls.int8", "ppocr_det"]
    assert doc["models"]["ppocr_cls"]["shapes"] == ["ppocr_cls.48x320"]
    assert doc["models"]["ppocr_cls.48x320"]["shape_of"] == "ppocr_cls"
    assert doc["models"]["ppocr_cls.int8"]["variant_of"] == "ppocr_cls"
    assert doc["models"]["ppocr_cls.48x320"]["io"]["inputs"][0]["shape"] == [1, 3, 48, 320]
    assert doc["models"]["face_landmark"]["source"]["route"] == "tflite->nnef->onnx (nnef-tools)"
    assert doc["models"]["face_landmark"]["io"]["inputs"][0]["shape"] == [1, 192, 192, 3]
    for name, model in doc["models"].items():
        # IREE's and TVM's CPU builds, both validated on host; rk3588's slot builds only
        # what ships (build: shipped): IREE's, TVM's listed as skipped with the reason
        abis = (cpu,) if "variant_of" in model or target == "rk3588" else (cpu, f"{cpu}-tvm")
        if target == "rk3588" and "variant_of" not in model:
            assert model["skipped"][f"{cpu}-tvm"].startswith(f"not built: {cpu} ships"), model
        if target == "rk3588":  # and the NPU's RKNN build, validated in its simulator (docs/npu.md)
            abis += ("npu",)
        assert sorted(model["artifacts"]) == sorted(abis)
        for abi in abis:
            art = model["artifacts"][abi]
            assert sha256(ws.artifacts / art["path"]) == art["sha256"]
            val = art["validation"]
            assert val["status"] == "passed" and val["executed"]["emulated"] is emulated
            for row in val["outputs"]:
                assert row["failures"] == []
                assert row["max_abs"] <= val["tolerance"]["max_abs"]
                assert row["cosine_skipped"] or row["cosine"] >= val["tolerance"]["cosine"]
        if "variant_of" not in model:
            assert model["choice"]["cpu"]["ships"] in abis
        folder = REPO / "models" / model.get("shape_of", model.get("variant_of", name))
        assert model["source"]["sha256"] == sha256(folder / model["source"]["file"])
    assert doc["models"]["ppocr_det"]["io"]["outputs"][0]["shape"] == [1, 1, 480, 640]
    assert ran(ws.build(f"target={target}", f"targets={targets}")) == []
    if target == "rk3588":
        check_release_on_the_board(ws, targets, tmp_path)


def check_release_on_the_board(ws, targets, tmp_path):
    """The rk3588 bundle of the default models: its aarch64 modelyard-run --check, under qemu,
    on every CPU artifact it ships (the compiler choice ships one per model), against the
    bundle's golden test vectors and recorded tolerance; then the same release as Debian packages
    in an arm64 Debian root filesystem (test_debian_packages.firmware_check: reuses this build)."""
    key = tmp_path / "key.pem"
    release_with_packages(ws, targets, key, "1.0.0")
    rel = ws.artifacts / "releases" / "rk3588" / "1.0.0"
    models = json.loads((rel / "release.json").read_text())["models"]
    exe = str(rel / "runtime" / "aarch64" / "bin" / "modelyard-run")
    checked = []
    for name, model in sorted(models.items()):
        for abi in [a for a, art in model["artifacts"].items() if art["requires"].get("arch") == "aarch64"]:
            if model["artifacts"][abi]["format"] == "rknn":
                continue  # the NPU's: no NPU here (its simulated validation is in the manifest)
            r = subprocess.run([*QEMU, exe, str(rel), name, "--check", "--abi", abi],
                               capture_output=True, text=True, timeout=900)
            assert r.returncode == 0, f"{name}/{abi}:\n{r.stdout}{r.stderr}"
            assert "aarch64 CPU" in r.stdout and "FAIL" not in r.stdout, r.stdout
            assert r.stdout.count("PASS") == len(model["io"]["outputs"]), r.stdout
            checked.append(f"{name}/{abi}")
    assert len(checked) == 5, checked  # 4 models and the int8 variant, one CPU artifact each
    packages = ws.artifacts / "packages" / "rk3588" / "1.0.0"
    report = firmware_check(packages, load_public_key(f"{key}.pub"), tmp_path / "debian")
    assert sorted(report["checked"]) == sorted(checked)
    rebuilt_identical(rel, packages, key, tmp_path / "packages-again")


def test_default_models_record_their_vulkan_decisions(tmp_path):
    """With the real registry: every default model builds the Mali build (twin-validated; the
    classifier thanks to the ABI's pad-fusion workaround); the detector and face_landmark also
    the baseline build (validated as is on lavapipe, with the ABI's depthwise workaround), the
    classifier and its shape variant skip it, naming the op wrong on a real GPU."""
    proj = load_project(REPO / "models", tmp_path / "artifacts", "rk3588")
    steps = {s.name for s in proj.steps("iree_compile")}
    specs = {m.name: m for m in proj.models}
    for name in ("ppocr_det", "ppocr_cls", "ppocr_cls.48x320", "face_landmark"):
        assert {f"rk3588/{name}/vulkan-mali-g610", f"rk3588/{name}/vulkan-mali-g610/twin"} <= steps, name
        assert specs[name].skip_reason("vulkan-mali-g610") is None
    for name in ("ppocr_det", "face_landmark"):
        assert f"rk3588/{name}/vulkan-baseline" in steps
        assert f"rk3588/{name}/vulkan-baseline/twin" not in steps  # runs as is on lavapipe
        assert specs[name].skip_reason("vulkan-baseline") is None, name
    for name in ("ppocr_cls", "ppocr_cls.48x320"):
        assert f"rk3588/{name}/vulkan-baseline" not in steps
        assert "node 108" in specs[name].skip_reason("vulkan-baseline")
        assert "NVIDIA H200" in specs[name].skip_reason("vulkan-baseline")
    baseline = next(a for t in proj.targets for a in t.abis if a.name == "vulkan-baseline")
    assert [r for w in baseline.workarounds for r in w["rewrites"]] == [
        "depthwise_conv3x3_as_slices", "depthwise_conv_as_dense"]
    # a twin-validated build can only be released under a waiver: every model that ships one has it
    for name in ("ppocr_cls", "ppocr_cls.48x320", "ppocr_det", "face_landmark"):
        waived = {(w["abi"], w["status"]) for w in specs[name].release.get("waivers", [])}
        assert ("vulkan-mali-g610", "twin-passed") in waived, name
    (manifest_step,) = proj.steps("manifest")
    cfg = {m["name"]: m for m in manifest_step.config["models"]}
    assert sorted(cfg["ppocr_cls"]["skipped"]) == ["vulkan-baseline"]
    assert cfg["ppocr_det"]["skipped"] == cfg["face_landmark"]["skipped"] == {}
    # rk3588's slot builds only what ships (build: shipped): TVM is the slot's fallback, built
    # only when IREE's aarch64 build fails (its steps are gated; the choice lists it as skipped
    # when IREE ships)
    gated = {s.name for s in proj.steps("tvm_compile") if s.gate is not None}
    for name in ("ppocr_cls", "ppocr_cls.48x320", "ppocr_det", "face_landmark"):
        assert f"rk3588/{name}/cpu-aarch64-tvm" in gated, name
    mali = next(a for t in proj.targets for a in t.abis if a.name == "vulkan-mali-g610")
    assert [w["name"] for w in mali.workarounds] == ["pad-fusion"]
