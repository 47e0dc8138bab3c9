"""The I/O signature of an ONNX model, read without onnx or protobuf.

A small reader of the protobuf wire format that walks only the fields the signature needs
(ModelProto ir_version / opset_import / graph; GraphProto node / name / initializer / input /
output; ValueInfoProto and its tensor type) and skips everything else without copying it, so
a model with megabytes of weights is read in about the time it takes to read the file.
The result is exactly what `onnx.load(path, load_external_data=False)` followed by the old
`spec.read_signature` gives. External data is never read.

external_data() walks the same way to the tensors stored outside the file (TensorProto
external_data `location`): those files are part of the source (spec/sources.py).

What it does not do is check the parts it skips: a file whose node attributes or weights are
corrupt (protobuf rejects it) still gets its signature here; the import stage reports it.
"""
from __future__ import annotations

import mmap
import os

ONNX_DTYPES = {1: "float32", 2: "uint8", 3: "int8", 6: "int32", 7: "int64", 9: "bool",
               10: "float16", 11: "float64"}
PARSE_ERROR = "Error parsing message with type 'onnx.ModelProto': Wire format was corrupt"
NO_GRAPH = "no ONNX graph in the file (ir_version or nodes missing)"

_VARINT, _I64, _LEN, _SGROUP, _EGROUP, _I32 = 0, 1, 2, 3, 4, 5


class DecodeError(Exception):
    pass


