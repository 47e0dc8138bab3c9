#!/usr/bin/env python3
"""Regenerate the vendored source archives of third_party/ from the public repositories.

    python third_party/regenerate.py                 # clone each repository at its pinned commit
    python third_party/regenerate.py --git iree-org/iree=/path/to/bare/repo ...   # use local copies
    python third_party/regenerate.py --check         # rebuild in a temporary folder, compare SHA256SUMS

Every archive is `git archive` of a pinned commit restricted to a file list, repacked
deterministically (sorted, mtime SOURCE_DATE_EPOCH=315532800, owner 0/0, mode 0644/0755,
xz preset 9, one thread): the same commit gives the same bytes. The archives unpack into one
tree, `iree/`, laid out as IREE's repository with its submodules (flatcc, Vulkan-Headers) in
place; cJSON unpacks into `cjson/`. The upstream fix iree-org/iree#24736 stays a separate patch
(iree-pr24736.patch), applied at build time (pipeline/stages/runtime.py), never to the archive.
Standard library and git only.
"""
from __future__ import annotations

import argparse
import hashlib
import io
import json
import lzma
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
EPOCH = 315532800
SOURCES = json.loads((HERE / "sources.json").read_text())


def _git_dir(repo: str, commit: str, given: dict[str, str], tmp: Path) -> Path:
    if repo in given:
        return Path(given[repo])
    dest = tmp / repo.replace("/", "+")
    subprocess.run(["git", "init", "-q", "--bare", str(dest)], check=True)
    subprocess.run(["git", "-C", str(dest), "fetch", "-q", "--depth", "1", "--filter=blob:none",
                    f"https://github.com/{repo}.git", commit], check=True)
    return dest


def _members(git_dir: Path, commit: str, paths: list[str]) -> list[tuple[str, bytes, int]]:
    """(path, bytes, mode) of each file of the list at the commit; a missing file is an error."""
    tar = subprocess.run(["git", "--git-dir", str(git_dir), "archive", "--format=tar", commit, "--", *paths],
                         check=True, capture_output=True).stdout
    out = []
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        for m in t.getmembers():
            if m.isfile():
                out.append((m.name, t.extractfile(m).read(), 0o755 if m.mode & 0o100 else 0o644))
    missing = sorted(set(paths) - {name for name, _, _ in out})
    if missing:
        raise SystemExit(f"regenerate: {len(missing)} listed files not at {commit}: {missing[:5]}")
    return out


def _pack(members: list[tuple[str, bytes, int]], dest: Path) -> None:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as t:
        for name, data, mode in sorted(members):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, EPOCH
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            t.addfile(info, io.BytesIO(data))
    dest.write_bytes(lzma.compress(raw.getvalue(), preset=9))


def regenerate(out: Path, given: dict[str, str]) -> dict[str, str]:
    files = (HERE / "iree-runtime.files").read_text().split()
    sums = {}
    with tempfile.TemporaryDirectory() as tmp:
        for src in SOURCES["archives"]:
            prefix, strip = src["unpack_to"], src["repo_path"]
            subs = [o["repo_path"] for o in SOURCES["archives"] if o["repo_path"]]
            if isinstance(src["files"], list):
                paths = src["files"]
            elif strip:
                paths = [f[len(strip):] for f in files if f.startswith(strip)]
            else:
                paths = [f for f in files if not any(f.startswith(s) for s in subs)]
            git_dir = _git_dir(src["repo"], src["commit"], given, Path(tmp))
            members = [(prefix + name, data, mode) for name, data, mode in _members(git_dir, src["commit"], paths)]
            _pack(members, out / src["archive"])
            for lic in src["licenses"]:
                (out / "licenses").mkdir(exist_ok=True)
                data = next((d for n, d, _ in members if n == prefix + lic["path"]), None)
                if data is None:
                    data = _members(git_dir, src["commit"], [lic["path"]])[0][1]
                (out / "licenses" / lic["as"]).write_bytes(data)
            sums[src["archive"]] = hashlib.sha256((out / src["archive"]).read_bytes()).hexdigest()
    return sums


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--git", action="append", default=[], metavar="OWNER/NAME=GIT_DIR",
                    help="a local (bare) copy of a repository instead of cloning it")
    ap.add_argument("--check", action="store_true", help="regenerate elsewhere and compare with SHA256SUMS")
    args = ap.parse_args()
    given = dict(g.split("=", 1) for g in args.git)
    if not args.check:
        sums = regenerate(HERE, given)
        (HERE / "SHA256SUMS").write_text("".join(f"{h}  {n}\n" for n, h in sorted(sums.items())))
        print("\n".join(f"{h}  {n}" for n, h in sorted(sums.items())))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        sums = regenerate(Path(tmp), given)
    recorded = dict(reversed(line.split()) for line in (HERE / "SHA256SUMS").read_text().splitlines())
    bad = [n for n in sums if recorded.get(n) != sums[n]]
    for n in bad:
        print(f"regenerate: {n} differs: recorded {recorded.get(n)}, regenerated {sums[n]}", file=sys.stderr)
    print("regenerate: all archives reproduce SHA256SUMS" if not bad else "regenerate: MISMATCH")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
