"""`doit release` and `doit verify`: reproducible signed bundles, immutability, gates, tampering.

The signing keys here are test keys generated into pytest's temporary folders; none is committed.
"""
from __future__ import annotations

import base64
import io
import json
import shutil
import tarfile
from pathlib import Path

import pytest

from conftest import Workspace, add_tiny_model, require_aarch64, sha256, tiny_onnx
from pipeline.release import release, signing
from pipeline.core.errors import PipelineError, SpecError
from pipeline.graph import load_project
from pipeline.spec import load_models
from pipeline.core.tools import distribution_version
from pipeline.release.verify import extract, verify

RELEASE_SPEC = """release:
  io:
    x: {layout: NCHW, preprocessing: "RGB, 16x16, scaled to [-1, 1]"}
    y: {layout: NC, postprocessing: softmax over 10 classes}
  waivers:
    - {abi: vulkan-mali-g610, target: rk3588, status: twin-passed,
       reason: "valhall3 kernels need a Mali; checked through the llvmpipe twin on lavapipe"}
"""
VMFB = "models/alpha/cpu-x86_64/model.vmfb"


def out(result) -> str:
    return result.stdout + result.stderr


def tiny_workspace(root: Path, seed: int = 1) -> Workspace:
    ws = Workspace(root)
    spec = add_tiny_model(ws.models, "alpha", seed=seed)
    spec.write_text(spec.read_text() + RELEASE_SPEC)
    return ws


def do_release(ws: Workspace, target: str, version: str, key: Path | None, check: bool = True):
    """A release without the C runtime (runtime=0): these tests check signing, bundles and
    verification; tests/e2e/test_c_runtime.py releases with the runtime and runs it."""
    args = ["release", f"target={target}", f"version={version}", "runtime=0"] + ([f"key={key}"] if key else [])
    result = ws.doit(*args)
    if check:
        assert result.returncode == 0, out(result)
    return result


def unreleased_copy(ws: Workspace, root: Path) -> tuple[Workspace, Path]:
    """ws's models and artifacts copied under root, without its releases; (the copy, its host
    build manifest)."""
    shutil.copytree(ws.models, root / "models")
    shutil.copytree(ws.artifacts, root / "artifacts", ignore=shutil.ignore_patterns("releases"))
    return Workspace(root), root / "artifacts" / "host" / "manifest.json"


def flip_byte(path: Path, offset: int = 1000) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def members(archive: Path) -> list[tarfile.TarInfo]:
    with tarfile.open(archive, "r:gz") as tar:
        return tar.getmembers()


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    """A host workspace with one tiny model, released as 1.0.0 through doit (key made by keygen)."""
    root = tmp_path_factory.mktemp("released")
    ws = tiny_workspace(root / "ws")
    key = root / "keys" / "test-signing-key.pem"  # a throwaway test key
    made = ws.doit("keygen", f"key={key}")
    assert made.returncode == 0 and "key id" in made.stdout, out(made)
    assert key.stat().st_mode & 0o777 == 0o600
    do_release(ws, "host", "1.0.0", key)
    return ws, key, ws.artifacts / "releases" / "host" / "1.0.0"


def project(ws: Workspace, target: str = "host", artifacts: Path | None = None):
    return load_project(ws.models, artifacts or ws.artifacts, target)


