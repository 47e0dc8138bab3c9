"""What a command prints as its steps run (DOIT_CONFIG["reporter"]), and on Ctrl-C.

doit's console reporter, but a step's failure is its PipelineError paragraph (`[model=... stage=
...] what` / `log:` / `next:`) without doit's `TaskFailed - taskid:...` above it, and the steps a
failure held back are one line at the end ("12 steps not run because static:ppocr_det failed")
instead of one `UnmetDependency` paragraph each. A failure that carries a traceback (a bug, not
a PipelineError) is printed as doit prints it.

Ctrl-C: `excepthook` turns the KeyboardInterrupt that ends the command into one line naming the
step that was running; a step's outputs are published by rename, so the same command resumes.
`on_sigint` holds the KeyboardInterrupt back while a module is being imported: onnx and onnxsim
are nanobind extensions whose module init calls back into Python, and an exception raised there
ends the process in C++'s `terminate` (abort, a traceback and no line), not in Python.
"""
from __future__ import annotations

import _thread
import signal
import sys
import threading

from doit.exceptions import TaskFailed, UnmetDependency
from doit.reporter import ConsoleReporter

_running: set[str] = set()      # the steps running now (threads: -n N)
_lock = threading.Lock()
_started = False                # whether any step has started


class Reporter(ConsoleReporter):
    desc = "console; a failure in its own words; the steps it held back in one line"

    def __init__(self, outstream, options):
        super().__init__(outstream, options)
        self.causes: dict[str, frozenset] = {}   # failed or held-back task -> the failed steps behind it
        self.held: dict[str, frozenset] = {}     # held-back step -> the failed steps behind it

    def execute_task(self, task):
        global _started
        with _lock:
            _running.add(task.name)
            _started = True
        super().execute_task(task)

    def add_success(self, task):
        with _lock:
            _running.discard(task.name)

    def add_failure(self, task, fail):
        with _lock:
            _running.discard(task.name)
        if isinstance(fail, UnmetDependency):
            causes = frozenset().union(*(self.causes.get(n, {n}) for n in fail.message.split()))
            self.causes[task.name] = causes
            if task.actions and not task.name.startswith("_"):  # a step, not a group or private task
                self.held[task.name] = causes
            return
        self.causes[task.name] = frozenset({task.name})
        super().add_failure(task, fail)

    def _write_failure(self, result, write_exception=True):
        fail = result["exception"]
        if isinstance(fail, TaskFailed) and not fail.traceback:  # a PipelineError (core/steps.py)
            if write_exception:
                self.write(f"{fail.message.rstrip()}\n")
            return
        super()._write_failure(result, write_exception)

    def complete_run(self):
        for result in self.failures:
            task = result["task"]
            if not task.executed:
                continue
            verbosity = task.verbosity if task.verbosity is not None else 1  # doit's default
            show_err = verbosity < 1 or self.failure_verbosity > 0
            show_out = verbosity < 2 or self.failure_verbosity == 2
            err = "".join(a.err for a in task.actions if a.err) if show_err else ""
            out = "".join(a.out for a in task.actions if a.out) if show_out else ""
            if err.strip() or out.strip():  # what the step printed, if anything
                self.write(f"{'#' * 40}\n{task.name} printed:\n{err}{out}\n")
        for line in held_back(self.held):
            self.write(f"modelyard: {line}\n")
        if self.runtime_errors:
            self.write("#" * 40 + "\nExecution aborted.\n" + "\n".join(self.runtime_errors) + "\n")


def held_back(held: dict[str, frozenset]) -> list[str]:
    """One line per set of failed steps: how many steps they held back."""
    by_cause: dict[frozenset, int] = {}
    for causes in held.values():
        by_cause[causes] = by_cause.get(causes, 0) + 1
    lines = []
    for causes, n in sorted(by_cause.items(), key=lambda kv: sorted(kv[0])):
        names = sorted(causes)
        failed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
        lines.append(f"{n} step{'s' if n != 1 else ''} not run because {failed} failed")
    return lines


def excepthook(kind, value, tb) -> None:
    """sys.excepthook: Ctrl-C in one line; anything else as Python prints it."""
    if not issubclass(kind, KeyboardInterrupt):
        sys.__excepthook__(kind, value, tb)
        return
    with _lock:
        running = sorted(_running)
    where = (f"at step {', '.join(running)}" if running else
             "between steps" if _started else "before any step ran")
    print(f"\nmodelyard: interrupted {where}; run the same command to resume", file=sys.stderr,
          flush=True)


def _importing(frame) -> bool:
    """Whether the main thread is inside an import (a module's init may be running in C++)."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def on_sigint(signum, frame) -> None:
    """SIGINT's handler: KeyboardInterrupt, but not inside an import: retried 50 ms later."""
    if _importing(frame):
        timer = threading.Timer(0.05, _thread.interrupt_main, (signal.SIGINT,))
        timer.daemon = True
        timer.start()
        return
    raise KeyboardInterrupt


def install() -> None:
    """Ctrl-C as one line, never inside an import (dodo.py calls it once, in the main thread)."""
    sys.excepthook = excepthook
    signal.signal(signal.SIGINT, on_sigint)
