"""Real models in, artifacts out: every model file of a folder (default ../shared/models, one
public model per failure class we know) taken through `doit new` and `doit build` as a user
would, on a target's CPU ABIs, with a table of what came out.

    python bench/public_models.py [--models-from DIR] [--target rk3588] [--only NAME ...] [--keep]

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
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.common import doit, temporary  # noqa: E402 (after the path is set)

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


def hand_edits(spec: Path, source: Path) -> list[str]:
    doc = yaml.safe_load(spec.read_text())
    done = []
    for name, value in CONSTANTS.get(source.name.split("__", 1)[-1], {}).items():
        doc["inputs"][name]["test_data"] = {"random": {"seed": 0, "low": value, "high": value}}
        done.append(f"{name} = {value}")
    for name, (low, high) in RANGES.get(source.name.split("__", 1)[-1], {}).items():
        doc["inputs"][name]["test_data"] = {"random": {"seed": 0, "low": low, "high": high}}
        done.append(f"{name} in [{low:g}, {high:g}]")
    tol = TOLERANCES.get(source.name.split("__", 1)[-1])
    if tol:
        doc["tolerance"] = tol
        done.append(f"tolerance {tol}")
    spec.write_text(yaml.safe_dump(doc, sort_keys=False))
    return done


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models-from", type=Path, default=REPO.parent / "shared" / "models")
    parser.add_argument("--target", default="rk3588")
    parser.add_argument("--only", nargs="*", default=None, help="file name substrings")
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args(argv)
    files = sorted(p for p in args.models_from.iterdir()
                   if p.suffix in (".onnx", ".tflite") and (not args.only or any(o in p.name for o in args.only)))
    with temporary("modelyard-public-", args.keep) as ws:
        (ws / "models").mkdir()
        rows, new_failed = {}, {}
        for f in files:
            name = short(f)
            shapes = [f"shape={s}" for s in SHAPES.get(f.name.split("__", 1)[-1], [])]
            _, made = doit(ws, "new", f"source={f}", f"name={name}", *shapes)
            if made.returncode != 0:
                new_failed[name] = (made.stdout + made.stderr).strip().splitlines()[-3:]
                continue
            rows[name] = {"file": f.name, "edits": hand_edits(ws / "models" / name / "model.yaml", f)}
        targets = cpu_registry(args.target, ws / "targets")
        elapsed, built = doit(ws, "build", f"target={args.target}", f"targets={targets}")
        manifest = ws / "artifacts" / args.target / "manifest.json"
        _, report = doit(ws, "coverage", f"target={args.target}", f"targets={targets}")
        doc = json.loads(manifest.read_text()) if manifest.is_file() else None
        print(f"public models: {len(files)} files from {args.models_from}, target {args.target} "
              f"(CPU ABIs), build {elapsed:.0f} s, exit {built.returncode}; folder {ws}\n")
        print("| model | status | shipped | rewrites | worst max abs vs golden | hand edits |")
        print("| --- | --- | --- | --- | --- | --- |")
        shipped_all = True
        for name, row in rows.items():
            result = _result(ws / "artifacts", args.target, name)
            if not result["abis"]:
                shipped_all = False
                status = _stopped(name, built.stdout + built.stderr)
                print(f"| {name} | {status} | - | {', '.join(result['rewrites']) or '-'} | - | "
                      f"{'; '.join(row['edits']) or '-'} |")
                continue
            print(f"| {name} | validated | {', '.join(result['abis'])} | "
                  f"{', '.join(result['rewrites']) or '-'} | {result['worst']:.2g} | "
                  f"{'; '.join(row['edits']) or '-'} |")
        for name, lines in new_failed.items():
            shipped_all = False
            print(f"| {name} | `doit new` failed: {' '.join(lines)[:200]} | - | - | - | - |")
        if not doc:
            print("\n(no manifest: at least one model failed; `doit coverage` says where)\n")
            print(report.stdout[-6000:])
        return 0 if shipped_all else 1


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
    for line in output.splitlines():
        if line.startswith(f"[model={name} "):
            return "stopped: " + line[:220].replace("|", "/")
    return "not built"


if __name__ == "__main__":
    sys.exit(main())
