"""Where build time goes: each step's wall and CPU time, and the peak memory of the tools it ran.

A step that runs writes `logs/<stage>/<step>.timing.json` beside its log: how it came up to date
(`ran`, `restored` from the store, `fresh` on disk), wall seconds, CPU seconds of this process
and of the tools it started, and the largest resident set of any tool it started (Linux's
`wait4` rusage of each child; a tool that stays below the build process's own size is not
told apart from it, since Linux counts the forking process into the child's peak; onnxruntime
and the compilers' Python bindings run in-process, where only the time is measured). These figures are measurements, not build results: they live
outside the step key, the store and the manifest, so they never change an artifact's bytes.

`summary` reads the records a build wrote (those finished since it started) into the lines
`doit build` prints at its end: time per stage and the slowest steps. `doit timings` (see
pipeline/graph/timeline.py) adds the critical path through the graph.
"""
from __future__ import annotations

import contextlib
import json
import os
import resource
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

SUFFIX = ".timing.json"
WORKED = ("ran", "failed")  # steps whose time was spent on work (not restored, not fresh)
_local = threading.local()  # the current thread's meter: what the tools it waited for used
_lock = threading.Lock()
_active: set = set()        # the meters running now (doit -n N runs steps in threads)


def own_peak_kb() -> int:
    """The largest resident set this process has had (kB): its high-water mark."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def note_child(usage, parent_peak_kb: int) -> float:
    """Called by tools._stream with the rusage of each tool it waited for; returns the tool's
    CPU seconds (user + system, its own waited-for children included), which count towards the
    meter of the calling thread. Linux starts a forked child's peak at the size of the process
    that forked it, so a peak that is not above `parent_peak_kb` (our own high-water mark, which
    bounds our size at the fork) says nothing of the tool itself and is not counted."""
    cpu = usage.ru_utime + usage.ru_stime
    measured = getattr(_local, "measured", None)
    if measured is not None:
        measured.tools_cpu_s += cpu
        if usage.ru_maxrss > parent_peak_kb:
            _local.peak_kb = max(_local.peak_kb, int(usage.ru_maxrss))
    return cpu


@dataclass(eq=False)  # hashed by identity: meters running now are kept in a set
class Measured:
    wall_s: float = 0.0
    cpu_s: float = 0.0            # this process, user + system (this thread's alone when other
                                  # steps ran beside it: doit -n N)
    tools_cpu_s: float = 0.0      # the tools it waited for (and their children), user + system
    tools_peak_rss_mb: float | None = None  # None: no tool ran
    overlapped: bool = False      # another step ran in this process meanwhile
    notes: dict = field(default_factory=dict)  # what a step says of its own cost (note())


@contextlib.contextmanager
def meter():
    """Measure the body, in the calling thread: yields a Measured filled in when the body ends
    (also on failure). The tools' CPU and peak are those of the tools this thread waited for.
    This process's own CPU is the whole process's while the body ran alone, else only the
    calling thread's (onnxruntime's own threads are then not counted)."""
    result = Measured()
    saved = getattr(_local, "measured", None), getattr(_local, "peak_kb", 0)
    _local.measured, _local.peak_kb = result, 0
    with _lock:
        if _active:
            result.overlapped = True
            for other in _active:
                other.overlapped = True
        _active.add(result)
    start, t0, own0 = time.perf_counter(), os.times(), time.thread_time()
    try:
        yield result
    finally:
        t1 = os.times()
        with _lock:
            _active.discard(result)
        result.wall_s = time.perf_counter() - start
        result.cpu_s = (time.thread_time() - own0 if result.overlapped
                        else (t1.user - t0.user) + (t1.system - t0.system))
        if _local.peak_kb:
            result.tools_peak_rss_mb = round(_local.peak_kb / 1024, 1)
        _local.measured, _local.peak_kb = saved[0], max(saved[1], _local.peak_kb)
        if saved[0] is not None:  # a meter inside a meter: its tools count for the outer one too
            saved[0].tools_cpu_s += result.tools_cpu_s


def note(name: str, value) -> None:
    """Something the running step says of its own cost (e.g. whether its shader pack was warm),
    kept in its timing record; nothing when no meter runs in this thread."""
    measured = getattr(_local, "measured", None)
    if measured is not None:
        measured.notes[name] = value


def record_path(log: Path) -> Path:
    return log.with_name(log.name[: -len(".log")] + SUFFIX if log.name.endswith(".log")
                         else log.name + SUFFIX)


def write(log: Path, stage: str, name: str, how: str, measured: Measured) -> None:
    """The step's timing record beside its log (best effort: a full disk must not fail a step
    that succeeded because its timing could not be written)."""
    doc = {"stage": stage, "name": name, "how": how, "wall_s": round(measured.wall_s, 3),
           "cpu_s": round(measured.cpu_s, 3), "tools_cpu_s": round(measured.tools_cpu_s, 3),
           "tools_peak_rss_mb": measured.tools_peak_rss_mb, "finished": round(time.time(), 3)}
    if measured.overlapped:  # cpu_s is then this step's thread alone (see meter)
        doc["overlapped"] = True
    if measured.notes:
        doc["notes"] = measured.notes
    path = record_path(log)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(doc, sort_keys=True) + "\n")
        os.replace(tmp, path)
    except OSError:
        pass


def read_all(logs: Path, since: float = 0.0) -> list[dict]:
    """Every timing record under `logs` finished at or after `since` (epoch seconds)."""
    found = []
    for path in sorted(logs.glob(f"*/*{SUFFIX}")):
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if doc.get("finished", 0) >= since:
            found.append(doc)
    return found


def by_stage(records: list[dict]) -> list[tuple[str, int, float, float]]:
    """(stage, steps run, wall s, CPU s incl. tools) per stage, the costliest first."""
    totals: dict[str, list] = {}
    for r in records:
        if r["how"] not in WORKED:
            continue
        t = totals.setdefault(r["stage"], [0, 0.0, 0.0])
        t[0] += 1
        t[1] += r["wall_s"]
        t[2] += r["cpu_s"] + r["tools_cpu_s"]
    return sorted(((s, n, w, c) for s, (n, w, c) in totals.items()), key=lambda x: -x[2])


def summary(records: list[dict], slowest: int = 8) -> str:
    """The lines `doit build` prints at its end; empty when no step ran."""
    ran = [r for r in records if r["how"] in WORKED]
    if not ran:
        return ""
    restored = sum(r["how"] == "restored" for r in records)
    failed = sum(r["how"] == "failed" for r in records)
    lines = [f"modelyard: {len(ran)} steps ran{f' ({failed} failed)' if failed else ''} ({sum(r['wall_s'] for r in ran):.0f} s of step "
             f"time), {restored} restored from the store; time per stage:"]
    for stage, n, wall, cpu in by_stage(records):
        lines.append(f"  {stage:<14} {n:>3} steps  {wall:8.1f} s wall  {cpu:8.1f} s CPU")
    lines.append("slowest steps:")
    for r in sorted(ran, key=lambda r: -r["wall_s"])[:slowest]:
        mem = f", tools peak {r['tools_peak_rss_mb']:.0f} MB" if r["tools_peak_rss_mb"] else ""
        end = " (failed)" if r["how"] == "failed" else ""
        lines.append(f"  {r['wall_s']:8.1f} s  {r['stage']}:{r['name']}{mem}{end}")
    lines += shader_pack_lines(ran)
    return "\n".join(lines)


def shader_pack_lines(records: list[dict]) -> list[str]:
    """One line per step that ran on lavapipe: its shader pack warm, cold or missed, and why."""
    packs = [(r, r["notes"]["shader_pack"]) for r in records
             if "shader_pack" in r.get("notes", {})]
    if not packs:
        return []
    lines = ["shader packs (Mesa's cache for lavapipe):"]
    for r, p in sorted(packs, key=lambda rp: rp[0]["name"]):
        state = ("cold" if p["source"] == "none" else
                 "missed" if p.get("compiled") else f"warm ({p['source']})")
        why = f": {p['why']}" if p.get("why") else ""
        lines.append(f"  {state:<15} {r['stage']}:{r['name']} ({p['cpu']}; {p['compiled']} kernels "
                     f"compiled){why}")
    return lines
