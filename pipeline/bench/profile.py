"""`doit profile target=T model=NAME [abi=A]`: where an artifact's time goes, op by op, beside
onnxruntime's own per-node profile of the same static model.

For each artifact of the model that runs natively here (IREE llvm-cpu `.vmfb`, TVM `.so`; the
same selection as `doit bench`) and for onnxruntime, each with the bench's thread count:

  IREE         `iree-benchmark-module --dispatch_statistics` on the shipped bytes: the time per
               iteration of every dispatch function (the runtime's own HAL profiling).
               Mapping ("locations"): the static model, through the graph rewrites the artifact's
               build applied (workarounds, pinned config), is imported again with its ONNX node
               names kept as MLIR locations and compiled with the artifact's exact flags up to its
               executable sources (`--compile-to=executable-sources --mlir-print-debuginfo`);
               each dispatch's call sites carry the nodes it computes (a rewrite's own nodes,
               `<node>__<part>`, count as the node they replaced). A dispatch that does not
               appear there falls back to "kind+shape" (its name's op kind and dims).
  TVM          each kernel call of one run of the VM (its instrument hook), timed on its own
               arguments with TVM's `time_evaluator` (0.27 has no VM profiler). Mapping
               ("values"): a kernel maps to the ONNX node whose output (onnxruntime's value on the
               golden inputs) its own output equals, and the nodes between it and the kernel's
               inputs (a fused kernel); a kernel whose output matches none (a Conv before its
               bias, a padding) belongs to the kernel that reads its output ("dataflow").
  onnxruntime  `SessionOptions.enable_profiling` on the static model, per node of its optimised
               graph; nodes are mapped back through that graph's tensors (an NCHWc Conv fused with
               its Relu maps to both; a layout reorder maps to none).

Runtimes take turns, `rounds` times, `iterations` runs each, so that load from elsewhere hits all
of them. Each entry's time is counted under one ONNX op kind (`category`: its main node, a Conv
split into depthwise / pointwise / dense / grouped), which gives the aggregate per op kind that
says which graph rewrite would pay. Written to reports/profile/<target>/<model>/profile.json.

Also `python -m pipeline.bench.profile import-onnx SRC DST`: iree-import-onnx with locations.
"""
from __future__ import annotations

import importlib.util
import itertools
import json
import math
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from ..compilers.backends import BY_FORMAT
from ..compilers.iree_backend import IREE
from ..compilers.iree_compiler import find_compiler
from ..compilers.tvm_backend import TVM
from ..core.errors import PipelineError
from ..core.layout import Layout
from ..core.store import atomic_write_text, pretty_json, sha256_file
from ..core.tools import (cpu_model, describe_exit, distribution_version, python_module_argv,
                          run_tool, tail)
from ..rewrite.abi_rewrites import apply as apply_rewrites
from ..run.ort import reduced_session
from ..run.tvm_run import TvmModule
from ..stages.iree_compile import graph_rewrites

SCHEMA = "modelyard.profile/1"
STAGE = "profile"
VARS = ("abi", "iterations", "rounds", "warmup", "threads")
ORT = "onnxruntime"
TOP = 10
FLOAT_TYPES = (1, 10, 11, 16)  # onnx TensorProto FLOAT, FLOAT16, DOUBLE, BFLOAT16
CRASH_RETRIES = 3    # iree-benchmark-module runs that died of a signal, run again (see round())
IREE_WARMUP_S = 0.1  # iree-benchmark-module's warm-up (seconds) before each round's iterations

# An entry's main node is the first of its nodes of the lowest rank: the heavy op a fused
# kernel is built around, not the activation fused after it.
HEAVY = {"Conv", "ConvTranspose", "MatMul", "Gemm", "Einsum", "LSTM", "GRU", "RNN", "Attention"}
ELEMENTWISE = {"Add", "Sub", "Mul", "Div", "Relu", "Clip", "Sigmoid", "HardSigmoid", "HardSwish",
               "Erf", "PRelu", "LeakyRelu", "Tanh", "Exp", "Log", "Sqrt", "Pow", "Neg", "Abs",
               "Max", "Min", "Where", "Cast", "Identity", "Not", "Equal", "Less", "Greater",
               "QuantizeLinear", "DequantizeLinear", "Elu", "Selu", "Softplus", "Gelu", "Floor",
               "Ceil", "Round", "Reciprocal", "BatchNormalization", "Dropout"}

# Kinds in IREE's dispatch names -> the ONNX ops such a dispatch can compute (kind+shape fallback).
DISPATCH_KINDS = {
    "conv": HEAVY, "matmul": HEAVY, "matmul_like": HEAVY, "batch_matmul": HEAVY, "mmt4d": HEAVY,
    "matvec": HEAVY, "matvec_like": HEAVY, "batch_matvec": HEAVY,
    "reduction": {"GlobalAveragePool", "ReduceMean", "ReduceSum", "ReduceMax", "AveragePool",
                  "MaxPool", "Softmax", "LayerNormalization"},
    "pooling": {"MaxPool", "AveragePool", "GlobalAveragePool"},
    "softmax": {"Softmax", "LogSoftmax"},
}
LAYOUT_KINDS = ("encode", "decode", "slow_memcpy", "pack", "unpack")  # compiler-made data movement


# ----------------------------------------------------------------------------- options
@dataclass(frozen=True)
class Options:
    """What one `doit profile` run is asked to do (doit vars of the same names)."""
    abi: str | None = None       # one ABI of the model (default: every one that runs here)
    iterations: int = 10         # runs per runtime per round
    rounds: int = 3              # the runtimes take turns this many times
    warmup: int = 2              # untimed runs of each runtime first
    threads: int | None = None   # CPU threads, all runtimes (default: every usable CPU, as the bench)

    def __post_init__(self):
        bad = [f"{k}={getattr(self, k)}: must be >= {low}" for k, low in
               (("iterations", 1), ("rounds", 1), ("warmup", 0)) if getattr(self, k) < low]
        if self.threads is not None and self.threads < 1:
            bad.append(f"threads={self.threads}: must be >= 1")
        if bad:
            raise PipelineError("bad profile options: " + "; ".join(bad), stage=STAGE,
                                hint="e.g. doit profile target=host model=ppocr_cls iterations=10 "
                                     "rounds=3")

    @classmethod
    def from_vars(cls, raw: dict) -> "Options":
        kw = {}
        for name, value in raw.items():
            if value is None:
                continue
            try:
                kw[name] = value if name == "abi" else int(value)
            except ValueError:
                raise PipelineError(f"profile option {name}={value!r} is not valid", stage=STAGE,
                                    hint="iterations, rounds, warmup and threads take integers"
                                    ) from None
        return cls(**kw)

    def usable_threads(self) -> int:
        return self.threads or len(os.sched_getaffinity(0))


