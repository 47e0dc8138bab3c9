"""The remote cache behind the local store: step key records and objects any runner reads and
trusted runners write, served through fsspec (`file://` for NFS, `s3://`, `gs://`, `http(s)://`
with the library's own backends: s3fs and gcsfs are installed by whoever uses those).

The layout is Bazel's HTTP remote cache protocol, plain GET and PUT, so that nginx with WebDAV
PUT, or bazel-remote (with `--disable_http_ac_validation`: the records are JSON, not protobuf),
serves it:

    <url>/ac/<key>       the key record: {"key", "stage", "outputs": {name: {sha256, size}}}
                         and, from a pusher with a signing key, "signature" (core/signing.py)
                         over RECORD_CONTEXT + canonical JSON of the record without it
    <url>/cas/<sha256>   the bytes of an object

Nothing pulled is trusted blindly: a record must name the key it is served under and only
plain relative output names; with a public key configured it must be signed by that key;
every object is checked against its sha256 and size before the store takes it (a damaged one is
discarded with a warning, and counts as a miss). The signature covers the key, so a record
cannot be replayed under another key.

Faults are not failures: a server that refuses, stalls, answers 5xx or drops the connection
mid-object makes the first operation that meets it warn once (one line on stderr) and the remote
is treated as absent for the rest of the process: the build goes on locally. A client error
(4xx) on a PUT only turns pushing off. Timeouts are bounded: `timeout` seconds (at most
CONNECT_TIMEOUT) to connect, `timeout` between two reads, and connect + `timeout` +
size / MIN_RATE in all for one transfer (async backends: HTTP, S3, GCS).

Pushes are objects first (skipped when the remote has them), record last; two runners pushing
the same key write the same bytes (a `file://` remote writes a temporary file and renames it,
an HTTP server such as nginx does the same with each PUT).

fsspec and aiohttp are imported at the first remote operation, never when no cache is set.
This module knows nothing of the local store's layout: store.py calls it.
"""
from __future__ import annotations

import atexit
import fcntl
import hashlib
import json
import os
import re
import sys
import time
import weakref
from pathlib import Path

from . import signing
from .errors import PipelineError

DEFAULT_TIMEOUT = 10.0   # seconds to connect, and between two reads of an answer
CONNECT_TIMEOUT = 5.0    # at most this to connect, whatever `timeout` says
MIN_RATE = 1 << 20       # bytes/s an object transfer must keep up on average
RECORD_CONTEXT = b"modelyard cache record v1\n"  # signed before the record: never a manifest
STATS_FILE = Path(".cache") / "cache-stats.json"  # under the artifacts folder
SHA256 = re.compile(r"^[0-9a-f]{64}$")
# Exceptions that are bugs in this code, never a remote's fault: they surface as tracebacks.
BUGS = (TypeError, AttributeError, NameError, AssertionError, SyntaxError, PipelineError)


class RemoteFault(Exception):
    """A remote operation failed for a reason of the remote's (down, slow, 5xx, dropped)."""


def warn(line: str) -> None:
    print(f"modelyard: {line}", file=sys.stderr, flush=True)


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def record_payload(key: str, stage: str, outputs: dict) -> dict:
    return {"key": key, "stage": stage, "outputs": outputs}


def signed_bytes(payload: dict) -> bytes:
    """What a record's signature covers: the context line and the canonical JSON of the record
    (key included) without its signature."""
    body = {k: v for k, v in payload.items() if k != "signature"}
    return RECORD_CONTEXT + json.dumps(body, sort_keys=True, separators=(",", ":"),
                                       ensure_ascii=True, allow_nan=False).encode()


def record_problem(key: str, record) -> str | None:
    """Why a pulled record cannot be used as the outputs of `key` (None: it can)."""
    if not isinstance(record, dict):
        return "not a JSON object"
    if record.get("key") != key:
        return f"it names key {str(record.get('key'))[:16]!r}, not the key it is served under"
    if not isinstance(record.get("stage"), str) or not isinstance(record.get("outputs"), dict):
        return "no stage or outputs"
    for name, meta in record["outputs"].items():
        if not isinstance(name, str) or "\\" in name or \
                any(part in ("", ".", "..") for part in name.split("/")):
            return f"output name {name!r} is not a plain relative path"
        if (not isinstance(meta, dict) or not SHA256.match(str(meta.get("sha256")))
                or type(meta.get("size")) is not int or meta["size"] < 0):
            return f"output {name!r} has no valid sha256 and size"
    return None


