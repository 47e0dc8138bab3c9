"""Trust under faults: code in the step keys, the workspace lock, kill -9 at every point of a
step's publication, a damaged store, a full disk. Each test runs the real dodo.py through doit."""
from __future__ import annotations

import filecmp
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, Workspace, add_tiny_model, ran

DRIVER = Path(__file__).resolve().parents[1] / "fault_driver.py"
# Written by the build itself and not its outputs: doit's db, caches, logs, scratch, the lock.
BOOKKEEPING = {".doit.db", ".cache", "logs", ".tmp", ".lock", ".store"}


def snapshot(artifacts: Path) -> dict[str, bytes]:
    """Every file a build made (its outputs and step records), by relative path."""
    return {p.relative_to(artifacts).as_posix(): p.read_bytes()
            for p in sorted(artifacts.rglob("*"))
            if p.is_file() and p.relative_to(artifacts).parts[0] not in BOOKKEEPING}


def store_is_sound(artifacts: Path) -> None:
    """Every key record's objects exist with the recorded sha256; no temp file is left."""
    import hashlib
    import json
    store = artifacts / ".store"
    for record in (store / "keys").glob("*.json"):
        for name, meta in json.loads(record.read_text())["outputs"].items():
            obj = store / "objects" / meta["sha256"][:2] / meta["sha256"]
            assert obj.is_file(), f"{record.name}: {name} has no object"
            assert hashlib.sha256(obj.read_bytes()).hexdigest() == meta["sha256"], f"{obj} damaged"


def doit(ws: Workspace, *args: str, driver: tuple = (), env=None, preexec=None):
    argv = [sys.executable, *([str(DRIVER), *driver] if driver else ["-m", "doit"]),
            "-f", str(REPO / "dodo.py"), *args, f"models={ws.models}", f"artifacts={ws.artifacts}"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=900, cwd=ws.root,
                          env=env, preexec_fn=preexec)


# --- 1. the code that made an output is part of its key ------------------------------------------

def test_editing_a_helper_reruns_exactly_the_steps_that_import_it(tmp_path):
    """pipeline/run/vulkan.py is IREE's code (its runner and timer use it): an edit there re-runs
    IREE's compile and validation, and the steps that import IREE's backend (coverage, choose) or
    list their keys (the manifest); never TVM's steps (the registry loads a backend when asked,
    and a step's key holds the backends its config names: core/codehash.py), nor a model's
    import, golden or static step; every artifact and validation result keeps its bytes."""
    repo = tmp_path / "repo"
    shutil.copytree(REPO / "pipeline", repo / "pipeline",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "dodo.py", repo / "dodo.py")
    for sources in ("runtime", "third_party"):  # the C runtime stage's inputs (a checkout has them)
        shutil.copytree(REPO / sources, repo / sources)
    ws = Workspace(tmp_path / "ws")
    add_tiny_model(ws.models, "alpha", seed=1)

    def build():
        argv = [sys.executable, "-m", "doit", "-f", str(repo / "dodo.py"), "build", "target=host",
                f"models={ws.models}", f"artifacts={ws.artifacts}"]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=900, cwd=repo)
        assert result.returncode == 0, result.stdout + result.stderr
        return result

    build()
    before = snapshot(ws.artifacts)
    assert ran(build()) == []  # nothing changed, nothing runs
    helper = repo / "pipeline" / "run" / "vulkan.py"
    helper.write_text(helper.read_text() + "\n# an edit that changes no behaviour\n")
    rerun = ran(build())
    assert rerun == ["choose:host/alpha", "coverage:host/alpha", "iree_compile:host/alpha/cpu-x86_64",
                     "manifest:host", "validate:host/alpha/cpu-x86_64"]
    after = snapshot(ws.artifacts)
    assert after.keys() == before.keys()
    changed = sorted(k for k in after if after[k] != before[k])
    # only the records of the re-run steps (their keys hold the new code digest) and the
    # manifest that lists those keys
    assert changed == ["host/alpha/choose/step.json", "host/alpha/coverage/step.json",
                       "host/alpha/cpu-x86_64/iree_compile/step.json",
                       "host/alpha/cpu-x86_64/validate/step.json", "host/manifest.json",
                       "host/step.json"]


# --- 2. one build at a time ------------------------------------------------------------------

def _hold_lock(artifacts: Path) -> subprocess.Popen:
    code = ("import sys, time; from pipeline.core import lock; "
            f"lock.acquire({str(artifacts)!r}); print('held', flush=True); time.sleep(120)")
    holder = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_a_second_build_waits_for_the_first_or_fails_at_once_with_wait_0(workspace):
    add_tiny_model(workspace.models, "alpha", seed=1)
    holder = _hold_lock(workspace.artifacts)
    try:
        busy = doit(workspace, "static", "wait=0")
        assert busy.returncode == 2
        assert f"is in use by another build (pid {holder.pid}" in busy.stderr
        assert "Traceback" not in busy.stderr
        assert not (workspace.artifacts / "models").exists()  # it touched nothing
        listed = doit(workspace, "list")  # read-only commands take no lock
        assert listed.returncode == 0 and "static" in listed.stdout

        argv = [sys.executable, "-m", "doit", "-f", str(REPO / "dodo.py"), "static",
                f"models={workspace.models}", f"artifacts={workspace.artifacts}"]
        waiting = subprocess.Popen(argv, cwd=workspace.root, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True)
        said = []  # its stderr up to the line saying it waits (however long loading takes)
        while not any("waiting for another build" in line for line in said):
            line = waiting.stderr.readline()
            assert line, f"the second build ended without waiting: {''.join(said)}"
            said.append(line)
        assert waiting.poll() is None, "the second build did not wait"
        assert not (workspace.artifacts / "models").exists()
    finally:
        holder.kill()
        holder.wait()
    out, err = waiting.communicate(timeout=600)
    assert waiting.returncode == 0, out + err
    assert "static:alpha" in out


