"""`doit bench`: time every artifact of a target that runs on this machine, against onnxruntime.

For each artifact of artifacts/<target>/manifest.json that passed validation and runs natively
here (a runner exists for its device; emulated artifacts are listed, never timed):

  1. load the module once (the runner) and an onnxruntime CPU session on the same model's static
     ONNX (the baseline), both with the same thread count, both on the golden inputs;
  2. warm up both, then a window of iterations (a count and/or a time budget, whichever ends
     first), interleaving artifact and onnxruntime iteration by iteration (which one goes first
     alternates), so that a burst of load from another process hits both and their ratio holds;
  3. per iteration, the artifact's time is split at the boundary: copy inputs to the device,
     invoke, read outputs back (their sum is the artifact's `total`);
  4. check that the last timed outputs still match golden (a fast wrong answer is no result).

Results are measurements, not cached steps: they are rewritten on every run.
    <target>/<model>/<abi>/bench/<artifact sha256>.json   per artifact: settings, machine, samples
    <target>/bench.json                                   summary (+ regression check) for the target
    <target>/report.html                                  see report.py
"""
from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from doit.exceptions import TaskFailed

from ..compilers.backends import BY_FORMAT
from ..core.errors import PipelineError
from ..core.layout import Layout
from ..core.numerics import compare, summary as numerics_summary
from ..spec.model import display
from ..core.store import atomic_write_text, pretty_json, sha256_file
from ..core.tools import cpu_model, distribution_version
from ..run.timing import (NOISY_CV, PHASES, IreeCpuRunner, IreeVulkanRunner, OnnxruntimeCpuRunner,
                          paired_ratio_p50, stats)
from ..run.tvm_timing import TvmCpuRunner
from ..run.variant_speed import build_text, ms_text, next_hint, slower_text
from . import profile, report

# The bench's API: its own, and the runners and statistics of run/timing.py it applies.
__all__ = ["Options", "Planned", "plan", "measure", "machine", "bench_artifact", "load_baseline",
           "regressions", "summarise", "run", "variant_rows", "table", "variant_table",
           "doit_action", "runner_key", "RESULT_SCHEMA", "SUMMARY_SCHEMA", "VARS", "STAGE",
           "NOISY_CV", "PHASES", "RUNNERS", "IreeCpuRunner", "IreeVulkanRunner",
           "OnnxruntimeCpuRunner", "paired_ratio_p50", "stats"]

# Runner key -> runner class: the IREE driver name, or "tvm:<device>" for TVM artifacts.
RUNNERS: dict[str, type] = {"local-task": IreeCpuRunner, "local-sync": IreeCpuRunner,
                            "vulkan": IreeVulkanRunner, "tvm:cpu": TvmCpuRunner}

RESULT_SCHEMA = "modelyard.bench/1"
SUMMARY_SCHEMA = "modelyard.bench-summary/1"
VARS = ("warmup", "iterations", "seconds", "threads", "baseline", "threshold", "gate", "profile")
STAGE = "bench"


