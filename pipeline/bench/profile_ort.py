"""`doit profile` of onnxruntime: its own per-node profile of the static model, mapped back
through its optimised graph's tensors, the reference side of pipeline/bench/profile.py."""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from ..core.tools import distribution_version
from .profile_graph import Graph
from .profile_sides import ORT, side

if TYPE_CHECKING:
    from .profile_context import Context


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
