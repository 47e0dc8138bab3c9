"""Detections compared as sets: a cut detector's post-processing (postprocess.onnx, see
spec/postprocess.py) run in onnxruntime on the artifact's outputs and on golden's, and the two
lists of detections matched, not the raw tensors element by element (NMS keeps one of two tied,
overlapping boxes, and which one, and in what order, is not part of the answer).

A detection is one row of the post-processing's outputs: each output's first dim counts the
detections (a leading batch dim of 1 on a rank-3 output is dropped). A float output whose last
dim is 4 holds the boxes (corners, either axis order: IoU is the same); its other float columns
are scores; integer columns are classes (or batch / box indices). Two detections match when
their integer columns are equal, every score differs by at most `score_abs` and their boxes
overlap by IoU >= `iou`. Greedy, golden's detections in order of falling first score, each
taking the best free match. Both lists must match completely.
"""
from __future__ import annotations

from .ort import session


def run_postprocess(path, feeds: dict) -> list:
    """The post-processing's outputs for `feeds` (cut tensors and graph inputs it reads, by
    name); extra feeds are ignored."""
    sess = session(path)
    wanted = {i.name for i in sess.get_inputs()}
    return sess.run(None, {k: v for k, v in feeds.items() if k in wanted})


def _table(outputs: list):
    """(boxes [n, 4] or None, scores [n, k], integers [n, j]) of post-processing outputs."""
    import numpy as np  # numpy: 0.2 s, not needed by doit list
    boxes, scores, ints, counts = None, [], [], set()
    for a in outputs:
        a = np.asarray(a)
        if a.ndim == 3 and a.shape[0] == 1:
            a = a[0]
        if a.ndim == 0:
            a = a.reshape(1)
        rows = a.reshape(a.shape[0], -1)
        counts.add(rows.shape[0])
        if a.dtype.kind == "f" and a.ndim == 2 and a.shape[1] == 4 and boxes is None:
            boxes = rows.astype(np.float64)
        elif a.dtype.kind == "f":
            scores.append(rows.astype(np.float64))
        else:
            ints.append(rows.astype(np.int64))
    if len(counts) > 1:
        raise ValueError(f"the post-processing's outputs count different numbers of detections "
                         f"({sorted(counts)}): each output's first dim must count them")
    n = counts.pop() if counts else 0
    return (boxes, np.concatenate(scores, 1) if scores else np.zeros((n, 0)),
            np.concatenate(ints, 1) if ints else np.zeros((n, 0), np.int64))


def iou(a, b) -> float:
    """IoU of two boxes given by two corners each (either axis order, either corner first)."""
    import numpy as np  # numpy: 0.2 s, not needed by doit list
    lo_a, hi_a = np.minimum(a[:2], a[2:]), np.maximum(a[:2], a[2:])
    lo_b, hi_b = np.minimum(b[:2], b[2:]), np.maximum(b[:2], b[2:])
    inter = np.prod(np.clip(np.minimum(hi_a, hi_b) - np.maximum(lo_a, lo_b), 0, None))
    union = np.prod(hi_a - lo_a) + np.prod(hi_b - lo_b) - inter
    return float(inter / union) if union > 0 else float(np.array_equal(a, b))


def match(actual: list, golden: list, min_iou: float, score_abs: float) -> dict:
    """The two lists of detections (post-processing outputs) matched as sets: the record
    validation.json keeps (counts, matched, worst IoU and score difference, the first unmatched,
    passed)."""
    import numpy as np  # numpy: 0.2 s, not needed by doit list
    a_box, a_score, a_int = _table(actual)
    g_box, g_score, g_int = _table(golden)
    order = (np.argsort(-g_score[:, 0], kind="stable") if g_score.shape[1]
             else np.arange(len(g_int)))
    free = set(range(len(a_int)))
    worst_iou, worst_score, unmatched = 1.0, 0.0, []
    for g in order:
        best, best_iou, best_diff = None, -1.0, 0.0
        for k in sorted(free):
            if not np.array_equal(a_int[k], g_int[g]):
                continue
            diff = float(np.max(np.abs(a_score[k] - g_score[g]))) if g_score.shape[1] else 0.0
            if diff > score_abs:
                continue
            overlap = iou(a_box[k], g_box[g]) if g_box is not None else 1.0
            if overlap >= min_iou and overlap > best_iou:
                best, best_iou, best_diff = k, overlap, diff
        if best is None:
            if len(unmatched) < 5:
                unmatched.append({"golden_row": int(g),
                                  **({"box": g_box[g].tolist()} if g_box is not None else {}),
                                  **({"scores": g_score[g].tolist()} if g_score.shape[1] else {}),
                                  **({"integers": g_int[g].tolist()} if g_int.shape[1] else {})})
            continue
        free.discard(best)
        worst_iou, worst_score = min(worst_iou, best_iou), max(worst_score, best_diff)
    matched = len(a_int) - len(free)
    passed = matched == len(g_int) == len(a_int)
    return {"passed": passed, "golden": int(len(g_int)), "artifact": int(len(a_int)),
            "matched": int(matched), "iou": min_iou, "score_abs": score_abs,
            "min_iou": round(worst_iou, 6) if matched else None,
            "max_score_diff": float(f"{worst_score:.3g}") if matched else None,
            **({"unmatched_golden": unmatched} if unmatched else {})}


def compare(path, cut_names: list[str], actual: list, expected: list, graph_inputs: dict,
            min_iou: float, score_abs: float) -> dict:
    """The post-processing at `path` run on the artifact's outputs and on golden's (both the cut
    tensors, named `cut_names`, plus the model's inputs), and the detections matched."""
    got = run_postprocess(path, {**graph_inputs, **dict(zip(cut_names, actual))})
    want = run_postprocess(path, {**graph_inputs, **dict(zip(cut_names, expected))})
    return match(got, want, min_iou, score_abs)


def check(path, cut_names: list[str], actual: list, golden_doc: dict, golden_inputs: list,
          golden_outputs: list, min_iou: float, score_abs: float) -> dict:
    """compare() for a validation: the artifact's outputs against the golden files (read by
    core.layout.read_golden), the model's inputs fed to the post-processing where it reads them."""
    feeds = {e["name"]: a for e, a in zip(golden_doc["inputs"], golden_inputs)}
    return compare(path, cut_names, actual, golden_outputs, feeds, min_iou, score_abs)


def describe(result: dict) -> str:
    """One line: counts, matched, and the first golden detection left unmatched."""
    first = result.get("unmatched_golden", [{}])[0]
    return (f"{result['matched']} of golden's {result['golden']} detections matched by the "
            f"artifact's {result['artifact']} (IoU >= {result['iou']}, scores within "
            f"{result['score_abs']}, classes equal)"
            + (f"; first unmatched: {first}" if first else ""))