def _varint(buf, pos: int, end: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= end or shift >= 70:
            raise DecodeError("truncated or overlong varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result & 0xFFFFFFFFFFFFFFFF, pos
        shift += 7


def _int64(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def _int32(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v >= 1 << 31 else v


def _skip(buf, pos: int, end: int, wire: int, field: int, depth: int = 0) -> int:
    if wire == _VARINT:
        return _varint(buf, pos, end)[1]
    if wire == _I64:
        pos += 8
    elif wire == _I32:
        pos += 4
    elif wire == _LEN:
        n, pos = _varint(buf, pos, end)
        pos += n
    elif wire == _SGROUP:
        if depth > 100:
            raise DecodeError("groups nested too deep")
        while True:
            tag, pos = _varint(buf, pos, end)
            f, w = tag >> 3, tag & 7
            if w == _EGROUP:
                if f != field:
                    raise DecodeError("mismatched end group")
                return pos
            pos = _skip(buf, pos, end, w, f, depth + 1)
    else:
        raise DecodeError(f"bad wire type {wire}")
    if pos > end:
        raise DecodeError("truncated field")
    return pos


def _fields(chunks):
    """(field, wire, value) of the messages in `chunks` (memoryviews of one message, merged as
    protobuf merges repeated occurrences): value is an int for varints, a memoryview for
    length-delimited fields, None for skipped fixed-width fields and groups."""
    for buf in chunks:
        pos, end = 0, len(buf)
        while pos < end:
            tag, pos = _varint(buf, pos, end)
            field, wire = tag >> 3, tag & 7
            if field == 0:
                raise DecodeError("field number 0")
            if wire == _VARINT:
                value, pos = _varint(buf, pos, end)
            elif wire == _LEN:
                n, pos = _varint(buf, pos, end)
                if pos + n > end:
                    raise DecodeError("truncated length-delimited field")
                value, pos = buf[pos:pos + n], pos + n
            elif wire == _EGROUP:
                raise DecodeError("unexpected end group")
            else:
                value, pos = None, _skip(buf, pos, end, wire, field)
            yield field, wire, value


def _text(mv):
    """A string field; like protobuf for proto2 strings, the raw bytes when not valid UTF-8."""
    raw = bytes(mv)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw


def _string_field(chunks, number: int) -> str:
    out = ""
    for f, w, v in _fields(chunks):
        if f == number and w == _LEN:
            out = _text(v)
    return out


def _dims(shape_chunks) -> list:
    dims = []
    for f, w, v in _fields(shape_chunks):
        if f != 1 or w != _LEN:
            continue
        which, value, param = None, 0, ""   # oneof value {dim_value = 1, dim_param = 2}
        for df, dw, dv in _fields([v]):
            if df == 1 and dw == _VARINT:
                which, value, param = "value", _int64(dv), ""
            elif df == 2 and dw == _LEN:
                which, value, param = "param", 0, _text(dv)
        dims.append(value if which == "value" and value > 0 else (param or None))
    return dims


def _value_info(chunks) -> dict:
    name, type_chunks = "", []
    for f, w, v in _fields(chunks):
        if f == 1 and w == _LEN:
            name = _text(v)
        elif f == 2 and w == _LEN:
            type_chunks.append(v)
    tensor_chunks = []
    for f, w, v in _fields(type_chunks):
        if w != _LEN:
            continue
        if f == 1:
            tensor_chunks.append(v)
        elif f in (4, 5, 8, 9):        # another member of TypeProto's oneof value clears it
            tensor_chunks = []
    elem_type, shape_chunks = 0, []
    for f, w, v in _fields(tensor_chunks):
        if f == 1 and w == _VARINT:
            elem_type = _int32(v)
        elif f == 2 and w == _LEN:
            shape_chunks.append(v)
    return {"name": name, "dtype": ONNX_DTYPES.get(elem_type, f"onnx:{elem_type}"),
            "dims": _dims(shape_chunks)}


def parse_signature(data) -> dict:
    """The signature of a serialized ModelProto (bytes or memoryview)."""
    buf = memoryview(data)
    try:
        ir_version, opsets, graph_chunks = 0, [], []
        for f, w, v in _fields([buf]):
            if f == 1 and w == _VARINT:
                ir_version = _int64(v)
            elif f == 8 and w == _LEN:
                domain, version = "", 0
                for of, ow, ov in _fields([v]):
                    if of == 1 and ow == _LEN:
                        domain = _text(ov)
                    elif of == 2 and ow == _VARINT:
                        version = _int64(ov)
                opsets.append((domain, version))
            elif f == 7 and w == _LEN:
                graph_chunks.append(v)
        has_nodes, graph_name, initializers, inputs, outputs = False, "", set(), [], []
        for f, w, v in _fields(graph_chunks):
            if w != _LEN:
                continue
            if f == 1:
                has_nodes = True
            elif f == 2:
                graph_name = _text(v)
            elif f == 5:
                initializers.add(_string_field([v], 8))
            elif f == 11:
                inputs.append(v)
            elif f == 12:
                outputs.append(v)
        if ir_version <= 0 or not has_nodes:
            return {"error": NO_GRAPH}
        described = [[_value_info([v]) for v in values] for values in (inputs, outputs)]
        ins, outs = ([d for d in values if d["name"] not in initializers] for values in described)
        defaults = [d for d in described[0] if d["name"] in initializers]  # IR < 4 exports
    except DecodeError:
        return {"error": PARSE_ERROR}
    opset = max((v for d, v in opsets if d in ("", "ai.onnx")), default=0)
    return {"inputs": ins, "outputs": outs, "opset": int(opset), "graph_name": graph_name,
            **({"defaults": defaults} if defaults else {})}


def read_signature(path) -> dict:
    """{"inputs": [{name, dtype, dims}], "outputs": [...], "opset": int, "graph_name": str} of
    an ONNX file, or {"error": one line} when it cannot be read or holds no graph.
    The file is mapped, not read: pages of weights that are skipped are never touched."""
    try:
        return _parse_mapped(path, parse_signature)
    except (OSError, ValueError) as exc:
        return {"error": str(exc).splitlines()[0] if str(exc) else type(exc).__name__}


# ----------------------------------------------------------------------------- external data
_EXTERNAL = 1                        # TensorProto.DataLocation.EXTERNAL
_GRAPH_NODE, _FUNCTION_NODE = 1, 7   # GraphProto.node, FunctionProto.node


def _tensor_location(chunks) -> str | None:
    """The `location` of a TensorProto stored as external data (data_location 14, external_data
    13: key/value entries), else None."""
    location, external = "", False
    for f, w, v in _fields(chunks):
        if f == 14 and w == _VARINT:
            external = v == _EXTERNAL
        elif f == 13 and w == _LEN:
            entry = {ef: bytes(ev).decode("utf-8", "replace") for ef, ew, ev in _fields([v])
                     if ef in (1, 2) and ew == _LEN}
            if entry.get(1) == "location":
                location = entry.get(2, "")
    return location if external else None


def _sparse_locations(chunks, out: set) -> None:
    for f, w, v in _fields(chunks):  # SparseTensorProto: values 1, indices 2
        if f in (1, 2) and w == _LEN:
            out.add(_tensor_location([v]))


def _graph_locations(chunks, out: set, node_field: int = _GRAPH_NODE, depth: int = 0) -> None:
    """Add the locations of the external tensors of a GraphProto (initializers 5, sparse
    initializers 15, node attributes) or a FunctionProto (node attributes only) to `out`."""
    if depth > 64:
        raise DecodeError("graphs nested too deep")
    nodes = []
    for f, w, v in _fields(chunks):
        if w != _LEN:
            continue
        if f == node_field:
            nodes.append(v)
        elif node_field == _GRAPH_NODE and f == 5:
            out.add(_tensor_location([v]))
        elif node_field == _GRAPH_NODE and f == 15:
            _sparse_locations([v], out)
    for node in nodes:
        for f, w, v in _fields([node]):
            if f != 5 or w != _LEN:        # NodeProto.attribute
                continue
            for af, aw, av in _fields([v]):
                if aw != _LEN:
                    continue
                if af in (5, 10):           # AttributeProto.t, .tensors
                    out.add(_tensor_location([av]))
                elif af in (6, 11):         # .g, .graphs
                    _graph_locations([av], out, _GRAPH_NODE, depth + 1)
                elif af in (22, 23):        # .sparse_tensor, .sparse_tensors
                    _sparse_locations([av], out)


def parse_external_data(data) -> list[str]:
    """The external-data locations of a serialized ModelProto (graph 7, functions 25), sorted."""
    out, graphs, functions = set(), [], []
    try:
        for f, w, v in _fields([memoryview(data)]):
            if f == 7 and w == _LEN:
                graphs.append(v)
            elif f == 25 and w == _LEN:
                functions.append(v)
        _graph_locations(graphs, out)
        for function in functions:
            _graph_locations([function], out, _FUNCTION_NODE)
    except DecodeError:
        return []  # read_signature reports the file as unreadable
    return sorted(loc for loc in out if loc is not None)


def external_data(path) -> list[str]:
    """The `location` of every tensor of an ONNX file stored as external data (initializers,
    sparse initializers, node attributes, subgraphs, functions, as onnx's own loader finds them),
    sorted, each once; [] for a file without, or one that cannot be read (read_signature says
    so). Like read_signature, the file is mapped, and the weights are skipped unread."""
    try:
        return _parse_mapped(path, parse_external_data)
    except (OSError, ValueError):
        return []


def _parse_mapped(path, parse):
    """parse(the file's bytes), the file mapped rather than read: pages of weights the parser
    skips are never touched. OSError/ValueError when the file cannot be opened or mapped."""
    with open(os.fspath(path), "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return parse(b"")
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        return parse(mapped)
    finally:
        try:
            mapped.close()
        except BufferError:  # a view still alive (only on an unexpected error): leave it to GC
            pass