# ----------------------------------------------------------------------------- the good path
def test_release_twice_from_clean_workspaces_is_byte_identical(tmp_path):
    require_aarch64()
    key = tmp_path / "test-key.pem"
    signing.generate(key)
    bundles = []
    for name in ("one", "elsewhere"):
        ws = tiny_workspace(tmp_path / name)
        result = do_release(ws, "rk3588", "1.2.0", key)  # builds first: release depends on the manifest
        assert "manifest:rk3588" in result.stdout and "released rk3588 1.2.0" in result.stdout
        bundles.append(ws.artifacts / "releases" / "rk3588" / "1.2.0")
    archives = [b / "modelyard-rk3588-1.2.0.tar.gz" for b in bundles]
    assert sha256(archives[0]) == sha256(archives[1])
    for name in ("manifest.json", "manifest.json.sig", "sbom.cdx.json", "provenance.intoto.jsonl"):
        assert (bundles[0] / name).read_bytes() == (bundles[1] / name).read_bytes(), name

    # the archive: sorted regular files under one folder, fixed mtime and owner, no gzip stamp
    entries = members(archives[0])
    names = [m.name for m in entries]
    assert names == sorted(names) and all(n.startswith("modelyard-rk3588-1.2.0/") for n in names)
    assert {(m.mtime, m.uid, m.gid, m.uname, m.gname, m.mode, m.type) for m in entries} == \
           {(release.DEFAULT_EPOCH, 0, 0, "", "", 0o644, tarfile.REGTYPE)}
    header = archives[0].read_bytes()[:10]
    assert header[3] == 0 and header[4:8] == b"\0\0\0\0"  # no file name flag, mtime 0
    manifest = json.loads((bundles[0] / "manifest.json").read_text())
    inside = sorted(n.split("/", 1)[1] for n in names)
    assert sorted(manifest["files"]) == [n for n in inside
                                         if n not in ("manifest.json", "manifest.json.sig")]
    vmfb = "models/alpha/cpu-aarch64/model.vmfb"
    assert manifest["files"][vmfb]["sha256"] == sha256(bundles[0] / vmfb)

    # what the board needs to know
    doc = json.loads((bundles[0] / "release.json").read_text())
    art = doc["models"]["alpha"]["artifacts"]["cpu-aarch64"]
    runtime = distribution_version("iree-base-runtime")
    assert art["requires"]["iree_runtime"]["install"] == f"pip install iree-base-runtime=={runtime}"
    assert (art["requires"]["cpu"], art["requires"]["arch"], art["requires"]["hal_driver"]) == \
           ("cortex-a55", "aarch64", "local-task")
    mali = doc["models"]["alpha"]["artifacts"]["vulkan-mali-g610"]
    assert mali["requires"]["hal_driver"] == "vulkan"
    assert mali["requires"]["vulkan"]["arch"] == "valhall3" and mali["requires"]["vulkan"]["subgroup_size"] == [16]
    assert mali["validation"]["status"] == "twin-passed" and mali["validation"]["shipped_bytes_executed"] is False
    assert mali["waiver"]["reason"].startswith("valhall3 kernels need a Mali")
    assert doc["models"]["alpha"]["artifacts"]["vulkan-baseline"]["validation"]["status"] == "passed"
    assert art["entry"] == "main" and art["validation"]["status"] == "passed"
    assert art["validation"]["executed"]["emulated"] is True
    assert art["validation"]["outputs"][0]["max_abs"] < 1e-4
    assert art["benchmark"]["status"] == "not measured"
    (x,), (y,) = doc["models"]["alpha"]["io"]["inputs"], doc["models"]["alpha"]["io"]["outputs"]
    assert (x["name"], x["shape"], x["dtype"], x["layout"]) == ("x", [1, 3, 16, 16], "float32", "NCHW")
    assert x["preprocessing"].startswith("RGB") and y["postprocessing"].startswith("softmax")

    # provenance: signed, names the archive and the artifact
    envelope = json.loads((bundles[0] / "provenance.intoto.jsonl").read_text())
    statement = json.loads(base64.b64decode(envelope["payload"]))
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["predicateType"] == "https://slsa.dev/provenance/v1"
    subjects = {s["name"]: s["digest"]["sha256"] for s in statement["subject"]}
    shipped = {f"models/alpha/{abi}/model.vmfb" for abi in ("cpu-aarch64", "vulkan-baseline", "vulkan-mali-g610")}
    shipped.add("models/alpha/npu/model.rknn")  # the NPU's (docs/npu.md)
    assert subjects == {archives[0].name: sha256(archives[0]),
                        **{v: sha256(bundles[0] / v) for v in shipped}}
    deps = statement["predicate"]["buildDefinition"]["resolvedDependencies"]
    assert {"name": "models/alpha/model.onnx",
            "digest": {"sha256": sha256(tmp_path / "one/models/alpha/model.onnx")}} in deps
    assert {"name": "iree-base-compiler",
            "uri": f"pkg:pypi/iree-base-compiler@{distribution_version('iree-base-compiler')}"} in deps
    assert statement["predicate"]["buildDefinition"]["externalParameters"]["version"] == "1.2.0"

    # verify: the folder, and the archive alone with the key pinned
    for bundle in (bundles[0], archives[1]):
        checked = Workspace(tmp_path / "one").doit("verify", f"bundle={bundle}", f"pubkey={key}.pub")
        assert checked.returncode == 0, out(checked)
        assert "files match the signed manifest of rk3588 1.2.0" in checked.stdout
        assert "signed by the expected key" in checked.stdout


