"""Stage `accuracy`: the gate of a precision variant, and its layer-by-layer divergence from fp32.

Both models run in onnxruntime (CPU, one thread) on every evaluation sample. fp32 runs as in
golden; the reduced model runs with graph optimisations off: the QDQ graph's own semantics
(dequantize, compute in float, quantize), which is what IREE compiles: its artifacts match that
bit for bit, whereas onnxruntime's fused int8 kernels round differently by a quantum or so.

Gate, per model output, over the whole evaluation set (thresholds from the spec's `gate:`):
  max_abs          max |variant - fp32| over every sample and element
  mean_abs         mean |variant - fp32|
  cosine           the worst sample's cosine similarity (the flattened output)
  top1_agreement   share of rows (every index but the last axis) whose argmax agrees; only for
                   outputs with a last axis longer than 1 (classifier scores)
Divergence: fp32 and the variant again, every float tensor of the fp32 graph exposed as an
output (graph inputs first, then node outputs in the graph's topological order) and matched by
name in the variant (an int8 activation as its consumers see it, i.e. `<name>_DequantizeLinear_
Output` when the quantizer inserted one; an fp16 tensor under its own name), on the
`divergence.samples` evaluation samples where the first output differs most (lowest cosine;
named in divergence.json). Per layer: cosine, max |error|, and max |error| relative
to max |fp32|; the first layer whose cosine falls below `divergence.cosine` is marked.

Outputs: accuracy.json (the gate), divergence.json (the table), accuracy.txt (both, readable;
what `doit accuracy` prints, followed for an int8 variant by the worst layers of each NPU build's
own per-layer analysis: RKNN's simulator, its int8 model vs its fp32 run, from the last build).
A failing gate also leaves the three in artifacts/reports/accuracy/<model>.<variant>/ (the
step's own outputs are removed on failure) and fails the step with the figures and the first
divergent layer.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from ..core.errors import PipelineError
from ..core.layout import static_model
from ..core.steps import StageConfig, Step
from ..core.store import pretty_json
from ..run.ort import reduced_session, session, variant_feeds
from ..spec.samples import Samples, dataset_summary, load_data, sample_inputs_problems
from ..spec.variants import (IO_DTYPES, PRECISIONS, full_name, variant_inputs, variant_preprocessing,
                             variant_tools)

VERSION = 1
OUTPUTS = ("accuracy.json", "divergence.json", "accuracy.txt")
_FLOATS = (1, 10, 11, 16)  # onnx elem types: float, float16, double, bfloat16
GATE_KEYS = ("max_abs", "mean_abs", "cosine", "top1_agreement")


@dataclass(frozen=True)
class Divergence(StageConfig):
    samples: int        # the layer table is made on this many samples, those farthest from fp32
    cosine: float       # a layer whose cosine with fp32 falls below this is beyond tolerance

    def problems(self):
        if not isinstance(self.samples, int) or self.samples < 1:
            yield f"divergence samples must be a positive integer, got {self.samples!r}"


@dataclass(frozen=True)
class Config(StageConfig):
    precision: str                  # int8 | fp16
    gate: dict                      # max_abs, mean_abs, cosine and optionally top1_agreement
    inputs: tuple[dict, ...]        # per model input: name, shape, dtype
    preprocessing: dict             # input name -> spec.calibration.Preprocessing as a dict
    evaluation: Samples             # the samples both models run on
    io_dtype: str                   # the variant's inputs/outputs: float32 | float16
    divergence: Divergence

    def problems(self):
        yield from sample_inputs_problems(self.inputs, self.preprocessing)
        if self.precision not in PRECISIONS:
            yield f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}"
        if not {"max_abs", "mean_abs", "cosine"} <= set(self.gate) <= set(GATE_KEYS):
            yield f"gate must give max_abs, mean_abs, cosine and optionally top1_agreement, got {sorted(self.gate)}"
        if self.io_dtype not in IO_DTYPES:
            yield f"io_dtype must be one of {', '.join(IO_DTYPES)}, got {self.io_dtype!r}"

    @classmethod
    def from_key(cls, key: dict) -> "Config":
        return cls(**{**key, "evaluation": Samples.from_key(key["evaluation"]),
                      "divergence": Divergence.from_key(key["divergence"])})


def _cosine(a, b) -> float:
    import numpy as np  # numpy: 0.2 s, not needed by doit list
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    if na == 0 and nb == 0:
        return 1.0
    if na == 0 or nb == 0:
        return 0.0
    return float(np.dot(a, b) / (na * nb))


def gate_metrics(pairs: list[tuple[list, list]], names: list[str], sample_names: list[str]) -> list[dict]:
    """pairs: per sample (fp32 outputs, variant outputs) -> per output the gate's figures."""
    import numpy as np  # numpy: 0.2 s, not needed by doit list
    rows = []
    for k, name in enumerate(names):
        max_abs, sum_abs, count, nonfinite, agree, total = 0.0, 0.0, 0, 0, 0, 0
        cosines = []
        for ref_outs, var_outs in pairs:
            ref = np.asarray(ref_outs[k], dtype=np.float64)
            var = np.asarray(var_outs[k], dtype=np.float64)
            finite = np.isfinite(var)
            nonfinite += int(var.size - finite.sum())
            diff = np.abs(np.where(finite, var, 0.0) - ref)
            max_abs = max(max_abs, float(diff.max()) if diff.size else 0.0)
            sum_abs += float(diff.sum())
            count += diff.size
            cosines.append(_cosine(np.where(finite, var, 0.0).ravel(), ref.ravel()))
            if ref.ndim and ref.shape[-1] > 1:
                r = ref.reshape(-1, ref.shape[-1]).argmax(1)
                v = var.reshape(-1, var.shape[-1]).argmax(1)
                agree += int((r == v).sum())
                total += r.size
        worst = int(np.argmin(cosines))
        rows.append({"name": name, "max_abs": max_abs, "mean_abs": sum_abs / max(count, 1),
                     "cosine_min": cosines[worst], "cosine_mean": float(np.mean(cosines)),
                     "worst_sample": sample_names[worst], "nonfinite": nonfinite,
                     "top1_agreement": agree / total if total else None, "top1_rows": total,
                     "worst_first": [int(k) for k in np.argsort(cosines, kind="stable")]})
    return rows


