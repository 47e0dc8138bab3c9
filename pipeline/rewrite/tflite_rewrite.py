"""TFLite graph rewrites applied before conversion, in the TFLite graph itself, so that LiteRT can
still run (and check) the rewritten model. The import stage records each rewrite (`rewrites` in
import.json, then the manifest) and checks it (`check`); golden runs LiteRT on the rewritten
model only where the original cannot run (a custom op).

    rule                                   what it does
    unfuse-activation                      a fused RELU, RELU_N1_TO_1 or RELU6 on an op whose fused
                                           activation nnef-tools drops silently (ADD, SUB, MUL, DIV,
                                           pools, TRANSPOSE_CONV, L2_NORMALIZATION) becomes its own op
    drop-ignored-activation                a fused TANH or SIGN_BIT that LiteRT's kernel ignores is
                                           removed (nnef-tools would apply it)
    densify                                a constant sparse tensor (TFLite sparsity: DENSE/CSR
                                           levels, blocks) feeding a DENSIFY op: the op's output
                                           becomes a dense constant, the op and the sparse tensor go
    Convolution2DTransposeBias->TRANSPOSE_CONV+ADD
                                           MediaPipe's custom op (mediapipe/util/tflite/operations/
                                           transpose_conv_bias.cc: OHWI weights, bias [O], options a
                                           TfLiteTransposeConvParams {padding, stride_w, stride_h})
                                           as builtin TRANSPOSE_CONV with the output shape MediaPipe's
                                           Prepare computes, then ADD of the bias

Models without any of these are left byte for byte as they are (`rewrite` returns the input).
The flatbuffer is edited through the object API of the schema LiteRT ships
(ai_edge_litert.schema_py_generated: ModelT unpack, edit, Pack).
"""
from __future__ import annotations

import hashlib
import struct

from ..spec.sources import TFLITE_DTYPES

CUSTOM_REWRITES = ("Convolution2DTransposeBias",)  # custom ops a rule below rewrites into builtins
DENSIFY, CUSTOM, TRANSPOSE_CONV, ADD = 124, 32, 67, 0
# Ops whose fused_activation_function nnef-tools 1.0.11 drops without a word (its TFLite transforms
# honour it only on CONV_*, DEPTHWISE_CONV_2D, FULLY_CONNECTED and CONCATENATION): ADD, SUB, MUL,
# DIV, AVERAGE/MAX/L2_POOL_2D, TRANSPOSE_CONV, L2_NORMALIZATION (builtin codes).
UNFUSE = {0: "ADD", 41: "SUB", 18: "MUL", 42: "DIV", 1: "AVERAGE_POOL_2D", 17: "MAX_POOL_2D",
          12: "L2_POOL_2D", 67: "TRANSPOSE_CONV", 11: "L2_NORMALIZATION"}
ACTIVATION_OPS = {1: ("RELU", 19), 2: ("RELU_N1_TO_1", 20), 3: ("RELU6", 21)}
# LiteRT's kernels of these ops (and of the convolutions and FULLY_CONNECTED) clamp their output to
# CalculateActivationRange(activation), which is (lowest, max) for TANH and SIGN_BIT: such a fused
# activation does nothing in LiteRT (the golden reference), while nnef-tools would apply tanh. It is
# dropped, recorded; the check shows the outputs unchanged.
IGNORED_ACTIVATIONS = {4: "TANH", 5: "SIGN_BIT"}
DROP_IGNORED = {**UNFUSE, 3: "CONV_2D", 4: "DEPTHWISE_CONV_2D", 9: "FULLY_CONNECTED"}
PADDING = {1: "SAME", 2: "VALID"}  # TfLitePadding (kTfLitePaddingSame = 1, Valid = 2)


class RewriteError(Exception):
    pass


def _schema():
    from ai_edge_litert import schema_py_generated as S  # LiteRT: 0.1 s, not needed by doit list
    return S


def _builtin(code) -> int:
    return max(code.builtinCode, code.deprecatedBuiltinCode)