# ----------------------------------------------------------------------------- options
@dataclass(frozen=True)
class Options:
    """What one `doit bench` run is asked to do (doit vars of the same names)."""
    warmup: int = 3              # untimed iterations of each runner before the window
    iterations: int = 200        # the window ends after this many iterations (0: no count limit) ...
    seconds: float = 20.0        # ... or after this many seconds per artifact (0: no time limit)
    threads: int | None = None   # CPU threads for the device and onnxruntime (None: every usable CPU)
    baseline: Path | None = None  # a previous bench.json to compare p50 against
    threshold: float = 10.0      # percent: p50 worse than the baseline by more than this regresses
    gate: bool = False           # fail (non-zero exit) when an artifact regressed
    profile: bool = False        # also `doit profile` each model first (its top 10 in the report)

    def __post_init__(self):
        problems = []
        if self.warmup < 0:
            problems.append(f"warmup={self.warmup}: must be >= 0")
        if self.iterations < 0 or self.seconds < 0:
            problems.append("iterations and seconds must be >= 0")
        if self.iterations == 0 and self.seconds == 0:
            problems.append("iterations=0 and seconds=0 leave the window unbounded: give one of them")
        if self.threads is not None and self.threads < 1:
            problems.append(f"threads={self.threads}: must be >= 1")
        if not self.threshold > 0:
            problems.append(f"threshold={self.threshold}: must be a percentage > 0")
        if self.gate and self.baseline is None:
            problems.append("gate=1 needs baseline=PATH (there is nothing to gate against)")
        if problems:
            raise PipelineError("bad bench options: " + "; ".join(problems), stage=STAGE,
                                hint="e.g. doit bench target=host iterations=100 seconds=10 "
                                     "warmup=3 threshold=10")

    @classmethod
    def from_vars(cls, raw: dict) -> "Options":
        """Options from doit vars (strings); an unparsable value is a PipelineError naming it."""
        kw = {}
        parsers = {"warmup": int, "iterations": int, "seconds": float, "threads": int,
                   "baseline": Path, "threshold": lambda v: float(v.rstrip("%")),
                   "gate": _flag, "profile": _flag}
        for name, value in raw.items():
            if value is None:
                continue
            try:
                kw[name] = parsers[name](value)
            except (ValueError, KeyError):
                raise PipelineError(f"bench option {name}={value!r} is not valid", stage=STAGE,
                                    hint="warmup/iterations/threads take integers, seconds a "
                                         "number, threshold a percentage (10 or 10%), gate and "
                                         "profile 0 or 1, baseline a path") from None
        return cls(**kw)

    def usable_threads(self) -> int:
        return self.threads or len(os.sched_getaffinity(0))


def _flag(value: str) -> bool:
    v = value.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(value)


# ----------------------------------------------------------------------------- statistics
def runner_key(art: dict, device: str | None) -> str | None:
    """The RUNNERS key of an artifact validated on `device`: its backend's."""
    backend = BY_FORMAT.get(art.get("format"))
    return backend.runner_key(device) if backend is not None else device


# ----------------------------------------------------------------------------- plan
@dataclass(frozen=True)
class Planned:
    model: str
    abi: str
    artifact: dict           # the manifest's entry
    runner: type | None      # None: not measured here
    reason: str = ""         # why not, when runner is None


def plan(manifest: dict, runners: dict = RUNNERS) -> list[Planned]:
    """Which artifacts of a manifest run here, and why the others do not (no toolchain needed)."""
    out = []
    for model, entry in sorted(manifest["models"].items()):
        for abi, art in sorted(entry["artifacts"].items()):
            val = art.get("validation", {})
            executed = val.get("executed", {})
            device = runner_key(art, executed.get("device"))
            if val.get("status") == "twin-passed":
                out.append(Planned(model, abi, art, None, "shipped bytes cannot run here "
                                   "(validated through a twin); time it on the board"))
            elif val.get("status") != "passed":
                out.append(Planned(model, abi, art, None, "not validated"))
            elif art["abi"]["backend"] == "vulkan-spirv":
                driver = art["abi"]["run"].get("driver")
                if "vulkan" in runners:
                    out.append(Planned(model, abi, art, runners["vulkan"]))
                else:
                    out.append(Planned(model, abi, art, None, f"no Vulkan runner for {driver!r} here"))
            elif executed.get("emulated"):
                out.append(Planned(model, abi, art, None, "emulated"))
            elif art["abi"]["run"].get("via") != "python" or device not in runners:
                out.append(Planned(model, abi, art, None, f"no runner for device {device!r} here"))
            else:
                out.append(Planned(model, abi, art, runners[device]))
    return out


