"""TVM as the second compiler, end to end through doit: compile, validate (natively and under
qemu), op coverage on real models, tuning (local and over an emulated RPC board farm), pinned
databases, the compiler choice, and the consumers (release, runtime, bench).

Tiny models, except Silero VAD and the GRU encoder (tests/fixtures) for op coverage. A target
`board` (an aarch64 CPU only: IREE and TVM) keeps the aarch64 builds free of the Vulkan ABIs.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import (REPO, TVM_AARCH64_ABI, Workspace, add_fixture_model, add_tiny_model, ran,
                      require, sha256)

BOARD = """description: an aarch64 board, CPU only (tests)
abis:
  cpu-aarch64:
    compiler: iree
    backend: llvm-cpu
    arch: aarch64
    cpu: cortex-a55
    flags: []
    run: {via: qemu, qemu_cpu: cortex-a76, device: local-task}
""" + TVM_AARCH64_ABI + """    tune: {key: rk3588}
ship:
  cpu: {abis: [cpu-aarch64, cpu-aarch64-tvm], policy: prefer}
"""
ELF_MACHINE = {0x3E: "x86_64", 0xB7: "aarch64"}


def require_tvm_aarch64() -> None:
    from pipeline.core.tools import aarch64_runtime, aarch64_tvm
    require(shutil.which("qemu-aarch64-static") is not None, "qemu-aarch64-static missing (./setup.sh)")
    require(shutil.which("aarch64-linux-gnu-g++") is not None, "aarch64-linux-gnu-g++ missing (./setup.sh)")
    require(aarch64_tvm(required=False) is not None, "aarch64 Python + TVM missing (./setup.sh)")
    require(aarch64_runtime(required=False) is not None, "aarch64 IREE runtime missing (./setup.sh)")


@pytest.fixture(scope="module")
def targets(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("targets")
    shutil.copy(REPO / "pipeline/targets/host.yaml", folder / "host.yaml")
    (folder / "board.yaml").write_text(BOARD)
    return folder


def manifest(ws: Workspace, target: str) -> dict:
    return json.loads((ws.artifacts / target / "manifest.json").read_text())


def elf_machine(path: Path) -> str:
    data = path.read_bytes()[:20]
    assert data[:4] == b"\x7fELF"
    return ELF_MACHINE[int.from_bytes(data[18:20], "little")]


def spec_with(ws: Workspace, model: str, text: str) -> None:
    spec = ws.models / model / "model.yaml"
    spec.write_text(spec.read_text() + text)


# ----------------------------------------------------------------------------- compile + validate
def test_tvm_artifacts_validate_on_host_and_under_qemu_and_are_reproducible(tmp_path, targets):
    require_tvm_aarch64()
    builds = []
    for name in ("one", "elsewhere"):
        ws = Workspace(tmp_path / name)
        add_tiny_model(ws.models, "alpha", seed=3)
        for target in ("host", "board"):
            result = ws.build(f"target={target}", f"targets={targets}")
            assert f"tvm_compile:{target}/alpha/cpu-{'x86_64' if target == 'host' else 'aarch64'}-tvm" in ran(result)
        builds.append(ws)
    ws = builds[0]
    for target, abi, arch, emulated in (("host", "cpu-x86_64-tvm", "x86_64", False),
                                        ("board", "cpu-aarch64-tvm", "aarch64", True)):
        doc = manifest(ws, target)
        art = doc["models"]["alpha"]["artifacts"][abi]
        so = ws.artifacts / art["path"]
        assert art["format"] == "tvm-so" and art["abi"]["compiler"] == "tvm" and so.name == "model.so"
        assert sha256(so) == art["sha256"] and elf_machine(so) == arch
        assert art["compile"]["target"]["mtriple"] == f"{arch}-linux-gnu"
        assert len(art["compile"]["step_key"]) == 64 and art["compile"]["tools"]["apache-tvm-ffi"] == "0.1.14.post1"
        val = art["validation"]
        assert val["status"] == "passed" and val["shipped_bytes_executed"] is True
        assert val["executed"]["emulated"] is emulated
        assert ("qemu-aarch64-static -cpu cortex-a76" in val["executed"]["where"]) is emulated
        assert val["outputs"][0]["max_abs"] < 1e-5 and val["outputs"][0]["failures"] == []
        assert art["requires"]["tvm_runtime"]["install"] == ("pip install apache-tvm==0.27.0.post1 "
                                                             "apache-tvm-ffi==0.1.14.post1")
        # both compilers' CPU builds are candidates of the slot; the declared order ships IREE
        choice = doc["models"]["alpha"]["choice"]["cpu"]
        assert choice["ships"] == ("cpu-x86_64" if target == "host" else "cpu-aarch64")
        assert choice["policy"] == "prefer" and "declared order" in choice["reason"]
        assert set(choice["candidates"]) == {abi, choice["ships"]}
        assert choice["candidates"][abi]["max_abs"] == val["outputs"][0]["max_abs"]
        assert doc["models"]["alpha"]["coverage"]["tvm"]["status"] == "ok"
        # the same bytes from another folder
        other = manifest(builds[1], target)["models"]["alpha"]["artifacts"][abi]
        assert other["sha256"] == art["sha256"] and other["compile"]["step_key"] == art["compile"]["step_key"]
    assert (ws.artifacts / "board/manifest.json").read_bytes() == \
        (builds[1].artifacts / "board/manifest.json").read_bytes()
    assert ran(ws.build("target=board", f"targets={targets}")) == []


# ----------------------------------------------------------------------------- op coverage
def test_op_coverage_builds_silero_with_tvm_only_and_the_gru_encoder_once_unrolled(tmp_path):
    """Silero's strided Conv1d is out of IREE's reach, so TVM alone builds it; the GRU encoder,
    which neither compiler takes as it is (2 bidirectional GRUs), ships once the static stage
    unrolls its GRUs (pipeline/rewrite/static_rewrites.py), and the manifest says so."""
    ws = Workspace(tmp_path)
    add_fixture_model(ws.models, "silero_vad")
    add_fixture_model(ws.models, "romanizer_encoder")
    result = ws.build("target=host")
    doc = json.loads((ws.artifacts / "host/manifest.json").read_text())
    encoder = doc["models"]["romanizer_encoder"]
    assert [r["rule"] for r in encoder["static_rewrites"]] == ["unroll-recurrent"]
    assert "GRU" not in encoder["coverage"]["iree"].get("unsupported", []) and \
        encoder["coverage"]["tvm"]["status"] == "ok"
    assert {"cpu-x86_64", "cpu-x86_64-tvm"} <= set(encoder["artifacts"])
    silero = doc["models"]["silero_vad"]
    assert silero["coverage"]["iree"]["status"] == "skipped" and \
        any(u["op"] == "Conv" for u in silero["coverage"]["iree"]["unsupported"])
    steps = ran(result)
    assert "tvm_compile:host/silero_vad/cpu-x86_64-tvm" in steps
    assert not any(s.startswith("iree_compile:host/silero_vad") for s in steps)

    shutil.rmtree(ws.models / "romanizer_encoder")
    ws.build("target=host")
    model = manifest(ws, "host")["models"]["silero_vad"]
    assert sorted(model["artifacts"]) == ["cpu-x86_64-tvm"]
    art = model["artifacts"]["cpu-x86_64-tvm"]
    assert art["validation"]["status"] == "passed"
    assert [o["name"] for o in art["validation"]["outputs"]] == ["output", "stateN"]
    assert model["skipped"]["cpu-x86_64"] == "op coverage: IREE cannot take Conv"
    (conv,) = model["coverage"]["iree"]["unsupported"]
    # the If on the sample rate was folded by the static stage (sr is bound to 16000): the conv
    # of its 16 kHz branch is now a node of the main graph
    assert conv["node"].endswith("__inl__node_conv1d_3")
    assert [r["rule"] for r in model["static_rewrites"]][0] == "fold-constant-if"
    assert "stride 2 on a 2-long axis gives 1 output and leaves 1 input element(s) over" in conv["why"]
    iree = model["coverage"]["iree"]
    assert iree["status"] == "skipped"
    assert iree["checked"]["confirmed"].startswith("iree-import-onnx + iree-compile failed on the "
                                                   "static model, as predicted: model.mlir:")
    assert "/tmp" not in json.dumps(model)  # no absolute paths in the manifest
    assert model["coverage"]["tvm"]["status"] == "ok"
    assert model["choice"]["cpu"]["ships"] == "cpu-x86_64-tvm"
    assert model["choice"]["cpu"]["reason"].startswith("the only candidate (cpu-x86_64 skipped: IREE cannot take Conv")


def test_a_stale_op_table_is_caught_by_the_real_compiler(tmp_path, monkeypatch):
    """Pretend the table says IREE cannot take Relu: the coverage step runs iree-compile, which
    takes it, and says the table is stale instead of silently dropping a working artifact."""
    from pipeline import graph
    from pipeline.stages import coverage
    from pipeline.core.errors import PipelineError
    from pipeline.core.steps import execute
    add_tiny_model(tmp_path / "models", "alpha", seed=1)
    monkeypatch.setitem(coverage.IREE_RULES, "Relu", (lambda n, s, c: "pretend", "a test rule", "none"))
    monkeypatch.setattr(coverage, "PREDICTION_VERSION", 99)  # not a stored coverage result
    proj = graph.load_project(tmp_path / "models", tmp_path / "artifacts", "host")
    for stage in ("import", "golden", "static"):
        for step in proj.steps(stage):
            execute(step)
    (step,) = proj.steps("coverage")
    with pytest.raises(PipelineError) as err:
        execute(step)
    assert "the op table says IREE cannot take Relu (pretend), but iree-import-onnx + " \
           "iree-compile accepted the static model: the table is stale" in err.value.render()
    assert not step.out_dir.exists()
    # no verdict: the compile steps are not dropped (the coverage task failed, and doit runs
    # nothing that comes after it)
    assert [s.name for s in proj.steps("iree_compile")] == ["host/alpha/cpu-x86_64"]


# ----------------------------------------------------------------------------- tuning
@pytest.fixture(scope="module")
def tuned(tmp_path_factory, targets):
    """alpha with a small host budget: tuned once by `doit tune`, shared by the tests below."""
    ws = Workspace(tmp_path_factory.mktemp("tuned"))
    add_tiny_model(ws.models, "alpha", seed=1)
    spec_with(ws, "alpha", "tvm:\n  tune:\n    host: {trials: 8, per_task: 2}\n")
    before = ws.build("target=host", f"targets={targets}", check=False)
    started = time.perf_counter()
    tune = ws.doit("tune", "target=host", f"targets={targets}")
    return ws, before, tune, time.perf_counter() - started


def test_build_does_not_tune_then_doit_tune_does_with_progress(tuned):
    ws, before, tune, seconds = tuned
    out = before.stdout + before.stderr
    assert before.returncode != 0
    assert ("[model=alpha target=host/cpu-x86_64-tvm stage=tvm_tune] a TVM tuning budget of 8 "
            "trials is set for this model and target, and no database was tuned for it yet") in out
    assert "next: run `doit tune target=host` first" in out
    assert tune.returncode == 0, tune.stdout + tune.stderr
    lines = tune.stdout.splitlines()
    assert "[tune] host/alpha/cpu-x86_64-tvm: 8 trials (at most 2 per task)" in lines
    assert any(l.startswith("[tune] 4 tasks: ") for l in lines)
    progress = [l for l in lines if l.startswith("[tune] task ")]
    assert progress and all(" trials" in l and "/8 trials" in l for l in progress)
    assert any(", best " in l and " us" in l for l in progress)
    assert any("Sending" in l and "to builder" in l for l in lines)  # live, from the scheduler
    report = json.loads((ws.artifacts / "host/alpha/cpu-x86_64-tvm/tvm_tune/tune.json").read_text())
    assert 0 < report["trials_spent"] <= 8 and report["trials_budget"] == 8
    assert report["identity"]["target"]["mcpu"] == "x86-64-v3"
    assert report["identity"]["tvm"] == {"apache-tvm": "0.27.0.post1", "apache-tvm-ffi": "0.1.14.post1"}
    assert report["measured_on"]["runner"] == "local" and report["cost_model"] == "xgb"
    print(f"doit tune (8 trials, tiny model): {seconds:.0f} s")


def test_next_build_applies_the_database_with_zero_trials(tuned, targets):
    ws, _, _, _ = tuned
    log = ws.artifacts / "logs/tvm_tune/host_alpha_cpu-x86_64-tvm.log"
    size = log.stat().st_size
    result = ws.build("target=host", f"targets={targets}")
    assert "tvm_compile:host/alpha/cpu-x86_64-tvm" in ran(result)
    art = manifest(ws, "host")["models"]["alpha"]["artifacts"]["cpu-x86_64-tvm"]
    assert art["tuning"]["source"] == "tuned" and art["tuning"]["trials_budget"] == 8
    assert art["validation"]["status"] == "passed"
    compiled = json.loads((ws.artifacts / art["path"]).with_name("compile.json").read_text())
    assert compiled["tuning_records"] == art["tuning"]["trials_spent"] > 0
    # a clean checkout of the artifacts folder with the store: restored, not tuned again
    shutil.rmtree(ws.artifacts / "host/alpha/cpu-x86_64-tvm/tvm_tune")
    (ws.artifacts / ".doit.db").unlink()
    from pipeline import graph
    from pipeline.core.steps import execute
    proj = graph.load_project(ws.models, ws.artifacts, "host", targets)
    (step,) = proj.steps("tvm_tune")
    assert execute(step) == "restored"
    assert log.stat().st_size == size  # no tuning ran: 0 trials (its log did not grow)
    assert execute(step) == "fresh"
    ws.build("target=host", f"targets={targets}")
    assert log.stat().st_size == size


def test_pinned_database_is_applied_and_refused_for_another_tvm_or_target(tuned, targets, tmp_path):
    ws0, _, _, _ = tuned
    ws = Workspace(tmp_path / "pinned")
    shutil.copytree(ws0.models, ws.models, dirs_exist_ok=True)
    shutil.copytree(ws0.artifacts / ".store", ws.artifacts / ".store")  # the tuned database
    pin = ws.doit("tune", "target=host", "pin=model", f"targets={targets}")
    assert pin.returncode == 0, pin.stdout + pin.stderr
    assert "already tuned under this key" in pin.stdout and "pinned at " in pin.stdout
    folder = ws.models / "alpha/tuning/host"
    assert sorted(p.name for p in folder.iterdir()) == ["database_tuning_record.json",
                                                        "database_workload.json", "tune.json"]
    spec_with(ws, "alpha", "  database:\n    host: tuning/host\n")
    shutil.rmtree(ws.artifacts / ".store")  # the pin alone must do
    ws.build("target=host", f"targets={targets}")
    tuning = manifest(ws, "host")["models"]["alpha"]["artifacts"]["cpu-x86_64-tvm"]["tuning"]
    assert tuning["source"] == "pinned" and tuning["pinned_at"] == "models/alpha/tuning/host"

    meta = json.loads((folder / "tune.json").read_text())
    meta["identity"]["tvm"]["apache-tvm"] = "0.26.0"
    (folder / "tune.json").write_text(json.dumps(meta))
    result = ws.build("target=host", f"targets={targets}", check=False)
    out = result.stdout + result.stderr
    assert result.returncode != 0
    assert "stage=tvm_tune] the pinned tuning database" in out and "was tuned for something else, refused" in out
    assert 'TVM version: the database has {"apache-tvm": "0.26.0", "apache-tvm-ffi": "0.1.14.post1"}' in out
    assert "next: re-tune: doit tune target=host model=alpha pin=1" in out
    assert not (ws.artifacts / "host/alpha/cpu-x86_64-tvm/tvm_tune/step.json").exists()

    meta["identity"]["tvm"]["apache-tvm"] = "0.27.0.post1"  # right version, but tuned for x86
    (folder / "tune.json").write_text(json.dumps(meta))
    spec = ws.models / "alpha/model.yaml"
    spec.write_text(spec.read_text().replace("    host: {trials: 8, per_task: 2}\n",
                                              "    host: {trials: 8, per_task: 2}\n"
                                              "    board: {trials: 8, per_task: 2}\n")
                    + "    board: tuning/host\n")
    result = ws.doit("build", "target=board", f"targets={targets}")
    out = result.stdout + result.stderr
    assert result.returncode != 0
    assert "TVM target: the database has" in out and '"mtriple": "x86_64-linux-gnu"' in out
    assert '"mtriple": "aarch64-linux-gnu"' in out


def test_a_tuning_run_killed_midway_publishes_nothing(tmp_path, targets):
    ws = Workspace(tmp_path)
    add_tiny_model(ws.models, "beta", seed=2)
    spec_with(ws, "beta", "tvm:\n  tune:\n    host: {trials: 64, per_task: 16}\n")
    assert ws.doit("static:beta", f"targets={targets}").returncode == 0
    argv = [sys.executable, "-m", "doit", "-f", str(REPO / "dodo.py"), "tune", "target=host",
            f"targets={targets}", f"models={ws.models}", f"artifacts={ws.artifacts}"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True, cwd=ws.root)
    pattern = "host/cpu-x86_64-tvm/*/database_tuning_record.json"  # the shared working database

    def recorded() -> bool:
        return any(p.read_text().strip() for p in (ws.artifacts / "tuning").glob(pattern))
    deadline = time.time() + 900
    while time.time() < deadline and not recorded():
        time.sleep(0.5)
    assert recorded(), "tuning never recorded a trial"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    tuned = ws.artifacts / "host/beta/cpu-x86_64-tvm/tvm_tune"
    assert not (tuned / "step.json").exists() and not (tuned / "database_tuning_record.json").exists()
    stored = [json.loads(p.read_text())["stage"] for p in (ws.artifacts / ".store/keys").glob("*.json")]
    assert "tvm_tune" not in stored and "static" in stored
    result = ws.build("target=host", f"targets={targets}", check=False)
    assert result.returncode != 0 and "no database was tuned for it yet" in result.stdout + result.stderr


# ----------------------------------------------------------------------------- the board farm
def test_tuning_through_the_rpc_tracker_on_an_emulated_board(tmp_path, targets):
    require_tvm_aarch64()
    from pipeline.run.tvm_farm import Farm, free_port
    ws = Workspace(tmp_path / "ws")
    add_tiny_model(ws.models, "alpha", seed=1)
    spec_with(ws, "alpha", "tvm:\n  tune:\n    board: {trials: 4, per_task: 1}\n")
    tune = lambda *a: ws.doit("tune", "target=board", f"targets={targets}", *a)

    missing = tune()
    assert missing.returncode != 0
    assert "tuning for this target measures on boards through a TVM RPC tracker, and none was " \
           "given" in missing.stdout + missing.stderr
    nobody = f"127.0.0.1:{free_port()}"
    unknown = tune(f"tracker={nobody}", "key=rk3588")
    assert unknown.returncode != 0
    assert f"cannot reach the TVM RPC tracker at {nobody}" in unknown.stdout + unknown.stderr

    farm = Farm(key="rk3588", log_dir=tmp_path / "farm")
    with farm:
        wrong = tune(f"tracker={farm.tracker}", "key=rk3399")
        assert wrong.returncode != 0
        assert (f"the tracker at {farm.tracker} has no board with key 'rk3399' (it has: rk3588 "
                f"(1 free))") in wrong.stdout + wrong.stderr
        started = time.perf_counter()
        result = tune(f"tracker={farm.tracker}", "key=rk3588", "emulated=1")
        seconds = time.perf_counter() - started
        assert result.returncode == 0, result.stdout + result.stderr
        pids = [p.pid for p in farm.procs]
    for pid in pids:  # the farm is gone, workers included
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()
    assert "(emulated board: not a performance figure)" in result.stdout
    report = json.loads((ws.artifacts / "board/alpha/cpu-aarch64-tvm/tvm_tune/tune.json").read_text())
    assert report["measured_on"] == {"runner": "rpc", "tracker": farm.tracker, "key": "rk3588",
                                     "emulated": True}
    assert 0 < report["trials_spent"] <= 4 and "plumbing only" in report["latencies_note"]
    assert report["identity"]["target"]["mtriple"] == "aarch64-linux-gnu"
    print(f"RPC tuning, 4 trials on an emulated board: {seconds:.0f} s")

    ws.build("target=board", f"targets={targets}")  # no tracker needed: the database is stored
    art = manifest(ws, "board")["models"]["alpha"]["artifacts"]["cpu-aarch64-tvm"]
    assert art["tuning"]["measured_on"]["emulated"] is True and art["tuning"]["trials_spent"] > 0
    assert art["validation"]["status"] == "passed" and art["validation"]["executed"]["emulated"] is True
    assert elf_machine(ws.artifacts / art["path"]) == "aarch64"
    assert "latency" not in json.dumps(art["tuning"])  # emulated timings are not reported


# ----------------------------------------------------------------------------- choice + consumers
def test_compiler_choice_by_measurement_or_spec_and_what_release_runtime_and_bench_do(tmp_path, targets):
    fastest = tmp_path / "targets"
    fastest.mkdir()
    (fastest / "host.yaml").write_text((targets / "host.yaml").read_text().replace(
        "    policy: prefer", "    policy: fastest-on-host"))
    ws = Workspace(tmp_path / "ws")
    add_tiny_model(ws.models, "alpha", seed=1)
    ws.build("target=host", f"targets={fastest}")
    choice = manifest(ws, "host")["models"]["alpha"]["choice"]["cpu"]
    assert choice["policy"] == "fastest-on-host"
    figures = {abi: c["host_proxy"]["p50_ms"] for abi, c in choice["candidates"].items()}
    assert set(figures) == {"cpu-x86_64", "cpu-x86_64-tvm"} and all(v > 0 for v in figures.values())
    assert choice["ships"] == min(figures, key=figures.get)
    assert "interleaved" in choice["reason"] and f"p50 {figures[choice['ships']]:.3f} ms" in choice["reason"]

    spec_with(ws, "alpha", "ship: {host: {cpu: cpu-x86_64-tvm}}\n")
    ws.build("target=host", f"targets={fastest}")
    doc = manifest(ws, "host")
    choice = doc["models"]["alpha"]["choice"]["cpu"]
    assert (choice["ships"], choice["policy"]) == ("cpu-x86_64-tvm", "explicit")
    assert choice["reason"] == "explicit choice in the model spec (ship.host.cpu: cpu-x86_64-tvm)"
    assert doc["target"]["ship"] == [{"name": "cpu", "abis": ["cpu-x86_64", "cpu-x86_64-tvm"],
                                      "policy": "fastest-on-host", "proxies": {}}]

    # release: the shipped choice only, with its TVM runtime requirement
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives import serialization
    key = tmp_path / "k.pem"
    key.write_bytes(Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    rel = ws.doit("release", "target=host", "version=1.0.0", f"key={key}", f"targets={fastest}", "runtime=0")
    assert rel.returncode == 0, rel.stdout + rel.stderr
    bundle = ws.artifacts / "releases/host/1.0.0"
    assert sorted(p.relative_to(bundle).as_posix() for p in (bundle / "models").rglob("*") if p.is_file()) \
        == ["models/alpha/cpu-x86_64-tvm/model.so"]
    release = json.loads((bundle / "release.json").read_text())["models"]["alpha"]
    assert list(release["artifacts"]) == ["cpu-x86_64-tvm"]
    assert release["artifacts"]["cpu-x86_64-tvm"]["requires"]["tvm_runtime"]["version"] == "0.27.0.post1"
    assert release["choice"]["cpu"]["ships"] == "cpu-x86_64-tvm"
    pub = tmp_path / "k.pem.pub"  # verify needs the key pinned: the release key's public half
    private = serialization.load_pem_private_key(key.read_bytes(), None)
    pub.write_bytes(private.public_key().public_bytes(serialization.Encoding.PEM,
                                                      serialization.PublicFormat.SubjectPublicKeyInfo))
    assert ws.doit("verify", f"bundle={bundle}", f"pubkey={pub}").returncode == 0

    # runtime: the shipped choice is what an app gets, and it runs
    from pipeline.app import Runner
    runner = Runner.open(ws.artifacts / "host/manifest.json", "alpha")
    assert runner.choice.abi == "cpu-x86_64-tvm" and "TVM runtime" in runner.choice.device
    assert "passed over cpu-x86_64: not the shipped choice" in runner.choice.explain()
    golden = ws.artifacts / "models/alpha/golden"
    (y,) = runner.run(np.load(golden / "input_0.npy"))
    np.testing.assert_allclose(y, np.load(golden / "output_0.npy"), atol=1e-5)

    # bench: the host TVM artifact is timed next to IREE's, against onnxruntime
    bench = ws.doit("bench", "target=host", "iterations=4", "seconds=0", "warmup=1", f"targets={fastest}")
    assert bench.returncode == 0, bench.stdout + bench.stderr
    rows = json.loads((ws.artifacts / "host/bench.json").read_text())["artifacts"]
    assert [(r["abi"], r["runner"]) for r in rows] == [("cpu-x86_64", "iree-cpu"),
                                                       ("cpu-x86_64-tvm", "tvm-cpu")]


def test_compilers_script_prints_untuned_tuned_iree_and_onnxruntime_side_by_side(tuned, targets):
    ws, _, _, _ = tuned
    ws.build("target=host", f"targets={targets}")
    out = subprocess.run([sys.executable, str(REPO / "bench/compilers.py"), "--model", "alpha",
                          "--artifacts", str(ws.artifacts), "--rounds", "6"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    rows = [l for l in out.stdout.splitlines() if l.endswith("  ok")]
    assert [r.split("  ")[0].split(" (")[0] for r in rows] == ["TVM untuned", "TVM tuned", "IREE",
                                                               "onnxruntime"]
    assert "TVM tuned (" in out.stdout and "budget 8, tuned)" in out.stdout
    assert "6 interleaved rounds" in out.stdout
