"""The build graph's second compiler: op coverage, TVM tune/compile/validate, the compiler choice.

Per target and model (graph.py asks `steps(project, stage)` for these stages):

    static ─> coverage ─┬─> iree_compile ... validate (graph.py; none for a skipped compiler)
                        └─> [tvm_tune] ─> tvm_compile ─> validate (TVM ABIs)
    validate (every candidate of a slot) ─> choose ─> manifest

Task names follow the IREE ones: `tvm_compile:rk3588/ppocr_det/cpu-aarch64-tvm`,
`coverage:rk3588/ppocr_det`, `choose:rk3588/ppocr_det`. Paths: artifacts/<t>/<m>/<abi>/
{tvm_tune,tvm_compile,validate}/, artifacts/<t>/<m>/{coverage,choose}/.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from . import choice, coverage, static, tvm_compile, tvm_tune, tvm_validate
from .errors import SpecError
from .steps import Step

STAGES = ("coverage", "tvm_tune", "tvm_compile", "validate", "choose")


def compiler_of(abi) -> str:
    return getattr(abi, "compiler", "iree")


def compilers(target) -> dict:
    """compiler -> the target's ABI names built by it."""
    out: dict = {}
    for abi in target.all_abis:
        out.setdefault(compiler_of(abi), []).append(abi.name)
    return out


def skipped(project, model, target) -> set[str]:
    prediction = project.coverage.get(model.name)
    return coverage.skipped(prediction, compilers(target)) if prediction else set()


def complete(project, targets_dir):
    """Add to a freshly loaded project what its specs imply: coverage predictions, the targets
    that proxy another's ABIs, checks of the models' explicit choices."""
    from .spec import TARGETS_DIR, load_target
    problems = choice.check_explicit(project.models, project.targets)
    if problems:
        raise SpecError(problems)
    predictions = {m.name: coverage.predict(m, project.layout.cache) for m in project.models}
    loaded = {t.name for t in project.targets}
    wanted = sorted({p.split("/")[0] for t in project.targets for s in t.ship
                     for p in s["proxies"].values()} - loaded)
    proxies = tuple(load_target(n, Path(targets_dir) if targets_dir else TARGETS_DIR,
                                memo_dir=project.layout.cache) for n in wanted)
    return dataclasses.replace(project, coverage=predictions, proxies=proxies)


def _where(model, target, abi=None) -> dict:
    return {"model": model.name, "target": f"{target.name}/{abi.name}" if abi else target.name}


def _static(layout, model) -> Path:
    return layout.model_stage(model.name, "static") / "model.onnx"


# ----------------------------------------------------------------------------- steps
def coverage_step(project, model, target) -> Step:
    prediction = project.coverage[model.name]
    by_compiler = compilers(target)
    cpu = [a for a in target.abis if a.backend == "llvm-cpu"] or list(target.abis)
    layout = project.layout
    return Step(stage="coverage", name=f"{target.name}/{model.name}", version=coverage.VERSION,
                config={"prediction": {"ops": prediction["ops"],
                                       **{c: prediction[c] for c in by_compiler},
                                       **({"unpredicted": prediction["unpredicted"]}
                                          if prediction.get("unpredicted") else {})},
                        "compilers": by_compiler,
                        # the flags matter only when the step must confirm that IREE fails
                        "iree_abi": cpu[0].compile_config() if cpu and prediction.get("iree")
                        else None},
                inputs={"model": _static(layout, model)}, outputs=coverage.OUTPUTS,
                out_dir=layout.root / target.name / model.name / "coverage",
                tools=("onnx", "iree-base-compiler", "apache-tvm"), action=coverage.run,
                layout=layout, doc="which ops each compiler of the target cannot take",
                where=_where(model, target))


def _budget(model, target) -> dict | None:
    return model.tvm.get("tune", {}).get(target.name)


