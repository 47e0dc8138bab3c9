"""Debian packages cut from a release (`doit release ... format=deb`): the C runtime and the models.

From one staged release folder (release.py: its signed manifest, release.json, runtime/, models/,
tests/, licenses/), for the architecture `A` of the target's CPU ABIs (Debian name `D`, triplet `T`):

  libmodelyard0_V_D.deb          /usr/lib/T/libmodelyard.so (+ the TVM plugin and runtime when
                                 built), the licences in /usr/share/doc/libmodelyard0/
  libmodelyard-dev_V_D.deb       /usr/include/modelyard.h, /usr/lib/T/pkgconfig/modelyard.pc,
                                 /usr/lib/T/cmake/modelyard/ (the release's own files: both find
                                 the library relative to themselves), static libraries if built
                                 (none today), the documented example
  modelyard-tools_V_D.deb        /usr/bin/modelyard-run
  modelyard-models-<target>_V_D.deb   the release as modelyard-run opens it, under
                                 /usr/lib/modelyard/<target>/: release.json, the artifacts, test
                                 vectors, licences, and the signed manifest with its signature
                                 (what each installed file's sha256 is checked against)

One models package per release, not one per model: release.json is one document (the fallback
order, every model's contract) and the signature covers the manifest of the whole release, so a
package per model would have to rewrite release.json and could no longer carry a signature that
matches its files; a firmware that wants fewer models releases fewer.

Versions: the release's semver, Debian-ordered (debian_version). Each package depends on
libmodelyard0 of exactly that version: IREE's bytecode is not stable across IREE versions, so
artifacts load in the runtime they were checked with. NPU artifacts need Rockchip's librknnrt,
which is not packaged (Suggests, and said in the description); Vulkan ones a Vulkan driver.

Written here, not by dpkg-deb (the build machine need not have it): an ar archive of
debian-binary, control.tar.xz, data.tar.xz. Reproducible: mtimes = the release's
SOURCE_DATE_EPOCH, owner root:root (0/0), sorted entries, folders included, modes 0755 for
folders and programs and 0644 for everything else, xz at a fixed preset. The packages are listed
with sha256 and size in packages.json, signed with the release key (packages.json.sig), bound to
the release by its manifest's sha256; SHA256SUMS beside them for `sha256sum -c`.
Output: artifacts/packages/<target>/<version>/, written in a scratch folder renamed at the end;
immutable like releases (the same bytes again is a no-op).
"""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import lzma
import os
import re
import shutil
import tarfile
import textwrap
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from . import signing
from ..core.errors import PipelineError
from ..core.store import pretty_json
from ..stages.runtime import SOURCE
from .verify import MANIFEST, SIGNATURE, file_digest

VERSION = 1
SCHEMA = "modelyard.packages/1"
FORMATS = ("tar", "deb")
LIST, LIST_SIGNATURE, SUMS = "packages.json", "packages.json.sig", "SHA256SUMS"
DEB_ARCH = {"aarch64": "arm64", "x86_64": "amd64"}
TRIPLET = {"aarch64": "aarch64-linux-gnu", "x86_64": "x86_64-linux-gnu"}
RUNTIME = "libmodelyard0"  # the C API's major version is 0 (runtime/CMakeLists.txt: 0.1.0)
MAINTAINER = "modelyard maintainers <modelyard@localhost>"
HOMEPAGE_NOTE = "Built by modelyard's `doit release format=deb` from a signed release."
XZ_PRESET = 6
EXAMPLE = SOURCE / "example" / "example.c"


# ----------------------------------------------------------------------------- pure parts
def formats(text: str | None, with_runtime: bool = True, **where) -> tuple[str, ...]:
    """`format=tar,deb` -> ("tar", "deb"); every problem in one error."""
    kinds = tuple(dict.fromkeys(k.strip() for k in (text or "tar").split(",") if k.strip()))
    unknown = [k for k in kinds if k not in FORMATS]
    if unknown or not kinds:
        raise PipelineError(f"format={text!r}: unknown {', '.join(unknown) or 'empty'}", **where,
                            hint=f"say format= one or more of {', '.join(FORMATS)}, comma-separated "
                                 f"(default tar: the signed bundle)")
    if "deb" in kinds and not with_runtime:
        raise PipelineError("format=deb packages the C runtime, and runtime=0 leaves it out", **where,
                            hint="drop runtime=0 (the models package depends on libmodelyard0)")
    return kinds


