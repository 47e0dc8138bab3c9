"""TFLite -> ONNX directly, op by op: the import stage's second TFLite route (sources.py tries it
when nnef-tools refuses a model or its conversion does not match LiteRT).

Why a converter of our own: nnef-tools 1.0.11 cannot take full-integer (uint8/int8) models, a
RESIZE_BILINEAR with a non-integer factor or align_corners, L2_NORMALIZATION over one axis, and
writes dilated SAME convolutions onnxruntime refuses; TVM's Relax TFLite frontend takes those but
yields no ONNX (the static stage, IREE and validation work on ONNX); tf2onnx converts them but
imports TensorFlow (1.3 GB installed, ~8 s a model): docs/measurements/2026-12-02-tflite-routes.md.

How it converts:
- tensors keep the TFLite layout (NHWC) and names: the interface is the source's, byte for byte
  in names, dtypes and shapes; spatial ops (convolutions, pools, resizes, DEPTH_TO_SPACE) are
  wrapped in Transposes to NCHW and back, and back-to-back Transposes that cancel are removed;
- a quantized tensor (int8/uint8/int32 with a scale) stays integer at the interface and between
  ops, as QDQ: an op reads DequantizeLinear of its operands, computes in float, and writes
  QuantizeLinear with its output's scale and zero point (per-channel weights keep their axis).
  IREE compiles QDQ and onnxruntime runs it with integer kernels (TOOLCHAIN.md);
- control flow: IF becomes ONNX If, each branch subgraph converted into the If's then/else graph
  (its inputs are the IF's operands, read from the outer scope; nested IFs likewise); the static
  stage folds it when the condition is known once the inputs are bound (fold-constant-if), else
  it stays an If, compiled as one (its branches must give one shape). WHILE becomes a Loop with
  no trip count, its condition subgraph inlined before it and at the end of its body (the static
  stage unrolls it when folding fixes the count: unroll-loop). CALL is refused by name;
- an op or an option outside the table below raises Unsupported naming the op, its index and why.
"""
from __future__ import annotations

import numpy as np
from ai_edge_litert import schema_py_generated as S
from onnx import helper, numpy_helper

OPSET = 17
ONNX_TYPES = {0: 1, 1: 10, 2: 6, 3: 2, 4: 7, 6: 9, 7: 5, 9: 3, 10: 11}  # TFLite -> onnx.TensorProto
NP_TYPES = {0: np.float32, 1: np.float16, 2: np.int32, 3: np.uint8, 4: np.int64, 6: np.bool_,
            7: np.int16, 9: np.int8, 10: np.float64}
TO_NCHW, TO_NHWC = [0, 3, 1, 2], [0, 2, 3, 1]
BIG = np.iinfo(np.int64).max


class Unsupported(Exception):
    """An op (or an option of it) this converter does not take: the message names both."""


def convert(data: bytes, graph_name: str = "tflite"):
    """The ONNX model (onnx.ModelProto) of a TFLite flatbuffer; raises Unsupported."""
    return _Converter(data).run(graph_name)


