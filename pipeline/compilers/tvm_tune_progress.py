"""The progress of a tuning run: the child's line per measured batch (`Progress`), and the
parent's display of it and of MetaSchedule's task scheduler log, streamed while the child runs.
"""
from __future__ import annotations

import threading
import time
from pathlib import Path

from ..core.tools import run_tool
from .tvm_tuning import PROGRESS


class Progress:
    """What the tuning child prints per measured batch: the task, its trials and best latency,
    the budget done (what the database already had, plus this run), the time since the run
    started and an estimate of the time left, from this run's measured rate."""

    def __init__(self, names: list[str], have: list[int], trials: int, already: int,
                 planned: int, emulated: bool, clock=time.time):
        self.names, self.trials = names, list(have)   # per task: its trials, the database's included
        self.budget, self.already, self.planned = trials, already, planned
        self.emulated, self.clock = emulated, clock
        self.best: dict[int, float] = {}
        self.run, self.started = 0, clock()
        self.members: list[int] = []    # the tasks of the running batch group, by its task ids

    def batch(self, task_id: int, latencies_s: list[float], failed: int) -> str:
        task = self.members[task_id]
        n = len(latencies_s) + failed
        self.trials[task] += n
        self.run += n
        if latencies_s:
            self.best[task] = min([*latencies_s, self.best.get(task, float("inf"))])
        best = self.best.get(task)
        note = " (emulated board: not a performance figure)" if self.emulated else ""
        elapsed = self.clock() - self.started
        left = elapsed / self.run * max(0, self.planned - self.run)
        return (f"[tune] task {task + 1}/{len(self.names)} {self.names[task]}: {self.trials[task]} "
                f"trials{f', best {best * 1e6:.1f} us{note}' if best is not None else ', no valid run yet'}"
                f"{f', {failed} failed' if failed else ''} | {self.already + self.run}/{self.budget} "
                f"trials, {elapsed:.0f} s, about {duration(left)} left")


def duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


SCHEDULER_NEWS = ("picks Task", "Sending", "Build errors", "has finished")


def follow_log(path: Path, prefix: str, done) -> None:
    """Print the task scheduler's news (task picked, batch built, batch measured) as it logs
    them: between two measured batches, its log is the live view."""
    offset = 0
    while not done.wait(1.0):
        try:
            with open(path, errors="replace") as f:
                f.seek(offset)
                chunk = f.read()
                offset = f.tell()
        except OSError:
            continue
        for line in chunk.splitlines():
            if any(k in line for k in SCHEDULER_NEWS):
                print(f"{prefix}{line.split('] ', 2)[-1].strip()}", flush=True)


def run_following(argv: list[str], log: Path, follow: Path, where: dict):
    """Run the tuning child (run_tool, streaming): its `[tune] ` lines are progress, printed as
    they come, as are the news of the scheduler's log `follow`; everything goes to `log`."""
    done = threading.Event()
    watcher = threading.Thread(target=follow_log, args=(follow, PROGRESS, done), daemon=True)
    watcher.start()
    try:
        return run_tool(argv, log=log, what="MetaSchedule tuning", on_line=print_progress,
                        hint="read the log; the trials measured so far are kept in the shared "
                             "database, and the next `doit tune` resumes from them", **where)
    finally:
        done.set()


def print_progress(line: str) -> None:
    if line.startswith(PROGRESS):
        print(line, flush=True)
