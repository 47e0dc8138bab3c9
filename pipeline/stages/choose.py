"""Stage `choose`: when several compilers' artifacts of a model validate for one device, which ships.

A target declares *slots*: ABIs that stand for the same device, one of which ships per model,
and the policy that picks it:

    ship:                                       # in pipeline/targets/<target>.yaml
      cpu:
        abis: [cpu-aarch64, cpu-aarch64-tvm]    # the declared order
        policy: prefer                          # prefer | fastest-on-host
        proxies: {cpu-aarch64: host/cpu-x86_64, cpu-aarch64-tvm: host/cpu-x86_64-tvm}

  prefer           the first validated ABI in the declared order;
  fastest-on-host  time the host proxies of the candidates side by side (interleaved rounds in a
                   child process, on the golden inputs) and ship the one whose proxy is faster.
                   Native ABIs (run.via python) are their own proxies; an aarch64 ABI needs a
                   host ABI of the same compiler as `proxies`. When it cannot measure, it says
                   why in the reason and ships by the declared order (never silently).
  pinned           (not declared: it comes first when it applies) the slot's fastest validated
                   ABI as `doit search` measured it and pinned it in models/<m>/configs/<target>.yaml
                   (pipeline/bench/config_search.py); it applies only while the candidates are the
                   very bytes that were timed (their sha256s), else the reason says why not and the
                   slot's policy decides. No timing happens in the build.
  fallback         (not declared: a slot that builds one candidate, compilers/builds.py
                   `fallback_pair`) the preferred candidate failed to compile or to validate, so
                   the slot's fallback (the next ABI of another compiler, left out while the
                   preferred works) was built, validated, and ships; the reason and `failed` give
                   the preferred's stage, error class and error. The two read attempt records
                   (graph/fallback.py), not artifacts that may not exist.
A model can override all of them with an explicit choice: `ship: {rk3588: {cpu: cpu-aarch64-tvm}}`
in its model.yaml (a shape variant does not inherit its model's: its figures are its own). A
candidate skipped by op coverage is not a candidate.

choice.json (and the manifest's `models[m]["choice"]`) says, per slot, what shipped, by which
policy, why, and the figures (validation errors, size, and the measured p50s when measured).
Measured figures are measurements: a rebuild restores them from the store under the step's key
(the artifacts' sha256s); a clean build measures again.

A precision variant (`<model>.<variant>`, int8 or fp16) has a choice step of its own: whether it
pays, measured. Per ABI it is built for whose artifacts run natively here, the variant's artifact,
its model's fp32 artifact for the same ABI, and onnxruntime on the variant's model and on the fp32
model are timed side by side (interleaved rounds in a child process, on the golden inputs);
choice.json's `pays` (run/variant_speed.py) gives the four p50s, the speedup and, for a variant
slower than its fp32 build, why and next. An ABI not timed here says why (`measured: false`).
"""
from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ..compilers.backends import BY_FORMAT, backend_of
from ..compilers.builds import (attempt_file, built, fallback_pair, not_needed, read_attempt,
                                skipped, unsupported, variant_abis, variant_skip_reason)
from ..compilers.coverage_table import ops_text
from ..core.layout import golden_files, static_model
from ..core.steps import StageConfig, Step, where
from ..core.store import pretty_json, sha256_file
from ..core.tools import python_module_argv, run_tool
from ..run.timing import OnnxruntimeCpuRunner
from ..run.variant_speed import not_measured, reason, record
from ..spec.ship import POLICIES
from ..spec.variants import PRECISIONS, full_name, variant_model

VERSION = 1
OUTPUTS = ("choice.json",)
WINDOW = {"warmup": 2, "rounds": 30, "seconds": 10.0}


