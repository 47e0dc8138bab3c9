"""One build at a time per artifacts folder: an advisory lock (fcntl.flock) on artifacts/.lock.

A second build on the same workspace (a developer's build beside `doit bench`, two CI jobs on
one runner) waits for the first, saying who holds the lock, or fails at once with wait=0.
The lock belongs to the open file, so it goes when the holder exits, even by kill -9: there is
no stale lock to remove by hand. Commands that only read (list, info, verify) take no lock.

Scratch folders are per process (Layout.scratch), so the scratch of a build killed midway is
never mistaken for another's; the lock holder removes what dead processes left (`sweep_scratch`).
"""
from __future__ import annotations

import atexit
import errno
import fcntl
import os
import shutil
import sys
import time
from pathlib import Path

from .errors import PipelineError

NAME = ".lock"
NOT_WRITABLE = (errno.EROFS, errno.EACCES, errno.EPERM)
_held: dict[Path, int] = {}  # artifacts root -> fd of the held lock (kept open for the process)


def _holder(path: Path) -> str:
    try:
        text = path.read_text().strip()
    except OSError:
        text = ""
    return text or "another process"


def acquire(root: Path, wait: bool = True, poll: float = 0.2, say=None) -> None:
    """Take the workspace lock of `root` for the rest of this process (re-entrant)."""
    root = Path(root).resolve()
    if root in _held:
        return
    path = root / NAME
    try:
        root.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as err:
        if err.errno not in NOT_WRITABLE:
            raise
        raise not_writable(root, err) from None
    said = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            holder = _holder(path)
            if not wait:
                os.close(fd)
                raise PipelineError(
                    f"{root} is in use by another build ({holder})", stage="lock",
                    hint="wait for it to finish, or run without wait=0 to wait for it") from None
            if not said:
                (say or _stderr)(f"modelyard: waiting for another build on {root} ({holder}) to finish "
                                 "(wait=0 fails at once instead)")
                said = True
            time.sleep(poll)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()}, {' '.join(sys.argv[1:3]) or 'doit'}, since "
                  f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode(), 0)
    _held[root] = fd
    sweep_scratch(root / ".tmp")
    atexit.register(shutil.rmtree, root / ".tmp" / str(os.getpid()), True)


def not_writable(root: Path, err: OSError) -> PipelineError:
    """The error for an artifacts folder this process cannot write (a read-only mount, another
    user's folder): every command that builds writes there."""
    return PipelineError(
        f"cannot write to the artifacts folder {root} ({err.strerror})", stage="lock",
        hint="give artifacts=DIR a folder you can write to, or make this one writable "
             "(doit list and doit info only read it)")


def writable(root: Path) -> bool:
    """Whether this process may write in `root` (or create it): False on a read-only mount."""
    root = Path(root).resolve()
    while not root.exists() and root != root.parent:
        root = root.parent
    return os.access(root, os.W_OK)


def release(root: Path) -> None:
    fd = _held.pop(Path(root).resolve(), None)
    if fd is not None:
        os.close(fd)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_scratch(tmp: Path) -> None:
    """Remove the per-process scratch folders (tmp/<pid>) of processes that are gone."""
    if not tmp.is_dir():
        return
    for entry in tmp.iterdir():
        if not (entry.name.isdigit() and _alive(int(entry.name))):
            shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink(missing_ok=True)


def _stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)
