"""The README's build: the shipped default models, for rk3588 (aarch64 under qemu) and the host."""
from __future__ import annotations

import json

from conftest import REPO, Workspace, ran, require_aarch64, sha256


def test_default_models_build_and_validate_for_rk3588_and_host(tmp_path):
    require_aarch64()
    ws = Workspace(tmp_path)
    ws.models = REPO / "models"
    for target, cpu, emulated in (("rk3588", "cpu-aarch64", True), ("host", "cpu-x86_64", False)):
        ws.build(f"target={target}")
        doc = json.loads((ws.artifacts / target / "manifest.json").read_text())
        assert doc["target"]["name"] == target
        assert sorted(doc["models"]) == ["ppocr_cls", "ppocr_det"]
        for name, model in doc["models"].items():
            for abi in (cpu, f"{cpu}-tvm"):  # IREE's and TVM's CPU builds, both validated
                art = model["artifacts"][abi]
                assert sha256(ws.artifacts / art["path"]) == art["sha256"]
                val = art["validation"]
                assert val["status"] == "passed" and val["executed"]["emulated"] is emulated
                for row in val["outputs"]:
                    assert row["failures"] == []
                    assert row["max_abs"] <= val["tolerance"]["max_abs"]
                    assert row["cosine"] >= val["tolerance"]["cosine"]
            assert model["choice"]["cpu"]["ships"] in (cpu, f"{cpu}-tvm")
            assert model["source"]["sha256"] == sha256(REPO / "models" / name / model["source"]["file"])
        assert doc["models"]["ppocr_det"]["io"]["outputs"][0]["shape"] == [1, 1, 480, 640]
        assert ran(ws.build(f"target={target}")) == []
