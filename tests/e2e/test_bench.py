"""`doit bench` and its report: structure and content, never timing thresholds (timings flake).

The pure parts (statistics, the window, which artifacts run, the regression check) are tested
directly; the rest through the repo's dodo.py on tiny models, with few iterations.
"""
from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, TVM_AARCH64_ABI, Workspace, add_tiny_model, ran, require, require_aarch64
from pipeline.bench import measure as bench
from pipeline.core.errors import PipelineError

FEW = ("iterations=6", "seconds=0", "warmup=1")


# ----------------------------------------------------------------------------- pure parts
def test_stats_orders_percentiles_and_flags_noise():
    s = bench.stats([5_000_000, 1_000_000, 3_000_000, 2_000_000, 4_000_000])
    assert (s["n"], s["min_ms"], s["p50_ms"], s["max_ms"], s["mean_ms"]) == (5, 1.0, 3.0, 5.0, 3.0)
    assert s["min_ms"] <= s["p50_ms"] <= s["p90_ms"] <= s["p99_ms"] <= s["max_ms"]
    assert s["p90_ms"] == pytest.approx(4.6) and s["p99_ms"] == pytest.approx(4.96)
    assert s["stddev_ms"] == pytest.approx(np.std([1, 2, 3, 4, 5], ddof=1), abs=1e-6)
    assert s["cv"] == pytest.approx(s["stddev_ms"] / 3.0, abs=1e-6) and s["noisy"] is True
    flat = bench.stats([2_000_000] * 4)
    assert (flat["stddev_ms"], flat["cv"], flat["noisy"]) == (0.0, 0.0, False)
    assert bench.paired_ratio_p50([2, 4, 9], [1, 1, 3]) == 3.0


def test_measure_interleaves_alternately_and_ends_the_window_by_time():
    now = [0]
    log = []

    def artifact(inputs):
        log.append("a")
        now[0] += 300_000_000
        return {"copy_in": 1, "invoke": 20, "read_back": 3}, ["out-a"]

    def baseline(inputs):
        log.append("o")
        now[0] += 300_000_000
        return {"total": 7}, ["out-o"]

    m = bench.measure(artifact, baseline, [], bench.Options(warmup=1, iterations=0, seconds=1.0),
                      clock=lambda: now[0])
    assert log[:2] == ["a", "o"]          # warm-up
    assert log[2:] == ["a", "o", "o", "a"]  # the window: who goes first alternates
    assert (m["iterations"], m["ended_by"]) == (2, "seconds")
    assert m["samples_ns"]["total"] == [24, 24] and m["samples_ns"]["onnxruntime"] == [7, 7]
    assert m["samples_ns"]["invoke"] == [20, 20]
    m = bench.measure(artifact, baseline, [], bench.Options(warmup=0, iterations=3, seconds=0))
    assert (m["iterations"], m["ended_by"]) == (3, "iterations")


def _artifact(emulated: bool, device: str = "local-task", status: str = "passed",
              backend: str = "llvm-cpu") -> dict:
    run = ({"via": "vulkan", "driver": "lavapipe"} if backend == "vulkan-spirv"
           else {"via": "python" if not emulated else "qemu"})
    return {"sha256": "0" * 64, "size": 1, "path": "x", "abi": {"backend": backend, "run": run},
            "validation": {"status": status, "executed": {"emulated": emulated, "device": device}}}


def test_plan_times_native_artifacts_only_and_takes_new_runners():
    manifest = {"models": {"m": {"artifacts": {
        "cpu-aarch64": _artifact(True), "cpu-x86_64": _artifact(False),
        "gpu-vulkan": _artifact(False, "llvmpipe", backend="vulkan-spirv"),
        "gpu-mali": _artifact(False, "llvmpipe", "twin-passed", backend="vulkan-spirv")}}}}
    items = {i.abi: i for i in bench.plan(manifest)}
    assert items["cpu-x86_64"].runner is bench.IreeCpuRunner
    assert (items["cpu-aarch64"].runner, items["cpu-aarch64"].reason) == (None, "emulated")
    assert items["gpu-vulkan"].runner is bench.IreeVulkanRunner
    assert items["gpu-mali"].runner is None and "validated through a twin" in items["gpu-mali"].reason
    # without a Vulkan runner, Vulkan artifacts are listed with the reason
    runners = {k: v for k, v in bench.RUNNERS.items() if k != "vulkan"}
    items = {i.abi: i for i in bench.plan(manifest, runners)}
    assert items["gpu-vulkan"].reason == "no Vulkan runner for 'lavapipe' here"