def debian_version(semver: str) -> str:
    """A semantic version as a Debian version that sorts the same way: a pre-release sorts
    before its release (`~`), build metadata after (`+`); a hyphen left in the upstream part
    (a pre-release such as rc-1) needs a Debian revision, so `-1` is added then."""
    core, plus, build = semver.partition("+")
    core, dash, pre = core.partition("-")
    out = core + (f"~{pre}" if dash else "") + (f"+{build}" if plus else "")
    return out + "-1" if "-" in out else out


def package_name(text: str) -> str:
    """A Debian package name: lower case letters, digits, + - . (a target's `_` becomes `-`)."""
    return re.sub(r"[^a-z0-9+.-]", "-", text.lower())


@dataclass(frozen=True)
class File:
    path: str                       # inside the package, without a leading / (usr/bin/...)
    source: Path | None = None      # where the bytes are, or
    data: bytes | None = None       # the bytes themselves
    mode: int = 0o644

    def read(self) -> bytes:
        return self.data if self.data is not None else self.source.read_bytes()


@dataclass(frozen=True)
class Package:
    name: str
    version: str                    # the Debian version
    arch: str                       # Debian's name: arm64, amd64
    section: str
    synopsis: str
    description: str                # the extended description, paragraphs split by blank lines
    files: tuple[File, ...]
    depends: tuple[str, ...] = ()
    recommends: tuple[str, ...] = ()
    suggests: tuple[str, ...] = ()
    multi_arch: str | None = None
    triggers: str | None = None     # control.tar's triggers file (a shared library: ldconfig)
    extra: dict = field(default_factory=dict)
    extra_note: str = ""            # the changelog's one entry

    @property
    def filename(self) -> str:
        return f"{self.name}_{self.version.split(':')[-1]}_{self.arch}.deb"


def folders(paths) -> list[str]:
    """Every folder above the given file paths (usr, usr/bin, ...)."""
    out = set()
    for p in paths:
        parts = p.split("/")[:-1]
        out |= {"/".join(parts[:i]) for i in range(1, len(parts) + 1)}
    return sorted(out)


