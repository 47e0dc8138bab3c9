"""IREE compiler-level fallback (pipeline/stages/iree_compile.py): an ABI's declared `fallbacks:`
are tried in order when iree-compile fails with its own flags; compile.json and the manifest say
which flags the artifact was built with and why; when every attempt fails, the error shows
IREE's own diagnostics, not an IR dump.

The fallback *compiler* (compilers/builds.py fallback_pair, graph/fallback.py): when every
attempt of IREE fails, the slot's TVM build, left out while IREE works (an untuned build that
cannot win; `build: shipped` on rk3588 alike), is built, validated and ships, and the choice says
why, with IREE's stage and error class; `doit build` succeeds. The last test.

The failure is real: IREE 3.13's `iree-preprocessing-pad-linalg-ops{pad-size=0}` breaks the
tiny model's Gemm ("specified type 'tensor<-2147483648x...'"). The i1 data-tiling failure of the
issue did not reproduce on IREE 3.13 with tiny bool-input models (Where, Cast+MatMul, masked
mean pooling as in the romanizer encoder; x86-64-v3 and cortex-a55): that fallback is declared
in the real targets, this flag stands in for it here.
"""
from __future__ import annotations

import json
import subprocess

from conftest import add_tiny_model, ran, require, sha256
from pipeline.compilers.iree_compiler import find_compiler, import_argv
from pipeline.spec.target import load_target

BREAKS = "--iree-preprocessing-pass-pipeline=builtin.module(util.func(iree-preprocessing-pad-linalg-ops{pad-size=0}))"


def registry(folder, flags: list[str], drop: list[str]):
    folder.mkdir(parents=True)
    (folder / "host.yaml").write_text(f"""description: x86_64 host, one IREE ABI
abis:
  cpu-x86_64:
    compiler: iree
    backend: llvm-cpu
    arch: x86_64
    cpu: x86-64-v3
    flags: {json.dumps(flags)}
    fallbacks:
      - drop: {json.dumps(drop)}
        why: "IREE 3.13 pad-linalg-ops with pad-size 0 breaks Gemm"
    run: {{via: python}}
""")
    return folder


def test_a_flag_that_breaks_the_build_falls_back_and_ships(workspace):
    add_tiny_model(workspace.models, "tiny", dynamic_batch=False)
    targets = registry(workspace.root / "targets", ["--iree-opt-data-tiling", BREAKS], [BREAKS])
    workspace.build("target=host", f"targets={targets}")
    compiled = json.loads((workspace.artifacts / "host/tiny/cpu-x86_64/iree_compile/compile.json").read_text())
    assert compiled["attempts"][0]["status"] == "failed"
    assert compiled["attempts"][0]["flags"] == ["--iree-opt-data-tiling", BREAKS]
    assert compiled["attempts"][0]["error"].startswith("model.mlir:")
    assert "error: specified type 'tensor<-2147483648x-2147483648xf32>'" in compiled["attempts"][0]["error"]
    assert compiled["attempts"][1] == {"flags": ["--iree-opt-data-tiling"], "status": "ok"}
    assert compiled["flags"][-1] == "--iree-opt-data-tiling" and BREAKS not in compiled["flags"]
    assert compiled["fallback"]["drop"] == [BREAKS]
    assert compiled["fallback"]["why"] == "IREE 3.13 pad-linalg-ops with pad-size 0 breaks Gemm"
    assert "1 failed attempt(s); the first: model.mlir:" in compiled["fallback"]["after"]
    manifest = json.loads((workspace.artifacts / "host/manifest.json").read_text())
    art = manifest["models"]["tiny"]["artifacts"]["cpu-x86_64"]
    assert art["compile"]["flags"] == compiled["flags"]
    assert art["validation"]["status"] == "passed"
    row = manifest["coverage"]["tiny"]
    assert row["status"] == "shipped" and row["shipped"] == ["cpu-x86_64"]
    assert row["fallbacks"]["cpu-x86_64"]["why"] == compiled["fallback"]["why"]


