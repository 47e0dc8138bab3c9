"""Stage `search_configs`: the configs of a model with no pin, searched during the build.

One step per model and host IREE ABI that is timed here (`cpu-x86_64`), when the model folder
pins no config for it (compilers/config_choice.py) and the build's budget is not 0
(`search=SECONDS`, default 180 s; `search=0`: none). The step runs `doit search`'s own
machinery (pipeline/bench/config_search.py, in a child process: a stage does not import the
commands above it) on that one ABI: each candidate is compiled by the iree_compile stage's step,
validated by the validate stage's step, and the validated ones timed side by side with
onnxruntime in one child process. Candidates go in the order most likely to pay (PRIORITY);
when the next one would not fit in the budget (with the timing reserved), the rest are recorded
as not tried. Its output, ranking.json, is a measurement: stored under the step's key (the static
model, the golden inputs, the model spec and target files, the candidates in order, the budget,
the tools and the search's code) and restored from the store or the remote cache like any
step's outputs, so a second build and every CI runner reuse it.

The compile steps of that model (and of the ABIs that follow it, `configs_from`) read the ranking
and add the winner's flags and rewrites; compile.json and the manifest say which config, and
whether a pin, this search or the base flags (and why) gave it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from ..compilers.builds import built, proxy_abis
from ..compilers.config_choice import (SEARCH_STAGE, budget_of, decide, ranking_file,
                                       search_source)
from ..compilers.iree_backend import IREE
from ..core.codehash import code_digest
from ..core.errors import PipelineError
from ..core.layout import golden_files, static_model
from ..core.steps import StageConfig, Step, abi_step_name, where
from ..core.tools import python_module_argv, run_tool
from ..spec.target import DEFAULT_CONFIG

VERSION = 1
OUTPUTS = ("ranking.json",)
CHILD = "pipeline.bench.config_search"   # runs the search (it may import the stages it uses)
# The backends the child asks the registry for: its code digest holds them (and no other), and
# the child runs under that claim (codehash.running: asking for another is refused).
CHILD_USES = {"compiler": IREE.name}
WINDOW = {"warmup": 2, "rounds": 40, "seconds": 15.0}  # the timing at the end, within the budget
# The declared configs, most likely to pay first: ordered by the geometric mean of p50 / the
# default's p50 over the four searched default models (models/*/configs/host.yaml, December 2026:
# face_landmark, ppocr_cls, ppocr_cls.48x320, ppocr_det). A config not listed comes after these,
# in declared order; "default" (the baseline) always comes first. The conv1d and matmul configs
# follow the config they extend: on a model without a 1-D (or 1x1) Conv their graph is that
# config's, the same bytes, not built again (gen_conv1d: 1.5 ms against the default's 12.5 ms;
# dw-chunks-loops-matmul 0.84x dw-chunks-loops' time on 3 models: docs/measurements/2026-12-03-conv1d.md).
PRIORITY = ("loops", "conv1d-loops", "dw-chunks-loops", "dw-chunks-loops-matmul", "dw-chunks-loops-conv1d",
            "pw-loops", "conv1d", "o3-dw-chunks", "dw-chunks", "o3-all-rewrites", "all-rewrites",
            "upsample-nearest-dw-slices", "o3-im2col-dw-slices", "dw-slices", "im2col-dw-slices",
            "upsample-d2s-dw-slices", "o3-upsample-d2s", "upsample-d2s", "o3", "im2col",
            "o3-im2col", "conv-dt")


@dataclass(frozen=True)
class Config(StageConfig):
    target: str
    model: str
    abi: str
    budget_s: float                # seconds for building, validating and timing the candidates
    candidates: tuple[dict, ...]   # {name, flags, rewrites}, in the order they are tried
    window: dict                   # the timing window (warmup, rounds, seconds)
    code: str                      # sha256 of the search's code (CHILD and what it imports)

    def problems(self):
        if isinstance(self.budget_s, bool) or not isinstance(self.budget_s, (int, float)) \
                or self.budget_s <= 0:
            yield f"budget_s must be a positive number of seconds, got {self.budget_s!r}"
        names = [c.get("name") for c in self.candidates]
        if not names or names[0] != DEFAULT_CONFIG or len(set(names)) != len(names):
            yield f"candidates are {DEFAULT_CONFIG!r} first, then unique names, got {names}"
        for c in self.candidates:
            if set(c) != {"name", "flags", "rewrites"}:
                yield f"a candidate is {{name, flags, rewrites}}, got {c!r}"
        if set(self.window) != {"warmup", "rounds", "seconds"}:
            yield f"window is {{warmup, rounds, seconds}}, got {self.window!r}"


def ordered(abi) -> list[dict]:
    """The ABI's candidates in the order the search tries them: default, then PRIORITY's order,
    then the rest as declared."""
    rank = {name: k for k, name in enumerate(PRIORITY)}
    declared = [c["name"] for c in abi.configs]
    names = sorted(declared, key=lambda n: (rank.get(n, len(rank)), declared.index(n)))
    return [{"name": n, "flags": list(c["flags"]), "rewrites": list(c["rewrites"])}
            for n in [DEFAULT_CONFIG] + names for c in [abi.config(n)]]


def parse_budget(value) -> float | None:
    """search=SECONDS as given (None: the default); an error names what is wrong."""
    if value is None or value == "":
        return None
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = -1.0
    if seconds < 0 or seconds != seconds:
        raise PipelineError(f"search={value!r} is not a number of seconds >= 0", stage=SEARCH_STAGE,
                            hint="search=0 builds models without a pin with their ABI's base "
                                 "flags; search=300 gives each model and host ABI 300 s")
    return seconds


# ----------------------------------------------------------------------------- the step
def run(ctx) -> None:
    """Search in a child process (pipeline/bench/config_search.py --in-build): it builds and
    validates through the stages' own steps, times, and writes ranking.json."""
    cfg = ctx.cfg
    plan = ctx.scratch / "plan.json"
    plan.write_text(json.dumps({
        "artifacts": str(ctx.step.layout.root), "spec": str(ctx.input("spec")),
        "targets": str(ctx.input("target").parent), "config": cfg.as_key(),
        "output": str(ctx.output("ranking.json")), "uses": CHILD_USES,
        "where": dict(stage=ctx.step.stage, **ctx.step.where)}))
    run_tool(python_module_argv(CHILD, "--in-build", str(plan)), log=ctx.log,
             what="searching the configs", timeout=cfg.budget_s * 2 + 900,
             hint="read the log: a candidate that fails is recorded, not raised; a crash here is "
                  "the search's own", stage=ctx.step.stage, **ctx.step.where)
    plan.unlink()


