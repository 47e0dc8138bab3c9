"""Converting TFLite files and NNEF folders to ONNX (the import stage's routes: a TFLite file
tries nnef-tools, then tflite_onnx.py, and takes the first conversion that matches LiteRT), and
running TFLite sources in LiteRT (their golden reference). What a source is: pipeline/spec/sources.py.

The import stage converts its own copy of the source, whose bytes it has hashed and checked
against the spec's pin (import_model.read_source): to_onnx reads nothing else.
"""
from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from ..core.tools import python_module_argv, run_tool
from ..spec.model import read_signature as onnx_signature
from ..spec.sources import DIRECT_TFLITE, NNEF_TOOLS_TFLITE, ROUTES, read_signature
from . import tflite_rewrite, tflite_state


# ----------------------------------------------------------------------------- conversion
class ConversionError(Exception):
    pass


# A route's conversion is used only if onnxruntime runs it and its outputs match LiteRT's on one
# seeded input within MATCH_RELATIVE of the outputs' magnitude (floats) or MATCH_STEPS quantization
# steps (integer outputs): a gate against wrong conversions (nnef-tools once dropped a fused ReLU:
# error 28 on outputs up to 36), not the acceptance test, which is the static stage's, against the
# spec's tolerance. Full-integer kernels may round one step apart from QDQ in onnxruntime.
MATCH_RELATIVE, MATCH_STEPS, CHECK_SEED = 1e-2, 2, 0


def _nnef_tools(args: list[str], log: Path | None) -> None:
    """Run nnef-tools' converter in a child process (it prints freely and may exit), through
    `python -m pipeline.rewrite.nnef_fixes`: `nnef_tools.convert` with constant shape ops folded after
    reading a TFLite file (see nnef_fixes.fold_shape_ops)."""
    repo = str(Path(__file__).resolve().parents[2])  # --custom-converters imports pipeline.rewrite.nnef_fixes
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")])}
    result = run_tool(python_module_argv("pipeline.rewrite.nnef_fixes", *args), log=log,
                      what="nnef-tools", env=env, check=False)
    if result.returncode != 0 or "cannot be converted" in result.output:
        raise ConversionError(converter_reason(result.output) or f"exit {result.returncode}")


def converter_reason(output: str) -> str:
    """What a converter's output says stopped it: each op it refused with its reason ("Conversion
    of operator 'X' is not possible: why"), else the exception of a traceback with the frame that
    raised it (an AssertionError says nothing by itself), else its last line."""
    lines = [l.rstrip() for l in output.splitlines() if l.strip()]
    refused = [l.strip() for l in lines if re.match(r"\s*Conversion of operator '.*' is not (possible|implemented)", l)]
    if refused:
        return "; ".join(dict.fromkeys(refused))[:600]
    if any(l.startswith("Traceback") for l in lines):
        errors = [k for k, l in enumerate(lines) if re.match(r"[A-Za-z_.]*(Error|Exception)\b", l)]
        frames = [k for k, l in enumerate(lines) if re.match(r'\s*File ".*", line \d+, in ', l)]
        if errors:
            k = errors[-1]
            where = [f for f in frames if f < k]
            at = ""
            if where:
                m = re.match(r'\s*File "(.*)", line (\d+), in (.*)', lines[where[-1]])
                code = lines[where[-1] + 1].strip() if where[-1] + 1 < k else ""
                at = f" at {'/'.join(Path(m[1]).parts[-2:])}:{m[2]} in {m[3]}" + (f" ({code})" if code else "")
            return f"{lines[k].strip()}{at}"[:600]
    return lines[-1][:600] if lines else ""


def _note(log: Path | None, text: str) -> None:
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "a") as out:
            out.write(text + "\n")


def _via_nnef_tools(model: Path, out: Path, log: Path | None, tmp: Path) -> None:
    nnef_dir = Path(tmp) / "model.nnef"
    _nnef_tools(["--input-format", "tflite", "--output-format", "nnef", "--input-model",
                 str(model), "--output-model", str(nnef_dir), "--keep-io-names",
                 "--custom-converters", "pipeline.rewrite.nnef_fixes",
                 "--custom-fragments", "pipeline.rewrite.nnef_fixes"], log)
    _nnef_to_onnx(nnef_dir, out, log)


def _nnef_to_onnx(nnef_dir: Path, out: Path, log: Path | None) -> None:
    from . import nnef_fixes  # nnef-tools: 0.2 s, not needed by doit list
    _nnef_tools(["--input-format", "nnef", "--output-format", "onnx", "--input-model",
                 str(nnef_dir), "--output-model", str(out), "--keep-io-names",
                 "--custom-converters", "pipeline.rewrite.nnef_fixes",
                 "--decompose", *nnef_fixes.DECOMPOSE], log)


