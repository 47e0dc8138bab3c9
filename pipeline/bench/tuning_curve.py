"""Trials vs latency: what a model's tuning bought, measured (`doit tune target=T curve=1`).

For each TVM artifact of the target with a tuning database (the tvm_tune step's output: the
model's records, in the order they were measured), the model is compiled with the records
measured first up to each checkpoint (by default 0 = untuned, 25, 50 and 100 % of them: a
compile each, no tuning), and the builds are timed with onnxruntime on the golden inputs, in
interleaved rounds (every build and onnxruntime once per round, the order rotating), so that a
burst of load from another process hits them all and their ratios hold. A measurement, never
cached: written on every run, next to the artifact.

    artifacts/<target>/<model>/<abi>/tuning_curve.json
    {
      "schema": "modelyard.tuning-curve/1",
      "target": "host", "model": "ppocr_det", "abi": "cpu-x86_64-tvm",
      "database": {"source": "tuned", "step_key": "<sha256>", "trials": 64,   # records it holds
                   "trials_budget": 64, "per_task": 1, "tasks": 76},
      "machine": {...},   "threads": 2,   "started_utc": "2026-12-01T10:00:00+00:00",
      "window": {"warmup": 1, "rounds": 20, "ended_by": "rounds" | "seconds", "seconds": 41.2},
      "onnxruntime": {"p50_ms": 38.1, ...},              # run/timing.py stats()
      "points": [                                        # by trials, ascending
        {"percent": 0, "trials": 0, "workloads_tuned": 0, "so_sha256": "<sha256>",
         "compile_s": 61.0, "stats": {"p50_ms": 912.4, ...},
         "ratio_to_onnxruntime": 23.9,                   # median of the per-round ratios
         "max_abs_vs_golden": 2.1e-06},
        ...]
    }
"""
from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from ..compilers import tuning_db
from ..compilers.builds import built_abis
from ..compilers.tvm_backend import TVM
from ..core.errors import PipelineError
from ..core.store import atomic_write_text, pretty_json, sha256_file
from ..core.tools import run_tool
from ..run.timing import OnnxruntimeCpuRunner, paired_ratio_p50, stats
from ..run.tvm_timing import TvmCpuRunner
from ..spec.tvm import budget
from ..stages import tvm_compile, tvm_tune
from .measure import machine

SCHEMA = "modelyard.tuning-curve/1"
STAGE = "tuning_curve"
VARS = ("points", "rounds", "seconds", "warmup", "threads")


@dataclass(frozen=True)
class Options:
    """`doit tune ... curve=1 [points=0,25,50,100] [rounds=20] [seconds=60] [warmup=1] [threads=N]`."""
    points: tuple[int, ...] = (0, 25, 50, 100)   # percent of the database's trials
    rounds: int = 20
    seconds: float = 60.0
    warmup: int = 1
    threads: int | None = None

    @classmethod
    def from_vars(cls, raw: dict) -> "Options":
        try:
            opts = cls(points=tuple(sorted({int(p) for p in (raw.get("points") or "0,25,50,100")
                                            .split(",")})),
                       rounds=int(raw.get("rounds") or 20), seconds=float(raw.get("seconds") or 60),
                       warmup=int(raw.get("warmup") or 1),
                       threads=int(raw["threads"]) if raw.get("threads") else None)
        except ValueError as exc:
            raise PipelineError(f"tuning curve: a setting is not a number ({exc})", stage=STAGE,
                                hint="points=0,25,50,100 rounds=20 seconds=60 warmup=1 threads=2")
        if not opts.points or min(opts.points) < 0 or max(opts.points) > 100 or opts.rounds < 1:
            raise PipelineError(f"tuning curve: points must be percentages (0 to 100) and rounds "
                                f"at least 1, got points={raw.get('points')} rounds={opts.rounds}",
                                stage=STAGE, hint="points=0,25,50,100 rounds=20")
        return opts


def checkpoints(n_records: int, percents) -> list[tuple[int, int]]:
    """(percent, trials) per checkpoint: the first round(percent * n / 100) records; two
    percentages that come to the same number of trials are one point (the lower percent)."""
    out, seen = [], set()
    for p in sorted(percents):
        k = round(p * n_records / 100)
        if k not in seen:
            seen.add(k)
            out.append((p, k))
    return out


def interleaved(runners: list, inputs: list, rounds: int, seconds: float, warmup: int,
                clock=time.perf_counter_ns) -> dict:
    """Every runner once per round, the order rotating by one each round; per runner its
    per-round times (ns) and last outputs. Ends after `rounds` or `seconds`, whichever first."""
    for _ in range(warmup):
        for run in runners:
            run(inputs)
    samples = [[] for _ in runners]
    outputs: list = [None] * len(runners)
    start, ended_by, done = clock(), "rounds", 0
    while done < rounds:
        if done and seconds and clock() - start >= seconds * 1e9:
            ended_by = "seconds"
            break
        for i in [(done + j) % len(runners) for j in range(len(runners))]:
            t0 = clock()
            _, outputs[i] = runners[i](inputs)
            samples[i].append(clock() - t0)
        done += 1
    return {"samples_ns": samples, "outputs": outputs, "rounds": done, "ended_by": ended_by,
            "seconds": round((clock() - start) / 1e9, 3)}


