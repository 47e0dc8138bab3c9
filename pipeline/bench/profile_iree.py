"""`doit profile` of an IREE CPU artifact: iree-benchmark-module's dispatch statistics, each
dispatch mapped onto the static model's ONNX nodes through MLIR locations (or its name's kind
and shape), the IREE side of pipeline/bench/profile.py."""
from __future__ import annotations

import importlib.util
import itertools
import json
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING

from ..compilers.iree_backend import IREE
from ..compilers.iree_compiler import find_compiler
from ..core.errors import PipelineError
from ..core.tools import describe_exit, python_module_argv, run_tool, tail
from ..rewrite.abi_rewrites import apply as apply_rewrites
from ..stages.iree_compile import graph_rewrites
from .profile_graph import ELEMENTWISE, HEAVY, Graph
from .profile_sides import STAGE, side

if TYPE_CHECKING:
    from .profile_context import Context


CRASH_RETRIES = 3    # iree-benchmark-module runs that died of a signal, run again (see round())
IREE_WARMUP_S = 0.1  # iree-benchmark-module's warm-up (seconds) before each round's iterations
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
