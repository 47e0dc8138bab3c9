"""`doit timings`: where the last build's time went, and its critical path through the graph.

Reads the timing records the steps wrote (pipeline/core/timings.py: one per step, beside its log)
and the project's step graph: a step depends on the steps that made its input files and on
those it must run after. The critical path is the chain of steps whose times add up to the
most: no number of cores makes a cold build shorter than it, so it is where shortening a step
shortens the build. `doit build` prints the short form at its end (`build_summary`).
"""
from __future__ import annotations

import sys

from ..core import timings
from .stages import STAGES


def _graph(project) -> dict[str, tuple[object, list[str]]]:
    """task id (stage:name) -> (step, the task ids it waits for)."""
    steps = {}
    for stage in STAGES:
        try:
            for step in project.steps(stage.name):
                steps[f"{stage.name}:{step.name}"] = step
        except Exception:  # a stage whose steps need files a failed build did not make
            continue
    producer = {str(step.out_dir / o): tid for tid, step in steps.items() for o in step.outputs}
    graph = {}
    for tid, step in steps.items():
        before = {producer[str(p)] for p in step.inputs.values() if str(p) in producer}
        before |= {a for a in step.after if a in steps}
        graph[tid] = (step, sorted(before - {tid}))
    return graph


def critical_path(graph: dict, wall: dict[str, float]) -> list[tuple[str, float]]:
    """The chain of task ids with the largest sum of `wall` (seconds; 0 for steps not timed),
    first step first, each with its own time."""
    best: dict[str, tuple[float, str | None]] = {}

    def cost(tid: str, depth: int = 0) -> float:
        if tid not in best:
            if depth > 500:  # the graph is a DAG; a cycle would be a bug elsewhere
                return 0.0
            preds = [(cost(p, depth + 1), p) for p in graph[tid][1]]
            top = max(preds, default=(0.0, None))
            best[tid] = (top[0] + wall.get(tid, 0.0), top[1])
        return best[tid][0]

    if not graph:
        return []
    end = max(graph, key=cost)
    chain = []
    while end is not None:
        chain.append((end, wall.get(end, 0.0)))
        end = best[end][1]
    return chain[::-1]


def report(project, records: list[dict], slowest: int = 15) -> str:
    if not records:
        return ("no timing records under " f"{project.layout.root / 'logs'}: run `doit build` "
                "first (every step that runs writes one)")
    latest = {}
    for r in sorted(records, key=lambda r: r["finished"]):
        latest[f"{r['stage']}:{r['name']}"] = r
    worked = {tid: r["wall_s"] for tid, r in latest.items() if r["how"] in timings.WORKED}
    lines = [timings.summary(list(latest.values()), slowest=slowest)
             or "every step's last record is a restore or an up-to-date check: nothing ran"]
    chain = critical_path(_graph(project), worked)
    total = sum(w for _, w in chain)
    lines.append(f"critical path ({total:.1f} s of {sum(worked.values()):.1f} s of step time: "
                 f"the least a cold build takes with unlimited cores):")
    lines += [f"  {w:8.1f} s  {tid}" for tid, w in chain if w > 0]
    return "\n".join(lines)


def command(project) -> str:
    return report(project, timings.read_all(project.layout.root / "logs"))


def build_summary(layout, since: float) -> None:
    """The end of a `doit build`: what ran in this command, per stage, the slowest steps."""
    text = timings.summary(timings.read_all(layout.root / "logs", since))
    if text:
        print(text + "\n(`doit timings` adds the critical path)", file=sys.stderr)