# ----------------------------------------------------------------------------- the ONNX graph
@dataclass(frozen=True)
class Node:
    name: str
    op: str
    index: int                          # position among the graph's nodes (Constant left out)
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    category: str                       # the op kind its time is counted under


@dataclass
class Graph:
    """The static model's computing nodes in graph order (Constant nodes are weights)."""
    nodes: list[Node]
    shapes: dict[str, tuple] = field(default_factory=dict)  # tensor -> static shape
    types: dict[str, int] = field(default_factory=dict)     # tensor -> ONNX element type

    def __post_init__(self):
        self.by_name = {n.name: n for n in self.nodes}
        self.producer = {t: n for n in self.nodes for t in n.outputs}

    def known(self, name: str) -> str | None:
        """The graph node `name` stands for: itself, or for a node a graph rewrite put in its
        place (`<node>__<part>`, pipeline/rewrite/abi_rewrites.py) the node it replaced."""
        while name not in self.by_name and "__" in name:
            name = name.rsplit("__", 1)[0]
        return name if name in self.by_name else None

    def ordered(self, names) -> list[str]:
        """Known node names (see `known`), once each, in graph order."""
        found = {self.known(n) for n in names} - {None}
        return sorted(found, key=lambda n: self.by_name[n].index)

    def main(self, names, heavy: bool = True) -> Node | None:
        """The node an entry's time counts under: the first of the lowest rank (heavy=False:
        a kernel that is no convolution or matmul, its bias or activation aside)."""
        nodes = [self.by_name[n] for n in self.ordered(names)]
        if not heavy:
            nodes = [n for n in nodes if n.op not in HEAVY] or nodes
        return min(nodes, key=lambda n: (rank(n.op), n.index), default=None)

    def category(self, names, otherwise: str, heavy: bool = True) -> str:
        node = self.main(names, heavy)
        return node.category if node else otherwise

    def between(self, outputs, inputs, limit: int = 16) -> list[str]:
        """The nodes that compute tensors `outputs` from tensors `inputs`: the outputs'
        producers and their ancestors, up to `inputs` (and weights, model inputs). A walk that
        does not end within `limit` nodes (an input not known) gives the producers only."""
        stop = set(inputs)
        todo = [self.producer[t] for t in outputs if t in self.producer]
        seen: set[str] = set()
        while todo and len(seen) <= limit:
            node = todo.pop()
            if node.name not in seen:
                seen.add(node.name)
                todo += [self.producer[i] for i in node.inputs if i not in stop and i in self.producer]
        if len(seen) > limit:
            seen = {self.producer[t].name for t in outputs if t in self.producer}
        return self.ordered(seen)


def rank(op: str) -> int:
    return 0 if op in HEAVY else 2 if op in ELEMENTWISE else 1


def conv_category(group: int, weight_shape, in_channels) -> str:
    """Conv depthwise (one filter per input channel), grouped, pointwise (1x1) or dense."""
    if group > 1:
        return "Conv depthwise" if in_channels in (group, None) and (
            not weight_shape or weight_shape[1] == 1) else "Conv grouped"
    kernel = list(weight_shape[2:]) if weight_shape else []
    return "Conv pointwise" if kernel and all(k == 1 for k in kernel) else "Conv dense"


def named(model) -> None:
    """Give every unnamed node a name (`<op>#<index>`): the names carry the mapping."""
    taken = {n.name for n in model.graph.node}
    for k, node in enumerate(model.graph.node):
        if not node.name:
            name = f"{node.op_type}#{k}"
            while name in taken:
                name += "_"
            node.name = name
            taken.add(name)


def load_graph(model) -> Graph:
    """The Graph of an ONNX model proto (named: see `named`), static shapes inferred."""
    import onnx  # onnx: 1.5 s, not needed by doit list
    inferred = onnx.shape_inference.infer_shapes(model)
    shapes, types = {}, {}
    for vi in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]:
        if vi.type.HasField("tensor_type"):
            types[vi.name] = vi.type.tensor_type.elem_type
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape"):
            dims = [d.dim_value if d.HasField("dim_value") else None
                    for d in vi.type.tensor_type.shape.dim]
            if None not in dims:
                shapes[vi.name] = tuple(dims)
    shapes.update({i.name: tuple(i.dims) for i in model.graph.initializer})
    nodes = []
    for node in model.graph.node:
        if node.op_type == "Constant":
            continue
        category = node.op_type
        if node.op_type == "Conv":
            group = next((a.i for a in node.attribute if a.name == "group"), 1)
            x = shapes.get(node.input[0])
            category = conv_category(group, shapes.get(node.input[1]), x[1] if x else None)
        nodes.append(Node(node.name, node.op_type, len(nodes), tuple(node.input),
                          tuple(o for o in node.output if o), category))
    return Graph(nodes, shapes, types)


# ----------------------------------------------------------------------------- IREE
_DIMS = re.compile(r"_(\d+(?:x\d+)*)(?:x|_)(bf16|[fiu]\d+)")


def parse_dispatch(name: str) -> dict:
    """An IREE dispatch function's name, read: `main$async_dispatch_58_conv_2x160x200x5x5_f32` ->
    ordinal 58, kind conv, dims [2, 160, 200, 5, 5], dtype f32; `_encoding_37_encode_32x960xf32_to_...`
    -> kind encode (a data-tiling relayout); `..._slow_memcpy` -> kind slow_memcpy."""
    m = re.match(r"^(?:.*\$async_dispatch_|_encoding_)(\d+)_(.*)$", name)
    ordinal, rest = (int(m[1]), m[2]) if m else (None, name)
    shape = _DIMS.search(rest)
    if shape is None:
        return {"ordinal": ordinal, "kind": rest, "dims": [], "dtype": None}
    return {"ordinal": ordinal, "kind": rest[:shape.start()],
            "dims": [int(d) for d in shape[1].split("x")], "dtype": shape[2]}


def by_kind_and_shape(name: str, graph: Graph) -> list[str]:
    """The fallback mapping of a dispatch without locations: the nodes whose op the dispatch's
    kind can compute and whose output has as many elements as some of the dispatch's dims
    (IREE collapses dims: a 1x1 Conv's 8x8 pixels are one dim of 64 in its matmul)."""
    d = parse_dispatch(name)
    ops = DISPATCH_KINDS.get(d["kind"])
    if ops is None and d["kind"].startswith(("elementwise", "generic")):
        ops = ELEMENTWISE | {"Resize", "Transpose", "Concat", "Pad", "Slice", "Split"}
    if not ops or not d["dims"]:
        return []
    sizes = {math.prod(c) for k in range(1, len(d["dims"]) + 1)
             for c in itertools.combinations(d["dims"], k)}
    return [n.name for n in graph.nodes if n.op in ops and n.outputs
            and n.outputs[0] in graph.shapes and math.prod(graph.shapes[n.outputs[0]]) in sizes]


