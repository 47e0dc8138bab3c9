"""Shared helpers: tiny real ONNX models built with a fixed seed, isolated workspaces, doit runs.

Tools the tests need (qemu-user, the aarch64 IREE runtime) are installed by setup.sh. On a
developer's machine a missing tool skips the test with the reason; under CI=true it fails.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
# Every test workspace's Vulkan validations share one Mesa shader cache (lavapipe compiles each
# kernel once per run of the suite instead of once per workspace; see Layout.shader_cache).
os.environ.setdefault("MODELYARD_SHADER_CACHE", str(Path(os.environ.get("TMPDIR", "/tmp"))
                                                    / f"modelyard-tests-shader-cache-{os.getuid()}"))
# No build of a test workspace searches configs for its models without a pin (a search spends
# minutes per model: stages/search_configs.py); the tests of that search pass search=SECONDS.
os.environ.setdefault("MODELYARD_SEARCH", "0")
# ...and builds the untuned TVM artifacts the default leaves out (compilers/builds.py cannot_win),
# which the TVM tests check on tiny models (tests/unit/test_search_budget.py checks the default).
os.environ.setdefault("MODELYARD_UNTUNED", "1")


# The RK3588's TVM CPU ABI as a target YAML declares it (the tests' own small registries)
TVM_AARCH64_ABI = """  cpu-aarch64-tvm:
    compiler: tvm
    arch: aarch64
    cpu: cortex-a55
    cpu_features: [+neon]
    num_cores: 4
    run: {via: qemu, qemu_cpu: cortex-a76}
"""


def require(condition: bool, reason: str) -> None:
    if condition:
        return
    if IN_CI:
        pytest.fail(f"CI installs every tool, yet: {reason}")
    pytest.skip(reason)  # only off CI: under CI=true a missing tool fails (above)


def require_aarch64() -> None:
    from pipeline.core.tools import aarch64_runtime
    require(shutil.which("qemu-aarch64-static") is not None, "qemu-aarch64-static missing (./setup.sh)")
    require(aarch64_runtime(required=False) is not None, "aarch64 IREE runtime missing (./setup.sh)")


def tiny_onnx(path: Path, seed: int = 0, channels: int = 8, opset: int = 13,
              dynamic_batch: bool = True) -> Path:
    """Conv -> Relu -> GlobalAveragePool -> Flatten -> Gemm; input x f32[N,3,16,16], output y f32[N,10]."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    w = numpy_helper.from_array(rng.standard_normal((channels, 3, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(channels).astype(np.float32), "b")
    gw = numpy_helper.from_array(rng.standard_normal((10, channels)).astype(np.float32), "gw")
    gb = numpy_helper.from_array(rng.standard_normal(10).astype(np.float32), "gb")
    batch = "N" if dynamic_batch else 1
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("GlobalAveragePool", ["r"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "gw", "gb"], ["y"], transB=1),
    ]
    graph = helper.make_graph(
        nodes, f"tiny{seed}",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 10])],
        initializer=[w, b, gw, gb])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(model.SerializeToString(deterministic=True))
    return path


def sha256(path: Path) -> str:
    import hashlib
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def write_spec(folder: Path, source: str, sha: str, inputs: dict | None = None,
               extra: str = "", tolerance: str | None = None) -> Path:
    inputs = inputs or {"x": ([1, 3, 16, 16], "float32", 0)}
    lines = [f"description: test model {folder.name}", "source:", f"  path: {source}",
             f"  sha256: {sha}", "inputs:"]
    for name, (shape, dtype, seed) in inputs.items():
        lines += [f"  {name}:", f"    shape: {list(shape)}", f"    dtype: {dtype}",
                  "    test_data:", f"      random: {{seed: {seed}, low: -1.0, high: 1.0}}"]
    lines += ["tolerance:", tolerance or "  max_abs: 1.0e-4\n  mean_abs: 1.0e-5\n  cosine: 0.99999"]
    text = "\n".join(lines) + "\n" + extra
    (folder / "model.yaml").write_text(text)
    return folder / "model.yaml"


def add_tiny_model(models: Path, name: str, seed: int = 0, **kw) -> Path:
    folder = models / name
    onnx_path = tiny_onnx(folder / "model.onnx", seed=seed, **kw)
    return write_spec(folder, "model.onnx", sha256(onnx_path))


def add_fixture_model(models: Path, fixture: str) -> Path:
    shutil.copytree(FIXTURES / fixture, models / fixture)
    return models / fixture / "model.yaml"


def add_default_model(models: Path, name: str) -> Path:
    shutil.copytree(REPO / "models" / name, models / name)
    return models / name / "model.yaml"


def target_registry(folder: Path, keep) -> Path:
    """The real target files (host, rk3588) with only the ABIs whose YAML body `keep` accepts
    (same flags), their fallback order cut to match, and only the compiler-choice slots whose
    ABIs are all kept."""
    import yaml
    folder.mkdir(parents=True)
    for name in ("rk3588", "host"):
        doc = yaml.safe_load((REPO / "pipeline/targets" / f"{name}.yaml").read_text())
        doc["abis"] = {k: v for k, v in doc["abis"].items() if keep(v)}
        doc["fallback"] = [a for a in doc.get("fallback", doc["abis"]) if a in doc["abis"]]
        doc["ship"] = {k: v for k, v in doc.get("ship", {}).items()
                       if all(a in doc["abis"] for a in v["abis"])}
        if not doc["ship"]:
            del doc["ship"]
        (folder / f"{name}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return folder


class Workspace:
    """models/ and artifacts/ folders of their own, built with the repo's dodo.py through doit."""

    def __init__(self, root: Path):
        self.root = root
        self.models = root / "models"
        self.artifacts = root / "artifacts"
        self.models.mkdir(parents=True, exist_ok=True)

    def doit(self, *args: str, timeout: float = 2400) -> subprocess.CompletedProcess:
        argv = [sys.executable, "-m", "doit", "-f", str(REPO / "dodo.py"), *args,
                f"models={self.models}", f"artifacts={self.artifacts}"]
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=self.root)

    def build(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        result = self.doit("build", *args)
        if check and result.returncode != 0:
            raise AssertionError(f"build failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
        return result


def ran(result: subprocess.CompletedProcess) -> list[str]:
    """Tasks doit executed (lines '.  name'); up-to-date ones print '-- name'."""
    return sorted(line[3:].strip() for line in result.stdout.splitlines() if line.startswith(".  "))


@pytest.fixture
def workspace(tmp_path) -> Workspace:
    return Workspace(tmp_path / "ws")


# Under CI=true a skipped test fails the run: CI installs every tool, so a skip there means a
# test silently stopped checking anything (`require` already fails instead of skipping; this
# catches every other skip, a skipif marker or a pytest.skip deep in a helper).
_SKIPPED: list[str] = []


def pytest_runtest_logreport(report):
    if report.skipped and not hasattr(report, "wasxfail"):
        _SKIPPED.append(report.nodeid)


def pytest_sessionfinish(session, exitstatus):
    if IN_CI and _SKIPPED and exitstatus == 0:
        print(f"\nCI=true: {len(_SKIPPED)} test(s) skipped, which fails the run: "
              + ", ".join(_SKIPPED), file=sys.stderr)
        session.exitstatus = 1