def installed_size(files) -> int:
    """KiB, as dpkg-gencontrol counts: each file rounded up, 1 per folder."""
    sizes = [len(f.data) if f.data is not None else f.source.stat().st_size for f in files]
    return sum((s + 1023) // 1024 for s in sizes) + len(folders(f.path for f in files))


def control_text(pkg: Package, size_kib: int) -> str:
    fields = [("Package", pkg.name), ("Version", pkg.version), ("Architecture", pkg.arch),
              ("Maintainer", MAINTAINER), ("Installed-Size", str(size_kib)),
              ("Depends", ", ".join(pkg.depends)), ("Recommends", ", ".join(pkg.recommends)),
              ("Suggests", ", ".join(pkg.suggests)), ("Section", pkg.section),
              ("Priority", "optional"), ("Multi-Arch", pkg.multi_arch or ""),
              *sorted(pkg.extra.items())]
    lines = [f"{k}: {v}" for k, v in fields if v]
    paragraphs = [textwrap.wrap(p, 78) for p in pkg.description.strip().split("\n\n")]
    body = [line for i, p in enumerate(paragraphs) for line in ([" ."] if i else []) + [f" {w}" for w in p]]
    return "\n".join([*lines, f"Description: {pkg.synopsis}", *body]) + "\n"


def elf_depends(data: bytes) -> dict[str, str]:
    """Debian packages an ELF file needs, from the names in its dynamic string table: libc6 at
    the newest GLIBC_2.N symbol version it references, libstdc++6 and libgcc-s1 when linked."""
    out = {}
    versions = [tuple(int(x) for x in m.groups() if x) for m in
                re.finditer(rb"GLIBC_2\.(\d+)(?:\.(\d+))?\x00", data)]
    if versions or b"libc.so.6\x00" in data:
        newest = max(versions, default=(17,))
        out["libc6"] = "libc6 (>= 2.%s)" % ".".join(map(str, newest))
    if b"libstdc++.so.6\x00" in data:
        out["libstdc++6"] = "libstdc++6"
    if b"libgcc_s.so.1\x00" in data:
        out["libgcc-s1"] = "libgcc-s1"
    return out


def shared_depends(files) -> tuple[str, ...]:
    """elf_depends over every ELF file of a package, merged (the newest libc6 wins)."""
    merged: dict[str, str] = {}
    for f in files:
        data = f.read()
        if not data.startswith(b"\x7fELF"):
            continue
        for name, dep in elf_depends(data).items():
            old = merged.get(name)
            if old is None or _glibc(dep) > _glibc(old):
                merged[name] = dep
    return tuple(merged[k] for k in sorted(merged))


def _glibc(dep: str) -> tuple[int, ...]:
    m = re.search(r"\(>= ([\d.]+)\)", dep)
    return tuple(int(x) for x in m[1].split(".")) if m else ()


# ----------------------------------------------------------------------------- what goes where
def plan(release: Path, **where) -> list[Package]:
    """The packages of a staged release folder (release.py's layout), from its manifest's file
    list and release.json; reads nothing else of the release."""
    manifest = json.loads((release / MANIFEST).read_bytes())
    doc = json.loads((release / "release.json").read_bytes())
    files = sorted(manifest["files"])
    target, semver = manifest["target"], manifest["version"]
    arches = sorted(a for a in doc.get("runtime", {}) if a in TRIPLET)
    model_arches = sorted({art["requires"]["arch"] for m in doc["models"].values()
                           for art in m["artifacts"].values() if art["requires"].get("arch")})
    if not arches:
        raise PipelineError(f"the release of {target} {semver} holds no C runtime to package", **where,
                            hint="release without runtime=0 (format=deb packages the runtime)")
    if len(set(arches) | set(model_arches)) != 1:
        raise PipelineError(f"the release of {target} mixes architectures "
                            f"({', '.join(sorted(set(arches) | set(model_arches)))}): one Debian "
                            f"architecture per package set", **where,
                            hint="release one target per architecture")
    (arch,) = arches
    version, deb_arch, triplet = debian_version(semver), DEB_ARCH[arch], TRIPLET[arch]
    exact = f"{RUNTIME} (= {version})"
    runtime = doc["runtime"][arch]
    src = f"Cut from the signed release {target} {semver} (SOURCE_DATE_EPOCH " \
          f"{manifest['source_date_epoch']}). " + HOMEPAGE_NOTE

    def pick(prefix: str) -> list[str]:
        return [n for n in files if n.startswith(prefix)]

    def under(dest: str, prefix: str, mode=0o644, names=None) -> list[File]:
        return [File(f"{dest}/{n[len(prefix):]}", release / n, mode=mode)
                for n in (pick(prefix) if names is None else names)]

    lib, docs = f"usr/lib/{triplet}", "usr/share/doc"
    libs = [n for n in pick(f"runtime/{arch}/lib/") if n.count("/") == 3 and ".so" in n]
    static = [n for n in pick(f"runtime/{arch}/lib/") if n.count("/") == 3 and n.endswith(".a")]
    licenses = under(f"{docs}/{RUNTIME}/licenses", "runtime/licenses/")
    third = ", ".join(f"{t['name']} {t['version']} ({t['spdx']})" for t in runtime.get("third_party", []))
    lib_files = [*under(lib, f"runtime/{arch}/lib/", names=libs), *licenses,
                 File(f"{docs}/{RUNTIME}/copyright", data=copyright_text(
                     target, semver, [f.path for f in licenses], third).encode())]
    lib_deps = shared_depends(lib_files)
    dev_files = [*under("usr/include", "runtime/include/"),
                 *under(f"{lib}/pkgconfig", f"runtime/{arch}/lib/pkgconfig/"),
                 *under(f"{lib}/cmake", f"runtime/{arch}/lib/cmake/"),
                 *under(lib, f"runtime/{arch}/lib/", names=static),
                 File(f"{docs}/libmodelyard-dev/examples/example.c", EXAMPLE),
                 File(f"{docs}/libmodelyard-dev/copyright", data=copyright_text(target, semver).encode())]
    tool_files = [*under("usr/bin", f"runtime/{arch}/bin/", mode=0o755,
                         names=[f"runtime/{arch}/bin/modelyard-run"]),
                  File(f"{docs}/modelyard-tools/copyright", data=copyright_text(target, semver).encode())]

    name = package_name(f"modelyard-models-{target}")
    root = f"usr/lib/modelyard/{target}"
    shipped = [n for n in files if not n.startswith("runtime/")] + [MANIFEST, SIGNATURE]
    model_licenses = [f"{root}/{n}" for n in shipped if n.startswith("licenses/")]
    arts = [art for m in doc["models"].values() for art in m["artifacts"].values()]
    rknn = sorted({a["requires"]["npu"].get("librknnrt") or "" for a in arts if a["requires"].get("npu")})
    vulkan = any(a["requires"].get("vulkan") for a in arts)
    suggests = (f"librknnrt (>= {rknn[-1]})" if rknn[-1] else "librknnrt",) if rknn else ()
    notes = []
    if rknn:
        notes.append("The NPU artifacts (.rknn) need Rockchip's librknnrt"
                     f"{' ' + rknn[-1] if rknn[-1] else ''} on the board: it is not packaged here "
                     "(proprietary; from Rockchip's SDK or the board vendor's image). Without it "
                     "modelyard-run passes them over and runs the next artifact in the fallback order.")
    if vulkan:
        notes.append("The Vulkan artifacts need the board's Vulkan driver (for the RK3588's "
                     "Mali-G610: Mesa panvk or Arm's Mali driver) and the Vulkan loader.")
    model_files = [*(File(f"{root}/{n}", release / n) for n in shipped),
                   File(f"{docs}/{name}/copyright", data=copyright_text(
                       target, semver, model_licenses, "the models' own licences, listed").encode())]
    models = ", ".join(sorted(doc["models"]))
    note = f"The signed release {target} {semver}, cut into Debian packages."
    return [replace(p, extra_note=note) for p in [
        Package(RUNTIME, version, deb_arch, "libs", "modelyard board runtime (shared library)",
                f"libmodelyard opens a released model by name and runs the artifact this device "
                f"can run (IREE inside; TVM artifacts through a plugin).\n\nIREE runtime "
                f"{runtime['iree']['commit'][:12]} (HAL module version "
                f"{runtime['iree']['hal_module_version']}), TVM runtime {runtime.get('tvm_runtime')}."
                f"\n\n{src}", tuple(lib_files), depends=lib_deps,
                recommends=("libvulkan1",), multi_arch="same",
                triggers="activate-noawait ldconfig\n"),
        Package("libmodelyard-dev", version, deb_arch, "libdevel",
                "modelyard board runtime (development files)",
                f"modelyard.h, the pkg-config file (pkg-config --cflags --libs modelyard), the "
                f"CMake package (find_package(modelyard)) and the documented example.\n"
                f"{'' if static else 'No static library is built.'}\n\n{src}",
                tuple(dev_files), depends=(exact,), multi_arch="same"),
        Package("modelyard-tools", version, deb_arch, "utils", "modelyard-run: run or check a released model",
                f"modelyard-run RELEASE MODEL [--check] [--abi ABI] [--bench N].\n\n{src}",
                tuple(tool_files), depends=(exact, *shared_depends(tool_files))),
        Package(name, version, deb_arch, "misc", f"modelyard models released for {target}",
                f"The release {target} {semver} as modelyard-run opens it: /{root} "
                f"(models: {models}), with release.json, the artifacts, their golden test "
                f"vectors (modelyard-run /{root} MODEL --check), licences, and manifest.json with "
                f"its Ed25519 signature (manifest.json.sig).\n\n" + "\n\n".join([*notes, src]),
                tuple(model_files), depends=(exact,), suggests=suggests,
                recommends=("libvulkan1",) if vulkan else ()),
    ]]


def copyright_text(target: str, semver: str, licenses=(), third: str = "") -> str:
    """/usr/share/doc/<package>/copyright (machine-readable format 1.0)."""
    lines = ["Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/",
             "Upstream-Name: modelyard",
             f"Comment: cut from the signed release {target} {semver} by `doit release format=deb`",
             "", "Files: *", "Copyright: the modelyard authors", "License: Apache-2.0",
             " On Debian systems the full text is /usr/share/common-licenses/Apache-2.0."]
    if licenses:
        lines += ["", "Files: *", "Copyright: see the licence files", "License: other",
                  f" Third-party parts{': ' + third if third else ''}.", " The licence texts:"]
        lines += [f" /{p}" for p in licenses]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- writing
def _tar(entries: list[tuple[str, bytes | Path | None, int]], epoch: int, out) -> None:
    """A GNU tar (what dpkg-deb writes) of ./ and `entries` (path, bytes or a file or None for a
    folder, mode): sorted by path, root:root, mtime `epoch`."""
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for path, content, mode in sorted(entries, key=lambda e: e[0].split("/")):
            info = tarfile.TarInfo(f"./{path}/" if content is None and path else f"./{path}" if path else "./")
            info.mtime, info.uid, info.gid, info.uname, info.gname = epoch, 0, 0, "root", "root"
            info.mode = mode
            if content is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif isinstance(content, Path):
                info.size = content.stat().st_size
                with open(content, "rb") as f:
                    tar.addfile(info, f)
            else:
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))


