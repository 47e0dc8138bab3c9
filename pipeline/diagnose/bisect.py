"""`doit bisect model=NAME target=T abi=A`: the first op an ABI's compiled code gets wrong.

When an artifact fails validation (a GPU build that runs and returns wrong numbers, say), this
finds where the numbers go wrong: the static model is cut after a node (its output becomes the
model's output), each such prefix is compiled for the same ABI with the same flags and run the
way validation runs it (Vulkan on lavapipe, qemu-user, natively), and its output compared with
onnxruntime's value of the same tensor on the golden inputs, within the model's tolerance
(its absolute bounds scaled by the tensor's magnitude). Prefixes are searched by bisection
over the nodes in topological order: about log2(nodes) builds. Then the smallest window of nodes ending at the first wrong one that still goes wrong
on its own, fed with onnxruntime's values of its inputs, is the standalone repro:

    artifacts/reports/bisect/<target>/<model>/<abi>/
      report.json         the first wrong node (op, attributes, input and output shapes), the
                          probes made, the window, the flags, the figures
      repro.onnx          the window as a model of its own (weights included)
      input_<i>.npy       its inputs (onnxruntime's values in the full model)
      expected_0.npy      onnxruntime's output; actual_0.npy what the compiled window gave

Builds go through the compile stage's own step (same Config, same fallbacks) in a work folder
with its own store, so a second bisection of the same model reuses every probe it built.
Bisection assumes that once a tensor is wrong, the tensors computed from it are wrong too; a
bug that only shows at some later node (a fusion across several ops) is caught by the window.
"""
from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

from ..compilers.iree_backend import IREE
from ..core.errors import PipelineError
from ..core.layout import Layout, golden_files, static_model
from ..core.numerics import compare, summary
from ..core.steps import execute
from ..core.store import pretty_json
from ..core.tools import run_tool
from ..stages import iree_compile, validate

STAGE = "bisect"
MAX_WINDOW = 8   # nodes: the largest standalone repro tried
FLOAT_TYPES = (1, 10, 11, 16)  # onnx TensorProto FLOAT, FLOAT16, DOUBLE, BFLOAT16


@dataclasses.dataclass
class Probe:
    """One sub-model built and run for the ABI: its nodes, and how it compared."""
    name: str
    node: int                    # index of the last node (its output is the probe's output)
    wrong: bool
    figures: str
    error: str | None = None