@dataclass(frozen=True)
class Slot(StageConfig):
    """One slot of the target (ABIs that stand for one device) as this model sees it."""
    name: str
    order: tuple[str, ...]          # the slot's ABIs in the declared order
    policy: str                     # prefer | fastest-on-host
    candidates: tuple[str, ...]     # the ABIs built for the model, in that order
    skipped: dict                   # ABI -> why it is not a candidate
    explicit: str | None            # the model spec's own choice
    proxy_of: dict                  # fastest-on-host: candidate -> {name: target/abi, format}
    golden_inputs: tuple[str, ...]  # the golden input files the proxies are timed on
    pinned: dict | None = None      # `doit search`'s winner: {ships, reason, sha256: {abi: sha256}}
    fallback: dict | None = None    # {preferred, fallback, why}: built only if the preferred fails

    def problems(self):
        if self.policy not in POLICIES:
            yield f"slot {self.name}: policy must be one of {', '.join(POLICIES)}, got {self.policy!r}"
        if not set(self.candidates) <= set(self.order):
            yield f"slot {self.name}: candidates must be ABIs of the slot ({', '.join(self.order)})"
        if self.explicit is not None and self.explicit not in self.order:
            yield f"slot {self.name}: the explicit choice {self.explicit!r} is not an ABI of the slot"
        timed = self.policy == "fastest-on-host" and len(self.candidates) > 1
        if sorted(self.proxy_of) != (sorted(self.candidates) if timed else []):
            yield f"slot {self.name}: proxy_of names a host proxy for each candidate a fastest-on-host slot times, only"
        if self.pinned is not None and (set(self.pinned) != {"ships", "reason", "sha256"}
                                        or self.pinned["ships"] not in self.order):
            yield f"slot {self.name}: pinned is {{ships, reason, sha256}}, ships an ABI of the slot"
        if self.fallback is not None and (
                set(self.fallback) != {"preferred", "fallback", "why"}
                or self.candidates != (self.fallback["preferred"],)
                or self.fallback["fallback"] not in self.order or self.pinned or self.explicit):
            yield (f"slot {self.name}: fallback is {{preferred, fallback, why}} of a slot whose one "
                   f"candidate is the preferred, with no pin or explicit choice")

    def as_key(self) -> dict:
        key = super().as_key()
        if self.pinned is None:  # the key of a slot without a pin is what it was before pins
            del key["pinned"]
        if self.fallback is None:  # ... and without a fallback, before fallbacks
            del key["fallback"]
        return key


@dataclass(frozen=True)
class Config(StageConfig):
    target: str                 # the target's name
    slots: tuple[Slot, ...]     # in the target's order

    def problems(self):
        names = [s.name for s in self.slots]
        if len(set(names)) != len(names):
            yield f"slot names must be unique, got {', '.join(names)}"

    @classmethod
    def from_key(cls, key: dict) -> "Config":
        return cls(target=key["target"], slots=tuple(Slot.from_key(s) for s in key["slots"]))


# ----------------------------------------------------------------------------- the step
def run(ctx) -> None:
    cfg = ctx.cfg
    slots = {}
    for slot in cfg.slots:
        candidates = list(slot.candidates)
        entry = {"candidates": candidates, "policy": slot.policy, "skipped": slot.skipped}
        pinned = slot.pinned if len(candidates) > 1 and not slot.explicit else None
        stale = _stale(ctx, slot) if pinned else None
        if slot.fallback:
            entry.update(_fallback(ctx, slot))
        elif not candidates:
            entry.update(ships=None, reason="no candidate: every ABI of the slot was skipped")
        elif slot.explicit:
            entry.update(ships=slot.explicit, policy="explicit",
                         reason=f"explicit choice in the model spec (ship.{cfg.target}."
                                f"{slot.name}: {slot.explicit})"
                                + (f"; the search pinned {slot.pinned['ships']}"
                                   if slot.pinned else ""))
        elif len(candidates) == 1:
            entry.update(ships=candidates[0], reason="the only candidate"
                         + (f" ({_skipped_text(slot.skipped)})" if slot.skipped else ""))
        elif pinned and not stale:
            entry.update(ships=pinned["ships"], policy="pinned",
                         reason=f"pinned by doit search: {pinned['reason']}")
        elif slot.policy == "prefer":
            entry.update(ships=candidates[0],
                         reason=f"policy prefer: the first validated ABI in the declared order "
                                f"[{', '.join(slot.order)}]")
        else:
            entry.update(_fastest(ctx, slot))
        if stale:
            entry["reason"] = f"the search's pin does not apply ({stale}); {entry['reason']}"
        slots[slot.name] = entry
    ctx.output("choice.json").write_text(pretty_json({"slots": slots}))


