"""TFLite resource variables as explicit state (issue 40): a streaming model (a wake-word
detector keeping its last frames) keeps its state in variables: CALL_ONCE runs an initialiser
subgraph that ASSIGN_VARIABLEs each variable its initial value, then each call reads the state
(VAR_HANDLE -> READ_VARIABLE) and writes the next one (ASSIGN_VARIABLE). No ONNX route converts
that (two subgraphs, resource tensors); an ONNX model, and every compiler after it, carries state
as inputs and outputs, as pipeline/rewrite/recurrent.py does for LSTM state. So, in the TFLite
graph itself (LiteRT still runs and checks it), before the routes:

    each variable V read and assigned  a graph input `V` (after the model's own inputs), read where
                                       the first READ_VARIABLE was; a graph output `V_out` (after
                                       the model's own outputs) holding the last value assigned
                                       (a RESHAPE copy when that tensor is already an input, an
                                       output or a constant); a READ_VARIABLE after an
                                       ASSIGN_VARIABLE reads the assigned tensor, as LiteRT does
    read, never assigned               a constant: its initial value
    assigned, never read               dropped (nothing can observe it), recorded
    the CALL_ONCE and its subgraph     gone: folded into each variable's initial value (the
                                       initialiser run in LiteRT, constants read directly),
                                       recorded in the rewrite (`variables`: name, input,
                                       output, shape, dtype, quantization, initial values)

A caller starts with the initial values and feeds each call's `V_out` to the next call's `V`.
`check` proves it: LiteRT runs the original for CALLS consecutive calls with its variables, the
rewrite as many with the state carried by hand, outputs equal bit for bit at every call. Control
flow other than CALL_ONCE (WHILE, IF, CALL) is not this rewrite's: tflite_onnx converts IF, the
routes refuse the others.
"""
from __future__ import annotations

import hashlib

from ..spec.sources import TFLITE_DTYPES
from .tflite_rewrite import _drop_unused_tensors

VAR_HANDLE, READ_VARIABLE, ASSIGN_VARIABLE, CALL_ONCE, RESHAPE = 142, 143, 144, 129, 22
RESOURCE = 13
CALLS = 3  # consecutive calls the check carries the state over
INLINE = 4096  # initial values up to this many elements are written into the record


class StateError(Exception):
    pass


def _schema():
    from ai_edge_litert import schema_py_generated as S  # LiteRT: 0.1 s, not needed by doit list
    return S


def _code(model, op) -> int:
    c = model.operatorCodes[op.opcodeIndex]
    return max(c.builtinCode, c.deprecatedBuiltinCode)


def _name(t) -> str:
    return t.name.decode() if isinstance(t.name, bytes) else str(t.name or "")


def stateful(data: bytes) -> bool:
    """Whether the model has resource variables (a VAR_HANDLE op)."""
    model = _schema().Model.GetRootAs(data, 0)
    return any(max(model.OperatorCodes(i).BuiltinCode(), model.OperatorCodes(i).DeprecatedBuiltinCode())
               == VAR_HANDLE for i in range(model.OperatorCodesLength()))


def _variable(op) -> str:
    o = op.builtinOptions
    container = (o.container or b"").decode() if o is not None else ""
    shared = (o.sharedName or b"").decode() if o is not None else ""
    return f"{container}/{shared}" if container else shared


def _constant(model, t):
    import numpy as np  # numpy: 0.2 s, not needed by doit list
    data = model.buffers[t.buffer].data if t.buffer else None
    if data is None or len(data) == 0:
        return None
    return np.frombuffer(bytes(bytearray(data)), TFLITE_DTYPES[t.type]).reshape(list(t.shape))


def _pack(model) -> bytes:
    import flatbuffers  # flatbuffers: 0.15 s, not needed by doit list
    b = flatbuffers.Builder(1 << 16)
    b.Finish(model.Pack(b), file_identifier=b"TFL3")
    return bytes(b.Output())


