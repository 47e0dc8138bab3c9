"""`doit search target=host [model=NAME]`: which of each ABI's declared compiler configurations a
model is built with, measured here and pinned in the model folder like a tuning database.

For each model (a shape variant is a model of its own) and each IREE ABI of the target that runs
on this machine, every candidate -- "default" (the ABI's own flags) and each of its `configs:`
(pipeline/targets/<target>.yaml) -- is
  1. compiled by the iree_compile stage's own step, the candidate's flags added as a build adds a
     pinned config's (the same step key: the next build restores the winner from the store);
     A candidate whose flags and rewritten graph are an earlier candidate's (upsample-d2s on a
     model without ConvTranspose; dw-chunks where no depthwise kernel is above 3x3, the graph
     of dw-slices) would be those very bytes: it is recorded as `same-as` that one and neither
     built nor timed;
  2. validated by the validate stage's own step (the same run, the same tolerance check);
  3. when it validated, timed: every validated candidate, the model's TVM artifacts as the build
     makes them, and onnxruntime on the static model, side by side in ONE child process,
     interleaved round by round on the golden inputs (choose.measure).
The pin, models/<m>/configs/<target>.yaml (one file per model folder and target, an entry per
model: spec/target.py PinDoc), records per ABI the winning config (the lowest p50) and every
candidate's figures (p50, ratio to onnxruntime's p50 in the same rounds, validation max abs) or
where and why it failed (never pinned); per slot of the target the fastest validated ABI with
those figures and the sha256s of the bytes timed; the tool versions, the date and the machine.
`doit build` reads it (spec.target.load_pins) and never times anything; searching again is this
explicit command.

ABIs of other targets that cannot be timed here (aarch64) follow a host ABI (`configs_from:
host/cpu-x86_64`): for each, the search compiles and validates (under qemu) the host's candidates
in the host's order of speed and pins, under `followers`, the first that validates there (a
config can be right on x86 and beyond the tolerance on aarch64): their speed is measured on a
board later, their correctness here.

In a build (`search_in_build`, the child of a search_configs step: pipeline/stages/search_configs.py)
the same candidate steps run for one host ABI of a model with no pin, in the step's order and
within its time budget (a candidate still building when it runs out is killed with its tools);
the ranking is that step's output, not a pin.
"""
from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import platform
import signal
import sys
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path

import yaml

from ..compilers.builds import built, built_abis, fallback_role
from ..compilers.iree_backend import IREE
from ..compilers.tvm_backend import TVM
from ..core import codehash
from ..core.errors import PipelineError
from ..core.layout import REPO, Layout, golden_files, static_model
from ..core.numerics import worst_cosine
from ..core.steps import execute
from ..core.store import atomic_write_text, sha256_bytes, sha256_file
from ..core.tools import cpu_model, distribution_version, python_module_argv, run_tool
from ..rewrite.abi_rewrites import rewritten
from ..spec.common import display, read_yaml
from ..spec.model import load_model
from ..spec.target import DEFAULT_CONFIG, PIN_FORMAT, known_targets, load_target, pin_path
from ..spec.tvm import budget
from ..stages import tvm_compile, tvm_tune
from ..stages.choose import measure
from ..stages.iree_compile import compile_step
from ..stages.validate import validate_step

STAGE = "search"
WINDOW = {"warmup": 3, "rounds": 100, "seconds": 60.0}  # per model: every candidate, interleaved
TOOLS = ("iree-base-compiler", "iree-base-runtime", "onnxruntime", "apache-tvm")
PROGRESS = "[search] "
CAP_FACTOR, CAP_MIN_S = 3, 120.0  # in a build, a candidate may take 3x the default's build time
VARS = ("warmup", "rounds", "seconds")


def window_from(raw: dict) -> dict:
    """The timing window from doit vars (warmup=N rounds=N seconds=S); defaults: WINDOW."""
    window = dict(WINDOW)
    for name, value in raw.items():
        if value is None:
            continue
        try:
            window[name] = float(value) if name == "seconds" else int(value)
        except ValueError:
            raise PipelineError(f"search option {name}={value!r} is not a number", stage=STAGE,
                                hint="e.g. doit search target=host rounds=100 seconds=60 warmup=3") from None
    if window["warmup"] < 0 or window["rounds"] < 1 or window["seconds"] <= 0:
        raise PipelineError(f"search window {window}: warmup >= 0, rounds >= 1, seconds > 0",
                            stage=STAGE, hint="e.g. doit search target=host rounds=100 seconds=60")
    return window