def _stale(ctx, slot: Slot) -> str | None:
    """Why the pinned winner does not speak for this build's candidates, or None when it does:
    the winner must be a candidate, and every candidate the pin timed must be the bytes it timed."""
    if slot.pinned["ships"] not in slot.candidates:
        return f"it pinned {slot.pinned['ships']}, not a candidate of this build"
    changed = [abi for abi in slot.candidates if abi in slot.pinned["sha256"]
               and sha256_file(ctx.input(f"artifact:{abi}")) != slot.pinned["sha256"][abi]]
    missing = [abi for abi in slot.candidates if abi not in slot.pinned["sha256"]]
    if changed or missing:
        return ("the search timed other bytes of " + ", ".join(changed + missing)
                + ": search again (doit search)")
    return None


def _fallback(ctx, slot: Slot) -> dict:
    """A slot with a fallback: the preferred ships when it validated; else the fallback, which
    its gated steps built and validated (its failure fails the build before this step)."""
    preferred, fallback = slot.fallback["preferred"], slot.fallback["fallback"]
    mine = read_attempt(ctx.input(f"attempt:{preferred}"))
    if mine["status"] == "passed":
        left = {**slot.skipped, fallback: slot.fallback["why"]}
        return {"ships": preferred, "skipped": left,
                "reason": f"the only candidate ({_skipped_text(left)})"}
    spare = read_attempt(ctx.input(f"attempt:{fallback}"))
    if spare["status"] != "passed":  # its steps fail the build first: a bug if reached
        raise ctx.error(f"{preferred} failed and its fallback {fallback} did not pass "
                        f"({spare['status']})", hint="build again; report it if it stays")
    failed = {k: mine[k] for k in ("stage", "error_class", "what")}
    return {"ships": fallback, "policy": "fallback", "candidates": [fallback],
            "failed": {preferred: failed},
            "reason": f"fallback: {preferred} failed ({mine['error_class']} in {mine['stage']}: "
                      f"{mine['what'].splitlines()[0]}); {fallback}, the slot's fallback, was "
                      f"built and validated and ships"}


def _skipped_text(skipped: dict) -> str:
    return "; ".join(f"{abi} skipped: {why}" for abi, why in sorted(skipped.items()))


def _fastest(ctx, slot: Slot) -> dict:
    """Time the candidates' host proxies side by side; the reason quotes the figures."""
    where = dict(stage=ctx.step.stage, **ctx.step.where)
    plan = {"artifacts": [], "inputs": [str(ctx.input(f"golden:{f}")) for f in slot.golden_inputs],
            "window": WINDOW}
    for abi in slot.candidates:
        proxy = slot.proxy_of[abi]
        plan["artifacts"].append({"abi": abi, "proxy": proxy["name"], "format": proxy["format"],
                                  "path": str(ctx.input(f"proxy:{abi}")), "entry": "main"})
    spec = ctx.scratch / "timing.json"
    spec.write_text(json.dumps(plan))
    result = run_tool(python_module_argv("pipeline.stages.choose", str(spec)), log=ctx.log,
                      what="timing the host proxies", check=False, timeout=600, **where)
    order = list(slot.candidates)
    if result.returncode != 0:
        return {"ships": order[0], "measured": None,
                "reason": f"policy fastest-on-host could not measure (the timing run failed, "
                          f"see {ctx.log}); shipped by the declared order [{', '.join(order)}]"}
    timing = json.loads(result.output.strip().splitlines()[-1])
    p50 = {a["abi"]: a["p50_ms"] for a in timing["artifacts"]}
    best = min(order, key=lambda a: (p50[a], order.index(a)))
    others = [a for a in order if a != best]
    figures = ", ".join(f"{a} via {slot.proxy_of[a]['name']} p50 {p50[a]:.3f} ms" for a in order)
    ratio = min(p50[a] for a in others) / p50[best] if p50[best] else float("inf")
    return {"ships": best, "measured": timing,
            "reason": f"policy fastest-on-host: {figures} (interleaved, {timing['rounds']} "
                      f"rounds, {timing['threads']} threads, this machine); {best} is "
                      f"{ratio:.2f}x faster"}