def _name(tensor) -> str:
    return tensor.name.decode() if isinstance(tensor.name, bytes) else str(tensor.name)


def _buffer_array(model, tensor):
    import numpy as np  # numpy: 0.2 s, not needed by doit list
    data = model.buffers[tensor.buffer].data
    if data is None or tensor.type not in TFLITE_DTYPES:
        return None
    return np.frombuffer(np.asarray(data, np.uint8).tobytes(), np.dtype(TFLITE_DTYPES[tensor.type]).newbyteorder("<"))


# ----------------------------------------------------------------------------- plan
def pending(data: bytes) -> dict:
    """What `rewrite` would do to a TFLite file: {"rules": {rule: count}} (empty: nothing), and the
    custom ops no rule rewrites (`unknown`)."""
    model = _schema().ModelT.InitFromPackedBuf(data, 0)
    found, unknown = {}, set()
    for sub in model.subgraphs:
        for op in sub.operators:
            code = model.operatorCodes[op.opcodeIndex]
            b = _builtin(code)
            if b == DENSIFY:
                name = "densify"
            elif b == CUSTOM:
                name = (code.customCode or b"?").decode()
                if name not in CUSTOM_REWRITES:
                    unknown.add(name)
                    continue
            elif b in DROP_IGNORED and getattr(op.builtinOptions, "fusedActivationFunction", 0) in IGNORED_ACTIVATIONS:
                name = "drop-ignored-activation"
            elif b in UNFUSE and getattr(op.builtinOptions, "fusedActivationFunction", 0):
                name = "unfuse-activation"
            else:
                continue
            found[name] = found.get(name, 0) + 1
    return {"rules": found, "unknown": sorted(unknown)}


def rewrite(data: bytes, only_custom: bool = False) -> tuple[bytes, list[dict]]:
    """(rewritten TFLite bytes, the rewrites applied). `only_custom`: just the custom-op rules (what
    LiteRT needs to run the model at all; golden). Raises RewriteError for a custom op no rule takes."""
    plan = pending(data)
    if plan["unknown"]:
        raise RewriteError(f"custom op(s) {', '.join(plan['unknown'])}: no rewrite into builtin TFLite ops "
                           f"is known for them (known: {', '.join(CUSTOM_REWRITES)}), and neither LiteRT "
                           f"nor nnef-tools can run or convert a custom op")
    rules = {k: v for k, v in plan["rules"].items() if not only_custom or k in CUSTOM_REWRITES}
    if not rules:
        return data, []
    import flatbuffers  # flatbuffers (with numpy): 0.15 s, not needed by doit list
    S = _schema()
    model = S.ModelT.InitFromPackedBuf(data, 0)
    if any((buf.offset or 0) > 1 for buf in model.buffers):
        raise RewriteError(f"the model keeps its buffers after the flatbuffer (offset/size, a > 2 GB "
                           f"export): rules {', '.join(rules)} cannot rewrite it in place")
    done = []
    if "densify" in rules:
        done += _densify(model)
    if "drop-ignored-activation" in rules:
        done += _drop_ignored(model)
    if "unfuse-activation" in rules:
        done += _unfuse(model)
    if "Convolution2DTransposeBias" in rules:
        done += _transpose_conv_bias(model)
    _drop_unused_tensors(model)
    b = flatbuffers.Builder(len(data) + 4096)
    b.Finish(model.Pack(b), file_identifier=b"TFL3")
    return bytes(b.Output()), done