_LOC_ALIAS = re.compile(r"^(#loc\d*) = loc\((.*)\)\s*$")
_LOC_PART = re.compile(r'"((?:[^"\\]|\\.)*)"|(#loc\d*)\b')
_CALL = re.compile(r"stream\.cmd\.dispatch\b")
_ENTRY = re.compile(r"@[\w$.\-]+::@[\w$.\-]+::@([\w$.\-]+)")
_BODY_OP = re.compile(r"= (arith|math)\.(\w+)")


def _unescape(s: str) -> str:
    """An MLIR string literal's text: `\\XX` is a byte in hex (UTF-8 bytes escaped one by one)."""
    raw = re.sub(rb"\\([0-9A-Fa-f]{2}|\\)",
                 lambda m: b"\\" if m[1] == b"\\" else bytes([int(m[1], 16)]), s.encode())
    return raw.decode("utf-8", "replace")


def _loc_names(text: str, aliases: dict, seen=None) -> list[str]:
    """The strings of a location in order, #loc aliases followed: node names among them."""
    seen = seen if seen is not None else set()
    names = []
    for quoted, ref in _LOC_PART.findall(text):
        if quoted or not ref:
            names.append(_unescape(quoted))
        elif ref not in seen and ref in aliases:
            seen.add(ref)
            names += _loc_names(aliases[ref], aliases, seen)
    return names


def _trailing_loc(line: str) -> str | None:
    at = line.rfind(" loc(")
    return line[at + 5:].rstrip()[:-1] if at >= 0 and line.rstrip().endswith(")") else None


def dispatch_locations(text: str) -> dict[str, dict]:
    """From `iree-compile --compile-to=executable-sources --mlir-print-debuginfo` output: per
    dispatch function, the location strings of its call sites in the host code (`sites`, one
    list per call, what the dispatch computes) and those of the arithmetic inside its body
    (`body`: the ops fused into it; from the one executable, whichever call it was made for)."""
    lines = text.splitlines()
    aliases = {m[1]: m[2] for m in map(_LOC_ALIAS.match, lines) if m}
    out: dict[str, dict] = {}
    entry = lambda name: out.setdefault(name, {"sites": [], "body": []})
    func, func_indent = None, 0
    for i, line in enumerate(lines):
        indent = len(line) - len(line.lstrip())
        if _CALL.search(line):
            names = _ENTRY.findall(line)
            loc = None
            if line.rstrip().endswith("{"):  # the op's resource list follows; its loc closes it
                for nxt in lines[i + 1:]:
                    if len(nxt) - len(nxt.lstrip()) == indent and nxt.lstrip().startswith("}"):
                        loc = _trailing_loc(nxt)
                        break
            else:
                loc = _trailing_loc(line)
            for name in names:
                entry(name)["sites"].append(_loc_names(loc or "", aliases))
            continue
        m = re.match(r"\s*func\.func @([\w$.\-]+)\(", line)
        if m and ("$async_dispatch_" in m[1] or m[1].startswith("_encoding_")):
            func, func_indent = m[1], indent
            continue
        if func is not None:
            if indent == func_indent and line.lstrip().startswith("}"):
                func = None
                continue
            op = _BODY_OP.search(line)
            if op and not (op[1] == "arith" and (op[2] == "constant" or op[2].startswith("index"))):
                entry(func)["body"] += _loc_names(_trailing_loc(line) or "", aliases)
    return out


def iree_entries(stats: dict, locations: dict, graph: Graph) -> list[dict]:
    """Per dispatch function ({name: {"ms", "calls"}} per iteration): its ONNX nodes, category."""
    entries = []
    for name, s in stats.items():
        loc = locations.get(name)
        sites = [graph.ordered(site) for site in loc["sites"]] if loc else []
        nodes = graph.ordered(n for site in sites for n in site)
        fused = [n for n in graph.ordered(loc["body"]) if n not in nodes] if loc else []
        mapped_by = "locations"
        if not nodes:
            nodes, fused, mapped_by = by_kind_and_shape(name, graph), [], "kind+shape"
        kind = parse_dispatch(name)["kind"]
        layout = next((k for k in LAYOUT_KINDS if kind.startswith(k)), None)
        # else a Conv's bias fused into it is no conv; but the elementwise ops a rewrite put in
        # place of a Conv (a depthwise one as Slices) are that conv
        replaced = {graph.known(n) for site in (loc["sites"] if loc else []) for n in site
                    if n not in graph.by_name} - {None}
        heavy = DISPATCH_KINDS.get(kind) is HEAVY or any(graph.by_name[n].op in HEAVY for n in replaced)
        category = (f"(IREE {'data-tiling relayout' if layout in ('encode', 'decode') else layout})"
                    if layout else graph.category(nodes + fused, "(unmapped)", heavy))
        entries.append({"name": name, "calls": s["calls"], "ms": s["ms"], "kind": kind,
                        "onnx_nodes": nodes, "fused": fused, "category": category,
                        "mapped_by": mapped_by if nodes else "none"})
    return entries


def read_benchmark(doc: dict) -> tuple[float, dict]:
    """iree-benchmark-module's JSON (`--dispatch_statistics`): the time per iteration (ms) and,
    per dispatch function, its time per iteration (ms) and calls per iteration."""
    unit = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}
    total, stats = None, {}
    for b in doc["benchmarks"]:
        name = b["name"].split("/", 1)[1]
        ms = b["real_time"] * unit[b.get("time_unit", "ns")]
        if "calls" in b:
            stats[name] = {"ms": ms, "calls": int(b["calls"])}
        elif total is None:
            total = ms
    return total, stats


def import_with_locations(src: Path, dst: Path) -> None:
    """iree-import-onnx as the compile stage runs it, printed with debug info: every op keeps
    its ONNX node's name as its MLIR location."""
    # IREE's ONNX importer: 1.6 s, not needed by doit list
    from iree.compiler.tools.import_onnx.__main__ import load_onnx_model, parse_arguments
    # IREE's ONNX importer: 1.6 s, not needed by doit list
    from iree.compiler.tools.import_onnx.importer_externalization_overrides import (
        Context, onnx_importer)
    model = load_onnx_model(parse_arguments([str(src), "-o", str(dst)]))
    info = onnx_importer.ModelInfo(model)
    module = info.create_module(context=Context()).operation
    onnx_importer.NodeImporter.define_function(info.main_graph, module).import_all()
    module.verify()
    dst.write_text(module.get_asm(assume_verified=True, enable_debug_info=True))


def _runtime_tool(name: str) -> Path:
    spec = importlib.util.find_spec("iree._runtime_libs")
    if spec is None or not spec.submodule_search_locations:
        raise PipelineError("the IREE runtime (iree-base-runtime) is not installed", stage=STAGE,
                            hint="run ./setup.sh")
    return Path(list(spec.submodule_search_locations)[0]) / name