def tune_step(project, model, target, abi, allow_tuning=None, farm=None,
              ignore_pins=False) -> Step:
    layout = project.layout
    budget = _budget(model, target)
    pinned = None if ignore_pins else model.tvm.get("database", {}).get(target.name)
    inputs = {"model": _static(layout, model)}
    if pinned:
        for name in tvm_tune.OUTPUTS:
            inputs[f"pinned:{name}"] = pinned / name
    given = farm if farm is not None else project.farm
    farm = {**abi.tune, **{k: v for k, v in given.items() if v is not None}}
    if allow_tuning is None:
        allow_tuning = budget["in_build"]
    return Step(stage="tvm_tune", name=f"{target.name}/{model.name}/{abi.name}",
                version=tvm_tune.VERSION,
                config={"target": abi.target_dict(), "target_name": target.name,
                        "budget": {k: budget[k] for k in ("trials", "per_task")},
                        "linker": abi.cross_compiler, "cross": abi.run["via"] != "python",
                        "pinned": _relative(pinned, model) if pinned else None},
                inputs=inputs, outputs=tvm_tune.OUTPUTS,
                out_dir=layout.artifact_stage(target.name, model.name, abi.name, "tvm_tune"),
                tools=tvm_tune.TOOLS, action=tvm_tune.action(allow_tuning, farm), layout=layout,
                doc=f"MetaSchedule database ({budget['trials']} trials) for {abi.cpu}",
                where=_where(model, target, abi), after=(f"coverage:{target.name}/{model.name}",))


def _relative(path: Path, model) -> str:
    try:
        return f"models/{model.name}/{path.relative_to(model.dir).as_posix()}"
    except ValueError:
        return str(path)


def compile_step(project, model, target, abi) -> Step:
    layout = project.layout
    budget = _budget(model, target)
    inputs = {"model": _static(layout, model)}
    if budget:
        tuned = layout.artifact_stage(target.name, model.name, abi.name, "tvm_tune")
        for name in tvm_tune.DATABASE:
            inputs[name] = tuned / name
    tools = tvm_compile.TOOLS + (abi.cross_compiler,)
    return Step(stage="tvm_compile", name=f"{target.name}/{model.name}/{abi.name}",
                version=tvm_compile.VERSION,
                config={**abi.compile_config(), "entry": static.ENTRY,
                        "tuning": {k: budget[k] for k in ("trials", "per_task")} if budget else None},
                inputs=inputs, outputs=tvm_compile.OUTPUTS,
                out_dir=layout.artifact_stage(target.name, model.name, abi.name, "tvm_compile"),
                tools=tools, action=tvm_compile.run, layout=layout,
                doc=f"TVM Relax for {abi.triple} ({abi.cpu})"
                    + (f", tuned ({budget['trials']} trials)" if budget else ", untuned"),
                where=_where(model, target, abi), after=(f"coverage:{target.name}/{model.name}",))


def validate_step(project, model, target, abi) -> Step:
    from .graph import _golden_files
    layout = project.layout
    compiled = layout.artifact_stage(target.name, model.name, abi.name, "tvm_compile")
    via = abi.run["via"]
    tools = ("apache-tvm", "numpy") if via == "python" else \
        ("tvm-aarch64", "qemu-aarch64-static", "numpy")
    return Step(stage="validate", name=f"{target.name}/{model.name}/{abi.name}",
                version=tvm_validate.VERSION,
                config={"run": abi.run, "entry": static.ENTRY, "compiler": "tvm",
                        "tolerance": model.tolerance.as_dict()},
                inputs={"model.so": compiled / "model.so", **_golden_files(layout, model)},
                outputs=tvm_validate.OUTPUTS,
                out_dir=layout.artifact_stage(target.name, model.name, abi.name, "validate"),
                tools=tools, action=tvm_validate.run, layout=layout,
                doc=f"run the TVM artifact ({via}) and compare with golden",
                where=_where(model, target, abi))