def test_scratch_folders_are_per_process(tmp_path):
    from pipeline.core.layout import Layout
    scratch = Layout(tmp_path).scratch("static", "alpha")
    assert str(os.getpid()) in scratch.relative_to(tmp_path).parts


# --- 3. kill -9 at each point of a step, with older outputs in place ----------------------------

# (point, n): see tests/fault_driver.py. The static step of the tiny model stores 2 objects and
# publishes 2 outputs: os.replace 1-2 store its objects, 3 its key record, 4-5 publish the
# outputs, 6 writes step.json.
KILL_POINTS = [("put", 1), ("copy", 1), ("put-done", 1), ("publish", 1)] + \
              [("replace", n) for n in range(1, 7)] + [("replaced", 6)]


@pytest.fixture(scope="module")
def fault_base(tmp_path_factory):
    """A workspace built at seed 1, and the snapshot of a clean build of the same at seed 2."""
    root = tmp_path_factory.mktemp("faults")
    clean = Workspace(root / "clean")
    add_tiny_model(clean.models, "alpha", seed=2)
    assert doit(clean, "static").returncode == 0
    ws = Workspace(root / "ws")
    add_tiny_model(ws.models, "alpha", seed=1)
    assert doit(ws, "static").returncode == 0
    saved = root / "saved"
    shutil.copytree(ws.artifacts, saved, symlinks=True)
    return ws, saved, snapshot(clean.artifacts), clean.models


@pytest.mark.parametrize("point,nth", KILL_POINTS, ids=[f"{p}-{n}" for p, n in KILL_POINTS])
def test_kill_at_any_point_of_a_step_then_rebuild_gives_the_clean_bytes(fault_base, point, nth):
    ws, saved, clean, clean_models = fault_base
    shutil.rmtree(ws.artifacts)
    shutil.copytree(saved, ws.artifacts, symlinks=True)
    shutil.rmtree(ws.models)
    shutil.copytree(clean_models, ws.models)  # the model changes: seed 1 -> 2
    old = snapshot(ws.artifacts)

    killed = doit(ws, "static", driver=("static", point, str(nth)))
    assert killed.returncode == -9, f"{point} #{nth} was not reached:\n{killed.stdout}{killed.stderr}"
    static = ws.artifacts / "models/alpha/static"
    now = snapshot(ws.artifacts)
    if (static / "step.json").exists():  # a record left in place must describe what is there
        import json
        record = json.loads((static / "step.json").read_text())
        for name, meta in record["outputs"].items():
            data = now[f"models/alpha/static/{name}"]
            import hashlib
            assert hashlib.sha256(data).hexdigest() == meta["sha256"]
        assert record == __import__("json").loads(old["models/alpha/static/step.json"]) or \
            now["models/alpha/static/step.json"] == clean["models/alpha/static/step.json"]
    store_is_sound(ws.artifacts)

    rebuilt = doit(ws, "static")
    assert rebuilt.returncode == 0, rebuilt.stdout + rebuilt.stderr
    assert snapshot(ws.artifacts) == clean
    store_is_sound(ws.artifacts)


# --- 4. a damaged store heals itself ------------------------------------------------------------

def test_a_damaged_store_object_is_evicted_and_its_step_runs_again(workspace):
    add_tiny_model(workspace.models, "alpha", seed=1)
    assert doit(workspace, "static").returncode == 0
    clean = snapshot(workspace.artifacts)
    static = workspace.artifacts / "models/alpha/static"
    import json
    digest = json.loads((static / "step.json").read_text())["outputs"]["model.onnx"]["sha256"]
    obj = workspace.artifacts / ".store/objects" / digest[:2] / digest
    data = bytearray(obj.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size: only a sha256 check can see it
    obj.write_bytes(bytes(data))
    shutil.rmtree(static)          # a fresh checkout of the outputs: they come from the store
    (workspace.artifacts / ".doit.db").unlink()

    healed = doit(workspace, "static")
    assert healed.returncode == 0, healed.stdout + healed.stderr
    assert "Traceback" not in healed.stderr
    assert digest[:12] in healed.stderr and "damaged" in healed.stderr.lower()
    assert snapshot(workspace.artifacts) == clean
    store_is_sound(workspace.artifacts)


# --- 5. a full disk ------------------------------------------------------------------------------

def test_a_full_disk_gives_one_paragraph_and_leaves_the_workspace_usable(workspace):
    add_tiny_model(workspace.models, "alpha", seed=1, channels=3000)  # ~400 KB of weights
    clean_ws = Workspace(workspace.root.parent / "clean")
    add_tiny_model(clean_ws.models, "alpha", seed=1, channels=3000)
    assert doit(clean_ws, "static").returncode == 0
    clean = snapshot(clean_ws.artifacts)

    limit = 200_000  # bytes per file: the model's copies cannot be written, the rest can
    full = doit(workspace, "static",
                preexec=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)))
    assert full.returncode != 0
    text = full.stdout + full.stderr
    assert "no room to write" in text and "File too large" in text, text
    assert "Traceback" not in text, text
    assert "next: free space under" in text
    assert not (workspace.artifacts / "models/alpha/import/step.json").exists()
    store_is_sound(workspace.artifacts)

    again = doit(workspace, "static")
    assert again.returncode == 0, again.stdout + again.stderr
    assert snapshot(workspace.artifacts) == clean