def test_sbom_is_cyclonedx_with_models_and_toolchain(released):
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    ws, _, bundle = released
    text = (bundle / "sbom.cdx.json").read_text()
    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(text) is None
    bom = json.loads(text)
    assert bom["specVersion"] == "1.6"
    assert bom["metadata"]["timestamp"].startswith("1980-01-01T00:00:00")
    assert bom["metadata"]["component"]["type"] == "firmware"
    by_ref = {c["bom-ref"]: c for c in bom["components"]}
    model = by_ref["model:alpha"]
    assert model["type"] == "machine-learning-model"
    assert model["hashes"] == [{"alg": "SHA-256", "content": sha256(ws.models / "alpha/model.onnx")}]
    assert by_ref["tool:iree-base-compiler"]["purl"].startswith("pkg:pypi/iree-base-compiler@")
    assert by_ref[f"file:{VMFB}"]["hashes"][0]["content"] == sha256(bundle / VMFB)
    deps = {d["ref"]: set(d.get("dependsOn", [])) for d in bom["dependencies"]}
    assert deps[f"file:{VMFB}"] == {"model:alpha", "tool:iree-base-compiler"}


def test_verify_unpacks_a_good_archive_only_into_the_target_folder(released, tmp_path):
    _, key, bundle = released
    archive = bundle / "modelyard-host-1.0.0.tar.gz"
    summary = verify(archive, pubkey=f"{key}.pub", into=tmp_path / "board")
    dest = tmp_path / "board" / "modelyard-host-1.0.0"
    assert f"unpacked into {dest}" in summary
    assert sorted(p.name for p in (tmp_path / "board").iterdir()) == ["modelyard-host-1.0.0"]
    assert (dest / VMFB).read_bytes() == (bundle / VMFB).read_bytes()
    assert "files match" in verify(dest, pubkey=f"{key}.pub")
    # no program in a runtime=0 bundle: every file 0644 in the archive, the folder and unpacked
    files = [p for p in dest.rglob("*") if p.is_file()]
    assert {m.mode for m in members(archive)} == {0o644}
    assert {p.stat().st_mode & 0o7777 for p in files} == {0o644}, [(p, oct(p.stat().st_mode)) for p in files]
    assert {p.stat().st_mode & 0o7777 for p in bundle.rglob("*") if p.is_file()} == {0o644}
    with pytest.raises(PipelineError, match="already exists: nothing was unpacked"):
        verify(archive, pubkey=f"{key}.pub", into=tmp_path / "board")


# ----------------------------------------------------------------------------- tampering
def test_flipped_byte_in_a_released_artifact_fails_verify_naming_that_file(released, tmp_path):
    ws, key, bundle = released
    copy = tmp_path / "copy"
    shutil.copytree(bundle, copy)
    flip_byte(copy / VMFB)
    result = ws.doit("verify", f"bundle={copy}", f"pubkey={key}.pub")
    assert result.returncode != 0
    problems = [l for l in out(result).splitlines() if l.startswith("  - ")]
    assert problems == [f"  - {VMFB}: sha256 {sha256(copy / VMFB)} (" +
                        f"{(copy / VMFB).stat().st_size} bytes) does not match the manifest's "
                        f"{sha256(bundle / VMFB)} ({(bundle / VMFB).stat().st_size} bytes)"], out(result)
    assert "[target=host stage=verify]" in out(result) and "Traceback" not in out(result)

    # the same byte flipped inside a re-packed archive, and a signed manifest edited by hand
    unpacked = tmp_path / "unpacked"
    extract(bundle / "modelyard-host-1.0.0.tar.gz", unpacked)
    inner = unpacked / "modelyard-host-1.0.0"
    flip_byte(inner / VMFB)
    repacked = tmp_path / "repacked.tar.gz"
    names = [p.relative_to(inner).as_posix() for p in inner.rglob("*") if p.is_file()]
    release.write_archive(inner, names, "modelyard-host-1.0.0", release.DEFAULT_EPOCH, repacked)
    with pytest.raises(PipelineError) as info:
        verify(repacked, pubkey=f"{key}.pub")
    assert f"  - {VMFB}: sha256 {sha256(inner / VMFB)}" in info.value.what
    manifest = inner / "manifest.json"
    manifest.write_text(manifest.read_text().replace(sha256(bundle / VMFB), sha256(inner / VMFB)))
    with pytest.raises(PipelineError, match="manifest.json: the signature of key [0-9a-f]{16} does "
                                            "not match the signed bytes"):
        verify(inner, pubkey=f"{key}.pub")


