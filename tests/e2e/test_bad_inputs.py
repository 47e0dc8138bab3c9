"""Wrong input, as a new user gives it: one table, one row per mistake.

Every row starts from the same built workspace (a tiny model built for the host, a signing key
pair, a release v1.0.0 of it, all made once per worker and restored byte for byte before each
row), does one wrong thing, and asserts what issue 38 asks of every wrong input:
  - a non-zero exit;
  - a clear line that names what was wrong (the row's pattern);
  - no Python traceback and none of doit's UnmetDependency chains on the terminal;
  - `artifacts/` byte-identical before and after: manifests, the store, every artifact and
    release (the logs may grow; doit's own database, the hash memo, the cache statistics and the
    lock file's holder line are bookkeeping, not output).
"""
from __future__ import annotations

import dataclasses
import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Callable

import pytest

from conftest import REPO, Workspace, add_tiny_model, require, tiny_onnx, write_spec

BOOKKEEPING = ("logs/", ".doit.db", ".cache/", ".lock", ".tmp/")


def snapshot(artifacts: Path) -> dict[str, str]:
    """relative path -> sha256 of every file under artifacts/ that is output, not bookkeeping."""
    out = {}
    for path in sorted(artifacts.rglob("*")):
        rel = path.relative_to(artifacts).as_posix()
        if path.is_file() and not rel.startswith(BOOKKEEPING):
            out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(the built workspace's pristine copy, where each row's workspace goes): made once per worker."""
    base = tmp_path_factory.mktemp("bad-inputs")
    ws = Workspace(base / "ws")
    add_tiny_model(ws.models, "alpha", seed=1)
    result = ws.build("target=host")
    key = base / "keys" / "release.key"
    key.parent.mkdir()
    assert ws.doit("keygen", f"key={key}").returncode == 0
    release = ws.doit("release", "target=host", "version=1.0.0", "runtime=0", f"key={key}")
    assert release.returncode == 0, release.stdout + release.stderr
    assert (ws.artifacts / "host" / "manifest.json").exists(), result.stdout
    pristine = base / "pristine"
    shutil.copytree(ws.root, pristine, symlinks=True)
    return pristine, ws.root


@dataclasses.dataclass
class Row:
    id: str
    # (workspace, scratch folder) -> the command line: ["doit", ...] runs the repo's dodo.py with
    # the workspace's models= and artifacts= appended, anything else runs as given
    act: Callable[[Workspace, Path], list[str]]
    expect: str  # a regular expression the output must contain (re.S is not set: one line)


def bundle(ws: Workspace) -> Path:
    return next((ws.artifacts / "releases").rglob("*.tar.gz"))


def pubkey(ws: Workspace) -> Path:
    return ws.root.parent / "keys" / "release.key.pub"


def key(ws: Workspace) -> Path:
    return ws.root.parent / "keys" / "release.key"


def _doit(*args):
    return lambda ws, tmp: ["doit", *args]


def _with(edit: Callable[[Workspace, Path], None], *args):
    def act(ws, tmp):
        edit(ws, tmp)
        return ["doit", *args]
    return act


def _spec_edit(old: str, new: str):
    def edit(ws, tmp):
        spec = ws.models / "alpha" / "model.yaml"
        text = spec.read_text()
        assert old in text, text
        spec.write_text(text.replace(old, new, 1))
    return edit


def _append_spec(extra: str):
    def edit(ws, tmp):
        spec = ws.models / "alpha" / "model.yaml"
        spec.write_text(spec.read_text() + extra)
    return edit


def _new_model(make: Callable[[Path], bytes]):
    """a second model, beta, whose source is `make`'s bytes (its spec pins their sha256)."""
    def edit(ws, tmp):
        folder = ws.models / "beta"
        folder.mkdir()
        data = make(tmp)
        (folder / "model.onnx").write_bytes(data)
        write_spec(folder, "model.onnx", hashlib.sha256(data).hexdigest())
    return edit


