"""sha256 helpers, canonical JSON, step keys, atomic writes and the content-addressed store.

The store maps a step key to the sha256 of each output it produced, and keeps every output
once, by its sha256:

    .store/keys/<key>.json        {"stage":..., "outputs": {"model.vmfb": {"sha256":..., "size":...}}}
    .store/objects/<aa>/<sha256>  the bytes

A key record is written only after all its objects are in place, so a step killed midway
leaves nothing that a later build mistakes for done. The layout is plain files so that a
shared remote cache can later serve the same keys to CI machines.
"""
from __future__ import annotations

import atexit
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

CHUNK = 1 << 20


def canonical_json(obj: Any) -> str:
    """Sorted keys, no whitespace noise, no NaN: the same object always gives the same text."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False)


def pretty_json(obj: Any) -> str:
    """Deterministic, human-readable JSON for files people open (manifests, reports)."""
    return json.dumps(obj, sort_keys=True, indent=2, ensure_ascii=True, allow_nan=False) + "\n"


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_text(text: str) -> str:
    return sha256_bytes(text.encode())


def _sha256_file_uncached(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


class HashMemo:
    """sha256 of files memoised by (inode, mtime_ns, size), as DVC does: unchanged files are not re-read.

    Saved as one JSON file; written atomically when the process exits, only if it changed.
    """

    def __init__(self, path: Path | None):
        self.path = path
        self.entries: dict[str, list] = {}
        self.dirty = False
        if path and path.is_file():
            try:
                self.entries = json.loads(path.read_text())
            except ValueError:
                self.entries = {}  # a damaged memo only costs re-hashing

    def sha256(self, path: Path) -> str:
        path = Path(path).resolve()
        st = path.stat()
        stamp = [st.st_ino, st.st_mtime_ns, st.st_size]
        hit = self.entries.get(str(path))
        if hit and hit[:3] == stamp:
            return hit[3]
        digest = _sha256_file_uncached(path)
        self.entries[str(path)] = stamp + [digest]
        self.dirty = True
        return digest

    def save(self) -> None:
        if self.path and self.dirty:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(self.path, canonical_json(self.entries))
            self.dirty = False


_memo = HashMemo(None)


def use_memo(path: Path) -> None:
    """Point the process-wide hash memo at `path` (called once by dodo.py)."""
    global _memo
    if _memo.path != path:
        _memo = HashMemo(path)
        atexit.register(_memo.save)


def sha256_file(path: Path) -> str:
    return _memo.sha256(Path(path))


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write to a sibling temporary file, fsync, then rename over `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def step_key(parts: dict) -> str:
    """The full sha256 of the canonical JSON of what a step was asked to do and what it read."""
    return sha256_text(canonical_json(parts))


class Store:
    """Content-addressed outputs of steps, by key."""

    def __init__(self, root: Path):
        self.root = Path(root)

    def _record(self, key: str) -> Path:
        return self.root / "keys" / f"{key}.json"

    def _object(self, digest: str) -> Path:
        return self.root / "objects" / digest[:2] / digest

    def lookup(self, key: str) -> dict | None:
        """The outputs recorded under `key`, if the record and every object are intact."""
        record = self._record(key)
        if not record.is_file():
            return None
        try:
            outputs = json.loads(record.read_text())["outputs"]
        except (ValueError, KeyError):
            return None
        for meta in outputs.values():
            obj = self._object(meta["sha256"])
            if not obj.is_file() or obj.stat().st_size != meta["size"]:
                return None
        return outputs

    def put(self, key: str, stage: str, files: dict[str, Path]) -> dict:
        """Copy `files` (name -> path) into the store, objects first, key record last."""
        outputs = {}
        for name, path in sorted(files.items()):
            digest = sha256_file(path)
            obj = self._object(digest)
            if not obj.is_file():
                obj.parent.mkdir(parents=True, exist_ok=True)
                tmp = obj.with_name(f".{digest}.{os.getpid()}.tmp")
                shutil.copyfile(path, tmp)
                os.replace(tmp, obj)
            outputs[name] = {"sha256": digest, "size": path.stat().st_size}
        atomic_write_text(self._record(key), pretty_json({"stage": stage, "outputs": outputs}))
        return outputs

    def restore(self, outputs: dict, into: Path) -> None:
        """Copy the objects of a recorded step into the folder `into`."""
        for name, meta in outputs.items():
            dest = into / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(self._object(meta["sha256"]), dest)
            if sha256_file(dest) != meta["sha256"]:
                raise OSError(f"store object for {name} is corrupt: {self._object(meta['sha256'])}")
