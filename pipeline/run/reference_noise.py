"""How far golden's own outputs move under the float rounding any other correct runtime has: the
reference's noise, per output, which no artifact can be held below.

Golden is one run of one runtime. Another correct runtime rounds differently (another summation
order, another polynomial for tanh or exp), and some outputs amplify that: mediapipe's
pose_landmark_full segmentation logits (peak 1366) move by 0.19 between LiteRT's own optimized
and reference kernels, 1.4e-4 of the peak, while `doit new`'s tolerance is 1e-5 of it; a
dynamically quantized LSTM (text2tashkeel's bilstm.int8) re-quantizes its hidden state at every
step, so a tanh one ulp off moves a value across a rounding boundary of the next step's 8-bit
quantization, and the logits by up to 1e-2. Held to the declared tolerance, such a model fails
on every compiler although nothing is wrong.

measure() reruns the reference with other roundings:

- a TFLite source: LiteRT with its XNNPACK delegate and with its reference kernels (golden runs
  its builtin optimized kernels);
- an ONNX source: onnxruntime without graph optimisations (other fusions), and so, twice (two
  seeds), with the outputs of its transcendental ops (Sigmoid, Tanh, Exp, Erf, Log, Softmax) and
  the float inputs of its roundings (DynamicQuantizeLinear, Round: the dynamic int8 quantization
  of activations, also as golden's exact reference writes it) multiplied element by element by
  1 + u x 2^-23, u uniform in [-1, 1]: independent differences of about an ulp, what another
  runtime's approximations and summation orders give. On the public corpus this predicts what
  the compiled artifacts do: text2tashkeel's bilstm.int8 moves by 9.0e-3 (mean 1.2e-4; the rk3588
  IREE and TVM artifacts: 4.5e-3, mean 8.0e-5), ddddocr's common_old by 0.24 (mean 0.019, cosine
  0.99978; the rk3588 IREE artifact: 0.23, 0.019, 0.99978). One sign for all elements at once
  (tried first) moved bilstm.int8's logits by 0.10, 22 times what its artifacts differ.

Per float output the largest max_abs and mean_abs to golden over those runs, and the lowest
cosine, is golden.json's `noise`; the static and validate stages hold each float output to
max(declared, NOISE_K x noise) (cosine: min(declared, 1 - NOISE_K x (1 - noise cosine))), with
compare_within_noise, recorded on the row (`noise`). An output the reruns do not move keeps the
declared bounds exactly. Integer and bool outputs are unchanged."""
from __future__ import annotations

import math
from pathlib import Path

from ..core.numerics import compare, compare_one
from .ort import reduced_session

NOISE_K = 2         # how many times the reference's own noise an artifact may be off
ULP = 2.0 ** -23    # the relative change of a perturbed transcendental output
PERTURBED = ("Sigmoid", "Tanh", "Exp", "Erf", "Log", "Softmax")   # their outputs
QUANTIZING = ("DynamicQuantizeLinear", "Round")   # their float inputs: where a rounding flips
WHY = ("the reference's outputs move this much under another correct rounding (reruns: {runs}); "
       "an artifact is held to max(declared, {k} x this) per output")


def measure_onnx(model_path: Path, feeds: dict, golden: list, names: list[str]) -> dict:
    """golden.json's `noise` for an ONNX reference (the file onnxruntime ran for golden)."""
    runs = {"onnxruntime without graph optimisations": reduced_session(model_path).run(None, feeds)}
    for seed in (1, 2):   # without graph optimisations too: a third of the set-up time
        data, count = _perturbed(model_path, seed)
        if count:
            runs[f"{', '.join(PERTURBED)} outputs and {', '.join(QUANTIZING)} inputs x "
                 f"(1 + u 2^-23), u uniform in [-1, 1] per element, seed {seed} "
                 f"({count} values)"] = reduced_session(data).run(None, feeds)
    return _noise(runs, golden, names)


