"""Issue 30's proof that a backend is one module and one row: a fourth backend (onnxruntime's own
format, tests/fixtures/fourth_backend/) is added to a copy of the package as new modules (its
backend, its compile stage, its runner, its ABI schema) and one row in each of the two tables
that list them (compilers/backends.py's BACKENDS, spec/target.py's ABI_SCHEMAS), nothing else.
That copy then builds a model for a target naming it: coverage, compile, validation, the slot's
choice (timed side by side with IREE's), the manifest and the SBOM's compiler, `doit list`, and
the app-side runner all take it without a line of theirs changed."""
from __future__ import annotations

import difflib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import FIXTURES, REPO, add_tiny_model

FOURTH = FIXTURES / "fourth_backend"
NEW_MODULES = ("pipeline/compilers/ort_backend.py", "pipeline/run/ort_run.py",
               "pipeline/spec/ort.py", "pipeline/stages/ort_compile.py")
TABLES = {"pipeline/compilers/backends.py": 1, "pipeline/spec/target.py": 3}  # file -> lines added


def package_with_fourth_backend(root: Path) -> None:
    """dodo.py and the package copied to root, the fourth backend's modules dropped in and its
    rows added to the tables (rows.json: each after a line of the table as it is)."""
    shutil.copy(REPO / "dodo.py", root / "dodo.py")
    for name in ("third_party", "runtime", "docs", "models", ".tools"):  # what the package reads
        (root / name).symlink_to(REPO / name)
    shutil.copytree(REPO / "pipeline", root / "pipeline",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for rel in NEW_MODULES:
        assert not (root / rel).exists(), f"{rel} exists in the package: the fixture must add it"
        shutil.copy(FOURTH / rel, root / rel)
    for row in json.loads((FOURTH / "rows.json").read_text()):
        path = root / row["file"]
        text = path.read_text()
        assert text.count(row["after"]) == 1, f"{row['file']}: {row['after']!r} is not one line of it"
        path.write_text(text.replace(row["after"], row["after"] + row["add"]))


def changes(root: Path) -> dict:
    """Every file of the copy's package that differs from the repository's: path -> (added
    lines, removed lines); new files: (lines, 0)."""
    out = {}
    for path in sorted((root / "pipeline").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        mine = path.read_text().splitlines()
        theirs = (REPO / rel).read_text().splitlines() if (REPO / rel).is_file() else None
        if theirs is None:
            out[rel] = (len(mine), 0)
        elif mine != theirs:
            diff = list(difflib.unified_diff(theirs, mine, lineterm="", n=0))[2:]
            out[rel] = (sum(l.startswith("+") for l in diff), sum(l.startswith("-") for l in diff))
    return out


def test_a_fourth_backend_is_its_modules_and_a_row_per_table(tmp_path):
    root = tmp_path / "repo"
    root.mkdir()
    package_with_fourth_backend(root)
    changed = changes(root)
    assert {f: n for f, n in changed.items() if f not in NEW_MODULES} == \
        {f: (n, 0) for f, n in TABLES.items()}, changed

    models, artifacts, targets = tmp_path / "models", tmp_path / "artifacts", tmp_path / "targets"
    targets.mkdir()
    shutil.copy(FOURTH / "host-ort.yaml", targets / "host-ort.yaml")
    add_tiny_model(models, "tiny", seed=3)
    env = {**os.environ, "PYTHONPATH": str(root)}

    def doit(*args):
        return subprocess.run([sys.executable, "-m", "doit", "-f", str(root / "dodo.py"), *args,
                               f"models={models}", f"artifacts={artifacts}", f"targets={targets}"],
                              capture_output=True, text=True, env=env, cwd=tmp_path, timeout=1800)

    listed = doit("list")
    assert listed.returncode == 0, listed.stderr
    assert "ort_compile" in listed.stdout and "onnxruntime's format" in listed.stdout

    built = doit("build", "target=host-ort")
    assert built.returncode == 0, f"{built.stdout}\n{built.stderr}"
    manifest = json.loads((artifacts / "host-ort" / "manifest.json").read_text())
    entry = manifest["models"]["tiny"]
    art = entry["artifacts"]["cpu-x86_64-ort"]
    path = artifacts / art["path"] if not Path(art["path"]).is_absolute() else Path(art["path"])
    assert art["format"] == "onnxruntime-ort" and path.name == "model.ort"
    assert art["validation"]["status"] == "passed", art["validation"]
    assert art["compile"]["optimization"] == "basic"
    assert art["requires"]["onnxruntime"]["version"]
    assert sorted(entry["artifacts"]) == ["cpu-x86_64", "cpu-x86_64-ort"]
    choice = entry["choice"]["cpu"]  # both timed side by side, the ORT one by its backend's timer
    assert choice["policy"] == "fastest-on-host" and choice["ships"] in choice["candidates"], choice
    assert all(c["host_proxy"]["p50_ms"] > 0 for c in choice["candidates"].values()), choice

    # An app opens the manifest and runs what ships on this machine: the .ort file, as validated.
    opened = subprocess.run([sys.executable, "-c", (
        "import sys, numpy as np\n"
        "from pipeline.app import Runner\n"
        "r = Runner.open(sys.argv[1], 'tiny')\n"
        "print(r.choice.abi, r.choice.device)\n"
        "x = np.load(sys.argv[2]); want = np.load(sys.argv[3])\n"
        "(y,) = r.run(x)\n"
        "print('max_abs', float(np.abs(y - want).max()))\n"),
        str(artifacts / "host-ort" / "manifest.json"),
        *[str(next((artifacts).rglob(f"golden/{n}"))) for n in ("input_0.npy", "output_0.npy")]],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert opened.returncode == 0, opened.stderr[-3000:]
    abi, _, rest = opened.stdout.partition(" ")
    assert abi == choice["ships"] and "max_abs" in rest, opened.stdout
    assert float(rest.split("max_abs")[1]) <= 1e-5, opened.stdout

    # The SBOM names the compiler of its artifacts; the layer and backend-name checks hold for the
    # copy as they do for the package (the generated module map aside: docs/ is the repository's).
    made_by = subprocess.run([sys.executable, "-c", "from pipeline.release.provenance import MADE_BY; "
                              "print(MADE_BY['.ort'])"], capture_output=True, text=True, env=env,
                             cwd=tmp_path)
    assert made_by.stdout.strip() == "onnxruntime", made_by.stderr
    (root / "tests" / "unit").mkdir(parents=True)
    shutil.copy(REPO / "tests" / "unit" / "test_architecture.py", root / "tests" / "unit")
    checked = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                              "tests/unit/test_architecture.py", "-k",
                              "not module_map and not layers_table"],
                             capture_output=True, text=True, env=env, cwd=root, timeout=600)
    assert checked.returncode == 0, checked.stdout[-3000:]
