"""Mesa's shader cache, per Vulkan artifact, carried by the build cache.

lavapipe compiles every SPIR-V kernel with LLVM the first time a pipeline is made: minutes for a
detector, where a run from Mesa's on-disk cache takes seconds. So the cache a validation fills is
kept as one `shaders.tar` in the step store under a key of what decides it: the bytes of the
artifact that ran and the driver build (the sha256 of the lavapipe library and of the LLVM
library it links). It travels through the remote cache like a step's outputs, so a second
machine, a CI runner or a rebuild after an unrelated change validates the same artifact warm.
A folder of packs beside the workspace's Mesa cache (Layout.shader_cache/packs, or
$MODELYARD_SHADER_CACHE: one for several workspaces of a machine) is the machine-wide tier.

Mesa keys lavapipe's cache on the CPU too (`lp_disk_cache_create` hashes the first five words of
`util_cpu_caps`: CPUs available to the process, CPUs configured, AMD family, x86 family, cache
line, the first feature bits). Measured here: a pack made with 2 CPUs missed every kernel when
the same validation ran under `taskset -c 0` (66 kernels compiled again, 234 s against 1.5 s
warm). So the CPU kind (`cpu_kind`) is part of a pack's key: a fleet of mixed machines keeps one
pack per kind, each warm after its first validation. After each run the cache folder is counted:
kernels Mesa had to compile although a pack was found mean the pack missed (a kind this key does
not tell apart); the log and the step's timing record say so (`doit timings` lists it) and the
pack is stored again with them.

A pack is only a cache: the artifact still runs and every output is still compared. Mesa checks
its own entries (each keyed by shader and driver, with a checksum), so a stale or damaged pack
costs a recompile, never a wrong result. Nothing about the pack goes into a step's outputs.
"""
from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Iterator

from ..core import timings
from ..core.store import DamagedObject, Store, sha256_file, step_key
from ..core.tools import icd_file, vulkan_driver_fingerprint

STAGE = "mesa-shaders"
PACK = "shaders.tar"


@functools.lru_cache(maxsize=None)
def driver_build(driver: str) -> dict:
    """What decides the kernels lavapipe compiles: its library and the LLVM it links."""
    build = {"driver": driver, "library": vulkan_driver_fingerprint(driver)}
    icd = icd_file(driver)
    if icd is not None:
        library = Path(json.loads(icd.read_text())["ICD"]["library_path"])
        try:
            linked = subprocess.run(["ldd", str(library)], capture_output=True, text=True,
                                    timeout=30).stdout
        except (OSError, subprocess.SubprocessError):
            linked = ""
        for name, path in re.findall(r"(libLLVM[^\s]*)\s*=>\s*(\S+)", linked):
            build[name] = f"sha256:{sha256_file(Path(path))}"
    return build


# util_cpu_caps' first feature bits as /proc/cpuinfo names them (x86): what decides the code
# LLVM emits for lavapipe's kernels on this machine
_FEATURES = ("mmx", "mmxext", "sse", "sse2", "pni", "ssse3", "sse4_1", "sse4_2", "popcnt", "avx",
             "avx2", "f16c", "fma", "xop", "avx512f", "avx512dq", "avx512cd", "avx512bw",
             "avx512vl", "avx512er", "avx512pf", "avx512ifma", "avx512vbmi", "avx512_vnni",
             "avx512_bf16", "avx512_fp16", "gfni", "vaes", "vpclmulqdq", "tsc", "asimd", "fp16")


def cpu_kind(cpuinfo: str | None = None, available: int | None = None,
             configured: int | None = None) -> dict:
    """The CPU as Mesa's lavapipe cache key sees it: CPUs this process may use (`taskset`
    changes it), CPUs configured, vendor, family, cache line and the feature bits it reads."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    first = cpuinfo.split("\n\n", 1)[0]
    fields = dict((k.strip(), v.strip()) for k, _, v in
                  (line.partition(":") for line in first.splitlines()) if _)
    flags = set((fields.get("flags") or fields.get("Features") or "").split())
    return {"cpus": available if available is not None else len(os.sched_getaffinity(0)),
            "cpus_configured": configured if configured is not None else os.cpu_count(),
            "vendor": fields.get("vendor_id") or fields.get("CPU implementer", ""),
            "family": fields.get("cpu family") or fields.get("CPU architecture", ""),
            "cache_line": fields.get("clflush size") or fields.get("cache_alignment", ""),
            "features": sorted(flags.intersection(_FEATURES))}


def describe_kind(kind: dict) -> str:
    top = next((f for f in ("avx512f", "avx2", "avx", "sse4_2", "asimd") if f in kind["features"]), "")
    return (f"{kind['cpus']} of {kind['cpus_configured']} CPUs, {kind['vendor'] or '?'} family "
            f"{kind['family'] or '?'}{', ' + top if top else ''}")


def pack_key(artifact: Path, driver: str, kind: dict | None = None) -> str:
    return step_key({"stage": STAGE, "artifact": sha256_file(artifact), "build": driver_build(driver),
                     "cpu": kind if kind is not None else cpu_kind()})


def kernels(folder: Path) -> int:
    """How many entries Mesa's cache holds (one file per compiled kernel and its index)."""
    return sum(1 for p in folder.rglob("*") if p.is_file())