class IreeProfiler:
    """One IREE CPU artifact: mapped once, then timed per round by iree-benchmark-module."""
    runtime = IREE.name

    @staticmethod
    def runs(art: dict, device: str | None) -> bool:
        """An llvm-cpu artifact validated on IREE's CPU drivers."""
        return art["abi"].get("backend") == "llvm-cpu" and device in ("local-task", "local-sync")

    def __init__(self, ctx: "Context", abi: str, art: dict):
        self.ctx, self.abi, self.art = ctx, abi, art
        self.vmfb = ctx.layout.resolve(art["path"])
        work = ctx.scratch / abi
        work.mkdir(parents=True)
        source = ctx.named_model
        rewrites = graph_rewrites(art["compile"])
        if rewrites:  # the graph rewrites this build had (workarounds, pinned config): compile
            source = work / "model.onnx"  # what it compiled, or the dispatches would differ
            apply_rewrites(ctx.named_model, rewrites, source)
        mlir = work / "model.mlir"
        run_tool(python_module_argv("pipeline.bench.profile", "import-onnx", str(source), str(mlir)),
                 log=ctx.log, what="iree-import-onnx (with locations)", **ctx.where(abi))
        sources = work / "executables.mlir"
        run_tool([find_compiler(), str(mlir), *art["compile"]["flags"], "--compile-to=executable-sources",
                  "--mlir-print-debuginfo", "-o", str(sources)], log=ctx.log,
                 what="iree-compile --compile-to=executable-sources", cwd=work,
                 progress="iree-compile (executable sources)", **ctx.where(abi))
        self.locations = dispatch_locations(sources.read_text())
        sources.unlink()
        mlir.unlink()
        device = art["validation"]["executed"]["device"]
        self.argv = [_runtime_tool("iree-benchmark-module"), f"--device={device}",
                     f"--module={self.vmfb}", f"--function={art['entry']}",
                     *(f"--input=@{p}" for p in ctx.input_files), "--dispatch_statistics",
                     "--benchmark_out_format=json"]
        if device == "local-task":
            self.argv.insert(2, f"--task_topology_group_count={ctx.threads}")
        if ctx.options.warmup:  # each round is a process of its own: it warms up on its own
            self.argv.append(f"--benchmark_min_warmup_time={IREE_WARMUP_S}")
        self.out = work / "benchmark.json"
        self.totals, self.stats, self.crashes = [], {}, 0

    def round(self) -> None:
        argv = [*self.argv, f"--benchmark_min_time={self.ctx.options.iterations}x",
                f"--benchmark_out={self.out}"]
        where = self.ctx.where(self.abi)
        for attempt in range(CRASH_RETRIES + 1):
            done = run_tool(argv, log=self.ctx.log, check=False, **where,
                            what="iree-benchmark-module --dispatch_statistics")
            # IREE 3.13: a worker sometimes dies (SIGSEGV in iree_hal_task_queue_profile_finish_
            # host_execution) as a profiling session ends, ~1 run in 8 on ppocr_det: run it again
            if done.returncode >= 0 or attempt == CRASH_RETRIES:
                break
            self.crashes += 1
        if done.returncode != 0:
            raise PipelineError(f"iree-benchmark-module failed ({describe_exit(done.returncode)}"
                                f"{f', {self.crashes + 1} times' if self.crashes else ''}):\n"
                                f"{tail(done.output)}", log=str(self.ctx.log), **where,
                                hint="read the log; `doit bench` times the artifact without "
                                     "--dispatch_statistics")
        total, stats = read_benchmark(json.loads(self.out.read_text()))
        self.totals.append(total)
        for name, s in stats.items():
            acc = self.stats.setdefault(name, {"ms": 0.0, "calls": s["calls"], "n": 0})
            acc["ms"] += s["ms"]
            acc["n"] += 1

    def result(self, graph: Graph) -> dict:
        stats = {k: {"ms": v["ms"] / v["n"], "calls": v["calls"]} for k, v in self.stats.items()}
        entries = iree_entries(stats, self.locations, graph)
        unplaced = sorted(k for k in stats if k not in self.locations)
        out = side(entries, total_ms=sum(self.totals) / len(self.totals), runtime=self.runtime,
                    artifact=self.art, how="iree-benchmark-module --dispatch_statistics (HAL "
                    "profiling of the shipped .vmfb): time per iteration of each dispatch function",
                    mapping="locations: ONNX node names carried as MLIR locations to each "
                            "dispatch's call sites (the artifact's flags, compiled to executable "
                            "sources)" + (f"; kind+shape for {len(unplaced)} dispatch(es) not found "
                                          "there" if unplaced else ""),
                    outside="outside dispatches: the runtime's scheduling and waits between "
                            "them (dispatches that run side by side can add up to more than the run)")
        out["crashed_runs"] = self.crashes  # runs of the tool that died and were made again
        return out


# ----------------------------------------------------------------------------- TVM
def kernel_op(symbol: str) -> str:
    """A TVM kernel's op: `conv2d40` -> conv2d, `fused_conv2d_add_relu3` -> conv2d_add_relu."""
    return re.sub(r"\d+$", "", symbol.removeprefix("fused_"))


def fingerprint(array) -> tuple:
    import numpy as np  # numpy: 0.2 s, not needed by doit list
    a = np.asarray(array, dtype=np.float64)
    return tuple(a.shape), float(a.sum()), float(np.abs(a).sum())


def same_values(a: tuple, b: tuple, rel: float = 1e-3) -> bool:
    """Two fingerprints (shape, sum, sum of |x|) of the same tensor computed two ways."""
    if a[0] != b[0] and math.prod(a[0]) != math.prod(b[0]):
        return False
    scale = max(abs(a[2]), abs(b[2]), 1e-12) * rel + 1e-9
    return abs(a[1] - b[1]) <= scale and abs(a[2] - b[2]) <= scale


def align(calls: list[dict], graph: Graph) -> list[dict]:
    """Each kernel call's ONNX nodes. Per call, in execution order: `out`, the ONNX tensors its
    output equals; `ins`, those its inputs equal; `reads` and `write`, the addresses of its input
    and output buffers. The output is the first match whose node comes after the previous call's
    (kernels mostly run in graph order), else that node again, else the last before it; the call computes the
    nodes between that output and its inputs or other calls' outputs ("values"). A call whose
    output is no ONNX tensor (a Conv before its bias, a padding) belongs to the first call that
    reads it, directly or through other such calls ("dataflow"); failing that, to the next call
    that matched ("order")."""
    idx = lambda t: graph.producer[t].index
    outs: list[str | None] = []
    at = -1
    for call in calls:
        later = [t for t in call["out"] if idx(t) > at] or [t for t in call["out"] if idx(t) == at]
        out = (min(later, key=idx) if later else max(call["out"], key=idx)) if call["out"] else None
        at = idx(out) if out else at
        outs.append(out)
    produced = {o for o in outs if o}
    placed: list[dict | None] = [
        {"nodes": graph.between([out], set(call["ins"]) | (produced - {out})), "mapped_by": "values"}
        if out else None for call, out in zip(calls, outs)]
    readers: dict[int, list[int]] = {}
    writer: dict = {}
    for k, call in enumerate(calls):
        for ptr in call.get("reads", ()):
            if ptr in writer:
                readers.setdefault(writer[ptr], []).append(k)
        if call.get("write") is not None:
            writer[call["write"]] = k
    result = []
    for k, p in enumerate(placed):
        if p is None:
            seen, todo, found = set(), sorted(readers.get(k, [])), None
            while todo and found is None:
                r = todo.pop(0)
                if r in seen:
                    continue
                seen.add(r)
                if placed[r]:
                    found = placed[r]
                else:
                    todo = sorted(set(todo) | set(readers.get(r, [])))
            if found:
                p = {"nodes": found["nodes"], "mapped_by": "dataflow"}
            else:
                p = next((x for x in placed[k + 1:] if x), None) or next(
                    (x for x in reversed(placed[:k]) if x), {"nodes": []})
                p = {"nodes": p["nodes"], "mapped_by": "order" if p["nodes"] else "none"}
        result.append(p)
    return result