# ----------------------------------------------------------------------------- doit search
def command(project, target_name: str | None, model_name: str | None, raw_window: dict,
            say=print) -> str:
    """Search every model of the target (or model=NAME), write the pins; returns the table.
    raw_window: the doit vars warmup=, rounds=, seconds= (None: the default)."""
    window = window_from(raw_window)
    target = _target(project, target_name)
    models = _models(project, target, model_name)
    if not timed_here(target):
        followers = ", ".join(f"{a.name} follows {a.configs_from}" for a in target.abis
                              if a.configs_from) or "none declares configs_from"
        raise PipelineError(f"target {target.name} has no IREE CPU ABI that runs on this machine: "
                            f"its configurations cannot be timed here ({followers})",
                            stage=STAGE, target=target.name,
                            hint="search the host target its ABIs follow: doit search target=host")
    lines = []
    for k, model in enumerate(models):
        say(f"{PROGRESS}{target.name}/{model.name}: model {k + 1}/{len(models)}")
        entry = search_model(project, model, target, window, say)
        path = write_pin(project, model, target.name, entry)
        lines += table(model.name, entry) + [f"  pinned in {display(path)}"]
    lines.append(f"the next `doit build target={target.name}` builds with these configs; no "
                 f"timing happens there. Commit the pin files.")
    return "\n".join(lines)


def _target(project, name: str | None):
    known = [t.name for t in project.targets]
    if not name:
        raise PipelineError("the search is for one target: say target=NAME", stage=STAGE,
                            hint=f"known targets: {', '.join(known)}")
    target = next((t for t in project.targets if t.name == name), None)
    if target is None:
        raise PipelineError(f"unknown target {name!r}", stage=STAGE,
                            hint=f"known targets: {', '.join(known)}")
    return target


def _models(project, target, name: str | None) -> list:
    if name is None:
        return list(project.models)
    found = [m for m in project.models if m.name == name]
    if not found:
        variant = any(name == f"{m.name}.{v.name}" for m in project.models for v in m.variants)
        raise PipelineError(f"no model {name!r}" + (" to search: a precision variant is built "
                                                    "with its model's ABI flags" if variant else ""),
                            stage=STAGE, target=target.name,
                            hint=f"models: {', '.join(m.name for m in project.models)}")
    return found


# ----------------------------------------------------------------------------- one model
def timed_here(target) -> list:
    """The target's IREE CPU ABIs whose artifacts run (and are timed) on this machine."""
    return [a for a in target.abis
            if IREE.builds(a) and a.backend == "llvm-cpu" and a.run["via"] == "python"]


def candidates(abi) -> list[dict]:
    """"default" (no extra flag), then the ABI's declared configs, as {name, flags, rewrites}."""
    return [abi.config(DEFAULT_CONFIG)] + [abi.config(c["name"]) for c in abi.configs]


def candidate_steps(layout, model, target, abi, config: dict, pin: str | None = None) -> tuple:
    """The compile and validate steps of one candidate: the build's own steps, the candidate's
    flags pinned as a build pins them (by the search of target `pin`, default: the ABI's own),
    written under <abi>/search/<config>/."""
    pinned = {"name": config["name"], "flags": list(config["flags"]),
              "rewrites": list(config["rewrites"]), "pin": pin or target.name}
    folder = layout.artifact_stage(target.name, model.name, abi.name, STAGE) / config["name"]
    build = compile_step(layout, model, target, abi, config=pinned)
    name = f"{build.name}/{STAGE}/{config['name']}"
    comp = dataclasses.replace(build, name=name, out_dir=folder / IREE.compile_stage,
                               doc=f"{build.doc} (doit search candidate)")
    check = validate_step(layout, model, target, abi)
    check = dataclasses.replace(check, name=name, out_dir=folder / "validate",
                                inputs={**check.inputs, "artifact": comp.out_dir / IREE.artifact})
    return comp, check


