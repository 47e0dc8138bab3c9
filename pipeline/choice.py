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
A model can override both with an explicit choice: `ship: {rk3588: {cpu: cpu-aarch64-tvm}}`
in its model.yaml. A candidate skipped by op coverage is not a candidate.

choice.json (and the manifest's `models[m]["choice"]`) says, per slot, what shipped, by which
policy, why, and the figures (validation errors, size, and the measured p50s when measured).
Measured figures are measurements: a rebuild restores them from the store under the step's key
(the artifacts' sha256s); a clean build measures again.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from .errors import unknown_keys
from .tools import python_module_argv, run_tool

VERSION = 1
OUTPUTS = ("choice.json",)
POLICIES = ("prefer", "fastest-on-host")
_SLOT_KEYS = {"abis", "policy", "proxies"}
WINDOW = {"warmup": 2, "rounds": 30, "seconds": 10.0}


# ----------------------------------------------------------------------------- specs
def parse_target(raw, abi_names: list[str], native: set[str], where: str, problems: list) -> tuple:
    """The target's `ship:` slots as a tuple of dicts (name, abis, policy, proxies)."""
    if raw is None:
        return ()
    if not isinstance(raw, dict):
        problems.append(f"{where}: ship: expected a mapping of slot name -> {{abis, policy}}")
        return ()
    slots, taken = [], {}
    for name, body in raw.items():
        sw = f"{where}: ship.{name}"
        if not isinstance(body, dict):
            problems.append(f"{sw}: expected a mapping with abis and policy")
            continue
        unknown_keys(problems, sw, body, _SLOT_KEYS)
        abis = body.get("abis")
        if not isinstance(abis, list) or len(abis) < 2 or not all(isinstance(a, str) for a in abis):
            problems.append(f"{sw}.abis: expected a list of two or more ABI names")
            continue
        for abi in abis:
            if abi not in abi_names:
                problems.append(f"{sw}.abis: no ABI {abi!r} in this target (it has: "
                                f"{', '.join(abi_names)})")
            elif abi in taken:
                problems.append(f"{sw}.abis: {abi!r} is already in slot {taken[abi]!r}")
            taken.setdefault(abi, name)
        policy = body.get("policy", "prefer")
        if policy not in POLICIES:
            problems.append(f"{sw}.policy: expected one of {', '.join(POLICIES)}, got {policy!r}")
        proxies = body.get("proxies", {})
        if not isinstance(proxies, dict):
            problems.append(f"{sw}.proxies: expected a mapping ABI -> TARGET/ABI")
            proxies = {}
        for abi, proxy in proxies.items():
            if abi not in abis:
                problems.append(f"{sw}.proxies: {abi!r} is not one of this slot's abis")
            if not isinstance(proxy, str) or proxy.count("/") != 1:
                problems.append(f"{sw}.proxies.{abi}: expected TARGET/ABI (e.g. host/cpu-x86_64), "
                                f"got {proxy!r}")
        if policy == "fastest-on-host":
            for abi in abis:
                if abi not in native and abi not in proxies:
                    problems.append(f"{sw}.proxies: {abi!r} does not run on this machine: name "
                                    f"its host proxy (an ABI of the host target, same compiler)")
        slots.append({"name": str(name), "abis": list(abis), "policy": policy,
                      "proxies": {str(k): str(v) for k, v in proxies.items()}})
    return tuple(slots)


def parse_model(raw, where: str, problems: list) -> dict:
    """A model's explicit choices: {target: {slot: abi}} (checked against targets later)."""
    if raw is None:
        return {}
    ok = isinstance(raw, dict) and all(
        isinstance(t, dict) and all(isinstance(a, str) for a in t.values()) for t in raw.values())
    if not ok:
        problems.append(f"{where}: ship: expected {{target: {{slot: abi}}}}, e.g. "
                        f"{{rk3588: {{cpu: cpu-aarch64-tvm}}}}")
        return {}
    return {str(t): {str(s): a for s, a in slots.items()} for t, slots in raw.items()}


def check_explicit(models, targets) -> list[str]:
    """Problems with the models' explicit choices against the loaded targets' slots."""
    problems = []
    by_name = {t.name: t for t in targets}
    for model in models:
        for target, slots in model.ship.items():
            spec = by_name.get(target)
            if spec is None:
                continue  # a target not loaded in this run (target=NAME)
            known = {s["name"]: s for s in spec.ship}
            for slot, abi in slots.items():
                where = f"{model.spec_path}: ship.{target}.{slot}"
                if slot not in known:
                    problems.append(f"{where}: target {target} has no slot {slot!r} (it has: "
                                    f"{', '.join(known) or 'none'})")
                elif abi not in known[slot]["abis"]:
                    problems.append(f"{where}: {abi!r} is not in the slot (candidates: "
                                    f"{', '.join(known[slot]['abis'])})")
    return problems


# ----------------------------------------------------------------------------- the step
def run(ctx) -> None:
    cfg = ctx.config
    slots = {}
    for slot in cfg["slots"]:
        candidates = slot["candidates"]
        entry = {"candidates": candidates, "policy": slot["policy"],
                 "skipped": slot["skipped"]}
        if not candidates:
            entry.update(ships=None, reason="no candidate: every ABI of the slot was skipped")
        elif slot["explicit"]:
            entry.update(ships=slot["explicit"], policy="explicit",
                         reason=f"explicit choice in the model spec (ship.{cfg['target']}."
                                f"{slot['name']}: {slot['explicit']})")
        elif len(candidates) == 1:
            entry.update(ships=candidates[0], reason="the only candidate"
                         + (f" ({_skipped_text(slot['skipped'])})" if slot["skipped"] else ""))
        elif slot["policy"] == "prefer":
            entry.update(ships=candidates[0],
                         reason=f"policy prefer: the first validated ABI in the declared order "
                                f"[{', '.join(slot['order'])}]")
        else:
            entry.update(_fastest(ctx, slot))
        slots[slot["name"]] = entry
    ctx.output("choice.json").write_text(json.dumps({"slots": slots}, indent=2, sort_keys=True) + "\n")


def _skipped_text(skipped: dict) -> str:
    return "; ".join(f"{abi} skipped: {why}" for abi, why in sorted(skipped.items()))


def _fastest(ctx, slot: dict) -> dict:
    """Time the candidates' host proxies side by side; the reason quotes the figures."""
    where = dict(stage=ctx.step.stage, **ctx.step.where)
    plan = {"artifacts": [], "inputs": [str(ctx.input(f"golden:{f}")) for f in slot["golden_inputs"]],
            "window": WINDOW}
    for abi in slot["candidates"]:
        proxy = slot["proxy_of"][abi]
        plan["artifacts"].append({"abi": abi, "proxy": proxy["name"], "format": proxy["format"],
                                  "path": str(ctx.input(f"proxy:{abi}")), "entry": "main"})
    spec = ctx.scratch / "timing.json"
    spec.write_text(json.dumps(plan))
    result = run_tool(python_module_argv("pipeline.choice", str(spec)), log=ctx.log,
                      what="timing the host proxies", check=False, timeout=600, **where)
    order = slot["candidates"]
    if result.returncode != 0:
        return {"ships": order[0], "measured": None,
                "reason": f"policy fastest-on-host could not measure (the timing run failed, "
                          f"see {ctx.log}); shipped by the declared order [{', '.join(order)}]"}
    timing = json.loads(result.output.strip().splitlines()[-1])
    p50 = {a["abi"]: a["p50_ms"] for a in timing["artifacts"]}
    best = min(order, key=lambda a: (p50[a], order.index(a)))
    others = [a for a in order if a != best]
    figures = ", ".join(f"{a} via {slot['proxy_of'][a]['name']} p50 {p50[a]:.3f} ms" for a in order)
    ratio = min(p50[a] for a in others) / p50[best] if p50[best] else float("inf")
    return {"ships": best, "measured": timing,
            "reason": f"policy fastest-on-host: {figures} (interleaved, {timing['rounds']} "
                      f"rounds, {timing['threads']} threads, this machine); {best} is "
                      f"{ratio:.2f}x faster"}


# ----------------------------------------------------------------------------- the child
def _runner(art: dict, threads: int):
    from .bench import IreeCpuRunner
    from .tvm_run import TvmModule
    if art["format"] == "tvm-so":
        module = TvmModule(art["path"], art["entry"], threads=threads)
        return module.timed
    runner = IreeCpuRunner(Path(art["path"]), art["entry"], "local-task", threads)
    return lambda inputs: runner(inputs)


def measure(plan: dict) -> dict:
    """Round-robin the artifacts on the inputs (the first one of each round rotates)."""
    import os
    import numpy as np
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
    return {"rounds": rounds, "threads": threads,
            "artifacts": [{"abi": a["abi"], "proxy": a["proxy"],
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
