"""pipeline/core/noop.py without doit: which commands may take the fast path, and what the
fingerprint of the build graph's sources notices."""
from __future__ import annotations

import os
from pathlib import Path

from pipeline.core import noop


def test_only_a_plain_build_with_variables_takes_the_fast_path():
    assert noop.build_vars([]) == {}
    assert noop.build_vars(["build", "target=rk3588"]) == {"target": "rk3588"}
    assert noop.build_vars(["-n", "2", "build", "target=host"]) == {"target": "host"}
    assert noop.build_vars(["-f", "x/dodo.py", "build"])["__dodo__"] == str(Path("x/dodo.py").resolve())
    for argv in (["bench", "target=host"], ["build", "-v", "2"], ["build", "revalidate=1"],
                 ["list"], ["build", "manifest"], ["--always-execute", "build"], ["run", "build"]):
        assert noop.build_vars(argv) is None, argv


def test_the_fingerprint_notices_edits_new_files_settings_and_verdicts(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    models = tmp_path / "models"
    (models / "m").mkdir(parents=True)
    spec = models / "m" / "model.yaml"
    spec.write_text("a: 1\n")
    dodo = tmp_path / "dodo.py"
    dodo.write_text("")
    verdict = tmp_path / "coverage.json"
    values = {"models": str(models)}
    base = noop.fingerprint(dodo, values, [str(verdict)])
    assert noop.fingerprint(dodo, values, [str(verdict)]) == base
    spec.write_text("a: 2\n")                                   # same size, new content and mtime
    os.utime(spec, ns=(1, 1))
    edited = noop.fingerprint(dodo, values, [str(verdict)])
    assert edited != base
    (models / "m" / "extra.npy").write_bytes(b"x")              # a new file in a model folder
    assert noop.fingerprint(dodo, values, [str(verdict)]) != edited
    now = noop.fingerprint(dodo, values, [str(verdict)])
    verdict.write_text("{}")                                     # a coverage verdict appears
    assert noop.fingerprint(dodo, values, [str(verdict)]) != now
    now = noop.fingerprint(dodo, values, [str(verdict)])
    monkeypatch.setenv("MODELYARD_CACHE", "file:///elsewhere")
    assert noop.fingerprint(dodo, values, [str(verdict)]) != now
    monkeypatch.delenv("MODELYARD_CACHE")
    (tmp_path / "pyproject.toml").write_text("[tool.modelyard]\n")  # settings in the cwd
    assert noop.fingerprint(dodo, values, [str(verdict)]) != now
    assert noop.fingerprint(dodo, {**values, "target": "host"}, [str(verdict)]) != \
        noop.fingerprint(dodo, values, [str(verdict)])


def test_snapshots_are_per_command(tmp_path):
    a = noop.snapshot_path(tmp_path, {"target": "host"})
    assert a == noop.snapshot_path(tmp_path, {"target": "host"})
    assert a != noop.snapshot_path(tmp_path, {"target": "rk3588"})
    assert a.parent == tmp_path / ".cache" / "noop"