def search_model(project, model, target, window: dict, say=print) -> dict:
    """Build, validate and time every candidate of the model's timed ABIs: the pin's entry."""
    layout = project.layout
    where = f"{target.name}/{model.name}"
    abis = [a for a in timed_here(target) if built(project, model, target, a)]
    total = sum(len(candidates(a)) for a in abis)
    results, timed, done = {}, [], 0
    graphs = _GraphDigests(static_model(layout, model))
    for abi in abis:
        results[abi.name], seen = {}, {}
        for config in candidates(abi):
            done += 1
            same = (tuple(config["flags"]), graphs.of(config["rewrites"]))
            if same in seen:
                idle = [r for r in config["rewrites"] if graphs.idle(r)]
                how = (f"its rewrites {', '.join(idle)} change nothing" if idle else
                       "its rewrites give the same graph")
                results[abi.name][config["name"]] = {
                    "flags": list(config["flags"]), "rewrites": list(config["rewrites"]),
                    "status": "same-as", "same_as": seen[same],
                    "why": f"{how} in this model: the graph and flags of {seen[same]}"}
                say(f"{PROGRESS}{where}/{abi.name}: candidate {done}/{total} {config['name']} "
                    f"is {seen[same]} here ({how})")
                continue
            seen[same] = config["name"]
            say(f"{PROGRESS}{where}/{abi.name}: candidate {done}/{total} {config['name']} "
                f"({_what(config)}), {total - done} left after it")
            record, artifact = _build_candidate(layout, model, target, abi, config, say)
            results[abi.name][config["name"]] = record
            if artifact is not None:
                timed.append({"abi": abi.name, "config": config["name"], "format": IREE.format,
                              "path": str(artifact), "entry": "main",
                              "device": abi.run["device"]})
    tvm_results = {}
    for abi, role in tvm_rivals(project, model, target):
        if role is not None:
            say(f"{PROGRESS}{where}/{abi.name}: not built or timed: the build makes it only when "
                f"{role['preferred']} fails ({role['why']})")
            continue
        say(f"{PROGRESS}{where}/{abi.name}: the TVM build as `doit build` makes it")
        record, artifact = _build_tvm(project, model, target, abi, say)
        tvm_results[abi.name] = record
        if artifact is not None:
            timed.append({"abi": abi.name, "config": DEFAULT_CONFIG, "format": TVM.format,
                          "path": str(artifact), "entry": "main"})
    measured = _time(layout, model, target, timed, window, say) if timed else None
    entry = _entry(target, results, tvm_results, timed, measured, window)
    followers = {}
    for abi in abis:
        ranked = [n for n, c in sorted(entry["abis"][abi.name]["candidates"].items(),
                                       key=lambda item: item[1].get("p50_ms", float("inf")))
                  if c["status"] == "timed"]
        for other, follower in followers_of(target, abi):
            if model.skip_reason(follower.name) or not ranked:
                continue
            name = f"{other.name}/{follower.name}"
            say(f"{PROGRESS}{where} -> {name} (follows {abi.name}): the fastest config here that "
                f"validates there, of {', '.join(ranked)}")
            followers[name] = _follow(layout, model, other, follower, target, abi, ranked, say)
    if followers:
        entry["followers"] = followers
    return entry


def tvm_rivals(project, model, target) -> list[tuple]:
    """(ABI, None) for each TVM ABI the build makes for the model that runs here, the search's
    rivals to IREE; (ABI, its fallback_role) for one the build makes only when the slot's
    preferred ABI fails (an untuned build that cannot win): neither built nor timed."""
    out = []
    for abi in [a for a in built_abis(project, model, target, TVM) if a.run["via"] == "python"]:
        role = fallback_role(project, model, target, abi)
        out.append((abi, role if role and role["role"] == "fallback" else None))
    return out


class _GraphDigests:
    """The sha256 of the static model as each list of rewrites leaves it (abi_rewrites.rewritten
    on a copy: the bytes the compile stage writes): two candidates with
    the same digest and flags compile the same bytes. Computed once per list; the model is
    loaded once."""

    def __init__(self, static: Path):
        self.static, self.model, self.known = static, None, {}

    def of(self, rewrites) -> str:
        key = tuple(rewrites)
        if key not in self.known:
            import onnx  # onnx: 1.5 s, not needed by doit list
            if self.model is None:
                self.model = onnx.load(str(self.static))
            copy = onnx.ModelProto()
            copy.CopyFrom(self.model)
            self.known[key] = sha256_bytes(rewritten(copy, key)[0])
        return self.known[key]

    def idle(self, rewrite: str) -> bool:
        """Whether `rewrite` alone leaves the model as it is (nothing in it to rewrite)."""
        return self.of([rewrite]) == self.of([])


