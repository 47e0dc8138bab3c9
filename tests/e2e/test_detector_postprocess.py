"""Detectors with data-dependent post-processing (`postprocess: {cut: auto}`), on the generated
family tests/families/detectors.py (NMS, TopK with K from data, NonZero; with score ties).

The contract: the cut is found in the graph (the tensors NMS / TopK / NonZero read, walked back
past what only they read); the static part becomes static (no dynamic dim, no data-dependent op)
while the whole model does not; the post-processing, run in onnxruntime on the static part's
outputs, gives the model's own outputs bit for bit; detections are compared as sets (a tied box
swapped for its twin and the rows reordered still match; a moved box, a changed score or class,
a missing detection do not). Two members go through the stages (import, golden, static, IREE
llvm-cpu for the host, validate): validation.json records the detections matched.
"""
from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from families import detectors as det
from pipeline import graph
from pipeline.compilers.backends import backend_of
from pipeline.core.errors import PipelineError, SpecError
from pipeline.core.steps import execute
from pipeline.rewrite.postprocess import split
from pipeline.run.detections import match
from pipeline.release import release
from pipeline.spec.model import load_models
from pipeline.spec.postprocess import find_cut
from pipeline.stages import iree_compile, static, validate

DATA_DEPENDENT = {"NonMaxSuppression", "NonZero", "TopK"}
CUT = {"nms": ["boxes", "scores"], "topk": ["best", "k", "boxes0"],
       "nonzero": ["scores0", "boxes0"]}


def _run(model, feeds: dict) -> list:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    wanted = {i.name for i in sess.get_inputs()}
    return sess.run(None, {k: v for k, v in feeds.items() if k in wanted})


@pytest.mark.parametrize("case", det.cases(), ids=lambda c: c.name)
def test_the_cut_is_found_and_the_parts_give_the_model_outputs(case):
    model = case.model()
    expected = _run(model, case.feeds())
    cut = find_cut(model)
    names = [c["name"] for c in cut["cut"]]
    assert names == CUT[case.head]
    assert cut["outputs"] == [o.name for o in model.graph.output]
    assert cut["inputs"] == (["x"] if case.head == "nms" else [])  # NMS's head reads x's width
    assert DATA_DEPENDENT & set(cut["ops"])
    static_part, post = split(model, names)
    assert [o.name for o in static_part.graph.output] == names
    raw = _run(static_part, case.feeds())
    got = _run(post, {**case.feeds(), **dict(zip(names, raw))})
    assert [g.shape for g in got] == [e.shape for e in expected]
    for g, e in zip(got, expected):
        assert np.array_equal(g, e)
    # the static part becomes static; the whole model does not
    made, _ = static.make_static(static_part, case.inputs())
    assert static.dynamic_tensors(made) == []
    assert not DATA_DEPENDENT - {"TopK"} & {n.op_type for n in made.graph.node}
    with pytest.raises(static.Refusal, match="dynamic dims remain") as refused:
        static.make_static(case.model(), case.inputs())
    seed = {"nms": "NonMaxSuppression", "topk": "TopK", "nonzero": "NonZero"}[case.head]
    assert f"data-dependent post-processing: {seed}" in refused.value.what
    assert "postprocess: {cut: auto}" in refused.value.hint


def test_no_post_processing_is_said():
    model = det.DetectorCase("nms").model()
    assert find_cut(static.make_static(split(model, ["boxes", "scores"])[0],
                                       det.DetectorCase("nms").inputs())[0]) == {
        "error": "the graph has no data-dependent post-processing to cut (no NonMaxSuppression, "
                 "NonZero, or TopK whose K comes from data)"}


# ----------------------------------------------------------------------------- matching
def _detections(case):
    model = case.model()
    return _run(model, case.feeds())


