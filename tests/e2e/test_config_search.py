"""`doit search` end to end on a tiny model: every declared config built, validated and timed
against onnxruntime, the fastest pinned in the model folder; then `doit build` applies the pin
without searching or timing anything. Content is checked, never a timing threshold."""
from __future__ import annotations

import json
import sys

import yaml

from conftest import REPO, Workspace, require_aarch64, sha256, tiny_onnx, write_spec

HOST = """description: test host
abis:
  cpu-x86_64:
    compiler: iree
    backend: llvm-cpu
    arch: x86_64
    cpu: x86-64-v3
    flags: [--iree-opt-data-tiling]
    fallbacks:
      - {drop: [--iree-opt-data-tiling], why: test}
    configs:
      - {name: o3, flags: [--iree-opt-level=O3], why: test}
      - {name: o3-upsample, flags: [--iree-opt-level=O3], rewrites: [conv_transpose_as_depth_to_space],
         why: "the tiny model has no ConvTranspose: this is o3's build"}
      - {name: broken, flags: [--iree-no-such-flag], why: a flag iree-compile does not know}
    run: {via: python}
  cpu-x86_64-tvm:
    compiler: tvm
    arch: x86_64
    cpu: x86-64-v3
    num_cores: 2
    run: {via: python}
ship:
  cpu: {abis: [cpu-x86_64, cpu-x86_64-tvm], policy: prefer}
"""
# An aarch64 ABI that follows the host's pin; its `o3` cannot build: whatever the host ranks
# first, the search pins for it the fastest config that validates there, the default
BOARD = """abis:
  cpu-aarch64:
    compiler: iree
    backend: llvm-cpu
    arch: aarch64
    cpu: cortex-a55
    flags: [--iree-opt-data-tiling]
    configs_from: host/cpu-x86_64
    configs:
      - {name: o3, flags: [--iree-no-such-arm-flag], why: broken here on purpose}
      - {name: o3-upsample, flags: [--iree-no-such-arm-flag], rewrites: [conv_transpose_as_depth_to_space],
         why: test}
      - {name: broken, flags: [--iree-no-such-flag], why: test}
    run: {via: qemu, qemu_cpu: cortex-a76}
"""

# Runs doit like `python -m doit`, and writes the command line of every child process it starts.
SPY = """import subprocess, sys
log = open(sys.argv.pop(1), "a")
real = subprocess.Popen.__init__
def spy(self, *a, **k):
    log.write(repr(a[0] if a else k.get("args")) + "\\n"); log.flush()
    return real(self, *a, **k)
subprocess.Popen.__init__ = spy
subprocess.run(["true"])  # the spy's own proof that it sees children
from doit.doit_cmd import DoitMain
from doit.cmd_base import DodoTaskLoader
sys.exit(DoitMain(DodoTaskLoader()).run(sys.argv[1:]))
"""