def followers_of(target, abi) -> list[tuple]:
    """(target, ABI) of the registry's other targets whose ABI follows this one (configs_from)."""
    folder, ref = target.path.parent, f"{target.name}/{abi.name}"
    return [(other, a) for other in (load_target(n, folder) for n in known_targets(folder)
                                     if n != target.name)
            for a in other.abis if a.configs_from == ref]


def _follow(layout, model, target, abi, source, source_abi, ranked: list, say) -> dict:
    """The follower's pin: the first of `ranked` (the source ABI's configs, fastest first) that
    compiles and validates for it; every one tried is recorded."""
    record = {"follows": f"{source.name}/{source_abi.name}", "config": None, "flags": [],
              "rewrites": [], "candidates": {}}
    for name in ranked:
        config = abi.config(name)  # this ABI's flags for the config of that name
        if config is None:
            record["candidates"][name] = {"flags": [], "status": "failed", "stage": "spec",
                                          "why": f"{target.name}/{abi.name} declares no config "
                                                 f"{name!r} (configs_from wants the same names)"}
            continue
        say(f"{PROGRESS}  {target.name}/{abi.name}: {name} ({_what(config)})")
        result, artifact = _build_candidate(layout, model, target, abi, config, say,
                                            pin=source.name)
        record["candidates"][name] = result
        if artifact is not None:
            record.update(config=name, flags=list(config["flags"]),
                          rewrites=list(config["rewrites"]))
            break
    return record


def _what(config: dict) -> str:
    """A config's flags and rewrites, for people."""
    parts = list(config["flags"]) + [f"rewrite {r}" for r in config["rewrites"]]
    return " ".join(parts) or "no extra flag"


def _why(err: PipelineError) -> str:
    """The first lines of an error, for the pin (the log keeps the rest), without this machine's
    paths."""
    text = "\n".join(l.strip() for l in err.what.strip().splitlines()[:4])
    text = text.replace(f"{REPO}/", "")
    return text if len(text) <= 600 else text[:597] + "..."


def _build_candidate(layout, model, target, abi, config: dict, say,
                     pin: str | None = None) -> tuple[dict, Path | None]:
    comp, check = candidate_steps(layout, model, target, abi, config, pin)
    record = {"flags": list(config["flags"]), "rewrites": list(config["rewrites"])}
    try:
        how = execute(comp)
    except PipelineError as err:
        say(f"{PROGRESS}  compile failed: {err.what.splitlines()[0]} (log: {display(comp.log)})")
        return {**record, "status": "failed", "stage": IREE.compile_stage, "why": _why(err)}, None
    report = json.loads((comp.out_dir / "compile.json").read_text())
    if report.get("fallback"):
        record["fallback"] = report["fallback"]["why"]
    try:
        execute(check)
    except PipelineError as err:
        say(f"{PROGRESS}  compiled ({how}); validation failed: {err.what.splitlines()[0]} "
            f"(log: {display(check.log)})")
        return {**record, "status": "failed", "stage": "validate", "why": _why(err)}, None
    outputs = json.loads((check.out_dir / "validation.json").read_text())["outputs"]
    vmfb = comp.out_dir / IREE.artifact
    record.update(status="validated", sha256=sha256_file(vmfb), size=vmfb.stat().st_size,
                  max_abs=max(o["max_abs"] for o in outputs),
                  min_cosine=worst_cosine(outputs))
    say(f"{PROGRESS}  compiled ({how}), validated (max abs {record['max_abs']:.2g})")
    return record, vmfb