def test_regressions_compare_p50_with_the_threshold():
    def row(model, p50, sha="a"):
        return {"model": model, "abi": "cpu", "p50_ms": p50, "ratio_to_onnxruntime": 2.0,
                "sha256": sha}
    baseline = {"artifacts": [row("slow", 10.0), row("same", 10.0), row("gone", 1.0)],
                "started_utc": "then"}
    reg = bench.regressions([row("slow", 11.5, "b"), row("same", 10.9), row("new", 1.0)],
                            baseline, threshold_pct=10)
    rows = {r["model"]: r for r in reg["rows"]}
    assert rows["slow"]["status"] == "regressed" and rows["slow"]["change_pct"] == 15.0
    assert rows["slow"]["same_artifact"] is False
    assert rows["same"]["status"] == "ok" and rows["same"]["same_artifact"] is True
    assert rows["new"]["status"] == "new (not in baseline)"
    assert reg["regressed"] == ["slow/cpu"] and reg["missing_now"] == [{"model": "gone", "abi": "cpu"}]


def test_options_from_doit_vars_reject_bad_values_by_name():
    opts = bench.Options.from_vars({"iterations": "50", "seconds": "2.5", "threshold": "15%",
                                    "gate": "1", "baseline": "b.json", "warmup": None})
    assert (opts.iterations, opts.seconds, opts.threshold, opts.gate, opts.warmup) == (
        50, 2.5, 15.0, True, bench.Options().warmup)
    with pytest.raises(PipelineError, match="bench option iterations='many' is not valid"):
        bench.Options.from_vars({"iterations": "many"})
    with pytest.raises(PipelineError, match="leave the window unbounded"):
        bench.Options.from_vars({"iterations": "0", "seconds": "0"})
    with pytest.raises(PipelineError, match=r"gate=1 needs baseline=PATH"):
        bench.Options.from_vars({"gate": "1"})


# ----------------------------------------------------------------------------- through doit
@pytest.fixture(scope="module")
def benched(tmp_path_factory):
    """Two tiny models built for the host and benched once with a few iterations."""
    ws = Workspace(tmp_path_factory.mktemp("bench") / "ws")
    add_tiny_model(ws.models, "alpha", seed=1)
    add_tiny_model(ws.models, "beta", seed=2, channels=16)
    ws.build("target=host")
    result = ws.doit("bench", "target=host", *FEW)
    assert result.returncode == 0, result.stdout + result.stderr
    return ws, result


def _json(path):
    return json.loads(path.read_text())


