"""`doit release format=deb` as a firmware build takes it: the packages installed with dpkg into a
fresh arm64 Debian root filesystem (Debian's own packages, mmdebstrap), run there under qemu-user
through binfmt_misc (setup.sh registers it), then removed.

In the root filesystem: `modelyard-run --check` on every CPU artifact of the release, the example
of libmodelyard-dev cross-compiled against the installed pkg-config file and run there, the
installed release checked against its signed manifest, and `dpkg -r` leaving no file behind.
Here: a small model's rk3588 release (IREE and TVM artifacts, so the TVM plugin too); the default
models' rk3588 release goes through the same check at the end of
tests/e2e/test_default_models.py (it reuses that build: no second cold build of the default models).

The root filesystem is cached (ROOTFS_CACHE, a tarball per key) because making it takes minutes
under emulation. That is honest: the tarball holds only what mmdebstrap made from Debian's
packages for the key (suite, architecture, variant, package list, mmdebstrap's version), never one
of ours; each test unpacks a fresh copy, installs into it and throws it away; and it is made again
when older than ROOTFS_MAX_AGE, so Debian's updates reach it.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from conftest import REPO, Workspace, add_tiny_model, require, require_aarch64
from pipeline.release import deb, signing
from pipeline.release.verify import MANIFEST, SIGNATURE

SUITE, ARCH, VARIANT = "bookworm", "arm64", "apt"
INCLUDE: tuple[str, ...] = ()  # apt's minimal system: the example is cross-compiled, as an SDK does
ROOTFS_CACHE = Path(os.environ.get("MODELYARD_ROOTFS_CACHE",
                                   Path.home() / ".cache" / "modelyard" / "rootfs"))
ROOTFS_MAX_AGE = 14 * 86400
BINFMT = Path("/proc/sys/fs/binfmt_misc/qemu-aarch64")
# Not part of what a package leaves behind: dpkg's own records, its log, ld.so's cache
STATE = ("var/lib/dpkg/", "var/log/", "var/cache/ldconfig/", "etc/ld.so.cache", "proc/", "tmp/")


def require_rootfs_tools() -> None:
    require(os.geteuid() == 0, "the arm64 root filesystem test runs as root (chroot, mount)")
    require(shutil.which("mmdebstrap") is not None, "mmdebstrap missing (./setup.sh)")
    require(BINFMT.is_file() and re.search(r"^flags: .*F", BINFMT.read_text(), re.M) is not None,
            "qemu-aarch64 is not registered with binfmt_misc with flag F (./setup.sh says why)")


def rootfs_tarball() -> Path:
    """The cached arm64 Debian root filesystem (made once per key and per ROOTFS_MAX_AGE)."""
    version = subprocess.run(["mmdebstrap", "--version"], capture_output=True, text=True).stdout.strip()
    key = hashlib.sha256(json.dumps([SUITE, ARCH, VARIANT, sorted(INCLUDE), version]).encode()).hexdigest()
    ROOTFS_CACHE.mkdir(parents=True, exist_ok=True)
    tarball = ROOTFS_CACHE / f"{SUITE}-{ARCH}-{key[:16]}.tar"
    with open(ROOTFS_CACHE / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another xdist worker may be making it
        if tarball.is_file() and time.time() - tarball.stat().st_mtime < ROOTFS_MAX_AGE:
            return tarball
        partial = tarball.with_suffix(".partial.tar")
        partial.unlink(missing_ok=True)
        r = subprocess.run(["mmdebstrap", f"--arch={ARCH}", f"--variant={VARIANT}",
                            *([f"--include={','.join(INCLUDE)}"] if INCLUDE else []), SUITE, str(partial)],
                           capture_output=True, text=True, timeout=1800)
        assert r.returncode == 0, f"mmdebstrap failed:\n{r.stderr[-4000:]}"
        os.rename(partial, tarball)
    return tarball


class Rootfs:
    """A fresh copy of the cached root filesystem, /proc mounted, removed at exit."""

    def __init__(self, folder: Path):
        self.root = folder

    def __enter__(self) -> "Rootfs":
        self.root.mkdir(parents=True)
        subprocess.run(["tar", "-xf", str(rootfs_tarball()), "-C", str(self.root)], check=True)
        subprocess.run(["mount", "-t", "proc", "proc", str(self.root / "proc")], check=True)
        return self

    def __exit__(self, *exc) -> None:
        subprocess.run(["umount", "-l", str(self.root / "proc")], check=False)
        shutil.rmtree(self.root, ignore_errors=True)

    def run(self, *argv: str, check: bool = True, timeout: float = 900) -> subprocess.CompletedProcess:
        """argv inside the root filesystem (arm64 programs through binfmt_misc's qemu-aarch64)."""
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "LC_ALL": "C",
               "HOME": "/root", "DEBIAN_FRONTEND": "noninteractive"}
        r = subprocess.run(["chroot", str(self.root), *argv], capture_output=True, text=True,
                           env=env, timeout=timeout)
        if check:
            assert r.returncode == 0, f"{' '.join(argv)} -> {r.returncode}:\n{r.stdout}{r.stderr}"
        return r

    def files(self) -> set[str]:
        """Every path in the root filesystem (folders with a trailing /), dpkg's state left out."""
        out = set()
        for dirpath, dirnames, filenames in os.walk(self.root):
            rel = os.path.relpath(dirpath, self.root)
            rel = "" if rel == "." else rel + "/"
            out |= {rel + d + "/" for d in dirnames} | {rel + f for f in filenames}
        return {p for p in out if not p.startswith(STATE)}