# ----------------------------------------------------------------------------- densify
def densify_values(values, shape, sparsity):
    """The dense array a TFLite sparse tensor stands for (tensorflow/lite/kernels/internal/utils/
    sparsity_format_converter.cc): levels in traversal order, each DENSE (dense_size) or SPARSE_CSR
    (segments, indices); dims past the tensor's rank are blocks of block_map's dims."""
    import numpy as np  # numpy: 0.2 s, not needed by doit list
    order = [int(d) for d in sparsity.traversalOrder]
    block_map = [int(d) for d in (sparsity.blockMap if sparsity.blockMap is not None else [])]
    levels = sparsity.dimMetadata
    rank = len(shape)
    coords = np.zeros((1, 0), np.int64)  # one row per position reached so far, one column per level
    positions = np.zeros(1, np.int64)
    for level in levels:
        if level.format == 0:  # DENSE
            n = int(level.denseSize)
            coords = np.concatenate([np.repeat(coords, n, 0),
                                     np.tile(np.arange(n), len(positions))[:, None]], 1)
            positions = (positions[:, None] * n + np.arange(n)).reshape(-1)
        else:                  # SPARSE_CSR
            seg = np.asarray(level.arraySegments.values, np.int64)
            idx = np.asarray(level.arrayIndices.values, np.int64)
            counts = seg[positions + 1] - seg[positions]
            starts = np.repeat(seg[positions], counts)
            within = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
            new_pos = starts + within
            coords = np.concatenate([np.repeat(coords, counts, 0), idx[new_pos][:, None]], 1)
            positions = new_pos
    expanded = np.zeros((len(positions), len(order)), np.int64)
    for level, dim in enumerate(order):
        expanded[:, dim] = coords[:, level]
    block_size = {block_map[k]: int(levels[order.index(rank + k)].denseSize) for k in range(len(block_map))}
    index = []
    for d in range(rank):
        if d in block_size:
            index.append(expanded[:, d] * block_size[d] + expanded[:, rank + block_map.index(d)])
        else:
            index.append(expanded[:, d])
    dense = np.zeros([int(s) for s in shape], values.dtype)
    dense[tuple(index)] = values[positions]
    return dense


def _densify(model) -> list[dict]:
    import numpy as np  # numpy: 0.2 s, not needed by doit list
    S = _schema()
    tensors_done = []
    for sub in model.subgraphs:
        keep = []
        for op in sub.operators:
            code = model.operatorCodes[op.opcodeIndex]
            if _builtin(code) != DENSIFY:
                keep.append(op)
                continue
            src, dst = sub.tensors[op.inputs[0]], sub.tensors[op.outputs[0]]
            values = _buffer_array(model, src)
            if src.sparsity is None or values is None:
                raise RewriteError(f"DENSIFY of {_name(src)!r}: its input is not a constant sparse "
                                   f"tensor, so it cannot be densified at load")
            dense = densify_values(values, list(dst.shape), src.sparsity)
            buf = S.BufferT()
            buf.data = np.frombuffer(dense.astype(dense.dtype.newbyteorder("<")).tobytes(), np.uint8)
            model.buffers.append(buf)
            dst.buffer = len(model.buffers) - 1
            tensors_done.append(_name(dst))
        sub.operators = keep
    return [{"rule": "densify", "ops": "DENSIFY", "count": len(tensors_done),
             "why": "nnef-tools reads sparse buffers as dense ones; each sparse constant is expanded "
                    "at load and the DENSIFY op that LiteRT would run is removed",
             "tensors": tensors_done}]


# ----------------------------------------------------------------------------- fused activations
def _unfuse(model) -> list[dict]:
    """An op of UNFUSE with a fused activation: the op writes a new tensor, without activation, and
    the activation's builtin op (RELU, RELU_N1_TO_1, RELU6, TANH) computes the op's old output."""
    S = _schema()
    counts = {}
    for sub in model.subgraphs:
        ops = []
        for op in sub.operators:
            ops.append(op)
            b = _builtin(model.operatorCodes[op.opcodeIndex])
            act = getattr(op.builtinOptions, "fusedActivationFunction", 0) if b in UNFUSE else 0
            if not act:
                continue
            (y,) = (int(i) for i in op.outputs)
            name, code = ACTIVATION_OPS[act]
            pre = S.TensorT()
            pre.shape, pre.type = list(sub.tensors[y].shape), sub.tensors[y].type
            if sub.tensors[y].shapeSignature is not None:
                pre.shapeSignature = list(sub.tensors[y].shapeSignature)
            pre.name = f"{_name(sub.tensors[y])}/before_{name.lower()}".encode()
            model.buffers.append(S.BufferT())
            pre.buffer = len(model.buffers) - 1
            sub.tensors.append(pre)
            op.outputs = [len(sub.tensors) - 1]
            op.builtinOptions.fusedActivationFunction = 0
            activation = S.OperatorT()
            activation.opcodeIndex = _opcode(model, code)
            activation.inputs, activation.outputs = [len(sub.tensors) - 1], [y]
            ops.append(activation)
            key = f"{UNFUSE[b]}+{name}"
            counts[key] = counts.get(key, 0) + 1
        sub.operators = ops
    return [{"rule": "unfuse-activation", "ops": ", ".join(sorted(counts)), "count": sum(counts.values()),
             "why": "nnef-tools drops the fused activation of these ops silently (wrong numbers); "
                    "the activation becomes its own builtin op, which it converts",
             "by_op": dict(sorted(counts.items()))}]