def _via_tflite_onnx(model: Path, out: Path, log: Path | None, tmp: Path) -> None:
    from . import tflite_onnx  # onnx and LiteRT's schema: 1.7 s, not needed by doit list
    try:
        converted = tflite_onnx.convert(model.read_bytes(), graph_name=model.stem)
    except tflite_onnx.Unsupported as exc:
        raise ConversionError(str(exc)) from None
    out.write_bytes(converted.SerializeToString(deterministic=True))


TFLITE_ROUTES = {NNEF_TOOLS_TFLITE: _via_nnef_tools, DIRECT_TFLITE: _via_tflite_onnx}


def to_onnx(source: Path, fmt: str, out: Path, log: Path | None = None,
            check_shapes: dict | None = None) -> dict:
    """Convert a TFLite file or NNEF folder to ONNX at `out`. A TFLite file is first rewritten where
    it must be (tflite_rewrite: fused activations nnef-tools would lose, sparse weights densified,
    known custom ops as builtins), each rewrite checked with LiteRT; then the routes of ROUTES are
    tried in order, each conversion run in onnxruntime against LiteRT (match_litert), the first
    that passes used. Returns {"route": used, "attempts": [every route tried: status, reason or
    check], "rewrites": [...]}; raises ConversionError naming each route's reason. `check_shapes`
    (input name -> dims, the spec's) is the shape the check runs at where an input has dynamic
    dims (a [-1, -1] input may not run at 1x1: a CONV_2D over it fails to prepare in LiteRT)."""
    if fmt == "nnef":
        _nnef_to_onnx(source, out, log)
        _clean_onnx(out, read_signature(source))
        return {"route": ROUTES["nnef"][0], "attempts": [{"route": ROUTES["nnef"][0], "status": "used"}],
                "rewrites": []}
    data, state = _explicit_state(source.read_bytes())
    try:
        rewritten, rewrites = tflite_rewrite.rewrite(data)
        rewrites = state + tflite_rewrite.check(data, rewritten, rewrites, check_shapes)
    except tflite_rewrite.RewriteError as exc:
        raise ConversionError(str(exc)) from None
    except (RuntimeError, ValueError) as exc:  # LiteRT's own errors: its reason is the first line
        raise ConversionError(f"LiteRT cannot run {source.name} to check its TFLite rewrites "
                              f"(at the input shapes {check_shapes or 'stored in the file'}): "
                              f"{(str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]}") from None
    attempts, signature = [], read_signature(source)
    with tempfile.TemporaryDirectory() as tmp:
        model = source
        if rewrites:  # else the source itself, byte for byte
            model = Path(tmp) / source.name
            model.write_bytes(rewritten)
            _note(log, f"tflite rewrites: {[(r['rule'], r['count']) for r in rewrites]}; the "
                       f"rewritten model (sha256 {tflite_rewrite.sha256(rewritten)}) is converted")
        for k, route in enumerate(ROUTES["tflite"]):
            attempt = Path(tmp) / f"route{k}.onnx"
            try:
                TFLITE_ROUTES[route](model, attempt, log, Path(tmp))
                _clean_onnx(attempt, signature)
                _same_interface(signature, attempt)
                check = match_litert(source, attempt, signature, check_shapes)
            except ConversionError as exc:
                attempts.append({"route": route, "status": "failed", "reason": str(exc)})
                _note(log, f"route {route} failed: {exc}")
                continue
            attempts.append({"route": route, "status": "used", "check": check})
            _note(log, f"route {route} used: {check}")
            out.write_bytes(attempt.read_bytes())
            return {"route": route, "attempts": attempts, "rewrites": rewrites}
    raise ConversionError("; ".join(f"[{a['route']}] {a['reason']}" for a in attempts))


def _explicit_state(data: bytes) -> tuple[bytes, list[dict]]:
    """A TFLite model with resource variables as the one-subgraph model with explicit state
    (tflite_state: each variable an input and an output `<name>_out`, the CALL_ONCE initialiser
    folded into the initial values the record gives), checked in LiteRT against the original over
    consecutive calls; the model as it is (and no record) when it has none."""
    if not tflite_state.stateful(data):
        return data, []
    try:
        explicit, record = tflite_state.explicit_state(data)
        return explicit, [tflite_state.check(data, explicit, record)]
    except tflite_state.StateError as exc:
        raise ConversionError(f"resource variables: {exc}") from None
    except (RuntimeError, ValueError) as exc:  # LiteRT's own errors: its reason is the first line
        raise ConversionError(f"resource variables: LiteRT cannot run the model to check the explicit "
                              f"state: {(str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]}") from None