def _artifact_files(layout, target_name: str, model, abi) -> dict:
    stage = "tvm_compile" if compiler_of(abi) == "tvm" else "iree_compile"
    base = layout.artifact_stage(target_name, model.name, abi.name, stage)
    return {"artifact": base / ("model.so" if stage == "tvm_compile" else "model.vmfb"),
            "validation": layout.artifact_stage(target_name, model.name, abi.name, "validate")
            / "validation.json", "format": "tvm-so" if stage == "tvm_compile" else "iree-vmfb"}


def choose_step(project, model, target) -> Step:
    from .graph import _golden_files
    layout = project.layout
    by_name = {a.name: a for a in target.all_abis}
    skip = skipped(project, model, target)
    targets = {t.name: t for t in (*project.targets, *project.proxies)}
    inputs, slots = {}, []
    prediction = project.coverage[model.name]
    for slot in target.ship:
        candidates, skipped_abis = [], {}
        for name in slot["abis"]:
            c = compiler_of(by_name[name])
            if model.skip_reason(name):
                skipped_abis[name] = f"skipped by the model's spec: {model.skip_reason(name)}"
                continue
            if c in skip:
                skipped_abis[name] = (f"{c.upper()} cannot take "
                                      f"{coverage.ops_text(prediction[c])} (op coverage)")
                continue
            candidates.append(name)
            inputs[f"validation:{name}"] = _artifact_files(layout, target.name, model,
                                                           by_name[name])["validation"]
        proxy_of = {}
        if slot["policy"] == "fastest-on-host" and len(candidates) > 1:
            for name in candidates:
                ref = slot["proxies"].get(name, f"{target.name}/{name}")
                t_name, a_name = ref.split("/")
                proxy_abi = next(a for a in targets[t_name].all_abis if a.name == a_name)
                files = _artifact_files(layout, t_name, model, proxy_abi)
                inputs[f"proxy:{name}"] = files["artifact"]
                inputs[f"proxy-validation:{name}"] = files["validation"]
                proxy_of[name] = {"name": ref, "format": files["format"]}
            inputs.update(_golden_files(layout, model))
        explicit = model.ship.get(target.name, {}).get(slot["name"])
        slots.append({"name": slot["name"], "order": slot["abis"], "policy": slot["policy"],
                      "candidates": candidates, "skipped": skipped_abis, "explicit": explicit,
                      "proxy_of": proxy_of,
                      "golden_inputs": [f"input_{i}.npy" for i in range(len(model.inputs))]})
    return Step(stage="choose", name=f"{target.name}/{model.name}", version=choice.VERSION,
                config={"target": target.name, "slots": slots}, inputs=inputs,
                outputs=choice.OUTPUTS, out_dir=layout.root / target.name / model.name / "choose",
                tools=("iree-base-runtime", "apache-tvm") if any(s["proxy_of"] for s in slots)
                else (), action=choice.run, layout=layout,
                doc="which compiler's artifact ships, by the target's policy",
                where=_where(model, target))


def _tvm_abis(project, model, target) -> list:
    return [a for a in target.tvm_abis
            if not model.skip_reason(a.name) and "tvm" not in skipped(project, model, target)]


def _proxy_pairs(project):
    """(target, abi) of the proxy targets that some loaded target's slots name."""
    names = {p for t in project.targets for s in t.ship for p in s["proxies"].values()}
    for target in project.proxies:
        for abi in target.all_abis:
            if f"{target.name}/{abi.name}" in names:
                yield target, abi