def _drop_ignored(model) -> list[dict]:
    counts = {}
    for sub in model.subgraphs:
        for op in sub.operators:
            b = _builtin(model.operatorCodes[op.opcodeIndex])
            act = getattr(op.builtinOptions, "fusedActivationFunction", 0) if b in DROP_IGNORED else 0
            if act in IGNORED_ACTIVATIONS:
                op.builtinOptions.fusedActivationFunction = 0
                key = f"{DROP_IGNORED[b]}+{IGNORED_ACTIVATIONS[act]}"
                counts[key] = counts.get(key, 0) + 1
    return [{"rule": "drop-ignored-activation", "ops": ", ".join(sorted(counts)), "count": sum(counts.values()),
             "why": "LiteRT's kernels ignore a fused TANH or SIGN_BIT on these ops (activation range "
                    "lowest..max); nnef-tools would apply it, so it is dropped to keep LiteRT's numbers",
             "by_op": dict(sorted(counts.items()))}]


# ----------------------------------------------------------------------------- MediaPipe custom op
def transpose_conv_bias_params(options: bytes) -> dict:
    """MediaPipe's custom options: a TfLiteTransposeConvParams {padding, stride_width,
    stride_height[, activation, ...]} as little-endian int32."""
    if len(options) < 12:
        raise RewriteError(f"Convolution2DTransposeBias options are {len(options)} bytes, expected a "
                           f"TfLiteTransposeConvParams (>= 12)")
    padding, stride_w, stride_h = struct.unpack_from("<3i", options)
    extra = struct.unpack_from(f"<{(len(options) - 12) // 4}i", options, 12)
    if padding not in PADDING or stride_w < 1 or stride_h < 1 or (extra and extra[0] != 0):
        raise RewriteError(f"Convolution2DTransposeBias options {padding, stride_w, stride_h, *extra} "
                           f"are not a padding (1 SAME, 2 VALID), two strides and no activation")
    return {"padding": PADDING[padding], "stride_w": stride_w, "stride_h": stride_h}


def transpose_conv_bias_shape(in_hw, filter_hw, params) -> tuple[int, int]:
    """The output H, W MediaPipe's Prepare gives (transpose_conv_bias.cc)."""
    out = []
    for size, k, stride in zip(in_hw, filter_hw, (params["stride_h"], params["stride_w"])):
        pad = max(0, k - (size - 1) % stride - 1) if params["padding"] == "SAME" else 0
        out.append(stride * (size - 1) + k - pad)
    return tuple(out)