def _build_tvm(project, model, target, abi, say) -> tuple[dict, Path | None]:
    """The TVM artifact through the build's own steps (a pinned tuning database is applied; no
    tuning unless the spec lets the build tune)."""
    steps = []
    if budget(model, target):
        steps.append(tvm_tune.tune_step(project, model, target, abi))
    comp = tvm_compile.compile_step(project, model, target, abi)
    steps += [comp, validate_step(project.layout, model, target, abi)]
    for step in steps:
        try:
            execute(step)
        except PipelineError as err:
            say(f"{PROGRESS}  {step.stage} failed: {err.what.splitlines()[0]} "
                f"(log: {display(step.log)})")
            return {"flags": [], "status": "failed", "stage": step.stage, "why": _why(err)}, None
    outputs = json.loads((steps[-1].out_dir / "validation.json").read_text())["outputs"]
    so = comp.out_dir / "model.so"
    record = {"flags": [], "status": "validated", "sha256": sha256_file(so),
              "size": so.stat().st_size, "tuned": bool(comp.cfg.tuning),
              "max_abs": max(o["max_abs"] for o in outputs),
              "min_cosine": worst_cosine(outputs)}
    say(f"{PROGRESS}  {'tuned' if record['tuned'] else 'untuned'}, validated "
        f"(max abs {record['max_abs']:.2g})")
    return record, so


# ----------------------------------------------------------------------------- timing
def _time(layout, model, target, timed: list, window: dict, say) -> dict:
    """Every validated artifact and onnxruntime in one child process, interleaved."""
    golden = golden_files(layout, model)
    doc = json.loads(golden["golden.json"].read_text())
    plan = {"inputs": [str(golden[f"golden:{e['file']}"]) for e in doc["inputs"]],
            "window": window,
            "artifacts": timed + [{"abi": "onnxruntime", "format": "onnx",
                                   "path": str(static_model(layout, model)),
                                   "input_names": [e["name"] for e in doc["inputs"]]}]}
    scratch = layout.scratch(STAGE, f"{target.name}/{model.name}")
    scratch.mkdir(parents=True, exist_ok=True)
    spec = scratch / "timing.json"
    spec.write_text(json.dumps(plan))
    log = layout.log(STAGE, f"{target.name}/{model.name}")
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(f"# doit search {target.name}/{model.name}\n")
    say(f"{PROGRESS}{target.name}/{model.name}: timing {len(timed)} artifact(s) and onnxruntime "
        f"side by side in one process ({window['rounds']} rounds at most, {window['seconds']:g} s)")
    where = {"stage": STAGE, "model": model.name, "target": target.name}
    try:
        result = run_tool(python_module_argv("pipeline.bench.config_search", str(spec)), log=log,
                          what="timing the candidates", timeout=window["seconds"] * 3 + 600,
                          on_line=lambda line: line.startswith(PROGRESS) and say(line),
                          hint="read the log: every candidate was validated, so a crash here "
                               "is the runtime's", **where)
    finally:
        spec.unlink(missing_ok=True)
    out = json.loads([l for l in result.output.splitlines() if l.startswith("{")][-1])
    say(f"{PROGRESS}  {out['rounds']} rounds, {out['threads']} threads")
    return out


# ----------------------------------------------------------------------------- the pin
def _entry(target, results: dict, tvm_results: dict, timed: list, measured: dict | None,
           window: dict) -> dict:
    """The pin's entry for one model: per ABI the winner and every candidate's figures, per slot
    the fastest ABI, and when, where and with what it was measured."""
    p50 = {}
    ort = None
    for row in (measured or {}).get("artifacts", []):
        if row["abi"] == "onnxruntime":
            ort = row
        else:
            p50[(row["abi"], row["config"])] = row
    abis = {}
    for abi, records in {**results, **{k: {DEFAULT_CONFIG: v} for k, v in tvm_results.items()}}.items():
        for name, record in records.items():
            row = p50.get((abi, name))
            if row is not None:
                record.update(status="timed", p50_ms=row["p50_ms"], min_ms=row["min_ms"],
                              ratio_to_onnxruntime=round(row["p50_ms"] / ort["p50_ms"], 4))
        order = list(records)
        ranked = sorted((n for n in order if records[n]["status"] == "timed"),
                        key=lambda n: (records[n]["p50_ms"], order.index(n)))
        best = ranked[0] if ranked else None
        abis[abi] = {"config": best, "flags": list(records[best]["flags"]) if best else [],
                     "rewrites": list(records[best].get("rewrites", ())) if best else [],
                     "candidates": records}
    slots = {}
    for slot in target.ship:
        members = [a for a in slot["abis"] if (abis.get(a) or {}).get("config")]
        if len(members) < 2:
            continue  # nothing to compare: the slot's policy decides
        figures = {a: {"config": abis[a]["config"],
                       **{k: abis[a]["candidates"][abis[a]["config"]][k]
                          for k in ("p50_ms", "ratio_to_onnxruntime", "sha256")}} for a in members}
        best = min(members, key=lambda a: (figures[a]["p50_ms"], members.index(a)))
        second = min(figures[a]["p50_ms"] for a in members if a != best)
        text = ", ".join(f"{a} (config {f['config']}) p50 {f['p50_ms']:.3f} ms = "
                         f"{f['ratio_to_onnxruntime']:.2f}x onnxruntime" for a, f in figures.items())
        slots[slot["name"]] = {
            "ships": best, "sha256": {a: f["sha256"] for a, f in figures.items()},
            "figures": figures,
            "reason": f"{text} ({measured['rounds']} interleaved rounds, {measured['threads']} "
                      f"threads, {cpu_model()}, {_today()}); {best} is "
                      f"{second / figures[best]['p50_ms']:.2f}x faster"}
    return {"searched": {"date": _today(),
                         "machine": {"cpu_model": cpu_model(), "arch": platform.machine(),
                                     "usable_cpus": len(os.sched_getaffinity(0))},
                         "tools": {t: distribution_version(t) for t in TOOLS},
                         "window": {**window, "rounds_done": (measured or {}).get("rounds", 0),
                                    "threads": (measured or {}).get("threads")},
                         "onnxruntime": {k: ort[k] for k in ("p50_ms", "min_ms")} if ort else None},
            "abis": abis, "slots": slots}


