"""Stage `runtime`: the board-side C runtime (runtime/), built per architecture a target ships.

One step per architecture (aarch64 for rk3588 and rpi5, x86_64 for host), shared by the targets
that need it: it unpacks third_party/'s pinned archives (IREE runtime, flatcc, Vulkan headers,
cJSON), applies iree-pr24736.patch, configures runtime/CMakeLists.txt with CMake + Ninja and
the Debian toolchain (aarch64-linux-gnu-gcc/g++ for aarch64), builds libmodelyard.so (IREE
inside), libmodelyard_tvm.so (against the TVM runtime of the same TVM version as the compiler:
the aarch64 wheel setup.sh unpacks, or this venv's), modelyard-run and the example, installs
them stripped and writes:
  runtime-<arch>.tar   lib/ (the libraries, pkg-config file, CMake package), bin/, include/:
                       deterministic (sorted, mtime SOURCE_DATE_EPOCH, 0/0, modes 0644/0755)
  runtime.json         each file's sha256 and size, the vendored IREE commit and HAL module
                       version, the TVM runtime version, the compilers
Reproducible: -ffile-prefix-map for every build path, SOURCE_DATE_EPOCH, no build id; two
builds give the same bytes (tests/e2e/test_c_runtime.py). Log: artifacts/logs/runtime/<arch>.log.
"""
from __future__ import annotations

import importlib.util
import io
import json
import lzma
import os
import re
import shutil
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

from ..core.steps import StageConfig, Step
from ..core.store import pretty_json, sha256_file
from ..core.tools import REPO, aarch64_tvm, run_tool

VERSION = 1
OUTPUTS = ("runtime.tar", "runtime.json")
EPOCH = 315532800  # the release's default SOURCE_DATE_EPOCH: a constant, never the clock
THIRD_PARTY = REPO / "third_party"
SOURCE = REPO / "runtime"
ARCHES = {"aarch64": ("aarch64-linux-gnu-gcc", "aarch64-linux-gnu-g++"), "x86_64": ("gcc", "g++")}


@dataclass(frozen=True)
class Config(StageConfig):
    arch: str                       # what the runtime is built for
    c_compiler: str                 # the Debian toolchain's drivers (their sha256 are in `tools`)
    cxx_compiler: str
    build_type: str = "Release"
    c_flags: tuple[str, ...] = ("-O2", "-g0")
    tvm: bool = True                # build the TVM plugin (against the wheel's libtvm_runtime.so)

    def problems(self):
        if self.arch not in ARCHES:
            yield f"arch must be one of {', '.join(ARCHES)}, got {self.arch!r}"
        elif (self.c_compiler, self.cxx_compiler) != ARCHES[self.arch]:
            yield f"{self.arch} builds with {' and '.join(ARCHES[self.arch])}"
        if self.build_type not in ("Release", "MinSizeRel"):
            yield f"build_type must be Release or MinSizeRel, got {self.build_type!r}"


def arches(project) -> list[str]:
    """The architectures the loaded targets ship CPU artifacts for (their runtime's)."""
    return sorted({a.arch for t in project.targets for a in t.abis if a.arch})


def tvm_root(arch: str) -> Path | None:
    """A site-packages folder with tvm/lib/libtvm_runtime.so and tvm_ffi/ for `arch`."""
    if arch == "aarch64":
        tv = aarch64_tvm(required=False)
        return tv.root / "site" if tv else None
    spec = importlib.util.find_spec("tvm")  # finds the package without importing it
    return Path(spec.submodule_search_locations[0]).parent if spec else None


def host_tools() -> Path:
    """The x86_64 iree-base-runtime wheel's iree-c-embed-data and iree-flatcc-cli (IREE_HOST_BIN_DIR)."""
    spec = importlib.util.find_spec("iree._runtime_libs")
    return Path(spec.submodule_search_locations[0])


