"""Threads that spin instead of waiting are demoted to SCHED_IDLE, so that the CPU goes to the
threads that work.

IREE's Vulkan driver waits for its queue with vkWaitSemaphores(WAIT_ANY, UINT64_MAX); lavapipe's
timelines are Mesa's emulated ones, so Mesa polls in a loop (clock_gettime, a mutex) instead of
sleeping: two threads of the runtime stay runnable for the whole run and take as much CPU as
the thread doing lavapipe's work (TOOLCHAIN.md, December 2026, second week). On SCHED_IDLE they
get a CPU only when no other thread wants it, and still see every completion when they do. Which
thread runs when changes no number lavapipe computes: outputs stay bit-identical.

Which threads spin is measured, never assumed by order or name: runnable at every sample of the
last `window` seconds, no voluntary context switch in that time, on a CPU for a good part of
it, and (almost) never a wait in its life. The last rule is what tells the thread doing
lavapipe's work apart: compiling one big kernel it ran 93 s without a wait (face_landmark, a
loaded 2-core machine), but it had waited for its jobs 23 times or more before each such
stretch; the two spinners had waited 0 to 2 times in their life (0 in 710 s). A thread on
SCHED_IDLE that waits is given its normal policy back (see Watcher). Measurements:
docs/measurements/2026-12-03-lavapipe-spin.md.
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

HZ = os.sysconf("SC_CLK_TCK")
EVERY = 0.5     # seconds between samples
WINDOW = 2.0    # seconds a thread must spin before it is demoted
WAITS = 5       # ... and the voluntary context switches it may have made in its whole life (the
                # spinners had made 0-2; lavapipe's worker 18 or more before its first long job)
BUSY = 0.05     # ... on a CPU for at least this share of it: its CPU time grows (on a shared
                # 2-core machine at load 10 a spinner got 0.12 of a CPU)


@dataclass(frozen=True)
class Sample:
    """One thread as /proc/PID/task/TID shows it at one moment."""
    state: str       # stat's state: R runnable, S sleeping, D in I/O, ...
    cpu: float       # seconds on a CPU so far (stat's utime + stime)
    voluntary: int   # status's voluntary_ctxt_switches: how often it gave the CPU up to wait


def parse(stat: str, status: str) -> Sample:
    """A Sample from the text of /proc/PID/task/TID/stat and .../status."""
    fields = stat[stat.rindex(")") + 2:].split()   # the name in parentheses may hold spaces
    voluntary = next(int(line.split()[1]) for line in status.splitlines()
                     if line.startswith("voluntary_ctxt_switches:"))
    return Sample(state=fields[0], cpu=(int(fields[11]) + int(fields[12])) / HZ, voluntary=voluntary)


def read_threads(pid: int | str = "self") -> dict[int, Sample]:
    """Every thread of process `pid` now (threads that end while being read are left out)."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out[int(task.name)] = parse((task / "stat").read_text(), (task / "status").read_text())
        except (OSError, ValueError, StopIteration):
            pass
    return out


def spinning(history: list[tuple[float, dict[int, Sample]]], window: float = WINDOW,
             busy: float = BUSY, waits: int = WAITS) -> set[int]:
    """The threads that spun through the last `window` seconds of `history` (samples (seconds,
    {tid: Sample}), oldest first): runnable in every sample of it, no voluntary context switch,
    on a CPU at least `busy` of the time, and no more than `waits` voluntary context switches
    in their life. Empty while the history is shorter than `window`."""
    if not history or history[-1][0] - history[0][0] < window:
        return set()
    now, last = history[-1]
    start = max(i for i, (t, _) in enumerate(history) if now - t >= window)
    span = history[start:]
    elapsed = now - span[0][0]

    def spun(tid: int, s: Sample) -> bool:
        return (s.voluntary <= waits
                and all(tid in threads and threads[tid].state == "R"
                        and threads[tid].voluntary == s.voluntary for _, threads in span)
                and s.cpu - span[0][1][tid].cpu >= busy * elapsed)
    return {tid for tid, s in last.items() if spun(tid, s)}


def woke(before: dict[int, Sample], now: dict[int, Sample]) -> set[int]:
    """The threads that waited (a voluntary context switch) between two samples."""
    return {tid for tid, s in now.items() if tid in before and s.voluntary != before[tid].voluntary}


@dataclass
class Watcher:
    """Samples the threads of `pid` every EVERY seconds from a thread of its own and demotes those
    that spin to SCHED_IDLE. A thread inherits its creator's policy: seen once, the main thread,
    runnable for 2 s while Python imported numpy and IREE, was taken for a spinner, and every
    thread of the Vulkan device it then started inherited SCHED_IDLE. So the main thread (it
    runs Python, never IREE's queue) is never demoted, a thread that starts on SCHED_IDLE after
    a demotion is given SCHED_OTHER at once, and so is a demoted thread that waits (on a busy
    machine a thread on SCHED_IDLE that is not a spinner may never run again to show it).
    `demoted` holds the threads ever demoted; `failed` says why a change was refused (once)."""
    pid: int | str = "self"
    window: float = WINDOW
    busy: float = BUSY
    waits: int = WAITS
    every: float = EVERY
    demoted: set = field(default_factory=set)
    restored: set = field(default_factory=set)
    failed: str = ""
    last: dict = field(default_factory=dict)  # the latest sample of every thread

    def __post_init__(self):
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="spin-watcher", daemon=True)

    def __enter__(self) -> "Watcher":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        history: list[tuple[float, dict[int, Sample]]] = []
        spared = {threading.get_native_id(), os.getpid() if self.pid == "self" else int(self.pid)}
        while not self._stop.is_set():
            try:
                now = read_threads(self.pid)
            except OSError:  # the process ended
                return
            born = set(now) - set(history[-1][1]) if history and self.demoted else set()
            for tid in (woke(history[-1][1], now) if history else set()) | born:
                if _policy_of(tid) == os.SCHED_IDLE and self._policy(tid, os.SCHED_OTHER):
                    self.restored.add(tid)
            history.append((time.monotonic(), now))
            self.last = now
            while len(history) > 2 and history[-1][0] - history[1][0] >= self.window:
                history.pop(0)
            for tid in spinning(history, self.window, self.busy, self.waits) - spared:
                if _policy_of(tid) != os.SCHED_IDLE and self._policy(tid, os.SCHED_IDLE):
                    self.demoted.add(tid)
            self._stop.wait(self.every)

    def _policy(self, tid: int, policy: int) -> bool:
        try:
            os.sched_setscheduler(tid, policy, os.sched_param(0))
            return True
        except ProcessLookupError:  # it ended
            return False
        except PermissionError as exc:
            self.failed = self.failed or f"thread {tid}: {exc}"
            return False

    def spin_cpu(self) -> float:
        """CPU seconds the demoted threads had used by the last sample (spinning, nearly all)."""
        return sum(self.last[tid].cpu for tid in self.demoted if tid in self.last)

    def describe(self) -> str:
        """One line for the log: what was demoted, given back, refused."""
        text = (f"spin watcher: {len(self.demoted)} spinning thread(s) demoted to SCHED_IDLE"
                + (f" ({', '.join(map(str, sorted(self.demoted)))})" if self.demoted else "")
                + (f", {len(self.restored)} given back when they waited" if self.restored else ""))
        return text + (f"; refused: {self.failed}" if self.failed else "")


def _policy_of(tid: int) -> int | None:
    try:
        return os.sched_getscheduler(tid)
    except ProcessLookupError:
        return None