# ----------------------------------------------------------------------------- measuring
def measure(artifact: Callable, baseline: Callable, inputs: list, options: Options,
            clock: Callable[[], int] = time.perf_counter_ns) -> dict:
    """Warm-up, then the window, interleaved; per-iteration samples in nanoseconds."""
    for _ in range(options.warmup):
        artifact(inputs)
        baseline(inputs)
    series = {p: [] for p in (*PHASES, "total", "onnxruntime")}
    budget = options.seconds * 1e9
    start = clock()
    outputs = {}
    ended_by = "iterations"
    i = 0
    while options.iterations == 0 or i < options.iterations:
        if i and budget and clock() - start >= budget:
            ended_by = "seconds"
            break
        order = (("artifact", artifact), ("onnxruntime", baseline))
        for who, run in (order if i % 2 == 0 else order[::-1]):
            phases, outputs[who] = run(inputs)
            if who == "artifact":
                for p in PHASES:
                    series[p].append(phases[p])
                series["total"].append(sum(phases[p] for p in PHASES))
            else:
                series["onnxruntime"].append(phases["total"])
        i += 1
    return {"samples_ns": series, "iterations": i, "ended_by": ended_by,
            "window_s": round((clock() - start) / 1e9, 3), "outputs": outputs}


def machine() -> dict:
    """The CPU model and what this process may use: part of every result."""
    return {"cpu_model": cpu_model(), "logical_cpus": os.cpu_count(),
            "usable_cpus": len(os.sched_getaffinity(0)), "arch": platform.machine(),
            "python": platform.python_version(), "loadavg_1m_start": round(os.getloadavg()[0], 2)}


def _load_json(path: Path, what: str, target: str, hint: str) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise PipelineError(f"{what} not found: {path}", stage=STAGE, target=target,
                            hint=hint) from None
    except (OSError, ValueError) as exc:
        raise PipelineError(f"{what} {path} is not readable JSON: {exc}", stage=STAGE,
                            target=target, hint=hint) from None


def bench_artifact(layout: Layout, target: str, item: Planned, manifest: dict,
                   options: Options, mach: dict) -> dict:
    """Measure one artifact against onnxruntime; returns the result document (not yet written)."""
    import numpy as np  # numpy: 0.2 s, not needed by doit list

    where = {"stage": STAGE, "model": item.model, "target": f"{target}/{item.abi}"}
    art = item.artifact
    vmfb = layout.resolve(art["path"])
    static_entry = manifest["models"][item.model]["static_model"]
    static = (layout.resolve(static_entry["path"]) if "path" in static_entry  # a precision variant
              else layout.model_stage(item.model, "static") / "model.onnx")
    for path, want, what in ((vmfb, art["sha256"], "artifact"),
                             (static, manifest["models"][item.model]["static_model"]["sha256"],
                              "static model")):
        if not path.is_file() or sha256_file(path) != want:
            raise PipelineError(f"the {what} {path} is missing or differs from the manifest",
                                hint=f"rebuild: doit build target={target}", **where)
    golden_dir = layout.model_stage(item.model, "golden")
    doc = json.loads((golden_dir / "golden.json").read_text())
    inputs = [np.load(golden_dir / e["file"], allow_pickle=False) for e in doc["inputs"]]
    expected = [np.load(golden_dir / e["file"], allow_pickle=False) for e in doc["outputs"]]

    device = (art["abi"]["run"]["driver"] if art["abi"]["backend"] == "vulkan-spirv"
              else art["validation"]["executed"]["device"])
    runner = item.runner(vmfb, art["entry"], device, options.usable_threads())
    baseline = OnnxruntimeCpuRunner(static, [e["name"] for e in doc["inputs"]], runner.threads)
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    m = measure(runner, baseline, inputs, options)
    samples = m["samples_ns"]

    names = [e["name"] for e in doc["outputs"]]
    tol = art["validation"]["tolerance"]
    checks = {who: compare([np.asarray(o) for o in m["outputs"][who]], expected, names, tol)
              for who in ("artifact", "onnxruntime")}
    if not checks["artifact"]["passed"]:
        raise PipelineError(f"the timed runs' outputs differ from golden "
                            f"({numerics_summary(checks['artifact'])})",
                            hint="the artifact passed validation but not under the bench's "
                                 "settings (threads?): investigate before trusting any timing",
                            **where)
    series = {name: stats(values) for name, values in samples.items()}
    total, ort = series["total"], series["onnxruntime"]
    return {
        "schema": RESULT_SCHEMA,
        "target": target, "model": item.model, "abi": item.abi,
        "artifact": {"path": art["path"], "sha256": art["sha256"], "size": art["size"]},
        "static_model": {"path": layout.relative(static),
                         "sha256": manifest["models"][item.model]["static_model"]["sha256"]},
        "inputs": [{k: e[k] for k in ("name", "shape", "dtype")} for e in doc["inputs"]],
        "started_utc": started,
        "machine": {**mach, "loadavg_1m_end": round(os.getloadavg()[0], 2)},
        "settings": {"warmup": options.warmup, "iterations": options.iterations,
                     "seconds": options.seconds, "noisy_cv": NOISY_CV,
                     "interleave": "artifact and onnxruntime alternate iteration by iteration; "
                                   "the artifact goes first on even iterations"},
        "runner": runner.describe(),
        "baseline": baseline.describe(),
        "window": {"iterations": m["iterations"], "ended_by": m["ended_by"],
                   "seconds": m["window_s"]},
        "stats": series,
        # of the unrounded medians: the rounded p50s (1 ns) are too coarse for a short window
        "ratio_to_onnxruntime": round(float(np.median(samples["total"])
                                            / np.median(samples["onnxruntime"])), 6),
        "paired_ratio_p50": paired_ratio_p50(samples["total"], samples["onnxruntime"]),
        "noisy": total["noisy"] or ort["noisy"],
        "outputs_check": {who: {"passed": c["passed"], "summary": numerics_summary(c)}
                          for who, c in checks.items()},
        "samples_ns": samples,
    }