def gate_failures(rows: list[dict], gate: dict) -> list[str]:
    failures = []
    for r in rows:
        o = f"output {r['name']!r}"
        if r["nonfinite"]:
            failures.append(f"{o}: {r['nonfinite']} non-finite values")
        if r["max_abs"] > gate["max_abs"]:
            failures.append(f"{o}: max_abs {r['max_abs']:.4g} is above the gate {gate['max_abs']:.4g}")
        if r["mean_abs"] > gate["mean_abs"]:
            failures.append(f"{o}: mean_abs {r['mean_abs']:.4g} is above the gate {gate['mean_abs']:.4g}")
        if r["cosine_min"] < gate["cosine"]:
            failures.append(f"{o}: cosine {r['cosine_min']:.6f} (worst sample {r['worst_sample']}) "
                            f"is below the gate {gate['cosine']}")
        if "top1_agreement" in gate and r["top1_agreement"] is not None \
                and r["top1_agreement"] < gate["top1_agreement"]:
            failures.append(f"{o}: top-1 agreement {r['top1_agreement']:.3f} is below the gate "
                            f"{gate['top1_agreement']}")
    if "top1_agreement" in gate and all(r["top1_agreement"] is None for r in rows):
        failures.append("top1_agreement is asked, but no output has a class axis (last dim > 1)")
    return failures


# ----------------------------------------------------------------------------- divergence
def _types(model) -> dict:
    """Element type of every tensor the graph really has (inputs, node outputs): value_info can
    name tensors a rewrite removed."""
    vis = list(model.graph.input) + list(model.graph.value_info) + list(model.graph.output)
    real = {i.name for i in model.graph.input} | {o for n in model.graph.node for o in n.output}
    return {vi.name: vi.type.tensor_type.elem_type for vi in vis
            if vi.type.HasField("tensor_type") and vi.name in real}