def _xz(write, path: Path) -> None:
    with open(path, "wb") as raw, lzma.open(raw, "wb", format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64,
                                           preset=XZ_PRESET) as xz:
        write(xz)


def changelog(pkg: Package, epoch: int) -> bytes:
    """/usr/share/doc/<package>/changelog.gz of a native package: one entry, the release, dated
    by its SOURCE_DATE_EPOCH; gzip without a name or a time."""
    when = time.strftime("%a, %d %b %Y %H:%M:%S +0000", time.gmtime(epoch))
    text = (f"{pkg.name} ({pkg.version}) unstable; urgency=medium\n\n  * {pkg.extra_note}\n\n"
            f" -- {MAINTAINER}  {when}\n")
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, compresslevel=9, mtime=0) as gz:
        gz.write(text.encode())
    return buf.getvalue()


def _ar_member(out, name: str, size: int, epoch: int) -> None:
    out.write(f"{name:<16}{epoch:<12}{0:<6}{0:<6}{'100644':<8}{size:<10}`\n".encode())


def build(pkg: Package, epoch: int, dest: Path, work: Path) -> Path:
    """Write pkg as dest/<filename>; `work` holds the compressed members meanwhile."""
    work.mkdir(parents=True, exist_ok=True)
    files = [*pkg.files, File(f"usr/share/doc/{pkg.name}/changelog.gz", data=changelog(pkg, epoch))]
    md5s, data_entries = [], [("", None, 0o755)]
    data_entries += [(d, None, 0o755) for d in folders(f.path for f in files)]
    for f in sorted(files, key=lambda f: f.path):
        content = f.data if f.data is not None else f.source
        data_entries.append((f.path, content, f.mode))
        md5s.append(f"{hashlib.md5(f.read()).hexdigest()}  {f.path}\n")
    control = [("", None, 0o755), ("control", control_text(pkg, installed_size(files)).encode(), 0o644),
               ("md5sums", "".join(md5s).encode(), 0o644)]
    if pkg.triggers:
        control.append(("triggers", pkg.triggers.encode(), 0o644))
    members = [("debian-binary", None), ("control.tar.xz", work / "control.tar.xz"),
               ("data.tar.xz", work / "data.tar.xz")]
    _xz(lambda out: _tar(control, epoch, out), members[1][1])
    _xz(lambda out: _tar(data_entries, epoch, out), members[2][1])
    path = dest / pkg.filename
    with open(path, "xb") as out:
        out.write(b"!<arch>\n")
        for name, source in members:
            size = 4 if source is None else source.stat().st_size
            _ar_member(out, name, size, epoch)
            if source is None:
                out.write(b"2.0\n")
            else:
                with open(source, "rb") as f:
                    shutil.copyfileobj(f, out)
            if size % 2:
                out.write(b"\n")
    for _, source in members[1:]:
        source.unlink()
    return path