# ----------------------------------------------------------------------------- regression
def load_baseline(path: Path, target: str) -> dict:
    hint = "give baseline= the bench.json of an earlier `doit bench` of this target"
    doc = _load_json(Path(path), "baseline file", target, hint)
    if not isinstance(doc, dict) or doc.get("schema") != SUMMARY_SCHEMA or not isinstance(
            doc.get("artifacts"), list):
        raise PipelineError(f"baseline file {path} is not a bench summary "
                            f"(schema {SUMMARY_SCHEMA})", stage=STAGE, target=target, hint=hint)
    if doc.get("target") != target:
        raise PipelineError(f"baseline file {path} is for target {doc.get('target')!r}, "
                            f"not {target!r}", stage=STAGE, target=target, hint=hint)
    return doc


def regressions(current: list[dict], baseline: dict, threshold_pct: float) -> dict:
    """Compare each artifact's p50 (total) with the baseline's entry for the same model and ABI."""
    before = {(a["model"], a["abi"]): a for a in baseline["artifacts"]}
    rows = []
    for a in current:
        b = before.get((a["model"], a["abi"]))
        if b is None:
            rows.append({"model": a["model"], "abi": a["abi"], "status": "new (not in baseline)"})
            continue
        change = (a["p50_ms"] / b["p50_ms"] - 1) * 100
        rows.append({"model": a["model"], "abi": a["abi"], "baseline_p50_ms": b["p50_ms"],
                     "p50_ms": a["p50_ms"], "change_pct": round(change, 2),
                     "baseline_ratio": b["ratio_to_onnxruntime"],
                     "ratio": a["ratio_to_onnxruntime"],
                     "same_artifact": a["sha256"] == b["sha256"],
                     "status": "regressed" if change > threshold_pct else "ok"})
    gone = sorted(set(before) - {(a["model"], a["abi"]) for a in current})
    return {"baseline_started_utc": baseline.get("started_utc"), "threshold_pct": threshold_pct,
            "rows": rows, "missing_now": [{"model": m, "abi": a} for m, a in gone],
            "regressed": [f"{r['model']}/{r['abi']}" for r in rows if r["status"] == "regressed"]}