def test_verify_pins_the_signing_key(released, tmp_path, monkeypatch):
    _, key, bundle = released
    other = tmp_path / "other-test-key.pem"
    signing.generate(other)
    with pytest.raises(PipelineError) as info:
        verify(bundle, pubkey=f"{other}.pub")
    text = info.value.what
    for name in ("manifest.json", "modelyard-host-1.0.0.tar.gz: manifest.json", "provenance.intoto.jsonl"):
        assert f"  - {name}: signed by key " in text and "not by the expected key" in text, text
    monkeypatch.setenv(signing.ENV_PUBKEY, f"{key}.pub")
    assert "signed by the expected key" in verify(bundle)


def test_verify_requires_a_pinned_key_unless_integrity_only(released, tmp_path, monkeypatch):
    """Scripts read exit codes: without a pinned key (pubkey=, $MODELYARD_VERIFY_KEY, verify_key
    in pyproject.toml) verify fails, unless integrity_only=1 says that integrity alone is wanted."""
    ws, key, bundle = released
    monkeypatch.delenv(signing.ENV_PUBKEY, raising=False)
    refused = ws.doit("verify", f"bundle={bundle}")
    text = out(refused)
    assert refused.returncode != 0 and "Traceback" not in text
    assert (f"[stage=verify] no key is pinned, so nothing says who must have signed {bundle}: "
            f"checked against the key it names itself, a bundle anyone re-signed would pass; "
            f"nothing was checked\n  next: pin the key the releases are signed with: pubkey=PATH, "
            f"or $MODELYARD_VERIFY_KEY=PATH, or verify_key = \"PATH\" in the [tool.modelyard] "
            f"table of pyproject.toml") in text, text
    assert "integrity_only=1" in text and "files match" not in text

    loose = ws.doit("verify", f"bundle={bundle}", "integrity_only=1")
    assert loose.returncode == 0, out(loose)
    assert "files match the signed manifest of host 1.0.0" in loose.stdout
    assert "INTEGRITY ONLY (integrity_only=1, no key pinned): who signed it was NOT checked" \
        in loose.stdout and "signed by the expected key" not in loose.stdout

    # a pinned key is checked even with integrity_only=1
    other = tmp_path / "other-test-key.pem"
    signing.generate(other)
    wrong = ws.doit("verify", f"bundle={bundle}", f"pubkey={other}.pub", "integrity_only=1")
    assert wrong.returncode != 0 and "not by the expected key" in out(wrong)
    monkeypatch.setenv(signing.ENV_PUBKEY, f"{key}.pub")
    pinned = ws.doit("verify", f"bundle={bundle}")
    assert pinned.returncode == 0 and "signed by the expected key" in pinned.stdout, out(pinned)

    # the project's pyproject.toml: [tool.modelyard] verify_key, relative to that file's folder
    monkeypatch.delenv(signing.ENV_PUBKEY)
    project_dir = tmp_path / "project"
    (project_dir / "keys").mkdir(parents=True)
    shutil.copy(f"{key}.pub", project_dir / "keys" / "release.pub")
    (project_dir / "pyproject.toml").write_text('[tool.modelyard]\nverify_key = "keys/release.pub"\n')
    monkeypatch.chdir(project_dir)
    assert "signed by the expected key" in verify(bundle)
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "keys").mkdir(parents=True)
    shutil.copy(f"{other}.pub", elsewhere / "keys" / "release.pub")
    (elsewhere / "pyproject.toml").write_text('[tool.modelyard]\nverify_key = "keys/release.pub"\n')
    monkeypatch.chdir(elsewhere)
    with pytest.raises(PipelineError, match="signed by key [0-9a-f]{16}, not by the expected key"):
        verify(bundle)