def _exposing(model, names: list[str], types: dict):
    """A copy of `model` that also outputs `names` (each a float tensor of the graph)."""
    import onnx  # onnx: 1.5 s, not needed by doit list
    from onnx import helper  # onnx: 1.5 s, not needed by doit list
    model = onnx.ModelProto.FromString(model.SerializeToString())
    present = {o.name for o in model.graph.output}
    for name in names:
        if name not in present:
            model.graph.output.append(helper.make_tensor_value_info(name, types[name], None))
            present.add(name)
    return model


def layers(fp32) -> list[dict]:
    """The float tensors of the fp32 graph in order: its inputs, then every node's outputs
    (Constant nodes are weights: left out)."""
    import onnx  # onnx: 1.5 s, not needed by doit list
    types = _types(onnx.shape_inference.infer_shapes(fp32))
    out = [{"tensor": i.name, "node": f"(input {i.name})", "op": "input"} for i in fp32.graph.input
           if types.get(i.name) in _FLOATS]
    for node in fp32.graph.node:
        if node.op_type == "Constant":  # weights, not a computation
            continue
        out += [{"tensor": o, "node": node.name or f"{node.op_type}_{len(out)}", "op": node.op_type}
                for o in node.output if o and types.get(o) in _FLOATS]
    return out


def layer_divergence(fp32_path, reduced_path, samples: list[dict], io_dtype: str,
                     cosine_tol: float) -> dict:
    import numpy as np  # numpy: 0.2 s, not needed by doit list
    import onnx  # onnx: 1.5 s, not needed by doit list
    fp32, reduced = onnx.load(str(fp32_path)), onnx.load(str(reduced_path))
    f_types = _types(onnx.shape_inference.infer_shapes(fp32))
    r_types = _types(onnx.shape_inference.infer_shapes(reduced))
    rows, unmatched = [], []
    for layer in layers(fp32):
        match = next((c for c in (f"{layer['tensor']}_DequantizeLinear_Output", layer["tensor"])
                      if r_types.get(c) in _FLOATS), None)
        if match is None:
            unmatched.append(layer["tensor"])
        else:
            rows.append({**layer, "matched": match})
    f_sess = reduced_session(_exposing(fp32, [r["tensor"] for r in rows], f_types).SerializeToString())
    r_sess = reduced_session(_exposing(reduced, [r["matched"] for r in rows], r_types).SerializeToString())
    f_names = [o.name for o in f_sess.get_outputs()]
    r_names = [o.name for o in r_sess.get_outputs()]
    acc = [{"dot": 0.0, "ff": 0.0, "rr": 0.0, "max_abs": 0.0, "max_ref": 0.0, "nonfinite": 0}
           for _ in rows]
    for sample in samples:
        f_out = dict(zip(f_names, f_sess.run(None, sample)))
        r_out = dict(zip(r_names, r_sess.run(None, variant_feeds(sample, io_dtype))))
        for row, a in zip(rows, acc):
            f = f_out[row["tensor"]].astype(np.float64).ravel()
            r = r_out[row["matched"]].astype(np.float64).ravel()
            bad = ~np.isfinite(r)
            a["nonfinite"] += int(bad.sum())
            r = np.where(bad, 0.0, r)
            a["dot"] += float(np.dot(f, r))
            a["ff"] += float(np.dot(f, f))
            a["rr"] += float(np.dot(r, r))
            a["max_abs"] = max(a["max_abs"], float(np.abs(f - r).max()) if f.size else 0.0)
            a["max_ref"] = max(a["max_ref"], float(np.abs(f).max()) if f.size else 0.0)
    first = None
    for k, (row, a) in enumerate(zip(rows, acc)):
        if a["ff"] == 0 and a["rr"] == 0:
            cos = 1.0
        elif a["ff"] == 0 or a["rr"] == 0:
            cos = 0.0
        else:
            cos = a["dot"] / (a["ff"] ** 0.5 * a["rr"] ** 0.5)
        row.update(index=k, cosine=cos, max_abs=a["max_abs"],
                   rel_max=a["max_abs"] / a["max_ref"] if a["max_ref"] else None,
                   nonfinite=a["nonfinite"])
        row["beyond_tolerance"] = bool(cos < cosine_tol or a["nonfinite"])
        if row["beyond_tolerance"] and first is None:
            first = k
    return {"cosine_tolerance": cosine_tol, "samples": len(samples),
            "runs": "onnxruntime CPU, graph optimisations off, every layer exposed",
            "first_divergent": rows[first] if first is not None else None,
            "layers": rows, "unmatched": unmatched}