def _today() -> str:
    return datetime.now(timezone.utc).date().isoformat()


HEADER = ("# Written by `doit search target={target}` (pipeline/bench/config_search.py): per model\n"
          "# of this folder, the compiler configuration each ABI is built with, and the figures it\n"
          "# was chosen by. `doit build` reads it and times nothing; search again to replace it\n"
          "# (docs/configs.md). Commit it with the model.\n")


def write_pin(project, model, target_name: str, entry: dict) -> Path:
    """Replace the model's entry of its folder's pin for the target (the other models of the
    folder keep theirs; entries of models the folder no longer has are dropped)."""
    path = pin_path(model.dir, target_name)
    ours = {m.name for m in project.models if m.dir == model.dir}
    problems: list = []
    old = read_yaml(path, problems) if path.is_file() else None
    kept = {k: v for k, v in ((old or {}).get("models") or {}).items() if k in ours}
    kept[model.name] = entry
    doc = {"format": PIN_FORMAT, "target": target_name,
           "models": {k: kept[k] for k in sorted(kept)}}
    text = HEADER.format(target=target_name) + yaml.safe_dump(doc, sort_keys=False, width=100,
                                                              allow_unicode=True)
    atomic_write_text(path, text)
    return path


def table(model_name: str, entry: dict) -> list[str]:
    """The figures of one model's search, one line per candidate."""
    ort = entry["searched"]["onnxruntime"]
    lines = [f"{model_name}: onnxruntime p50 {ort['p50_ms']:.3f} ms" if ort else
             f"{model_name}: nothing was timed"]
    for abi, body in entry["abis"].items():
        for name, c in body["candidates"].items():
            mark = "*" if name == body["config"] else " "
            if c["status"] == "timed":
                lines.append(f"  {mark} {abi} {name}: p50 {c['p50_ms']:.3f} ms, "
                             f"{c['ratio_to_onnxruntime']:.2f}x onnxruntime, max abs {c['max_abs']:.2g}")
            elif c["status"] == "same-as":
                lines.append(f"    {abi} {name}: the same build as {c['same_as']} ({c['why']})")
            else:
                lines.append(f"    {abi} {name}: {c['status']} at {c.get('stage')}: "
                             f"{' '.join((c.get('why') or '').splitlines()[:2])}")
    for name, body in entry.get("followers", {}).items():
        tried = ", ".join(f"{n} {c['status']}" for n, c in body["candidates"].items())
        lines.append(f"  {name} follows {body['follows']}: pinned {body['config']} ({tried})")
    for slot, body in entry["slots"].items():
        lines.append(f"  slot {slot}: {body['ships']} ({body['reason']})")
    return lines