def test_search_pins_the_fastest_config_and_the_build_applies_it_without_timing(tmp_path):
    require_aarch64()
    ws = Workspace(tmp_path / "ws")
    targets = tmp_path / "targets"
    targets.mkdir()
    (targets / "host.yaml").write_text(HOST)
    (targets / "board.yaml").write_text(BOARD)
    folder = ws.models / "m"
    tiny_onnx(folder / "model.onnx")
    # a shape variant, and an explicit choice of the model's that the variant must not inherit
    write_spec(folder, "model.onnx", sha256(folder / "model.onnx"),
               extra="shapes:\n  b2:\n    inputs:\n      x: {shape: [2, 3, 16, 16]}\n"
                     "ship:\n  host: {cpu: cpu-x86_64-tvm}\n")
    where = (f"targets={targets}",)

    result = ws.doit("search", "target=host", "rounds=5", "seconds=5", "warmup=1", *where)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert "[search] host/m/cpu-x86_64: candidate 2/4 o3 (--iree-opt-level=O3), 2 left after it" in out
    assert ("[search] host/m/cpu-x86_64: candidate 3/4 o3-upsample is o3 here (its rewrites "
            "conv_transpose_as_depth_to_space change nothing)") in out
    assert "[search] host/m.b2: timing 3 artifact(s) and onnxruntime side by side" in out

    pin_file = folder / "configs" / "host.yaml"
    pin = yaml.safe_load(pin_file.read_text())
    assert (pin["format"], pin["target"], sorted(pin["models"])) == ("modelyard.configs/1", "host",
                                                                    ["m", "m.b2"])
    for name in ("m", "m.b2"):
        entry = pin["models"][name]
        assert entry["searched"]["tools"]["iree-base-compiler"] and entry["searched"]["machine"]
        assert entry["searched"]["window"]["rounds_done"] == 5
        ort = entry["searched"]["onnxruntime"]["p50_ms"]
        x86 = entry["abis"]["cpu-x86_64"]
        timed = {k: c for k, c in x86["candidates"].items() if c["status"] == "timed"}
        assert sorted(timed) == ["default", "o3"]
        for c in timed.values():  # every candidate's figures
            assert c["p50_ms"] > 0 and c["max_abs"] <= 1e-4 and len(c["sha256"]) == 64
            assert abs(c["ratio_to_onnxruntime"] - c["p50_ms"] / ort) < 1e-3
        best = min(timed, key=lambda k: timed[k]["p50_ms"])
        assert (x86["config"], x86["flags"]) == (best, timed[best]["flags"])
        same = x86["candidates"]["o3-upsample"]  # neither built nor timed: o3's very bytes
        assert (same["status"], same["same_as"]) == ("same-as", "o3") and "p50_ms" not in same
        broken = x86["candidates"]["broken"]  # recorded with why, never pinned
        assert (broken["status"], broken["stage"]) == ("failed", "iree_compile")
        assert "--iree-no-such-flag" in broken["why"] and "p50_ms" not in broken
        tvm = entry["abis"]["cpu-x86_64-tvm"]["candidates"]["default"]
        slot = entry["slots"]["cpu"]
        fastest = min(("cpu-x86_64", timed[best]["p50_ms"]), ("cpu-x86_64-tvm", tvm["p50_ms"]),
                      key=lambda t: t[1])[0]
        assert slot["ships"] == fastest
        assert slot["sha256"] == {"cpu-x86_64": timed[best]["sha256"], "cpu-x86_64-tvm": tvm["sha256"]}
        follower = entry["followers"]["board/cpu-aarch64"]
        assert (follower["follows"], follower["config"]) == ("host/cpu-x86_64", "default")
        assert follower["candidates"]["default"]["status"] == "validated"
        if "o3" in follower["candidates"]:  # tried first when it was the faster here, and failed
            assert follower["candidates"]["o3"]["stage"] == "iree_compile"

    # the model's pin names o3 (validated, whatever won); the variant's stays as the search wrote it
    pin["models"]["m"]["abis"]["cpu-x86_64"].update(config="o3", flags=["--iree-opt-level=O3"])
    pin_file.write_text(yaml.safe_dump(pin, sort_keys=False))
    variant_pin = pin["models"]["m.b2"]

    spy_log = tmp_path / "children.txt"
    probe = tmp_path / "spy.py"
    probe.write_text(SPY)
    import subprocess
    build = subprocess.run([sys.executable, str(probe), str(spy_log), "-f", str(REPO / "dodo.py"),
                            "build", "target=host", f"models={ws.models}", f"artifacts={ws.artifacts}",
                            *where], capture_output=True, text=True, timeout=900, cwd=ws.root)
    assert build.returncode == 0, build.stdout + build.stderr
    children = spy_log.read_text()
    assert "pipeline.bench.config_search" not in children and "pipeline.stages.choose" not in children
    assert "['true']" in children  # the spy sees children (the build restored every step)

    art = ws.artifacts / "host"
    compiled = json.loads((art / "m" / "cpu-x86_64" / "iree_compile" / "compile.json").read_text())
    assert compiled["flags"][-2:] == ["--iree-opt-data-tiling", "--iree-opt-level=O3"]
    assert compiled["config"] == {"name": "o3", "flags": ["--iree-opt-level=O3"], "rewrites": [],
                                  "pin": "host", "flags_used": True, "rewritten": [],
                                  "from": "pin"}  # the pin, not this build's search (search_configs)
    variant = json.loads((art / "m.b2" / "cpu-x86_64" / "iree_compile" / "compile.json").read_text())
    won = variant_pin["abis"]["cpu-x86_64"]
    assert variant["config"]["name"] == won["config"]
    assert variant["flags"][-1 - len(won["flags"]):] == ["--iree-opt-data-tiling", *won["flags"]]
    # the build's compile step is the search's candidate step: same key, restored from the store
    record = json.loads((art / "m" / "cpu-x86_64" / "iree_compile" / "step.json").read_text())
    searched = json.loads((art / "m" / "cpu-x86_64" / "search" / "o3" / "iree_compile"
                           / "step.json").read_text())
    assert record["key"] == searched["key"]
    assert not (ws.artifacts / "logs" / "iree_compile" / "host_m_cpu-x86_64.log").exists()

    manifest = json.loads((art / "manifest.json").read_text())["models"]
    assert manifest["m"]["artifacts"]["cpu-x86_64"]["compile"]["config"]["name"] == "o3"
    choice = manifest["m"]["choice"]["cpu"]  # the model's own declaration still wins for it ...
    assert (choice["policy"], choice["ships"]) == ("explicit", "cpu-x86_64-tvm")
    assert f"the search pinned {pin['models']['m']['slots']['cpu']['ships']}" in choice["reason"]
    choice = manifest["m.b2"]["choice"]["cpu"]  # ... the shape variant follows its own figures
    slot = variant_pin["slots"]["cpu"]
    assert (choice["policy"], choice["ships"]) == ("pinned", slot["ships"])
    assert choice["reason"] == f"pinned by doit search: {slot['reason']}"

    # the board builds with what the search validated for it (restored: no qemu run again)
    board = ws.build("target=board", *where)
    compiled = json.loads((ws.artifacts / "board" / "m" / "cpu-aarch64" / "iree_compile"
                           / "compile.json").read_text())
    assert compiled["config"] == {"name": "default", "flags": [], "rewrites": [], "pin": "host",
                                  "flags_used": True, "rewritten": [], "from": "pin"}
    assert not (ws.artifacts / "logs" / "validate" / "board_m_cpu-aarch64.log").exists()

    # a pin naming a config the target does not declare: a clear error, nothing built
    pin["models"]["m"]["abis"]["cpu-x86_64"].update(config="fast")
    pin_file.write_text(yaml.safe_dump(pin, sort_keys=False))
    failed = ws.build(*where, check=False)
    assert failed.returncode != 0
    assert ("configs/host.yaml: models.m.abis.cpu-x86_64.config: 'fast' is not a config of "
            "host/cpu-x86_64 (it declares: default, o3, o3-upsample, broken): search again (doit search "
            "target=host model=m)") in failed.stderr