def _initial_values(data: bytes, init_index: int) -> dict:
    """{variable: initial value} of the initialiser subgraph `init_index`: the last value each
    ASSIGN_VARIABLE gives, read from its buffer when constant, else computed by LiteRT on the
    initialiser alone (its VAR_HANDLE/ASSIGN_VARIABLE ops removed, the assigned tensors made its
    outputs)."""
    S = _schema()
    model = S.ModelT.InitFromPackedBuf(data, 0)
    sub = model.subgraphs[init_index]
    handles, assigned, kept = {}, {}, []
    for op in sub.operators:
        code = _code(model, op)
        if code == VAR_HANDLE:
            handles[op.outputs[0]] = _variable(op)
        elif code == ASSIGN_VARIABLE:
            assigned[handles[op.inputs[0]]] = op.inputs[1]
        elif code == READ_VARIABLE:
            raise StateError(f"the initialiser subgraph #{init_index} reads a variable: only "
                             f"assignments are folded into initial values")
        else:
            kept.append(op)
    values = {v: _constant(model, sub.tensors[t]) for v, t in assigned.items()}
    computed = {v: t for v, t in assigned.items() if values[v] is None}
    if computed:
        sub.operators, sub.inputs, sub.outputs = kept, [], list(computed.values())
        model.subgraphs, model.signatureDefs = [sub], []
        from ai_edge_litert.interpreter import Interpreter, OpResolverType  # LiteRT: 0.1 s, not needed by doit list
        interp = Interpreter(model_content=_pack(model), num_threads=1,
                             experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
        interp.allocate_tensors()
        interp.invoke()
        for v, d in zip(computed, interp.get_output_details()):
            values[v] = interp.get_tensor(d["index"]).copy()
    return values


def explicit_state(data: bytes) -> tuple[bytes, dict]:
    """(the one-subgraph model with its variables as inputs/outputs, the rewrite's record)."""
    import numpy as np  # numpy: 0.2 s, not needed by doit list
    S = _schema()
    model = S.ModelT.InitFromPackedBuf(data, 0)
    if any((buf.offset or 0) > 1 for buf in model.buffers):
        raise StateError("the model keeps its buffers after the flatbuffer (a > 2 GB export): "
                         "its variables cannot be made explicit in place")
    main = model.subgraphs[0]
    handles, alias, first_read, current, order, inits, kept = {}, {}, {}, {}, [], {}, []
    for k, op in enumerate(main.operators):
        code = _code(model, op)
        if code == CALL_ONCE:
            index = op.builtinOptions.initSubgraphIndex
            inits.update(_initial_values(data, index))
            continue
        if code == VAR_HANDLE:
            handles[op.outputs[0]] = _variable(op)
            if handles[op.outputs[0]] not in order:
                order.append(handles[op.outputs[0]])
            continue
        if code == READ_VARIABLE:
            var, out = handles[op.inputs[0]], op.outputs[0]
            if var in current:
                alias[out] = current[var]
            else:
                first_read[var] = current[var] = out
            continue
        if code == ASSIGN_VARIABLE:
            var, value = handles[op.inputs[0]], op.inputs[1]
            current[var] = alias.get(value, value)
            continue
        resource = [i for i in op.inputs if i >= 0 and main.tensors[i].type == RESOURCE]
        if resource:
            raise StateError(f"operator #{k} takes a resource tensor: only VAR_HANDLE, "
                             f"READ_VARIABLE and ASSIGN_VARIABLE are made explicit")
        op.inputs = [alias.get(i, i) for i in op.inputs]
        kept.append(op)
    others = set(range(1, len(model.subgraphs))) - {
        op.builtinOptions.initSubgraphIndex for op in main.operators if _code(model, op) == CALL_ONCE}
    if others:
        raise StateError(f"subgraph(s) {sorted(others)} are not initialisers called once: control "
                         f"flow other than CALL_ONCE is not made explicit")
    main.operators = kept
    outputs = [alias.get(i, i) for i in main.outputs]
    inputs = list(main.inputs)
    taken = {_name(main.tensors[i]) for i in inputs + outputs}
    variables = []
    for var in order:
        read, last = first_read.get(var), current.get(var)
        row = {"variable": var}
        initial = inits.get(var)
        if initial is None:
            raise StateError(f"variable {var!r} has no initial value: no CALL_ONCE initialiser "
                             f"assigns it")
        if read is None:  # assigned, never read: dead
            variables.append({**row, "dropped": "assigned, never read: nothing observes it"})
            continue
        t = main.tensors[read]
        if list(t.shape) != list(initial.shape):
            t.shape = list(initial.shape)
        if last == read:  # never assigned: a constant
            buf = S.BufferT()
            buf.data = np.frombuffer(np.ascontiguousarray(initial).tobytes(), np.uint8)
            model.buffers.append(buf)
            t.buffer = len(model.buffers) - 1
            variables.append({**row, "constant": "read, never assigned: its initial value"})
            continue
        name = var
        if name in taken:
            raise StateError(f"variable {var!r}: the model already has an input or output of that "
                             f"name")
        out_name = f"{name}_out"
        for i, other in enumerate(main.tensors):  # the interface names are the variables' own
            if _name(other) in (name, out_name):
                other.name = f"{_name(other)}__inner{i}".encode()
        t.name = name.encode()
        if last in inputs + outputs or last == read or _constant(model, main.tensors[last]) is not None \
                or last in [v for v in first_read.values()]:
            src = main.tensors[last]
            copy = S.TensorT()
            copy.name, copy.shape, copy.type, copy.buffer = out_name.encode(), list(src.shape), src.type, 0
            copy.quantization = src.quantization
            main.tensors.append(copy)
            shape = S.TensorT()
            shape.name, shape.shape, shape.type = f"{out_name}__shape".encode(), [len(src.shape)], 2
            buf = S.BufferT()
            buf.data = np.frombuffer(np.asarray(src.shape, np.int32).tobytes(), np.uint8)
            model.buffers.append(buf)
            shape.buffer = len(model.buffers) - 1
            main.tensors.append(shape)
            op = S.OperatorT()
            op.opcodeIndex = _opcode(model, RESHAPE)
            op.inputs, op.outputs = [last, len(main.tensors) - 1], [len(main.tensors) - 2]
            op.builtinOptionsType = S.BuiltinOptions.ReshapeOptions
            op.builtinOptions = S.ReshapeOptionsT()
            op.builtinOptions.newShape = list(src.shape)
            main.operators.append(op)
            last = len(main.tensors) - 2
        else:
            main.tensors[last].name = out_name.encode()
        inputs.append(read)
        outputs.append(last)
        taken |= {name, out_name}
        q = t.quantization
        quant = None
        if q is not None and q.scale is not None and len(q.scale):
            quant = {"scale": [float(s) for s in q.scale], "zero_point": [int(z) for z in q.zeroPoint]}
        variables.append({**row, "input": name, "output": out_name, "shape": list(initial.shape),
                          "dtype": str(initial.dtype), "quantization": quant,
                          **describe_initial(initial)})
    main.inputs, main.outputs = inputs, outputs
    model.subgraphs, model.signatureDefs = [main], []
    _drop_unused_tensors(model)
    used = sorted({op.opcodeIndex for op in main.operators})  # VAR_HANDLE & co. gone from the codes
    model.operatorCodes = [model.operatorCodes[k] for k in used]
    for op in main.operators:
        op.opcodeIndex = used.index(op.opcodeIndex)
    record = {"rule": "explicit-state", "ops": "VAR_HANDLE/READ_VARIABLE/ASSIGN_VARIABLE/CALL_ONCE",
              "count": len(variables), "variables": variables,
              "how": "each variable V: input V, output V_out; start from `initial`, feed each "
                     "call's V_out to the next call's V"}
    return _pack(model), record


def describe_initial(initial) -> dict:
    """A variable's initial value for the record: `initial` (the values, nested lists, up to
    INLINE elements; else its fill value when every element is the same), and its sha256."""
    import numpy as np  # numpy: 0.2 s, not needed by doit list
    flat = initial.ravel()
    out = {"initial_sha256": hashlib.sha256(np.ascontiguousarray(initial).tobytes()).hexdigest()}
    if flat.size and (flat == flat[0]).all():
        out["initial_fill"] = flat[0].item()
    if flat.size <= INLINE:
        out["initial"] = initial.tolist()
    return out


def initial_arrays(record: dict) -> dict:
    """{input name: initial value} from the rewrite's record (what a caller starts with)."""
    import numpy as np  # numpy: 0.2 s, not needed by doit list
    out = {}
    for v in record["variables"]:
        if "input" not in v:
            continue
        if "initial" in v:
            out[v["input"]] = np.asarray(v["initial"], v["dtype"]).reshape(v["shape"])
        else:
            out[v["input"]] = np.full(v["shape"], v["initial_fill"], v["dtype"])
    return out


def _opcode(model, builtin: int) -> int:
    S = _schema()
    for k, c in enumerate(model.operatorCodes):
        if max(c.builtinCode, c.deprecatedBuiltinCode) == builtin:
            return k
    c = S.OperatorCodeT()
    c.builtinCode, c.deprecatedBuiltinCode, c.version = builtin, min(builtin, 127), 1
    model.operatorCodes.append(c)
    return len(model.operatorCodes) - 1


def _interpreter(data: bytes):
    from ai_edge_litert.interpreter import Interpreter, OpResolverType  # LiteRT: 0.1 s, not needed by doit list
    interp = Interpreter(model_content=data, num_threads=1,
                         experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    interp.allocate_tensors()
    return interp


def step_inputs(details: list, seed: int, call: int) -> dict:
    """One call's seeded inputs by name: floats uniform in -1..1, 8-bit integers over their range."""
    import numpy as np  # numpy: 0.2 s, not needed by doit list
    rng, out = np.random.default_rng([seed, call]), {}
    for d in details:
        dtype = np.dtype(d["dtype"])
        if dtype.kind == "f":
            out[d["name"]] = rng.uniform(-1, 1, d["shape"]).astype(dtype)
        elif dtype in (np.int8, np.uint8):
            info = np.iinfo(dtype)
            out[d["name"]] = rng.integers(info.min, int(info.max) + 1, d["shape"]).astype(dtype)
        else:
            out[d["name"]] = np.zeros(d["shape"], dtype)
    return out


def run_original(data: bytes, calls: list[dict]) -> list[dict]:
    """LiteRT on the stateful original, one invoke per call (its variables kept between them)."""
    interp = _interpreter(data)
    out = []
    for arrays in calls:
        for d in interp.get_input_details():
            interp.set_tensor(d["index"], arrays[d["name"]])
        interp.invoke()
        out.append({d["name"]: interp.get_tensor(d["index"]).copy() for d in interp.get_output_details()})
    return out


def run_explicit(data: bytes, record: dict, calls: list[dict]) -> list[dict]:
    """LiteRT on the rewrite, the state carried by hand from the initial values (outputs without
    the state outputs, as the original gives them)."""
    interp = _interpreter(data)
    state = initial_arrays(record)
    pairs = [(v["input"], v["output"]) for v in record["variables"] if "input" in v]
    out = []
    for arrays in calls:
        for d in interp.get_input_details():
            interp.set_tensor(d["index"], {**arrays, **state}[d["name"]])
        interp.invoke()
        got = {d["name"]: interp.get_tensor(d["index"]).copy() for d in interp.get_output_details()}
        state = {i: got.pop(o) for i, o in pairs}
        out.append(got)
    return out


def check(original: bytes, rewritten: bytes, record: dict, seed: int = 0) -> dict:
    """The record with its `check`: CALLS consecutive calls, equal bit for bit; raises StateError."""
    import numpy as np  # numpy: 0.2 s, not needed by doit list
    calls = [step_inputs(_interpreter(original).get_input_details(), seed, k) for k in range(CALLS)]
    want, got = run_original(original, calls), run_explicit(rewritten, record, calls)
    for k, (w, g) in enumerate(zip(want, got)):
        for name, ref in w.items():
            if name not in g or g[name].shape != ref.shape or not np.array_equal(g[name], ref):
                diff = (float(np.abs(g[name].astype(np.float64) - ref).max())
                        if name in g and g[name].shape == ref.shape else "shape")
                raise StateError(f"call {k + 1} of {CALLS}: output {name!r} of the explicit-state "
                                 f"model differs from the original's with its variables ({diff})")
    return {**record, "check": {"against": "LiteRT on the original, its variables kept between calls",
                                "calls": CALLS, "seed": seed, "max_abs": 0.0}}