def transpose_conv_bias_reference(x, w, bias, params):
    """MediaPipe's Convolution2DTransposeBias in numpy, as its Eval computes it: NHWC x, OHWI w,
    padding (SAME) half of Prepare's total, floor; scatter-add from every input pixel, then bias."""
    import numpy as np  # numpy: 0.2 s, not needed by doit list
    n, h, wd, _ = x.shape
    o, kh, kw, _ = w.shape
    oh, ow = transpose_conv_bias_shape((h, wd), (kh, kw), params)
    sh, sw = params["stride_h"], params["stride_w"]
    ph = (sh * (h - 1) + kh - oh) // 2
    pw = (sw * (wd - 1) + kw - ow) // 2
    full = np.zeros((n, sh * (h - 1) + kh, sw * (wd - 1) + kw, o), np.float64)
    for fy in range(kh):
        for fx in range(kw):
            full[:, fy:fy + sh * h:sh, fx:fx + sw * wd:sw, :] += np.einsum(
                "nhwi,oi->nhwo", x.astype(np.float64), w[:, fy, fx, :].astype(np.float64))
    return (full[:, ph:ph + oh, pw:pw + ow, :] + bias.astype(np.float64)).astype(np.float32)


def _opcode(model, builtin: int, version: int = 1) -> int:
    S = _schema()
    for k, code in enumerate(model.operatorCodes):
        if _builtin(code) == builtin and not code.customCode:
            return k
    code = S.OperatorCodeT()
    code.builtinCode, code.deprecatedBuiltinCode, code.version = builtin, min(builtin, 127), version
    model.operatorCodes.append(code)
    return len(model.operatorCodes) - 1


def _transpose_conv_bias(model) -> list[dict]:
    import numpy as np  # numpy: 0.2 s, not needed by doit list
    S = _schema()
    rewritten = []
    for sub in model.subgraphs:
        ops = []
        for op in sub.operators:
            code = model.operatorCodes[op.opcodeIndex]
            if _builtin(code) != CUSTOM or code.customCode != b"Convolution2DTransposeBias":
                ops.append(op)
                continue
            x, w, bias = (int(i) for i in op.inputs)
            (y,) = (int(i) for i in op.outputs)
            params = transpose_conv_bias_params(bytes(np.asarray(op.customOptions, np.uint8)))
            xs, ws = [int(d) for d in sub.tensors[x].shape], [int(d) for d in sub.tensors[w].shape]
            oh, ow = transpose_conv_bias_shape(xs[1:3], ws[1:3], params)
            shape = [xs[0], oh, ow, ws[0]]
            if [int(d) for d in sub.tensors[y].shape] != shape:
                raise RewriteError(f"Convolution2DTransposeBias {_name(sub.tensors[y])!r}: the file says "
                                   f"output shape {list(sub.tensors[y].shape)}, MediaPipe's Prepare gives {shape}")
            buf = S.BufferT()
            buf.data = np.frombuffer(np.asarray(shape, "<i4").tobytes(), np.uint8)
            model.buffers.append(buf)
            shape_t = S.TensorT()
            shape_t.shape, shape_t.type, shape_t.buffer = [4], 2, len(model.buffers) - 1  # INT32
            shape_t.name = f"{_name(sub.tensors[y])}/output_shape".encode()
            sub.tensors.append(shape_t)
            conv_t = S.TensorT()
            conv_t.shape, conv_t.type = shape, sub.tensors[y].type
            conv_t.name = f"{_name(sub.tensors[y])}/transpose_conv".encode()
            model.buffers.append(S.BufferT())
            conv_t.buffer = len(model.buffers) - 1
            sub.tensors.append(conv_t)
            conv = S.OperatorT()
            conv.opcodeIndex = _opcode(model, TRANSPOSE_CONV)
            conv.inputs, conv.outputs = [len(sub.tensors) - 2, w, x], [len(sub.tensors) - 1]
            options = S.TransposeConvOptionsT()
            options.padding = 0 if params["padding"] == "SAME" else 1  # schema Padding: SAME 0, VALID 1
            options.strideW, options.strideH = params["stride_w"], params["stride_h"]
            conv.builtinOptionsType, conv.builtinOptions = S.BuiltinOptions.TransposeConvOptions, options
            add = S.OperatorT()
            add.opcodeIndex = _opcode(model, ADD)
            add.inputs, add.outputs = [len(sub.tensors) - 1, bias], [y]
            add.builtinOptionsType, add.builtinOptions = S.BuiltinOptions.AddOptions, S.AddOptionsT()
            ops += [conv, add]
            rewritten.append({"output": _name(sub.tensors[y]), **params, "output_shape": shape})
        sub.operators = ops
    return [{"rule": "Convolution2DTransposeBias->TRANSPOSE_CONV+ADD", "ops": "Convolution2DTransposeBias",
             "count": len(rewritten),
             "why": "MediaPipe's custom op, which neither LiteRT's builtins nor nnef-tools know, as the "
                    "builtins its source (transpose_conv_bias.cc) defines it by",
             "instances": rewritten}]


