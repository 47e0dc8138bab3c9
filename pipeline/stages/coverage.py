"""Stage `coverage`: which ops of a model each compiler cannot take, known before compiling.

The step (per target and model, after `static`) does two things:

1. **Prediction**: the static
   model (what the compilers get: every dim bound, the static stage's rewrites applied, e.g. an
   unrolled LSTM), shape-inferred (subgraphs included), is checked against
     * IREE: `IREE_RULES`, a table of what IREE's ONNX path fails on. Each rule was reproduced
       with a tiny model on IREE 3.13 (tests/e2e/test_coverage.py runs the real compiler on every
       rule, and on the claims that did *not* reproduce, so that a new IREE shows up there);
     * TVM: the converter map of the installed TVM's ONNX frontend (plus `If`, which the
       frontend handles itself), as recorded per TVM version by pipeline/compilers/tvm_ops.py
       (a test checks the record against the installed frontend).
     * both: ops outside the standard ONNX domain (com.microsoft...), per ../shared/TOOLCHAIN.md.
   A compiler predicted to fail gets no compile step for that model: its ABIs are *skipped*.
   (The steps after coverage are made once it has run: dodo.py creates them after it.)
2. **Confirmation**: where the
   prediction matters -- a compiler it skips -- the real compiler is run on the static model
   (IREE: iree-import-onnx + iree-compile with the target's flags; TVM: its ONNX import) and
   must fail as predicted; if it does not, the table is stale and the step says so instead of
   silently dropping an artifact that would have worked. A compiler predicted to cope is
   confirmed by its compile step (which names the ops if it fails). A model that no compiler
   of the target can take fails here, with the ops per compiler.

coverage.json records, per compiler, the status (ok / skipped), the ops and why, and how each
verdict was checked.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from ..compilers import tvm_ops
from ..compilers.backends import BACKENDS, backend_named
from ..compilers.builds import proxy_pairs
from ..compilers.coverage_table import ops_text
from ..compilers.iree_backend import IREE
from ..compilers.iree_compiler import compile_argv, find_compiler, import_argv
from ..compilers.tvm_backend import TVM
from ..compilers.tvm_relax import import_onnx
from ..core.layout import static_model
from ..core.steps import StageConfig, Step, where
from ..core.store import pretty_json
from ..core.tools import distribution_version, python_module_argv, run_tool
from ..rewrite.bind_shapes import bind_inputs, localize_subgraphs
from ..spec.sources import ROUTES

VERSION = 2  # 2: the basis names the table and its test where they now live (pipeline/stages/, tests/e2e/)
OUTPUTS = ("coverage.json",)
PREDICTION_VERSION = 1
COMPILERS = tuple(b.name for b in BACKENDS)
STANDARD_DOMAINS = ("", "ai.onnx")
TABLE = "pipeline/stages/coverage.py"


@dataclass(frozen=True)
class Config(StageConfig):
    format: str                 # the source's format: an ONNX source is predicted before import
    shapes: dict                # input name -> the spec's shape, bound for shape inference
    rules: int                  # PREDICTION_VERSION of the rules the verdicts come from
    compilers: dict             # compiler -> the target's ABI names it builds
    iree_abi: dict | None       # the flags IREE is confirmed with (a CPU ABI of the target)

    def problems(self):
        if self.format not in ROUTES:
            yield f"format must be one of {', '.join(ROUTES)}, got {self.format!r}"
        if not set(self.compilers) <= set(COMPILERS):
            yield f"compilers must be among {', '.join(COMPILERS)}, got {', '.join(sorted(self.compilers))}"
        if IREE.name in self.compilers and self.iree_abi is None:
            yield "a target with IREE ABIs needs iree_abi, the flags its failures are confirmed with"


# ----------------------------------------------------------------------------- the rules
def _direction_not_forward(node, shapes, consts):
    direction = _attr(node, "direction", b"forward")
    direction = direction.decode() if isinstance(direction, bytes) else direction
    return None if direction == "forward" else f"direction={direction}"


def _strided_conv_to_one(node, shapes, consts):
    """A strided Conv whose output is 1 long on an axis where the stride leaves input over:
    IREE 3.13's shape verifier rejects it ('inferred input/output operand ... to be 4, found 3').
    Reproduced for Conv1d and Conv2d; Silero VAD's encoder has one."""
    x, w = shapes.get(node.input[0]), _weight_shape(node, shapes, consts)
    y = shapes.get(node.output[0])
    if not x or not w or not y or len(x) < 3:
        return None
    rank = len(x) - 2
    strides = list(_attr(node, "strides", [1] * rank))
    dilations = list(_attr(node, "dilations", [1] * rank))
    pads = list(_attr(node, "pads", [0] * 2 * rank))
    for i in range(rank):
        size, k, s, d, out = x[2 + i], w[2 + i], strides[i], dilations[i], y[2 + i]
        if not all(isinstance(v, int) for v in (size, k, out)) or s <= 1 or out != 1:
            continue
        if _attr(node, "auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
            pad = max((out - 1) * s + d * (k - 1) + 1 - size, 0)
        else:
            pad = pads[i] + pads[i + rank]
        leftover = (size + pad - d * (k - 1) - 1) % s
        if leftover:
            return (f"stride {s} on a {size}-long axis gives 1 output and leaves {leftover} "
                    f"input element(s) over")
    return None


# op -> (condition(node, shapes, consts) -> reason or None, what it is, how it was established)
IREE_RULES = {
    "GRU": (_direction_not_forward, "bidirectional/reverse GRU is not lowered "
            "('failed to legalize operation torch.operator onnx.GRU')",
            "reproduced on IREE 3.13.0 with a tiny GRU (forward: compiles)"),
    "RNN": (_direction_not_forward, "bidirectional/reverse RNN is not lowered",
            "reproduced on IREE 3.13.0 with a tiny RNN (forward: compiles)"),
    "Conv": (_strided_conv_to_one, "strided Conv with a 1-long output and input left over",
             "reproduced on IREE 3.13.0 with tiny Conv1d/Conv2d models (other strided convs "
             "compile)"),
}
# Claims in ../shared/TOOLCHAIN.md that tiny models did NOT reproduce on IREE 3.13.0 (they
# compiled): If with a [1]-shaped condition, Loop, reflect Pad on 3-D tensors, forward GRU,
# LSTM. They are not in the table; tests/e2e/test_coverage.py keeps checking that they compile.


def _attr(node, name, default):
    from onnx import helper  # onnx: 1.5 s, not needed by doit list
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _weight_shape(node, shapes, consts):
    if len(node.input) > 1 and node.input[1] in consts:
        return list(consts[node.input[1]])
    return shapes.get(node.input[1]) if len(node.input) > 1 else None


# ----------------------------------------------------------------------------- prediction
def walk(graph, shapes: dict, consts: dict, path: str = ""):
    """Every node of a graph and its subgraphs, with its path ('If_3/then_branch/Conv_1')."""
    consts = {**consts, **{t.name: tuple(t.dims) for t in graph.initializer}}
    for value in list(graph.input) + list(graph.value_info) + list(graph.output):
        dims = [d.dim_value if d.HasField("dim_value") else None
                for d in value.type.tensor_type.shape.dim]
        if value.type.tensor_type.HasField("shape"):
            shapes.setdefault(value.name, dims)
    for k, node in enumerate(graph.node):
        name = f"{path}{node.name or f'{node.op_type}_{k}'}"
        yield node, name, consts
        for attr in node.attribute:
            subs = ([attr.g] if attr.HasField("g") else []) + list(attr.graphs)
            for sub in subs:
                yield from walk(sub, shapes, consts, f"{name}/{attr.name}/")


def tvm_supported_ops() -> set[str]:
    """The ops the installed TVM's ONNX frontend converts (its converter map, plus If/Constant
    which it handles itself: see `_check_for_unsupported_ops` in tvm.relax.frontend.onnx)."""
    from tvm.relax.frontend.onnx.onnx_frontend import _get_convert_map  # tvm: 2.8 s, not needed by doit list
    return set(_get_convert_map()) | {"If", "Constant"}


def predict_model(model, tvm_ops: set[str]) -> dict:
    """{"ops": counts, "iree": [problems], "tvm": [problems]} for a shape-inferred model."""
    shapes: dict = {}
    found = {c: [] for c in COMPILERS}
    counts: dict = {}
    for node, name, consts in list(walk(model.graph, shapes, {})):
        op = node.op_type if node.domain in STANDARD_DOMAINS else f"{node.domain}::{node.op_type}"
        counts[op] = counts.get(op, 0) + 1
        if node.domain not in STANDARD_DOMAINS:
            for c in COMPILERS:
                found[c].append({"op": op, "node": name, "why": "op outside the standard ONNX "
                                 "domain", "basis": "../shared/TOOLCHAIN.md (not re-checked)"})
            continue
        rule = IREE_RULES.get(node.op_type)
        if rule:
            why = rule[0](node, shapes, consts)
            if why:
                found[IREE.name].append({"op": op, "node": name, "why": f"{rule[1]}: {why}",
                                      "basis": rule[2]})
        if node.op_type not in tvm_ops:
            found[TVM.name].append({"op": op, "node": name,
                                 "why": "no converter in TVM's ONNX frontend",
                                 "basis": f"converter map of apache-tvm "
                                          f"{distribution_version('apache-tvm')}"})
    return {"ops": dict(sorted(counts.items())), **found}


def predict(source: Path, shapes: dict) -> dict:
    """{"ops", "iree", "tvm"} for an ONNX source with the spec's shapes bound, shape-inferred."""
    import onnx  # onnx: 1.5 s, not needed by doit list
    model = onnx.load(str(source))
    bind_inputs(model, shapes)
    localize_subgraphs(model.graph)
    try:
        model = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception:  # an unreadable shape only weakens the shape-dependent rules
        pass
    return predict_model(model, _tvm_ops())


def _tvm_ops() -> set[str]:
    """The installed TVM's ONNX converters: the recorded table (compilers/tvm_ops.py) when it has
    this version, else the frontend itself."""
    version = distribution_version("apache-tvm")
    if version == "missing":
        return set()
    return tvm_ops.supported_ops(version) or tvm_supported_ops()


# ----------------------------------------------------------------------------- the step
def run(ctx) -> None:
    """Confirm the prediction where it decides something; fail when no compiler is left."""
    cfg = ctx.cfg
    where = dict(stage=ctx.step.stage, **ctx.step.where)
    if cfg.format != "onnx":
        return _run_unpredicted(ctx, cfg)
    # on the static model: what the compilers get, after the static stage's rewrites (an LSTM
    # it unrolled is no longer an LSTM a compiler lacks)
    prediction = predict(ctx.input("model"), cfg.shapes)
    report = {"ops": prediction["ops"], "compilers": {}}
    for compiler, abis in sorted(cfg.compilers.items()):
        problems = prediction.get(compiler, [])  # a backend with no op table: its build checks
        entry = {"abis": abis, "status": "skipped" if problems else "ok", "unsupported": problems,
                 "checked": {"prediction": _basis(compiler)}}
        if problems:
            entry["checked"]["confirmed"] = _confirm(ctx, compiler, problems, where)
        else:
            entry["checked"]["confirmed"] = (f"not needed: the {backend_named(compiler).compile_stage} "
                                             f"step is the check, and names the ops if it fails")
        report["compilers"][compiler] = entry
    usable = [c for c, e in report["compilers"].items() if e["status"] == "ok"]
    if not usable:
        lines = "; ".join(f"{c.upper()} cannot take {ops_text(e['unsupported'])}"
                          for c, e in sorted(report["compilers"].items()))
        raise ctx.error(f"no compiler of this target can take the model: {lines}", log=True,
                        hint="replace those ops in the model (or export it differently), add "
                             "an ABI of a compiler that takes it, or leave the model out of "
                             "this target")
    ctx.output("coverage.json").write_text(pretty_json(report))


def _run_unpredicted(ctx, cfg: Config) -> None:
    """A TFLite/NNEF source: no prediction could be made before the build (the ONNX form is the
    import step's output), so both compilers got their steps. Check the static model now: a
    compiler that cannot take it would only fail later; say which ops, and how to skip it."""
    import onnx  # onnx: 1.5 s, not needed by doit list
    fmt = cfg.format
    model = onnx.load(str(ctx.input("model")))
    try:
        model = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception:  # an unreadable shape only weakens the shape-dependent rules
        pass
    found = predict_model(model, _tvm_ops())
    report = {"ops": found["ops"], "compilers": {}}
    lacking = {c: found[c] for c in cfg.compilers if found[c]}
    if lacking:
        lines = "; ".join(f"{c.upper()} cannot take {ops_text(p)}" for c, p in sorted(lacking.items()))
        abis = ", ".join(f"'{a}'" for c in sorted(lacking) for a in cfg.compilers[c])
        raise ctx.error(f"the model's {fmt} source, converted to ONNX, has ops a compiler of this "
                        f"target cannot take: {lines}", log=True,
                        hint=f"add `skip: {{{abis.split(', ')[0]}: <why>}}` (one per ABI: {abis}) "
                             f"to the model's spec, or convert the model differently")
    for compiler, abis in sorted(cfg.compilers.items()):
        report["compilers"][compiler] = {
            "abis": abis, "status": "ok", "unsupported": [],
            "checked": {"prediction": f"made at build time on the static model (the source is "
                                      f"{fmt}, ONNX only after import): {_basis(compiler)}",
                        "confirmed": f"not needed: the {backend_named(compiler).compile_stage} "
                                     f"step is the check"}}
    ctx.output("coverage.json").write_text(pretty_json(report))


def _iree_basis() -> str:
    return (f"the IREE rules in {TABLE} (each reproduced on IREE 3.13.0 by tests/"
            f"e2e/test_coverage.py), on the static model (after its rewrites)")


def _tvm_basis() -> str:
    return (f"the converter map of the installed TVM ONNX frontend (apache-tvm "
            f"{distribution_version('apache-tvm')}), on the static model (after its rewrites)")


def _basis(compiler: str) -> str:
    backend = backend_named(compiler)
    return PREDICTIONS[backend][0]() if backend in PREDICTIONS else backend.coverage_basis


def _iree_check(ctx, model: Path, where: dict) -> tuple:
    """iree-import-onnx + iree-compile with the confirming ABI's flags: (result, what ran)."""
    mlir, out = ctx.scratch / "model.mlir", ctx.scratch / IREE.artifact
    imported = run_tool(import_argv(model, mlir), log=ctx.log, what="iree-import-onnx",
                        check=False, **where)
    result = imported
    if imported.returncode == 0:
        result = run_tool(compile_argv(find_compiler(), ctx.cfg.iree_abi, mlir, out),
                          log=ctx.log, what="iree-compile", check=False, timeout=3600, **where)
    mlir.unlink(missing_ok=True)
    out.unlink(missing_ok=True)
    return result, "iree-import-onnx + iree-compile"


def _tvm_check(ctx, model: Path, where: dict) -> tuple:
    """TVM's ONNX import alone, in a child process: (result, what ran)."""
    result = run_tool(python_module_argv("pipeline.stages.coverage", "--tvm-import", str(model)),
                      log=ctx.log, what="TVM ONNX import", check=False, timeout=3600, **where)
    return result, "TVM's ONNX import (relax.frontend.onnx.from_onnx)"


# backend -> (the basis of its prediction, the real check that must fail where it predicts so):
# the backends with an op table here; another backend's own build is the check (its
# `coverage_basis` says so).
PREDICTIONS = {IREE: (_iree_basis, _iree_check), TVM: (_tvm_basis, _tvm_check)}


def _confirm(ctx, compiler: str, problems: list, where: dict) -> str:
    """Run the real compiler on the static model; it must fail as predicted."""
    result, tool = PREDICTIONS[backend_named(compiler)][1](ctx, ctx.input("model"), where)
    if result.returncode == 0:
        raise ctx.error(f"the op table says {compiler.upper()} cannot take "
                        f"{ops_text(problems)}, but {tool} accepted the static model: the table "
                        f"is stale for this {compiler.upper()} version", log=True,
                        hint=f"remove or narrow that rule in {TABLE}, so that the model builds "
                             f"with {compiler.upper()} too")
    first = next((l.strip() for l in result.output.splitlines()
                  if "error" in l.lower() or "not supported" in l), "")
    first = first.replace(f"{ctx.scratch}/", "")  # no absolute paths in reports
    return f"{tool} failed on the static model, as predicted: {first[:300]}"


# ----------------------------------------------------------------------------- steps
def compilers(target) -> dict:
    """compiler -> the target's ABI names built by it."""
    out: dict = {}
    for abi in target.abis:
        out.setdefault(abi.compiler, []).append(abi.name)
    return out


def steps(project) -> list:
    """One per model and target (and per target that proxies another's ABIs in a choice)."""
    out = []
    for model in project.models:
        for target in project.targets:
            out.append(coverage_step(project, model, target))
        names = {s.name for s in out}
        for target, _abi in proxy_pairs(project):
            if f"{target.name}/{model.name}" not in names:
                out.append(coverage_step(project, model, target))
                names.add(out[-1].name)
    return out


def coverage_step(project, model, target) -> Step:
    """Predicted from the static model (what the compilers get, after the static stage's
    rewrites); confirmed where it skips."""
    layout = project.layout
    iree = [a for a in target.abis if IREE.builds(a)]
    cpu = [a for a in iree if a.backend == "llvm-cpu"] or iree
    inputs = {"model": static_model(layout, model)}
    return Step(stage="coverage", name=f"{target.name}/{model.name}", version=VERSION,
                config=Config(format=model.source_format,
                              shapes={i.name: list(i.shape) for i in model.inputs},
                              rules=PREDICTION_VERSION, compilers=compilers(target),
                              # the flags matter only when the step must confirm that IREE fails
                              iree_abi=cpu[0].compile_config() if cpu else None),
                inputs=inputs, outputs=OUTPUTS,
                out_dir=layout.target_model_stage(target.name, model.name, "coverage"),
                tools=("onnx", "iree-base-compiler", "apache-tvm"), action=run,
                layout=layout, doc="which ops each compiler of the target cannot take",
                where=where(model, target))



def main(argv=None) -> int:
    """`python -m pipeline.stages.coverage --tvm-import model.onnx`: TVM's import alone (a child)."""
    parser = argparse.ArgumentParser(prog="python -m pipeline.stages.coverage")
    parser.add_argument("--tvm-import", required=True)
    args = parser.parse_args(argv)
    import_onnx(Path(args.tvm_import))
    print("TVM imported the model")
    return 0


if __name__ == "__main__":
    sys.exit(main())