def _same_interface(signature: dict, converted: Path) -> None:
    """A route that changes the interface (a layout flip, a renamed output) is refused like one
    that fails: io_mismatches, the import stage's own check, on the attempt."""
    problems = io_mismatches(signature, onnx_signature(converted))
    if problems:
        raise ConversionError(f"the conversion's interface differs from the source's: {'; '.join(problems)}")


def check_inputs(signature: dict, seed: int = CHECK_SEED, shapes: dict | None = None) -> dict:
    """One seeded input per source input (at its shape in `shapes` where given, else dynamic dims
    as 1): floats uniform in 0..1, 8-bit integers over their whole range, other integers and
    booleans zero."""
    import numpy as np  # numpy: 0.2 s, not needed by doit list
    rng, arrays, shapes = np.random.default_rng(seed), {}, shapes or {}
    for i in signature["inputs"]:
        dims, dtype = list(shapes.get(i["name"]) or [d or 1 for d in i["dims"]]), np.dtype(i["dtype"])
        if dtype.kind == "f":
            arrays[i["name"]] = rng.uniform(0, 1, dims).astype(dtype)
        elif dtype in (np.uint8, np.int8):
            info = np.iinfo(dtype)
            arrays[i["name"]] = rng.integers(info.min, int(info.max) + 1, dims).astype(dtype)
        else:
            arrays[i["name"]] = np.zeros(dims, dtype)
    return arrays


def match_litert(source: Path, converted: Path, signature: dict, shapes: dict | None = None) -> dict:
    """Run the conversion in onnxruntime and the source in LiteRT (tflite_run, the golden reference)
    on check_inputs (at `shapes` where given); raises ConversionError if LiteRT or onnxruntime
    cannot run it or an output differs beyond the gate (MATCH_RELATIVE, MATCH_STEPS). Returns the
    figures."""
    import numpy as np  # numpy: 0.2 s, not needed by doit list
    import onnxruntime as ort  # onnxruntime: 0.2 s, not needed by doit list
    arrays = check_inputs(signature, shapes=shapes)
    try:
        want = tflite_run(source, arrays)
    except LiteRTError as exc:
        raise ConversionError(f"{exc}; the conversion cannot be checked against it") from None
    try:
        options = ort.SessionOptions()
        options.log_severity_level = 3  # its refusal is reported below, not logged twice
        session = ort.InferenceSession(str(converted), options, providers=["CPUExecutionProvider"])
        got = dict(zip([o.name for o in session.get_outputs()], session.run(None, arrays)))
    except Exception as exc:  # onnxruntime's own error types: the conversion is not runnable
        raise ConversionError(f"onnxruntime cannot run the conversion: "
                              f"{(str(exc).strip().splitlines() or [type(exc).__name__])[-1][:300]}") from None
    worst = {"max_abs": 0.0}
    for name, ref in want.items():
        if name not in got or got[name].shape != ref.shape:
            raise ConversionError(f"output {name!r}: {got[name].shape if name in got else 'missing'} "
                                  f"from the conversion, {ref.shape} from LiteRT")
        err = float(np.abs(got[name].astype(np.float64) - ref.astype(np.float64)).max()) if ref.size else 0.0
        scale = float(np.abs(ref.astype(np.float64)).max()) if ref.size else 0.0
        bound = MATCH_STEPS if ref.dtype.kind in "iu" else MATCH_RELATIVE * max(1.0, scale)
        if err > bound:
            raise ConversionError(f"output {name!r} differs from LiteRT by {err:.3g} (outputs up to "
                                  f"{scale:.3g}, allowed {bound:.3g}) on the seeded check input")
        if err >= worst["max_abs"]:
            worst = {"output": name, "max_abs": err, "max_ref": scale}
    return {"against": "litert (source)", "seed": CHECK_SEED,
            "shapes": {k: list(v.shape) for k, v in arrays.items()}, **worst}


