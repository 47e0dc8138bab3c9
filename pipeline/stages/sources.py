"""Converting TFLite files and NNEF folders to ONNX (the import stage's route), and running
TFLite sources in LiteRT (their golden reference). What a source is: pipeline/spec/sources.py.

The import stage converts its own copy of the source, whose bytes it has hashed and checked
against the spec's pin (import_model.read_source): to_onnx reads nothing else.
"""
from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from ..core.tools import python_module_argv, run_tool
from ..spec.sources import read_signature


# ----------------------------------------------------------------------------- conversion
class ConversionError(Exception):
    pass


def _nnef_tools(args: list[str], log: Path | None) -> None:
    """Run nnef-tools' converter in a child process (it prints freely and may exit), through
    `python -m pipeline.stages.nnef_fixes`: `nnef_tools.convert` with constant shape ops folded after
    reading a TFLite file (see nnef_fixes.fold_shape_ops)."""
    repo = str(Path(__file__).resolve().parents[2])  # --custom-converters imports pipeline.stages.nnef_fixes
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")])}
    result = run_tool(python_module_argv("pipeline.stages.nnef_fixes", *args), log=log,
                      what="nnef-tools", env=env, check=False)
    if result.returncode != 0 or "cannot be converted" in result.output:
        lines = [l for l in result.output.splitlines() if l.strip()]
        detail = [l for l in lines if "not implemented" in l or "Error" in l or "error" in l]
        raise ConversionError("; ".join(dict.fromkeys(detail or lines[-1:]))[:600]
                              or f"exit {result.returncode}")


def _note(log: Path | None, text: str) -> None:
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "a") as out:
            out.write(text + "\n")


def to_onnx(source: Path, fmt: str, out: Path, log: Path | None = None) -> list[dict]:
    """Convert a TFLite file or NNEF folder to ONNX at `out` with nnef-tools; raises ConversionError.
    A TFLite file is first rewritten where it must be (tflite_rewrite: fused activations nnef-tools
    would lose, sparse weights densified, known custom ops as builtins), each rewrite checked with
    LiteRT: returns those rewrites (none: the source's own bytes are converted)."""
    from . import nnef_fixes, tflite_rewrite
    rewrites = []
    with tempfile.TemporaryDirectory() as tmp:
        nnef_dir = source
        if fmt == "tflite":
            data = source.read_bytes()
            try:
                rewritten, rewrites = tflite_rewrite.rewrite(data)
                rewrites = tflite_rewrite.check(data, rewritten, rewrites)
            except tflite_rewrite.RewriteError as exc:
                raise ConversionError(str(exc)) from None
            model = source
            if rewrites:  # else the source itself, byte for byte
                model = Path(tmp) / source.name
                model.write_bytes(rewritten)
                _note(log, f"tflite rewrites: {[(r['rule'], r['count']) for r in rewrites]}; the "
                           f"rewritten model (sha256 {tflite_rewrite.sha256(rewritten)}) is converted")
            nnef_dir = Path(tmp) / "model.nnef"
            _nnef_tools(["--input-format", "tflite", "--output-format", "nnef", "--input-model",
                         str(model), "--output-model", str(nnef_dir), "--keep-io-names",
                         "--custom-converters", "pipeline.stages.nnef_fixes",
                         "--custom-fragments", "pipeline.stages.nnef_fixes"], log)
        _nnef_tools(["--input-format", "nnef", "--output-format", "onnx", "--input-model",
                     str(nnef_dir), "--output-model", str(out), "--keep-io-names",
                     "--custom-converters", "pipeline.stages.nnef_fixes",
                     "--decompose", *nnef_fixes.DECOMPOSE], log)
    _clean_onnx(out, read_signature(source))
    return rewrites


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
    import onnx
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
def tflite_run(path: Path, arrays: dict) -> dict:
    """The TFLite interpreter (LiteRT, builtin reference-delegate-free kernels, 1 thread) on named
    inputs. A model with a custom op that tflite_rewrite knows runs with that op rewritten into
    builtins (nothing else rewritten: the reference the import stage checks its other rewrites
    against); any other model runs as it is."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType
    from . import tflite_rewrite
    data, _ = tflite_rewrite.rewrite(path.read_bytes(), only_custom=True)
    interp = Interpreter(model_content=data, num_threads=1,
                         experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    for d in interp.get_input_details():
        if tuple(d["shape"]) != arrays[d["name"]].shape:
            interp.resize_tensor_input(d["index"], list(arrays[d["name"]].shape), strict=True)
    interp.allocate_tensors()
    for d in interp.get_input_details():
        interp.set_tensor(d["index"], arrays[d["name"]])
    interp.invoke()
    return {d["name"]: interp.get_tensor(d["index"]).copy() for d in interp.get_output_details()}