# ----------------------------------------------------------------------------- steps
def steps(project) -> list:
    return ([choose_step(project, m, t) for m in project.models for t in project.targets if t.ship]
            + [variant_step(project, m, v, t) for m in project.models for v in m.variants
               for t in project.targets if _variant_built(project, m, v, t)])


def _artifact_files(layout, target_name: str, model, abi) -> dict:
    backend = backend_of(abi)
    base = layout.artifact_stage(target_name, model.name, abi.name, backend.compile_stage)
    return {"artifact": base / backend.artifact,
            "validation": layout.artifact_stage(target_name, model.name, abi.name, "validate")
            / "validation.json", "format": backend.format}


def choose_step(project, model, target) -> Step:
    layout = project.layout
    by_name = {a.name: a for a in target.abis}
    skip = skipped(project, model, target)
    targets = {t.name: t for t in (*project.targets, *project.proxies)}
    inputs, slots = {}, []
    for slot in target.ship:
        candidates, skipped_abis = [], {}
        pair = fallback_pair(project, model, target, slot)
        for name in slot["abis"]:
            backend = backend_of(by_name[name])
            if model.skip_reason(name):
                skipped_abis[name] = f"skipped by the model's spec: {model.skip_reason(name)}"
                continue
            if backend in skip:
                skipped_abis[name] = (f"{backend.title} cannot take "
                                      f"{ops_text(unsupported(project, model, target, backend))} "
                                      f"(op coverage)")
                continue
            why_not = not_needed(project, model, target, by_name[name])
            if why_not:
                skipped_abis[name] = why_not
                continue
            if pair:  # the preferred and its fallback: their validations' attempt records
                inputs[f"attempt:{name}"] = attempt_file(layout, target.name, model.name, name,
                                                         "validate")
                if name == pair["fallback"]:
                    continue
            else:
                inputs[f"validation:{name}"] = _artifact_files(layout, target.name, model,
                                                               by_name[name])["validation"]
            candidates.append(name)
        proxy_of = {}
        if slot["policy"] == "fastest-on-host" and len(candidates) > 1:
            for name in candidates:
                ref = slot["proxies"].get(name, f"{target.name}/{name}")
                t_name, a_name = ref.split("/")
                proxy_abi = next(a for a in targets[t_name].abis if a.name == a_name)
                files = _artifact_files(layout, t_name, model, proxy_abi)
                inputs[f"proxy:{name}"] = files["artifact"]
                inputs[f"proxy-validation:{name}"] = files["validation"]
                proxy_of[name] = {"name": ref, "format": files["format"]}
            inputs.update(golden_files(layout, model))
        explicit = model.ship.get(target.name, {}).get(slot["name"])
        pinned = project.pinned_slots.get((target.name, model.name), {}).get(slot["name"])
        if pinned:  # the pin applies to the bytes it timed: choose compares their sha256s
            for name in candidates:
                inputs[f"artifact:{name}"] = _artifact_files(layout, target.name, model,
                                                             by_name[name])["artifact"]
        slots.append(Slot(name=slot["name"], order=tuple(slot["abis"]), policy=slot["policy"],
                          candidates=tuple(candidates), skipped=skipped_abis, explicit=explicit,
                          proxy_of=proxy_of,
                          golden_inputs=tuple(f"input_{i}.npy" for i in range(len(model.inputs))),
                          pinned=pinned, fallback=pair))
    return Step(stage="choose", name=f"{target.name}/{model.name}", version=VERSION,
                config=Config(target=target.name, slots=tuple(slots)), inputs=inputs,
                outputs=OUTPUTS, out_dir=layout.target_model_stage(target.name, model.name, "choose"),
                tools=("iree-base-runtime", "apache-tvm") if any(s.proxy_of for s in slots)
                else (), action=run, layout=layout,
                doc="which compiler's artifact ships, by the target's policy",
                where=where(model, target))