def tvm_entries(calls: list[dict], graph: Graph) -> list[dict]:
    """Per kernel (its symbol; calls of one kernel add up; each call {symbol, ms, nodes,
    mapped_by}): ONNX nodes, time, and each call's time under its own category."""
    entries: dict[str, dict] = {}
    for call in calls:
        e = entries.setdefault(call["symbol"], {"name": call["symbol"], "calls": 0, "ms": 0.0,
                                                "kind": kernel_op(call["symbol"]), "onnx_nodes": [],
                                                "fused": [], "mapped": set(), "split": {}})
        e["calls"] += 1
        e["ms"] += call["ms"]
        e["onnx_nodes"] += call["nodes"]
        e["mapped"].add(call["mapped_by"])
        cat = graph.category(call["nodes"], "(unmapped)")
        e["split"][cat] = e["split"].get(cat, 0.0) + call["ms"]
    out = []
    for e in entries.values():
        nodes = graph.ordered(e["onnx_nodes"])
        main = graph.main(nodes)
        same = [n for n in nodes if main and graph.by_name[n].op == main.op]
        e["onnx_nodes"], e["fused"] = same, [n for n in nodes if n not in same]
        e["mapped_by"] = "+".join(sorted(e.pop("mapped")))
        e["category"] = main.category if main else "(unmapped)"
        out.append(e)
    return out


class TvmProfiler:
    """One TVM CPU artifact: each kernel call mapped to its ONNX node once (values), then timed
    per round: whole runs, and every kernel call by time_evaluator on that call's own tensors."""
    runtime = TVM.name

    @staticmethod
    def runs(art: dict, device: str | None) -> bool:
        return device == "cpu"

    def __init__(self, ctx: "Context", abi: str, art: dict):
        import numpy as np  # numpy: 0.2 s, not needed by doit list
        self.ctx, self.abi, self.art = ctx, abi, art
        self.module = TvmModule(str(ctx.layout.resolve(art["path"])), art["entry"],
                                threads=ctx.threads)
        self.kernels = self.module.lib.imports[0]  # the compiled kernels (the VM calls them)
        self._known: dict[str, bool] = {}
        tvm, dev = self.module.tvm, self.module.device
        self.args = [tvm.runtime.tensor(a, dev) for a in ctx.inputs]
        by_size: dict = {}  # onnxruntime's tensors by element count
        for tensor, fp in ctx.reference().items():
            by_size.setdefault(math.prod(fp[0]), []).append((tensor, fp))
        equal = lambda a: sorted(t for t, ref in by_size.get(math.prod(a.shape), [])
                                 if same_values(fingerprint(a.numpy()), ref))
        calls: list[dict] = []
        self.symbols: list[str] = []
        self.in_place: set[int] = set()  # calls whose output buffer is one of their inputs

        def record(func, symbol, before, ret, *args):
            if not self._kernel(symbol):
                return 0
            tensors = [a for a in args if hasattr(a, "numpy")]  # destination-passing: out last
            if before:  # inputs as they are read: an in-place kernel overwrites one
                self.symbols.append(symbol)
                calls.append({"ins": sorted({t for a in tensors[:-1] for t in equal(a)}),
                              "reads": [a.data_ptr() for a in tensors[:-1]],
                              "write": tensors[-1].data_ptr() if tensors else None})
                return 0
            call = calls[-1]  # kernels call nothing back: before and after come in pairs
            call["out"] = [t for t in equal(tensors[-1]) if t in ctx.graph.producer] if tensors else []
            if call["write"] in call["reads"]:
                self.in_place.add(len(calls) - 1)
            return 0

        for _ in range(max(ctx.options.warmup, 1)):
            self.module.fn(*self.args)
        self._instrumented(record)
        self.placed = align(calls, ctx.graph)
        self.kernel_ms = np.zeros(len(self.symbols))
        self.totals, self.rounds = [], 0
        self._evaluators: dict = {}

    def _kernel(self, symbol: str) -> bool:
        """A compiled kernel (timed), not the VM's own builtins or a closure (its overhead)."""
        if symbol not in self._known:
            self._known[symbol] = (not symbol.startswith("vm.builtin.")
                                   and self.kernels.implements_function(symbol))
        return self._known[symbol]

    def _instrumented(self, hook) -> None:
        self.module.vm["set_instrument"](hook)
        try:
            self.module.fn(*self.args)
        finally:
            self.module.vm["set_instrument"](None)

    def round(self) -> None:
        n = self.ctx.options.iterations
        for _ in range(n):
            t0 = time.perf_counter_ns()
            self.module.fn(*self.args)
            self.totals.append((time.perf_counter_ns() - t0) / 1e6)
        k = [0]
        dev = self.module.device

        def timed(func, symbol, before, ret, *args):
            if before or not self._kernel(symbol):
                return 0
            ev = self._evaluators.get(symbol)
            if ev is None:
                ev = self._evaluators[symbol] = self.kernels.time_evaluator(symbol, dev, number=n,
                                                                            repeat=1)
            if k[0] in self.in_place:  # timed on its own buffers it would change the model's data
                args = [self.module.tvm.runtime.tensor(a.numpy(), dev) if hasattr(a, "numpy") else a
                        for a in args]
            self.kernel_ms[k[0]] += ev(*args).mean * 1e3
            k[0] += 1
            return 0

        self._instrumented(timed)
        if k[0] != len(self.symbols):
            raise PipelineError(f"the TVM VM made {k[0]} kernel calls in one run and "
                                f"{len(self.symbols)} in another", **self.ctx.where(self.abi),
                                hint="a model with data-dependent control flow cannot be "
                                     "profiled kernel by kernel")
        self.rounds += 1

    def result(self, graph: Graph) -> dict:
        import numpy as np  # numpy: 0.2 s, not needed by doit list
        calls = [{"symbol": s, "ms": float(ms) / self.rounds, **placed}
                 for s, ms, placed in zip(self.symbols, self.kernel_ms, self.placed)]
        return side(tvm_entries(calls, graph), total_ms=float(np.mean(self.totals)),
                    runtime=self.runtime, artifact=self.art,
                    how="each kernel call of the Relax VM (its instrument hook) timed by TVM's "
                        "time_evaluator on that call's own tensors; the total: whole runs",
                    mapping="values: each kernel's output compared with onnxruntime's value of the "
                            "ONNX tensors of its size; a kernel whose output is no ONNX tensor (a "
                            "Conv before its bias) belongs to the kernel that reads it (dataflow)",
                    outside="outside kernels: the VM's own work (allocations, reshapes, shape "
                            "checks), and the difference between a kernel timed alone (warm "
                            "caches) and in the model")


