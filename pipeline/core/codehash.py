"""The code a step ran, as one sha256: its stage module, what it imports or runs, its backends.

That is: every `pipeline` module the stage module imports or runs in a child process, and the
backends its config names (nothing reached only through the backend registry).

A step key holds this digest, so editing a stage, or any helper it reaches (numerics, sources,
iree_run...), re-runs exactly the steps whose code changed: there is no version number to forget,
and a shared cache never serves outputs made by other code.

Imports are read from the source text, not by importing: a line-based scan that may see more
than Python runs (an import under TYPE_CHECKING, one quoted in a docstring) but never less,
which for a cache key errs on the safe side. A string literal that is exactly the name of one of
the package's modules counts as an import too: that is how a step runs one in a child process
(`python_module_argv(...)` of `pipeline.run.iree_run`, nnef-tools' `--custom-converters`). Data
files of a package the closure touches (the compilers' recorded tables) count as code.

A registry that imports its rows only when asked for (compilers/backends.py) declares them in a
module-level literal `LAZY`: rows of words and one "module:object", the words being how a
step's config names the row (a backend's name, its artifact format). The rows are not imports:
a step's digest holds the closure of the rows its config names (any string in it, key or value,
equal to a row's word), and nothing reached only through the registry. A step that asks the
registry for a row its key does not hold is refused (`running`, `check_covered`), so the key is
never narrower than the code that runs. Without a config (`code_digest(module)`), every row of
every registry the closure reaches counts.

Everything is read once per process: about 10 ms for the whole package, where parsing it with
`ast` would take 0.2 s of every no-op build (only a registry's `LAZY` literal is parsed).

    python -m pipeline.core.codehash --report    # modules per stage and backend key
"""
from __future__ import annotations

import ast
import contextlib
import contextvars
import hashlib
import re
import sys
from functools import lru_cache
from pathlib import Path
from typing import Iterator

from .errors import PipelineError

PACKAGE = "pipeline"
ROOT = Path(__file__).resolve().parents[1]  # the pipeline/ folder

_FROM = re.compile(r"^[ \t]*from[ \t]+(\.*[\w.]*)[ \t]+import[ \t]+(\([^)]*\)|[^\n]*)", re.M)
_IMPORT = re.compile(r"^[ \t]*import[ \t]+([^\n]+)", re.M)
_NAMED = re.compile(r"""["'](pipeline(?:\.\w+)+)["']""")   # a module named in quotes
_LAZY = re.compile(r"^LAZY\b[^=\n]*=", re.M)


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
    """The package's modules that `module` imports (anywhere in its text) or names as a string
    (a child process's `-m`), and the packages above them (importing a.b.c runs a/__init__ and
    a/b/__init__ first)."""
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
    found |= {n for n in _NAMED.findall(text) if n in mods}
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
def lazy_rows(module: str) -> tuple[tuple[frozenset, str], ...]:
    """The rows a registry module loads when asked for: (the words that name a row, its module),
    from its `LAZY` literal; () for a module with none."""
    text = _sources()[module][1].decode()
    if not _LAZY.search(text):
        return ()
    for node in ast.parse(text).body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "LAZY" for t in targets):
                rows = ast.literal_eval(node.value)
                return tuple((frozenset(row[:-1]), row[-1].partition(":")[0]) for row in rows)
    raise ValueError(f"{module}: LAZY is not a literal")  # a bug of the registry, not user error


def words(config) -> frozenset[str]:
    """Every string in a step's config, keys and values, at any depth."""
    found: set[str] = set()
    todo = [config]
    while todo:
        value = todo.pop()
        if isinstance(value, str):
            found.add(value)
        elif isinstance(value, dict):
            todo.extend(value.keys())
            todo.extend(value.values())
        elif isinstance(value, (list, tuple, set, frozenset)):
            todo.extend(value)
    return frozenset(found)


@lru_cache(maxsize=None)
def code_modules(module: str, named: frozenset[str] | None = None) -> tuple[str, ...]:
    """The modules a step of `module` runs: its closure, and the closure of each lazy row of a
    registry in it that `named` (the words of the step's config) names; None: every row."""
    mods = _sources()
    if module not in mods:
        raise KeyError(f"{module} is not a module of {PACKAGE}/")
    seen = set(closure(module))
    taken: set[str] = set()
    while True:
        rows = {target for m in seen for row_words, target in lazy_rows(m)
                if target not in taken and (named is None or row_words & named)}
        if not rows:
            return tuple(sorted(seen))
        taken |= rows
        for target in rows:
            seen.update(closure(target))