# ----------------------------------------------------------------------------- in a build
def search_in_build(layout, model, target, abi, cfg: dict, say=print, clock=time.monotonic) -> dict:
    """The search_configs step's ranking (pipeline/stages/search_configs.py): the candidates of
    one host ABI in cfg's order, each built and validated through the stages' own steps while
    the budget allows (the timing window reserved), then every validated one timed with
    onnxruntime side by side; the winner (lowest p50), the ranking, and what was not tried.
    The budget is enforced: a candidate still building when it runs out is stopped (its tools
    killed) and recorded as not finished. One that takes more than CAP_FACTOR times the default's
    time (at least CAP_MIN_S) is stopped too, and the search goes on without the candidates whose
    rewrites include all of its own (they build the same slow graph, or a larger one)."""
    start, budget, window = clock(), float(cfg["budget_s"]), dict(cfg["window"])
    reserve = 2 * window["seconds"]  # the timing at the end, and its warm-up
    graphs = _GraphDigests(static_model(layout, model))
    results, timed, seen, costs, finished, slow, stopped = {}, [], {}, [], [], {}, None
    for k, config in enumerate(cfg["candidates"]):
        name = config["name"]
        record = {"flags": list(config["flags"]), "rewrites": list(config["rewrites"])}
        spent = clock() - start
        if stopped is None and k and not fits(spent, finished, budget, window["seconds"]):
            stopped = (f"the budget of {budget:g} s was used: {spent:.0f} s spent building and "
                       f"validating, the slowest candidate took {max(finished or [0]):.0f} s, "
                       f"{reserve:g} s kept for timing")
        if stopped is not None:
            results[name] = {**record, "status": "not-tried", "why": stopped}
            continue
        like = next((n for n, r in slow.items() if r <= set(config["rewrites"])), None)
        if like is not None:  # its rewrites hold those of a candidate too slow to build
            results[name] = {**record, "status": "not-tried",
                             "why": f"its rewrites include all of {like}'s, which did not build "
                                    f"in time: {results[like]['why']}"}
            continue
        same = (tuple(config["flags"]), graphs.of(config["rewrites"]))
        if same in seen:
            results[name] = {**record, "status": "same-as", "same_as": seen[same],
                             "why": f"the graph and flags of {seen[same]} in this model"}
            continue
        seen[same] = name
        say(f"{PROGRESS}{target.name}/{model.name}/{abi.name}: {name} ({_what(config)}), "
            f"{spent:.0f} of {budget:g} s spent")
        began, left = clock(), max(budget - spent - reserve, 1.0)
        cap = max(CAP_FACTOR * costs[0], CAP_MIN_S) if costs else left  # default: the budget
        done, built = bounded(lambda: _build_candidate(layout, model, target, abi, config, say),
                              min(left, cap))
        costs.append(clock() - began)
        if done:
            finished.append(costs[-1])
        if not done and cap < left:  # one slow candidate does not eat the budget: the next goes on
            why = (f"stopped after {costs[-1]:.0f} s: more than {CAP_FACTOR}x the default's "
                   f"{costs[0]:.0f} s (at least {CAP_MIN_S:g} s) to build and validate")
            say(f"{PROGRESS}  {why}")
            results[name] = {**record, "status": "not-finished", "why": why}
            if config["rewrites"]:
                slow[name] = set(config["rewrites"])
            continue
        if not done:
            stopped = (f"the budget of {budget:g} s ran out while {name} was building: stopped "
                       f"after {costs[-1]:.0f} s, {reserve:g} s kept for timing")
            say(f"{PROGRESS}  {stopped}")
            results[name] = {**record, "status": "not-finished", "why": stopped}
            continue
        results[name], artifact = built
        if artifact is not None:
            timed.append({"abi": abi.name, "config": name, "format": IREE.format,
                          "path": str(artifact), "entry": "main", "device": abi.run["device"]})
    measured = _time(layout, model, target, timed, window, say) if timed else None
    ort = next((r for r in (measured or {}).get("artifacts", []) if r["abi"] == "onnxruntime"), None)
    for row in (measured or {}).get("artifacts", []):
        if row["abi"] != "onnxruntime":
            results[row["config"]].update(status="timed", p50_ms=row["p50_ms"], min_ms=row["min_ms"],
                                          ratio_to_onnxruntime=round(row["p50_ms"] / ort["p50_ms"], 4))
    order = [c["name"] for c in cfg["candidates"]]
    ranking = sorted((n for n in order if results[n]["status"] == "timed"),
                     key=lambda n: (results[n]["p50_ms"], order.index(n)))
    best = ranking[0] if ranking else None
    return {"format": "modelyard.search/1", "target": target.name, "model": model.name,
            "abi": abi.name, "budget_s": budget, "spent_s": round(clock() - start, 1),
            "config": best, "flags": list(results[best]["flags"]) if best else [],
            "rewrites": list(results[best]["rewrites"]) if best else [],
            "ranking": ranking, "order": order,
            "not_tried": [n for n in order if results[n]["status"] in ("not-tried", "not-finished")],
            "candidates": results,
            "onnxruntime": {k: ort[k] for k in ("p50_ms", "min_ms")} if ort else None,
            "window": {**window, "rounds_done": (measured or {}).get("rounds", 0),
                       "threads": (measured or {}).get("threads")},
            "machine": {"cpu_model": cpu_model(), "arch": platform.machine(),
                        "usable_cpus": len(os.sched_getaffinity(0))},
            "tools": {t: distribution_version(t) for t in TOOLS[:3]}}


