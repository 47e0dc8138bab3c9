"""The code a step ran, as one sha256: its stage module and every `pipeline` module it imports.

A step key holds this digest, so editing a stage, or any helper it reaches (numerics, sources,
iree_run...), re-runs exactly the steps whose code changed: there is no version number to forget,
and a shared cache never serves outputs made by other code.

Imports are read from the source text, not by importing: a line-based scan that may see more
than Python runs (an import under TYPE_CHECKING, one quoted in a docstring) but never less,
which for a cache key errs on the safe side. Data files of a package the closure touches (the
compilers' recorded tables) count as code. Everything is read once per process: about 10 ms for
the whole package, where parsing it with `ast` would take 0.2 s of every no-op build.
"""
from __future__ import annotations

import hashlib
import re
from functools import lru_cache
from pathlib import Path

PACKAGE = "pipeline"
ROOT = Path(__file__).resolve().parents[1]  # the pipeline/ folder

_FROM = re.compile(r"^[ \t]*from[ \t]+(\.*[\w.]*)[ \t]+import[ \t]+(\([^)]*\)|[^\n]*)", re.M)
_IMPORT = re.compile(r"^[ \t]*import[ \t]+([^\n]+)", re.M)


def _module(path: Path) -> str:
    parts = (PACKAGE,) + path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@lru_cache(maxsize=None)
def _sources() -> dict[str, tuple[Path, bytes]]:
    """module name -> (file, bytes) for every module of the package."""
    return {_module(p): (p, p.read_bytes()) for p in sorted(ROOT.rglob("*.py"))
            if "__pycache__" not in p.parts}


def _names(clause: str) -> list[str]:
    clause = clause.split("#")[0] if not clause.startswith("(") else clause
    clause = re.sub(r"#[^\n]*", "", clause).strip("()\\ \t\n")
    return [n.split()[0] for n in re.split(r"[,\n\\]+", clause) if n.strip()]


@lru_cache(maxsize=None)
def imports_of(module: str) -> frozenset[str]:
    """The package's modules that `module` imports (anywhere in its text), and the packages
    above them (importing a.b.c runs a/__init__ and a/b/__init__ first)."""
    mods = _sources()
    path, data = mods[module]
    text = data.decode()
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found: set[str] = set()
    for base, clause in _FROM.findall(text):
        level = len(base) - len(base.lstrip("."))
        name = base[level:]
        if level:
            target = package[: len(package) - level + 1] + ([name] if name else [])
            target = ".".join(target)
        else:
            target = name
        if target != PACKAGE and not target.startswith(PACKAGE + "."):
            continue
        found.add(target)
        found |= {f"{target}.{n}" for n in _names(clause)}
    for clause in _IMPORT.findall(text):
        found |= {n for n in _names(clause) if n == PACKAGE or n.startswith(PACKAGE + ".")}
    closed = set()
    for name in found:
        parts = name.split(".")
        closed |= {".".join(parts[:i]) for i in range(1, len(parts) + 1)}
    return frozenset(m for m in closed if m in mods and m != module)


@lru_cache(maxsize=None)
def closure(module: str) -> tuple[str, ...]:
    """`module` and every package module it reaches through imports, sorted."""
    seen, todo = set(), [module]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        todo.extend(imports_of(name) - seen)
    return tuple(sorted(seen))


@lru_cache(maxsize=None)
def _file_digest(path: Path) -> str:
    data = _sources()[_module(path)][1] if path.suffix == ".py" else path.read_bytes()
    return hashlib.sha256(data).hexdigest()


@lru_cache(maxsize=None)
def _data_files(folder: Path) -> tuple[Path, ...]:
    return tuple(p for p in folder.iterdir() if p.is_file() and p.suffix not in (".py", ".pyc"))


@lru_cache(maxsize=None)
def code_digest(module: str) -> str:
    """sha256 over the sources of `module`'s closure and the data files of their packages."""
    mods = _sources()
    if module not in mods:
        raise KeyError(f"{module} is not a module of {PACKAGE}/")
    files = {mods[m][0] for m in closure(module)}
    for folder in {f.parent for f in files}:
        files.update(_data_files(folder))
    listing = "".join(f"{p.relative_to(ROOT).as_posix()} {_file_digest(p)}\n" for p in sorted(files))
    return hashlib.sha256(listing.encode()).hexdigest()