# ----------------------------------------------------------------------------- onnxruntime
def ort_node_map(opt_nodes: list[tuple], graph: Graph) -> dict[str, list[str]]:
    """onnxruntime's optimised graph ([(name, op_type, inputs, outputs)]) -> for each of its
    nodes, the static model's nodes it computes: those between the original tensors it reads and
    those it (or any other of its nodes) writes. A tensor onnxruntime made is traced through its
    layout reorders back to an original one; an NCHWc node named `<original tensor>_nchwc` writes
    that tensor."""
    original = set(graph.producer) | {t for n in graph.nodes for t in n.inputs}
    producer = {o: n for n in opt_nodes for o in n[3]}
    consumers: dict = {}
    for n in opt_nodes:
        for i in n[2]:
            consumers.setdefault(i, []).append(n)

    def written(node) -> set[str]:
        name, op, _, outs = node
        found = {o for o in outs if o in original}
        if not found and name.endswith("_nchwc") and name[:-6] in original:
            found = {name[:-6]}
        if not found and name in graph.by_name:  # an original node on onnxruntime's tensors
            found = set(graph.by_name[name].outputs)
        for o in outs:  # through layout reorders, e.g. ReorderOutput
            for c in consumers.get(o, []):
                if c[1].startswith("Reorder"):
                    found |= {x for x in c[3] if x in original}
        return found

    def read(tensor: str, depth: int = 0) -> set[str]:
        if tensor in original or tensor not in producer or depth > 8:
            return {tensor}
        node = producer[tensor]
        if node[1].startswith("Reorder"):
            return set().union(*(read(i, depth + 1) for i in node[2] if i)) if node[2] else set()
        return written(node) or {tensor}

    writes = {n[0]: written(n) for n in opt_nodes if not n[1].startswith("Reorder")}
    writer = {t: name for name, w in writes.items() for t in w}
    out = {}
    for name, op, inputs, _ in opt_nodes:
        if op.startswith("Reorder"):
            out[name] = []
            continue
        stop = {t for i in inputs if i for t in read(i)} | {t for t, w in writer.items() if w != name}
        out[name] = graph.between(writes[name], stop)
    return out


def ort_times(events: list[dict], warmup: int) -> tuple[list[float], dict]:
    """onnxruntime's profile (trace events): per timed run its total (ms); per node of the
    optimised graph its time summed over the timed runs (ms), op type, calls. The first `warmup`
    runs are left out."""
    runs = sorted((e for e in events if e.get("name") == "model_run"), key=lambda e: e["ts"])
    timed = runs[warmup:]
    windows = [(e["ts"], e["ts"] + e["dur"]) for e in timed]
    nodes: dict[str, dict] = {}
    for e in events:
        if e.get("cat") != "Node" or not e["name"].endswith("_kernel_time"):
            continue
        if not any(a <= e["ts"] <= b for a, b in windows):
            continue
        n = nodes.setdefault(e["name"][:-len("_kernel_time")],
                             {"ms": 0.0, "calls": 0, "op": e.get("args", {}).get("op_name", "")})
        n["ms"] += e["dur"] / 1e3
        n["calls"] += 1
    return [e["dur"] / 1e3 for e in timed], nodes


class OrtProfiler:
    """onnxruntime on the static model, with the bench's session settings and profiling on."""
    runtime = ORT

    def __init__(self, ctx: "Context"):
        import onnx  # onnx: 1.5 s, not needed by doit list
        import onnxruntime as ort  # onnxruntime: 0.2 s, not needed by doit list
        self.ctx = ctx
        work = ctx.scratch / ORT
        work.mkdir(parents=True)

        def options():
            opts = ort.SessionOptions()  # as run/timing.py's OnnxruntimeCpuRunner (the bench)
            opts.intra_op_num_threads = ctx.threads
            opts.inter_op_num_threads = 1
            opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
            opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
            opts.log_severity_level = 3
            return opts

        opts = options()
        opts.optimized_model_filepath = str(work / "optimized.onnx")
        ort.InferenceSession(str(ctx.named_model), sess_options=opts,
                             providers=["CPUExecutionProvider"])
        optimized = onnx.load(str(work / "optimized.onnx"), load_external_data=False)
        self.opt_nodes = [(n.name, n.op_type, tuple(n.input), tuple(n.output))
                          for n in optimized.graph.node]
        opts = options()
        opts.enable_profiling = True
        opts.profile_file_prefix = str(work / "ort")
        self.session = ort.InferenceSession(str(ctx.named_model), sess_options=opts,
                                            providers=["CPUExecutionProvider"])
        self.feeds = dict(zip(ctx.input_names, ctx.inputs))
        for _ in range(ctx.options.warmup):
            self.session.run(None, self.feeds)

    def round(self) -> None:
        for _ in range(self.ctx.options.iterations):
            self.session.run(None, self.feeds)

    def result(self, graph: Graph) -> dict:
        trace = Path(self.session.end_profiling())
        totals, nodes = ort_times(json.loads(trace.read_text()), self.ctx.options.warmup)
        trace.unlink()
        runs = len(totals)
        mapping = ort_node_map(self.opt_nodes, graph)
        entries = []
        for name, n in nodes.items():
            onnx_nodes = mapping.get(name) or graph.ordered([name])
            layout = n["op"].startswith("Reorder")
            main = graph.main(onnx_nodes)
            fused = [x for x in onnx_nodes if main and x != main.name]
            entries.append({"name": name, "calls": n["calls"] // max(runs, 1), "ms": n["ms"] / runs,
                            "kind": n["op"], "onnx_nodes": [x for x in onnx_nodes if x not in fused],
                            "fused": fused,
                            "category": "(onnxruntime layout reorder)" if layout
                            else graph.category(onnx_nodes, "(unmapped)"),
                            "mapped_by": "graph" if onnx_nodes else "none"})
        return side(entries, total_ms=sum(totals) / len(totals), runtime=ORT, artifact=None,
                    how="SessionOptions.enable_profiling: each node's kernel time in the timed runs "
                        f"(onnxruntime {distribution_version('onnxruntime')}, CPU, graph "
                        "optimisations as the bench: all)",
                    mapping="graph: each node of onnxruntime's optimised graph traced back to the "
                            "static model's nodes through the tensors it reads and writes",
                    outside="outside nodes: the session's own work between kernels")


