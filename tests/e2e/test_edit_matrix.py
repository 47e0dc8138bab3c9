"""The edit matrix, built for real (issue 41 item 1): a one-line edit of one backend in a copy of
the package re-runs, in `doit build`, the steps of that backend only, and the artifacts come out
byte-identical. The digest-level matrix over every stage, backend and target is
tests/unit/test_codehash.py; this is its check through doit on one small build (a tiny model, the
host's IREE CPU ABI)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import REPO, Workspace, add_tiny_model, ran, sha256, target_registry


def clone(root: Path) -> Path:
    """dodo.py and the package copied to root (what the package reads linked): a checkout to edit."""
    root.mkdir()
    shutil.copy(REPO / "dodo.py", root / "dodo.py")
    for name in ("third_party", "runtime", "docs", "models", ".tools", "pyproject.toml"):
        if (REPO / name).exists():
            (root / name).symlink_to(REPO / name)
    shutil.copytree(REPO / "pipeline", root / "pipeline", ignore=shutil.ignore_patterns("__pycache__"))
    return root


def artifacts(ws: Workspace) -> dict[str, str]:
    return {p.relative_to(ws.artifacts).as_posix(): sha256(p) for p in sorted(ws.artifacts.rglob("*"))
            if p.is_file() and p.suffix in (".vmfb", ".onnx", ".npy")}


def test_editing_a_backend_reruns_its_steps_only_and_the_bytes_stay(tmp_path):
    targets = target_registry(tmp_path / "targets", keep=lambda abi: abi.get("arch") == "x86_64"
                              and abi.get("compiler") == "iree")
    ws = Workspace(tmp_path / "ws")
    add_tiny_model(ws.models, "alpha", seed=5)
    root = clone(tmp_path / "checkout")
    env = {**os.environ, "PYTHONPATH": str(root)}

    def build() -> list[str]:
        argv = [sys.executable, "-m", "doit", "-f", str(root / "dodo.py"), "build", "target=host",
                f"targets={targets}", "search=0", f"models={ws.models}", f"artifacts={ws.artifacts}"]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=1200, cwd=ws.root, env=env)
        assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
        return ran(result)

    def edit(rel: str) -> None:
        path = root / "pipeline" / rel
        path.write_text(path.read_text() + "\nEDIT_MATRIX = 1\n")

    first = build()
    assert "iree_compile:host/alpha/cpu-x86_64" in first and "validate:host/alpha/cpu-x86_64" in first
    made = artifacts(ws)
    assert any(k.endswith(".vmfb") for k in made)
    assert build() == []

    edit("compilers/rknn_backend.py")        # a backend the host does not build: nothing runs
    edit("run/rknn_run.py")
    assert build() == []

    edit("compilers/tvm_backend.py")         # TVM: only the steps that import it (coverage runs
    edit("run/tvm_run.py")                   # TVM's importer; choose and manifest import coverage)
    rerun = build()
    assert not any(t.startswith(("iree_compile:", "validate:", "import:", "golden:", "static:"))
                   for t in rerun), rerun
    assert "coverage:host/alpha" in rerun, rerun

    edit("run/iree_run.py")                  # IREE's runner: its compile and validation re-run
    rerun = build()                          # (and coverage, which confirms its verdicts with IREE)
    assert "validate:host/alpha/cpu-x86_64" in rerun and "iree_compile:host/alpha/cpu-x86_64" in rerun
    assert not any(t.startswith(("import:", "golden:", "static:")) for t in rerun), rerun
    assert artifacts(ws) == made             # keys changed, the bytes did not

    edit("stages/validate.py")               # a stage: its own steps
    rerun = build()
    assert [t for t in rerun if not t.startswith(("choose:", "manifest:"))] == \
        ["validate:host/alpha/cpu-x86_64"], rerun
    assert artifacts(ws) == made