def test_bench_times_each_artifact_against_onnxruntime_in_one_run(benched):
    ws, result = benched
    manifest = _json(ws.artifacts / "host/manifest.json")
    summary = _json(ws.artifacts / "host/bench.json")
    cpu_model = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
                     if l.startswith("model name"))
    assert summary["schema"] == bench.SUMMARY_SCHEMA and summary["target"] == "host"
    assert summary["machine"]["cpu_model"] == cpu_model
    assert summary["not_measured"] == [] and summary["regression"] is None
    assert [(r["model"], r["abi"]) for r in summary["artifacts"]] == [
        ("alpha", "cpu-x86_64"), ("alpha", "cpu-x86_64-tvm"), ("beta", "cpu-x86_64"),
        ("beta", "cpu-x86_64-tvm")]  # both compilers' host artifacts
    for row in summary["artifacts"]:
        art = manifest["models"][row["model"]]["artifacts"][row["abi"]]
        path = ws.artifacts / f"host/{row['model']}/{row['abi']}/bench/{art['sha256']}.json"
        assert row["result"] == path.relative_to(ws.artifacts).as_posix()
        doc = _json(path)
        assert doc["artifact"] == {k: art[k] for k in ("path", "sha256", "size")}
        assert doc["static_model"]["sha256"] == manifest["models"][row["model"]]["static_model"]["sha256"]
        assert doc["window"] == {"iterations": 6, "ended_by": "iterations",
                                 "seconds": doc["window"]["seconds"]}
        samples = doc["samples_ns"]
        assert {k: len(v) for k, v in samples.items()} == {k: 6 for k in (*bench.PHASES, "total",
                                                                          "onnxruntime")}
        for k in range(6):  # the boundary split adds up to the artifact's time
            assert samples["total"][k] == sum(samples[p][k] for p in bench.PHASES)
        for name, st in doc["stats"].items():
            assert st["n"] == 6
            assert st["min_ms"] <= st["p50_ms"] <= st["p90_ms"] <= st["p99_ms"] <= st["max_ms"]
            assert st["p50_ms"] == pytest.approx(np.median(samples[name]) / 1e6, abs=1e-6)
            assert st["noisy"] == (st["cv"] > bench.NOISY_CV)
        # the ratio comes from this run's own samples
        p50 = lambda key: np.percentile(np.asarray(samples[key]) / 1e6, 50)
        assert doc["ratio_to_onnxruntime"] == pytest.approx(p50("total") / p50("onnxruntime"),
                                                            rel=1e-5)
        assert row["ratio_to_onnxruntime"] == doc["ratio_to_onnxruntime"]
        assert row["p50_ms"] == doc["stats"]["total"]["p50_ms"]
        # same thread count on both sides, recorded
        assert doc["runner"]["threads"] == doc["baseline"]["threads"] == summary["threads"]
        assert doc["runner"]["driver"] == ("cpu" if row["abi"].endswith("-tvm") else "local-task")
        assert doc["baseline"]["allow_spinning"] is False
        assert doc["outputs_check"]["artifact"]["passed"] is True
        assert row["validation"]["outputs"][0]["max_abs"] == art["validation"]["outputs"][0]["max_abs"]
    out = result.stdout
    assert "p50 ms" in out and "ort p50 ms" in out and "ratio = artifact p50 / onnxruntime p50" in out
    for model in ("alpha", "beta"):
        assert any(line.startswith(model + " ") and line.endswith("x") for line in out.splitlines())
    assert f"wrote {ws.artifacts / 'host/report.html'}" in out


def test_bench_is_not_part_of_the_build_and_measures_again_each_time(benched):
    ws, _ = benched
    assert ran(ws.build("target=host")) == []
    again = ws.doit("bench", "target=host", "iterations=2", "seconds=0", "warmup=0")
    assert again.returncode == 0, again.stderr
    assert ran(again) == ["bench"]  # the build is up to date; the measurement reran
    rows = _json(ws.artifacts / "host/bench.json")["artifacts"]
    assert [r["n"] for r in rows] == [2, 2, 2, 2]


def test_regression_against_a_baseline_is_flagged_and_gates(benched, tmp_path):
    ws, _ = benched
    previous = _json(ws.artifacts / "host/bench.json")
    baseline = json.loads(json.dumps(previous))
    # alpha "was" 10,000x faster and beta 10,000x slower: no load on this machine can swing a
    # median that far, so the verdicts below do not depend on how busy it is now
    for row in baseline["artifacts"]:
        row["p50_ms"] = row["p50_ms"] / 1e4 if row["model"] == "alpha" else row["p50_ms"] * 1e4
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps(baseline))

    flagged = ws.doit("bench", "target=host", *FEW, f"baseline={path}")
    assert flagged.returncode == 0, flagged.stderr
    reg = _json(ws.artifacts / "host/bench.json")["regression"]
    assert reg["baseline"] == str(path) and reg["threshold_pct"] == 10
    assert reg["regressed"] == ["alpha/cpu-x86_64", "alpha/cpu-x86_64-tvm"]
    status = {r["model"]: r for r in reg["rows"]}
    assert status["beta"]["status"] == "ok" and status["beta"]["same_artifact"] is True
    assert "regressions (p50 worse by more than 10%): alpha/cpu-x86_64" in flagged.stdout
    assert "Regression check" in (ws.artifacts / "host/report.html").read_text()

    gated = ws.doit("bench", "target=host", *FEW, f"baseline={path}", "gate=1")
    assert gated.returncode != 0
    assert "gate: p50 regressed by more than 10%" in gated.stdout + gated.stderr
    assert "alpha/cpu-x86_64" in gated.stdout + gated.stderr
    assert "Traceback" not in gated.stdout + gated.stderr

    lenient = ws.doit("bench", "target=host", *FEW, f"baseline={path}", "gate=1",
                      "threshold=1000000000")  # alpha: about +1,000,000 %
    assert lenient.returncode == 0, lenient.stdout + lenient.stderr


