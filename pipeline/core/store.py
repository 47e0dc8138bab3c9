"""sha256 helpers, canonical JSON, step keys, atomic writes and the content-addressed store.

The store maps a step key to the sha256 of each output it produced, and keeps every output
once, by its sha256:

    .store/keys/<key>.json        {"stage":..., "outputs": {"model.vmfb": {"sha256":..., "size":...}}}
    .store/objects/<aa>/<sha256>  the bytes

A key record is written only after all its objects are in place and fsync'ed (file and folder),
so a step killed midway, or a machine that loses power, leaves nothing that a later build
mistakes for done. The store heals itself: `restore` checks each object's sha256 as it copies
it, evicts a damaged one (one line on stderr) and raises DamagedObject so that the step runs
instead; `put` replaces a damaged object; `verify` checks the whole store.

Behind it, when `configure` set one, is a remote cache (remote.py): a local miss is pulled from
it (record and objects, each checked), and what `put` stores is pushed when pushing is on.
Without a remote nothing more is imported. Hits, misses and bytes moved are counted for
`doit cache status` (remote.Stats).
"""
from __future__ import annotations

import atexit
import hashlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from . import remote
from .errors import PipelineError

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


def umask() -> int:
    """The process's umask, read without changing it (Linux: /proc), else by setting it back."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _temp_beside(path: Path) -> tuple[int, str]:
    """A new temporary file in path's folder, with the mode a plain new file gets (mkstemp
    makes 0600): (fd, name)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.fchmod(fd, 0o666 & ~umask())
    return fd, tmp


def fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write to a sibling temporary file, fsync, then rename over `path` (mode as the umask says)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _temp_beside(path)
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


class DamagedObject(OSError):
    """A store object whose bytes no longer match its sha256 (or that is gone). It was evicted
    when found: the caller runs the step instead of restoring it."""


# The cache of this process, set by configure(): the stats file, and the remote when one is set.
_stats: "remote.Stats | None" = None
_remote: "remote.Remote | None" = None


def configure(artifacts_root: Path, url: str | None = None, push: bool = False,
              pubkey: str | None = None, signing_key: str | None = None,
              timeout: float | None = None) -> None:
    """Set this process's cache (dodo.py calls it once, at load): every Store then counts its
    hits in <artifacts_root>/.cache/cache-stats.json and, with a `url`, pulls what the local
    store lacks from that remote (remote.py), and pushes what it stores when `push`.

    pubkey: a public key file (or PEM text): only records signed by it are pulled.
    signing_key: a private key file (or PEM text): pushed records are signed with it.
    timeout: seconds to connect and between reads (default remote.DEFAULT_TIMEOUT).
    Cheap: nothing is imported or contacted until a step needs the remote. Raises PipelineError
    when a key file cannot be read."""
    global _stats, _remote
    if _stats is not None:
        _stats.flush()
    url = url or None
    if url:
        remote.check_url(url)
        remote.check_key_source(pubkey, "cache public key (cache_pubkey)")
        remote.check_key_source(signing_key, "cache signing key (cache_key)")
    _stats = remote.Stats(Path(artifacts_root) / remote.STATS_FILE,
                          {"remote": url, "push": bool(url and push),
                           "signed": bool(url and signing_key), "pubkey": bool(url and pubkey)})
    _remote = remote.Remote(url, push=push, pubkey=pubkey, signing_key=signing_key,
                            timeout=timeout, stats=_stats) if url else None


def timeout_setting(value) -> float | None:
    """cache_timeout as given (a doit variable, the environment or pyproject.toml): seconds > 0,
    or None for the default."""
    if value in (None, ""):
        return None
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = -1.0
    if seconds <= 0:
        raise PipelineError(f"cache_timeout={value!r} is not a number of seconds above 0",
                            stage="cache", hint="e.g. cache_timeout=10 (the default)")
    return seconds


def configured_remote() -> "remote.Remote | None":
    return _remote


def flush_stats() -> None:
    """Write this process's counters now (they are written at exit anyway)."""
    if _stats is not None:
        _stats.flush()