# ----------------------------------------------------------------------------- precision variants
@dataclass(frozen=True)
class VariantConfig(StageConfig):
    """A precision variant's choice: which of its ABIs are timed beside the fp32 build here."""
    target: str
    variant_of: str                 # the fp32 model
    precision: str                  # int8 | fp16
    timed: tuple[str, ...]          # ABIs whose variant and fp32 artifacts run natively here
    untimed: dict                   # ABI -> why its speed is not measured here
    formats: dict                   # timed ABI -> its artifacts' format
    input_names: tuple[str, ...]    # the model's inputs (onnxruntime's feeds), golden order

    def problems(self):
        if self.precision not in PRECISIONS:
            yield f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}"
        if set(self.timed) & set(self.untimed):
            yield "an ABI is timed or untimed, not both"
        if sorted(self.formats) != sorted(self.timed):
            yield "formats names the format of each timed ABI, only"


def run_variant(ctx) -> None:
    cfg = ctx.cfg
    pays = {abi: not_measured(why) for abi, why in cfg.untimed.items()}
    inputs = [str(ctx.input(f"golden:input_{i}.npy")) for i in range(len(cfg.input_names))]
    for abi in cfg.timed:
        plan = {"inputs": inputs, "window": WINDOW, "artifacts": [
            {"config": "variant", "format": cfg.formats[abi],
             "path": str(ctx.input(f"artifact:{abi}")), "entry": "main"},
            {"config": "fp32", "format": cfg.formats[abi], "path": str(ctx.input(f"fp32:{abi}")),
             "entry": "main"},
            {"config": "onnxruntime", "format": ONNX, "path": str(ctx.input("model")),
             "input_names": list(cfg.input_names)},
            {"config": "onnxruntime-fp32", "format": ONNX, "path": str(ctx.input("fp32-model")),
             "input_names": list(cfg.input_names)}]}
        spec = ctx.scratch / f"timing-{abi}.json"
        spec.write_text(json.dumps(plan))
        result = run_tool(python_module_argv("pipeline.stages.choose", str(spec)), log=ctx.log,
                          what=f"timing the {cfg.precision} and fp32 artifacts ({abi})",
                          check=False, timeout=600, stage=ctx.step.stage, **ctx.step.where)
        if result.returncode != 0:
            pays[abi] = not_measured(f"the timing run failed (see {ctx.log})")
            continue
        timing = json.loads(result.output.strip().splitlines()[-1])
        p50 = {a["config"]: a["p50_ms"] for a in timing["artifacts"]}
        pays[abi] = {**record(cfg.precision, p50["variant"], p50["fp32"], p50["onnxruntime"],
                              p50["onnxruntime-fp32"],
                              where=f"this machine, interleaved, {timing['rounds']} rounds, "
                                    f"{timing['threads']} threads"),
                     "rounds": timing["rounds"], "threads": timing["threads"]}
    ctx.output("choice.json").write_text(pretty_json(
        {"variant_of": cfg.variant_of, "precision": cfg.precision, "pays": pays,
         "reason": reason(cfg.precision, pays)}))


def _variant_built(project, model, v, target) -> list:
    """The target's ABIs the variant is built for (its skips, its backends)."""
    return [a for a in variant_abis(target)
            if not variant_skip_reason(model, v, a, project.layout.cache)]


