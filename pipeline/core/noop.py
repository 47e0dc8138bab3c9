"""The no-op build's fast path: answer "nothing to do" without loading the project.

A full load validates every spec (pydantic), imports every stage module and hashes their code:
~0.4 s before doit asks a single step whether it is up to date. When nothing changed since the
last successful build, that work gives the same graph again. So each successful `doit build`
leaves a snapshot of its graph (every step's file_dep, targets, task_dep and the value doit
compares for its config) in `artifacts/.cache/noop/`, under a key of the command's variables,
together with a fingerprint of everything the graph was made from:

- every file under the models folder, the target registry, the `pipeline` package (code and
  data) and dodo.py: path, size, mtime (what doit itself checks first);
- pyproject.toml in the working folder ([tool.modelyard] settings), the MODELYARD_* variables;
- the coverage verdicts the steps after `coverage` were made from;
- the Python interpreter and the folders of sys.path (installing or upgrading a package, i.e. a
  tool version in a step key, changes its site-packages folder).

The next `doit build` with the same variables stats those files; when the fingerprint matches,
it asks doit's own dependency check (doit.dependency, the same database and file checker) about
every step of the snapshot, and only when each one is up to date does it print them the way doit
does and exit. Anything else (a changed file, a step to run, another build holding the lock, a
command or option it does not know) falls through to the full load, so the fast path can only
ever skip work that the full path would also skip.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import sys
from pathlib import Path

from doit.dependency import Dependency, MD5Checker, SqliteDB
from doit.task import Task
from doit.tools import config_changed

VERSION = 1
FOLDER = Path(".cache") / "noop"
_PACKAGE = Path(__file__).resolve().parent.parent       # pipeline/
_OPTIONS_WITH_VALUE = {"-n", "--process", "-P", "--parallel-type", "-f", "--file"}


def build_vars(argv: list[str]) -> dict | None:
    """The variables of a plain `doit [build] [-n N] name=value...` command, else None."""
    words, values, skip = [], {}, False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        if arg in _OPTIONS_WITH_VALUE:
            skip = True
            if arg in ("-f", "--file"):
                values["__dodo__"] = str(Path(argv[i + 1]).resolve()) if i + 1 < len(argv) else ""
            continue
        if arg.startswith("-"):
            return None                               # an option this path does not know
        if "=" in arg:
            name, value = arg.split("=", 1)
            values[name] = value
        else:
            words.append(arg)
    if words not in ([], ["build"]) or "revalidate" in values:
        return None
    return values


def _tree(root: Path, out: list) -> None:
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except OSError:
        out.append((str(root), None))
        return
    for e in entries:
        if e.name == "__pycache__" or e.name.endswith(".pyc"):
            continue
        if e.is_dir(follow_symlinks=True):
            _tree(Path(e.path), out)
        else:
            try:
                st = e.stat()
                out.append((e.path, st.st_size, st.st_mtime_ns))
            except OSError:
                out.append((e.path, None))


def _stat(path: Path) -> tuple:
    try:
        st = path.stat()
        return (str(path), st.st_size, st.st_mtime_ns)
    except OSError:
        return (str(path), None)


def fingerprint(dodo: Path, values: dict, verdicts: list[str]) -> str:
    """sha256 over what the build graph is made from (see the module docstring)."""
    items: list = [VERSION, sys.prefix, sys.version, sorted(values.items()),
                   sorted((k, v) for k, v in os.environ.items() if k.startswith("MODELYARD_"))]
    items.append(_stat(dodo))
    items.append(_stat(Path.cwd() / "pyproject.toml"))
    for root in (Path(values.get("models", "models")).resolve(), _PACKAGE,
                 *([Path(values["targets"]).resolve()] if values.get("targets") else [])):
        _tree(root, items)
    items += [_stat(Path(p)) for p in sorted(set(sys.path)) if p.endswith("-packages")]
    items += [_stat(Path(p)) for p in verdicts]
    return hashlib.sha256(json.dumps(items, default=str).encode()).hexdigest()


def snapshot_path(artifacts: Path, values: dict) -> Path:
    key = {k: v for k, v in values.items() if k != "__dodo__"}
    key["__dodo__"] = values.get("__dodo__", "")
    digest = hashlib.sha256(json.dumps(sorted(key.items())).encode()).hexdigest()[:32]
    return artifacts / FOLDER / f"{digest}.json"


# ----------------------------------------------------------------------------- the fast path
def up_to_date(dodo: str, argv: list[str], say=print) -> bool:
    """True when the snapshot proves every step of this build up to date (it then printed them
    as doit does); False sends the caller down the full path."""
    values = build_vars(argv)
    if values is None:
        return False
    artifacts = Path(values.get("artifacts", "artifacts")).resolve()
    try:
        snap = json.loads(snapshot_path(artifacts, values).read_text())
    except (OSError, ValueError):
        return False
    if snap.get("version") != VERSION or snap.get("fingerprint") != fingerprint(
            Path(dodo).resolve(), values, snap.get("verdicts", [])):
        return False
    try:
        fd = os.open(artifacts / ".lock", os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a build running now: the full path waits
    except BlockingIOError:
        os.close(fd)
        return False
    try:
        titles = _check(snap)
    finally:
        os.close(fd)  # the lock goes with the descriptor
    if titles is None:
        return False
    say("".join(f"-- {t}\n" for t in titles), end="")
    return True


def _check(snap: dict) -> list[str] | None:
    if not Path(snap["dep_file"]).is_file():
        return None
    tasks = {}
    for t in snap["tasks"]:
        uptodate = [config_changed(t["config"])] if t["config"] is not None else [False]
        tasks[t["name"]] = Task(t["name"], [(_never, ())], file_dep=t["file_dep"],
                                targets=t["targets"], task_dep=t["task_dep"], uptodate=uptodate)
    dep = Dependency(SqliteDB, snap["dep_file"], checker_cls=MD5Checker)
    try:
        for task in tasks.values():
            if dep._get(task.name, "ignore:") or dep.get_status(task, tasks).status != "up-to-date":
                return None
    finally:
        dep.backend._conn.close() if hasattr(dep.backend, "_conn") else None
    return list(tasks)


def _never():  # pragma: no cover - the snapshot's tasks are checked, never run
    raise AssertionError("a no-op snapshot task was run")


# ----------------------------------------------------------------------------- the snapshot
def write(dodo: str, argv: list[str], artifacts: Path, dep_file: Path, tasks: list[dict],
          verdicts: list[Path], loaded_fingerprint: str | None) -> None:
    """After a successful build: record its graph, unless what it was made from changed while
    it ran (then the next build takes the full path, which is always right)."""
    values = build_vars(argv)
    if values is None:
        return
    dodo_path = Path(dodo).resolve()
    if loaded_fingerprint != fingerprint(dodo_path, values, []):
        return
    verdict_paths = sorted(str(p) for p in verdicts)
    snap = {"version": VERSION, "fingerprint": fingerprint(dodo_path, values, verdict_paths),
            "verdicts": verdict_paths, "dep_file": str(Path(dep_file).resolve()),
            "tasks": [{"name": t["name"], "file_dep": list(t["file_dep"]),
                       "targets": list(t["targets"]), "task_dep": list(t["task_dep"]),
                       "config": _config_value(t["uptodate"])} for t in tasks]}
    path = snapshot_path(artifacts, values)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(snap, sort_keys=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def _config_value(uptodate: list):
    """The value a step's config_changed compares (None: a step that always runs)."""
    (check,) = uptodate
    if check is False:
        return None
    return check._calc_digest()  # config_changed of a str compares the str itself


def loaded(dodo: str, argv: list[str]) -> str | None:
    """The fingerprint at load time (without verdicts), to compare with the one after the build."""
    values = build_vars(argv)
    return None if values is None else fingerprint(Path(dodo).resolve(), values, [])
