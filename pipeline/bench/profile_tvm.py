"""`doit profile` of a TVM `.so`: each kernel call of one VM run timed on its own arguments,
mapped onto the static model's ONNX nodes by the values it computes (onnxruntime's on the golden
inputs), the TVM side of pipeline/bench/profile.py."""
from __future__ import annotations

import math
import re
import time
from typing import TYPE_CHECKING

from ..compilers.tvm_backend import TVM
from ..core.errors import PipelineError
from ..run.tvm_run import TvmModule
from .profile_context import fingerprint, same_values
from .profile_graph import Graph
from .profile_sides import side

if TYPE_CHECKING:
    from .profile_context import Context


def kernel_op(symbol: str) -> str:
    """A TVM kernel's op: `conv2d40` -> conv2d, `fused_conv2d_add_relu3` -> conv2d_add_relu."""
    return re.sub(r"\d+$", "", symbol.removeprefix("fused_"))


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