def _drop_unused_tensors(model) -> None:
    """Tensors no operator, graph input/output or signature refers to are dropped (the sparse
    originals): indices are renumbered, their buffers emptied when nothing else uses them."""
    for g, sub in enumerate(model.subgraphs):
        used = {int(i) for op in sub.operators for i in list(op.inputs) + list(op.outputs)
                + list(op.intermediates if op.intermediates is not None else []) if int(i) >= 0}
        used |= {int(i) for i in list(sub.inputs) + list(sub.outputs)}
        for sig in model.signatureDefs or []:
            if sig.subgraphIndex == g:
                used |= {int(t.tensorIndex) for t in list(sig.inputs or []) + list(sig.outputs or [])}
        if len(used) == len(sub.tensors):
            continue
        dropped = [t for i, t in enumerate(sub.tensors) if i not in used]
        new = {old: k for k, old in enumerate(sorted(used))}
        sub.tensors = [sub.tensors[i] for i in sorted(used)]

        def remap(xs):
            return [new[int(i)] if int(i) >= 0 else -1 for i in xs]
        for op in sub.operators:
            op.inputs, op.outputs = remap(op.inputs), remap(op.outputs)
            if op.intermediates is not None:
                op.intermediates = remap(op.intermediates)
        sub.inputs, sub.outputs = remap(sub.inputs), remap(sub.outputs)
        for sig in model.signatureDefs or []:
            if sig.subgraphIndex == g:
                for t in list(sig.inputs or []) + list(sig.outputs or []):
                    t.tensorIndex = new[int(t.tensorIndex)]
        still = {t.buffer for s in model.subgraphs for t in s.tensors}
        for t in dropped:
            if t.buffer and t.buffer not in still:
                model.buffers[t.buffer].data = None


