"""Model sources (spec side): which format a source is, its files, its sha256, its I/O signature.

Conversion to ONNX is the import stage's (pipeline/rewrite/sources.py).

Model sources other than ONNX: TFLite files and NNEF graph folders, brought into the ONNX stages.

    format   source                         golden reference                 routes to ONNX, tried in order
    onnx     model.onnx                     onnxruntime on the source        (none)
    tflite   model.tflite                   LiteRT interpreter on the source tflite -> NNEF -> ONNX (nnef-tools),
                                                                             then tflite -> ONNX (tflite_onnx)
    nnef     folder with graph.nnef (+.dat) onnxruntime on the conversion    NNEF -> ONNX (nnef-tools)

Why these routes (measured on ../shared/models, Nov 2026): tflite2onnx 0.4.1 fails on both real
TFLite models (IndexError in its layout pass on face_landmark, AssertionError on basic-pitch);
IREE's TFLite importer (iree-tools-tflite) needs TensorFlow; TVM's Relax TFLite frontend imports
face_landmark (max abs 1.4e-4) but cannot leave TVM for the ONNX stages and fails on basic-pitch
(EXPAND_DIMS). Khronos nnef-tools reads TFLite and writes ONNX through NNEF, keeping the model's
own NHWC interface (it inserts Transposes inside; with --keep-io-names the tensor names stay, and
names NNEF cannot spell, such as `input_2:0`, are given back after conversion), once a few gaps are
fixed (`nnef_fixes.py`: PRELU, SELECT_V2, NNEF stack, shape ops computed at run time, RELU6,
HARD_SWISH, DEPTH_TO_SPACE...). Before conversion the TFLite graph itself is rewritten where
nnef-tools cannot follow (pipeline/rewrite/tflite_rewrite.py: sparse weights densified, fused
activations unfused, MediaPipe's Convolution2DTransposeBias as TRANSPOSE_CONV + ADD), each
rewrite checked in LiteRT. The converted model is then checked like any other: the static stage
compares it with the TFLite interpreter's golden outputs.

nnef-tools still refuses whole classes (Dec 2026, issue 28): full-integer uint8/int8 models,
RESIZE_BILINEAR with align_corners or a non-integer factor, L2_NORMALIZATION, and it writes dilated
SAME convolutions onnxruntime rejects. The second route, pipeline/rewrite/tflite_onnx.py, converts
TFLite op by op into ONNX (QDQ for quantized tensors), and the import stage takes it when the first
refuses or its conversion does not match LiteRT (docs/measurements/2026-12-02-tflite-routes.md).

An ONNX source's external-data files (tensors stored beside the .onnx, `location` in
TensorProto.external_data) are part of it: its import step reads and hashes them, and its sha256
covers them (source_files, files_sha256).

A TFLite model with resource variables (a streaming model's state) has the interface the import
gives it (pipeline/rewrite/tflite_state.py): each variable read and assigned an input `<name>`
after its own inputs and an output `<name>_out` after its own outputs (`state` in the signature).

A layout flip is never silent: the import stage requires the converted model's inputs and
outputs to have exactly the source's names, order, shapes and dtypes.
"""
from __future__ import annotations

from pathlib import Path

from ..core.store import canonical_json, sha256_file, sha256_text
from .onnx_signature import external_data

NNEF_GRAPH = "graph.nnef"
NNEF_TOOLS_TFLITE = "tflite->nnef->onnx (nnef-tools)"
DIRECT_TFLITE = "tflite->onnx (tflite_onnx)"
# The routes of each format into ONNX, in the order the import stage tries them: the first whose
# conversion runs and matches the reference is used; import.json records every attempt.
ROUTES = {"onnx": (), "tflite": (NNEF_TOOLS_TFLITE, DIRECT_TFLITE), "nnef": ("nnef->onnx (nnef-tools)",)}
GOLDEN = {"onnx": "onnxruntime (source)", "tflite": "litert (source)",
          "nnef": "onnxruntime (nnef-tools conversion)"}
TOOLS = {"onnx": (), "tflite": ("nnef-tools", "nnef", "tflite", "ai-edge-litert", "onnxruntime"),
         "nnef": ("nnef-tools", "nnef")}
TFLITE_DTYPES = {0: "float32", 1: "float16", 2: "int32", 3: "uint8", 4: "int64", 6: "bool",
                 9: "int8", 11: "float64"}


def source_format(path: Path) -> str | None:
    """'onnx', 'tflite' or 'nnef' (a folder: an NNEF graph), from the path alone; None if unknown."""
    if path.is_dir():
        return "nnef"
    return {".onnx": "onnx", ".tflite": "tflite"}.get(path.suffix)