class Stats:
    """Counters of one build, written (merged with the build's other processes) to a small JSON
    file in the artifacts folder for `doit cache status`.

    A build is the process that configured the cache and the processes it forks (doit -n):
    they share `build`; a file written by another build is started afresh. The configuring
    process writes at exit; a forked process writes after each change (it may leave with
    os._exit)."""

    FIELDS = ("lookups", "local_hits", "remote_hits", "remote_misses", "rejected", "damaged",
              "objects_pulled", "bytes_pulled", "objects_pushed", "bytes_pushed", "records_pushed",
              "stored", "evicted")

    def __init__(self, path: Path | None, info: dict):
        self.path, self.info = path, info
        self.pid = os.getpid()
        self.build = f"{self.pid}-{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}"
        self.counts = dict.fromkeys(self.FIELDS, 0)
        self.faults: list[str] = []
        _ALL_STATS.add(self)
        if path is not None:
            atexit.register(self.flush)

    def add(self, **counts: int) -> None:
        for name, n in counts.items():
            self.counts[name] += n
        if os.getpid() != self.pid:
            self.flush()

    def fault(self, line: str) -> None:
        self.faults.append(line)
        if os.getpid() != self.pid:
            self.flush()

    def forget(self) -> None:
        self.counts = dict.fromkeys(self.FIELDS, 0)
        self.faults = []

    def flush(self) -> None:
        if self.path is None or not (any(self.counts.values()) or self.faults):
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            with os.fdopen(os.dup(fd), "rb") as f:
                text = f.read()
            try:
                doc = json.loads(text)
            except ValueError:
                doc = {}
            if not isinstance(doc, dict) or doc.get("build") != self.build:
                doc = {"build": self.build, **self.info, "counts": {}, "faults": []}
            for name, n in self.counts.items():
                doc["counts"][name] = doc["counts"].get(name, 0) + n
            doc["faults"] += [f for f in self.faults if f not in doc["faults"]]
            data = (json.dumps(doc, sort_keys=True, indent=2) + "\n").encode()
            os.ftruncate(fd, 0)
            os.pwrite(fd, data, 0)
        finally:
            os.close(fd)
        self.forget()


_ALL_STATS: "weakref.WeakSet[Stats]" = weakref.WeakSet()


def _forget_in_child() -> None:
    """A forked process starts counting from zero: its parent writes what it counted itself."""
    for stats in list(_ALL_STATS):
        stats.forget()


os.register_at_fork(after_in_child=_forget_in_child)


def read_stats(artifacts_root: Path) -> dict | None:
    try:
        return json.loads((Path(artifacts_root) / STATS_FILE).read_text())
    except (OSError, ValueError):
        return None


def describe(exc: BaseException, timeout: float) -> str:
    """A fault in a few words: what a person reading the warning needs."""
    aiohttp = sys.modules.get("aiohttp")  # only http(s) remotes raise its errors
    if aiohttp and isinstance(exc, aiohttp.ClientResponseError):
        return f"HTTP {exc.status} {exc.message}".strip()
    if aiohttp and isinstance(exc, aiohttp.ClientPayloadError):
        got = re.search(r"received \d+ of \d+ bytes", str(exc))
        return "the connection dropped mid-body" + (f" ({got.group(0)})" if got else "")
    if aiohttp and isinstance(exc, aiohttp.ClientConnectorError):
        return f"cannot connect to {exc.host}:{exc.port} ({type(exc.os_error).__name__})"
    if type(exc).__name__ == "FSTimeoutError" and exc.__cause__ is not None:
        return describe(exc.__cause__, timeout)  # fsspec wraps every timeout in its own
    if aiohttp and isinstance(exc, aiohttp.ServerTimeoutError):
        return f"no answer within the {timeout:g} s timeout"
    if isinstance(exc, TimeoutError):  # the bound on a whole transfer
        return "the transfer took longer than its time bound"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