# ----------------------------------------------------------------------------- the target
def summarise(result: dict, result_path: str, validation: dict) -> dict:
    s, ort = result["stats"], result["stats"]["onnxruntime"]
    return {"model": result["model"], "abi": result["abi"], "result": result_path,
            "sha256": result["artifact"]["sha256"], "size": result["artifact"]["size"],
            "path": result["artifact"]["path"], "n": s["total"]["n"],
            **{k: s["total"][k] for k in ("min_ms", "p50_ms", "p90_ms", "p99_ms", "max_ms",
                                          "mean_ms", "stddev_ms", "cv")},
            "phases_p50_ms": {p: s[p]["p50_ms"] for p in PHASES},
            "onnxruntime": {k: ort[k] for k in ("p50_ms", "p90_ms", "p99_ms", "cv")},
            "ratio_to_onnxruntime": result["ratio_to_onnxruntime"],
            "paired_ratio_p50": result["paired_ratio_p50"], "noisy": result["noisy"],
            "threads": result["runner"]["threads"], "runner": result["runner"]["kind"],
            "validation": {"status": validation["status"],
                           "outputs": [{k: o[k] for k in ("name", "max_abs", "mean_abs", "cosine")}
                                       for o in validation["outputs"]]}}


def run(layout: Layout, target: str, options: Options, say: Callable[[str], None] = print,
        runners: dict = RUNNERS) -> dict:
    """Bench every runnable artifact of `target`; write results, bench.json and report.html."""

    manifest_path = layout.manifest(target)
    manifest = _load_json(manifest_path, "manifest", target,
                          f"build first: doit build target={target}")
    items = plan(manifest, runners)
    runnable = [i for i in items if i.runner]
    skipped = [{"model": i.model, "abi": i.abi, "reason": i.reason, "sha256": i.artifact["sha256"],
                "size": i.artifact["size"], "path": i.artifact["path"],
                "executed": i.artifact.get("validation", {}).get("executed", {})}
               for i in items if not i.runner]
    if not runnable:
        listed = ", ".join(f"{s['model']}/{s['abi']} ({s['reason']})" for s in skipped) or "none"
        raise PipelineError(f"nothing in {layout.relative(manifest_path)} can be timed on this "
                            f"machine; artifacts: {listed}", stage=STAGE, target=target,
                            hint="emulated (qemu) timings mean nothing: bench a target built for "
                                 "this machine (target=host), or run the bench on the board")
    baseline = load_baseline(options.baseline, target) if options.baseline else None

    mach = machine()
    threads = options.usable_threads()
    say(f"bench {target}: {len(runnable)} artifact(s) on {mach['cpu_model']} "
        f"({mach['usable_cpus']} usable CPUs), {threads} thread(s); "
        + report.window_text({"warmup": options.warmup, "iterations": options.iterations,
                              "seconds": options.seconds}))
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    results, rows = {}, []
    for item in runnable:
        result = bench_artifact(layout, target, item, manifest, options, mach)
        path = layout.bench_result(target, item.model, item.abi, item.artifact["sha256"])
        atomic_write_text(path, pretty_json(result))
        rel = layout.relative(path)
        results[rel] = result
        rows.append(summarise(result, rel, item.artifact["validation"]))
        say("  " + _row_text(rows[-1]))
    summary = {"schema": SUMMARY_SCHEMA, "target": target, "started_utc": started,
               "manifest": {"path": layout.relative(manifest_path),
                            "sha256": sha256_file(manifest_path)},
               "machine": mach, "threads": threads,
               "settings": {"warmup": options.warmup, "iterations": options.iterations,
                            "seconds": options.seconds, "noisy_cv": NOISY_CV},
               "versions": {d: distribution_version(d) for d in ("iree-base-runtime", "apache-tvm",
                                                                  "onnxruntime", "numpy")},
               "artifacts": rows, "not_measured": skipped,
               "report": layout.relative(layout.bench_report(target)),
               "regression": None}
    summary["variants"] = variant_rows(rows, skipped, manifest)
    if baseline is not None:
        summary["regression"] = {"baseline": str(options.baseline),
                                 **regressions(rows, baseline, options.threshold)}
    if options.profile:  # after the timing: the profiles' compiles never overlap a timed window
        for model in sorted({r["model"] for r in rows}):
            if any(profile.runnable(a)[0] for a in manifest["models"][model]["artifacts"].values()):
                profile.run(layout, target, model, profile.Options(threads=options.threads), say)
    profiles = profile.current(layout, target, manifest)
    summary["profiles"] = {m: layout.relative(layout.profile_report(target, m) / "profile.json")
                           for m in profiles}
    atomic_write_text(layout.bench_report(target), report.render(summary, results, manifest,
                                                                 profiles))
    atomic_write_text(layout.bench_summary(target), pretty_json(summary))
    for line in table(summary):
        say(line)
    say(f"wrote {display(layout.bench_report(target))} and {display(layout.bench_summary(target))}")
    return summary