def test_the_search_leaves_out_an_untuned_tvm_that_is_only_the_fallback(tmp_path):
    """TVM with no tuning, in a slot whose IREE ABI is built, is the slot's fallback (built only
    when IREE fails): `doit search` neither builds nor times it; a model that ships it (`ship:`)
    gets it built and timed."""
    from pipeline.bench.config_search import tvm_rivals
    from pipeline.graph import load_project
    targets = tmp_path / "targets"
    targets.mkdir()
    (targets / "host.yaml").write_text(HOST)
    for name, extra in (("plain", ""), ("ships_tvm", "ship:\n  host: {cpu: cpu-x86_64-tvm}\n")):
        folder = tmp_path / "models" / name
        tiny_onnx(folder / "model.onnx")
        write_spec(folder, "model.onnx", sha256(folder / "model.onnx"), extra=extra)
    # untuned=0: the product's default (the test workspaces build untuned TVM, tests/conftest.py)
    project = load_project(tmp_path / "models", tmp_path / "artifacts", "host", targets, untuned="0")
    (target,) = project.targets
    rivals = {m.name: [(a.name, role) for a, role in tvm_rivals(project, m, target)]
              for m in project.models}
    ((abi, role),) = rivals["plain"]
    assert abi == "cpu-x86_64-tvm" and role["role"] == "fallback" and role["preferred"] == "cpu-x86_64"
    assert "untuned" in role["why"]
    assert rivals["ships_tvm"] == [("cpu-x86_64-tvm", None)]