def _pack(folder: Path, tar: Path) -> None:
    """The folder as a tar with sorted names and no owners or times (the same cache, the same bytes)."""
    with tarfile.open(tar, "w") as out:
        for path in sorted(folder.rglob("*")):
            if not path.is_file():
                continue
            info = tarfile.TarInfo(path.relative_to(folder).as_posix())
            info.size, info.mode, info.mtime = path.stat().st_size, 0o644, 0
            out.addfile(info, io.BytesIO(path.read_bytes()))


def _unpack(tar: Path, folder: Path) -> bool:
    try:
        with tarfile.open(tar) as src:
            src.extractall(folder, filter="data")
        return True
    except (OSError, tarfile.TarError):  # a damaged pack: start cold, Mesa recompiles
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        return False


@contextlib.contextmanager
def mesa_cache(layout, artifact: Path, run: dict, scratch: Path, log=None) -> Iterator[Path | None]:
    """A fresh Mesa cache folder for one Vulkan run of `artifact`, warm from its pack when the
    store (or the machine's folder of packs) has one; after a successful run that started cold,
    the pack is stored. Yields None for runs that use no Vulkan driver."""
    driver = run.get("driver") if run.get("via") in ("vulkan", "twin") else None
    if driver not in ("lavapipe", "llvmpipe"):  # no driver, or one without Mesa's disk cache
        yield None
        return
    folder, work = scratch / "mesa-cache", scratch / "mesa-pack"
    for f in (folder, work):
        shutil.rmtree(f, ignore_errors=True)
        f.mkdir(parents=True)
    kind = cpu_kind()
    key, store = pack_key(artifact, driver, kind), Store(layout.store)
    machine = layout.shader_cache / "packs" / f"{key}.tar"
    source = None
    outputs = store.lookup(key)
    if outputs is not None:
        try:
            store.restore(outputs, work)
            source = "store" if _unpack(work / PACK, folder) else None
        except DamagedObject:
            pass
    if source is None and machine.is_file() and _unpack(machine, folder):
        source = "machine"
    _note(log, f"Mesa shader cache for {artifact.name} ({describe_kind(kind)}): "
          + (f"warm, from the {'build cache' if source == 'store' else 'machine folder ' + str(machine.parent)}"
             if source else "cold (no pack for these bytes, this driver build and this CPU kind yet)"))
    before = kernels(folder)
    yield folder
    compiled = kernels(folder) - before
    missed = bool(source) and compiled > 0
    why = ("no pack for these bytes, this driver build and this CPU kind" if not source else
           f"the pack from the {'build cache' if source == 'store' else 'machine folder'} missed "
           f"{compiled} kernel(s): made on a CPU Mesa tells apart from this one" if missed else "")
    if missed:
        _note(log, f"Mesa shader cache for {artifact.name}: {why}; the pack is stored again with them")
    timings.note("shader_pack", {"source": source or "none", "compiled": compiled,
                                 "cpu": describe_kind(kind), **({"why": why} if why else {})})
    if source != "store" or missed:
        _pack(folder, work / PACK)
        store.put(key, STAGE, {PACK: work / PACK})
    if source is None or missed:
        machine.parent.mkdir(parents=True, exist_ok=True)
        tmp = machine.with_name(f"{machine.name}.{os.getpid()}.tmp")
        shutil.copyfile(work / PACK, tmp)
        os.replace(tmp, machine)


def _note(log, text: str) -> None:
    if log is not None:
        with open(log, "a") as out:
            out.write(f"# {text}\n")