def source_files(path: Path, external: tuple[str, ...] | None = None) -> dict[str, Path]:
    """The files a source consists of, by logical name: an NNEF folder's graph.nnef and .dat
    files (`source:<path in the folder>`); a file (`source`) and, for ONNX, the external-data
    files its tensors name (`source:<location>`, relative to the .onnx's folder). `external`:
    those locations when already known (ModelSpec.external_data), else they are read."""
    if path.is_dir():
        return {f"source:{p.relative_to(path).as_posix()}": p
                for p in sorted(path.rglob("*")) if p.is_file()}
    if external is None:
        external = external_data(path) if source_format(path) == "onnx" else ()
    return {"source": path, **{f"source:{loc}": path.parent / loc for loc in external}}


def files_sha256(hashes: dict[str, str]) -> str:
    """The sha256 a spec pins for a source, from the sha256 of each of its files by logical name
    (source_files): a lone file's own (what sha256sum prints); an NNEF folder's or an ONNX file's
    with external data: the sha256 of the canonical JSON of {logical name: sha256}."""
    if set(hashes) == {"source"}:
        return hashes["source"]
    return sha256_text(canonical_json(hashes))


def source_sha256(path: Path, external: tuple[str, ...] | None = None) -> str:
    """The sha256 a spec pins for the source at `path` (files_sha256 of its files)."""
    return files_sha256({k: sha256_file(p) for k, p in source_files(path, external).items()})


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
    # tflite: 0.25 s, only for a TFLite source's signature (then memoised); the flatbuffer
    # schema reads any file, custom ops included
    import tflite
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

    signature = {"inputs": describe(graph.InputsAsNumpy()), "outputs": describe(graph.OutputsAsNumpy()),
                 "opset": 0, "graph_name": (graph.Name() or b"").decode(), "custom_ops": custom_ops(path)}
    state = _tflite_state(model, graph, describe)
    if state:  # resource variables: the interface the import makes explicit (rewrite/tflite_state.py)
        signature["inputs"] += [s["input"] for s in state]
        signature["outputs"] += [s["output"] for s in state]
        signature["state"] = [{"variable": s["variable"], "input": s["input"]["name"],
                               "output": s["output"]["name"]} for s in state]
    return signature


def _tflite_state(model, graph, describe) -> list[dict]:
    """The variables a TFLite model keeps between calls (VAR_HANDLE / READ_VARIABLE /
    ASSIGN_VARIABLE in its first subgraph), as the state inputs and outputs the import stage makes
    of them (pipeline/rewrite/tflite_state.py, the rule): each variable both read and assigned is
    an input named after it (the first read's tensor: its shape and dtype) after the model's own
    inputs, and an output `<name>_out` after its own outputs."""
    import tflite  # tflite: 0.25 s, only for a TFLite source's signature (then memoised)
    handles, order, read, assigned = {}, [], {}, set()
    for k in range(graph.OperatorsLength()):
        op = graph.Operators(k)
        code = model.OperatorCodes(op.OpcodeIndex())
        builtin = max(code.BuiltinCode(), code.DeprecatedBuiltinCode())
        if builtin == tflite.BuiltinOperator.VAR_HANDLE:
            options = tflite.VarHandleOptions()
            table = op.BuiltinOptions()
            container = shared = ""
            if table is not None:
                options.Init(table.Bytes, table.Pos)
                container, shared = ((options.Container() or b"").decode(),
                                     (options.SharedName() or b"").decode())
            var = f"{container}/{shared}" if container else shared
            handles[int(op.Outputs(0))] = var
            if var not in order:
                order.append(var)
        elif builtin == tflite.BuiltinOperator.READ_VARIABLE:
            var = handles.get(int(op.Inputs(0)))
            if var not in assigned:
                read.setdefault(var, int(op.Outputs(0)))
        elif builtin == tflite.BuiltinOperator.ASSIGN_VARIABLE:
            assigned.add(handles.get(int(op.Inputs(0))))
    state = []
    for var in order:
        if var in read and var in assigned:
            (tensor,) = describe([read[var]])
            state.append({"variable": var, "input": {**tensor, "name": var},
                          "output": {**tensor, "name": f"{var}_out"}})
    return state


def custom_ops(path: Path) -> list[str]:
    """Custom (non-builtin) operators a TFLite file uses: neither LiteRT nor a converter knows them."""
    import tflite  # tflite: 0.25 s, only for a TFLite source's signature (then memoised)
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
    import nnef  # nnef: 0.12 s, only for an NNEF source's signature (then memoised)
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