def write_all(release: Path, out: Path, private_key, **where) -> dict:
    """Every package of the staged release folder into `out` (new), with packages.json, its
    signature and SHA256SUMS; returns packages.json's document."""
    manifest_bytes = (release / MANIFEST).read_bytes()
    manifest = json.loads(manifest_bytes)
    epoch = int(manifest["source_date_epoch"])
    out.mkdir(parents=True)
    listed = {}
    for pkg in plan(release, **where):
        path = build(pkg, epoch, out, out / ".work")
        sha, size = file_digest(path)
        listed[path.name] = {"package": pkg.name, "version": pkg.version, "architecture": pkg.arch,
                             "sha256": sha, "size": size, "depends": list(pkg.depends)}
    shutil.rmtree(out / ".work", ignore_errors=True)
    doc = {"schema": SCHEMA, "target": manifest["target"], "version": manifest["version"],
           "debian_version": debian_version(manifest["version"]), "source_date_epoch": epoch,
           "release_manifest_sha256": hashlib.sha256(manifest_bytes).hexdigest(),
           "stage_version": VERSION, "packages": listed}
    data = pretty_json(doc).encode()
    (out / LIST).write_bytes(data)
    (out / LIST_SIGNATURE).write_text(pretty_json(signing.sign(private_key, data)))
    (out / SUMS).write_text("".join(f"{m['sha256']}  {n}\n" for n, m in sorted(listed.items())))
    return doc


