"""Where build time goes (issue 32, item 1): each step's timing record, the summary `doit build`
prints at its end, `doit timings` with the critical path; none of it in a step key or artifact."""
from __future__ import annotations

import json
import os
import shutil

from conftest import add_tiny_model, ran
from pipeline.core import timings
from pipeline.graph.timeline import critical_path


def _records(ws) -> dict:
    return {f"{r['stage']}:{r['name']}": r for r in timings.read_all(ws.artifacts / "logs")}


def test_every_step_that_runs_records_its_time_and_the_build_prints_where_it_went(workspace):
    add_tiny_model(workspace.models, "alpha", seed=1)
    first = workspace.build("target=host")
    records = _records(workspace)
    for task in ran(first):
        assert records[task]["how"] == "ran", task
    compiled = records["iree_compile:host/alpha/cpu-x86_64"]
    assert compiled["wall_s"] > 0 and compiled["tools_cpu_s"] > 0  # iree-compile is a child
    assert "steps ran" in first.stderr and "slowest steps:" in first.stderr
    assert "iree_compile" in first.stderr.split("time per stage:")[1]

    manifest = (workspace.artifacts / "host" / "manifest.json").read_bytes()
    report = workspace.doit("timings", "target=host")
    assert report.returncode == 0, report.stderr
    path = report.stdout.split("critical path")[1].splitlines()[1:]
    stages = [line.split()[2].split(":")[0] for line in path if line.strip()]
    assert stages[0] == "import" and stages[-1] == "manifest", report.stdout  # source to manifest
    assert "static" in stages and "validate" in stages

    # a record is a measurement, outside keys and outputs: steps brought back from the store
    # (their folders gone) are restored under the same keys, the manifest byte for byte
    compile_dir = workspace.artifacts / "host" / "alpha" / "cpu-x86_64" / "iree_compile"
    key = json.loads((compile_dir / "step.json").read_text())["key"]
    assert not any(o.endswith(timings.SUFFIX) for o in json.loads(
        (compile_dir / "step.json").read_text())["outputs"])
    shutil.rmtree(compile_dir)
    os.remove(workspace.artifacts / "host" / "manifest.json")
    workspace.build("target=host")
    assert _records(workspace)["iree_compile:host/alpha/cpu-x86_64"]["how"] == "restored"
    assert json.loads((compile_dir / "step.json").read_text())["key"] == key
    assert (workspace.artifacts / "host" / "manifest.json").read_bytes() == manifest


def test_a_tool_bigger_than_the_build_process_reports_its_peak_memory():
    import sys
    from pipeline.core.tools import run_tool
    grow = "x = bytearray({mb} * 2**20); x[::4096] = b'1' * len(x[::4096])"
    parent_mb = timings.own_peak_kb() / 1024   # our high-water mark: what a child starts from
    with timings.meter() as big:
        run_tool([sys.executable, "-c", grow.format(mb=int(parent_mb) + 300)], log=None, what="grow")
    assert parent_mb + 250 < big.tools_peak_rss_mb < parent_mb + 600 and big.tools_cpu_s > 0
    with timings.meter() as small:  # smaller than us: Linux counts our size into its peak
        run_tool([sys.executable, "-c", "pass"], log=None, what="nothing")
    assert small.tools_peak_rss_mb is None and small.wall_s > 0


def test_critical_path_is_the_heaviest_chain():
    graph = {"a": (None, []), "b": (None, ["a"]), "c": (None, ["a"]), "d": (None, ["b", "c"])}
    assert critical_path(graph, {"a": 1, "b": 5, "c": 2, "d": 1}) == [("a", 1), ("b", 5), ("d", 1)]
    assert critical_path(graph, {"a": 1, "b": 1, "c": 7, "d": 0.5}) == [("a", 1), ("c", 7), ("d", 0.5)]


def test_summary_counts_failed_steps_and_ignores_restored_ones():
    recs = [{"stage": "static", "name": "m", "how": "failed", "wall_s": 3.0, "cpu_s": 1.0,
             "tools_cpu_s": 0.0, "tools_peak_rss_mb": None, "finished": 1.0},
            {"stage": "golden", "name": "m", "how": "restored", "wall_s": 0.1, "cpu_s": 0.1,
             "tools_cpu_s": 0.0, "tools_peak_rss_mb": None, "finished": 1.0},
            {"stage": "validate", "name": "t/m/a", "how": "ran", "wall_s": 9.0, "cpu_s": 1.0,
             "tools_cpu_s": 20.0, "tools_peak_rss_mb": 812.4, "finished": 2.0}]
    text = timings.summary(recs)
    assert text.startswith("modelyard: 2 steps ran (1 failed)") and "1 restored" in text
    lines = text.splitlines()
    assert lines[1].split()[0] == "validate"          # the costliest stage (CPU) first
    slow = lines[lines.index("slowest steps:") + 1:]
    assert "validate:t/m/a, tools peak 812 MB" in slow[0] and slow[1].endswith("static:m (failed)")
    assert timings.summary(recs[1:2]) == ""           # nothing ran: nothing printed
