"""release/deb.py on a small staged release folder made here (no build, no toolchain): the
packages' layout, control fields, modes and owners, md5sums, the ar/tar structure dpkg reads,
byte-reproducibility, and the signed package list. The real packages of the default models'
rk3588 release, installed in an arm64 Debian root filesystem: tests/e2e/test_debian_packages.py."""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import lzma
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from conftest import require
from pipeline.core.errors import PipelineError
from pipeline.core.layout import Layout
from pipeline.core.store import pretty_json
from pipeline.release import deb, signing
from pipeline.release.verify import MANIFEST, SIGNATURE

EPOCH = 1700000000
ELF_LIB = b"\x7fELF" + b"\x00" * 60 + b"libc.so.6\x00GLIBC_2.17\x00GLIBC_2.34\x00libstdc++.so.6\x00"
ELF_EXE = b"\x7fELF" + b"\x00" * 60 + b"libmodelyard.so\x00libc.so.6\x00GLIBC_2.17\x00"


def staged_release(folder: Path, key, version: str = "1.2.0", npu: bool = True) -> Path:
    """The files release.py stages for an rk3588 release with one model (CPU + NPU artifacts)."""
    files = {
        "release.json": None, "build-manifest.json": b"{}\n", "sbom.cdx.json": b"{}\n",
        "models/alpha/cpu-aarch64/model.vmfb": b"vmfb" * 100,
        "models/alpha/npu/model.rknn": b"rknn" * 10,
        "tests/alpha/input_0.npy": b"in", "tests/alpha/output_0.npy": b"out",
        "licenses/alpha/LICENSE": b"MIT\n",
        "runtime/aarch64/lib/libmodelyard.so": ELF_LIB,
        "runtime/aarch64/lib/pkgconfig/modelyard.pc": b"libdir=${pcfiledir}/..\n",
        "runtime/aarch64/lib/cmake/modelyard/modelyardConfig.cmake": b"# cmake\n",
        "runtime/aarch64/bin/modelyard-run": ELF_EXE,
        "runtime/aarch64/bin/modelyard-example": ELF_EXE,
        "runtime/include/modelyard.h": b"/* api */\n",
        "runtime/licenses/iree-LICENSE": b"Apache-2.0\n",
    }
    artifacts = {"cpu-aarch64": {"file": "models/alpha/cpu-aarch64/model.vmfb", "format": "vmfb",
                                 "requires": {"arch": "aarch64", "device": "CPU"}}}
    if npu:
        artifacts["npu"] = {"file": "models/alpha/npu/model.rknn", "format": "rknn",
                            "requires": {"npu": {"librknnrt": "2.5.0"}, "device": "NPU"}}
    doc = {"target": {"name": "rk3588"}, "models": {"alpha": {"artifacts": artifacts}},
           "runtime": {"aarch64": {"iree": {"commit": "b48a5955575cf8924ffc191f3b0804976e5738b9",
                                            "hal_module_version": 7}, "tvm_runtime": "0.27.0",
                                   "third_party": [{"name": "iree-runtime", "version": "3.13",
                                                    "spdx": "Apache-2.0"}]}}}
    files["release.json"] = pretty_json(doc).encode()
    for name, data in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    (folder / "runtime/aarch64/bin/modelyard-run").chmod(0o755)
    manifest = {"target": "rk3588", "version": version, "source_date_epoch": EPOCH,
                "files": {n: {"sha256": hashlib.sha256(d).hexdigest(), "size": len(d)}
                          for n, d in sorted(files.items())}}
    data = pretty_json(manifest).encode()
    (folder / MANIFEST).write_bytes(data)
    (folder / SIGNATURE).write_text(pretty_json(signing.sign(key, data)))
    return folder


@pytest.fixture(scope="module")
def key():
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    return Ed25519PrivateKey.from_private_bytes(bytes(range(32)))