def variant_step(project, model, v, target) -> Step:
    """Whether the variant pays on each ABI it is built for: timed beside the fp32 build."""
    layout, name = project.layout, full_name(model, v)
    inputs = {"model": layout.model_stage(name, "quantize") / "model.onnx",
              "fp32-model": static_model(layout, model), **golden_files(layout, model)}
    timed, untimed, formats = [], {}, {}
    for abi in _variant_built(project, model, v, target):
        if abi.run.get("via") != "python":
            untimed[abi.name] = (f"its artifacts run {abi.run.get('via')} here, not natively: "
                                 f"their speed is not measured on this machine (a host build of "
                                 f"the variant is timed by `doit build target=host`)")
            continue
        if not built(project, model, target, abi):
            untimed[abi.name] = f"{model.name} (fp32) is not built for {abi.name}: nothing to compare with"
            continue
        mine = _artifact_files(layout, target.name, variant_model(model, v), abi)
        theirs = _artifact_files(layout, target.name, model, abi)
        inputs.update({f"artifact:{abi.name}": mine["artifact"],
                       f"validation:{abi.name}": mine["validation"],
                       f"fp32:{abi.name}": theirs["artifact"],
                       f"fp32-validation:{abi.name}": theirs["validation"]})
        formats[abi.name] = mine["format"]
        timed.append(abi.name)
    config = VariantConfig(target=target.name, variant_of=model.name, precision=v.precision,
                           timed=tuple(timed), untimed=untimed, formats=formats,
                           input_names=tuple(i.name for i in model.inputs))
    return Step(stage="choose", name=f"{target.name}/{name}", version=VERSION, config=config,
                inputs=inputs, outputs=OUTPUTS,
                out_dir=layout.target_model_stage(target.name, name, "choose"),
                tools=("iree-base-runtime", "onnxruntime") if timed else (), action=run_variant,
                layout=layout, doc=f"whether the {v.precision} variant pays: timed beside the fp32 build",
                where={"model": name, "target": target.name})


# ----------------------------------------------------------------------------- the child
LABELS = ("abi", "proxy", "config")  # what a timed item of a plan is called in the result
ONNX = "onnx"         # the format of onnxruntime's baseline in a plan
CPU = "local-task"    # the device an artifact is timed on when its plan item names none


def _runner(art: dict, threads: int):
    """A callable timing one run: an artifact (its backend's timer, on the device it names, by
    default its CPU), or onnxruntime on an .onnx model (format onnx, with its input names: the
    baseline `doit search` times the others against)."""
    if art["format"] == ONNX:
        return OnnxruntimeCpuRunner(Path(art["path"]), art["input_names"], threads)
    return BY_FORMAT[art["format"]].timer(Path(art["path"]), art["entry"],
                                          art.get("device", CPU), threads)


def measure(plan: dict, on_round=None) -> dict:
    """Round-robin the artifacts on the inputs (the first one of each round rotates);
    `on_round(rounds done, seconds)` after each round."""
    import numpy as np  # numpy: 0.2 s, not needed by doit list
    threads = len(os.sched_getaffinity(0))
    inputs = [np.load(p, allow_pickle=False) for p in plan["inputs"]]
    runners = [_runner(a, threads) for a in plan["artifacts"]]
    window = plan["window"]
    for _ in range(window["warmup"]):
        for run in runners:
            run(inputs)
    samples = [[] for _ in runners]
    start, rounds = time.perf_counter(), 0
    while rounds < window["rounds"] and time.perf_counter() - start < window["seconds"]:
        k = rounds % len(runners)
        for i in list(range(k, len(runners))) + list(range(k)):
            phases, _ = runners[i](inputs)
            samples[i].append(sum(phases.values()))
        rounds += 1
        if on_round:
            on_round(rounds, time.perf_counter() - start)
    return {"rounds": rounds, "threads": threads,
            "artifacts": [{**{k: a[k] for k in LABELS if k in a},
                           "p50_ms": round(float(np.median(s)) / 1e6, 6),
                           "min_ms": round(min(s) / 1e6, 6)}
                          for a, s in zip(plan["artifacts"], samples)]}


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    plan = json.loads(Path(args[0]).read_text())
    print(json.dumps(measure(plan), sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