class Remote:
    """One remote cache, for the life of a process (see the module's docstring)."""

    def __init__(self, url: str, *, push: bool = False, pubkey: str | None = None,
                 signing_key: str | None = None, timeout: float | None = None,
                 stats: Stats | None = None):
        self.url = url.rstrip("/")
        self.push_enabled = bool(push)
        self.pubkey_source, self.signing_source = pubkey, signing_key
        self.timeout = float(timeout) if timeout else DEFAULT_TIMEOUT
        self.stats = stats or Stats(None, {})
        self.down: str | None = None       # why the remote is off for the rest of the process
        self.push_down: str | None = None  # why pushing is off (a 4xx on PUT)
        self.damaged_on_remote: set[str] = set()  # objects to upload again when pushing
        self._warned: set[str] = set()
        self._fs = self._fs_pid = self._root = None
        self._async = False
        self._keys: dict[str, object] = {}
        self._http = self.url.split("://", 1)[0].lower() in ("http", "https")
        self._local = "://" not in self.url or self.url.lower().startswith("file://")

    # ---- transport ---------------------------------------------------------------------------
    @property
    def fs(self):
        """The fsspec file system, made at first use (again in a forked process). Raises
        RemoteFault when it cannot be made (an unknown protocol, a backend not installed)."""
        if self._fs is None or self._fs_pid != os.getpid():
            try:
                import fsspec  # fsspec: 0.05 s, not needed by doit list
                import fsspec.asyn  # fsspec: 0.05 s, not needed by doit list
                options = {"skip_instance_cache": True}
                if self._http:
                    options["client_kwargs"] = {"timeout": self._client_timeout()}
                fs, root = fsspec.core.url_to_fs(self.url, **options)
                self._async = isinstance(fs, fsspec.asyn.AsyncFileSystem)
                if self._local:
                    for folder in ("ac", "cas"):
                        fs.makedirs(f"{root.rstrip('/')}/{folder}", exist_ok=True)
            except BUGS:
                raise
            except Exception as exc:
                raise RemoteFault(f"opening the cache failed ({describe(exc, self.timeout)})") from exc
            self._fs, self._root, self._fs_pid = fs, root.rstrip("/"), os.getpid()
        return self._fs

    def _client_timeout(self):
        """aiohttp's bounds for every request: to connect, and between two reads."""
        import aiohttp  # aiohttp: 0.3 s, not needed by doit list
        connect = min(self.timeout, CONNECT_TIMEOUT)
        return aiohttp.ClientTimeout(total=None, connect=connect, sock_connect=connect,
                                     sock_read=self.timeout)

    def _kw(self, size: int = 0) -> dict:
        """Per-operation options: the bound on one whole transfer of `size` bytes (fsspec's own
        `timeout` of its blocking calls, which cancels the operation; async backends only)."""
        bound = min(self.timeout, CONNECT_TIMEOUT) + self.timeout + size / MIN_RATE
        return {"timeout": bound} if self._async else {}

    def _path(self, kind: str, name: str) -> str:
        self.fs  # noqa: B018 (makes _root)
        return f"{self._root}/{kind}/{name}"

    def _call(self, what: str, fn, *args, absent_ok: bool = True, **kwargs):
        """fn(*args, **kwargs); FileNotFoundError (a miss) passes through when `absent_ok`; any
        other failure but a bug in this code is the remote's: RemoteFault."""
        try:
            return fn(*args, **kwargs)
        except FileNotFoundError as exc:
            if absent_ok:
                raise
            raise RemoteFault(f"{what} failed (not found: {exc})") from exc
        except BUGS:
            raise
        except Exception as exc:
            raise RemoteFault(f"{what} failed ({describe(exc, self.timeout)})") from exc

    def _write(self, what: str, fn, *args, **kwargs):
        """A write: a 404 (say, a server that cannot create the folder) is a fault too."""
        return self._call(what, fn, *args, absent_ok=False, **kwargs)

    def _size_on_remote(self, kind: str, name: str) -> int | None:
        """The size of <url>/<kind>/<name>, None when absent."""
        path = self._path(kind, name)
        try:
            info = self._call(f"checking {kind}/{name}", self.fs.info, path, **self._kw())
        except FileNotFoundError as exc:
            cause = exc.__cause__  # fsspec's HTTP info() turns every failure into this one
            if self._http and cause is not None and getattr(cause, "status", None) != 404:
                raise RemoteFault(f"checking {kind}/{name} failed "
                                  f"({describe(cause, self.timeout)})") from cause
            return None
        return info.get("size")

    def _upload(self, kind: str, name: str, size: int, local: Path | None = None,
                data: bytes | None = None) -> None:
        """PUT the file `local` (or the bytes `data`) as <url>/<kind>/<name>. Raises RemoteFault."""
        path, what = self._path(kind, name), f"uploading {kind}/{name}"
        if self._http:  # one PUT; the server writes a temporary file and renames it (nginx does)
            if local is not None:
                self._write(what, self.fs.put_file, str(local), path, method="put",
                           headers={"Content-Length": str(size)}, **self._kw(size))
            else:
                self._write(what, self.fs.pipe_file, path, data, **self._kw(size))
            return
        # a file system: write a temporary file, then rename (a reader never sees half an
        # object); object stores: a PUT is atomic by itself
        target = self._path(kind, f".{name}.{os.getpid()}.{os.urandom(8).hex()}.tmp") \
            if self._local else path
        try:
            if local is not None:
                self._write(what, self.fs.put_file, str(local), target)
            else:
                self._write(what, self.fs.pipe_file, target, data)
            if target != path:
                self._write(what, self.fs.mv, target, path)
        except BaseException:
            if target != path:
                try:
                    self.fs.rm_file(target)
                except (OSError, ValueError):
                    pass
            raise

    # ---- faults and warnings -------------------------------------------------------------------
    def _fault(self, fault: RemoteFault, pushing: bool = False) -> None:
        cause = fault.__cause__
        status = getattr(cause, "status", None)
        if pushing and isinstance(status, int) and 400 <= status < 500 and status not in (408, 429):
            self.push_down = str(fault)
            line = (f"remote cache {self.url}: {fault}: pushing is off for the rest of this run "
                    f"(pulling goes on)")
        else:
            self.down = str(fault)
            line = (f"remote cache {self.url}: {fault}; building locally "
                    f"(the remote cache is off for the rest of this run)")
        self.stats.fault(line)
        self._warn_once("push" if self.push_down == str(fault) else "fault", line)

    def _warn_once(self, kind: str, line: str) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            warn(line)

    # ---- keys --------------------------------------------------------------------------------
    def _pubkey(self):
        if "pub" not in self._keys:
            self._keys["pub"] = signing.load_public_key(self.pubkey_source, env=None, stage="cache")
        return self._keys["pub"]

    def _signing_key(self):
        if "priv" not in self._keys:
            self._keys["priv"] = signing.load_private_key(
                self.signing_source, env=None, stage="cache",
                hint="set cache_key (MODELYARD_CACHE_KEY) to a private key made by `doit keygen`")
        return self._keys["priv"]

    # ---- pulling -----------------------------------------------------------------------------
    def get_record(self, key: str) -> dict | None:
        """The outputs record {"stage", "outputs"} the remote holds under `key`; None on a miss,
        a record that is malformed, unsigned or wrongly signed (with a public key set), or a
        fault."""
        if self.down:
            return None
        try:
            data = self._call("reading a key record", self.fs.cat_file, self._path("ac", key),
                              **self._kw())
        except FileNotFoundError:
            self.stats.add(remote_misses=1)
            return None
        except RemoteFault as fault:
            self._fault(fault)
            return None
        try:
            record = json.loads(data)
        except ValueError:
            record = None
        problem = record_problem(key, record) if record is not None else "not JSON"
        if problem:
            self.stats.add(damaged=1, remote_misses=1)
            warn(f"remote cache {self.url}: ignoring the key record ac/{key}: {problem}")
            return None
        if self.pubkey_source:
            problem = self._signature_problem(record)
            if problem:
                self.stats.add(rejected=1, remote_misses=1)
                self._warn_once("rejected", f"remote cache {self.url}: ignoring key records not "
                                f"signed by the cache public key (first: ac/{key[:16]}: {problem}); "
                                f"`doit cache status` counts them")
                return None
        return {"stage": record["stage"], "outputs": record["outputs"]}

    def _signature_problem(self, record: dict) -> str | None:
        signature = record.get("signature")
        if not isinstance(signature, dict):
            return "unsigned"
        return signing.check(signature, signed_bytes(record), self._pubkey())[1]

    def fetch(self, digest: str, size: int, into: Path) -> bool:
        """Download object `digest` into the file `into`, checked against its sha256 and size.
        False (and no file) on a miss, a damaged object (with a warning naming it) or a fault."""
        if self.down:
            return False
        into = Path(into)
        try:
            self._call(f"downloading cas/{digest}", self.fs.get_file, self._path("cas", digest),
                       str(into), **self._kw(size))
        except FileNotFoundError:
            into.unlink(missing_ok=True)
            self.stats.add(damaged=1)
            warn(f"remote cache {self.url}: object cas/{digest} is missing (a key record lists "
                 f"it); the step runs locally")
            return False
        except RemoteFault as fault:
            into.unlink(missing_ok=True)
            self._fault(fault)
            return False
        got_size = into.stat().st_size
        got = file_sha256(into) if got_size == size else None
        if got != digest:
            into.unlink(missing_ok=True)
            self.damaged_on_remote.add(digest)
            self.stats.add(damaged=1)
            found = f"{got_size} bytes" + (f", sha256 {got[:16]}" if got else "")
            warn(f"remote cache {self.url}: discarding the damaged object cas/{digest} "
                 f"({found}; the record says {size} bytes); the step runs locally")
            return False
        self.stats.add(objects_pulled=1, bytes_pulled=size)
        return True

    # ---- pushing -----------------------------------------------------------------------------
    @property
    def can_push(self) -> bool:
        return self.push_enabled and not self.down and not self.push_down

    def push(self, key: str, stage: str, outputs: dict, object_path, strict: bool = False) -> bool:
        """Upload the objects the remote lacks (object_path(sha256) -> local file), then the
        record, signed when a signing key is set. False after a fault (warned once); with
        strict=True a fault raises RemoteFault instead (explicit commands)."""
        if not (strict or self.can_push):
            return False
        try:
            for digest, size in sorted({(m["sha256"], m["size"]) for m in outputs.values()}):
                self.put_object(digest, size, object_path(digest))
            self.put_record(key, stage, outputs)
        except RemoteFault as fault:
            if strict:
                raise
            self._fault(fault, pushing=True)
            return False
        return True

    def put_object(self, digest: str, size: int, local: Path) -> bool:
        """Upload one object unless the remote has it (at that size, and not found damaged);
        True when uploaded. Raises RemoteFault."""
        if digest not in self.damaged_on_remote and self._size_on_remote("cas", digest) == size:
            return False
        self._upload("cas", digest, size, local=Path(local))
        self.damaged_on_remote.discard(digest)
        self.stats.add(objects_pushed=1, bytes_pushed=size)
        return True

    def put_record(self, key: str, stage: str, outputs: dict) -> None:
        payload = record_payload(key, stage, outputs)
        if self.signing_source:
            payload["signature"] = signing.sign(self._signing_key(), signed_bytes(payload))
        data = (json.dumps(payload, sort_keys=True, indent=2) + "\n").encode()
        self._upload("ac", key, len(data), data=data)
        self.stats.add(records_pushed=1)


def check_key_source(source: str | None, what: str) -> None:
    """Fail at configuration (not in every step) when a key path cannot be read."""
    if source and not source.lstrip().startswith("-----BEGIN") and not os.access(source, os.R_OK):
        raise PipelineError(f"cannot read the {what} {source}", stage="cache",
                            hint="point the setting at a readable PEM file (`doit keygen key=PATH` "
                                 "makes a pair), or leave it unset")


def check_url(url: str) -> None:
    """Fail at configuration when no fsspec file system serves the URL's scheme (a typo such as
    `htps://`, or a scheme nobody serves caches over): otherwise it would only surface when a
    step first asks the remote, and a build with every step up to date would accept it."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else "file"
    from fsspec.registry import known_implementations  # fsspec: 0.05 s, only with cache= set
    if scheme not in known_implementations and scheme != "file":
        raise PipelineError(f"cache={url}: no file system serves the scheme {scheme}://", stage="cache",
                            hint="give a file:// folder, an http(s):// server, s3:// or gs:// "
                                 "(docs/cache.md), or leave cache= unset")
