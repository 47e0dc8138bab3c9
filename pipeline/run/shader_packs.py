"""Mesa's shader cache, per Vulkan artifact, carried by the build cache.

lavapipe compiles every SPIR-V kernel with LLVM the first time a pipeline is made: minutes for a
detector, where a run from Mesa's on-disk cache takes seconds. So the cache a validation fills is
kept as one `shaders.tar` in the step store under a key of what decides it: the bytes of the
artifact that ran and the driver build (the sha256 of the lavapipe library and of the LLVM
library it links). It travels through the remote cache like a step's outputs, so a second
machine, a CI runner or a rebuild after an unrelated change validates the same artifact warm.
A folder of packs beside the workspace's Mesa cache (Layout.shader_cache/packs, or
$MODELYARD_SHADER_CACHE: one for several workspaces of a machine) is the machine-wide tier.

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


def pack_key(artifact: Path, driver: str) -> str:
    return step_key({"stage": STAGE, "artifact": sha256_file(artifact), "build": driver_build(driver)})


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
    if not driver:
        yield None
        return
    folder, work = scratch / "mesa-cache", scratch / "mesa-pack"
    for f in (folder, work):
        shutil.rmtree(f, ignore_errors=True)
        f.mkdir(parents=True)
    key, store = pack_key(artifact, driver), Store(layout.store)
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
    _note(log, f"Mesa shader cache for {artifact.name}: "
          + (f"warm, from the {'build cache' if source == 'store' else 'machine folder ' + str(machine.parent)}"
             if source else "cold (no pack for these bytes and this driver build yet)"))
    yield folder
    if source != "store":
        _pack(folder, work / PACK)
        store.put(key, STAGE, {PACK: work / PACK})
    if source is None:
        machine.parent.mkdir(parents=True, exist_ok=True)
        tmp = machine.with_name(f"{machine.name}.{os.getpid()}.tmp")
        shutil.copyfile(work / PACK, tmp)
        os.replace(tmp, machine)


def _note(log, text: str) -> None:
    if log is not None:
        with open(log, "a") as out:
            out.write(f"# {text}\n")