def forget_stats() -> None:
    """Drop this process's counters unwritten (the cache commands: their work is no build's)."""
    if _stats is not None:
        _stats.forget()


def _count(**counts: int) -> None:
    if _stats is not None:
        _stats.add(**counts)


def _copy_hashing(src: Path, dest_fd: int) -> tuple[str, int]:
    """Copy the file `src` into the open file `dest_fd`; (sha256, size) of what was copied."""
    h, size = hashlib.sha256(), 0
    with open(src, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
            size += len(chunk)
            view = memoryview(chunk)
            while view:
                view = view[os.write(dest_fd, view):]
    return h.hexdigest(), size


def warn(line: str) -> None:
    print(f"modelyard: {line}", file=sys.stderr, flush=True)


class Store:
    """Content-addressed outputs of steps, by key; backed by the configured remote, if any."""

    STALE_TEMP_S = 3600  # verify() and gc remove temporary files older than this (a killed put)

    def __init__(self, root: Path):
        self.root = Path(root)

    def record_path(self, key: str) -> Path:
        return self.root / "keys" / f"{key}.json"

    def object_path(self, digest: str) -> Path:
        return self.root / "objects" / digest[:2] / digest

    def records(self) -> list[Path]:
        folder = self.root / "keys"
        return sorted(folder.glob("*.json")) if folder.is_dir() else []

    def objects(self) -> list[Path]:
        folder = self.root / "objects"
        return sorted(p for p in folder.glob("*/*") if not p.name.startswith(".")) \
            if folder.is_dir() else []

    def read_record(self, key: str) -> dict | None:
        try:
            record = json.loads(self.record_path(key).read_text())
            record["outputs"].items()
            return record
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None

    def _local(self, key: str) -> dict | None:
        record = self.read_record(key)
        if record is None:
            return None
        try:
            for meta in record["outputs"].values():
                if self.object_path(meta["sha256"]).stat().st_size != meta["size"]:
                    return None
        except (OSError, KeyError, TypeError):
            return None
        return record["outputs"]

    def lookup(self, key: str) -> dict | None:
        """The outputs recorded under `key`, if the record and every object are here (sizes
        checked; restore checks the sha256); else pulled from the remote, if one is configured
        and has them intact (and signed, when a public key is set)."""
        outputs = self._local(key)
        if outputs is not None:
            _count(lookups=1, local_hits=1)
            try:
                os.utime(self.record_path(key))  # newest first when gc keeps a size budget
            except OSError:
                pass
            return outputs
        _count(lookups=1)
        if _remote is None:
            return None
        outputs = self._pull(key)
        if outputs is not None:
            _count(remote_hits=1)
        return outputs

    def _pull(self, key: str) -> dict | None:
        """The record of `key` and its objects from the remote into this store, each object
        checked; the record is written last. None when the remote cannot give all of it."""
        record = _remote.get_record(key)
        if record is None:
            return None
        outputs = record["outputs"]
        for digest, size in sorted({(m["sha256"], m["size"]) for m in outputs.values()}):
            obj = self.object_path(digest)
            if obj.is_file() and obj.stat().st_size == size:
                continue
            self._object_folder(obj)
            fd, tmp = _temp_beside(obj)
            os.close(fd)
            try:
                if not _remote.fetch(digest, size, Path(tmp)):
                    return None
                self._place(Path(tmp), obj)
            finally:
                Path(tmp).unlink(missing_ok=True)
        atomic_write_text(self.record_path(key), pretty_json({"stage": record["stage"], "outputs": outputs}))
        return outputs

    @staticmethod
    def _object_folder(obj: Path) -> None:
        """Make the object's folder; a new one is made durable in its parent."""
        if not obj.parent.is_dir():
            obj.parent.mkdir(parents=True, exist_ok=True)
            fsync_dir(obj.parent.parent)

    @staticmethod
    def _place(tmp: Path, obj: Path) -> None:
        """Make the checked temporary file `tmp` the object `obj`: durable before any record
        names it (the file and its folder fsync'ed)."""
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, obj)
        fsync_dir(obj.parent)

    def _intact(self, digest: str, size: int) -> bool:
        obj = self.object_path(digest)
        try:
            return obj.stat().st_size == size and _sha256_file_uncached(obj) == digest
        except OSError:
            return False

    def put(self, key: str, stage: str, files: dict[str, Path]) -> dict:
        """Copy `files` (name -> path) into the store, objects first (fsync'ed, a damaged one
        replaced), key record last; then push them when the remote is configured to."""
        outputs = {}
        for name, path in sorted(files.items()):
            digest, size = sha256_file(path), Path(path).stat().st_size
            if not self._intact(digest, size):
                self._write_object(Path(path), digest)
            outputs[name] = {"sha256": digest, "size": size}
        atomic_write_text(self.record_path(key), pretty_json({"stage": stage, "outputs": outputs}))
        _count(stored=1)
        if _remote is not None and _remote.can_push:
            _remote.push(key, stage, outputs, self.object_path)
        return outputs

    def _write_object(self, src: Path, digest: str) -> None:
        obj = self.object_path(digest)
        self._object_folder(obj)
        fd, tmp = _temp_beside(obj)
        try:
            try:
                got, _ = _copy_hashing(src, fd)
                os.fsync(fd)
            finally:
                os.close(fd)
            if got != digest:
                raise OSError(f"{src} changed while it was stored (sha256 {got[:16]}, "
                              f"expected {digest[:16]})")
            os.replace(tmp, obj)
            fsync_dir(obj.parent)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def evict(self, digest: str, why: str) -> None:
        """Remove a damaged object, with a one-line warning (the records naming it stop
        matching: their steps run again, or are pulled again)."""
        self.object_path(digest).unlink(missing_ok=True)
        _count(evicted=1)
        warn(f"store object {self.object_path(digest)} {why}: evicted, the step runs again")

    def restore(self, outputs: dict, into: Path) -> None:
        """Copy the objects of a recorded step into the folder `into`, checking each one's
        sha256 as it is copied. A damaged or missing object is evicted (with a warning) and
        raises DamagedObject: the caller runs the step instead."""
        for name, meta in outputs.items():
            dest = Path(into) / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            digest, obj = meta["sha256"], self.object_path(meta["sha256"])
            fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
            try:
                got, size = _copy_hashing(obj, fd)
            except FileNotFoundError:
                got, size = None, None
            finally:
                os.close(fd)
            if (got, size) != (digest, meta["size"]):
                dest.unlink(missing_ok=True)
                why = ("is gone" if got is None else
                       f"is damaged ({size} bytes, sha256 {got[:16]}; expected {meta['size']} "
                       f"bytes, sha256 {digest[:16]})")
                if got is not None:
                    self.evict(digest, why)
                raise DamagedObject(f"store object {obj} ({name}) {why}: the step runs again")

    def verify(self) -> dict:
        """Check every object against its sha256 (evicting damaged ones), drop the records whose
        objects are gone or damaged, remove temporary files a killed write left behind.
        Returns {"objects", "bytes", "damaged": [sha256], "records", "dropped": [key], "temp"}."""
        summary = {"objects": 0, "bytes": 0, "damaged": [], "records": 0, "dropped": [], "temp": 0}
        folder = self.root / "objects"
        for path in sorted(folder.glob("*/*")) if folder.is_dir() else []:
            if path.name.startswith("."):
                summary["temp"] += self._remove_stale(path, time.time())
                continue
            got = _sha256_file_uncached(path)
            if got != path.name:
                self.evict(path.name, f"is damaged (sha256 {got[:16]})")
                summary["damaged"].append(path.name)
                continue
            summary["objects"] += 1
            summary["bytes"] += path.stat().st_size
        for record in self.records():
            key = record.stem
            if self._local(key) is None:
                record.unlink(missing_ok=True)
                summary["dropped"].append(key)
            else:
                summary["records"] += 1
        for path in (self.root / "keys").glob(".*.tmp") if (self.root / "keys").is_dir() else []:
            summary["temp"] += self._remove_stale(path, time.time())
        return summary

    def _remove_stale(self, path: Path, now: float) -> int:
        try:
            if now - path.stat().st_mtime > self.STALE_TEMP_S:
                path.unlink()
                return 1
        except OSError:
            pass
        return 0