def read_deb(path: Path) -> dict:
    """{member name: bytes} of the ar archive, checking its headers as dpkg does."""
    data = path.read_bytes()
    assert data[:8] == b"!<arch>\n"
    pos, out = 8, {}
    while pos < len(data):
        head = data[pos:pos + 60]
        name, mtime, uid, gid, mode, size = (head[0:16], head[16:28], head[28:34], head[34:40],
                                             head[40:48], head[48:58])
        assert head[58:60] == b"`\n" and int(mtime) == EPOCH and int(uid) == int(gid) == 0
        assert mode.strip() == b"100644"
        size = int(size)
        out[name.decode().strip()] = data[pos + 60:pos + 60 + size]
        pos += 60 + size + size % 2
    assert list(out) == ["debian-binary", "control.tar.xz", "data.tar.xz"]
    assert out["debian-binary"] == b"2.0\n"
    return out


def members(blob: bytes) -> list[tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(lzma.decompress(blob))) as tar:
        return tar.getmembers()


def extract(blob: bytes, name: str) -> bytes:
    with tarfile.open(fileobj=io.BytesIO(lzma.decompress(blob))) as tar:
        return tar.extractfile(name).read()


def control(path: Path) -> dict:
    text = extract(read_deb(path)["control.tar.xz"], "./control").decode()
    fields, last = {}, None
    for line in text.splitlines():
        if line.startswith(" "):
            fields[last] += "\n" + line
        else:
            last, value = line.split(": ", 1)
            fields[last] = value
    fields["Description"] = " ".join(line.strip() for line in fields["Description"].splitlines())
    return fields


@pytest.fixture(scope="module")
def built(tmp_path_factory, key) -> Path:
    root = tmp_path_factory.mktemp("deb")
    release = staged_release(root / "release", key)
    out = root / "out"
    deb.write_all(release, out, key)
    return out


def test_debian_version_sorts_like_semver():
    cases = [("1.2.0", "1.2.0"), ("2.0.0-rc.1", "2.0.0~rc.1"), ("1.0.0+build.5", "1.0.0+build.5"),
             ("1.0.0-alpha+b7", "1.0.0~alpha+b7"), ("1.0.0-rc-1", "1.0.0~rc-1-1")]
    for semver, want in cases:
        assert deb.debian_version(semver) == want
    if shutil.which("dpkg") is None:
        return
    order = ["1.0.0-alpha", "1.0.0-rc.1", "1.0.0", "1.0.1", "1.10.0"]
    for lower, higher in zip(order, order[1:]):
        r = subprocess.run(["dpkg", "--compare-versions", deb.debian_version(lower), "lt",
                            deb.debian_version(higher)])
        assert r.returncode == 0, (lower, higher)


def test_formats_are_checked():
    assert deb.formats(None) == ("tar",) and deb.formats("tar,deb") == ("tar", "deb")
    assert deb.formats("deb") == ("deb",)
    with pytest.raises(PipelineError, match="unknown rpm"):
        deb.formats("deb,rpm")
    with pytest.raises(PipelineError, match="runtime=0 leaves it out"):
        deb.formats("deb", with_runtime=False)


