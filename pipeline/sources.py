"""Model sources other than ONNX: TFLite files and NNEF graph folders, brought into the ONNX stages.

    format   source                         golden reference                 route to ONNX
    onnx     model.onnx                     onnxruntime on the source        (none)
    tflite   model.tflite                   LiteRT interpreter on the source tflite -> NNEF -> ONNX (nnef-tools)
    nnef     folder with graph.nnef (+.dat) onnxruntime on the conversion    NNEF -> ONNX (nnef-tools)

Why this route (measured on ../shared/models, Nov 2026): tflite2onnx 0.4.1 fails on both real
TFLite models (IndexError in its layout pass on face_landmark, AssertionError on basic-pitch);
IREE's TFLite importer (iree-tools-tflite) needs TensorFlow; TVM's Relax TFLite frontend imports
face_landmark (max abs 1.4e-4) but cannot leave TVM for the ONNX stages and fails on basic-pitch
(EXPAND_DIMS). Khronos nnef-tools reads TFLite and writes ONNX through NNEF, keeping the model's
own NHWC interface (it inserts Transposes inside; with --keep-io-names the tensor names stay, and
names NNEF cannot spell, such as `input_2:0`, are given back after conversion), once a few gaps are
fixed (`nnef_fixes.py`: PRELU, SELECT_V2, NNEF stack, shape ops computed at run time). The converted model is then checked like any
other: the static stage compares it with the TFLite interpreter's golden outputs.

A layout flip is never silent: the import stage requires the converted model's inputs and
outputs to have exactly the source's names, order, shapes and dtypes.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from .store import canonical_json, sha256_file, sha256_text

NNEF_GRAPH = "graph.nnef"
ROUTES = {"onnx": None, "tflite": "tflite->nnef->onnx (nnef-tools)", "nnef": "nnef->onnx (nnef-tools)"}
GOLDEN = {"onnx": "onnxruntime (source)", "tflite": "litert (source)",
          "nnef": "onnxruntime (nnef-tools conversion)"}
TOOLS = {"onnx": (), "tflite": ("nnef-tools", "nnef", "tflite", "ai-edge-litert"),
         "nnef": ("nnef-tools", "nnef")}
TFLITE_DTYPES = {0: "float32", 1: "float16", 2: "int32", 3: "uint8", 4: "int64", 6: "bool",
                 9: "int8", 11: "float64"}


def source_format(path: Path) -> str | None:
    """'onnx', 'tflite' or 'nnef' (a folder: an NNEF graph), from the path alone; None if unknown."""
    if path.is_dir():
        return "nnef"
    return {".onnx": "onnx", ".tflite": "tflite"}.get(path.suffix)


def source_files(path: Path) -> dict[str, Path]:
    """The files a source consists of, by logical name (an NNEF folder: graph.nnef and its .dat)."""
    if path.is_dir():
        return {f"source:{p.relative_to(path).as_posix()}": p
                for p in sorted(path.rglob("*")) if p.is_file()}
    return {"source": path}


def source_sha256(path: Path) -> str:
    """sha256 of the file; for a folder, of the canonical JSON of {relative path: sha256}."""
    if path.is_dir():
        return sha256_text(canonical_json({k: sha256_file(p) for k, p in source_files(path).items()}))
    return sha256_file(path)


# ----------------------------------------------------------------------------- signatures
def read_signature(path: Path) -> dict:
    """Inputs and outputs of a TFLite file or NNEF folder, in the form spec.read_signature gives.

    Problems come back as {"error": text}; they are reported as spec problems.
    """
    fmt = source_format(path)
    if fmt == "tflite":
        return _tflite_signature(path)
    if fmt == "nnef":
        return _nnef_signature(path)
    raise ValueError(f"not a TFLite or NNEF source: {path}")


def _tflite_signature(path: Path) -> dict:
    import tflite  # the flatbuffer schema: reads any file, custom ops included
    try:
        model = tflite.Model.GetRootAsModel(path.read_bytes(), 0)
        graph = model.Subgraphs(0)
    except Exception as exc:
        return {"error": f"not a readable TFLite flatbuffer ({type(exc).__name__}: {exc})"}

    def describe(indices):
        out = []
        for i in indices:
            t = graph.Tensors(int(i))
            sig = t.ShapeSignatureAsNumpy() if t.ShapeSignatureLength() else t.ShapeAsNumpy()
            dims = [int(d) if int(d) > 0 else None for d in (sig if not isinstance(sig, int) else [])]
            out.append({"name": t.Name().decode(), "dtype": TFLITE_DTYPES.get(t.Type(), f"tflite:{t.Type()}"),
                        "dims": dims})
        return out

    return {"inputs": describe(graph.InputsAsNumpy()), "outputs": describe(graph.OutputsAsNumpy()),
            "opset": 0, "graph_name": (graph.Name() or b"").decode(), "custom_ops": custom_ops(path)}


def custom_ops(path: Path) -> list[str]:
    """Custom (non-builtin) operators a TFLite file uses: neither LiteRT nor a converter knows them."""
    import tflite
    model = tflite.Model.GetRootAsModel(path.read_bytes(), 0)
    names = set()
    for k in range(model.OperatorCodesLength()):
        code = model.OperatorCodes(k)
        if max(code.BuiltinCode(), code.DeprecatedBuiltinCode()) == tflite.BuiltinOperator.CUSTOM:
            names.add((code.CustomCode() or b"?").decode())
    return sorted(names)


def _nnef_signature(path: Path) -> dict:
    graph_file = path / NNEF_GRAPH
    if not graph_file.is_file():
        present = ", ".join(sorted(p.name for p in path.iterdir())[:6]) or "nothing"
        return {"error": f"NNEF folder {path.name}/ has no {NNEF_GRAPH} (it holds: {present}); an "
                         f"NNEF source is a folder with {NNEF_GRAPH} and its .dat tensors"}
    import nnef
    try:
        graph = nnef.parse_file(str(graph_file))
        nnef.infer_shapes(graph)
    except nnef.Error as exc:
        return {"error": f"{NNEF_GRAPH} does not parse: {exc}"}
    dtype = {"scalar": "float32", "integer": "int64", "logical": "bool"}

    def describe(names):
        return [{"name": n, "dtype": dtype.get(graph.tensors[n].dtype, graph.tensors[n].dtype),
                 "dims": [int(d) for d in graph.tensors[n].shape]} for n in names]

    return {"inputs": describe(graph.inputs), "outputs": describe(graph.outputs), "opset": 0,
            "graph_name": graph.name}


# ----------------------------------------------------------------------------- conversion
class ConversionError(Exception):
    pass


def _nnef_tools(args: list[str], log: Path | None) -> None:
    """Run nnef-tools' converter in a child process (it prints freely and may exit), through
    `python -m pipeline.nnef_fixes`: `nnef_tools.convert` with constant shape ops folded after
    reading a TFLite file (see nnef_fixes.fold_shape_ops)."""
    argv = [sys.executable, "-m", "pipeline.nnef_fixes", *args]
    repo = str(Path(__file__).resolve().parent.parent)  # --custom-converters imports pipeline.nnef_fixes
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(argv, capture_output=True, text=True, env=env)
    if log:
        with open(log, "a") as fh:
            fh.write(f"$ {' '.join(argv)}\n{proc.stdout}{proc.stderr}\n# exit {proc.returncode}\n")
    if proc.returncode != 0 or "cannot be converted" in proc.stdout + proc.stderr:
        lines = [l for l in (proc.stderr + proc.stdout).splitlines() if l.strip()]
        detail = [l for l in lines if "not implemented" in l or "Error" in l or "error" in l]
        raise ConversionError("; ".join(dict.fromkeys(detail or lines[-1:]))[:600] or f"exit {proc.returncode}")


def to_onnx(source: Path, fmt: str, out: Path, log: Path | None = None) -> None:
    """Convert a TFLite file or NNEF folder to ONNX at `out` with nnef-tools; raises ConversionError."""
    with tempfile.TemporaryDirectory() as tmp:
        nnef_dir = source
        if fmt == "tflite":
            nnef_dir = Path(tmp) / "model.nnef"
            _nnef_tools(["--input-format", "tflite", "--output-format", "nnef", "--input-model",
                         str(source), "--output-model", str(nnef_dir), "--keep-io-names",
                         "--custom-converters", "pipeline.nnef_fixes"], log)
        _nnef_tools(["--input-format", "nnef", "--output-format", "onnx", "--input-model",
                     str(nnef_dir), "--output-model", str(out), "--keep-io-names",
                     "--custom-converters", "pipeline.nnef_fixes"], log)
    _clean_onnx(out, read_signature(source))


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
    """The TFLite interpreter (LiteRT, builtin reference-delegate-free kernels, 1 thread) on named inputs."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType
    interp = Interpreter(model_path=str(path), num_threads=1,
                         experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    for d in interp.get_input_details():
        if tuple(d["shape"]) != arrays[d["name"]].shape:
            interp.resize_tensor_input(d["index"], list(arrays[d["name"]].shape), strict=True)
    interp.allocate_tensors()
    for d in interp.get_input_details():
        interp.set_tensor(d["index"], arrays[d["name"]])
    interp.invoke()
    return {d["name"]: interp.get_tensor(d["index"]).copy() for d in interp.get_output_details()}
