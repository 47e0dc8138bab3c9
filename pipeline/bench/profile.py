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

Modules: this one, the command (options, the context the profilers share, the run, profile.json);
the static model's graph, profile_graph.py; one profiler per runtime, profile_iree.py,
profile_tvm.py, profile_ort.py; a runtime's side and the comparison, profile_sides.py; the
table as text, profile_text.py.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from ..compilers.backends import BY_FORMAT
from ..compilers.iree_backend import IREE
from ..compilers.tvm_backend import TVM
from ..core.errors import PipelineError
from ..core.layout import Layout
from ..core.store import atomic_write_text, pretty_json, sha256_file
from ..core.tools import cpu_model, distribution_version
from .profile_context import Context, Options
from .profile_graph import load_graph, named
from .profile_iree import IreeProfiler, import_with_locations
from .profile_ort import OrtProfiler
from .profile_sides import ORT, STAGE, compare
from .profile_text import table
from .profile_tvm import TvmProfiler
# Names callers and tests read from here (`from pipeline.bench import profile as P`), each
# defined in the module of its concern:
from .profile_graph import Graph, Node, conv_category  # noqa: F401,E402
from .profile_iree import (by_kind_and_shape, dispatch_locations, iree_entries,  # noqa: F401,E402
                           parse_dispatch, read_benchmark)
from .profile_ort import ort_node_map, ort_times  # noqa: F401,E402
from .profile_sides import side  # noqa: F401,E402
from .profile_text import TOP, _guessed, display_name, nodes_text  # noqa: F401,E402
from .profile_context import fingerprint, same_values  # noqa: F401,E402
from .profile_tvm import align, tvm_entries  # noqa: F401,E402

SCHEMA = "modelyard.profile/1"
VARS = ("abi", "iterations", "rounds", "warmup", "threads")


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