def test_truncated_archive_is_a_clear_error(released, tmp_path):
    ws, key, bundle = released
    data = (bundle / "modelyard-host-1.0.0.tar.gz").read_bytes()
    for cut in (len(data) // 2, len(data) - 4, 5):
        short = tmp_path / f"cut{cut}.tar.gz"
        short.write_bytes(data[:cut])
        with pytest.raises(PipelineError, match="the archive is truncated or damaged"):
            verify(short, pubkey=f"{key}.pub")
    result = ws.doit("verify", f"bundle={short}", f"pubkey={key}.pub", f"into={tmp_path / 'board'}")
    assert result.returncode != 0 and "truncated or damaged" in result.stdout
    assert "Traceback" not in out(result) and not (tmp_path / "board").exists()


def _evil_archive(path: Path, good: Path) -> None:
    """The good archive's entries plus a `..` entry, an absolute path, a symlink and a hard link."""
    with tarfile.open(good, "r:gz") as src, tarfile.open(path, "w:gz") as tar:
        for member in src:
            tar.addfile(member, src.extractfile(member))
        for name in ("modelyard-host-1.0.0/../../evil.txt", "/tmp/modelyard-abs-evil.txt"):
            info = tarfile.TarInfo(name)
            info.size = 5
            tar.addfile(info, io.BytesIO(b"evil\n"))
        link = tarfile.TarInfo("modelyard-host-1.0.0/models/passwd")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(link)
        hard = tarfile.TarInfo("modelyard-host-1.0.0/hard")
        hard.type, hard.linkname = tarfile.LNKTYPE, "modelyard-host-1.0.0/manifest.json"
        tar.addfile(hard)


def test_archive_with_traversal_or_links_is_refused_and_nothing_is_written(released, tmp_path):
    _, key, bundle = released
    evil = tmp_path / "evil.tar.gz"
    _evil_archive(evil, bundle / "modelyard-host-1.0.0.tar.gz")
    board = tmp_path / "deep" / "board"
    with pytest.raises(PipelineError) as info:
        verify(evil, pubkey=f"{key}.pub", into=board)
    text = info.value.what
    for expected in ("modelyard-host-1.0.0/../../evil.txt: the path leaves the bundle's top folder",
                     "/tmp/modelyard-abs-evil.txt: the path leaves the bundle's top folder",
                     "modelyard-host-1.0.0/models/passwd: a symbolic link: bundles hold regular files only",
                     "modelyard-host-1.0.0/hard: a hard link: bundles hold regular files only"):
        assert f"  - {expected}" in text, text
    assert not board.exists() and not (tmp_path / "evil.txt").exists()
    assert not Path("/tmp/modelyard-abs-evil.txt").exists()

    # a symlink placed in a release folder is refused too, not followed
    copy = tmp_path / "copy"
    shutil.copytree(bundle, copy)
    (copy / "models" / "alpha-link").symlink_to("/etc/passwd")
    with pytest.raises(PipelineError, match="models/alpha-link: a symbolic link"):
        verify(copy, pubkey=f"{key}.pub")


# ----------------------------------------------------------------------------- refusals
def test_a_released_version_is_never_rewritten(tmp_path):
    ws = tiny_workspace(tmp_path / "ws")
    key = tmp_path / "test-key.pem"
    signing.generate(key)
    do_release(ws, "host", "1.0.0", key)
    bundle = ws.artifacts / "releases" / "host" / "1.0.0"
    before = {p: sha256(p) for p in bundle.rglob("*") if p.is_file()}
    again = do_release(ws, "host", "1.0.0", key)
    assert "unchanged: host 1.0.0 is already released with this content" in again.stdout

    # new weights, same version: refused, naming what differs; the release is untouched
    model = ws.models / "alpha" / "model.onnx"
    old_sha = sha256(model)
    tiny_onnx(model, seed=7)
    spec = ws.models / "alpha" / "model.yaml"
    spec.write_text(spec.read_text().replace(old_sha, sha256(model)))
    refused = do_release(ws, "host", "1.0.0", key, check=False)
    assert refused.returncode != 0
    assert "[target=host stage=release] version 1.0.0 of host is already released with other " \
           "content" in refused.stdout
    assert VMFB in refused.stdout and "release under a new version number" in refused.stdout
    assert {p: sha256(p) for p in bundle.rglob("*") if p.is_file()} == before
    assert not any((ws.artifacts / ".tmp").glob("*/release/*"))  # .tmp/<pid>/release/<step>
    do_release(ws, "host", "1.1.0", key)
    assert sorted(p.name for p in bundle.parent.iterdir()) == ["1.0.0", "1.1.0"]


def test_a_version_signed_by_another_key_is_not_reported_unchanged(released, tmp_path, monkeypatch):
    """Re-releasing an existing version verifies the bundle on disk against the public half of
    the signing key given (its own pin), never against the key the bundle names."""
    ws, key, bundle = released
    monkeypatch.delenv(signing.ENV_PUBKEY, raising=False)
    other = tmp_path / "other-test-key.pem"
    signing.generate(other)
    before = {p: sha256(p) for p in bundle.rglob("*") if p.is_file()}
    with pytest.raises(PipelineError) as info:
        release.run(project(ws), "host", "1.0.0", str(other), with_runtime=False)
    old, new = signing.key_id(signing.load_private_key(str(key)).public_key()), \
        signing.key_id(signing.load_private_key(str(other)).public_key())
    assert info.value.what == (f"version 1.0.0 of host is already released with this content, "
                               f"but signed by key {old[:16]}, not by this key {new[:16]}; a "
                               f"release is never re-signed")
    assert info.value.stage == "release" and info.value.target == "host"
    assert {p: sha256(p) for p in bundle.rglob("*") if p.is_file()} == before
    assert "unchanged: host 1.0.0" in release.run(project(ws), "host", "1.0.0", str(key), with_runtime=False)


def test_bad_version_or_key_is_a_clear_error_and_writes_nothing(released, tmp_path, monkeypatch):
    ws, key, _ = released
    monkeypatch.delenv(signing.ENV_KEY, raising=False)
    proj = project(ws)
    for version in ("1.0", "v1.0.0", "01.0.0", "1.0.0/../../x", ""):
        with pytest.raises(PipelineError, match="is not a semantic version") as info:
            release.run(proj, "host", version, str(key), with_runtime=False)
        assert info.value.target == "host" and info.value.stage == "release"
    result = do_release(ws, "host", "2.0.0", None, check=False)
    assert result.returncode != 0 and "Traceback" not in out(result)
    assert "[target=host stage=release] no signing key: give key=PATH or set MODELYARD_SIGNING_KEY" \
           in result.stdout and "doit keygen key=PATH" in result.stdout
    with pytest.raises(PipelineError, match="cannot read the signing key .*nowhere.pem"):
        release.run(proj, "host", "2.0.0", str(tmp_path / "nowhere.pem"), with_runtime=False)
    (tmp_path / "public-only.pem").write_bytes(Path(f"{key}.pub").read_bytes())
    with pytest.raises(PipelineError, match="is not an unencrypted PEM private key"):
        release.run(proj, "host", "2.0.0", str(tmp_path / "public-only.pem"), with_runtime=False)
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "yesterday")
    with pytest.raises(PipelineError, match="SOURCE_DATE_EPOCH='yesterday' is not a whole number"):
        release.run(proj, "host", "2.0.0", str(key), with_runtime=False)
    assert sorted(p.name for p in (ws.artifacts / "releases" / "host").iterdir()) == ["1.0.0"]

    # the key may also come from the environment, as PEM text; SOURCE_DATE_EPOCH sets the mtimes
    monkeypatch.setenv(signing.ENV_KEY, key.read_text())
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    assert "released host 2.0.0" in release.run(proj, "host", "2.0.0", None, with_runtime=False)
    archive = ws.artifacts / "releases/host/2.0.0/modelyard-host-2.0.0.tar.gz"
    assert {m.mtime for m in members(archive)} == {1700000000}
    assert "signed by the expected key" in verify(archive, pubkey=f"{key}.pub")