def _row_text(row: dict) -> str:
    return (f"{row['model']}/{row['abi']}: p50 {ms_text(row['p50_ms'])} ms, onnxruntime "
            f"{ms_text(row['onnxruntime']['p50_ms'])} ms, ratio {row['ratio_to_onnxruntime']:.2f}x"
            f"{' (noisy)' if row['noisy'] else ''}")


def variant_rows(rows: list[dict], skipped: list[dict], manifest: dict) -> list[dict]:
    """Each precision variant's artifact next to its model's fp32 artifact for the same ABI:
    sizes and (when both were timed here) p50 latencies and their ratios."""
    timed = {(r["model"], r["abi"]): r for r in rows}
    out = []
    for name, entry in sorted(manifest["models"].items()):
        base = entry.get("variant_of")
        if not base:
            continue
        for abi, art in sorted(entry["artifacts"].items()):
            fp32 = manifest["models"].get(base, {}).get("artifacts", {}).get(abi)
            mine, theirs = timed.get((name, abi)), timed.get((base, abi))
            row = {"model": base, "variant": name, "precision": entry["precision"], "abi": abi,
                   "size": art["size"], "fp32_size": fp32["size"] if fp32 else None,
                   "p50_ms": mine["p50_ms"] if mine else None,
                   "fp32_p50_ms": theirs["p50_ms"] if theirs else None,
                   "onnxruntime_p50_ms": mine["onnxruntime"]["p50_ms"] if mine else None,
                   "fp32_onnxruntime_p50_ms": theirs["onnxruntime"]["p50_ms"] if theirs else None}
            row["size_ratio"] = round(row["size"] / row["fp32_size"], 4) if fp32 else None
            # 4 significant digits: a variant 30x slower (0.0337x) keeps its precision too
            row["speedup"] = (float(f"{row['fp32_p50_ms'] / row['p50_ms']:.4g}")
                              if mine and theirs else None)
            row["pays"] = None if row["speedup"] is None else row["speedup"] >= 1
            if row["pays"] is False:
                row["verdict"] = (f"{slower_text(entry['precision'], row['p50_ms'], row['fp32_p50_ms'])}"
                                  f"; next: {next_hint(entry['precision'])}")
            if art.get("pays"):  # what the build's choose step measured (stages/choose.py)
                row["build_pays"] = art["pays"]
            if not mine:
                row["not_measured"] = next((s["reason"] for s in skipped
                                            if (s["model"], s["abi"]) == (name, abi)), "not measured")
            out.append(row)
    return out


