"""Shader compilation paid once per fleet (issue 32, item 2): the Mesa cache a lavapipe validation
fills is stored under the artifact's bytes and the driver build, and the next validation of the
same bytes, here or on a machine that shares the remote cache, starts warm."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile

from conftest import REPO, Workspace, add_tiny_model, require
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
    kind = shader_packs.cpu_kind()
    one_cpu = dict(kind, cpus=1)
    assert shader_packs.pack_key(a, "lavapipe", kind) != shader_packs.pack_key(a, "lavapipe", one_cpu)


INTEL = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 106
flags\t\t: fpu tsc mmx sse sse2 pni ssse3 sse4_1 sse4_2 popcnt avx avx2 fma f16c avx512f avx512bw
clflush size\t: 64

processor\t: 1
vendor_id\t: GenuineIntel
"""
AMD = INTEL.replace("GenuineIntel", "AuthenticAMD").replace("family\t: 6", "family\t: 25").replace(
    " avx512f avx512bw", "")


def test_the_cpu_kind_is_what_mesa_keys_its_cache_on():
    intel = shader_packs.cpu_kind(INTEL, available=2, configured=2)
    assert intel == {"cpus": 2, "cpus_configured": 2, "vendor": "GenuineIntel", "family": "6",
                     "cache_line": "64", "features": sorted(
                         ["avx", "avx2", "avx512bw", "avx512f", "f16c", "fma", "mmx", "pni",
                          "popcnt", "sse", "sse2", "sse4_1", "sse4_2", "ssse3", "tsc"])}
    assert shader_packs.describe_kind(intel) == "2 of 2 CPUs, GenuineIntel family 6, avx512f"
    amd = shader_packs.cpu_kind(AMD, available=2, configured=2)
    assert shader_packs.describe_kind(amd) == "2 of 2 CPUs, AuthenticAMD family 25, avx2"
    assert shader_packs.cpu_kind(INTEL, available=1, configured=2)["cpus"] == 1  # taskset


def test_a_pack_made_with_other_cpus_is_a_miss_said_so_and_stored_again(tmp_path, monkeypatch):
    """Measured: Mesa's key holds the CPUs the process may use. A pack made with 2 CPUs, found
    by a validation restricted to one (`taskset -c 0`) under its own key, is a miss: the log and
    the timing record say how many kernels were compiled, and the pack is stored again."""
    devices, why = vulkan.query_devices(vulkan.driver_env("lavapipe"))
    require(bool(devices), f"lavapipe missing (./setup.sh installs mesa-vulkan-drivers): {why}")
    require(len(os.sched_getaffinity(0)) >= 2, "needs two CPUs to make a pack one CPU cannot use")
    monkeypatch.setenv("MODELYARD_SHADER_CACHE", str(tmp_path / "machine"))
    targets = tmp_path / "targets"
    targets.mkdir()
    (targets / "gpu.yaml").write_text(GPU)
    ws = Workspace(tmp_path / "ws")
    add_tiny_model(ws.models, "alpha", seed=7)
    ws.build(f"targets={targets}")
    (made,) = (tmp_path / "machine" / "packs").glob("*.tar")
    artifact = next(ws.artifacts.glob("gpu/alpha/vk/**/*.vmfb"))
    one_cpu = dict(shader_packs.cpu_kind(), cpus=1)
    (tmp_path / "machine" / "packs" / f"{shader_packs.pack_key(artifact, 'lavapipe', one_cpu)}.tar"
     ).write_bytes(made.read_bytes())  # another machine's pack where this kind's would be
    for record in Store(ws.artifacts / ".store").records():  # only the machine folder has one
        if json.loads(record.read_text())["stage"] == shader_packs.STAGE:
            record.unlink()
    argv = ["taskset", "-c", "0", sys.executable, "-m", "doit", "-f", str(REPO / "dodo.py"), "build",
            f"targets={targets}", "revalidate=1", f"models={ws.models}", f"artifacts={ws.artifacts}"]
    result = subprocess.run(argv, capture_output=True, text=True, cwd=ws.root, timeout=1200)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "missed" in _log(ws) and "the pack is stored again" in _log(ws), _log(ws)
    timing = json.loads((ws.artifacts / "logs/validate/gpu_alpha_vk.timing.json").read_text())
    pack = timing["notes"]["shader_pack"]
    assert pack["source"] == "machine" and pack["compiled"] > 0 and pack["cpu"].startswith("1 of ")
    assert "shader packs (Mesa's cache for lavapipe):" in result.stderr
    assert "missed" in result.stderr