# ----------------------------------------------------------------------------- text
def _g(value, fmt=".3g") -> str:
    return "n/a" if value is None else format(value, fmt)


def _layer_line(row: dict, first: dict | None) -> str:
    mark = "  <-- first beyond tolerance" if first and row["index"] == first["index"] else (
        "  *" if row["beyond_tolerance"] else "")
    return (f"{row['index']:>4}  {row['node'][:36]:<36}  {row['op'][:18]:<18}  "
            f"{row['cosine']:.6f}  {_g(row['max_abs']):>9}  {_g(row['rel_max']):>9}{mark}")


def render(name: str, acc: dict, div: dict, around: int | None = None) -> str:
    """The readable report: the gate table, then the layer table (all rows, or `around` rows on
    each side of the first divergent layer)."""
    gate = acc["gate"]
    lines = [f"{name}: {acc['precision']} vs fp32 on {acc['evaluation']['samples']} evaluation "
             f"samples ({acc['evaluation']['kind']}, sha256 {acc['evaluation']['sha256'][:12]}): "
             f"gate {'PASSED' if acc['passed'] else 'FAILED'}",
             f"  {'output':<28} {'max_abs':>10} {'mean_abs':>10} {'cos min':>10} {'cos mean':>10} "
             f"{'top-1':>7}  worst sample"]
    for r in acc["outputs"]:
        lines.append(f"  {r['name'][:28]:<28} {r['max_abs']:>10.4g} {r['mean_abs']:>10.4g} "
                     f"{r['cosine_min']:>10.6f} {r['cosine_mean']:>10.6f} "
                     f"{_g(r['top1_agreement'], '.3f'):>7}  {r['worst_sample']}")
    lines.append(f"  {'gate':<28} {gate['max_abs']:>10.4g} {gate['mean_abs']:>10.4g} "
                 f"{gate['cosine']:>10} {'':>10} {_g(gate.get('top1_agreement'), '.3f'):>7}")
    lines += [f"  FAILED: {f}" for f in acc["failures"]]
    first = div["first_divergent"]
    names = div.get("sample_files", [])
    lines += ["", f"layer-by-layer divergence on the {div['samples']} sample(s) farthest from fp32 "
                  f"({', '.join(names[:4])}{', ...' if len(names) > 4 else ''}); per-layer "
                  f"tolerance: cosine >= {div['cosine_tolerance']}): "
                  + (f"first beyond tolerance: #{first['index']} {first['node']} ({first['op']}, "
                     f"tensor {first['tensor']}, cosine {first['cosine']:.6f})" if first
                     else "no layer beyond tolerance"),
              f"{'#':>4}  {'layer (node)':<36}  {'op':<18}  {'cosine':<8}  {'max abs':>9}  "
              f"{'rel max':>9}"]
    rows = div["layers"]
    if around is not None and first is not None:
        lo, hi = max(0, first["index"] - around), first["index"] + around + 1
        if lo:
            lines.append(f"{'...':>4}  ({lo} layer(s) before)")
        lines += [_layer_line(r, first) for r in rows[lo:hi]]
        if hi < len(rows):
            lines.append(f"{'...':>4}  ({len(rows) - hi} more layer(s))")
    else:
        lines += [_layer_line(r, first) for r in rows]
    if div["unmatched"]:
        lines.append(f"not in the {acc['precision']} model (fused or renamed): "
                     f"{', '.join(div['unmatched'][:8])}"
                     + (f" and {len(div['unmatched']) - 8} more" if len(div["unmatched"]) > 8 else ""))
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- the NPU's own view
# An int8 build's per-layer table that a backend's compile step writes beside its artifact
# (stages/rknn_compile.py's ANALYSIS, in its format), in whichever stage's folder: found by name,
# not imported, so that this stage's key follows no compiler's code.
NPU_ANALYSIS = ("*", "accuracy_analysis.json")


