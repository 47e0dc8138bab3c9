"""The README's build: the shipped default models, for rk3588 (aarch64 under qemu) and the host."""
from __future__ import annotations

import json

from conftest import REPO, Workspace, ran, require_aarch64, sha256


def test_default_models_build_and_validate_for_rk3588_and_host(tmp_path):
    require_aarch64()
    ws = Workspace(tmp_path)
    ws.models = REPO / "models"
    for target, abi, emulated in (("rk3588", "cpu-aarch64", True), ("host", "cpu-x86_64", False)):
        ws.build(f"target={target}")
        doc = json.loads((ws.artifacts / target / "manifest.json").read_text())
        assert doc["target"]["name"] == target
        assert sorted(doc["models"]) == ["face_landmark", "ppocr_cls", "ppocr_cls.48x320", "ppocr_det"]
        assert doc["models"]["ppocr_cls"]["variants"] == ["ppocr_cls.48x320"]
        assert doc["models"]["ppocr_cls.48x320"]["variant_of"] == "ppocr_cls"
        assert doc["models"]["ppocr_cls.48x320"]["io"]["inputs"][0]["shape"] == [1, 3, 48, 320]
        assert doc["models"]["face_landmark"]["source"]["route"] == "tflite->nnef->onnx (nnef-tools)"
        assert doc["models"]["face_landmark"]["io"]["inputs"][0]["shape"] == [1, 192, 192, 3]
        for name, model in doc["models"].items():
            art = model["artifacts"][abi]
            assert sha256(ws.artifacts / art["path"]) == art["sha256"]
            val = art["validation"]
            assert val["status"] == "passed" and val["executed"]["emulated"] is emulated
            for row in val["outputs"]:
                assert row["failures"] == []
                assert row["max_abs"] <= val["tolerance"]["max_abs"]
                assert row["cosine"] >= val["tolerance"]["cosine"]
            folder = REPO / "models" / model.get("variant_of", name)
            assert model["source"]["sha256"] == sha256(folder / model["source"]["file"])
        assert doc["models"]["ppocr_det"]["io"]["outputs"][0]["shape"] == [1, 1, 480, 640]
        if target == "rk3588":  # the GPU path: the Mali build, validated through its lavapipe twin
            mali = doc["models"]["ppocr_det"]["artifacts"]["vulkan-mali-g610"]
            assert mali["validation"]["status"] == "twin-passed"
            assert mali["validation"]["outputs"][0]["max_abs"] < 1e-4
            assert mali["requires"]["vulkan"]["arch"] == "valhall3"
            assert "vulkan-baseline" in doc["models"]["ppocr_det"]["skipped"]
            assert sorted(doc["models"]["ppocr_cls"]["skipped"]) == ["vulkan-baseline",
                                                                     "vulkan-mali-g610"]
        assert ran(ws.build(f"target={target}")) == []