# ----------------------------------------------------------------------------- together
def side(entries: list[dict], *, total_ms: float, runtime: str, artifact: dict | None, how: str,
         mapping: str, outside: str) -> dict:
    """One runtime's profile: entries by time (each with its share of the entries' sum), the
    aggregate per category, the whole-run time beside the entries' sum."""
    kernels = sum(e["ms"] for e in entries)
    entries = sorted(entries, key=lambda e: (-e["ms"], e["name"]))
    for e in entries:
        e["ms"] = round(e["ms"], 6)
        e["share"] = round(e["ms"] / kernels, 6) if kernels else 0.0
    cats: dict[str, dict] = {}
    for e in entries:
        for cat, ms in (e.pop("split", None) or {e["category"]: e["ms"]}).items():
            c = cats.setdefault(cat, {"category": cat, "ms": 0.0, "entries": 0})
            c["ms"] += ms
            c["entries"] += 1
    by_category = sorted(cats.values(), key=lambda c: (-c["ms"], c["category"]))
    for c in by_category:
        c["ms"] = round(c["ms"], 6)
        c["share"] = round(c["ms"] / kernels, 6) if kernels else 0.0
    out = {"runtime": runtime, "how": how, "mapping": mapping, "total_ms": round(total_ms, 6),
           "entries_ms": round(kernels, 6), "outside": outside,
           "entries": entries, "by_category": by_category}
    if artifact is not None:
        out["artifact"] = {k: artifact[k] for k in ("path", "sha256", "format")}
    return out


def compare(sides: dict) -> list[dict]:
    """The categories of every side, with each side's ms and share: the op-by-op comparison."""
    cats: dict[str, dict] = {}
    for key, s in sides.items():
        for c in s["by_category"]:
            cats.setdefault(c["category"], {"category": c["category"]})[key] = {
                "ms": c["ms"], "share": c["share"]}
    first = next(iter(sides))
    return sorted(cats.values(), key=lambda c: (-c.get(first, {}).get("ms", 0.0), c["category"]))


@dataclass
class Context:
    """What every runtime's profiler of one model shares."""
    layout: Layout
    target: str
    model: str
    options: Options
    scratch: Path
    named_model: Path
    graph: Graph
    input_names: list[str]
    inputs: list
    input_files: list[Path]
    threads: int
    log: Path
    _reference: dict | None = None

    def where(self, abi: str | None = None) -> dict:
        return {"stage": STAGE, "model": self.model,
                "target": f"{self.target}/{abi}" if abi else self.target}

    def reference(self) -> dict:
        """onnxruntime's value of every float tensor of the static model on the golden inputs,
        as fingerprints: tensor -> (shape, sum, sum of |x|)."""
        if self._reference is None:
            import onnx  # onnx: 1.5 s, not needed by doit list
            from onnx import helper  # onnx: 1.5 s, not needed by doit list
            model = onnx.load(str(self.named_model))
            present = {o.name for o in model.graph.output}
            for n in self.graph.nodes:
                for t in n.outputs:
                    if t not in present and self.graph.types.get(t) in FLOAT_TYPES:
                        model.graph.output.append(helper.make_tensor_value_info(
                            t, self.graph.types[t], None))
            names = [o.name for o in model.graph.output]
            values = reduced_session(model.SerializeToString()).run(
                None, dict(zip(self.input_names, self.inputs)))
            values = [*values, *self.inputs]
            names = [*names, *self.input_names]
            self._reference = {n: fingerprint(v) for n, v in zip(names, values)
                               if getattr(v, "dtype", None) is not None and v.dtype.kind == "f"}
        return self._reference


PROFILERS = {IREE: IreeProfiler, TVM: TvmProfiler}   # backend -> its profiler


def runnable(art: dict) -> tuple[type | None, str]:
    """Which profiler an artifact gets here (its backend's, PROFILERS), or None and why not."""
    val = art.get("validation", {})
    executed = val.get("executed", {})
    if val.get("status") != "passed":
        return None, f"not validated here ({val.get('status', 'no validation')})"
    if executed.get("emulated"):
        return None, "emulated (qemu): its timings mean nothing"
    if art["abi"].get("run", {}).get("via") != "python":
        return None, f"runs via {art['abi'].get('run', {}).get('via')!r}, not on this CPU"
    profiler = PROFILERS.get(BY_FORMAT.get(art.get("format")))
    if profiler is not None and profiler.runs(art, executed.get("device")):
        return profiler, ""
    return None, f"no profiler for {art.get('format')} on {executed.get('device')!r}"


