"""The README's build on the shipped default models: rk3588 and the host, every CPU ABI.

The default models' Vulkan artifacts are left to the README's command itself and to the
benchmarks: lavapipe compiles each of the detector's pipelines on first use, which takes minutes
on a 2-core CI machine (small models in tests, big ones in benchmarks). The Vulkan path itself
is tested on lavapipe in tests/e2e/test_vulkan.py with small models; the default models' recorded
Vulkan skips are checked here, from the real specs.
"""
from __future__ import annotations

import json

from conftest import REPO, Workspace, ran, require_aarch64, sha256, target_registry
from pipeline.graph import load_project


def cpu_only_registry(tmp_path):
    """The real target files with their Vulkan ABIs taken out (same CPU ABIs, same flags)."""
    return target_registry(tmp_path / "targets", lambda abi: abi.get("backend") != "vulkan-spirv")


def test_default_models_build_and_validate_for_rk3588_and_host(tmp_path):
    require_aarch64()
    ws = Workspace(tmp_path)
    ws.models = REPO / "models"
    targets = cpu_only_registry(tmp_path)
    for target, cpu, emulated in (("rk3588", "cpu-aarch64", True), ("host", "cpu-x86_64", False)):
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
            # IREE's and TVM's CPU builds, both validated (precision variants: IREE only)
            abis = (cpu,) if "variant_of" in model else (cpu, f"{cpu}-tvm")
            assert sorted(model["artifacts"]) == sorted(abis)
            for abi in abis:
                art = model["artifacts"][abi]
                assert sha256(ws.artifacts / art["path"]) == art["sha256"]
                val = art["validation"]
                assert val["status"] == "passed" and val["executed"]["emulated"] is emulated
                for row in val["outputs"]:
                    assert row["failures"] == []
                    assert row["max_abs"] <= val["tolerance"]["max_abs"]
                    assert row["cosine"] >= val["tolerance"]["cosine"]
            if "variant_of" not in model:
                assert model["choice"]["cpu"]["ships"] in abis
            folder = REPO / "models" / model.get("shape_of", model.get("variant_of", name))
            assert model["source"]["sha256"] == sha256(folder / model["source"]["file"])
        assert doc["models"]["ppocr_det"]["io"]["outputs"][0]["shape"] == [1, 1, 480, 640]
        assert ran(ws.build(f"target={target}", f"targets={targets}")) == []


def test_default_models_record_their_vulkan_decisions(tmp_path):
    """With the real registry: every default model ships the Mali build (twin-validated; the
    classifier thanks to the ABI's pad-fusion workaround), none the baseline build (wrong: on a
    real GPU for the detector, for the classifier even with the depthwise workaround; too slow
    to validate on lavapipe for face_landmark)."""
    proj = load_project(REPO / "models", tmp_path / "artifacts", "rk3588")
    steps = {s.name for s in proj.steps("iree_compile")}
    assert "rk3588/ppocr_det/vulkan-mali-g610" in steps
    assert "rk3588/ppocr_det/vulkan-mali-g610/twin" in steps
    assert "rk3588/ppocr_det/vulkan-baseline" not in steps
    assert {"rk3588/ppocr_cls/vulkan-mali-g610", "rk3588/ppocr_cls/vulkan-mali-g610/twin"} <= steps
    assert "rk3588/ppocr_cls/vulkan-baseline" not in steps
    specs = {m.name: m for m in proj.models}
    assert "wrong without an error on a real" in specs["ppocr_det"].skip_reason("vulkan-baseline")
    assert "node 114" in specs["ppocr_det"].skip_reason("vulkan-baseline")
    assert "doit bisect" in specs["ppocr_cls"].skip_reason("vulkan-baseline")
    assert specs["ppocr_cls"].skip_reason("vulkan-mali-g610") is None
    # face_landmark: the Mali build (its twin validates on lavapipe in minutes); the baseline
    # build is right on a real GPU but too slow on lavapipe to validate here, and says so
    assert {"rk3588/face_landmark/vulkan-mali-g610", "rk3588/face_landmark/vulkan-mali-g610/twin"} <= steps
    assert "rk3588/face_landmark/vulkan-baseline" not in steps
    assert "not validated here" in specs["face_landmark"].skip_reason("vulkan-baseline")
    # a twin-validated build can only be released under a waiver: every model that ships one has it
    for name in ("ppocr_cls", "ppocr_cls.48x320", "ppocr_det", "face_landmark"):
        waived = {(w["abi"], w["status"]) for w in specs[name].release.get("waivers", [])}
        assert ("vulkan-mali-g610", "twin-passed") in waived, name
    (manifest_step,) = proj.steps("manifest")
    cfg = {m["name"]: m for m in manifest_step.config["models"]}
    assert sorted(cfg["ppocr_cls"]["skipped"]) == ["vulkan-baseline"]
    mali = next(a for t in proj.targets for a in t.abis if a.name == "vulkan-mali-g610")
    assert [w["name"] for w in mali.workarounds] == ["pad-fusion"]