class _Converter:
    def __init__(self, data: bytes):
        self.model = S.ModelT.InitFromPackedBuf(data, 0)
        self.op_names = {v: k for k, v in vars(S.BuiltinOperator).items() if not k.startswith("_")}
        self.used, self.depth = set(), 0  # every ONNX name, the branches' too (no shadowing)
        self._enter(self.model.subgraphs[0], {})

    def _enter(self, sub, bound: dict) -> None:
        """Convert into subgraph `sub` from now on; `bound`: its tensors that are outer ONNX
        values (a branch's inputs: the IF's operands)."""
        self.sub, self.nodes, self.inits, self.names, self.cache = sub, [], [], dict(bound), {}
        self._name_tensors(sub, bound)

    def _name_tensors(self, sub, bound: dict) -> None:
        for i, t in enumerate(sub.tensors):  # unique ONNX names, the TFLite ones where free
            if i in bound:
                continue
            name = t.name.decode() if isinstance(t.name, bytes) else str(t.name)
            self.names[i] = name if name not in self.used else self.fresh(name) if self.depth else f"{name}__{i}"
            self.used.add(self.names[i])

    # ------------------------------------------------------------------ building blocks
    def fresh(self, hint: str) -> str:
        k = len(self.used)
        while f"{hint}__{k}" in self.used:
            k += 1
        self.used.add(f"{hint}__{k}")
        return f"{hint}__{k}"

    def node(self, op: str, inputs, outputs=None, **attrs) -> str:
        outputs = outputs or [self.fresh(op.lower())]
        self.nodes.append(helper.make_node(op, list(inputs), list(outputs), **attrs))
        return outputs[0]

    def constant(self, array, hint: str = "const") -> str:
        name = self.fresh(hint)
        self.inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def tensor(self, i: int):
        return self.sub.tensors[i]

    def array(self, i: int):
        """The constant value of tensor i (raw, as stored), or None."""
        t = self.tensor(i)
        data = self.model.buffers[t.buffer].data
        if data is None or t.type not in NP_TYPES:
            return None
        raw = np.asarray(data, np.uint8).tobytes()
        shape = [int(d) for d in (t.shape if t.shape is not None else [])]
        return np.frombuffer(raw, np.dtype(NP_TYPES[t.type]).newbyteorder("<")).reshape(shape)

    def quant(self, i: int):
        """(scale, zero point, axis) of a quantized tensor, else None."""
        t = self.tensor(i)
        q = t.quantization
        if q is None or q.scale is None or len(q.scale) == 0 or t.type not in (2, 3, 7, 9):
            return None
        scale = np.asarray(q.scale, np.float32)
        zero = np.asarray(q.zeroPoint if q.zeroPoint is not None else np.zeros(len(scale)), np.int64)
        return scale, zero.astype(NP_TYPES[t.type]), int(q.quantizedDimension) if scale.size > 1 else None

    def raw(self, i: int) -> str:
        """Tensor i as stored (a constant becomes an initializer)."""
        key = ("raw", i)
        if key not in self.cache:
            value = self.array(i)
            self.cache[key] = self.names[i] if value is None else self._init(value, self.names[i])
        return self.cache[key]

    def _init(self, value, name: str) -> str:
        self.inits.append(numpy_helper.from_array(np.array(value, order="C"), name))
        return name

    def value(self, i: int, perm=None) -> str:
        """Tensor i as float (DequantizeLinear of a quantized tensor; fp16 constants cast), its
        constant data transposed by `perm` first where given (weights into ONNX's layout)."""
        key = ("value", i, tuple(perm or ()))
        if key in self.cache:
            return self.cache[key]
        q, const = self.quant(i), self.array(i)
        if perm is not None and const is not None:
            name = self._init(np.transpose(const, perm), self.fresh(self.names[i]))
        elif perm is not None:
            name = self.node("Transpose", [self.value(i)], perm=list(perm))
            q = None
        else:
            name = self.raw(i)
        if q is not None:
            scale, zero, axis = q
            if axis is not None and perm is not None:
                axis = list(perm).index(axis)
            extra = {} if axis is None else {"axis": axis}
            scale = scale if axis is not None else scale.reshape(())
            zero = zero if axis is not None else zero.reshape(())
            name = self.node("DequantizeLinear", [name, self.constant(scale, "scale"),
                                                   self.constant(zero, "zero_point")], **extra)
        elif self.tensor(i).type == 1:
            name = self.node("Cast", [name], to=1)
        self.cache[key] = name
        return name

    def define(self, i: int, name: str) -> None:
        """Tensor i is the float value `name`: QuantizeLinear'd into it if it is quantized (its
        consumers then read DequantizeLinear of it, the QDQ round trip LiteRT's integer kernels
        make), else the value itself, under the tensor's name."""
        q = self.quant(i)
        if q is None:
            if self.tensor(i).type == 1:
                name = self.node("Cast", [name], to=10)
            last = self.nodes[-1] if self.nodes else None
            if last is not None and last.output[0] == name and name not in self.cache.values() \
                    and name not in self.names.values():  # a temporary: the op writes the tensor itself
                last.output[0] = self.names[i]
            else:
                self.node("Identity", [name], [self.names[i]])
            return
        scale, zero, axis = q
        if axis is not None:
            raise Unsupported(f"per-channel quantized activation {self.names[i]!r}")
        scale, zero = self.constant(scale.reshape(()), "scale"), self.constant(zero.reshape(()), "zero_point")
        self.node("QuantizeLinear", [name, scale, zero], [self.names[i]])
        self.cache[("value", i, ())] = self.node("DequantizeLinear", [self.names[i], scale, zero])

    def ints(self, i: int, what: str) -> list[int]:
        value = self.array(i)
        if value is None:
            raise Unsupported(f"{what} is computed at run time (only a constant {what} is converted)")
        return [int(v) for v in np.asarray(value).reshape(-1)]

    def int64(self, name: str, i: int) -> str:
        return name if self.tensor(i).type == 4 else self.node("Cast", [name], to=7)

    def activation(self, name: str, code: int) -> str:
        if code == 0:
            return name
        if code == 1:
            return self.node("Relu", [name])
        if code in (2, 3):
            lo, hi = (-1.0, 1.0) if code == 2 else (0.0, 6.0)
            return self.node("Clip", [name, self.constant(np.float32(lo)), self.constant(np.float32(hi))])
        raise Unsupported(f"fused activation {code} (TANH/SIGN_BIT: tflite_rewrite drops those LiteRT ignores)")

    # ------------------------------------------------------------------ run
    def _convert_op(self, k: int, op, where: str = "") -> None:
        code = self.model.operatorCodes[op.opcodeIndex]
        name = self.op_names.get(max(code.builtinCode, code.deprecatedBuiltinCode), "?")
        handler = getattr(self, f"op_{name}", None)
        if handler is None:
            raise Unsupported(f"op {name} ({where}operator #{k}) has no conversion here"
                              + (" (control flow: IF and WHILE are converted)" if name in
                                 ("CALL", "CALL_ONCE") else ""))
        try:
            handler(op, list(op.inputs), list(op.outputs), op.builtinOptions)
        except Unsupported as exc:
            if str(exc).startswith("op "):  # raised in a branch: it already names its op
                raise
            raise Unsupported(f"op {name} ({where}operator #{k}): {exc}") from None

    def run(self, graph_name: str):
        for k, op in enumerate(self.sub.operators):
            self._convert_op(k, op)
        _cancel_transposes(self.nodes, {self.names[i] for i in self.sub.outputs})
        graph = helper.make_graph(self.nodes, graph_name, [self.info(i) for i in self.sub.inputs],
                                  [self.info(i) for i in self.sub.outputs], initializer=self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                                  producer_name="modelyard tflite_onnx")
        model.ir_version = 8
        return model

    def info(self, i: int, name: str | None = None):
        """The ONNX value info of tensor i (its shape signature: -1 dims free)."""
        t = self.tensor(i)
        sig = t.shapeSignature if t.shapeSignature is not None and len(t.shapeSignature) else t.shape
        dims = [int(d) if int(d) >= 0 else None for d in (sig if sig is not None else [])]
        return helper.make_tensor_value_info(name or self.names[i], ONNX_TYPES[t.type], dims)

    # ------------------------------------------------------------------ control flow
    def _subgraph(self, index: int, given: int, where: str):
        """TFLite subgraph `index` (not the main one), refused unless it takes `given` inputs."""
        if not 0 < index < len(self.model.subgraphs):
            raise Unsupported(f"{where} subgraph #{index} does not exist")
        sub = self.model.subgraphs[index]
        if len(sub.inputs) != given:
            raise Unsupported(f"{where} subgraph #{index} takes {len(sub.inputs)} inputs, "
                              f"{given} are given")
        return sub

    def _branch(self, index: int, operands: list[int], where: str):
        """TFLite subgraph `index` as the body of an ONNX If branch: its inputs are the IF's
        operands (outer values, read from the outer scope: an ONNX branch has no inputs), its
        constants its own initializers, its outputs fresh names (a branch that passes an operand
        through gets an Identity). Nested IFs convert the same way."""
        sub = self._subgraph(index, len(operands), where)
        outer = (self.sub, self.nodes, self.inits, self.names, self.cache)
        bound = {i: self.raw(j) for i, j in zip(sub.inputs, operands)}
        self.depth += 1
        try:
            self._enter(sub, bound)
            for k, op in enumerate(sub.operators):
                self._convert_op(k, op, f"{where} subgraph #{index} ")
            results, infos = [], []
            for i in sub.outputs:
                name = self.names[i]
                if name in bound.values() or name in results:  # an operand passed through
                    name = self.node("Identity", [name], [self.fresh(f"{where}_out")])
                results.append(name)
                infos.append(self.info(i, name))
            _cancel_transposes(self.nodes, set(results))
            return helper.make_graph(self.nodes, f"{where}_{index}", [], infos, initializer=self.inits)
        finally:
            self.depth -= 1
            self.sub, self.nodes, self.inits, self.names, self.cache = outer

    def _inline(self, index: int, values: list[str], where: str) -> list[str]:
        """TFLite subgraph `index` converted into the graph being built (its nodes appended here),
        its inputs bound to the ONNX values `values`; returns its outputs' ONNX names."""
        sub = self._subgraph(index, len(values), where)
        outer = (self.sub, self.names, self.cache)
        self.depth += 1
        try:
            self.sub, self.names, self.cache = sub, dict(zip(sub.inputs, values)), {}
            self._name_tensors(sub, self.names)
            for k, op in enumerate(sub.operators):
                self._convert_op(k, op, f"{where} subgraph #{index} ")
            return [self.names[i] for i in sub.outputs]
        finally:
            self.depth -= 1
            self.sub, self.names, self.cache = outer

    def op_WHILE(self, op, ins, outs, o):
        """TFLite WHILE (cond subgraph, body subgraph, loop variables) -> ONNX Loop with no trip
        count: the condition subgraph inlined once on the initial values (the Loop's first
        condition) and once in the body after the body subgraph (the next one). The static stage
        unrolls it when its trip count is known after folding (unroll-loop), else names it."""
        scalar = self.constant(np.zeros(0, np.int64), "scalar")
        init = [self.raw(i) for i in ins]
        first = self.node("Reshape", [self._inline(o.condSubgraphIndex, init, "cond")[0], scalar])
        outer_nodes, outer_inits = self.nodes, self.inits
        self.nodes, self.inits = [], []
        try:
            carried = [self.fresh(f"{self.names[i]}_carried") for i in ins]
            step = self._inline(o.bodySubgraphIndex, carried, "body")
            again = self._inline(o.condSubgraphIndex, step, "cond")[0]
            results = [self.node("Reshape", [again, scalar], [self.fresh("while_cond")])]
            results += [self.node("Identity", [n], [self.fresh(f"{self.names[i]}_next")])
                        for n, i in zip(step, outs)]
            body = helper.make_graph(
                self.nodes, "while_body",
                [helper.make_tensor_value_info(self.fresh("iteration"), 7, []),
                 helper.make_tensor_value_info(self.fresh("cond_in"), 9, [])]
                + [self.info(i, n) for i, n in zip(ins, carried)],
                [helper.make_tensor_value_info(results[0], 9, [])]
                + [self.info(i, n) for i, n in zip(outs, results[1:])], initializer=self.inits)
        finally:
            self.nodes, self.inits = outer_nodes, outer_inits
        self.node("Loop", ["", first, *init], [self.names[i] for i in outs], body=body)

    def op_IF(self, op, ins, outs, o):
        """TFLite IF (cond, operands...) -> ONNX If over the two branch subgraphs; the outputs are
        the outer tensors as stored (a quantized output stays integer: its readers dequantize it).
        A condition known after binding the inputs is folded later (static: fold-constant-if); one
        that depends on data stays an If, whose branches must give outputs of one shape."""
        if self.tensor(ins[0]).type != 6:
            raise Unsupported("the condition is not a bool tensor")
        cond = self.node("Reshape", [self.raw(ins[0]), self.constant(np.zeros(0, np.int64), "scalar")])
        then = self._branch(o.thenSubgraphIndex, ins[1:], "then")
        other = self._branch(o.elseSubgraphIndex, ins[1:], "else")
        for k, (a, b) in enumerate(zip(then.output, other.output)):
            if a.type.tensor_type.elem_type != b.type.tensor_type.elem_type:
                raise Unsupported(f"output {k}: the branches give different dtypes")
        self.node("If", [cond], [self.names[i] for i in outs], then_branch=then, else_branch=other)

    # ------------------------------------------------------------------ convolutions and pools
    def _pads(self, shape_in, kernel, strides, dilations, padding) -> list[int]:
        """TFLite's SAME (total = what reaches ceil(in / stride), floor half first) or VALID."""
        if padding == 1:
            return [0] * 4
        begins, ends = [], []
        for size, k, s, d in zip(shape_in, kernel, strides, dilations):
            out = -(-size // s)
            total = max((out - 1) * s + (k - 1) * d + 1 - size, 0)
            begins.append(total // 2)
            ends.append(total - total // 2)
        return begins + ends

    def _spatial(self, x: int, out: int, build, act: int = 0) -> None:
        """NHWC tensor x -> Transpose -> build(nchw) -> fused activation -> Transpose -> out."""
        y = build(self.node("Transpose", [self.value(x)], perm=TO_NCHW))
        self.define(out, self.node("Transpose", [self.activation(y, act)], perm=TO_NHWC))

    def _conv(self, ins, outs, o, weights: str, group: int, kernel) -> None:
        strides, dil = [o.strideH, o.strideW], [o.dilationHFactor or 1, o.dilationWFactor or 1]
        pads = self._pads(self.tensor(ins[0]).shape[1:3], kernel, strides, dil, o.padding)
        bias = [self.value(ins[2])] if len(ins) > 2 and ins[2] >= 0 else []
        self._spatial(ins[0], outs[0], lambda x: self.node(
            "Conv", [x, weights, *bias], strides=strides, dilations=dil, pads=pads, group=group,
            kernel_shape=list(kernel)), o.fusedActivationFunction)

    def op_CONV_2D(self, op, ins, outs, o):
        w = self.tensor(ins[1]).shape  # O, KH, KW, I
        group = self.tensor(ins[0]).shape[3] // w[3]
        self._conv(ins, outs, o, self.value(ins[1], perm=[0, 3, 1, 2]), group, w[1:3])

    def op_DEPTHWISE_CONV_2D(self, op, ins, outs, o):
        w = self.tensor(ins[1]).shape  # 1, KH, KW, C * M: output channel c * M + m reads channel c
        self._conv(ins, outs, o, self.value(ins[1], perm=[3, 0, 1, 2]), self.tensor(ins[0]).shape[3], w[1:3])

    def op_TRANSPOSE_CONV(self, op, ins, outs, o):
        shape_out = self.ints(ins[0], "output shape")
        w, x = self.tensor(ins[1]).shape, self.tensor(ins[2]).shape  # w: O, KH, KW, I
        strides = [o.strideH, o.strideW]
        begins, ends, extra = [], [], []
        for a in range(2):
            full = (x[1 + a] - 1) * strides[a] + w[1 + a]
            total = max(full - shape_out[1 + a], 0) if o.padding == 0 else 0
            begins.append(total // 2)
            ends.append(total - total // 2)
            extra.append(shape_out[1 + a] - (full - total))
        if any(e < 0 for e in extra):
            raise Unsupported(f"output shape {shape_out} smaller than the padding allows")
        bias = [self.value(ins[3])] if len(ins) > 3 and ins[3] >= 0 else []
        attrs = {"output_padding": extra} if any(extra) else {}
        self._spatial(ins[2], outs[0], lambda v: self.node(
            "ConvTranspose", [v, self.value(ins[1], perm=[3, 0, 1, 2]), *bias], strides=strides,
            pads=begins + ends, kernel_shape=list(w[1:3]), **attrs),
            getattr(o, "fusedActivationFunction", 0))

    def _pool(self, kind: str, ins, outs, o) -> None:
        kernel, strides = [o.filterHeight, o.filterWidth], [o.strideH, o.strideW]
        pads = self._pads(self.tensor(ins[0]).shape[1:3], kernel, strides, [1, 1], o.padding)
        extra = {"count_include_pad": 0} if kind == "AveragePool" else {}
        self._spatial(ins[0], outs[0], lambda x: self.node(
            kind, [x], kernel_shape=kernel, strides=strides, pads=pads, **extra), o.fusedActivationFunction)

    def op_AVERAGE_POOL_2D(self, op, ins, outs, o):
        self._pool("AveragePool", ins, outs, o)

    def op_MAX_POOL_2D(self, op, ins, outs, o):
        self._pool("MaxPool", ins, outs, o)

    def op_FULLY_CONNECTED(self, op, ins, outs, o):
        w = self.tensor(ins[1]).shape  # O, K
        if o is not None and o.weightsFormat != 0:
            raise Unsupported("shuffled weights format")
        x = self.node("Reshape", [self.value(ins[0]), self.constant(np.array([-1, w[1]], np.int64))])
        bias = [self.value(ins[2])] if len(ins) > 2 and ins[2] >= 0 else []
        y = self.node("Gemm", [x, self.value(ins[1]), *bias], transB=1)
        shape = list(self.tensor(outs[0]).shape)
        if len(shape) != 2:
            y = self.node("Reshape", [y, self.constant(np.array([-1, *shape[1:]], np.int64))])
        self.define(outs[0], self.activation(y, o.fusedActivationFunction if o else 0))

    def op_BATCH_MATMUL(self, op, ins, outs, o):
        operands = [self.value(ins[0]), self.value(ins[1])]
        for k, flag in enumerate((o.adjX, o.adjY)):
            if flag:  # the operand's last two axes swapped
                rank = len(self.tensor(ins[k]).shape)
                operands[k] = self.node("Transpose", [operands[k]], perm=[*range(rank - 2), rank - 1, rank - 2])
        self.define(outs[0], self.node("MatMul", operands))

    # ------------------------------------------------------------------ elementwise
    def _binary(self, kind: str, ins, outs, o) -> None:
        y = self.node(kind, [self.value(ins[0]), self.value(ins[1])])
        self.define(outs[0], self.activation(y, getattr(o, "fusedActivationFunction", 0) if o else 0))

    def _unary(self, kind: str, ins, outs, **attrs) -> None:
        self.define(outs[0], self.node(kind, [self.value(ins[0])], **attrs))

    def op_ADD(self, op, ins, outs, o): self._binary("Add", ins, outs, o)
    def op_SUB(self, op, ins, outs, o): self._binary("Sub", ins, outs, o)
    def op_MUL(self, op, ins, outs, o): self._binary("Mul", ins, outs, o)
    def op_DIV(self, op, ins, outs, o): self._binary("Div", ins, outs, o)
    def op_POW(self, op, ins, outs, o): self._binary("Pow", ins, outs, o)
    def op_MAXIMUM(self, op, ins, outs, o): self._binary("Max", ins, outs, o)
    def op_MINIMUM(self, op, ins, outs, o): self._binary("Min", ins, outs, o)
    def op_LESS(self, op, ins, outs, o): self._binary("Less", ins, outs, None)
    def op_GREATER(self, op, ins, outs, o): self._binary("Greater", ins, outs, None)
    def op_EQUAL(self, op, ins, outs, o): self._binary("Equal", ins, outs, None)
    def op_GREATER_EQUAL(self, op, ins, outs, o): self._binary("GreaterOrEqual", ins, outs, None)
    def op_LESS_EQUAL(self, op, ins, outs, o): self._binary("LessOrEqual", ins, outs, None)

    def op_NOT_EQUAL(self, op, ins, outs, o):
        self.define(outs[0], self.node("Not", [self.node("Equal", [self.value(ins[0]), self.value(ins[1])])]))
    def op_LOGICAL_AND(self, op, ins, outs, o): self._binary("And", ins, outs, None)
    def op_LOGICAL_OR(self, op, ins, outs, o): self._binary("Or", ins, outs, None)
    def op_PRELU(self, op, ins, outs, o): self._binary("PRelu", ins, outs, None)

    def op_SQUARED_DIFFERENCE(self, op, ins, outs, o):
        d = self.node("Sub", [self.value(ins[0]), self.value(ins[1])])
        self.define(outs[0], self.node("Mul", [d, d]))

    def op_RELU(self, op, ins, outs, o): self.define(outs[0], self.activation(self.value(ins[0]), 1))
    def op_RELU_N1_TO_1(self, op, ins, outs, o): self.define(outs[0], self.activation(self.value(ins[0]), 2))
    def op_RELU6(self, op, ins, outs, o): self.define(outs[0], self.activation(self.value(ins[0]), 3))
    def op_LOGISTIC(self, op, ins, outs, o): self._unary("Sigmoid", ins, outs)
    def op_TANH(self, op, ins, outs, o): self._unary("Tanh", ins, outs)
    def op_HARD_SWISH(self, op, ins, outs, o): self._unary("HardSwish", ins, outs)
    def op_EXP(self, op, ins, outs, o): self._unary("Exp", ins, outs)
    def op_LOG(self, op, ins, outs, o): self._unary("Log", ins, outs)
    def op_SQRT(self, op, ins, outs, o): self._unary("Sqrt", ins, outs)
    def op_ABS(self, op, ins, outs, o): self._unary("Abs", ins, outs)
    def op_NEG(self, op, ins, outs, o): self._unary("Neg", ins, outs)
    def op_FLOOR(self, op, ins, outs, o): self._unary("Floor", ins, outs)
    def op_ELU(self, op, ins, outs, o): self._unary("Elu", ins, outs)
    def op_LOGICAL_NOT(self, op, ins, outs, o): self._unary("Not", ins, outs)
    def op_DEQUANTIZE(self, op, ins, outs, o): self.define(outs[0], self.value(ins[0]))
    def op_QUANTIZE(self, op, ins, outs, o): self.define(outs[0], self.value(ins[0]))

    def op_RELU_0_TO_1(self, op, ins, outs, o):
        self.define(outs[0], self.node("Clip", [self.value(ins[0]), self.constant(np.float32(0)),
                                                self.constant(np.float32(1))]))

    def op_RSQRT(self, op, ins, outs, o):
        self.define(outs[0], self.node("Reciprocal", [self.node("Sqrt", [self.value(ins[0])])]))

    def op_SQUARE(self, op, ins, outs, o):
        x = self.value(ins[0])
        self.define(outs[0], self.node("Mul", [x, x]))

    def op_LEAKY_RELU(self, op, ins, outs, o):
        self._unary("LeakyRelu", ins, outs, alpha=float(o.alpha))

    def op_CAST(self, op, ins, outs, o):
        self.define(outs[0], self.node("Cast", [self.value(ins[0])], to=ONNX_TYPES[self.tensor(outs[0]).type]))

    def op_SELECT_V2(self, op, ins, outs, o):
        self.define(outs[0], self.node("Where", [self.value(k) for k in ins]))

    op_SELECT = op_SELECT_V2

    # ------------------------------------------------------------------ normalisation, softmax
    def op_SOFTMAX(self, op, ins, outs, o):
        x = self.value(ins[0])
        if o.beta != 1.0:
            x = self.node("Mul", [x, self.constant(np.float32(o.beta))])
        self.define(outs[0], self.node("Softmax", [x], axis=-1))

    def op_LOG_SOFTMAX(self, op, ins, outs, o):
        self._unary("LogSoftmax", ins, outs, axis=-1)

    def op_L2_NORMALIZATION(self, op, ins, outs, o):
        """TFLite's kernel: x / max(sqrt(sum(x^2)), 1e-6) over the last axis (LpNormalization has
        no epsilon: a zero vector would give NaN)."""
        x = self.value(ins[0])
        norm = self.node("ReduceL2", [x], axes=[-1], keepdims=1)
        norm = self.node("Max", [norm, self.constant(np.float32(1e-6))])
        self.define(outs[0], self.activation(self.node("Div", [x, norm]),
                                             o.fusedActivationFunction if o else 0))

    def _reduce(self, kind: str, ins, outs, o) -> None:
        axes = self.ints(ins[1], "axes")
        keep = int(bool(o.keepDims)) if o else 0
        if kind == "ReduceSum":
            y = self.node(kind, [self.value(ins[0]), self.constant(np.array(axes, np.int64))], keepdims=keep)
        else:
            y = self.node(kind, [self.value(ins[0])], axes=axes, keepdims=keep)
        self.define(outs[0], y)

    def op_MEAN(self, op, ins, outs, o): self._reduce("ReduceMean", ins, outs, o)
    def op_SUM(self, op, ins, outs, o): self._reduce("ReduceSum", ins, outs, o)
    def op_REDUCE_MAX(self, op, ins, outs, o): self._reduce("ReduceMax", ins, outs, o)
    def op_REDUCE_MIN(self, op, ins, outs, o): self._reduce("ReduceMin", ins, outs, o)
    def op_REDUCE_PROD(self, op, ins, outs, o): self._reduce("ReduceProd", ins, outs, o)

    def _arg(self, kind, ins, outs):
        (axis,) = self.ints(ins[1], "axis")
        y = self.node(kind, [self.value(ins[0])], axis=axis, keepdims=0)
        self.define(outs[0], self.node("Cast", [y], to=ONNX_TYPES[self.tensor(outs[0]).type]))

    def op_ARG_MAX(self, op, ins, outs, o): self._arg("ArgMax", ins, outs)
    def op_ARG_MIN(self, op, ins, outs, o): self._arg("ArgMin", ins, outs)

    # ------------------------------------------------------------------ resizing
    def _resize(self, ins, outs, mode: str, coordinates: str, **extra) -> None:
        size = self.ints(ins[1], "size")

        def build(x):
            batch_channels = self.node("Slice", [self.node("Shape", [x]), self.constant(np.array([0], np.int64)),
                                                 self.constant(np.array([2], np.int64))])
            sizes = self.node("Concat", [batch_channels, self.constant(np.array(size, np.int64))], axis=0)
            return self.node("Resize", [x, "", "", sizes], mode=mode,
                             coordinate_transformation_mode=coordinates, **extra)
        self._spatial(ins[0], outs[0], build)

    def op_RESIZE_BILINEAR(self, op, ins, outs, o):
        mode = "align_corners" if o.alignCorners else "half_pixel" if o.halfPixelCenters else "asymmetric"
        self._resize(ins, outs, "linear", mode)

    def op_RESIZE_NEAREST_NEIGHBOR(self, op, ins, outs, o):
        if o.alignCorners:
            self._resize(ins, outs, "nearest", "align_corners", nearest_mode="round_prefer_ceil")
        elif o.halfPixelCenters:
            self._resize(ins, outs, "nearest", "tf_half_pixel_for_nn", nearest_mode="round_prefer_ceil")
        else:
            self._resize(ins, outs, "nearest", "asymmetric", nearest_mode="floor")

    def op_DEPTH_TO_SPACE(self, op, ins, outs, o):
        self._spatial(ins[0], outs[0], lambda x: self.node("DepthToSpace", [x], blocksize=o.blockSize, mode="DCR"))

    def op_SPACE_TO_DEPTH(self, op, ins, outs, o):
        self._spatial(ins[0], outs[0], lambda x: self.node("SpaceToDepth", [x], blocksize=o.blockSize))

    # ------------------------------------------------------------------ shapes and data movement
    def op_RESHAPE(self, op, ins, outs, o):
        if len(ins) > 1 and ins[1] >= 0 and self.array(ins[1]) is None:  # computed at run time
            shape = self.int64(self.value(ins[1]), ins[1])
        else:
            dims = self.ints(ins[1], "shape") if len(ins) > 1 and ins[1] >= 0 else list(o.newShape)
            shape = self.constant(np.array(dims, np.int64))
        self.define(outs[0], self.node("Reshape", [self.value(ins[0]), shape]))

    def op_SQUEEZE(self, op, ins, outs, o):
        shape_in = self.tensor(ins[0]).shape
        axes = list(o.squeezeDims) if o is not None and o.squeezeDims is not None and len(o.squeezeDims) \
            else [a for a, d in enumerate(shape_in) if d == 1]
        self.define(outs[0], self.node("Squeeze", [self.value(ins[0]), self.constant(np.array(axes, np.int64))]))

    def op_EXPAND_DIMS(self, op, ins, outs, o):
        axes = self.ints(ins[1], "axis")
        self.define(outs[0], self.node("Unsqueeze", [self.value(ins[0]), self.constant(np.array(axes, np.int64))]))

    def op_SHAPE(self, op, ins, outs, o):
        y = self.node("Shape", [self.value(ins[0])])
        self.define(outs[0], y if self.tensor(outs[0]).type == 4 else self.node("Cast", [y], to=6))

    def op_STRIDED_SLICE(self, op, ins, outs, o):
        if o.ellipsisMask or o.newAxisMask or getattr(o, "offset", False):
            raise Unsupported("ellipsis_mask, new_axis_mask or offset set")
        begin, end, strides = (self.ints(k, w) for k, w in zip(ins[1:4], ("begin", "end", "strides")))
        starts, ends, shrink = [], [], []
        for a, (b, e, s) in enumerate(zip(begin, end, strides)):
            if o.shrinkAxisMask >> a & 1:
                starts.append(b)
                ends.append(b + 1 if b != -1 else BIG)
                shrink.append(a)
                continue
            starts.append((0 if s > 0 else BIG) if o.beginMask >> a & 1 else b)
            ends.append((BIG if s > 0 else -BIG) if o.endMask >> a & 1 else e)
        c = lambda v: self.constant(np.array(v, np.int64))  # noqa: E731
        y = self.node("Slice", [self.value(ins[0]), c(starts), c(ends), c(list(range(len(begin)))), c(strides)])
        if shrink:
            y = self.node("Squeeze", [y, c(shrink)])
        self.define(outs[0], y)

    def op_SLICE(self, op, ins, outs, o):
        begin, size = self.ints(ins[1], "begin"), self.ints(ins[2], "size")
        ends = [BIG if s == -1 else b + s for b, s in zip(begin, size)]
        c = lambda v: self.constant(np.array(v, np.int64))  # noqa: E731
        self.define(outs[0], self.node("Slice", [self.value(ins[0]), c(begin), c(ends), c(list(range(len(begin))))]))

    def op_PACK(self, op, ins, outs, o):
        axis = self.constant(np.array([o.axis], np.int64))
        parts = [self.node("Unsqueeze", [self.value(k), axis]) for k in ins]
        self.define(outs[0], self.node("Concat", parts, axis=o.axis))

    def op_UNPACK(self, op, ins, outs, o):
        parts = [self.fresh("unpack") for _ in outs]
        self.node("Split", [self.value(ins[0])], parts, axis=o.axis)
        axis = self.constant(np.array([o.axis], np.int64))
        for k, p in zip(outs, parts):
            self.define(k, self.node("Squeeze", [p, axis]))

    def op_CONCATENATION(self, op, ins, outs, o):
        y = self.node("Concat", [self.value(k) for k in ins], axis=o.axis)
        self.define(outs[0], self.activation(y, o.fusedActivationFunction))

    def op_SPLIT(self, op, ins, outs, o):
        (axis,) = self.ints(ins[0], "axis")
        parts = [self.fresh("split") for _ in outs]
        self.node("Split", [self.value(ins[1])], parts, axis=axis)
        for k, p in zip(outs, parts):
            self.define(k, p)

    def op_SPLIT_V(self, op, ins, outs, o):
        sizes, (axis,) = self.ints(ins[1], "size_splits"), self.ints(ins[2], "axis")
        parts = [self.fresh("split") for _ in outs]
        self.node("Split", [self.value(ins[0]), self.constant(np.array(sizes, np.int64))], parts, axis=axis)
        for k, p in zip(outs, parts):
            self.define(k, p)

    def op_TRANSPOSE(self, op, ins, outs, o):
        self.define(outs[0], self.node("Transpose", [self.value(ins[0])], perm=self.ints(ins[1], "perm")))

    def op_GATHER(self, op, ins, outs, o):
        if o.batchDims:
            raise Unsupported(f"batch_dims {o.batchDims}")
        self.define(outs[0], self.node("Gather", [self.value(ins[0]), self.raw(ins[1])], axis=o.axis))

    def op_TILE(self, op, ins, outs, o):
        self.define(outs[0], self.node("Tile", [self.value(ins[0]), self.int64(self.raw(ins[1]), ins[1])]))

    def op_BROADCAST_TO(self, op, ins, outs, o):
        self.define(outs[0], self.node("Expand", [self.value(ins[0]), self.int64(self.raw(ins[1]), ins[1])]))

    def _pad(self, ins, outs, mode: str, value=None) -> None:
        pads = np.array(self.ints(ins[1], "paddings"), np.int64).reshape(-1, 2)
        args = [self.value(ins[0]), self.constant(np.concatenate([pads[:, 0], pads[:, 1]]))]
        if value is not None:
            args.append(value)
        self.define(outs[0], self.node("Pad", args, mode=mode))

    def op_PAD(self, op, ins, outs, o):
        self._pad(ins, outs, "constant")

    def op_PADV2(self, op, ins, outs, o):
        scalar = self.constant(np.array([], np.int64))
        self._pad(ins, outs, "constant", self.node("Reshape", [self.value(ins[2]), scalar]))

    def op_MIRROR_PAD(self, op, ins, outs, o):
        if o.mode != 0:
            raise Unsupported("SYMMETRIC mirror padding (ONNX Pad has reflect, edge, constant)")
        self._pad(ins, outs, "reflect")


def _cancel_transposes(nodes, outputs: set) -> None:
    """Remove Transpose pairs that undo each other (NCHW -> NHWC -> NCHW between two spatial ops)
    where the first feeds only the second: the second's consumers read the first's input."""
    consumers = {}
    for n in nodes:
        for i in n.input:
            consumers[i] = consumers.get(i, 0) + 1
    produced = {o: n for n in nodes for o in n.output}
    rename, drop = {}, set()
    for n in nodes:
        if n.op_type != "Transpose":
            continue
        first = produced.get(n.input[0])
        if first is None or first.op_type != "Transpose" or consumers.get(first.output[0]) != 1 \
                or first.output[0] in outputs or n.output[0] in outputs or id(first) in drop:
            continue
        p = list(first.attribute[0].ints)
        q = list(n.attribute[0].ints)
        if [p[k] for k in q] == list(range(len(p))):
            rename[n.output[0]] = first.input[0]
            drop.update({id(n), id(first)})
    if not rename:
        return
    kept = [n for n in nodes if id(n) not in drop]

    def resolve(name):
        while name in rename:
            name = rename[name]
        return name
    for n in kept:
        n.input[:] = [resolve(i) for i in n.input]
    nodes[:] = kept