def npu_analyses(layout, variant: str) -> list:
    """The per-layer analyses of the variant's NPU builds on disk (any target and ABI)."""
    stage, file = NPU_ANALYSIS
    pattern = layout.artifact_stage("*", variant, "*", stage).relative_to(layout.root) / file
    return sorted(layout.root.glob(str(pattern)))


def render_npu(record: dict, where: str, ort: dict | None = None, worst: int = 5) -> str:
    """The worst layers of an NPU build by each of RKNN's cosines, single and entire; beside
    them, where a layer is a tensor of the ONNX graph, onnxruntime's int8 cosine there (`ort`:
    this variant's divergence rows by tensor)."""
    art, rows, ort = record["artifact"], record["layers"], ort or {}
    lines = [f"NPU {where}: RKNN's own per-layer analysis of the last build's {art['file']} "
             f"(sha256 {art['sha256'][:12]}; {record['toolkit']}'s accuracy_analysis, simulator):",
             f"  its int8 model vs the toolkit's fp32 run of the same graph, on the variant's golden "
             f"input; {len(rows)} layers (RKNN's, after its fusions; '-': no figures given);",
             "  ort cos: onnxruntime's int8 model at the same tensor, from the table above "
             "(errors accumulated, like entire)"]
    fig = lambda r, w, k, f: "-" if r[w] is None else format(r[w][k], f)
    for which, what in (("single", "the layer's own error"),
                        ("entire", "with the errors of the layers before it")):
        order = record["worst_first"][which][:worst]
        lines += [f"  worst {len(order)} by cosine {which} ({what}):",
                  f"  {'#':>4}  {'layer':<28}  {'op':<14}  {'cos single':>10}  {'cos entire':>10}  "
                  f"{'euc single':>10}  {'euc entire':>10}  {'ort cos':>8}"]
        lines += [f"  {r['index']:>4}  {r['layer'][:28]:<28}  {r['op'][:14]:<14}  "
                  f"{fig(r, 'single', 'cosine', '.5f'):>10}  {fig(r, 'entire', 'cosine', '.5f'):>10}  "
                  f"{fig(r, 'single', 'euclidean', '.4g'):>10}  {fig(r, 'entire', 'euclidean', '.4g'):>10}  "
                  f"{format(ort[r['layer']]['cosine'], '.5f') if r['layer'] in ort else '-':>8}"
                  for r in (rows[i] for i in order)]
    return "\n".join(lines) + "\n"


def _npu_part(layout, step) -> str:
    found = npu_analyses(layout, step.name)
    if not found:
        return ("NPU: no int8 NPU build of it on disk (`doit build target=T`, T a target with an "
                "NPU ABI, makes one with RKNN's per-layer analysis)\n"
                if step.cfg.precision == "int8" else "")
    div = json.loads((step.out_dir / "divergence.json").read_text())
    ort = {r["tensor"]: r for r in div["layers"]}
    parts = []
    for path in found:
        target, _, abi = path.relative_to(layout.root).parts[:3]
        parts.append(render_npu(json.loads(path.read_text()), f"{target}/{abi}", ort)
                     + f"  (file: {layout.relative(path)})\n")
    return "\n".join(parts)