def test_tied_boxes_swapped_and_rows_reordered_still_match():
    boxes, scores, classes = _detections(det.DetectorCase("nms", ties=True))
    # two detections with equal scores (ties): in the artifact's run NMS kept each one's twin
    # (a box shifted by a hair, as one of two tied overlapping anchors would be) and listed
    # the rows in another order
    assert len(set(scores.tolist())) < len(scores)
    order = np.random.default_rng(0).permutation(len(scores))
    twin = boxes.copy()
    twin[0] += 0.001  # boxes are ~0.1 wide (divided by the width)
    actual = [twin[order], scores[order], classes[order]]
    assert not np.array_equal(actual[0], boxes)  # raw, element by element: different
    found = match(actual, [boxes, scores, classes], 0.9, 1e-3)
    assert found["passed"] and found["matched"] == len(scores) == found["golden"]
    assert 0.9 <= found["min_iou"] < 1.0


@pytest.mark.parametrize("change", ["moved", "score", "class", "missing"])
def test_a_changed_detection_does_not_match(change):
    boxes, scores, classes = (a.copy() for a in _detections(det.DetectorCase("nms", ties=True)))
    if change == "moved":
        boxes[1] += 0.05
    elif change == "score":
        scores[1] += 0.01
    elif change == "class":
        classes[1] = 1 - classes[1]
    golden = _detections(det.DetectorCase("nms", ties=True))
    actual = ([np.delete(a, 1, 0) for a in (boxes, scores, classes)] if change == "missing"
              else [boxes, scores, classes])
    found = match(actual, golden, 0.9, 1e-3)
    assert not found["passed"]
    assert found["matched"] == len(golden[0]) - 1
    assert found["unmatched_golden"][0]["golden_row"] == 1


# ----------------------------------------------------------------------------- the spec
def _spec(folder, case, postprocess: str, tolerance: str = "max_abs: 1.0e-4, mean_abs: 1.0e-5"):
    folder.mkdir(parents=True)
    onnx.save(case.model(), folder / "model.onnx")
    sha = hashlib.sha256((folder / "model.onnx").read_bytes()).hexdigest()
    (folder / "model.yaml").write_text(
        f"source: {{path: model.onnx, sha256: {sha}}}\n"
        "inputs:\n  x: {shape: [1, 3, 16, 16], test_data: {random: {seed: 0, low: -1.0, high: 1.0}}}\n"
        f"tolerance: {{{tolerance}, cosine: 0.9999}}\n" + postprocess)


def test_the_spec_names_the_cut_or_says_why_not(tmp_path):
    _spec(tmp_path / "a" / "auto", det.DetectorCase("nms"), "postprocess: {cut: auto}\n")
    _spec(tmp_path / "a" / "named", det.DetectorCase("nms"),
          "postprocess: {cut: [boxes, scores], iou: 0.8}\n")
    auto, named = load_models(tmp_path / "a")
    assert [o["name"] for o in auto.signature["outputs"]] == ["boxes", "scores"]
    assert [o["name"] for o in auto.signature["postprocess_outputs"]] == [
        "det_boxes", "det_scores", "det_classes"]
    assert auto.postprocess["cut"] == named.postprocess["cut"] == ["boxes", "scores"]
    assert named.postprocess["iou"] == 0.8 and not named.postprocess["auto"]
    _spec(tmp_path / "b" / "wrong", det.DetectorCase("nms"), "postprocess: {cut: [boxs]}\n")
    with pytest.raises(SpecError, match=r"postprocess.cut: no tensor named boxs in the graph"):
        load_models(tmp_path / "b")


# ----------------------------------------------------------------------------- the stages
@pytest.mark.parametrize("case", [det.DetectorCase("nms", ties=True, classes=3),
                                  det.DetectorCase("topk")], ids=lambda c: c.name)