class Bisection:
    def __init__(self, project, model, target, abi, report_dir: Path):
        import numpy as np  # numpy: 0.2 s, not needed by doit list
        import onnx  # onnx: 1.5 s, not needed by doit list

        self.project, self.model, self.target, self.abi = project, model, target, abi
        self.where = {"model": model.name, "target": f"{target.name}/{abi.name}", "stage": STAGE}
        if not IREE.builds(abi):
            raise PipelineError(f"bisect builds IREE artifacts; {abi.name} is a {abi.compiler} ABI",
                                hint="pick an IREE ABI of the target", **self.where)
        layout = project.layout
        static = static_model(layout, model)
        goldens = golden_files(layout, model)
        missing = [p for p in [static, *goldens.values()] if not Path(p).is_file()]
        if missing:
            raise PipelineError(f"the static model and golden files are not built ({missing[0]})",
                                hint=f"run `doit static:{model.name} golden:{model.name}` first "
                                     "(`doit bisect` does when given model=)", **self.where)
        self.onnx = onnx.load(str(static))
        doc = json.loads(Path(goldens["golden.json"]).read_text())
        self.feeds = {e["name"]: np.load(goldens[f"golden:{e['file']}"], allow_pickle=False)
                      for e in doc["inputs"]}
        self.report_dir = report_dir
        self.work = report_dir / "work"
        self.tolerance = model.tolerance.as_dict()
        self.twin = abi.run.get("via") == "twin"
        self.compile = iree_compile.compile_step(layout, model, target, abi, twin=self.twin)
        self.check = validate.validate_step(layout, model, target, abi)
        self.values = self._reference_values()
        self.probes: list[Probe] = []

    # ---- onnxruntime: every intermediate value of the full model, once ------------------------
    def _reference_values(self) -> dict:
        import onnx  # onnx: 1.5 s, not needed by doit list
        import onnxruntime as ort  # onnxruntime: 0.2 s, not needed by doit list

        model = onnx.ModelProto()
        model.CopyFrom(self.onnx)
        known = {v.name: v for v in list(model.graph.value_info) + list(model.graph.output)}
        outputs = {o.name for o in model.graph.output}
        for node in model.graph.node:
            for out in node.output:
                if out and out in known and out not in outputs:
                    model.graph.output.append(known[out])
                    outputs.add(out)
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        session = ort.InferenceSession(model.SerializeToString(), opts,
                                       providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        return {**self.feeds, **dict(zip(names, session.run(names, self.feeds)))}

    def candidates(self) -> list[int]:
        """Nodes whose (first) output is a float tensor computed from the model's inputs."""
        vi = {v.name: v.type.tensor_type.elem_type for v in
              list(self.onnx.graph.value_info) + list(self.onnx.graph.output)}
        return [k for k, n in enumerate(self.onnx.graph.node)
                if n.output and vi.get(n.output[0]) in FLOAT_TYPES and n.output[0] in self.values
                and n.op_type != "Constant"]

    # ---- one probe: extract, compile, run, compare -------------------------------------------
    def probe(self, name: str, node: int, inputs: list[str]) -> Probe:
        import numpy as np  # numpy: 0.2 s, not needed by doit list
        import onnx  # onnx: 1.5 s, not needed by doit list
        from onnx.utils import Extractor  # onnx: 1.5 s, not needed by doit list

        output = self.onnx.graph.node[node].output[0]
        folder = self.work / name
        folder.mkdir(parents=True, exist_ok=True)
        sub = Extractor(self.onnx).extract_model(inputs, [output])
        sub.graph.name = self.onnx.graph.name  # IREE names the entry point after the graph
        path = folder / "model.onnx"
        path.write_bytes(sub.SerializeToString(deterministic=True))
        feeds = [folder / f"input_{i}.npy" for i in range(len(inputs))]
        for p, n in zip(feeds, inputs):
            np.save(p, self.values[n], allow_pickle=False)
        expected = self.values[output]
        layout = Layout(self.work)
        step = dataclasses.replace(self.compile, inputs={"model": path}, layout=layout,
                                   out_dir=folder / "compile", after=())
        try:
            execute(step)
        except PipelineError as err:
            result = Probe(name, node, True, "compile failed", error=err.what.splitlines()[0])
            self.probes.append(result)
            return result
        vmfb = folder / "compile" / "model.vmfb"
        actual_path = folder / "actual_0.npy"
        where = {k: v for k, v in self.where.items() if k != "stage"}
        argv, executed, env = validate.runner_argv(self.check.cfg, vmfb, feeds, [actual_path],
                                                   {**where, "stage": STAGE},
                                                   shader_cache=self.project.layout.shader_cache)
        run = run_tool(argv, log=layout.log(STAGE, name), what=f"running {name}", env=env,
                       check=False, timeout=3600, progress=f"bisect {name}", **self.where)
        if run.returncode != 0:
            lines = run.output.strip().splitlines()
            result = Probe(name, node, True, "run failed", error=lines[-1] if lines else None)
        else:
            got = compare([np.load(actual_path, allow_pickle=False)], [expected], [output],
                          self.tolerance_for(expected))
            result = Probe(name, node, not got["passed"], summary(got))
        self.probes.append(result)
        return result

    def tolerance_for(self, expected) -> dict:
        """The model's tolerance, its absolute bounds scaled by the tensor's magnitude: an
        intermediate tensor in the tens carries rounding in the 1e-6s that is no bug (the model's
        own outputs are often probabilities, in 0..1)."""
        import numpy as np  # numpy: 0.2 s, not needed by doit list
        scale = max(1.0, float(np.abs(expected).max())) if expected.size else 1.0
        return {**self.tolerance, "max_abs": self.tolerance["max_abs"] * scale,
                "mean_abs": self.tolerance["mean_abs"] * scale}

    def prefix(self, node: int) -> Probe:
        return self.probe(f"prefix_{node:04d}", node, list(self.feeds))

    # ---- the search ---------------------------------------------------------------------------
    def run(self, say=print) -> dict:
        cands = self.candidates()
        if not cands:
            raise PipelineError("the static model has no float node outputs to cut at",
                                **self.where)
        last = self.prefix(cands[-1])
        say(f"bisect: {len(cands)} cut points; the whole model: {last.figures}")
        if not last.wrong:
            return self._finish(None, None, "the last node's output matches onnxruntime: the "
                                            "compiled model is right on the golden inputs")
        lo, hi = -1, len(cands) - 1   # cands[lo] right (or nothing), cands[hi] wrong
        while hi - lo > 1:
            mid = (lo + hi) // 2
            p = self.prefix(cands[mid])
            say(f"bisect: prefix up to node {cands[mid]} "
                f"({self.onnx.graph.node[cands[mid]].op_type}): {'WRONG' if p.wrong else 'right'} "
                f"({p.figures})")
            lo, hi = (lo, mid) if p.wrong else (mid, hi)
        first = cands[hi]
        window = self._window(first, say)
        return self._finish(first, window, None)

    def _window(self, node: int, say) -> dict | None:
        """The fewest nodes ending at `node` that go wrong on their own."""
        nodes = self.onnx.graph.node
        inits = {i.name for i in self.onnx.graph.initializer}
        for size in range(1, MAX_WINDOW + 1):
            start = node - size + 1
            if start < 0:
                break
            inside = {o for n in nodes[start:node + 1] for o in n.output}
            inputs = sorted({i for n in nodes[start:node + 1] for i in n.input
                             if i and i not in inside and i not in inits and i in self.values})
            p = self.probe(f"window_{node:04d}_{size}", node, inputs)
            say(f"bisect: window of {size} node(s) ending at node {node}: "
                f"{'WRONG' if p.wrong else 'right'} ({p.figures})")
            if p.wrong:
                return {"first": start, "last": node, "inputs": inputs, "probe": p.name}
        return None

    def _node(self, k: int) -> dict:
        import onnx  # onnx: 1.5 s, not needed by doit list
        node = self.onnx.graph.node[k]
        shapes = {v.name: [d.dim_value if d.HasField("dim_value") else d.dim_param
                           for d in v.type.tensor_type.shape.dim]
                  for v in list(self.onnx.graph.value_info) + list(self.onnx.graph.input)
                  + list(self.onnx.graph.output)}
        inits = {i.name: list(i.dims) for i in self.onnx.graph.initializer}
        attrs = {}
        for a in node.attribute:
            v = onnx.helper.get_attribute_value(a)
            attrs[a.name] = v.decode() if isinstance(v, bytes) else (
                list(v) if isinstance(v, (list, tuple)) else v if isinstance(v, (int, float, str)) else str(type(v).__name__))
        return {"index": k, "name": node.name, "op": node.op_type, "attributes": attrs,
                "inputs": [{"name": i, "shape": shapes.get(i, inits.get(i))} for i in node.input if i],
                "outputs": [{"name": o, "shape": shapes.get(o)} for o in node.output]}

    def _finish(self, first: int | None, window: dict | None, verdict: str | None) -> dict:
        report = {"model": self.model.name, "target": self.target.name, "abi": self.abi.name,
                  "validated_as": "twin" if self.twin else self.abi.run.get("via"),
                  "compile_config": self.compile.config, "tolerance": self.tolerance,
                  "probes": [dataclasses.asdict(p) for p in self.probes]}
        for stale in ("repro.onnx", "expected_0.npy", "actual_0.npy"):
            (self.report_dir / stale).unlink(missing_ok=True)
        for stale in self.report_dir.glob("input_*.npy"):
            stale.unlink()
        if first is None:
            report["verdict"] = verdict
        else:
            report["first_wrong_node"] = self._node(first)
            report["verdict"] = (f"node {first} ({self.onnx.graph.node[first].op_type}) is the first "
                                 "whose output is wrong")
            if window:
                report["window"] = {**window, "nodes": [self._node(k) for k in
                                                        range(window["first"], window["last"] + 1)]}
                src = self.work / window["probe"]
                shutil.copyfile(src / "model.onnx", self.report_dir / "repro.onnx")
                for p in src.glob("input_*.npy"):
                    shutil.copyfile(p, self.report_dir / p.name)
                if (src / "actual_0.npy").is_file():  # absent when the window failed to run
                    shutil.copyfile(src / "actual_0.npy", self.report_dir / "actual_0.npy")
                import numpy as np  # numpy: 0.2 s, not needed by doit list
                np.save(self.report_dir / "expected_0.npy",
                        self.values[self.onnx.graph.node[first].output[0]], allow_pickle=False)
            else:
                report["window"] = None
                report["verdict"] += (f"; no window of up to {MAX_WINDOW} nodes ending there goes "
                                      "wrong on its own (the bug needs more context)")
        (self.report_dir / "report.json").write_text(pretty_json(report))
        return report


def command(project, model_name: str | None, target_name: str | None, abi_name: str | None) -> str:
    """`doit bisect`: run a bisection and say what it found (PipelineError on misuse)."""
    if not (model_name and target_name and abi_name):
        raise PipelineError("say which build to bisect: doit bisect model=NAME target=T abi=A",
                            stage=STAGE, hint="e.g. doit bisect model=ppocr_cls target=rk3588 "
                                              "abi=vulkan-baseline")
    model = next((m for m in project.models if m.name == model_name), None)
    if model is None:
        raise PipelineError(f"no model {model_name!r}; models: "
                            f"{', '.join(m.name for m in project.models)}", stage=STAGE)
    target = next((t for t in project.targets if t.name == target_name), None)
    abis = [a for a in target.abis if IREE.builds(a)] if target else []
    abi = next((a for a in abis if a.name == abi_name), None)
    if abi is None:
        known = ", ".join(a.name for a in abis)
        raise PipelineError(f"target {target_name!r} has no ABI {abi_name!r}" +
                            (f"; its ABIs: {known}" if known else ""), stage=STAGE)
    folder = project.layout.bisect_report(target.name, model.name, abi.name)
    folder.mkdir(parents=True, exist_ok=True)
    report = Bisection(project, model, target, abi, folder).run()
    lines = [f"bisect {model.name} for {target.name}/{abi.name}: {report['verdict']}"]
    node = report.get("first_wrong_node")
    if node:
        ins = ", ".join(f"{i['name']} {i['shape']}" for i in node["inputs"])
        outs = ", ".join(f"{o['name']} {o['shape']}" for o in node["outputs"])
        lines.append(f"  {node['op']} {node['name'] or ''} {json.dumps(node['attributes'], sort_keys=True)}")
        lines.append(f"  inputs: {ins}\n  outputs: {outs}")
        if report.get("window"):
            w = report["window"]
            lines.append(f"  standalone repro: nodes {w['first']}..{w['last']} "
                         f"({' -> '.join(n['op'] for n in w['nodes'])}): {folder / 'repro.onnx'}")
    lines.append(f"  report: {folder / 'report.json'} ({len(report['probes'])} builds)")
    return "\n".join(lines)