def test_four_packages_with_their_files_modes_and_owners(built):
    names = sorted(p.name for p in built.glob("*.deb"))
    assert names == ["libmodelyard-dev_1.2.0_arm64.deb", "libmodelyard0_1.2.0_arm64.deb",
                     "modelyard-models-rk3588_1.2.0_arm64.deb", "modelyard-tools_1.2.0_arm64.deb"]
    contents = {}
    for name in names:
        ms = members(read_deb(built / name)["data.tar.xz"])
        assert ms[0].name == "." and ms[0].isdir()  # "./" in the archive (tarfile drops the /)
        assert [m.name.split("/") for m in ms] == sorted(m.name.split("/") for m in ms)
        for m in ms:
            assert (m.uid, m.gid, m.uname, m.gname, m.mtime) == (0, 0, "root", "root", EPOCH), m.name
            assert m.mode == (0o755 if m.isdir() or m.name == "./usr/bin/modelyard-run" else 0o644), m.name
        dirs = {m.name for m in ms if m.isdir()}
        for m in ms[1:]:  # every folder above a file is an entry of its own
            assert m.name.rsplit("/", 1)[0] in dirs, m.name
        package = name.split("_")[0]
        changelog = f"./usr/share/doc/{package}/changelog.gz"
        assert changelog in {m.name for m in ms}
        contents[package] = {m.name for m in ms if m.isfile()} - {changelog}
    assert contents["libmodelyard0"] == {
        "./usr/lib/aarch64-linux-gnu/libmodelyard.so",
        "./usr/share/doc/libmodelyard0/licenses/iree-LICENSE", "./usr/share/doc/libmodelyard0/copyright"}
    assert contents["libmodelyard-dev"] == {
        "./usr/include/modelyard.h", "./usr/lib/aarch64-linux-gnu/pkgconfig/modelyard.pc",
        "./usr/lib/aarch64-linux-gnu/cmake/modelyard/modelyardConfig.cmake",
        "./usr/share/doc/libmodelyard-dev/examples/example.c", "./usr/share/doc/libmodelyard-dev/copyright"}
    assert contents["modelyard-tools"] == {"./usr/bin/modelyard-run", "./usr/share/doc/modelyard-tools/copyright"}
    root = "./usr/lib/modelyard/rk3588/"
    assert contents["modelyard-models-rk3588"] == {root + n for n in (
        "release.json", "build-manifest.json", "sbom.cdx.json", MANIFEST, SIGNATURE,
        "models/alpha/cpu-aarch64/model.vmfb", "models/alpha/npu/model.rknn", "tests/alpha/input_0.npy",
        "tests/alpha/output_0.npy", "licenses/alpha/LICENSE")} | {
        "./usr/share/doc/modelyard-models-rk3588/copyright"}
    # the release's own bytes, unchanged (what the signed manifest lists)
    release = built.parent / "release"
    blob = read_deb(built / "modelyard-models-rk3588_1.2.0_arm64.deb")["data.tar.xz"]
    assert extract(blob, root + SIGNATURE) == (release / SIGNATURE).read_bytes()
    assert extract(blob, root + "models/alpha/cpu-aarch64/model.vmfb") == b"vmfb" * 100


def test_control_fields(built):
    lib = control(built / "libmodelyard0_1.2.0_arm64.deb")
    assert (lib["Package"], lib["Version"], lib["Architecture"], lib["Multi-Arch"], lib["Section"]) == \
        ("libmodelyard0", "1.2.0", "arm64", "same", "libs")
    assert lib["Depends"] == "libc6 (>= 2.34), libstdc++6"  # the newest GLIBC_ symbol version wins
    assert lib["Recommends"] == "libvulkan1" and "HAL module version 7" in lib["Description"]
    assert int(lib["Installed-Size"]) >= 1 and lib["Maintainer"]
    triggers = extract(read_deb(built / "libmodelyard0_1.2.0_arm64.deb")["control.tar.xz"], "./triggers")
    assert triggers == b"activate-noawait ldconfig\n"
    tools = control(built / "modelyard-tools_1.2.0_arm64.deb")
    assert tools["Depends"] == "libmodelyard0 (= 1.2.0), libc6 (>= 2.17)"
    dev = control(built / "libmodelyard-dev_1.2.0_arm64.deb")
    assert dev["Depends"] == "libmodelyard0 (= 1.2.0)" and "No static library is built" in dev["Description"]
    models = control(built / "modelyard-models-rk3588_1.2.0_arm64.deb")
    assert models["Depends"] == "libmodelyard0 (= 1.2.0)" and models["Suggests"] == "librknnrt (>= 2.5.0)"
    assert "librknnrt 2.5.0 on the board: it is not packaged here" in models["Description"]
    assert "Recommends" not in models  # no Vulkan artifact in this release


def test_descriptions_fit_and_changelogs_are_dated(built):
    path = built / "libmodelyard0_1.2.0_arm64.deb"
    text = extract(read_deb(path)["control.tar.xz"], "./control").decode()
    assert all(len(line) <= 80 for line in text.splitlines()), text
    log = gzip.decompress(extract(read_deb(path)["data.tar.xz"], "./usr/share/doc/libmodelyard0/changelog.gz"))
    assert log.decode().startswith("libmodelyard0 (1.2.0) unstable; urgency=medium\n")
    assert "Tue, 14 Nov 2023 22:13:20 +0000" in log.decode()  # EPOCH, not the clock