def run(layout: Layout, target: str, model: str, options: Options,
        say: Callable[[str], None] = print) -> dict:
    """Profile one model's artifacts of `target` and onnxruntime; write profile.json."""
    import numpy as np  # numpy: 0.2 s, not needed by doit list
    import onnx  # onnx: 1.5 s, not needed by doit list

    where = {"stage": STAGE, "model": model, "target": target}
    manifest_path = layout.manifest(target)
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError):
        raise PipelineError(f"no readable manifest {manifest_path}",
                            hint=f"build first: doit build target={target}", **where) from None
    entry = manifest["models"].get(model)
    if entry is None:
        raise PipelineError(f"{target}'s manifest has no model {model!r}; models: "
                            f"{', '.join(sorted(manifest['models']))}", **where,
                            hint=f"doit profile target={target} model=NAME")
    arts = entry["artifacts"]
    if options.abi and options.abi not in arts:
        raise PipelineError(f"{model} has no {target} artifact for ABI {options.abi!r}; its ABIs: "
                            f"{', '.join(sorted(arts)) or 'none'}", **where,
                            hint="leave abi= out to profile every ABI that runs here")
    chosen, skipped = [], []
    for abi, art in sorted(arts.items()):
        if options.abi and abi != options.abi:
            continue
        profiler, why = runnable(art)
        (chosen.append((abi, art, profiler)) if profiler else skipped.append({"abi": abi, "reason": why}))
    if not chosen:
        listed = "; ".join(f"{s['abi']}: {s['reason']}" for s in skipped) or "none"
        raise PipelineError(f"no artifact of {model} for {target} can be profiled on this "
                            f"machine ({listed})", **where,
                            hint="profile a target built for this machine (target=host)")

    static_entry = entry["static_model"]
    static = (layout.resolve(static_entry["path"]) if "path" in static_entry
              else layout.model_stage(model, "static") / "model.onnx")
    for path, want, what in [(static, static_entry["sha256"], "static model"),
                             *((layout.resolve(a["path"]), a["sha256"], f"{abi} artifact")
                               for abi, a, _ in chosen)]:
        if not path.is_file() or sha256_file(path) != want:
            raise PipelineError(f"the {what} {path} is missing or differs from the manifest",
                                hint=f"rebuild: doit build target={target}", **where)
    golden = layout.model_stage(model, "golden")
    gdoc = json.loads((golden / "golden.json").read_text())

    scratch = layout.scratch(STAGE, f"{target}/{model}")
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    try:
        proto = onnx.load(str(static))
        named(proto)
        named_model = scratch / "model.onnx"
        named_model.write_bytes(proto.SerializeToString(deterministic=True))
        ctx = Context(layout, target, model, options, scratch, named_model, load_graph(proto),
                      [e["name"] for e in gdoc["inputs"]],
                      [np.load(golden / e["file"], allow_pickle=False) for e in gdoc["inputs"]],
                      [golden / e["file"] for e in gdoc["inputs"]], options.usable_threads(),
                      layout.log(STAGE, f"{target}/{model}"))
        ctx.log.unlink(missing_ok=True)
        say(f"profile {target}/{model}: {', '.join(a for a, _, _ in chosen)} and onnxruntime, "
            f"{ctx.threads} thread(s); {options.rounds} round(s) of {options.iterations} run(s) "
            f"each, in turn")
        started = datetime.now(timezone.utc).isoformat(timespec="seconds")
        load_start = round(os.getloadavg()[0], 2)
        profilers = {abi: profiler(ctx, abi, art) for abi, art, profiler in chosen}
        profilers[ORT] = OrtProfiler(ctx)
        for _ in range(options.rounds):
            for p in profilers.values():
                p.round()
        sides = {key: p.result(ctx.graph) for key, p in profilers.items()}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    doc = {"schema": SCHEMA, "target": target, "model": model, "started_utc": started,
           "machine": {"cpu_model": cpu_model(), "usable_cpus": len(os.sched_getaffinity(0)),
                       "loadavg_1m_start": load_start, "loadavg_1m_end": round(os.getloadavg()[0], 2)},
           "threads": ctx.threads,
           "settings": {"iterations": options.iterations, "rounds": options.rounds,
                        "warmup": options.warmup},
           "static_model": {"path": layout.relative(static), "sha256": static_entry["sha256"],
                            "nodes": len(ctx.graph.nodes)},
           "versions": {d: distribution_version(d) for d in ("iree-base-runtime", "apache-tvm",
                                                              "onnxruntime")},
           "not_profiled": skipped, "runtimes": sides, "by_category": compare(sides)}
    out = layout.profile_report(target, model) / "profile.json"
    atomic_write_text(out, pretty_json(doc))
    for line in table(doc):
        say(line)
    return doc


# ----------------------------------------------------------------------------- text
def nodes_text(entry: dict, graph_ops: dict | None = None, limit: int = 3) -> str:
    """The ONNX nodes of an entry, short: `Conv@43, Conv@48 (+ Add, Clip, Mul, Div)`."""
    nodes = entry["onnx_nodes"]
    text = ", ".join(nodes[:limit]) + (f" +{len(nodes) - limit}" if len(nodes) > limit else "")
    if entry.get("fused"):
        ops = []
        for n in entry["fused"]:
            op = n.split("@")[0].split("#")[0]
            if op not in ops:
                ops.append(op)
        text += f" (+ {', '.join(ops)})"
    return text or "-"


def _label(key: str, s: dict) -> str:
    return ORT if key == ORT else f"{key} ({s['runtime'].upper()})"


def _guessed(entries: list[dict]) -> str:
    """How many entries only their dispatch's name placed (a weaker mapping), if any."""
    n = sum(e.get("mapped_by") == "kind+shape" for e in entries)
    return f", {n} of them only by kind+shape (the dispatch name's op and dims)" if n else ""


def table(doc: dict, top: int = TOP) -> list[str]:
    """The printed profile: per runtime its top entries, then the per-category comparison."""
    lines = []
    for key, s in doc["runtimes"].items():
        lines.append("")
        lines.append(f"{_label(key, s)}: whole run {s['total_ms']:.3f} ms; its "
                     f"{len(s['entries'])} entries add up to {s['entries_ms']:.3f} ms "
                     f"({s['entries_ms'] / s['total_ms']:.0%}); mapped by "
                     f"{s['mapping'].split(':')[0]}{_guessed(s['entries'])}")
        rows = [("#", "ms", "share", "calls", "dispatch / kernel / node", "category", "ONNX nodes")]
        for k, e in enumerate(s["entries"][:top], 1):
            rows.append((str(k), f"{e['ms']:.3f}", f"{e['share']:.1%}", str(e["calls"]),
                         display_name(e["name"]), e["category"], nodes_text(e)))
        lines += _columns(rows)
    keys = list(doc["runtimes"])
    head = ("op kind", *(f"{k} ms / share" for k in keys))
    rows = [head]
    for c in doc["by_category"]:
        rows.append((c["category"], *(f"{c[k]['ms']:.3f} / {c[k]['share']:.1%}" if k in c else "-"
                                      for k in keys)))
    lines += ["", "time per ONNX op kind (each entry counted under its main node):"]
    lines += _columns(rows)
    for s in doc["not_profiled"]:
        lines.append(f"not profiled: {s['abi']}: {s['reason']}")
    return lines


def display_name(name: str, width: int = 56) -> str:
    """An entry's name as printed: IREE's `main$async_` prefix left out, long ones cut."""
    name = re.sub(r"^.*\$async_", "", name)
    return name if len(name) <= width else name[:width - 3] + "..."


def _columns(rows: list[tuple]) -> list[str]:
    widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]))]
    return ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def command(layout: Layout, target: str | None, model: str | None, raw_vars: dict,
            known: list[str]) -> str:
    """`doit profile`: profile one model; a PipelineError on misuse."""
    if not target or not model:
        raise PipelineError("say what to profile: doit profile target=T model=NAME [abi=A]",
                            stage=STAGE, hint=f"known targets: {', '.join(known)}")
    run(layout, target, model, Options.from_vars(raw_vars))
    return f"wrote {layout.profile_report(target, model) / 'profile.json'}"


def current(layout: Layout, target: str, manifest: dict) -> dict[str, dict]:
    """The profile.json of each model of the manifest whose profiled artifacts are the ones it
    lists now (a profile of bytes since rebuilt is left out)."""
    out = {}
    for model, entry in sorted(manifest["models"].items()):
        try:
            doc = json.loads((layout.profile_report(target, model) / "profile.json").read_text())
        except (OSError, ValueError):
            continue
        arts = entry["artifacts"]
        if doc.get("schema") == SCHEMA and all(
                s["artifact"]["sha256"] == arts.get(key, {}).get("sha256")
                for key, s in doc["runtimes"].items() if "artifact" in s):
            out[model] = doc
    return out


def main(argv=None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) == 3 and args[0] == "import-onnx":
        import_with_locations(Path(args[1]), Path(args[2]))
        return 0
    print("usage: python -m pipeline.bench.profile import-onnx SRC.onnx DST.mlir", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