def table(doc: dict) -> list[str]:
    head = (f"tuning curve {doc['target']}/{doc['model']}/{doc['abi']}: {doc['window']['rounds']} "
            f"interleaved rounds, {doc['threads']} threads; onnxruntime p50 "
            f"{doc['onnxruntime']['p50_ms']:.3f} ms")
    rows = [head, f"  {'trials':>6}  {'%':>4}  {'p50 ms':>10}  {'x onnxruntime':>13}  tuned kernels"]
    for p in doc["points"]:
        rows.append(f"  {p['trials']:>6}  {p['percent']:>4}  {p['stats']['p50_ms']:>10.3f}  "
                    f"{p['ratio_to_onnxruntime']:>13.2f}  {p['workloads_tuned']}")
    return rows


# ----------------------------------------------------------------------------- the command
def command(project, target: str | None, model: str | None, raw: dict) -> str:
    """`doit tune ... curve=1`, after the tuning: a curve per tuned TVM artifact of the target."""
    opts = Options.from_vars(raw)
    found = [(m, t, a) for t in project.targets if t.name == target for m in project.models
             if model in (None, m.name) and budget(m, t) for a in built_abis(project, m, t, TVM)]
    if not found:
        raise PipelineError(f"tuning curve: no model{' ' + model if model else ''} has a TVM "
                            f"tuning budget for {target}", stage=STAGE, target=target,
                            hint="set tvm.tune.<target> in a model.yaml, then doit tune")
    lines = []
    for m, t, a in found:
        doc = curve(project, m, t, a, opts)
        path = project.layout.tuning_curve(t.name, m.name, a.name)
        atomic_write_text(path, pretty_json(doc))
        lines += table(doc) + [f"  written to {path}"]
    return "\n".join(lines)


def curve(project, model, target, abi, opts: Options) -> dict:
    import numpy as np  # numpy: 0.2 s, not needed by doit list

    layout = project.layout
    where = {"stage": STAGE, "model": model.name, "target": f"{target.name}/{abi.name}"}
    tune = tvm_tune.tune_step(project, model, target, abi)
    comp = tvm_compile.compile_step(project, model, target, abi)
    try:
        record = json.loads(tune.record.read_text())
        report = json.loads((tune.out_dir / "tune.json").read_text())
    except (OSError, ValueError):
        raise PipelineError(f"no tuning database for {tune.name} yet", **where,
                            hint=f"doit tune target={target.name} model={model.name} "
                                 f"(or doit build, with a pinned database)") from None
    db = tuning_db.Database.read(tune.out_dir)
    golden = layout.model_stage(model.name, "golden")
    doc = json.loads((golden / "golden.json").read_text())
    inputs = [np.load(golden / e["file"], allow_pickle=False) for e in doc["inputs"]]
    expected = [np.load(golden / e["file"], allow_pickle=False) for e in doc["outputs"]]
    static = comp.inputs["model"]
    threads = opts.threads or len(os.sched_getaffinity(0))
    points = []
    with tempfile.TemporaryDirectory(prefix="modelyard-curve-") as tmp:
        for percent, k in checkpoints(len(db.records), opts.points):
            folder = Path(tmp) / f"{k}"
            part = tuning_db.Database(db.workloads, db.records[:k], {})
            if k:
                part.write(folder)
            else:
                folder.mkdir()
            so = folder / "model.so"
            print(f"[curve] {tune.name}: compiling with the first {k} of {len(db.records)} "
                  f"trials", flush=True)
            started = time.perf_counter()
            run_tool(tvm_compile.compile_argv(static, comp.config, so, folder if k else None),
                     log=layout.log(STAGE, tune.name), what="TVM compile (tuning curve)",
                     timeout=3600, hint="read the log", **where)
            points.append({"percent": percent, "trials": k,
                           "workloads_tuned": len({i for i, _ in db.records[:k]}),
                           "so": so, "compile_s": round(time.perf_counter() - started, 1)})
        print(f"[curve] {tune.name}: timing {len(points)} builds and onnxruntime, interleaved",
              flush=True)
        runners = [TvmCpuRunner(p["so"], comp.cfg.entry, "cpu", threads) for p in points]
        baseline = OnnxruntimeCpuRunner(static, [e["name"] for e in doc["inputs"]], threads)
        mach = machine()
        started_utc = datetime.now(timezone.utc).isoformat(timespec="seconds")
        m = interleaved([*runners, baseline], inputs, opts.rounds, opts.seconds, opts.warmup)
        for p in points:
            p["so_sha256"] = sha256_file(p.pop("so"))
    ort = m["samples_ns"][-1]
    for i, p in enumerate(points):
        got = [np.asarray(o) for o in m["outputs"][i]]
        p["stats"] = stats(m["samples_ns"][i])
        p["ratio_to_onnxruntime"] = paired_ratio_p50(m["samples_ns"][i], ort)
        p["max_abs_vs_golden"] = float(max(np.max(np.abs(g.astype(np.float64) - e))
                                           for g, e in zip(got, expected)))
    return {"schema": SCHEMA, "target": target.name, "model": model.name, "abi": abi.name,
            "database": {"source": report["source"], "step_key": record["key"],
                         "trials": len(db.records), "trials_budget": report["trials_budget"],
                         "per_task": report["per_task"], "tasks": len(report["tasks"])},
            "machine": {**mach, "loadavg_1m_end": round(os.getloadavg()[0], 2)},
            "threads": threads, "started_utc": started_utc,
            "window": {"warmup": opts.warmup, "rounds": m["rounds"], "ended_by": m["ended_by"],
                       "seconds": m["seconds"]},
            "onnxruntime": stats(ort), "runners": {"artifact": runners[0].describe(),
                                                   "baseline": baseline.describe()},
            "points": points}