def test_every_attempt_failing_shows_the_diagnostics_of_iree(workspace):
    add_tiny_model(workspace.models, "tiny", dynamic_batch=False)
    targets = registry(workspace.root / "targets", [BREAKS, "--iree-opt-data-tiling"],
                       ["--iree-opt-data-tiling"])
    result = workspace.build("target=host", f"targets={targets}", check=False)
    assert result.returncode != 0
    err = result.stdout + result.stderr
    assert "stage=iree_compile] iree-compile failed (exit code 1, all 2 attempts):" in err
    assert "model.mlir:12:10: error: specified type 'tensor<-2147483648x-2147483648xf32>'" in err
    assert 'torch.operator "onnx.Gemm"' in err          # the failing op
    assert 'note: see current operation: %22 = "tensor.pad"' in err
    assert "tensor.yield" not in err                     # not the IR dump
    assert "attempt 2 (" + BREAKS + "):" in err
    assert not (workspace.artifacts / "host/manifest.json").exists()
    # the coverage table names the stage, the ABI and IREE's error (the step runs again for it)
    report = workspace.doit("coverage", "target=host", f"targets={targets}")
    assert report.returncode == 0, report.stdout + report.stderr
    out = report.stdout
    assert "coverage of target host: 0 of 1 model(s) ship" in out
    line = next(l for l in out.splitlines() if l.startswith("  tiny "))
    assert line.split() == ["tiny", "stopped", "-", "iree_compile", "(cpu-x86_64)", "-"]
    assert "stopped by iree_compile:host/tiny/cpu-x86_64:" in out
    assert "model.mlir:12:10: error: specified type" in out


def test_a_fallback_that_changes_nothing_is_never_tried(tmp_path):
    """Editing an ABI's flags does not force editing its fallbacks: one that would drop a flag
    the ABI no longer has gives the same flags, and is not tried; one with neither drop nor add
    is a spec error."""
    from pipeline.compilers.iree_compiler import attempts
    (abi,) = load_target("host", registry(tmp_path / "a", [], ["--iree-opt-data-tiling"])).abis
    assert attempts(abi.compile_config()) == [{"flags": [], "fallback": None}]
    empty = registry(tmp_path / "b", ["--iree-opt-data-tiling"], [])
    try:
        load_target("host", empty)
    except Exception as err:
        assert "abis.cpu-x86_64.fallbacks[0]: give drop or add (flags to leave out or add)" in str(err)
    else:
        raise AssertionError("a fallback with neither drop nor add was accepted")


def test_a_twin_is_built_with_the_flags_that_compiled_its_shipped_artifact(workspace):
    """A Vulkan ABI validated through a twin, with a workaround flag that breaks the build (as
    rk3588's pad-fusion does on ppocr_det): the shipped build
    falls back; its twin tries only the flag set that compiled the shipped artifact (no second
    failed attempt) and says so. Vulkan builds run iree-compile in two phases (to the executable
    sources, whose target records give `requires`, then on to the .vmfb): the shipped bytes are
    those of one single iree-compile run with the recorded flags."""
    from pipeline.run import vulkan
    devices, why = vulkan.query_devices(vulkan.driver_env("lavapipe"))
    require(bool(devices), f"lavapipe missing: {why}")
    add_tiny_model(workspace.models, "tiny", dynamic_batch=False)
    folder = workspace.root / "targets"
    folder.mkdir(parents=True)
    (folder / "gpu.yaml").write_text(f"""description: a Mali-like GPU, validated through a twin
abis:
  vk:
    compiler: iree
    backend: vulkan-spirv
    vulkan_target: valhall3
    flags: []
    workarounds:      # as rk3588's pad-fusion: a workaround's flag that breaks some models
      - name: breaks
        flags: {json.dumps([BREAKS])}
        why: stands in for a compiler-bug workaround
    fallbacks:
      - drop: {json.dumps([BREAKS])}
        why: "IREE 3.13 pad-linalg-ops with pad-size 0 breaks Gemm"
    run: {{via: twin, twin: llvmpipe, driver: lavapipe}}
""")
    workspace.build("target=gpu", f"targets={folder}")
    root = workspace.artifacts / "gpu/tiny/vk"
    shipped = json.loads((root / "iree_compile/compile.json").read_text())
    twin = json.loads((root / "twin_compile/compile.json").read_text())
    assert [a["status"] for a in shipped["attempts"]] == ["failed", "ok"]
    assert twin["attempts"] == [{"flags": [], "status": "ok"}] and "shipped" in twin["flags_from"]
    assert twin["fallback"]["drop"] == [BREAKS] and "shipped artifact" in twin["fallback"]["after"]
    assert BREAKS not in shipped["flags"] and BREAKS not in twin["flags"]
    assert twin["workarounds"][0]["flags_used"] is False
    assert shipped["requires"]["vulkan"]["subgroup_size"] == [16]
    assert twin["requires"]["vulkan"]["subgroup_size"] == [8]
    manifest = json.loads((workspace.artifacts / "gpu/manifest.json").read_text())
    assert manifest["models"]["tiny"]["artifacts"]["vk"]["validation"]["status"] == "twin-passed"
    # the same bytes as one iree-compile run of the imported model with the recorded flags
    once = workspace.root / "once"
    once.mkdir()
    static = workspace.artifacts / "models/tiny/static/model.onnx"
    subprocess.run(import_argv(static, once / "model.mlir"), check=True, capture_output=True)
    subprocess.run([find_compiler(), "model.mlir", *shipped["flags"], "-o", "once.vmfb"], cwd=once,
                   check=True, capture_output=True)
    assert sha256(once / "once.vmfb") == sha256(root / "iree_compile/model.vmfb")


