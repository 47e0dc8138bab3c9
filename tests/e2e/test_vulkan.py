"""Vulkan ABIs: requirements from IREE's target record, twin validation on lavapipe, fallback
order, the runtime helper's choice, and the errors a wrong device or driver must give."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO, Workspace, add_tiny_model, require, require_aarch64, sha256
from pipeline.run import vulkan


def test_lavapipe_is_seen_through_the_iree_runtime():
    devices, why = vulkan.query_devices(vulkan.driver_env("lavapipe"))
    require(bool(devices), f"lavapipe missing (./setup.sh installs mesa-vulkan-drivers): {why}")
    assert devices[0].driver == "llvmpipe" and devices[0].subgroup_size == 8
    env = vulkan.driver_env(None)
    env["VK_DRIVER_FILES"] = env["VK_ICD_FILENAMES"] = "/nonexistent/icd.json"
    devices, why = vulkan.query_devices(env)
    assert devices == [] and "no usable Vulkan driver" in why


@pytest.fixture(scope="module")
def rk3588_build(tmp_path_factory):
    require_aarch64()
    ws = Workspace(tmp_path_factory.mktemp("vk"))
    add_tiny_model(ws.models, "alpha", seed=7)
    ws.build("target=rk3588")
    return ws


def test_rk3588_ships_valhall3_with_a_validated_twin(rk3588_build):
    ws = rk3588_build
    doc = json.loads((ws.artifacts / "rk3588/manifest.json").read_text())
    assert doc["target"]["fallback"] == ["npu", "vulkan-mali-g610", "vulkan-baseline", "cpu-aarch64",
                                         "cpu-aarch64-tvm"]
    arts = doc["models"]["alpha"]["artifacts"]
    mali = arts["vulkan-mali-g610"]
    assert sha256(ws.artifacts / mali["path"]) == mali["sha256"]
    assert mali["requires"]["vulkan"]["arch"] == "valhall3"
    assert mali["requires"]["vulkan"]["subgroup_size"] == [16]
    val = mali["validation"]
    assert val["status"] == "twin-passed" and val["shipped_bytes_executed"] is False
    assert val["twin"]["vulkan_target"] == "llvmpipe" and val["twin"]["shipped_sha256"] == mali["sha256"]
    assert val["twin"]["sha256"] != mali["sha256"] and "on the board" in val["twin"]["still_needed"]
    assert "llvmpipe" in val["executed"]["device"] and val["outputs"][0]["max_abs"] < 1e-4
    base = arts["vulkan-baseline"]
    assert base["validation"]["status"] == "passed" and base["validation"]["shipped_bytes_executed"]
    assert base["requires"]["vulkan"]["vulkan_api"] == "1.1"
    assert arts["cpu-aarch64"]["validation"]["executed"]["emulated"] is True


def _runner(ws, code: str, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    """The runtime helper in a fresh process: the Vulkan loader reads its environment once."""
    env = dict(os.environ, **(env_extra or {}))
    prog = ("import sys, json, numpy as np\n"
            f"sys.path.insert(0, {str(REPO)!r})\n"
            "from pipeline.app import Runner\n"
            "from pipeline.core.errors import PipelineError\n"
            f"M = {str(ws.artifacts / 'rk3588/manifest.json')!r}\n"
            f"X = np.load({str(ws.artifacts / 'models/alpha/golden/input_0.npy')!r})\n"
            f"Y = np.load({str(ws.artifacts / 'models/alpha/golden/output_0.npy')!r})\n" + code)
    return subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, env=env,
                          timeout=600)


def test_runtime_chooses_cpu_without_a_gpu_and_vulkan_on_lavapipe(rk3588_build):
    auto = _runner(rk3588_build, "r = Runner.open(M, 'alpha')\nprint(r.choice.explain())\n"
                                 "print('ERR', float(np.abs(r.run(X)[0] - Y).max()))")
    assert auto.returncode == 0, auto.stderr
    assert "chose cpu-aarch64" in auto.stdout and "emulated" in auto.stdout
    assert "passed over vulkan-mali-g610" in auto.stdout and "software rasterizer" in auto.stdout
    assert float(auto.stdout.split("ERR")[1]) < 1e-4
    lvp = _runner(rk3588_build, "r = Runner.open(M, 'alpha', vulkan_driver='lavapipe')\n"
                                "print(r.choice.explain())\n"
                                "print('ERR', float(np.abs(r.run(X)[0] - Y).max()))\n"
                                "print('ERR2', float(np.abs(r.run(X)[0] - Y).max()))")
    assert lvp.returncode == 0, lvp.stderr
    assert "chose vulkan-baseline" in lvp.stdout and "llvmpipe" in lvp.stdout
    assert "passed over vulkan-mali-g610: llvmpipe (LLVM" in lvp.stdout
    assert "compiled for subgroup size [16], device offers 8..8" in lvp.stdout
    assert float(lvp.stdout.split("ERR")[1].split()[0]) < 1e-4
    assert float(lvp.stdout.split("ERR2")[1]) < 1e-4  # loaded once, run twice


def test_runtime_errors_are_clear(rk3588_build):
    forced = _runner(rk3588_build, "try:\n    Runner.open(M, 'alpha', prefer='vulkan-mali-g610', "
                                   "vulkan_driver='lavapipe')\nexcept PipelineError as e:\n    print(e)")
    assert "no artifact of alpha can run on this machine" in forced.stdout
    assert "subgroup size [16]" in forced.stdout and "wrong numbers" in forced.stdout
    no_driver = _runner(rk3588_build, "try:\n    Runner.open(M, 'alpha', prefer='vulkan-baseline')\n"
                                      "except PipelineError as e:\n    print(e)",
                        {"VK_DRIVER_FILES": "/nonexistent.json", "VK_ICD_FILENAMES": "/nonexistent.json"})
    assert "vulkan-baseline: no usable Vulkan driver" in no_driver.stdout, no_driver.stdout + no_driver.stderr
    wrong = _runner(rk3588_build,
                    "from pipeline.run.iree_load import load_module\n"
                    f"cpu = {str(rk3588_build.artifacts / 'rk3588/alpha/cpu-aarch64/iree_compile/model.vmfb')!r}\n"
                    "try:\n    load_module(__import__('pathlib').Path(cpu), 'local-task', 'main', {'model': 'alpha'})\n"
                    "except PipelineError as e:\n    print(e)")
    assert "was built for another device than the IREE driver 'local-task' provides" in wrong.stdout, \
        wrong.stdout + wrong.stderr
    unknown = _runner(rk3588_build, "try:\n    Runner.open(M, 'alpha', prefer='dsp')\n"
                                    "except PipelineError as e:\n    print(e)")
    assert "no artifact 'dsp' for alpha" in unknown.stdout


def test_validation_catches_iree_vulkan_miscompiling_the_classifier(tmp_path):
    """IREE 3.13's SPIR-V code for this PP-OCR classifier subgraph runs without error and returns
    wrong numbers. Validation must stop it. When this test fails, IREE fixed the bug: drop the
    `skip:` of models/ppocr_cls/model.yaml."""
    devices, why = vulkan.query_devices(vulkan.driver_env("lavapipe"))
    require(bool(devices), f"lavapipe missing: {why}")
    targets = tmp_path / "targets"
    targets.mkdir()
    (targets / "gpu.yaml").write_text(
        "abis:\n  vulkan-baseline:\n    compiler: iree\n    backend: vulkan-spirv\n"
        "    vulkan_target: vp_android_baseline_2022\n    run: {via: vulkan, driver: lavapipe}\n")
    ws = Workspace(tmp_path / "ws")
    import shutil
    shutil.copytree(REPO / "tests/fixtures/ppocr_cls_vulkan_bug", ws.models / "cls_part")
    result = ws.build(f"targets={targets}", check=False)
    out = result.stdout + result.stderr
    assert result.returncode != 0
    assert "[model=cls_part target=gpu/vulkan-baseline stage=validate] outputs differ from golden" in out
    max_abs = float(out.split("max_abs ")[1].split()[0])
    assert max_abs > 1.0, out  # not a rounding difference: whole regions are wrong
    assert not (ws.artifacts / "gpu/cls_part/vulkan-baseline/validate").exists()


def test_a_skipped_abi_is_recorded_with_its_reason(tmp_path):
    ws = Workspace(tmp_path / "ws")
    spec = add_tiny_model(ws.models, "alpha", seed=2)
    spec.write_text(spec.read_text() + "skip:\n  'vulkan-*': known IREE bug, see issue 12\n"
                    "  '*-tvm': not wanted from TVM\n")  # patterns reach TVM's ABIs too
    ws.build("target=rk3588")
    doc = json.loads((ws.artifacts / "rk3588/manifest.json").read_text())
    model = doc["models"]["alpha"]
    assert sorted(model["artifacts"]) == ["cpu-aarch64", "npu"]
    assert model["skipped"] == {"cpu-aarch64-tvm": "not wanted from TVM",
                                "vulkan-baseline": "known IREE bug, see issue 12",
                                "vulkan-mali-g610": "known IREE bug, see issue 12"}
    choice = model["choice"]["cpu"]
    assert choice["ships"] == "cpu-aarch64"
    assert "skipped by the model's spec: not wanted from TVM" in choice["reason"]
    bad = add_tiny_model(ws.models, "beta", seed=3)
    bad.write_text(bad.read_text() + "skip:\n  'vulkan-*': ''\n")
    result = ws.build("target=rk3588", check=False)
    assert result.returncode != 0 and "a skip without a reason is not allowed" in result.stderr


def test_lavapipe_validation_demotes_the_spinning_threads_and_keeps_the_bytes(tmp_path, monkeypatch):
    """IREE's Vulkan driver spins on lavapipe (run/spin.py): the validation's runner demotes the
    spinning threads to SCHED_IDLE, says so in the step's log, and the outputs are the same
    bytes as a run without the watcher."""
    devices, why = vulkan.query_devices(vulkan.driver_env("lavapipe"))
    require(bool(devices), f"lavapipe missing: {why}")
    targets = tmp_path / "targets"
    targets.mkdir()
    (targets / "gpu.yaml").write_text(  # the flag makes this subgraph right on llvmpipe
        "abis:\n  vulkan-llvmpipe:\n    compiler: iree\n    backend: vulkan-spirv\n"
        "    vulkan_target: llvmpipe\n"
        "    flags: [--iree-dispatch-creation-enable-fuse-padding-into-linalg-consumer-ops]\n"
        "    run: {via: vulkan, driver: lavapipe}\n")
    ws = Workspace(tmp_path / "ws")
    import shutil
    shutil.copytree(REPO / "tests/fixtures/ppocr_cls_vulkan_bug", ws.models / "cls_part")
    # an empty shader cache: with the kernels compiled the run is too short to show a spinner
    monkeypatch.setenv("MODELYARD_SHADER_CACHE", str(tmp_path / "mesa-build"))
    ws.build(f"targets={targets}")
    log = (ws.artifacts / "logs/validate/gpu_cls_part_vulkan-llvmpipe.log").read_text()
    demoted = int(log.split("spin watcher: ")[1].split()[0])
    assert demoted >= 1, log  # lavapipe compiles the kernels for seconds: the spinners show

    vmfb = ws.artifacts / "gpu/cls_part/vulkan-llvmpipe/iree_compile/model.vmfb"
    x = ws.artifacts / "models/cls_part/golden/input_0.npy"
    runs = {}
    for mode in ("watched", "plain"):  # each with an empty Mesa cache: lavapipe compiles again
        env = vulkan.driver_env("lavapipe", shader_cache=tmp_path / f"mesa-{mode}")
        out = tmp_path / f"{mode}.npy"
        args = dict(module=str(vmfb), function="main", device="vulkan", input=[str(x)],
                    output=[str(out)])
        argv = ["--module", str(vmfb), "--function", "main", "--device", "vulkan",
                "--input", str(x), "--output", str(out)]
        code = "import argparse, sys\nfrom pipeline.run import iree_run\n" + (
            f"sys.exit(iree_run.main({argv!r}))" if mode == "watched" else
            f"sys.exit(iree_run._run(argparse.Namespace(**{args!r})))")  # as before the watcher
        run = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env,
                             capture_output=True, text=True, timeout=900)
        assert run.returncode == 0, run.stderr
        runs[mode] = (out.read_bytes(), run.stderr)
    assert "spin watcher: " in runs["watched"][1] and "spin watcher" not in runs["plain"][1]
    assert runs["watched"][0] == runs["plain"][0]


def test_a_baseline_build_validated_on_two_independent_drivers(tmp_path):
    """run.also: the same shipped bytes run on lavapipe and on SwiftShader (chromium's, a driver
    that shares no code with Mesa), each compared with golden; validation.json and the manifest
    say what each ran on. A driver outside the schema's list is a spec error."""
    for driver in ("lavapipe", "swiftshader"):
        devices, why = vulkan.query_devices(vulkan.driver_env(driver))
        require(bool(devices), f"{driver} missing (./setup.sh installs it): {why}")
    targets = tmp_path / "targets"
    targets.mkdir()
    abi = ("abis:\n  vulkan-baseline:\n    compiler: iree\n    backend: vulkan-spirv\n"
           "    vulkan_target: vp_android_baseline_2022\n"
           "    run: {via: vulkan, driver: lavapipe, also: [%s]}\n")
    (targets / "gpu.yaml").write_text(abi % "swiftshader")
    ws = Workspace(tmp_path / "ws")
    add_tiny_model(ws.models, "alpha", seed=11)
    ws.build(f"targets={targets}")
    report = json.loads((ws.artifacts / "gpu/alpha/vulkan-baseline/validate/validation.json").read_text())
    assert report["status"] == "passed" and report["shipped_bytes_executed"]
    assert "llvmpipe" in report["executed"]["device"].lower()
    (other,) = report["also"]
    assert other["driver"] == "swiftshader" and "swiftshader" in other["device"].lower()
    assert all(o["max_abs"] <= report["tolerance"]["max_abs"] for o in other["outputs"]), other
    manifest = json.loads((ws.artifacts / "gpu/manifest.json").read_text())
    assert manifest["models"]["alpha"]["artifacts"]["vulkan-baseline"]["validation"]["also"] == [other]
    (targets / "gpu.yaml").write_text(abi % "nvidia")
    refused = ws.build(f"targets={targets}", check=False)
    assert refused.returncode != 0 and "also" in refused.stdout + refused.stderr