def test_the_stages_build_the_static_part_and_validate_detections(tmp_path, case):
    loose = case.head == "topk"  # raw outputs within 0.1: room for a golden changed below
    _spec(tmp_path / "models" / "case", case, "postprocess: {cut: auto}\n",
          "max_abs: 0.1, mean_abs: 0.01" if loose else "max_abs: 1.0e-4, mean_abs: 1.0e-5")
    proj = graph.load_project(tmp_path / "models", tmp_path / "artifacts", "host")
    model = next(m for m in proj.models if m.name == "case")
    host = next(t for t in proj.targets if t.name == "host")
    abi = next(a for a in host.abis if a.name == "cpu-x86_64")
    steps = [next(s for s in proj.steps(stage) if s.name == "case")
             for stage in ("import", "golden", "static")]
    steps += [iree_compile.compile_step(proj.layout, model, host, abi),
              validate.validate_step(proj.layout, model, host, abi)]
    for step in steps:
        execute(step)
    golden = json.loads((steps[1].out_dir / "golden.json").read_text())
    assert [o["name"] for o in golden["outputs"]] == CUT[case.head]
    made = json.loads((steps[2].out_dir / "static.json").read_text())
    assert made["postprocess"]["cut"] == CUT[case.head]
    assert made["vs_original"]["passed"] and not DATA_DEPENDENT - {"TopK"} & set(made["ops"])
    post = onnx.load(steps[2].out_dir / "postprocess.onnx")
    assert [o.name for o in post.graph.output] == [o.name for o in case.model().graph.output]
    checked = json.loads((steps[-1].out_dir / "validation.json").read_text())
    assert checked["status"] == "passed"
    found = checked["detections"]
    assert found["passed"] and found["matched"] == found["golden"] == found["artifact"] > 0
    assert found["min_iou"] >= 0.9 and found["max_score_diff"] <= 1e-3
    if not loose:
        _release_ships_the_post_processing(proj, host, abi, steps, made, checked)
    if loose:  # golden's best score moved by 0.05: the raw outputs still pass, the detections not
        best_file = steps[1].out_dir / golden["outputs"][0]["file"]
        best = np.load(best_file)
        best[0, int(np.argmax(best))] += 0.05
        best_file.chmod(0o644)
        np.save(best_file, best)
        with pytest.raises(PipelineError, match=r"detections differ from golden's: 48 of golden's "
                                                r"49 detections matched .* first unmatched"):
            execute(steps[-1])


# ----------------------------------------------------------------------------- the C runtime's NMS
RUNTIME = Path(__file__).resolve().parents[2] / "runtime"


@pytest.fixture(scope="module")
def test_nms(tmp_path_factory) -> Path:
    """runtime/tests/test_nms.c (C99) linked with the library's nms.c and errors.c (C11), every
    warning an error, as runtime/CMakeLists.txt builds them."""
    out = tmp_path_factory.mktemp("nms")
    flags = ["-Wall", "-Wextra", "-pedantic", "-Werror", f"-I{RUNTIME / 'include'}",
             f"-I{RUNTIME / 'src'}"]
    objects = []
    for src in ("nms.c", "errors.c"):
        objects.append(out / src.replace(".c", ".o"))
        subprocess.run(["cc", "-std=c11", "-O2", "-c", str(RUNTIME / "src" / src), "-o",
                        str(objects[-1]), *flags], check=True)
    exe = out / "test_nms"
    subprocess.run(["cc", "-std=c99", str(RUNTIME / "tests" / "test_nms.c"), *map(str, objects),
                    "-o", str(exe), *flags], check=True)
    return exe