def test_unvalidated_artifact_is_refused_unless_the_spec_waives_it(released, tmp_path):
    ws, key, _ = released
    copy, build = unreleased_copy(ws, tmp_path)
    doc = json.loads(build.read_text())
    doc["models"]["alpha"]["artifacts"]["cpu-x86_64"]["validation"]["status"] = "twin-passed"
    build.write_text(json.dumps(doc))

    with pytest.raises(PipelineError) as info:
        release.run(project(copy), "host", "3.0.0", str(key), with_runtime=False)
    assert "1 artifact(s) may not ship, nothing was released" in info.value.what
    assert "alpha/cpu-x86_64: validation status 'twin-passed', not 'passed'" in info.value.what
    assert "waivers: [{abi: NAME, status: twin-passed" in info.value.hint
    assert not (tmp_path / "artifacts" / "releases").exists()

    spec = copy.models / "alpha" / "model.yaml"
    spec.write_text(spec.read_text() + "  waivers:\n    - {abi: cpu-x86_64, status: twin-passed, "
                                       "reason: checked through the llvmpipe twin}\n")
    assert "waivers: alpha/cpu-x86_64 (twin-passed)" in release.run(project(copy), "host", "3.0.0",
                                                                    str(key), with_runtime=False)
    bundle = tmp_path / "artifacts" / "releases" / "host" / "3.0.0"
    waiver = {"model": "alpha", "abi": "cpu-x86_64", "target": "host", "status": "twin-passed",
              "reason": "checked through the llvmpipe twin"}
    assert json.loads((bundle / "manifest.json").read_text())["waivers"] == [waiver]
    shipped = json.loads((bundle / "release.json").read_text())["models"]["alpha"]["artifacts"]
    assert shipped["cpu-x86_64"]["waiver"] == waiver
    assert shipped["cpu-x86_64"]["validation"]["status"] == "twin-passed"


