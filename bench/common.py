"""What the bench scripts share: doit on a workspace of their own, and that workspace."""
from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def doit(ws: Path, *args: str) -> tuple[float, subprocess.CompletedProcess]:
    """`doit ARGS` with the repository's dodo.py on ws/models and ws/artifacts: (seconds, result)."""
    argv = [sys.executable, "-m", "doit", "-f", str(REPO / "dodo.py"), *args,
            f"models={ws / 'models'}", f"artifacts={ws / 'artifacts'}"]
    start = time.perf_counter()
    result = subprocess.run(argv, capture_output=True, text=True, cwd=REPO)
    return time.perf_counter() - start, result


def executed(result: subprocess.CompletedProcess) -> list[str]:
    """Tasks doit executed (it prints '.  name' for those, '-- name' for up-to-date ones)."""
    return sorted(line[3:].strip() for line in result.stdout.splitlines() if line.startswith(".  "))


@contextlib.contextmanager
def temporary(prefix: str, keep: bool):
    """A fresh temporary folder (never the user's artifacts/), removed at the end unless `keep`."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield folder
    finally:
        if keep:
            print(f"kept {folder}")
        else:
            shutil.rmtree(folder, ignore_errors=True)