def run(layout, release: Path, private_key, **where) -> str:
    """`doit release format=deb`: the packages of the staged (or published) release folder into
    artifacts/packages/<target>/<version>/; the same bytes again is a no-op, other bytes refused."""
    manifest = json.loads((release / MANIFEST).read_bytes())
    target, version = manifest["target"], manifest["version"]
    final = layout.packages(target, version)
    scratch = layout.scratch("release", f"packages-{target}/{version}")
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.parent.mkdir(parents=True, exist_ok=True)
    try:
        doc = write_all(release, scratch, private_key, **where)
        sizes = ", ".join(f"{n} ({m['size']} bytes)" for n, m in doc["packages"].items())
        if final.exists():
            old = final / LIST
            if old.is_file() and old.read_bytes() == (scratch / LIST).read_bytes() and not problems(final, private_key.public_key()):
                return f"  packages unchanged at {final}: {sizes}"
            raise PipelineError(f"the Debian packages of {target} {version} at {final} differ from "
                                f"the ones this release makes; packages are never rewritten", **where,
                                hint="release under a new version number")
        final.parent.mkdir(parents=True, exist_ok=True)
        os.rename(scratch, final)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return f"  Debian packages -> {final}, listed in the signed {LIST}: {sizes}"


def problems(folder: Path, public_key) -> list[str]:
    """What is wrong with a packages folder: packages.json's signature by `public_key`, every
    listed .deb's sha256 and size, a .deb not listed."""
    try:
        data = (folder / LIST).read_bytes()
        doc = json.loads(data)
        record = json.loads((folder / LIST_SIGNATURE).read_bytes())
    except (OSError, ValueError) as exc:
        return [f"{LIST} or {LIST_SIGNATURE}: unreadable ({exc})"]
    out = []
    _, problem = signing.check(record, data, public_key)
    if problem:
        out.append(f"{LIST}: {problem}")
    for name, meta in sorted(doc["packages"].items()):
        path = folder / name
        if not path.is_file():
            out.append(f"{name}: listed in {LIST} but missing")
        elif file_digest(path) != (meta["sha256"], meta["size"]):
            out.append(f"{name}: sha256/size differ from {LIST}'s")
    out += [f"{p.name}: not listed in {LIST}" for p in sorted(folder.glob("*.deb"))
            if p.name not in doc["packages"]]
    return out