def source_inputs(arch: str) -> dict[str, Path]:
    """Every file the build reads from this repository and the TVM wheel: part of the key."""
    inputs = {f"third_party/{p.name}": p for p in sorted(THIRD_PARTY.iterdir())
              if p.suffix == ".xz" or p.name in ("iree-pr24736.patch", "sources.json")}
    inputs.update({f"runtime/{p.relative_to(SOURCE).as_posix()}": p
                   for p in sorted(SOURCE.rglob("*")) if p.is_file() and "__pycache__" not in p.parts
                   and p.relative_to(SOURCE).parts[0] != "tests"})  # the C tests: not in the build
    root = tvm_root(arch)
    if root is not None:
        inputs["tvm/libtvm_runtime.so"] = root / "tvm" / "lib" / "libtvm_runtime.so"
        inputs["tvm/libtvm_ffi.so"] = root / "tvm_ffi" / "lib" / "libtvm_ffi.so"
    return inputs


def steps(project) -> list[Step]:
    out = []
    for arch in arches(project):
        cc, cxx = ARCHES[arch]
        cfg = Config(arch=arch, c_compiler=cc, cxx_compiler=cxx)
        out.append(Step(stage="runtime", name=arch, version=VERSION, config=cfg,
                        inputs=source_inputs(arch), outputs=OUTPUTS,
                        out_dir=project.layout.runtime(arch),
                        tools=("cmake", "ninja", "patch", cc, cxx, "iree-base-runtime", "apache-tvm"),
                        action=run, layout=project.layout,
                        doc=f"the C runtime (libmodelyard, modelyard-run) for {arch}",
                        where={"target": arch}))
    return out


def cmake_args(cfg: Config, src: Path, tp: Path, build: Path, tvm: Path | None, toolchain: Path | None) -> list[str]:
    """configure arguments: a pure function of the config and the folders."""
    maps = [f"-ffile-prefix-map={tp}=third_party", f"-ffile-prefix-map={src}=runtime",
            f"-ffile-prefix-map={build}=build"]
    if tvm is not None:
        maps.append(f"-ffile-prefix-map={tvm}=tvm")
    flags = " ".join([*cfg.c_flags, *maps])
    sources = json.loads((THIRD_PARTY / "sources.json").read_text())
    commit = next(a["commit"] for a in sources["archives"] if a["name"] == "iree-runtime")
    args = ["-S", str(src), "-B", str(build), "-G", "Ninja", f"-DCMAKE_BUILD_TYPE={cfg.build_type}",
            f"-DCMAKE_C_FLAGS={flags}", f"-DCMAKE_CXX_FLAGS={flags}",
            "-DCMAKE_SHARED_LINKER_FLAGS=-Wl,--build-id=none",
            "-DCMAKE_EXE_LINKER_FLAGS=-Wl,--build-id=none", "-DCMAKE_MODULE_LINKER_FLAGS=-Wl,--build-id=none",
            f"-DMODELYARD_THIRD_PARTY={tp}", f"-DMODELYARD_IREE_COMMIT={commit}",
            f"-DIREE_HOST_BIN_DIR={host_tools()}",
            # artifacts/ is inside the user's git clone: IREE's CMake would run `git rev-parse`
            # there and fail on submodules the vendored sources do not have
            "-DIREE_ERROR_ON_MISSING_SUBMODULES=OFF",
            f"-DMODELYARD_TVM_ROOT={tvm if (cfg.tvm and tvm) else ''}"]
    if toolchain is not None:
        args.append(f"-DCMAKE_TOOLCHAIN_FILE={toolchain}")
    else:
        args += [f"-DCMAKE_C_COMPILER={cfg.c_compiler}", f"-DCMAKE_CXX_COMPILER={cfg.cxx_compiler}"]
    return args


TOOLCHAIN = """set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER {cc})
set(CMAKE_CXX_COMPILER {cxx})
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
"""


def unpack(tp: Path) -> None:
    """third_party's archives into tp/ (iree/, cjson/), then the upstream fix as a patch."""
    for archive in sorted(THIRD_PARTY.glob("*.tar.xz")):
        with lzma.open(archive) as raw, tarfile.open(fileobj=raw) as tar:
            tar.extractall(tp, filter="data")


