"""The no-op build's fast path (pipeline/core/noop.py): a second `doit build` answers from the
snapshot of the last successful build only when doit itself would run nothing, and prints what
the full path prints; any change sends it down the full path."""
from __future__ import annotations

import fcntl
import os
import subprocess
import sys

from conftest import REPO, Workspace, add_tiny_model, ran, target_registry


def fast_path(ws: Workspace, targets) -> bool:
    """Would the fast path answer this build? (asked in a child with the argv and the cwd doit
    gives dodo.py: its folder)"""
    argv = ["-f", str(REPO / "dodo.py"), "build", "target=host", f"targets={targets}",
            f"models={ws.models}", f"artifacts={ws.artifacts}"]
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from pipeline.core import noop; "
            "print(noop.up_to_date(sys.argv[2], sys.argv[3:], say=lambda *a, **k: None))")
    out = subprocess.run([sys.executable, "-c", code, str(REPO), str(REPO / "dodo.py"), *argv],
                         capture_output=True, text=True, cwd=REPO, check=True).stdout
    return out.strip() == "True"


def up_to_date_lines(result) -> list[str]:
    return sorted(line for line in result.stdout.splitlines() if line.startswith("-- "))


def test_a_noop_build_answers_from_the_snapshot_and_any_change_takes_the_full_path(tmp_path):
    targets = target_registry(tmp_path / "targets", keep=lambda abi: abi.get("arch") == "x86_64"
                              and abi.get("compiler") == "iree")
    ws = Workspace(tmp_path / "ws")
    spec = add_tiny_model(ws.models, "alpha", seed=1)
    build = lambda: ws.build("target=host", f"targets={targets}")  # noqa: E731
    build()
    assert fast_path(ws, targets)
    fast = build()
    assert ran(fast) == [] and fast.stderr == ""
    # the same lines as doit's own no-op, which the full path prints
    snapshots = ws.artifacts / ".cache" / "noop"
    for f in snapshots.iterdir():
        f.unlink()
    assert not fast_path(ws, targets)
    full = build()
    assert ran(full) == [] and up_to_date_lines(full) == up_to_date_lines(fast)
    assert len(up_to_date_lines(fast)) >= 6 and fast_path(ws, targets)

    # a spec edit that changes a step: the full path, and exactly the steps it changes run
    spec.write_text(spec.read_text().replace("max_abs: 1.0e-4", "max_abs: 2.0e-4"))
    assert not fast_path(ws, targets)
    rerun = ran(build())
    # the IREE CPU compile too: alpha has no pin, so its step builds the config of a model without
    # one and checks it against golden with this tolerance (compilers/config_choice.UNPINNED)
    assert "validate:host/alpha/cpu-x86_64" in rerun
    assert [t for t in rerun if "compile" in t] == ["iree_compile:host/alpha/cpu-x86_64"]
    assert fast_path(ws, targets)

    # an output removed: the snapshot still matches, doit's check does not
    vmfb = next(ws.artifacts.rglob("model.vmfb"))
    vmfb.unlink()
    assert not fast_path(ws, targets)
    rebuilt = build()
    assert any(t.startswith("iree_compile:host/alpha") for t in ran(rebuilt)) and vmfb.is_file()

    # a build running now holds the lock: the fast path leaves the waiting to the full path
    assert fast_path(ws, targets)
    fd = os.open(ws.artifacts / ".lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        assert not fast_path(ws, targets)
    finally:
        os.close(fd)
    assert fast_path(ws, targets)

    # a code edit (the pipeline package is part of the fingerprint) or a setting in the env
    env_changed = subprocess.run(
        [sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); from pipeline.core "
         "import noop; print(noop.up_to_date(sys.argv[2], sys.argv[3:], say=lambda *a, **k: None))",
         str(REPO), str(REPO / "dodo.py"), "build", "target=host", f"targets={targets}",
         f"models={ws.models}", f"artifacts={ws.artifacts}"],
        capture_output=True, text=True, cwd=REPO, check=True,
        env={**os.environ, "MODELYARD_CACHE": str(tmp_path / "elsewhere")}).stdout
    assert env_changed.strip() == "False"
