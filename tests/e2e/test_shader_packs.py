"""Shader compilation paid once per fleet (issue 32, item 2): the Mesa cache a lavapipe validation
fills is stored under the artifact's bytes and the driver build, and the next validation of the
same bytes, here or on a machine that shares the remote cache, starts warm."""
from __future__ import annotations

import json
import tarfile

from conftest import Workspace, add_tiny_model, require
from pipeline.core.store import Store
from pipeline.run import shader_packs, vulkan

GPU = ("abis:\n  vk:\n    compiler: iree\n    backend: vulkan-spirv\n"
       "    vulkan_target: llvmpipe\n    run: {via: vulkan, driver: lavapipe}\n")


def _packs(ws: Workspace) -> list[dict]:
    store = Store(ws.artifacts / ".store")
    records = [json.loads(p.read_text()) for p in store.records()]
    return [r for r in records if r["stage"] == shader_packs.STAGE]


def _log(ws: Workspace) -> str:
    return (ws.artifacts / "logs/validate/gpu_alpha_vk.log").read_text()


def test_a_validation_stores_its_shader_cache_and_the_next_one_starts_warm(tmp_path, monkeypatch):
    devices, why = vulkan.query_devices(vulkan.driver_env("lavapipe"))
    require(bool(devices), f"lavapipe missing (./setup.sh installs mesa-vulkan-drivers): {why}")
    monkeypatch.setenv("MODELYARD_SHADER_CACHE", str(tmp_path / "machine"))  # this test's own
    targets = tmp_path / "targets"
    targets.mkdir()
    (targets / "gpu.yaml").write_text(GPU)
    remote = tmp_path / "remote"
    remote.mkdir()

    first = Workspace(tmp_path / "one")
    add_tiny_model(first.models, "alpha", seed=5)
    first.build(f"targets={targets}", f"cache=file://{remote}", "cache_push=1")
    assert "cold (no pack" in _log(first)
    (pack,) = _packs(first)
    obj = Store(first.artifacts / ".store").object_path(pack["outputs"][shader_packs.PACK]["sha256"])
    with tarfile.open(obj) as tar:
        names = tar.getnames()
    assert any("mesa_shader_cache" in n for n in names), names   # lavapipe's compiled kernels
    assert list((tmp_path / "machine" / "packs").glob("*.tar"))

    # the same workspace, validation forced to run again: warm from its own store
    first.build(f"targets={targets}", "revalidate=1")
    assert "warm, from the build cache" in _log(first)

    # another machine: no store, no machine folder, only the remote cache
    monkeypatch.setenv("MODELYARD_SHADER_CACHE", str(tmp_path / "other-machine"))
    second = Workspace(tmp_path / "two")
    add_tiny_model(second.models, "alpha", seed=5)
    second.build(f"targets={targets}", f"cache=file://{remote}", "revalidate=1")
    assert "warm, from the build cache" in _log(second)
    assert json.loads((second.artifacts / "gpu/alpha/vk/validate/validation.json").read_text())[
        "status"] == "passed"
    assert not (tmp_path / "other-machine" / "packs").exists()  # it came from the remote


def test_the_pack_key_follows_the_artifact_bytes_and_the_driver_build(tmp_path):
    a, b = tmp_path / "a.vmfb", tmp_path / "b.vmfb"
    a.write_bytes(b"one")
    b.write_bytes(b"two")
    assert shader_packs.pack_key(a, "lavapipe") != shader_packs.pack_key(b, "lavapipe")
    assert shader_packs.pack_key(a, "lavapipe") == shader_packs.pack_key(a, "lavapipe")
    build = shader_packs.driver_build("lavapipe")
    assert build["library"].startswith("sha256:") or build["library"] == "missing"