def test_release_section_of_the_spec_is_checked_strictly(tmp_path):
    models = tmp_path / "models"
    spec = add_tiny_model(models, "a")
    spec.write_text(spec.read_text() + "release:\n  waiver: []\n  waivers:\n    - {abi: cpu, why: x}\n"
                    "  io:\n    z: {layout: NCHW}\n    x: {layout: NCHW, postprocessing: softmax}\n")
    with pytest.raises(SpecError) as info:
        load_models(models)
    text = "\n".join(info.value.problems)
    for expected in ("release: unknown key 'waiver' (allowed: io, waivers)",
                     "release.waivers[0]: unknown key 'why'",
                     "release.waivers[0].reason: required, a non-empty string",
                     "release.io.z: the model has no input or output named 'z' (it has: x, y)",
                     "release.io.x: unknown key 'postprocessing' (allowed: layout, preprocessing)"):
        assert expected in text, text
    assert len(info.value.problems) == 5, text


def test_release_carries_the_bench_figures_of_the_released_bytes(released, tmp_path):
    ws, key, _ = released
    shutil.copytree(ws.models, tmp_path / "models")
    shutil.copytree(ws.artifacts, tmp_path / "artifacts", ignore=shutil.ignore_patterns("releases"))
    copy = Workspace(tmp_path)
    bench = copy.doit("bench", "target=host", "iterations=20", "seconds=5", "warmup=1")
    assert bench.returncode == 0, out(bench)
    do_release(copy, "host", "1.1.0", key)
    doc = json.loads((copy.artifacts / "releases/host/1.1.0/release.json").read_text())
    figures = doc["models"]["alpha"]["artifacts"]["cpu-x86_64"]["benchmark"]
    assert figures["status"] == "measured" and figures["n"] == 20
    assert 0 < figures["p50_ms"] <= figures["p90_ms"] <= figures["p99_ms"]
    assert figures["ratio_to_onnxruntime"] > 0 and figures["measured_on"]


# ----------------------------------------------------------------------------- what verify says
def headline(result) -> str:
    """The first line of the error doit printed: '[where] what' (after any 'modelyard: ')."""
    lines = [l.removeprefix("modelyard: ") for l in out(result).splitlines()]
    return next((l for l in lines if l.startswith("[")), out(result))