# ----------------------------------------------------------------------------- steps
def steps(project) -> list:
    """One per (model, host ABI) some built ABI of a loaded target is searched through."""
    out, seen = [], set()
    for model in project.models:
        pairs = [(t, a) for t in project.targets for a in t.abis if built(project, model, t, a)]
        for target, abi in pairs + list(proxy_abis(project, model, IREE)):  # as iree_compile builds
            choice = decide(project, model, target, abi)
            if not choice or choice["from"] != "search":
                continue
            source, source_abi = choice["source"]
            if (source.name, model.name, source_abi.name) in seen:
                continue
            seen.add((source.name, model.name, source_abi.name))
            out.append(search_step(project, model, source, source_abi,
                                   after=source in project.targets))
    return out


def search_step(project, model, target, abi, after: bool = True) -> Step:
    layout = project.layout
    cfg = Config(target=target.name, model=model.name, abi=abi.name,
                 budget_s=budget_of(project), candidates=tuple(ordered(abi)), window=dict(WINDOW),
                 code=code_digest(CHILD, CHILD_USES))
    return Step(stage=SEARCH_STAGE, name=abi_step_name(model, target, abi), version=VERSION,
                config=cfg,
                inputs={"model": static_model(layout, model), **golden_files(layout, model),
                        "spec": model.spec_path, "target": target.path},
                outputs=OUTPUTS,
                out_dir=ranking_file(layout, target.name, model.name, abi.name).parent,
                tools=("iree-base-compiler", "iree-base-runtime", "onnxruntime", "onnx"),
                action=run, layout=layout,
                doc=f"rank {abi.name}'s configs for {model.name} within {cfg.budget_s:g} s "
                    f"(no pin in its folder)",
                where=where(model, target, abi),
                after=(f"coverage:{target.name}/{model.name}",) if after else ())