def test_md5sums_match_the_data(built):
    for path in built.glob("*.deb"):
        parts = read_deb(path)
        sums = extract(parts["control.tar.xz"], "./md5sums").decode().splitlines()
        with tarfile.open(fileobj=io.BytesIO(lzma.decompress(parts["data.tar.xz"]))) as tar:
            want = [f"{hashlib.md5(tar.extractfile(m).read()).hexdigest()}  {m.name[2:]}"
                    for m in tar.getmembers() if m.isfile()]
        assert sums == sorted(want, key=lambda l: l.split("  ")[1]), path.name


def test_two_builds_are_byte_identical(tmp_path, key, built):
    """Another folder, other file mtimes, another umask and clock: the same bytes."""
    release = staged_release(tmp_path / "elsewhere" / "release", key)
    for p in release.rglob("*"):
        os.utime(p, (1, 1))
    old = os.umask(0o077)
    try:
        deb.write_all(release, tmp_path / "out", key)
    finally:
        os.umask(old)
    for name in [*sorted(p.name for p in built.glob("*.deb")), deb.LIST, deb.LIST_SIGNATURE, deb.SUMS]:
        assert (tmp_path / "out" / name).read_bytes() == (built / name).read_bytes(), name


def test_the_signed_list_and_its_checks(built, key, tmp_path):
    doc = json.loads((built / deb.LIST).read_text())
    release = built.parent / "release"
    assert doc["release_manifest_sha256"] == hashlib.sha256((release / MANIFEST).read_bytes()).hexdigest()
    assert doc["source_date_epoch"] == EPOCH and doc["debian_version"] == "1.2.0"
    for name, meta in doc["packages"].items():
        assert hashlib.sha256((built / name).read_bytes()).hexdigest() == meta["sha256"]
    sums = (built / deb.SUMS).read_text().splitlines()
    assert sums == [f"{m['sha256']}  {n}" for n, m in sorted(doc["packages"].items())]
    assert deb.problems(built, key.public_key()) == []
    copy = shutil.copytree(built, tmp_path / "copy")
    victim = copy / "modelyard-tools_1.2.0_arm64.deb"
    victim.write_bytes(victim.read_bytes()[:-1] + b"\x00")
    (copy / "extra_1_arm64.deb").write_bytes(b"x")
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    other = Ed25519PrivateKey.from_private_bytes(bytes(32))
    found = deb.problems(copy, other.public_key())
    assert any(p.startswith(f"{deb.LIST}: ") for p in found), found
    assert "modelyard-tools_1.2.0_arm64.deb: sha256/size differ from packages.json's" in found
    assert "extra_1_arm64.deb: not listed in packages.json" in found


def test_run_is_immutable(tmp_path, key):
    layout = Layout(tmp_path / "artifacts")
    release = staged_release(tmp_path / "release", key)
    first = deb.run(layout, release, key, stage="release", target="rk3588")
    assert "Debian packages ->" in first and "modelyard-models-rk3588_1.2.0_arm64.deb (" in first
    assert "unchanged" in deb.run(layout, release, key, stage="release", target="rk3588")
    (release / "models/alpha/cpu-aarch64/model.vmfb").write_bytes(b"other")
    manifest = json.loads((release / MANIFEST).read_text())
    manifest["files"]["models/alpha/cpu-aarch64/model.vmfb"]["size"] = 5
    (release / MANIFEST).write_text(pretty_json(manifest))
    with pytest.raises(PipelineError, match="packages are never rewritten"):
        deb.run(layout, release, key, stage="release", target="rk3588")


def test_dpkg_deb_reads_them(built):
    require(shutil.which("dpkg-deb") is not None, "dpkg-deb missing (Debian's dpkg)")
    path = built / "modelyard-tools_1.2.0_arm64.deb"
    info = subprocess.run(["dpkg-deb", "--info", str(path)], capture_output=True, text=True, check=True).stdout
    assert "Package: modelyard-tools" in info and "Architecture: arm64" in info
    listing = subprocess.run(["dpkg-deb", "--contents", str(path)], capture_output=True, text=True,
                             check=True).stdout
    assert "-rwxr-xr-x root/root" in listing and "./usr/bin/modelyard-run" in listing
    field = subprocess.run(["dpkg-deb", "--field", str(built / "libmodelyard0_1.2.0_arm64.deb"), "Depends"],
                           capture_output=True, text=True, check=True).stdout
    assert field.strip() == "libc6 (>= 2.34), libstdc++6"