# ----------------------------------------------------------------------------- checks
def _interpreter(data: bytes, preserve: bool = False, shapes: dict | None = None):
    """LiteRT on `data`, each input named in `shapes` resized to it first (a model whose inputs
    are all dynamic may not prepare at its stored 1x1)."""
    # LiteRT: 0.1 s, not needed by doit list
    from ai_edge_litert.interpreter import Interpreter, OpResolverType
    interp = Interpreter(model_content=data, num_threads=1, experimental_preserve_all_tensors=preserve,
                         experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    for d in interp.get_input_details():
        want = (shapes or {}).get(d["name"])
        if want is not None and list(d["shape"]) != list(want):
            interp.resize_tensor_input(d["index"], list(want), strict=True)
    interp.allocate_tensors()
    return interp


def _run(interp, seed: int = 0) -> list:
    """The model's outputs, in order, on fixed random inputs (uniform 0..1, seeded), given by
    position: tensor indices differ between a model and its rewrite."""
    import numpy as np  # numpy: 0.2 s, not needed by doit list
    rng = np.random.default_rng(seed)
    for d in interp.get_input_details():
        interp.set_tensor(d["index"], rng.uniform(0, 1, d["shape"]).astype(d["dtype"]))
    interp.invoke()
    return [interp.get_tensor(d["index"]).copy() for d in interp.get_output_details()]


def _tensor_indices(data: bytes) -> dict:
    """Tensor name -> index in the first subgraph, as the file names them (LiteRT renames some:
    a DENSIFY output becomes `Densify_output`)."""
    sub = _schema().Model.GetRootAs(data, 0).Subgraphs(0)
    return {sub.Tensors(i).Name().decode(): i for i in range(sub.TensorsLength())}


def check(original: bytes, rewritten: bytes, rewrites: list[dict], shapes: dict | None = None) -> list[dict]:
    """Check the rewrites with LiteRT; returns them with their `check` filled in, raises
    RewriteError when one does not hold. The reference is LiteRT on the original or, when it has a
    custom op LiteRT cannot run, on the original with only its custom ops rewritten (the golden model):
    - the whole model: the rewritten model's outputs equal the reference's, bit for bit, on a fixed
      random input (uniform 0..1, seed 0): this checks unfuse-activation and drop-ignored-activation;
    - densify: each densified constant equals what LiteRT's own DENSIFY made of the sparse tensor in
      the reference, bit for bit;
    - Convolution2DTransposeBias: each rewritten op's LiteRT output against a numpy reference of
      MediaPipe's definition on the very tensors LiteRT fed it.
    Inputs run at `shapes` (name -> dims) where given, else at their stored shapes."""
    import numpy as np  # numpy: 0.2 s, not needed by doit list
    if not rewrites:
        return rewrites
    custom = any(r["ops"] in CUSTOM_REWRITES for r in rewrites)
    reference = rewrite(original, only_custom=True)[0] if custom else original
    against = ("LiteRT on the original with its custom op(s) rewritten" if custom
               else "LiteRT on the original")
    new, old = _interpreter(rewritten, True, shapes), _interpreter(reference, True, shapes)
    got, want = _run(new), _run(old)
    worst = max(float(np.abs(a.astype(np.float64) - b).max()) if a.shape == b.shape else float("inf")
                for a, b in zip(got, want))
    if len(got) != len(want) or worst > 0:
        raise RewriteError(f"the rewritten model's LiteRT outputs differ from the original's by up to "
                           f"{worst:g} (expected identical)")
    names_old, names_new = _tensor_indices(reference), _tensor_indices(rewritten)
    checked = []
    for r in rewrites:
        r = dict(r)
        if r["rule"] == "densify":
            for t in r["tensors"]:
                a, b = old.get_tensor(names_old[t]), new.get_tensor(names_new[t])
                if a.shape != b.shape or not np.array_equal(a, b):
                    raise RewriteError(f"densified {t!r} differs from LiteRT's DENSIFY output")
            r["check"] = {"against": f"DENSIFY outputs of {against}", "max_abs": 0.0,
                          "model_outputs_max_abs": 0.0}
        elif r["rule"] in ("unfuse-activation", "drop-ignored-activation"):
            r["check"] = {"against": against, "model_outputs_max_abs": 0.0}
        elif r["rule"].startswith("Convolution2DTransposeBias"):
            r["check"] = _check_transpose_conv_bias(new, names_new, r["instances"])
        checked.append(r)
    return checked


def _check_transpose_conv_bias(interp, names: dict, instances: list[dict]) -> dict:
    import numpy as np  # numpy: 0.2 s, not needed by doit list
    worst = 0.0
    ops = interp._get_ops_details()
    for inst in instances:
        conv = next(d for d in ops if list(d["outputs"]) == [names[inst["output"] + "/transpose_conv"]])
        add = next(d for d in ops if list(d["outputs"]) == [names[inst["output"]]])
        _, w, x = (int(i) for i in conv["inputs"])
        want = transpose_conv_bias_reference(interp.get_tensor(x), interp.get_tensor(w),
                                             interp.get_tensor(int(add["inputs"][1])), inst)
        err = float(np.abs(interp.get_tensor(names[inst["output"]]).astype(np.float64) - want).max())
        if err > 1e-5 * max(1.0, float(np.abs(want).max())):
            raise RewriteError(f"rewritten Convolution2DTransposeBias {inst['output']!r} differs from "
                               f"MediaPipe's definition (numpy) by {err:g}")
        worst = max(worst, err)
    return {"against": "numpy reference of MediaPipe's transpose_conv_bias.cc, on LiteRT's tensors "
                       "(model input uniform 0..1, seed 0)", "max_abs": worst}


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
