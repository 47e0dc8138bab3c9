"""artifacts/<target> read-only while a build validates (issue 38): each step that cannot write
says so in one line -- which file, why (read-only, permission denied), what to do -- with no
traceback and no blame on the artifact, the build exits non-zero, and the folder is as it was."""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys

from conftest import REPO, Workspace, add_tiny_model, require, target_registry


def _snapshot(folder) -> dict:
    return {str(p.relative_to(folder)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _build_read_only(ws: Workspace, targets, folder) -> subprocess.CompletedProcess:
    """`doit build target=host` with `folder` read-only: a read-only bind mount in a mount
    namespace of its own as root (chmod does not stop root), chmod a-w otherwise."""
    doit = [sys.executable, "-m", "doit", "-f", str(REPO / "dodo.py"), "build", "target=host",
            f"targets={targets}", f"models={ws.models}", f"artifacts={ws.artifacts}"]
    if os.geteuid() != 0:
        for p in [folder, *folder.rglob("*")]:
            p.chmod(p.stat().st_mode & ~0o222)
        try:
            return subprocess.run(doit, capture_output=True, text=True, cwd=ws.root, timeout=900)
        finally:
            for p in [folder, *folder.rglob("*")]:
                p.chmod(p.stat().st_mode | 0o200)
    require(shutil.which("unshare") is not None, "unshare (util-linux) is missing")
    script = (f'mount --bind "{folder}" "{folder}" && mount -o remount,bind,ro "{folder}" '
              f'|| exit 99; exec "$@"')
    result = subprocess.run(["unshare", "-m", "sh", "-c", script, "sh", *doit], capture_output=True,
                            text=True, cwd=ws.root, timeout=900)
    require(result.returncode != 99, f"cannot mount read-only here: {result.stderr.strip()}")
    return result


def test_a_read_only_target_folder_is_named_not_blamed_on_the_artifact(tmp_path):
    ws = Workspace(tmp_path / "ws")
    spec = add_tiny_model(ws.models, "tiny")
    targets = target_registry(tmp_path / "targets", lambda b: b.get("backend") == "llvm-cpu"
                              and b.get("compiler") == "iree")
    ws.build("target=host", f"targets={targets}")
    # a new tolerance: validation (and what follows it) must run again, into artifacts/host
    spec.write_text(spec.read_text().replace("max_abs: 1.0e-4", "max_abs: 2.0e-4"))
    host = ws.artifacts / "host"
    before = _snapshot(host)
    result = _build_read_only(ws, targets, host)
    out = result.stdout + result.stderr
    assert result.returncode != 0, out
    assert "Traceback" not in out and "INCOMPATIBLE" not in out, out
    lines = [l for l in out.splitlines() if "cannot write " in l]
    assert lines, out
    for line in lines:
        assert f"cannot write {host}/" in line, line
        assert ("read-only file system" in line or "permission denied" in line), line
        assert "the step's outputs were not published" in line and "stage=" in line, line
    assert "next: make " in out and "writable for this user" in out, out
    assert _snapshot(host) == before
    # writable again: the same build goes through
    ws.build("target=host", f"targets={targets}")