def two_compilers(folder, iree_flags: list[str]):
    """The host's CPU slot: IREE preferred, TVM beside it (left out untuned: cannot_win)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "host.yaml").write_text(f"""description: x86_64 host, IREE preferred, TVM its fallback
abis:
  cpu-x86_64:
    compiler: iree
    backend: llvm-cpu
    arch: x86_64
    cpu: x86-64-v3
    flags: {json.dumps(iree_flags)}
    run: {{via: python}}
  cpu-x86_64-tvm:
    compiler: tvm
    arch: x86_64
    cpu: x86-64-v3
    num_cores: 2
    run: {{via: python}}
ship:
  cpu: {{abis: [cpu-x86_64, cpu-x86_64-tvm], policy: prefer}}
""")
    return folder


def coverage_row(workspace, targets) -> list[str]:
    report = workspace.doit("coverage", "target=host", f"targets={targets}")
    assert report.returncode == 0, report.stdout + report.stderr
    return next(l for l in report.stdout.splitlines() if l.startswith("  tiny ")).split()


def test_iree_failing_ships_tvm_its_fallback_and_the_choice_says_why(workspace, monkeypatch):
    """IREE's compile fails on every attempt (BREAKS: IREE 3.13's pad-linalg-ops with pad-size 0
    breaks the tiny model's Gemm, deterministically; no `fallbacks:` flag set to retry with): the
    build still succeeds, shipping TVM's validated artifact; IREE's failure is printed as its
    paragraph and recorded (stage, error class) in the choice and the manifest, and leaves no
    artifact. A rebuild tries IREE again and does not rebuild TVM. Once IREE builds again (the
    flag gone), IREE ships and TVM's artifact is removed (nothing stale)."""
    add_tiny_model(workspace.models, "tiny", dynamic_batch=False)
    targets = two_compilers(workspace.root / "targets", [BREAKS])
    args = ("target=host", f"targets={targets}", "untuned=0")  # conftest sets untuned=1
    monkeypatch.setenv("MODELYARD_UNTUNED", "0")  # ... for `doit coverage` too
    result = workspace.build(*args)
    err = result.stdout + result.stderr
    assert "[model=tiny target=host/cpu-x86_64 stage=iree_compile] iree-compile failed" in err
    assert "error: specified type 'tensor<-2147483648x-2147483648xf32>'" in err
    assert "fallback: cpu-x86_64-tvm is built and validated instead" in err
    assert ("building cpu-x86_64-tvm, the fallback of cpu-x86_64, which failed (compile-error "
            "in iree_compile)") in err
    root = workspace.artifacts / "host/tiny"
    assert not (root / "cpu-x86_64/iree_compile").exists()  # a failed step leaves no artifact
    assert not (root / "cpu-x86_64/validate").exists()
    assert (root / "cpu-x86_64-tvm/tvm_compile/model.so").is_file()
    manifest = json.loads((workspace.artifacts / "host/manifest.json").read_text())
    entry = manifest["models"]["tiny"]
    assert sorted(entry["artifacts"]) == ["cpu-x86_64-tvm"]
    assert entry["artifacts"]["cpu-x86_64-tvm"]["validation"]["status"] == "passed"
    failed = entry["failed"]["cpu-x86_64"]
    assert (failed["stage"], failed["error_class"]) == ("iree_compile", "compile-error")
    assert "specified type 'tensor<-2147483648x" in failed["what"]
    choice = entry["choice"]["cpu"]
    assert (choice["ships"], choice["policy"]) == ("cpu-x86_64-tvm", "fallback")
    assert choice["reason"].startswith("fallback: cpu-x86_64 failed (compile-error in "
                                       "iree_compile: iree-compile failed (exit code 1)")
    assert choice["reason"].endswith("cpu-x86_64-tvm, the slot's fallback, was built and "
                                     "validated and ships")
    assert choice["failed"]["cpu-x86_64"] == {k: failed[k] for k in ("stage", "error_class", "what")}
    assert sorted(choice["candidates"]) == ["cpu-x86_64-tvm"]
    assert manifest["coverage"]["tiny"]["shipped"] == ["cpu-x86_64-tvm"]
    assert coverage_row(workspace, targets)[:4] == ["tiny", "shipped", "cpu-x86_64-tvm", "-"]

    again = workspace.build(*args)  # IREE is tried again (a failure is never cached); TVM is not rebuilt
    assert "stage=iree_compile] iree-compile failed" in again.stdout + again.stderr
    assert "iree_compile:host/tiny/cpu-x86_64" in ran(again)
    assert "tvm_compile:host/tiny/cpu-x86_64-tvm" not in ran(again)
    same = json.loads((workspace.artifacts / "host/manifest.json").read_text())["models"]["tiny"]
    assert (same["choice"], same["failed"]) == (entry["choice"], entry["failed"])
    assert same["artifacts"]["cpu-x86_64-tvm"]["sha256"] == entry["artifacts"]["cpu-x86_64-tvm"]["sha256"]

    two_compilers(targets, [])  # IREE builds again: it ships, TVM is not needed
    fixed = workspace.build(*args)
    assert "fallback" not in fixed.stdout + fixed.stderr
    assert not (root / "cpu-x86_64-tvm/tvm_compile").exists()
    entry = json.loads((workspace.artifacts / "host/manifest.json").read_text())["models"]["tiny"]
    assert sorted(entry["artifacts"]) == ["cpu-x86_64"] and "failed" not in entry
    assert "built when cpu-x86_64 fails" in entry["skipped"]["cpu-x86_64-tvm"]
    choice = entry["choice"]["cpu"]
    assert (choice["ships"], choice["policy"]) == ("cpu-x86_64", "prefer")
    assert choice["reason"].startswith("the only candidate (cpu-x86_64-tvm skipped: not built: "
                                       "an untuned TVM build cannot win")
    assert not (root / "cpu-x86_64-tvm/validate").exists()
    attempt = json.loads((root / "cpu-x86_64-tvm/tvm_compile.attempt.json").read_text())
    assert attempt == {"status": "not-needed", "because": "cpu-x86_64 compiled and validated"}
    quiet = workspace.build(*args)  # the gated tasks are up to date: a no-op build runs nothing
    assert ran(quiet) == [], quiet.stdout
    assert coverage_row(workspace, targets)[:4] == ["tiny", "shipped", "cpu-x86_64", "-"]