def firmware_check(packages: Path, pubkey, tmp_path: Path) -> dict:
    """The packages of `packages` (a folder deb.run wrote) into a fresh arm64 Debian: what each
    package and test costs, and every CPU artifact checked. Asserts on the way."""
    require_rootfs_tools()
    assert deb.problems(packages, pubkey) == []
    listed = json.loads((packages / deb.LIST).read_text())
    target, version = listed["target"], listed["debian_version"]
    debs = sorted(packages.glob("*.deb"))
    names = [json.loads((packages / deb.LIST).read_text())["packages"][p.name]["package"] for p in debs]
    report = {"sizes": {p.name: p.stat().st_size for p in debs}, "checked": [], "seconds": {}}
    release = f"/usr/lib/modelyard/{target}"
    start = time.monotonic()
    rootfs_tarball()
    report["seconds"]["rootfs (cache or mmdebstrap)"] = round(time.monotonic() - start, 1)
    with Rootfs(tmp_path / "rootfs") as fs:
        before = fs.files()
        (fs.root / "tmp/debs").mkdir()
        for p in debs:
            shutil.copy(p, fs.root / "tmp/debs" / p.name)
        t = time.monotonic()
        fs.run("dpkg", "-i", *[f"/tmp/debs/{p.name}" for p in debs])
        report["seconds"]["dpkg -i"] = round(time.monotonic() - t, 1)
        status = fs.run("dpkg-query", "-W", "-f", "${Package} ${Version} ${Architecture} ${Status}\n",
                        *names).stdout
        for name in names:
            assert f"{name} {version} {ARCH} install ok installed" in status, status
        listing = fs.run("dpkg", "-L", "modelyard-tools").stdout.split()
        assert "/usr/bin/modelyard-run" in listing
        assert os.stat(fs.root / "usr/bin/modelyard-run").st_mode & 0o777 == 0o755
        assert os.stat(fs.root / release.lstrip("/") / "release.json").st_mode & 0o777 == 0o644

        # the installed release against its signed manifest (the key pinned here, not the one it names)
        installed = fs.root / release.lstrip("/")
        data = (installed / MANIFEST).read_bytes()
        _, problem = signing.check(json.loads((installed / SIGNATURE).read_bytes()), data, pubkey)
        assert problem is None, problem
        manifest = json.loads(data)["files"]
        shipped = [n for n in manifest if not n.startswith("runtime/")]
        for name in shipped:
            assert hashlib.sha256((installed / name).read_bytes()).hexdigest() == manifest[name]["sha256"], name

        # every CPU artifact, checked against its golden test vectors inside the root filesystem
        t = time.monotonic()
        doc = json.loads((installed / "release.json").read_text())
        for model, entry in sorted(doc["models"].items()):
            for abi, art in sorted(entry["artifacts"].items()):
                if art["requires"].get("arch") != "aarch64" or art["format"] == "rknn":
                    continue
                r = fs.run("modelyard-run", release, model, "--check", "--abi", abi)
                assert "aarch64 CPU" in r.stdout and "FAIL" not in r.stdout, r.stdout
                assert r.stdout.count("PASS") == len(entry["io"]["outputs"]), r.stdout
                report["checked"].append(f"{model}/{abi}")
        report["seconds"]["modelyard-run --check"] = round(time.monotonic() - t, 1)

        # the documented example, cross-compiled (as a firmware SDK does) against the installed
        # -dev package: its pkg-config file, found in the root filesystem; run inside it
        t = time.monotonic()
        example = fs.root / "usr/share/doc/libmodelyard-dev/examples/example.c"
        assert example.read_text() == (REPO / "runtime/example/example.c").read_text()
        require(shutil.which("aarch64-linux-gnu-gcc") is not None, "gcc-aarch64-linux-gnu missing (./setup.sh)")
        pc = fs.root / "usr/lib/aarch64-linux-gnu/pkgconfig"
        r = subprocess.run(["pkg-config", "--cflags", "--libs", "modelyard"], capture_output=True, text=True,
                           env={"PKG_CONFIG_LIBDIR": str(pc), "PATH": "/usr/bin:/bin"})
        assert r.returncode == 0, r.stderr
        flags = r.stdout.split()
        assert f"-I{pc}/../../../include" in flags and "-lmodelyard" in flags, flags
        r = subprocess.run(["aarch64-linux-gnu-gcc", "-std=c99", "-Wall", "-Werror", str(example), "-o",
                            str(fs.root / "tmp/example"), *flags], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        model = sorted(m for m, e in doc["models"].items() if "variant_of" not in e)[0]
        r = fs.run("/tmp/example", release, model)
        assert r.stdout.startswith("chose ") and re.search(r"\[0\] = -?[0-9.e+-]+\n", r.stdout), r.stdout
        (fs.root / "tmp/example").unlink()
        report["seconds"]["example: pkg-config, gcc, run"] = round(time.monotonic() - t, 1)

        # removal leaves nothing behind
        t = time.monotonic()
        fs.run("dpkg", "-r", *names)
        for name in names:
            r = fs.run("dpkg", "-L", name, check=False)
            assert r.returncode != 0 and "is not installed" in r.stderr, r.stdout + r.stderr
        shutil.rmtree(fs.root / "tmp/debs")
        after = fs.files()
        assert after == before, f"left behind: {sorted(after - before)[:20]}; gone: {sorted(before - after)[:20]}"
        report["seconds"]["dpkg -r"] = round(time.monotonic() - t, 1)
    report["seconds"]["total"] = round(time.monotonic() - start, 1)
    print(f"\nDebian packages of {target} {version}: {json.dumps(report, indent=1)}")
    return report


def rebuilt_identical(release: Path, packages: Path, key: Path, folder: Path) -> None:
    """The packages cut again from the same release, in another folder, under another umask and
    with another SOURCE_DATE_EPOCH in the environment (the epoch is the release's): the same bytes."""
    private = signing.load_private_key(str(key))
    old, epoch = os.umask(0o077), os.environ.get("SOURCE_DATE_EPOCH")
    os.environ["SOURCE_DATE_EPOCH"] = "1"
    try:
        deb.write_all(release, folder, private)
    finally:
        os.umask(old)
        os.environ.pop("SOURCE_DATE_EPOCH") if epoch is None else os.environ.update(SOURCE_DATE_EPOCH=epoch)
    first = sorted(p.name for p in packages.iterdir())
    assert first == sorted(p.name for p in folder.iterdir())
    for name in first:
        assert (packages / name).read_bytes() == (folder / name).read_bytes(), name


def lintian_tags(packages: Path) -> list[str]:
    """lintian's errors and warnings on the packages (tag lines `E: pkg: tag detail`)."""
    r = subprocess.run(["lintian", "--tag-display-limit", "0", "--allow-root",
                        *map(str, sorted(packages.glob("*.deb")))], capture_output=True, text=True,
                       timeout=900)
    return [line for line in r.stdout.splitlines() if line[:2] in ("E:", "W:")]


# ----------------------------------------------------------------------------- a small release

def release_with_packages(ws: Workspace, targets, key, version: str):
    """A new key pair at `key`, the C runtime (shared across test workspaces), then the rk3588
    release of `version` as both the bundle and Debian packages; the release's CompletedProcess."""
    from test_c_runtime import shared_runtime
    assert ws.doit("keygen", f"key={key}").returncode == 0
    shared_runtime(ws, "rk3588", targets)
    r = ws.doit("release", "target=rk3588", f"version={version}", f"key={key}", f"targets={targets}",
                "format=tar,deb")
    assert r.returncode == 0, r.stdout + r.stderr
    return r

@pytest.fixture(scope="module")
def small(tmp_path_factory) -> dict:
    """A small model built for rk3588's CPU ABIs (IREE's and TVM's both ship), released with
    format=tar,deb."""
    from test_c_runtime import registry
    require_aarch64()
    root = tmp_path_factory.mktemp("debian")
    ws = Workspace(root / "ws")
    add_tiny_model(ws.models, "alpha", seed=3)
    targets = registry(root / "targets")
    key = root / "key.pem"
    r = release_with_packages(ws, targets, key, "1.0.0-rc.1")
    return {"ws": ws, "key": key, "targets": targets, "out": r.stdout,
            "packages": ws.artifacts / "packages" / "rk3588" / "1.0.0-rc.1",
            "release": ws.artifacts / "releases" / "rk3588" / "1.0.0-rc.1"}


def test_packages_install_check_build_and_remove_in_arm64_debian(small, tmp_path):
    pubkey = signing.load_public_key(f"{small['key']}.pub")
    report = firmware_check(small["packages"], pubkey, tmp_path)
    assert report["checked"] == ["alpha/cpu-aarch64", "alpha/cpu-aarch64-tvm"]  # the TVM plugin too


def test_the_release_and_its_packages(small):
    packages, release = small["packages"], small["release"]
    assert sorted(p.name for p in packages.glob("*.deb")) == [
        "libmodelyard-dev_1.0.0~rc.1_arm64.deb", "libmodelyard0_1.0.0~rc.1_arm64.deb",
        "modelyard-models-rk3588_1.0.0~rc.1_arm64.deb", "modelyard-tools_1.0.0~rc.1_arm64.deb"]
    listed = json.loads((packages / deb.LIST).read_text())
    assert listed["release_manifest_sha256"] == hashlib.sha256((release / MANIFEST).read_bytes()).hexdigest()
    assert "Debian packages ->" in small["out"] and (release / "modelyard-rk3588-1.0.0-rc.1.tar.gz").is_file()
    contents = subprocess.run(["dpkg-deb", "--contents", str(packages / "libmodelyard0_1.0.0~rc.1_arm64.deb")],
                              capture_output=True, text=True, check=True).stdout
    for lib in ("libmodelyard.so", "libmodelyard_tvm.so", "libtvm_runtime.so", "libtvm_ffi.so"):
        assert f"./usr/lib/aarch64-linux-gnu/{lib}" in contents, contents
    # the same release again: the packages are unchanged, byte for byte (immutable, reproducible)
    before = {p.name: p.read_bytes() for p in packages.iterdir()}
    r = small["ws"].doit("release", "target=rk3588", "version=1.0.0-rc.1", f"key={small['key']}",
                         f"targets={small['targets']}", "format=deb")
    assert r.returncode == 0 and "packages unchanged" in r.stdout, r.stdout + r.stderr
    assert {p.name: p.read_bytes() for p in packages.iterdir()} == before


def test_two_builds_of_the_packages_are_byte_identical(small, tmp_path):
    rebuilt_identical(small["release"], small["packages"], small["key"], tmp_path / "again")


def test_lintian(small):
    require(shutil.which("lintian") is not None, "lintian missing (./setup.sh)")
    tags = lintian_tags(small["packages"])
    unexplained = [t for t in tags if not any(re.search(p, t) for p in LINTIAN_KNOWN)]
    assert unexplained == [], "\n".join(unexplained)


# lintian's findings on these packages that are decisions, each with its reason (docs/packages.md);
# anything else fails the test
LINTIAN_KNOWN = (
    r"^E: \S+: bogus-mail-host(-in-debian-changelog)? ",  # deb.MAINTAINER: a placeholder the owner sets
    r"^W: \S+: copyright-without-copyright-notice$",      # the authors' notice lives in the licences
    # libmodelyard.so has no versioned SONAME yet (C API 0.x), and the TVM runtime libraries are
    # the wheel's (unversioned); the TVM plugin is a module libmodelyard opens from its own folder
    r"^W: libmodelyard0: shared-library-lacks-version ",
    r"^W: libmodelyard0: package-name-doesnt-match-sonames ",
    r"^E: libmodelyard0: sharedobject-in-library-directory-missing-soname \[\S+/libmodelyard_tvm\.so\]$",
    # a TVM artifact ships as validated: stripping it would change the bytes that were checked
    r"^E: modelyard-models-\S+: unstripped-binary-or-object \[\S+/model\.so\]$",
    r"^W: modelyard-models-\S+: shared-library-lacks-prerequisites \[\S+/model\.so\]$",
    r"^W: modelyard-tools: no-manual-page \[usr/bin/modelyard-run\]$",  # its --help is the manual
)