def test_bad_input_gives_clear_errors(benched, tmp_path):
    ws, _ = benched
    cases = {
        ("bench",): "doit bench needs target=NAME (known targets: host, rk3588, rpi5)",
        ("bench", "target=host", f"baseline={tmp_path / 'none.json'}"):
            f"baseline file not found: {tmp_path / 'none.json'}",
        ("bench", "target=host", "iterations=many"): "bench option iterations='many' is not valid",
        ("bench", "target=host", "gate=1"): "gate=1 needs baseline=PATH",
    }
    corrupt = tmp_path / "corrupt.json"
    corrupt.write_text("{not json")
    cases[("bench", "target=host", f"baseline={corrupt}")] = f"{corrupt} is not readable JSON"
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"schema": bench.SUMMARY_SCHEMA, "target": "rk3588",
                                 "artifacts": []}))
    cases[("bench", "target=host", f"baseline={other}")] = "is for target 'rk3588', not 'host'"
    for args, message in cases.items():
        result = ws.doit(*args)
        out = result.stdout + result.stderr
        assert result.returncode != 0 and message in out, (args, out)
        assert "Traceback" not in out
    unknown = ws.doit("bench", "target=rk3399")
    assert unknown.returncode != 0
    assert "unknown target 'rk3399'; known targets: host, rk3588, rpi5" in unknown.stderr


CPU_AARCH64 = """  cpu-aarch64:
    compiler: iree
    backend: llvm-cpu
    arch: aarch64
    cpu: cortex-a55
    run: {via: qemu, qemu_cpu: cortex-a76}
""" + TVM_AARCH64_ABI
MIXED = """description: this host, the board's CPU and GPU
abis:
  cpu-x86_64:
    compiler: iree
    backend: llvm-cpu
    arch: x86_64
    cpu: x86-64-v3
    run: {via: python}
  cpu-x86_64-tvm:
    compiler: tvm
    arch: x86_64
    cpu: x86-64-v3
    cpu_features: []
    num_cores: 2
    run: {via: python}
  vulkan-mali-g610:
    compiler: iree
    backend: vulkan-spirv
    vulkan_target: valhall3
    run: {via: twin, twin: llvmpipe, driver: lavapipe}
  vulkan-baseline:
    compiler: iree
    backend: vulkan-spirv
    vulkan_target: vp_android_baseline_2022
    run: {via: vulkan, driver: lavapipe}
""" + CPU_AARCH64


def test_emulated_and_twin_artifacts_are_listed_never_timed(tmp_path):
    require_aarch64()
    targets = tmp_path / "targets"
    targets.mkdir()
    (targets / "mixed.yaml").write_text(MIXED)
    (targets / "board.yaml").write_text("description: the board's CPU only\nabis:\n" + CPU_AARCH64)
    ws = Workspace(tmp_path / "ws")
    add_tiny_model(ws.models, "alpha", seed=1)
    for target in ("mixed", "board"):
        ws.build(f"target={target}", f"targets={targets}")

    result = ws.doit("bench", "target=mixed", f"targets={targets}", *FEW)
    assert result.returncode == 0, result.stdout + result.stderr
    summary = _json(ws.artifacts / "mixed/bench.json")
    timed = {r["abi"]: r for r in summary["artifacts"]}
    assert sorted(timed) == ["cpu-x86_64", "cpu-x86_64-tvm", "vulkan-baseline"]  # IREE's, TVM's
    assert timed["vulkan-baseline"]["ratio_to_onnxruntime"] > 0
    skipped = {r["abi"]: r for r in summary["not_measured"]}
    assert sorted(skipped) == ["cpu-aarch64", "cpu-aarch64-tvm", "vulkan-mali-g610"]
    for name in ("cpu-aarch64", "cpu-aarch64-tvm"):  # IREE's and TVM's
        assert (skipped[name]["model"], skipped[name]["reason"]) == ("alpha", "emulated")
        assert skipped[name]["executed"]["emulated"] is True
    assert "validated through a twin" in skipped["vulkan-mali-g610"]["reason"]
    assert not (ws.artifacts / "mixed/alpha/cpu-aarch64/bench").exists()
    assert "not measured here: alpha/cpu-aarch64: emulated" in result.stdout
    assert "not measured here: emulated" in (ws.artifacts / "mixed/report.html").read_text()
    vk = _json(next((ws.artifacts / "mixed/alpha/vulkan-baseline/bench").glob("*.json")))
    assert vk["runner"]["kind"] == "iree-vulkan" and "llvmpipe" in vk["runner"]["device"]

    board_only = ws.doit("bench", "target=board", f"targets={targets}", *FEW)
    out = board_only.stdout + board_only.stderr
    assert board_only.returncode != 0 and "Traceback" not in out
    assert "nothing in board/manifest.json can be timed on this machine" in out
    assert "alpha/cpu-aarch64 (emulated)" in out
    assert not (ws.artifacts / "board/bench.json").exists()