# bf16 inputs to every contraction (the tiny model's Conv and Gemm): IREE builds and runs it, and
# its outputs miss the model's fp32 tolerance (max_abs 1e-4) by orders of magnitude
BF16 = ["--iree-global-opt-demote-contraction-inputs-type=bf16",
        "--iree-global-opt-demote-contraction-inputs-operations=all"]


def test_iree_outputs_beyond_the_tolerance_ship_tvm_its_fallback(workspace):
    """The preferred compiles but fails its validation (wrong outputs): the fallback is built and
    validated and ships; the error class says the outputs were wrong; no validation of IREE's
    artifact is left behind."""
    add_tiny_model(workspace.models, "tiny", dynamic_batch=False)
    targets = two_compilers(workspace.root / "targets", BF16)
    result = workspace.build("target=host", f"targets={targets}", "untuned=0")
    err = result.stdout + result.stderr
    assert "[model=tiny target=host/cpu-x86_64 stage=validate] outputs differ from golden" in err
    root = workspace.artifacts / "host/tiny"
    assert not (root / "cpu-x86_64/validate").exists()
    entry = json.loads((workspace.artifacts / "host/manifest.json").read_text())["models"]["tiny"]
    assert sorted(entry["artifacts"]) == ["cpu-x86_64-tvm"]
    failed = entry["failed"]["cpu-x86_64"]
    assert (failed["stage"], failed["error_class"]) == ("validate", "wrong-outputs")
    choice = entry["choice"]["cpu"]
    assert (choice["ships"], choice["policy"]) == ("cpu-x86_64-tvm", "fallback")
    assert choice["reason"].startswith("fallback: cpu-x86_64 failed (wrong-outputs in validate: "
                                       "outputs differ from golden")