def steps(project, stage: str) -> list[Step]:
    """The steps of `stage` that graph.py does not make itself."""
    from . import graph
    out = []
    for model in project.models:
        for target in project.targets:
            if stage == "coverage":
                out.append(coverage_step(project, model, target))
            elif stage == "tvm_tune":
                out += [tune_step(project, model, target, a) for a in _tvm_abis(project, model, target)
                        if _budget(model, target)]
            elif stage == "tvm_compile":
                out += [compile_step(project, model, target, a) for a in _tvm_abis(project, model, target)]
            elif stage == "validate":
                out += [validate_step(project, model, target, a) for a in _tvm_abis(project, model, target)]
            elif stage == "choose" and target.ship:
                out.append(choose_step(project, model, target))
        # the host ABIs that stand in for another target's ABIs when timing the choice
        for target, abi in _proxy_pairs(project):
            if compiler_of(abi) in skipped(project, model, target):
                continue
            if stage == "coverage" and not any(s.name == f"{target.name}/{model.name}" for s in out):
                out.append(coverage_step(project, model, target))
            elif compiler_of(abi) == "tvm" and stage in ("tvm_tune", "tvm_compile", "validate"):
                make = {"tvm_tune": tune_step, "tvm_compile": compile_step,
                        "validate": validate_step}[stage]
                if stage != "tvm_tune" or _budget(model, target):
                    out.append(make(project, model, target, abi))
            elif compiler_of(abi) == "iree" and stage in ("iree_compile", "validate"):
                out.append(graph.STAGE_STEPS[stage](project.layout, model, target, abi))
    return out


def tune_steps(project, target_name: str, model_name: str | None, farm: dict,
               allow_tuning: bool, ignore_pins: bool) -> list[Step]:
    """The tuning steps `doit tune` runs, with its tracker settings and permission to tune."""
    out = []
    for target in [t for t in (*project.targets, *project.proxies) if t.name == target_name]:
        for model in project.models:
            if model_name and model.name != model_name or not _budget(model, target):
                continue
            out += [tune_step(project, model, target, a, allow_tuning=allow_tuning, farm=farm,
                              ignore_pins=ignore_pins) for a in _tvm_abis(project, model, target)]
    return out


def pin_folder(project, step: Step) -> Path:
    """Where `doit tune pin=1` copies a database: the declared pin, or models/<m>/tuning/<t>."""
    target_name, model_name, _abi = step.name.split("/")
    model = next(m for m in project.models if m.name == model_name)
    return model.tvm.get("database", {}).get(target_name) or model.dir / "tuning" / target_name


# ----------------------------------------------------------------------------- manifest
def extend_manifest(project, step: Step, target) -> Step:
    """The manifest step of graph.py, plus TVM artifacts, op coverage and the choice."""
    layout = project.layout
    inputs, extra = dict(step.inputs), {}
    for model in project.models:
        inputs[f"{model.name}:coverage.json"] = (layout.root / target.name / model.name
                                                 / "coverage" / "coverage.json")
        if target.ship:
            inputs[f"{model.name}:choice.json"] = (layout.root / target.name / model.name
                                                   / "choose" / "choice.json")
        tvm = []
        for abi in _tvm_abis(project, model, target):
            prefix = f"{model.name}:{abi.name}"
            compiled = layout.artifact_stage(target.name, model.name, abi.name, "tvm_compile")
            checked = layout.artifact_stage(target.name, model.name, abi.name, "validate")
            inputs[f"{prefix}:model.so"] = compiled / "model.so"
            inputs[f"{prefix}:compile.json"] = compiled / "compile.json"
            inputs[f"{prefix}:compile.step"] = compiled / "step.json"
            inputs[f"{prefix}:validation.json"] = checked / "validation.json"
            inputs[f"{prefix}:validate.step"] = checked / "step.json"
            if _budget(model, target):
                tuned = layout.artifact_stage(target.name, model.name, abi.name, "tvm_tune")
                inputs[f"{prefix}:tune.json"] = tuned / "tune.json"
                inputs[f"{prefix}:tune.step"] = tuned / "step.json"
            tvm.append(abi.name)
        extra[model.name] = tvm
    config = dict(step.config)
    config["target"] = {**config["target"], "tvm_abis": [
        {"name": a.name, **a.compile_config(), "run": a.run} for a in target.tvm_abis],
        "ship": [dict(s) for s in target.ship]}
    # precision variants (variants.py) are IREE-only: no TVM ABIs
    config["models"] = [{**m, "tvm_abis": extra.get(m["name"], [])} for m in config["models"]]
    return dataclasses.replace(step, inputs=inputs, config=config)