def run(ctx) -> None:
    cfg = ctx.cfg
    work = ctx.scratch / "work"
    tp, build, prefix = work / "tp", work / "build", work / "install"
    shutil.rmtree(work, ignore_errors=True)
    tp.mkdir(parents=True)
    where = {"stage": "runtime", "target": cfg.arch}
    unpack(tp)
    run_tool(["patch", "-p1", "--forward", "--quiet", "-d", str(tp / "iree"),
              "-i", str(THIRD_PARTY / "iree-pr24736.patch")], log=ctx.log, what="applying iree-pr24736.patch",
             **where)
    toolchain = None
    if cfg.arch == "aarch64":
        toolchain = work / "aarch64.cmake"
        toolchain.write_text(TOOLCHAIN.format(cc=cfg.c_compiler, cxx=cfg.cxx_compiler))
    tvm = tvm_root(cfg.arch) if cfg.tvm else None
    if cfg.tvm and tvm is None:
        raise ctx.error(f"no TVM runtime for {cfg.arch} to build the TVM backend against",
                        hint="run ./setup.sh (it unpacks the aarch64 TVM wheel into .tools/)")
    bindir = Path(sys.executable).parent  # the venv's cmake and ninja (pyproject.toml)
    env = {**os.environ, "SOURCE_DATE_EPOCH": str(EPOCH), "LC_ALL": "C",
           "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}"}
    cmake = str(bindir / "cmake") if (bindir / "cmake").is_file() else "cmake"
    jobs = str(max(1, min(os.cpu_count() or 1, 8)))
    run_tool([cmake, *cmake_args(cfg, SOURCE, tp, build, tvm, toolchain)], log=ctx.log,
             what=f"configuring the {cfg.arch} runtime", env=env, **where)
    run_tool([cmake, "--build", str(build), "-j", jobs], log=ctx.log, what=f"building the {cfg.arch} runtime",
             env=env, progress=f"runtime {cfg.arch}", **where)
    run_tool([cmake, "--install", str(build), "--prefix", str(prefix), "--strip"], log=ctx.log,
             what="installing the runtime", env=env, **where)
    files = sorted(p.relative_to(prefix).as_posix() for p in prefix.rglob("*") if p.is_file())
    write_tar(prefix, files, ctx.output("runtime.tar"))
    sources = json.loads((THIRD_PARTY / "sources.json").read_text())
    doc = {"arch": cfg.arch,
           "files": {f: {"sha256": sha256_file(prefix / f), "size": (prefix / f).stat().st_size}
                     for f in files},
           "iree": {"commit": next(a["commit"] for a in sources["archives"] if a["name"] == "iree-runtime"),
                    "hal_module_version": hal_version(tp), "patches": [p["file"] for p in sources["patches"]]},
           "third_party": [{k: a[k] for k in ("name", "version", "repo", "commit", "spdx", "archive")}
                           for a in sources["archives"]],
           "tvm_runtime": tvm_version(tvm) if tvm else None}
    ctx.output("runtime.json").write_text(pretty_json(doc))
    shutil.rmtree(work, ignore_errors=True)


def hal_version(tp: Path) -> int:
    """IREE_HAL_MODULE_VERSION_LATEST of the vendored sources: the newest `hal` a .vmfb may import."""
    text = (tp / "iree" / "runtime" / "src" / "iree" / "modules" / "hal" / "module.c").read_text()
    return int(re.search(r"#define IREE_HAL_MODULE_VERSION_LATEST IREE_HAL_MODULE_VERSION_0_(\d+)", text)[1])


def tvm_version(root: Path) -> str:
    found = sorted(root.glob("apache_tvm-*.dist-info"))
    return found[0].name.removeprefix("apache_tvm-").removesuffix(".dist-info") if found else "unknown"


def write_tar(folder: Path, names: list[str], out: Path) -> None:
    """A byte-reproducible tar: sorted, mtime EPOCH, owner 0/0 without names, 0755 for bin/, else 0644."""
    with open(out, "wb") as raw, tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in names:
            path = folder / name
            info = tarfile.TarInfo(name)
            info.size = path.stat().st_size
            info.mode = 0o755 if os.access(path, os.X_OK) and name.startswith("bin/") else 0o644
            info.mtime, info.uid, info.gid, info.uname, info.gname = EPOCH, 0, 0, "", ""
            with open(path, "rb") as f:
                tar.addfile(info, f)


def unpack_runtime(tar_path: Path, dest: Path) -> list[str]:
    """runtime.tar into dest/ (the release and the tests use it); returns the names."""
    with tarfile.open(tar_path) as tar:
        tar.extractall(dest, filter="data")
        return sorted(m.name for m in tar.getmembers() if m.isfile())