def test_each_verify_failure_is_one_clear_error(released, tmp_path):
    """What a firmware engineer meets: a damaged download, a hand-edited manifest, the wrong key,
    a wrong path. Each: exit status non-zero, one paragraph naming what failed, no traceback."""
    ws, key, bundle = released
    archive = bundle / "modelyard-host-1.0.0.tar.gz"
    pub = f"{key}.pub"
    other = tmp_path / "other-test-key.pem"
    signing.generate(other)

    def verify_cli(*args):
        result = ws.doit("verify", *args)
        assert result.returncode != 0 and "Traceback" not in out(result), out(result)
        return result

    # one byte flipped in the archive: in the compressed data, in the gzip trailer (CRC, size)
    data = archive.read_bytes()
    for offset in (len(data) // 2, len(data) - 6, len(data) - 2):
        bad = tmp_path / f"flipped-{offset}.tar.gz"
        bad.write_bytes(data)
        flip_byte(bad, offset)
        result = verify_cli(f"bundle={bad}", f"pubkey={pub}", f"into={tmp_path / 'board'}")
        assert headline(result).startswith(f"[stage=verify] {bad}: the archive is truncated or "
                                           f"damaged ("), out(result)
        assert "  next: copy or download it again and compare its sha256 with the release's " \
               "provenance" in out(result)
        assert not (tmp_path / "board").exists()

    # the signed manifest edited by hand (a size changed): the signature no longer matches
    copy = tmp_path / "edited"
    shutil.copytree(bundle, copy)
    manifest = copy / "manifest.json"
    size = (bundle / VMFB).stat().st_size
    manifest.write_text(manifest.read_text().replace(f'"size": {size}', f'"size": {size + 1}', 1))
    result = verify_cli(f"bundle={copy}", f"pubkey={pub}")
    assert headline(result) == f"[target=host stage=verify] {copy} failed verification, 3 problem(s):"
    problems = [l for l in out(result).splitlines() if l.startswith("  - ")]
    sha = sha256(bundle / VMFB)
    assert problems == [
        "  - manifest.json: the signature of key "
        f"{signing.key_id(signing.load_public_key(pub))[:16]} does not match the signed bytes",
        f"  - {VMFB}: sha256 {sha} ({size} bytes) does not match the manifest's {sha} ({size + 1} "
        f"bytes)",
        "  - modelyard-host-1.0.0.tar.gz: holds another manifest than the folder's"], out(result)

    # the wrong public key: another key's, a file that is no key, a file that is not there
    result = verify_cli(f"bundle={archive}", f"pubkey={other}.pub")
    assert headline(result) == f"[target=host stage=verify] {archive} failed verification, 1 problem(s):"
    assert "  - manifest.json: signed by key " in out(result) and "not by the expected key" in out(result)
    result = verify_cli(f"bundle={archive}", f"pubkey={bundle / 'release.json'}")
    assert headline(result).startswith(f"[stage=verify] {bundle / 'release.json'} is not a PEM "
                                       f"Ed25519 key: "), out(result)
    result = verify_cli(f"bundle={archive}", f"pubkey={tmp_path / 'nowhere.pub'}")
    assert headline(result) == (f"[stage=verify] cannot read the public key {tmp_path / 'nowhere.pub'}: "
                                f"No such file or directory"), out(result)

    # a bundle path that is not there
    result = verify_cli(f"bundle={tmp_path / 'nowhere.tar.gz'}", f"pubkey={pub}")
    assert headline(result) == f"[stage=verify] no bundle at {tmp_path / 'nowhere.tar.gz'}"
    assert "  next: give bundle=PATH: a release folder or its .tar.gz" in out(result)


# ----------------------------------------------------------------------------- never emptier
def test_a_manifest_with_no_model_is_refused(released, tmp_path):
    """A build manifest that lists no model, or only models without an artifact for the target
    (every ABI skipped): nothing to release, and the error says what to do."""
    ws, key, _ = released
    copy, build = unreleased_copy(ws, tmp_path)
    doc = json.loads(build.read_text())
    for models in ({}, {"alpha": {**doc["models"]["alpha"], "artifacts": {}}}):
        build.write_text(json.dumps({**doc, "models": models}))
        with pytest.raises(PipelineError) as info:
            release.run(project(copy), "host", "1.0.0", str(key), with_runtime=False)
        assert info.value.render() == (
            f"[target=host stage=release] the build manifest {build} lists no model with an "
            f"artifact to ship: a release of host would hold no model; nothing was released\n"
            f"  next: build the models first (`doit build target=host`), and check models=DIR: the "
            f"folder of model folders (default models/)")
    assert not (tmp_path / "artifacts" / "releases").exists()


def test_a_model_the_previous_release_shipped_is_dropped_only_with_drop(released, tmp_path):
    """1.0.5 (written here as an earlier release that also shipped `beta`) is the previous release
    of 1.1.0: 1.1.0 lacks beta, so it is refused unless drop=beta says so; the model without a
    license file is named in a warning."""
    ws, key, bundle = released
    shutil.copytree(ws.models, tmp_path / "models")
    shutil.copytree(ws.artifacts, tmp_path / "artifacts")
    copy = Workspace(tmp_path)
    earlier = json.loads((bundle / "release.json").read_text())
    earlier["models"]["beta"] = earlier["models"]["alpha"]
    (tmp_path / "artifacts/releases/host/1.0.5").mkdir()
    (tmp_path / "artifacts/releases/host/1.0.5/release.json").write_text(json.dumps(earlier))

    with pytest.raises(PipelineError) as info:
        release.run(project(copy), "host", "1.1.0", str(key), with_runtime=False)
    assert info.value.render() == (
        "[target=host stage=release] 1.1.0 would drop 1 model(s) that 1.0.5 shipped: beta; "
        "nothing was released\n  next: build them (`doit build target=host`; check models=DIR), "
        "or confirm that they go: drop=beta")
    with pytest.raises(PipelineError) as info:
        release.run(project(copy), "host", "1.1.0", str(key), with_runtime=False, drop="bta")
    assert info.value.what == ("drop=bta: not a model this release drops (models the previous "
                               "release 1.0.5 shipped and this one lacks: beta); nothing was released")
    assert not (tmp_path / "artifacts/releases/host/1.1.0").exists()

    confirmed = copy.doit("release", "target=host", "version=1.1.0", "runtime=0", f"key={key}", "drop=beta")
    assert confirmed.returncode == 0, out(confirmed)
    assert "  dropped since 1.0.5 (drop=): beta" in confirmed.stdout
    assert ("modelyard: warning: [target=host stage=release] 1 model(s) ship without a license file "
            "(licenses: [] in release.json): alpha; name each model's license under `license:` in "
            "its models/<model>/model.yaml") in confirmed.stderr.splitlines(), out(confirmed)
    doc = json.loads((tmp_path / "artifacts/releases/host/1.1.0/release.json").read_text())
    assert doc["dropped"] == {"previous": "1.0.5", "models": ["beta"]} and list(doc["models"]) == ["alpha"]