# ----------------------------------------------------------------------------- the stage
def run(ctx) -> None:
    cfg = ctx.cfg
    samples = load_data(ctx, "evaluation", cfg.evaluation)
    files = cfg.evaluation.files
    ref = session(ctx.input("fp32"))
    try:
        var = reduced_session(ctx.input("model"))
        pairs = [(ref.run(None, s), var.run(None, variant_feeds(s, cfg.io_dtype)))
                 for s in samples]
    except Exception as exc:  # onnxruntime's own errors: the reduced model does not run
        raise ctx.error(f"onnxruntime cannot run the {cfg.precision} model: "
                        f"{str(exc).strip().splitlines()[-1]}",
                        hint="exclude the node it names (exclude_nodes)")
    names = [o.name for o in ref.get_outputs()]
    rows = gate_metrics(pairs, names, files)
    failures = gate_failures(rows, cfg.gate)
    evaluation = dataset_summary(ctx, "evaluation", cfg.evaluation)
    acc = {"precision": cfg.precision, "gate": cfg.gate, "passed": not failures,
           "failures": failures, "evaluation": {**evaluation, "samples": len(samples)},
           "outputs": rows,
           "runs": {"fp32": "onnxruntime CPU, 1 thread (as golden)",
                    cfg.precision: "onnxruntime CPU, 1 thread, graph optimisations off"}}
    chosen = rows[0].pop("worst_first")[:cfg.divergence.samples]  # where the outputs differ most
    for r in rows[1:]:
        r.pop("worst_first")
    div = layer_divergence(ctx.input("fp32"), ctx.input("model"), [samples[k] for k in chosen],
                           cfg.io_dtype, cfg.divergence.cosine)
    div["sample_files"] = [files[k] for k in chosen]
    first = div["first_divergent"]
    acc["summary"] = {"passed": acc["passed"], "gate": cfg.gate, "evaluation": acc["evaluation"],
                      "outputs": [{k: r[k] for k in ("name", "max_abs", "mean_abs", "cosine_min",
                                                      "cosine_mean", "top1_agreement")} for r in rows],
                      "first_divergent_layer": first and {k: first[k] for k in (
                          "index", "node", "op", "tensor", "cosine")}}
    texts = {"accuracy.json": pretty_json(acc), "divergence.json": pretty_json(div),
             "accuracy.txt": render(ctx.step.name, acc, div)}
    for name, text in texts.items():
        ctx.output(name).write_text(text)
    if failures:
        where = ctx.step.layout.accuracy_report(ctx.step.name)
        where.mkdir(parents=True, exist_ok=True)
        for name, text in texts.items():
            (where / name).write_text(text)
        raise ctx.error(f"the {cfg.precision} variant fails its accuracy gate: "
                        f"{'; '.join(failures)}\n" + render(ctx.step.name, acc, div, around=3)
                        + f"  full report: {where / 'accuracy.txt'} (and .json)",
                        hint="look at the first divergent layer: leave it in fp32 "
                             "(exclude_nodes), calibrate on data like the evaluation set, try "
                             "per_channel or another method; or do not ship this variant")


def doit_report(layout, steps: list, only: str | None) -> str:
    """`doit accuracy [model=NAME]`: the gate and the layer table of each variant (of NAME:
    a model, or one model.variant); for int8, the worst layers of its NPU builds by RKNN's own
    analysis."""
    if not steps and only is None:
        return "no model declares variants: (nothing to report)"
    shown = [s for s in steps if only in (None, s.name, s.name.split(".")[0])]
    if not shown:
        names = ", ".join(s.name for s in steps) or "none (no model declares variants:)"
        raise PipelineError(f"no variant named {only!r}; variants: {names}", stage="accuracy",
                            hint="say model=MODEL or model=MODEL.VARIANT")
    return "\n".join((s.out_dir / "accuracy.txt").read_text()
                     + f"  (files: {layout.relative(s.out_dir)}/accuracy.json, divergence.json)\n"
                     + (f"\n{npu}" if (npu := _npu_part(layout, s)) else "")
                     for s in shown)


# ----------------------------------------------------------------------------- steps
def steps(project) -> list:
    """The gate of each precision variant: nothing is compiled for a variant that fails it."""
    return [accuracy_step(project.layout, m, v) for m in project.models for v in m.variants]


def accuracy_step(layout, model, v) -> Step:
    name = full_name(model, v)
    return Step(
        stage="accuracy", name=name, version=VERSION,
        config=Config(precision=v.precision, gate=v.gate.as_dict(), inputs=variant_inputs(model),
                      preprocessing=variant_preprocessing(model),
                      evaluation=Samples.from_key(v.evaluation.as_dict()), io_dtype=v.io_dtype,
                      divergence=Divergence(v.divergence_samples, v.divergence_cosine)),
        inputs={"fp32": static_model(layout, model),
                "model": layout.model_stage(name, "quantize") / "model.onnx",
                **{f"evaluation:{p.name}": p for p in v.evaluation.files}},
        outputs=OUTPUTS, out_dir=layout.model_stage(name, "accuracy"),
        tools=variant_tools(v), action=run, layout=layout, where={"model": name},
        doc=f"gate: {v.precision} vs fp32 on {len(v.evaluation.files)} evaluation samples")