def bounded(fn, seconds: float) -> tuple[bool, object]:
    """fn() in a forked child in a session of its own: (True, what it returned), or (False,
    None) when `seconds` passed first (the child and the tools it started are killed: a step
    killed midway publishes nothing, core/steps.py). An exception in fn is raised here."""
    ctx = multiprocessing.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)

    def child():
        os.setsid()
        try:
            send.send((True, fn()))
        except BaseException:  # a bug: its traceback goes to the parent
            send.send((False, traceback.format_exc()))

    proc = ctx.Process(target=child)
    proc.start()
    send.close()
    if receive.poll(seconds):
        try:
            ok, value = receive.recv()
        except EOFError:
            ok, value = False, f"the child building the candidate died (exit code {proc.exitcode})"
        proc.join()
        if not ok:
            raise RuntimeError(f"building a candidate failed:\n{value}")
        return True, value
    for kill in (lambda: os.killpg(proc.pid, signal.SIGKILL), proc.kill):
        try:
            kill()
            break
        except (ProcessLookupError, PermissionError):
            continue
    proc.join()
    return False, None


def fits(spent: float, costs: list, budget: float, timing_s: float) -> bool:
    """Whether one more candidate fits: the slowest so far (a guess at the next), after what was
    spent, leaves the timing window (and its warm-up, at most as much again) in the budget."""
    return spent + max(costs or [0.0]) + 2 * timing_s <= budget


def _in_build(plan_path: str) -> int:
    """The child of a search_configs step: load the model and target, search, write the ranking."""
    plan = json.loads(Path(plan_path).read_text())
    cfg, layout = plan["config"], Layout(Path(plan["artifacts"]))
    specs, problems = load_model(Path(plan["spec"]), memo_dir=layout.cache)
    model = next((m for m in specs or () if m.name == cfg["model"]), None)
    if model is None:
        raise SystemExit(f"no model {cfg['model']!r} in {plan['spec']}: {'; '.join(problems)}")
    target = load_target(cfg["target"], Path(plan["targets"]))
    abi = next(a for a in target.abis if a.name == cfg["abi"])
    # the search_configs step's key holds these backends: asking for another is refused
    with codehash.running("pipeline.bench.config_search", plan["uses"], plan["where"]):
        ranking = search_in_build(layout, model, target, abi, cfg,
                                  say=lambda line: print(line, flush=True))
    atomic_write_text(Path(plan["output"]), json.dumps(ranking, indent=1, sort_keys=True) + "\n")
    print(f"{PROGRESS}ranking: {', '.join(ranking['ranking']) or 'nothing validated'}; not tried: "
          f"{', '.join(ranking['not_tried']) or 'none'}", flush=True)
    return 0


# ----------------------------------------------------------------------------- the child
def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--in-build"]:
        return _in_build(args[1])
    plan = json.loads(Path(args[0]).read_text())
    last = [time.perf_counter()]

    def progress(rounds: int, seconds: float) -> None:
        if time.perf_counter() - last[0] >= 10 or rounds == plan["window"]["rounds"]:
            last[0] = time.perf_counter()
            print(f"{PROGRESS}  round {rounds}/{plan['window']['rounds']}, {seconds:.0f} s",
                  flush=True)
    print(json.dumps(measure(plan, on_round=progress), sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
