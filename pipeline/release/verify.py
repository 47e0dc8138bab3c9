"""`doit verify bundle=PATH`: prove that a release bundle is what was signed.

PATH is a release folder (artifacts/releases/<target>/<version>/), a folder unpacked from an
archive, or the .tar.gz itself. The key that must have signed it is pinned: pubkey=PATH, else
$MODELYARD_VERIFY_KEY, else `verify_key` in the [tool.modelyard] table of the project's
pyproject.toml (core/settings.py). Without a pinned key verify refuses (a signature checked
against the key the bundle names itself proves integrity, not who signed), unless
integrity_only=1 asks for exactly that: the report then says that authorship was not checked.
A pinned key is always checked, integrity_only=1 or not. Checked, every problem reported at
once and naming its file:
  * manifest.json.sig is a valid Ed25519 signature of manifest.json, by the pinned key;
  * every file the manifest lists is there, with its sha256 and size;
  * nothing is there that the manifest does not list; an archive holds regular files only,
    all under one top folder (no absolute paths, no `..`, no links, no devices, no duplicates);
  * in a release folder: the archive holds the same signed manifest, and the provenance is
    signed by the same key and names the archive's and the artifacts' sha256.
An archive is read as a stream and never unpacked to be checked; `into=DIR` unpacks it after
it passed, writing only under DIR (into a temporary folder renamed at the end), each file with
its mode from the archive made safe (safe_mode: 0755 for the runtime's programs, 0644 for the
rest; never setuid, setgid, sticky, group- or world-writable), so that the unpacked
runtime/<arch>/bin/modelyard-run runs as it is. The mode is the archive header's, not signed
by the manifest: an archive released with every member 0644 verifies and unpacks as 0644.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tarfile
import zlib
from pathlib import Path, PurePosixPath

from . import signing
from ..core.errors import PipelineError
from ..core.settings import setting

MANIFEST = "manifest.json"
SIGNATURE = "manifest.json.sig"
PROVENANCE = "provenance.intoto.jsonl"
CHUNK = 1 << 20


def digest(stream, sink=None) -> tuple[str, int]:
    """sha256 and size of a binary stream read to its end (copied to `sink` when given)."""
    h, size = hashlib.sha256(), 0
    while chunk := stream.read(CHUNK):
        h.update(chunk)
        size += len(chunk)
        if sink is not None:
            sink.write(chunk)
    return h.hexdigest(), size


def file_digest(path: Path) -> tuple[str, int]:
    """Never memoised: a tampered file keeps its size, and may keep its mtime."""
    with open(path, "rb") as f:
        return digest(f)


def archive_name(root: str) -> str:
    return f"{root}.tar.gz"


PIN_HINT = (f"pin the key the releases are signed with: pubkey=PATH, or ${signing.ENV_PUBKEY}=PATH, "
            f"or verify_key = \"PATH\" in the [tool.modelyard] table of pyproject.toml (PATH: the "
            f"public key, the .pub that `doit keygen` wrote); or say integrity_only=1 to check the "
            f"bundle's integrity alone, without knowing who signed it")


def pinned_key(pubkey: str | None = None, integrity_only: bool = False, what: str = "the bundle"):
    """The public key a bundle must be signed with: pubkey=PATH, else $MODELYARD_VERIFY_KEY, else
    `verify_key` in [tool.modelyard] of the pyproject.toml of the current folder (doit runs in
    the project's). None only when no key is pinned and integrity_only is set."""
    source = setting("verify_key", pubkey or None, env=signing.ENV_PUBKEY, path=True)
    if source:
        return signing.load_public_key(source, stage="verify")
    if integrity_only:
        return None
    raise PipelineError(f"no key is pinned, so nothing says who must have signed {what}: checked "
                        f"against the key it names itself, a bundle anyone re-signed would pass; "
                        f"nothing was checked", stage="verify", hint=PIN_HINT)


def verify(bundle: str | Path, pubkey: str | None = None, into: str | Path | None = None,
           integrity_only: bool = False) -> str:
    """Check a bundle against the pinned key (pinned_key); returns a summary, raises
    PipelineError listing every problem."""
    if not bundle:
        raise PipelineError("say which bundle: doit verify bundle=PATH (a release folder or its "
                            ".tar.gz)", stage="verify")
    return check_bundle(Path(bundle), pinned_key(pubkey, integrity_only, what=str(bundle)), into)


def check_bundle(bundle: Path, expected, into: str | Path | None = None) -> str:
    """verify() with the key already chosen: `expected`, a public key, or None to check
    integrity only (the summary then says that authorship was not checked)."""
    if bundle.is_dir():
        if into:
            raise PipelineError("into=DIR unpacks an archive; this bundle is a folder already",
                                stage="verify", hint="give bundle=<the .tar.gz>")
        return _verify_folder(bundle, expected)
    if not bundle.is_file():
        raise PipelineError(f"no bundle at {bundle}", stage="verify",
                            hint="give bundle=PATH: a release folder or its .tar.gz")
    summary = _verify_archive(bundle, expected)
    if into:
        summary += f"\nunpacked into {extract(bundle, Path(into))}"
    return summary


# ----------------------------------------------------------------------------- the common core
def _check(found: dict, manifest: bytes | None, signature: bytes | None, expected, where: str):
    """(manifest doc, key id, problems) for the files `found` (name -> (sha256, size))."""
    if manifest is None:
        return None, None, [f"{MANIFEST}: missing: this is not a release bundle"]
    problems = []
    try:
        doc = json.loads(manifest)
        listed = doc["files"]
    except (ValueError, KeyError, TypeError) as exc:
        return None, None, [f"{MANIFEST}: not a release manifest ({exc})"]
    kid = None
    if signature is None:
        problems.append(f"{SIGNATURE}: missing: the manifest is not signed")
    else:
        try:
            record = json.loads(signature)
        except ValueError as exc:
            record = {"error": str(exc)}
        kid, problem = signing.check(record, manifest, expected)
        if problem:
            problems.append(f"{MANIFEST}: {problem}")
    for name, meta in sorted(listed.items()):
        if name not in found:
            problems.append(f"{name}: listed in the manifest but missing from the {where}")
            continue
        sha, size = found[name]
        if sha != meta["sha256"] or size != meta["size"]:
            problems.append(f"{name}: sha256 {sha} ({size} bytes) does not match the manifest's "
                            f"{meta['sha256']} ({meta['size']} bytes)")
    for name in sorted(set(found) - set(listed) - {MANIFEST, SIGNATURE}):
        problems.append(f"{name}: in the {where} but not listed in the manifest")
    return doc, kid, problems


def _fail(bundle: Path, doc: dict | None, problems: list[str]):
    body = "\n".join(f"  - {p}" for p in problems)
    target = doc.get("target") if isinstance(doc, dict) else None
    return PipelineError(f"{bundle} failed verification, {len(problems)} problem(s):\n{body}",
                         stage="verify", target=target,
                         hint="do not ship it: rebuild the release, or fetch the bundle again")


def _who(kid: str, expected) -> str:
    if expected is not None:
        return f"signed by the expected key {kid[:16]}"
    return (f"signed by key {kid[:16]} as named in the bundle. INTEGRITY ONLY (integrity_only=1, "
            f"no key pinned): who signed it was NOT checked; pin the release key (pubkey=PATH, "
            f"${signing.ENV_PUBKEY} or verify_key in pyproject.toml) to check it")


def _summary(doc: dict, kid: str, expected, what: str) -> str:
    return (f"OK: {what}: {len(doc['files'])} files match the signed manifest of "
            f"{doc.get('target')} {doc.get('version')}; {_who(kid, expected)}")


# ----------------------------------------------------------------------------- folders
def _verify_folder(folder: Path, expected) -> str:
    found, problems = {}, []
    for path in sorted(folder.rglob("*")):
        name = path.relative_to(folder).as_posix()
        if path.is_symlink():
            problems.append(f"{name}: a symbolic link: bundles hold regular files only")
        elif path.is_file():
            found[name] = file_digest(path)
        elif not path.is_dir():
            problems.append(f"{name}: not a regular file")
    manifest = (folder / MANIFEST).read_bytes() if MANIFEST in found else None
    signature = (folder / SIGNATURE).read_bytes() if SIGNATURE in found else None
    try:
        root = json.loads(manifest).get("archive_root") if manifest else None
    except (ValueError, AttributeError):
        root = None
    extras = {archive_name(root), PROVENANCE} & set(found) if root else set()
    doc, kid, more = _check({k: v for k, v in found.items() if k not in extras}, manifest,
                            signature, expected, "folder")
    problems += more
    notes = []
    if extras and doc is not None and kid is not None:  # a release folder, not an unpacked archive
        problems += _release_extras(folder, doc, found, kid, expected, notes)
    if problems:
        raise _fail(folder, doc, problems)
    return "\n".join([_summary(doc, kid, expected, str(folder)), *notes])


def _release_extras(folder: Path, doc: dict, found: dict, kid: str, expected, notes: list) -> list:
    """The archive and the provenance beside a release folder's files."""
    problems = []
    root = doc["archive_root"]
    archive = archive_name(root)
    if archive not in found:
        problems.append(f"{archive}: missing from the release folder")
    else:
        try:
            _, _, inner = _archive_problems(folder / archive, expected)
            problems += [f"{archive}: {p}" for p in inner]
            with tarfile.open(folder / archive, "r:gz") as tar:
                signed = tar.extractfile(f"{root}/{MANIFEST}").read()
        except PipelineError as err:
            problems.append(f"{archive}: {err.what}")
        except KeyError:
            pass  # no manifest in the archive: reported above
        else:
            if signed != (folder / MANIFEST).read_bytes():
                problems.append(f"{archive}: holds another manifest than the folder's")
            notes.append(f"archive {archive}: sha256 {found[archive][0]}")
    if PROVENANCE not in found:
        return problems + [f"{PROVENANCE}: missing from the release folder"]
    try:
        envelope = json.loads((folder / PROVENANCE).read_text())
    except ValueError as exc:
        return problems + [f"{PROVENANCE}: not JSON ({exc})"]
    statement, signer, problem = signing.open_envelope(envelope, expected)
    if problem is None and signer != kid:
        problem = f"signed by key {signer[:16]}, the manifest by key {kid[:16]}"
    if problem:
        return problems + [f"{PROVENANCE}: {problem}"]
    want = {name: meta["sha256"] for name, meta in doc["files"].items()}
    if archive in found:
        want[archive] = found[archive][0]
    subjects = statement.get("subject", [])
    for subject in subjects:
        name, sha = subject.get("name"), subject.get("digest", {}).get("sha256")
        if want.get(name) != sha:
            problems.append(f"{PROVENANCE}: subject {name} has sha256 {sha}, the bundle's is "
                            f"{want.get(name, 'absent')}")
    if archive not in {s.get("name") for s in subjects}:
        problems.append(f"{PROVENANCE}: does not name the archive {archive} as a subject")
    notes.append(f"provenance: {len(subjects)} subjects, signed by the same key")
    return problems


# ----------------------------------------------------------------------------- archives
def member_path(member: tarfile.TarInfo, root: str | None) -> tuple[str | None, str | None]:
    """(path inside the bundle, problem) of an archive entry; the path is safe to join to a folder."""
    kind = ("a symbolic link" if member.issym() else "a hard link" if member.islnk()
            else "a folder" if member.isdir() else None if member.isfile() else "a special file")
    if kind:
        return None, f"{member.name}: {kind}: bundles hold regular files only"
    parts = PurePosixPath(member.name).parts
    if member.name.startswith("/") or ".." in parts or len(parts) < 2:
        return None, f"{member.name}: the path leaves the bundle's top folder"
    if root is not None and parts[0] != root:
        return None, f"{member.name}: outside the bundle's top folder {root}/"
    return "/".join(parts[1:]), None


def _damaged(archive: Path, exc: Exception) -> PipelineError:
    return PipelineError(f"{archive}: the archive is truncated or damaged ({type(exc).__name__}: "
                         f"{exc})", stage="verify",
                         hint="copy or download it again and compare its sha256 with the "
                              "release's provenance")


def _verify_archive(archive: Path, expected) -> str:
    doc, kid, problems = _archive_problems(archive, expected)
    if problems:
        raise _fail(archive, doc, problems)
    return _summary(doc, kid, expected, str(archive))


def _archive_problems(archive: Path, expected) -> tuple[dict | None, str | None, list[str]]:
    found, special, problems, root = {}, {}, [], None
    try:
        with tarfile.open(archive, "r:gz") as tar:
            for member in tar:
                name, problem = member_path(member, root)
                if problem:
                    problems.append(problem)
                    continue
                root = root or PurePosixPath(member.name).parts[0]
                if name in found:
                    problems.append(f"{member.name}: appears twice in the archive")
                    continue
                data = tar.extractfile(member)
                if name in (MANIFEST, SIGNATURE):
                    special[name] = data.read()
                    found[name] = (hashlib.sha256(special[name]).hexdigest(), len(special[name]))
                else:
                    found[name] = digest(data)
            digest(tar.fileobj)  # read past the tar's end to the gzip trailer: its CRC and length
    except (tarfile.TarError, EOFError, zlib.error, OSError) as exc:
        raise _damaged(archive, exc) from None
    doc, kid, more = _check(found, special.get(MANIFEST), special.get(SIGNATURE), expected, "archive")
    problems += more
    if doc is not None and root != doc.get("archive_root"):
        problems.append(f"{root}/: the top folder is not the manifest's {doc.get('archive_root')}/")
    return doc, kid, problems


def safe_mode(mode: int) -> int:
    """The mode an unpacked file gets from its archive entry's `mode`: its permission bits without
    setuid, setgid, sticky and group/other write, readable and writable by its owner (the rule
    of Python's tarfile "data" filter): 0755 stays 0755, 0644 stays 0644, 04777 becomes 0755."""
    return (mode & 0o755) | 0o600


def extract(archive: Path, into: Path) -> Path:
    """Unpack a verified archive under `into`, each file with safe_mode() of its entry's mode
    (exactly that: the umask does not narrow it); re-checks every file's sha256 while writing."""
    try:
        with tarfile.open(archive, "r:gz") as tar:
            root = PurePosixPath(tar.next().name).parts[0]
    except (tarfile.TarError, EOFError, zlib.error, OSError) as exc:
        raise _damaged(archive, exc) from None
    dest, partial = into / root, into / f".{root}.partial"
    if dest.exists():
        raise PipelineError(f"{dest} already exists: nothing was unpacked", stage="verify",
                            hint="unpack into an empty folder, or remove the old copy first")
    into.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    try:
        files = {}
        with tarfile.open(archive, "r:gz") as tar:
            for member in tar:
                name, problem = member_path(member, root)
                out = (partial / name).resolve() if name else None
                if problem or not out.is_relative_to(partial.resolve()):
                    raise PipelineError(f"{archive}: {problem or member.name}: refused while "
                                        f"unpacking", stage="verify")
                out.parent.mkdir(parents=True, exist_ok=True)
                with open(out, "xb") as sink:
                    files[name] = digest(tar.extractfile(member), sink)
                    os.fchmod(sink.fileno(), safe_mode(member.mode))
        listed = json.loads((partial / MANIFEST).read_bytes())["files"]
        changed = [n for n, meta in listed.items() if files.get(n) != (meta["sha256"], meta["size"])]
        if changed:
            raise PipelineError(f"{archive} changed while being unpacked: {', '.join(changed)}",
                                stage="verify", hint="unpack it again")
        os.rename(partial, dest)
    except (tarfile.TarError, EOFError, zlib.error) as exc:
        raise _damaged(archive, exc) from None
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return dest