def table(summary: dict) -> list[str]:
    """The printed summary: one line per artifact, then what was not measured and regressions."""
    head = ("model", "abi", "n", "p50 ms", "p90 ms", "p99 ms", "cv", "in/invoke/out p50 ms",
            "ort p50 ms", "ratio")
    body = []
    for r in summary["artifacts"]:
        ph = r["phases_p50_ms"]
        body.append((r["model"], r["abi"], str(r["n"]), ms_text(r["p50_ms"]), ms_text(r["p90_ms"]),
                     ms_text(r["p99_ms"]), f"{r['cv']:.2f}{'*' if r['noisy'] else ''}",
                     "/".join(ms_text(ph[p]) for p in PHASES), ms_text(r["onnxruntime"]["p50_ms"]),
                     f"{r['ratio_to_onnxruntime']:.2f}x"))
    widths = [max(len(x[k]) for x in (head, *body)) for k in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in (head, *body)]
    if any(r["noisy"] for r in summary["artifacts"]):
        lines.append(f"* noisy: coefficient of variation above {NOISY_CV:.2f} (artifact or "
                     f"onnxruntime); the ratio is the steadier figure: both ran interleaved")
    lines.append("ratio = artifact p50 / onnxruntime p50 (same run, same inputs, "
                 f"{summary['threads']} thread(s))")
    for s in summary["not_measured"]:
        lines.append(f"not measured here: {s['model']}/{s['abi']}: {s['reason']}")
    lines += variant_table(summary.get("variants") or [])
    reg = summary.get("regression")
    if reg:
        for row in reg["rows"]:
            if "change_pct" in row:
                lines.append(f"vs baseline: {row['model']}/{row['abi']} p50 "
                             f"{ms_text(row['baseline_p50_ms'])} -> {ms_text(row['p50_ms'])} ms "
                             f"({row['change_pct']:+.1f}%), ratio {row['baseline_ratio']:.2f}x -> "
                             f"{row['ratio']:.2f}x: {row['status']}")
            else:
                lines.append(f"vs baseline: {row['model']}/{row['abi']}: {row['status']}")
        lines.append(f"regressions (p50 worse by more than {reg['threshold_pct']:g}%): "
                     f"{', '.join(reg['regressed']) or 'none'}")
    return lines


def variant_table(variants: list[dict]) -> list[str]:
    """Precision variants side by side with fp32: size, p50 (IREE), onnxruntime p50 of each model."""
    if not variants:
        return []
    head = ("model", "abi", "precision", "size", "fp32 size", "p50 ms", "fp32 p50 ms", "speedup",
            "ort p50 ms", "ort fp32 p50 ms")
    kb = lambda b: "n/a" if b is None else f"{b / 1024:.0f} KiB"
    ms = lambda v: "n/a" if v is None else ms_text(v)
    body = [(v["model"], v["abi"], v["precision"], kb(v["size"]), kb(v["fp32_size"]),
             ms(v["p50_ms"]), ms(v["fp32_p50_ms"]),
             "n/a" if v["speedup"] is None else f"{v['speedup']:.2f}x",
             ms(v["onnxruntime_p50_ms"]), ms(v["fp32_onnxruntime_p50_ms"])) for v in variants]
    widths = [max(len(x[k]) for x in (head, *body)) for k in range(len(head))]
    lines = ["", "precision variants vs fp32 (speedup = fp32 p50 / variant p50, IREE artifacts):"]
    lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in (head, *body)]
    lines += [f"  {v['variant']}/{v['abi']}: {v['not_measured']}" for v in variants if "not_measured" in v]
    lines += [f"  {v['variant']}/{v['abi']}: {v['verdict']}" for v in variants if v.get("verdict")]
    lines += [f"  {v['variant']}/{v['abi']}: {build_text(v['build_pays'])}" for v in variants
              if v.get("build_pays")]
    return lines


def doit_action(layout: Layout, target: str | None, raw_vars: dict, known: list[str]):
    """The python-action of `doit bench`: PipelineErrors and a failed gate become TaskFailed."""
    if target is None:
        return TaskFailed(f"[stage={STAGE}] doit bench needs target=NAME (known targets: "
                          f"{', '.join(known)})")
    try:
        options = Options.from_vars(raw_vars)
        summary = run(layout, target, options)
    except PipelineError as err:
        return TaskFailed(err.render())
    reg = summary["regression"]
    if options.gate and reg and reg["regressed"]:
        return TaskFailed(f"[stage={STAGE} target={target}] gate: p50 regressed by more than "
                          f"{reg['threshold_pct']:g}% against {reg['baseline']}: "
                          f"{', '.join(reg['regressed'])}")
    return None
