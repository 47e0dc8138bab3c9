"""Run doit in this process and kill -9 it at a chosen point inside one stage's `execute`.

    python tests/fault_driver.py STAGE POINT N [doit args...]

POINT names a function of the real code; the process kills itself on the N-th call of it made
while `execute` runs a step of STAGE (calls outside such steps are not counted):
    put        entry of Store.put (the outputs exist, nothing is in the store yet)
    put-done   return of Store.put (objects and key record stored, nothing published)
    publish    entry of steps._publish
    replace    before the N-th os.replace (store objects, the key record, each published
               output and step.json are all renamed into place)
    replaced   after the N-th os.replace
    copy       after the N-th store._copy_hashing (a store object's temp copy is written)
Exit code 3 when the point was never reached (the test then knows its point is wrong).
"""
from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pipeline.core import steps, store  # noqa: E402  (after the path is set)

STAGE, POINT, NTH = sys.argv[1], sys.argv[2], int(sys.argv[3])
_active = False
_calls = 0


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _counted(fn, after: bool = False):
    def wrapped(*args, **kwargs):
        global _calls
        if not _active:
            return fn(*args, **kwargs)
        _calls += 1
        if _calls == NTH and not after:
            _die()
        result = fn(*args, **kwargs)
        if _calls == NTH and after:
            _die()
        return result
    return wrapped


def _run_step(execute):
    def wrapped(step):
        global _active
        _active = step.stage == STAGE
        try:
            return execute(step)
        finally:
            _active = False
    return wrapped


if POINT == "put":
    store.Store.put = _counted(store.Store.put)
elif POINT == "put-done":
    store.Store.put = _counted(store.Store.put, after=True)
elif POINT == "publish":
    steps._publish = _counted(steps._publish)
elif POINT in ("replace", "replaced"):
    os.replace = _counted(os.replace, after=POINT == "replaced")
elif POINT == "copy":
    store._copy_hashing = _counted(store._copy_hashing, after=True)
else:
    raise SystemExit(f"unknown point {POINT!r}")
steps.execute = _run_step(steps.execute)

from doit.cmd_base import DodoTaskLoader  # noqa: E402
from doit.doit_cmd import DoitMain  # noqa: E402

code = DoitMain(DodoTaskLoader()).run(sys.argv[4:])
sys.exit(code if _calls >= NTH else 3)