def measure_tflite(data: bytes, feeds: dict, golden: list, names: list[str]) -> dict:
    """golden.json's `noise` for a TFLite reference: `data` is the flatbuffer golden's LiteRT ran
    (after its state and custom-op rewrites)."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType  # LiteRT: 0.1 s
    runs, failed = {}, {}
    for what, kind in (("LiteRT with XNNPACK", OpResolverType.AUTO),
                       ("LiteRT's reference kernels", OpResolverType.BUILTIN_REF)):
        try:  # XNNPACK refuses some quantized graphs: that rerun is left out, and said so
            interp = Interpreter(model_content=data, num_threads=1, experimental_op_resolver_type=kind)
            for d in interp.get_input_details():
                if tuple(d["shape"]) != feeds[d["name"]].shape:
                    interp.resize_tensor_input(d["index"], list(feeds[d["name"]].shape), strict=True)
            interp.allocate_tensors()
            for d in interp.get_input_details():
                interp.set_tensor(d["index"], feeds[d["name"]])
            interp.invoke()
        except (RuntimeError, ValueError) as exc:
            failed[what] = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            continue
        got = {d["name"]: interp.get_tensor(d["index"]).copy() for d in interp.get_output_details()}
        runs[what] = [got[n] for n in names]
    return _noise(runs, golden, names, failed)


def _perturbed(model_path: Path, seed: int) -> tuple[bytes, int]:
    """The model with each float32 output of a PERTURBED op of the main graph, and each float32
    input of a QUANTIZING op, multiplied element by element by 1 + u x 2^-23, u uniform in
    [-1, 1] (RandomUniformLike, seeded: the same on every run): independent roundings of about an
    ulp, as another runtime's differ from onnxruntime's; and how many values were."""
    import numpy as np  # numpy: 0.2 s, not needed by doit list
    import onnx  # onnx: 1.5 s, not needed by doit list
    from onnx import helper, numpy_helper  # onnx: 1.5 s, not needed by doit list
    model = onnx.load(str(model_path))
    try:
        typed = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - no types known: nothing is perturbed (and none counted)
        return b"", 0
    types = {vi.name: vi.type.tensor_type.elem_type for vi in
             list(typed.graph.value_info) + list(typed.graph.output) + list(typed.graph.input)}
    one = "__reference_noise_one"
    nodes, count = [], 0

    def moved(value: str, out: str) -> None:   # out = value * (1 + u * ULP)
        stem = f"{out}__noise"
        nodes.extend([
            helper.make_node("RandomUniformLike", [value], [f"{stem}_u"], low=-ULP, high=ULP,
                             seed=float(seed * 100003 + count)),
            helper.make_node("Add", [f"{stem}_u", one], [f"{stem}_f"]),
            helper.make_node("Mul", [value, f"{stem}_f"], [out])])

    for node in model.graph.node:
        standard = node.domain in ("", "ai.onnx")
        if standard and node.op_type in QUANTIZING and types.get(node.input[0]) == onnx.TensorProto.FLOAT:
            out = f"{node.input[0]}__noise_{count}"   # the value as it reaches the rounding
            moved(node.input[0], out)
            node.input[0] = out
            count += 1
        nodes.append(node)
        if standard and node.op_type in PERTURBED and types.get(node.output[0]) == onnx.TensorProto.FLOAT:
            raw = f"{node.output[0]}__before_noise"
            out = node.output[0]
            node.output[0] = raw
            moved(raw, out)
            count += 1
    if not count:
        return b"", 0
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    model.graph.initializer.append(numpy_helper.from_array(np.array(1, np.float32), one))
    return model.SerializeToString(), count


def _noise(runs: dict, golden: list, names: list[str], failed: dict | None = None) -> dict:
    import numpy as np  # numpy: 0.2 s, not needed by doit list
    outputs = []
    for k, (name, expected) in enumerate(zip(names, golden)):
        if np.asarray(expected).dtype.kind != "f" or not np.size(expected):
            continue
        e = np.asarray(expected, np.float64)
        worst = {"name": name, "max_abs": 0.0, "mean_abs": 0.0, "cosine": 1.0, "by": None}
        for what, got in runs.items():
            a = np.asarray(got[k], np.float64)
            if a.shape != e.shape:
                continue
            diff = np.abs(a - e)
            diff = diff[np.isfinite(diff)]
            if diff.size and float(diff.max()) > worst["max_abs"]:
                worst.update(max_abs=float(diff.max()), by=what)
            if diff.size:
                worst["mean_abs"] = max(worst["mean_abs"], float(diff.mean()))
            if np.all(np.isfinite(a)) and np.all(np.isfinite(e)) and np.abs(e).max() > 0:
                worst["cosine"] = min(worst["cosine"], _cosine(a, e))
        outputs.append(worst)
    doc = {"why": WHY.format(runs="; ".join(runs) or "none ran", k=NOISE_K), "k": NOISE_K,
           "outputs": outputs if runs else []}
    if failed:
        doc["runs_failed"] = failed
    return doc


def _cosine(a, e) -> float:
    """As core.numerics judges it: each scaled by its peak, exactly rounded sums."""
    import numpy as np  # numpy: 0.2 s, not needed by doit list
    pa, pe = np.abs(a).max(), np.abs(e).max()
    if pa == 0:
        return 0.0
    a, e = (a / pa).ravel().tolist(), (e / pe).ravel().tolist()
    dot = math.fsum(x * y for x, y in zip(a, e))
    return dot / math.sqrt(math.fsum(x * x for x in a) * math.fsum(y * y for y in e))


def bounds(tol: dict, noise: dict | None, name: str) -> tuple[dict, dict | None]:
    """(the tolerance output `name` is held to, the noise row that widened it or None)."""
    row = next((o for o in (noise or {}).get("outputs", ()) if o["name"] == name), None)
    if row is None:
        return tol, None
    k = noise.get("k", NOISE_K)
    wider = {**tol, "max_abs": max(tol["max_abs"], k * row["max_abs"]),
             "mean_abs": max(tol["mean_abs"], k * row["mean_abs"]),
             "cosine": min(tol["cosine"], 1 - k * (1 - row.get("cosine", 1.0)))}
    if wider == tol:
        return tol, None
    metrics = ("max_abs", "mean_abs", "cosine")
    return wider, {**row, "k": k, "declared": {m: tol[m] for m in metrics},
                   "applied": {m: wider[m] for m in metrics},
                   "rule": "max_abs, mean_abs = max(declared, k x noise); cosine = min(declared, "
                           "1 - k x (1 - noise cosine))"}


def compare_within_noise(actual: list, expected: list, names: list[str], tol: dict,
                         noise: dict | None, precision: str | None = None) -> dict:
    """core.numerics.compare, each float output held to max(declared, k x golden's noise); a row
    so widened carries `noise` (what was measured, by which rerun, the bounds applied)."""
    if not noise or len(actual) != len(expected):
        return compare(actual, expected, names, tol, precision)
    rows = []
    for name, a, e in zip(names, actual, expected):
        applied, widened = bounds(tol, noise, name)
        row = compare_one(name, a, e, applied, precision)
        if widened is not None:
            row["noise"] = widened
        rows.append(row)
    return {"passed": all(not r["failures"] for r in rows), "outputs": rows}
