"""The suite's own rules: under CI=true a skipped test fails the run (tests/conftest.py)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def _pytest(folder: Path, ci: bool) -> subprocess.CompletedProcess:
    (folder / "test_sample.py").write_text(
        "import pytest\n\ndef test_skips():\n    pytest.skip('no tool here')\n\n"
        "def test_passes():\n    pass\n")
    env = {**os.environ, "PYTHONPATH": str(TESTS), "CI": "true" if ci else ""}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-p", "conftest", "-n", "0", "-c", os.devnull, "--rootdir", str(folder),
                           str(folder)],
                          capture_output=True, text=True, env=env, cwd=folder, timeout=300)


def test_a_skip_fails_the_run_under_ci_only(tmp_path):
    off = _pytest(tmp_path, ci=False)
    assert off.returncode == 0, off.stdout + off.stderr
    on = _pytest(tmp_path, ci=True)
    assert on.returncode == 1, on.stdout + on.stderr
    assert "1 test(s) skipped, which fails the run" in on.stderr and "test_skips" in on.stderr