def _truncated(tmp: Path) -> bytes:
    data = tiny_onnx(tmp / "t.onnx", seed=3).read_bytes()
    return data[: len(data) // 2]


def _random_bytes(tmp: Path) -> bytes:
    import numpy as np
    return np.random.default_rng(7).integers(0, 256, 4096, dtype=np.uint8).tobytes()


def _flip_bundle_byte(ws, tmp) -> Path:
    """a copy of the released bundle with one byte flipped"""
    data = bytearray(bundle(ws).read_bytes())
    data[len(data) // 2] ^= 0x01
    out = tmp / bundle(ws).name
    out.write_bytes(bytes(data))
    return out


def _edit_signed_manifest(ws, tmp) -> Path:
    """a copy of the released bundle whose signed manifest.json was edited (its version), its
    signature kept."""
    path = bundle(ws)
    with tarfile.open(path) as tar:
        members = [(m, tar.extractfile(m).read() if m.isfile() else None) for m in tar.getmembers()]
    out = tmp / "edited.tar.gz"
    with tarfile.open(out, "w:gz") as tar:
        for member, data in members:
            if member.name.endswith("/manifest.json"):
                edited = re.sub(rb'("version":\s*)"1\.0\.0"', rb'\1"1.0.1"', data)
                assert edited != data, data[:300]
                data = edited
                member.size = len(data)
            tar.addfile(member, None if data is None else io.BytesIO(data))
    return out


def _hold_lock(ws, tmp):
    """another build holds the artifacts folder's lock (a process that sleeps holding it)."""
    code = ("import sys, time; sys.path.insert(0, sys.argv[1]); from pipeline.core import lock; "
            "lock.acquire(sys.argv[2], wait=False); print('held', flush=True); time.sleep(120)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(REPO), str(ws.artifacts)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    _HELD.append(proc)


_HELD: list[subprocess.Popen] = []


def _keygen(ws, tmp) -> bool:
    """another key pair, tmp/other.key(.pub)"""
    subprocess.run([sys.executable, "-m", "doit", "-f", str(REPO / "dodo.py"), "keygen",
                    f"key={tmp / 'other.key'}"], capture_output=True, check=True, cwd=ws.root)
    return True


def _bad_target_registry(ws, tmp):
    folder = tmp / "targets"
    folder.mkdir()
    text = (REPO / "pipeline" / "targets" / "host.yaml").read_text()
    (folder / "host.yaml").write_text(text.replace("abis:", "abis:\n  bad: [", 1))


ROWS = [
    # the models folder and the variables
    Row("models-empty", lambda ws, tmp: (tmp / "empty").mkdir() or
        ["doit", "build", "target=host", f"models={tmp / 'empty'}"],
        r"no model folders .*under .*empty"),
    Row("models-is-a-model-folder", lambda ws, tmp: ["doit", "build", "target=host",
                                                     f"models={ws.models / 'alpha'}"],
        r"model folder.*models=.*parent|parent.*models="),
    Row("models-missing", lambda ws, tmp: ["doit", "build", "target=host", f"models={tmp / 'nope'}"],
        r"nope.*(does not exist|no such|not a folder)"),
    Row("misspelt-variable", _doit("build", "target=host", "modles=models"),
        r"modles.*did you mean.*models"),
    Row("unknown-variable-verify", _doit("verify", "bundel=x"), r"bundel.*did you mean.*bundle"),
    Row("unknown-target", _doit("build", "target=rk3599"), r"rk3599.*(known|unknown).*host"),
    Row("unknown-abi-bisect", _doit("bisect", "model=alpha", "target=host", "abi=cpu-x86-64"),
        r"cpu-x86-64.*cpu-x86_64"),
    Row("unknown-model-accuracy", _doit("accuracy", "model=alfa"), r"no variant named 'alfa'"),
    Row("bad-threads", _doit("bench", "target=host", "threads=many"), r"threads.*many"),
    Row("bad-cache-url", _doit("build", "target=host", "cache=gopher://example.org/x"),
        r"cache=gopher://.*no file system serves the scheme"),
    Row("bad-executor", _doit("build", "target=host", "executor=spark"), r"spark.*(local|dask)"),
    Row("broken-target-registry", lambda ws, tmp: _bad_target_registry(ws, tmp) or
        ["doit", "build", "target=host", f"targets={tmp / 'targets'}"], r"host\.yaml.*line \d+"),
    Row("lock-held-wait-0", _with(_hold_lock, "build", "target=host", "wait=0"),
        r"in use by another build"),
    # the model's spec
    Row("yaml-syntax", _with(_spec_edit("inputs:\n", "inputs:\n  - [\n"), "build", "target=host"),
        r"model\.yaml.*line \d+.*column \d+"),
    Row("spec-unknown-key", _with(_append_spec("tolerence: {max_abs: 1}\n"), "build", "target=host"),
        r"tolerence.*tolerance"),
    Row("spec-bad-dtype", _with(_spec_edit("dtype: float32", "dtype: float33"), "build", "target=host"),
        r"float33"),
    Row("spec-wrong-rank", _with(_spec_edit("shape: [1, 3, 16, 16]", "shape: [1, 3, 16]"),
                                 "build", "target=host"), r"shape.*\[1, 3, 16\]|rank|dims"),
    Row("spec-wrong-sha256", _with(_spec_edit("sha256: ", "sha256: 0"), "build", "target=host"),
        r"sha256"),
    Row("spec-source-missing", _with(_spec_edit("path: model.onnx", "path: modle.onnx"), "build",
                                     "target=host"), r"modle\.onnx"),
    Row("spec-negative-tolerance", _with(_spec_edit("max_abs: 1.0e-4", "max_abs: -1"), "build",
                                         "target=host"), r"max_abs"),
    Row("spec-skip-unknown-abi", _with(_append_spec("skip:\n  cpu-x86-64: not wanted\n"), "build",
                                       "target=host"), r"cpu-x86-64.*cpu-x86_64"),
    # the model's bytes: one model's failure, told once, the others untouched
    Row("truncated-model", _with(_new_model(_truncated), "build", "target=host"),
        r"beta/model\.yaml: source\.path: model\.onnx is not a readable ONNX model"),
    Row("random-bytes-model", _with(_new_model(_random_bytes), "build", "target=host"),
        r"beta/model\.yaml: source\.path: model\.onnx is not a readable ONNX model"),
    # doit new
    Row("new-missing-source", _doit("new", "source=nothing.onnx", "name=gamma"), r"nothing\.onnx"),
    Row("new-existing-name", lambda ws, tmp: ["doit", "new", f"source={ws.models / 'alpha' / 'model.onnx'}",
                                              "name=alpha"], r"alpha.*(exists|already)"),
    Row("new-bad-name", lambda ws, tmp: ["doit", "new", f"source={ws.models / 'alpha' / 'model.onnx'}",
                                         "name=../gamma"], r"name"),
    Row("new-shape-not-an-input", lambda ws, tmp: ["doit", "new", f"source={ws.models / 'alpha' / 'model.onnx'}",
                                                   "name=gamma", "shape=image:1x3x16x16"],
        r"image.*inputs: x"),
    # releases and bundles
    Row("release-missing-key", _doit("release", "target=host", "version=1.1.0", "runtime=0"),
        r"key"),
    Row("release-bad-version", lambda ws, tmp: ["doit", "release", "target=host", "version=1.1",
                                                "runtime=0", f"key={key(ws)}"], r"1\.1.*(semver|SEMVER|MAJOR)"),
    Row("release-unknown-format", lambda ws, tmp: ["doit", "release", "target=host", "version=1.1.0",
                                                   "runtime=0", f"key={key(ws)}", "format=zip"],
        r"format.*zip"),
    Row("release-same-version-other-key", lambda ws, tmp: _keygen(ws, tmp) and
        ["doit", "release", "target=host", "version=1.0.0", "runtime=0", f"key={tmp / 'other.key'}"],
        r"1\.0\.0"),
    Row("verify-flipped-byte", lambda ws, tmp: ["doit", "verify", f"bundle={_flip_bundle_byte(ws, tmp)}",
                                                f"pubkey={pubkey(ws)}"],
        r"(damaged|corrupt|sha256|CRC|truncated|Error -3)"),
    Row("verify-edited-manifest", lambda ws, tmp: ["doit", "verify", f"bundle={_edit_signed_manifest(ws, tmp)}",
                                                   f"pubkey={pubkey(ws)}"], r"signature"),
    Row("verify-wrong-key", lambda ws, tmp: _keygen(ws, tmp) and
        ["doit", "verify", f"bundle={bundle(ws)}", f"pubkey={tmp / 'other.key.pub'}"],
        r"(signed by|key)"),
    Row("verify-missing-bundle", lambda ws, tmp: ["doit", "verify", f"bundle={tmp / 'none.tar.gz'}",
                                                  f"pubkey={pubkey(ws)}"], r"none\.tar\.gz"),
    # the file system
    Row("read-only-artifacts", lambda ws, tmp: ["unshare", "-m", "sh", "-c",
                                                'mount --bind -o ro "$1" "$1" && shift && exec "$@"', "sh",
                                                str(ws.artifacts), "doit", "build", "target=host"],
        r"(read-only|cannot write).*artifacts"),
]


def run_row(row: Row, ws: Workspace, tmp: Path) -> subprocess.CompletedProcess:
    argv = row.act(ws, tmp)
    tail = [f"models={ws.models}", f"artifacts={ws.artifacts}"]
    if "doit" in argv:
        at = argv.index("doit")
        given = {a.split("=")[0] for a in argv[at + 1:] if "=" in a}
        argv = (argv[:at] + [sys.executable, "-m", "doit", "-f", str(REPO / "dodo.py")] + argv[at + 1:]
                + [t for t in tail if t.split("=")[0] not in given])
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run(argv, capture_output=True, text=True, timeout=900, cwd=ws.root, env=env)


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_wrong_input_is_refused_clearly_and_loses_nothing(row, built, tmp_path):
    pristine, root = built
    if row.id == "read-only-artifacts":  # chmod does not stop root: a read-only bind mount does
        require(os.geteuid() == 0 and shutil.which("unshare") is not None,
                "a read-only bind mount needs root and unshare (util-linux)")
    if root.exists():
        shutil.rmtree(root)
    shutil.copytree(pristine, root, symlinks=True)
    ws = Workspace(root)
    before = snapshot(ws.artifacts)
    try:
        result = run_row(row, ws, tmp_path)
    finally:
        while _HELD:
            _HELD.pop().kill()
    text = result.stdout + result.stderr
    assert result.returncode != 0, f"{row.id}: exit 0\n{text}"
    assert re.search(row.expect, text), f"{row.id}: no line matching {row.expect!r}:\n{text}"
    assert "Traceback" not in text, f"{row.id}: a traceback reached the user:\n{text}"
    assert "UnmetDependency" not in text, f"{row.id}: doit's dependency chains:\n{text}"
    after = snapshot(ws.artifacts)
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    assert not changed, f"{row.id}: artifacts/ changed: {changed[:10]}\n{text}"


def test_the_table_holds_at_least_thirty_wrong_inputs():
    assert len({r.id for r in ROWS}) == len(ROWS) >= 30