def _ort_nms(boxes, scores, iou, score, most, center) -> np.ndarray:
    from onnx import TensorProto as T
    from onnx import helper as h
    inputs = ["boxes", "scores", "max", "iou"] + (["score"] if score is not None else [])
    inits = [onnx.numpy_helper.from_array(np.array([most], np.int64), "max"),
             onnx.numpy_helper.from_array(np.array([iou], np.float32), "iou")]
    if score is not None:
        inits.append(onnx.numpy_helper.from_array(np.array([score], np.float32), "score"))
    graph = h.make_graph([h.make_node("NonMaxSuppression", inputs, ["selected"],
                                      center_point_box=center)], "nms",
                         [h.make_tensor_value_info("boxes", T.FLOAT, list(boxes.shape)),
                          h.make_tensor_value_info("scores", T.FLOAT, list(scores.shape))],
                         [h.make_tensor_value_info("selected", T.INT64, None)], initializer=inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    return _run(model, {"boxes": boxes, "scores": scores})[0]


def _nms_inputs(kind: str):
    rng = np.random.default_rng(3)
    if kind == "family-ties":  # the detector family's static outputs (scores in quarters: ties)
        case = det.DetectorCase("nms", ties=True, classes=3)
        boxes, scores = _run(split(case.model(), ["boxes", "scores"])[0], case.feeds())
        return boxes, scores
    if kind == "duplicates":  # identical boxes with identical scores: only the index decides
        boxes = np.repeat(rng.uniform(0, 1, (1, 5, 4)).astype(np.float32), 3, axis=1)
        return boxes, np.repeat(rng.uniform(0, 1, (1, 2, 5)).astype(np.float32), 3, axis=2)
    centers = rng.uniform(0, 10, (2, 40, 2))
    sizes = rng.uniform(0.5, 3, (2, 40, 2))
    boxes = np.concatenate([centers, sizes], -1).astype(np.float32)  # xc, yc, w, h
    return boxes, np.round(rng.uniform(0, 1, (2, 4, 40)) * 8).astype(np.float32) / 8


@pytest.mark.parametrize("kind, iou, score, most, center", [
    ("family-ties", 0.3, 0.25, 6, 0), ("family-ties", 0.5, None, 100, 0),
    ("duplicates", 0.5, None, 4, 0), ("centers", 0.4, 0.3, 5, 1), ("centers", 0.0, None, 0, 1)],
    ids=["family-ties", "family-no-threshold", "duplicates", "center-boxes", "max-0"])
def test_the_c_runtime_nms_selects_as_onnxruntime(test_nms, tmp_path, kind, iou, score, most,
                                                  center):
    boxes, scores = _nms_inputs(kind)
    want = _ort_nms(boxes, scores, iou, score, most, center)
    (tmp_path / "b.raw").write_bytes(boxes.tobytes())
    (tmp_path / "s.raw").write_bytes(scores.tobytes())
    batches, classes, n = scores.shape
    r = subprocess.run([str(test_nms), str(tmp_path / "b.raw"), str(tmp_path / "s.raw"),
                        str(batches), str(classes), str(n), str(iou),
                        "none" if score is None else str(score), str(most), str(center),
                        str(tmp_path / "out.raw")], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "not ok" not in r.stdout and r.stdout.count("ok - ") >= 5
    got = np.frombuffer((tmp_path / "out.raw").read_bytes(), np.int64).reshape(-1, 3)
    assert np.array_equal(got, want), (got, want)
    assert len(want) > 0 or most == 0


def _release_ships_the_post_processing(proj, host, abi, steps, made, checked):
    """release.plan on a build manifest whose model entry carries what the manifest stage writes
    for a cut detector (static.json's postprocess + the sha256 of postprocess.onnx): the file
    ships beside the artifact with that sha256, release.json says how to run it."""
    post = steps[2].out_dir / "postprocess.onnx"
    sha = hashlib.sha256(post.read_bytes()).hexdigest()
    backend = backend_of(abi)
    art_file = steps[3].out_dir / backend.artifact
    art = {"path": proj.layout.relative(art_file), "abi": {"name": abi.name, "run": abi.run},
           "sha256": hashlib.sha256(art_file.read_bytes()).hexdigest(),
           "size": art_file.stat().st_size, "format": backend.format, "entry": "main",
           "compile": {"flags": [], "tools": {"iree-base-compiler": "3.13"}},
           "validation": {k: checked[k] for k in ("status", "executed", "tolerance", "outputs",
                                                   "shipped_bytes_executed", "detections")}}
    golden = json.loads((steps[1].out_dir / "golden.json").read_text())
    build = {"target": "host", "models": {"case": {
        "description": "", "source": {}, "artifacts": {abi.name: art},
        "io": {k: [{f: e[f] for f in ("name", "shape", "dtype")} for e in golden[k]]
               for k in ("inputs", "outputs")},
        "postprocess": {**made["postprocess"], "sha256": sha}}}}
    ship, doc, _ = release.plan(proj, host, build)
    assert ship["models/case/postprocess.onnx"] == release.Ship(post, sha)
    entry = doc["models"]["case"]["postprocess"]
    assert entry["file"] == "models/case/postprocess.onnx" and entry["sha256"] == sha
    assert entry["cut"] == ["boxes", "scores"] and entry["inputs"] == ["boxes", "scores", "x"]
    assert entry["outputs"] == ["det_boxes", "det_scores", "det_classes"]
    shipped = doc["models"]["case"]["artifacts"][abi.name]["validation"]["detections"]
    assert shipped == checked["detections"] and shipped["passed"]