def _nnef_identifier(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", name)


def _restore_io_names(model, signature: dict) -> None:
    """NNEF names are identifiers, so nnef-tools turns a TFLite `input_2:0` into `input_2_0`: give the
    interface back the source's own names, by position, where the name is exactly that identifier
    (any other difference is left for io_mismatches to report)."""
    rename = {}
    for kind, infos in (("inputs", model.graph.input), ("outputs", model.graph.output)):
        for want, vi in zip(signature.get(kind, []), infos):
            if vi.name != want["name"] and vi.name == _nnef_identifier(want["name"]):
                rename[vi.name] = want["name"]
    taken = {o for n in model.graph.node for o in n.output} | {t.name for t in model.graph.initializer}
    rename = {a: b for a, b in rename.items() if b not in taken}
    if not rename:
        return
    for node in model.graph.node:
        node.input[:] = [rename.get(n, n) for n in node.input]
        node.output[:] = [rename.get(n, n) for n in node.output]
    for vi in list(model.graph.input) + list(model.graph.output) + list(model.graph.value_info):
        vi.name = rename.get(vi.name, vi.name)


def _clean_onnx(path: Path, signature: dict) -> None:
    """nnef-tools lists every weight as a graph input too: keep only the real inputs, under the
    source's names."""
    import onnx  # onnx: 1.5 s, not needed by doit list
    model = onnx.load(str(path))
    inits = {t.name for t in model.graph.initializer}
    real = [vi for vi in model.graph.input if vi.name not in inits]
    del model.graph.input[:]
    model.graph.input.extend(real)
    _restore_io_names(model, signature)
    path.write_bytes(model.SerializeToString(deterministic=True))


def io_mismatches(signature: dict, converted: dict) -> list[str]:
    """How the converted model's interface differs from the source's (names, order, shapes, dtypes)."""
    problems = []
    for kind in ("inputs", "outputs"):
        want, have = signature[kind], converted[kind]
        if [t["name"] for t in want] != [t["name"] for t in have]:
            problems.append(f"{kind}: source {[t['name'] for t in want]}, converted "
                            f"{[t['name'] for t in have]}")
            continue
        for w, h in zip(want, have):
            if w["dtype"] != h["dtype"]:
                problems.append(f"{kind[:-1]} {w['name']!r}: dtype {w['dtype']} became {h['dtype']}")
            if len(w["dims"]) != len(h["dims"]) or any(
                    a is not None and b is not None and a != b for a, b in zip(w["dims"], h["dims"])):
                problems.append(f"{kind[:-1]} {w['name']!r}: shape {w['dims']} became {h['dims']} "
                                f"(a layout change, e.g. NHWC -> NCHW, is never made silently)")
    return problems


# ----------------------------------------------------------------------------- golden
class LiteRTError(RuntimeError):
    """LiteRT refused to run a TFLite model (resize, allocate or invoke): the message says which
    step, at which input shapes, and LiteRT's own reason. A RuntimeError, as LiteRT's own are."""


def tflite_run(path: Path, arrays: dict) -> dict:
    """The TFLite interpreter (LiteRT, builtin reference-delegate-free kernels, 1 thread) on named
    inputs. A model with a custom op that tflite_rewrite knows runs with that op rewritten into
    builtins (nothing else rewritten: the reference the import stage checks its other rewrites
    against); a model with resource variables runs with them as explicit state inputs and outputs
    (tflite_state: `arrays` gives the state, the outputs include the next one; the import stage
    checked that rewrite against the original over consecutive calls); any other model runs as it
    is. Each input is resized to its array's shape before the tensors are allocated; LiteRT's
    refusals (a kernel that fails to prepare at that shape, a wrong dtype) raise LiteRTError."""
    # LiteRT: 0.1 s, not needed by doit list
    from ai_edge_litert.interpreter import Interpreter, OpResolverType
    data = path.read_bytes()
    if tflite_state.stateful(data):
        data = tflite_state.explicit_state(data)[0]
    data, _ = tflite_rewrite.rewrite(data, only_custom=True)
    shapes = {k: list(getattr(v, "shape", ())) for k, v in arrays.items()}
    step = "load"
    try:
        interp = Interpreter(model_content=data, num_threads=1,
                             experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
        step = "resize the inputs"
        for d in interp.get_input_details():
            if tuple(d["shape"]) != arrays[d["name"]].shape:
                interp.resize_tensor_input(d["index"], list(arrays[d["name"]].shape), strict=True)
        step = "allocate (prepare every op)"
        interp.allocate_tensors()
        step = "set the inputs"
        for d in interp.get_input_details():
            interp.set_tensor(d["index"], arrays[d["name"]])
        step = "invoke"
        interp.invoke()
    except (RuntimeError, ValueError) as exc:  # LiteRT's own errors: its reason is the first line
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        raise LiteRTError(f"LiteRT cannot {step} {path.name} at the input shapes {shapes}: "
                          f"{reason}") from None
    return {d["name"]: interp.get_tensor(d["index"]).copy() for d in interp.get_output_details()}