@lru_cache(maxsize=None)
def _file_digest(path: Path) -> str:
    data = _sources()[_module(path)][1] if path.suffix == ".py" else path.read_bytes()
    return hashlib.sha256(data).hexdigest()


@lru_cache(maxsize=None)
def _data_files(folder: Path) -> tuple[Path, ...]:
    return tuple(p for p in folder.iterdir() if p.is_file() and p.suffix not in (".py", ".pyc"))


@lru_cache(maxsize=None)
def _digest(modules: tuple[str, ...]) -> str:
    mods = _sources()
    files = {mods[m][0] for m in modules}
    for folder in {f.parent for f in files}:
        files.update(_data_files(folder))
    listing = "".join(f"{p.relative_to(ROOT).as_posix()} {_file_digest(p)}\n" for p in sorted(files))
    return hashlib.sha256(listing.encode()).hexdigest()


def code_digest(module: str, config=None) -> str:
    """sha256 over the sources of the modules a step of `module` with this config runs
    (code_modules) and the data files of their packages. Without a config: every lazy row."""
    return _digest(code_modules(module, None if config is None else words(config)))


def forget() -> None:
    """Drop what was read: the next digest reads the package again (a test that edits it)."""
    for cached in (_sources, imports_of, closure, lazy_rows, code_modules, _file_digest,
                   _data_files, _digest):
        cached.cache_clear()


# ----------------------------------------------------------------------------- the guard
_RUNNING: contextvars.ContextVar = contextvars.ContextVar("codehash_running", default=None)


@contextlib.contextmanager
def running(module: str, config, where: dict) -> Iterator[None]:
    """While a step runs here (in this thread), a registry's row it asks for must be one its
    key holds (check_covered). An action outside the package (a test's) is not checked."""
    if module not in _sources():
        yield
        return
    token = _RUNNING.set((code_modules(module, words(config)), where))
    try:
        yield
    finally:
        _RUNNING.reset(token)


def check_covered(entry: str, what: str) -> None:
    """Called by a registry before it hands out a row ("module:object"): refuses one that the
    running step's code digest does not hold (its config does not name it)."""
    state = _RUNNING.get()
    module = entry.partition(":")[0]
    if state is None or module in state[0]:
        return
    held, where = state
    raise PipelineError(
        f"the step asked for {what} ({module}), which its key's code digest does not hold: its "
        f"config names no word of that row, so an edit there would not re-run it",
        hint="name the backend in the stage's Config (its `compiler`, or the artifact's "
             "`format`), or import its module in the stage; see pipeline/core/codehash.py",
        **where)


# ----------------------------------------------------------------------------- report
def report() -> str:
    """Modules per stage key, by backend (the lazy rows of the registries): how wide each step's
    code digest is; and each backend module's own closure."""
    mods = _sources()
    rows = sorted({row for m in mods for row in lazy_rows(m)}, key=lambda r: r[1])
    label = {target: target.rsplit(".", 1)[1] for _, target in rows}
    out = [f"{len(mods)} modules in {PACKAGE}/; modules in a stage's key, by the backend its config names",
           f"{'stage':16} {'none':>6} " + " ".join(f"{label[t]:>14}" for _, t in rows)]
    for m in sorted(mods):
        if m.startswith(f"{PACKAGE}.stages."):
            counts = [len(code_modules(m, frozenset()))] + [len(code_modules(m, w)) for w, _ in rows]
            out.append(f"{m.rsplit('.', 1)[1]:16} " + " ".join(
                f"{c:>{6 if i == 0 else 14}}" for i, c in enumerate(counts)))
    out.append("a backend module's own closure: "
               + ", ".join(f"{label[t]} {len(closure(t))}" for _, t in rows))
    return "\n".join(out)


if __name__ == "__main__":
    if sys.argv[1:] != ["--report"]:
        sys.exit("usage: python -m pipeline.core.codehash --report")
    print(report())