def test_report_is_self_contained_and_renders_in_headless_chromium(benched, tmp_path):
    from headless import chromium, render
    require(chromium() is not None, "chromium missing (./setup.sh installs it)")
    from PIL import Image

    ws, _ = benched
    report = ws.artifacts / "host/report.html"
    html = report.read_text()
    assert "http://" not in html and "https://" not in html and "<script" not in html
    for text in ("alpha", "beta", "fp32", "p99 ms", "ratio", "copy in", "Size vs latency"):
        assert text in html
    timed = json.loads((ws.artifacts / "host/bench.json").read_text())["artifacts"]
    assert len(timed) == 4  # alpha and beta, each IREE's and TVM's host build
    assert html.count("<svg") == 2 * len(timed) + 1  # split + distribution per artifact, one scatter

    # the detector itself: a page with a console error and a failed load must be caught
    bad = tmp_path / "bad.html"
    bad.write_text('<html><body>x<script>console.error("boom")</script><img src="gone.png">'
                   "</body></html>")
    caught = render(bad)
    assert any("boom" in e for e in caught.errors) and any("gone.png" in e for e in caught.errors)

    page = render(report)
    assert page.errors == []
    assert page.requests == [report.resolve().as_uri()]  # nothing else was fetched
    assert "Bench report: target host" in page.text and "not measured" not in page.text
    shot = Image.open(io.BytesIO(page.png)).convert("RGB")
    width, height = shot.size
    assert width >= 1000 and height > 900
    colours = shot.getcolors(1 << 24)
    assert len(colours) > 50  # text, bars, dots: not a blank page
    white = next((count for count, rgb in colours if rgb == (255, 255, 255)), 0)
    assert white < 0.98 * width * height


def test_overhead_script_reports_noop_cold_and_the_edited_models_chain(tmp_path):
    import subprocess
    import sys
    models = tmp_path / "models"
    add_tiny_model(models, "alpha", seed=1)
    add_tiny_model(models, "beta", seed=2)
    result = subprocess.run([sys.executable, str(REPO / "bench/overhead.py"), "--runs", "2",
                             "--models", str(models), "--model", "beta"],
                            capture_output=True, text=True, timeout=600)
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert "bare `doit --version`" in out and "no-op `doit build`" in out
    assert "cold build (19 tasks)" in out
    assert "one-model edit (beta: input x [1, 3, 16, 16] -> [2, 3, 16, 16])" in out
    chain = [l.strip() for l in out.splitlines() if l.startswith("    ")]
    assert chain == ["golden:beta", "static:beta", "coverage:host/beta",
                     "iree_compile:host/beta/cpu-x86_64", "tvm_compile:host/beta/cpu-x86_64-tvm",
                     "validate:host/beta/cpu-x86_64", "validate:host/beta/cpu-x86_64-tvm",
                     "choose:host/beta", "manifest:host"]
    assert "= beta's chain as the build graph predicts it: equal" in out
    tmp = next(l for l in out.splitlines() if "temporary folder" in l).rsplit(" ", 1)[1]
    assert not Path(tmp).exists()  # cleaned up; the user's artifacts/ never touched
