"""RKNN's per-layer accuracy analysis without the toolkit: its error_analysis.txt (a real one,
tests/fixtures/rknn_analysis) read into rows, the record and its summary, the int8 child's
command line, and `doit accuracy`'s text of it."""
from __future__ import annotations

from pathlib import Path

import pytest

from conftest import REPO
from pipeline.stages.accuracy import render_npu
from pipeline.stages.quantize import Samples
from pipeline.stages.rknn_compile import (ANALYSIS, Config, analysis_record, analysis_summary,
                                          driver_argv, outputs_of, parse_error_analysis)

TEXT = (REPO / "tests/fixtures/rknn_analysis/error_analysis.txt").read_text()
FP16 = Config(compiler="rknn", backend="npu", target_platform="rk3588", precision="fp16",
              entry="main", librknnrt="2.5.0",
              inputs=({"name": "x", "shape": [1, 3, 16, 16], "dtype": "float32"},), n_outputs=1)
INT8 = Config(**{**FP16.as_key(), "precision": "int8", "preprocessing": {},
                 "calibration": Samples(kind="npy", files=("a.npy",)), "algorithm": "normal"})


def test_the_toolkits_table_is_read_row_by_row_with_fused_layers_left_without_figures():
    rows = parse_error_analysis(TEXT)
    assert [(r["op"], r["layer"]) for r in rows][:5] == [
        ("Input", "x"), ("exDataConvert", "x_int8"), ("Add", "xs"), ("Conv", "c1"), ("Relu", "r1")]
    assert len(rows) == 13 and [r["index"] for r in rows] == list(range(13))
    assert rows[3]["entire"] is None and rows[3]["single"] is None   # Conv c1: fused with its Relu
    assert rows[9] == {"index": 9, "layer": "logits_mm", "op": "Conv",
                       "entire": {"cosine": 0.99977, "euclidean": 0.18562},
                       "single": {"cosine": 0.99976, "euclidean": 0.19007}}
    # a long name runs into the figures' column: still one space before them
    long = "[Conv] " + "n" * 60 + " 0.5 | 1.0   0.25 | 2.0"
    row = parse_error_analysis("-----\n" + long)[0]
    assert row["layer"] == "n" * 60 and row["single"] == {"cosine": 0.25, "euclidean": 2.0}


def test_a_table_the_parser_cannot_read_is_an_error_not_an_empty_record():
    with pytest.raises(ValueError, match="no layer table"):
        parse_error_analysis("# simulator_error\nlayer_name\n")
    with pytest.raises(ValueError, match="does not read as a layer: 'Conv c1 0.9'"):
        parse_error_analysis(TEXT + "Conv c1 0.9\n")


def test_the_record_orders_the_worst_layers_and_its_summary_names_them():
    rows = parse_error_analysis(TEXT)
    record = analysis_record(rows, {"file": "model.rknn", "sha256": "ab" * 32},
                             [{"file": "input_0.npy", "sha256": "cd" * 32}], "rknn-toolkit2 2.5.0")
    single = [rows[i]["single"]["cosine"] for i in record["worst_first"]["single"]]
    assert single == sorted(single) and len(single) == 11   # the two fused Convs have no figures
    assert [rows[i]["layer"] for i in record["worst_first"]["single"][:2]] == ["logits_mm",
                                                                               "logits_mm__float16"]
    assert analysis_summary(record) == {
        "file": ANALYSIS, "what": analysis_summary(record)["what"], "layers": 13,
        "worst_single": {"layer": "logits_mm", "op": "Conv", "cosine": 0.99976},
        "worst_entire": {"layer": "logits_mm", "op": "Conv", "cosine": 0.99977}}


def test_int8_children_run_the_driver_through_the_analysis_script_and_fp16_ones_do_not():
    root = Path("/tmp/rknn-abcdefgh")
    fp16 = driver_argv(FP16, root)
    assert fp16[4] == "driver.py" and "--analysis" not in fp16 and "--driver" not in fp16
    first, second = driver_argv(INT8, root, analysis=True), driver_argv(INT8, root)
    assert first[4] == second[4] == "analysis.py"
    assert first[-6:] == ["--driver", "driver.py", "--analysis", "analysis", "--summary", "summary.json"]
    assert second[-4:] == ["--driver", "driver.py", "--summary", "summary.json"]
    assert ANALYSIS in outputs_of(1, "int8") and ANALYSIS not in outputs_of(1, "fp16")


def test_doit_accuracy_prints_the_worst_layers_beside_onnxruntimes_cosine_at_the_same_tensor():
    rows = parse_error_analysis(TEXT)
    record = analysis_record(rows, {"file": "model.rknn", "sha256": "ab" * 32}, [], "rknn-toolkit2 2.5.0")
    text = render_npu(record, "rk3588/npu", {"logits_mm": {"cosine": 0.9912}}, worst=3)
    lines = text.splitlines()
    assert lines[0].startswith("NPU rk3588/npu: RKNN's own per-layer analysis of the last build's "
                               "model.rknn (sha256 abababababab")
    single = lines[lines.index(next(l for l in lines if "worst 3 by cosine single" in l)) + 2:][:3]
    assert [l.split()[1] for l in single] == ["logits_mm", "logits_mm__float16", "r1"]
    assert single[0].split()[3:5] == ["0.99976", "0.99977"] and single[0].split()[-1] == "0.99120"
    assert single[1].split()[-1] == "-"   # not a tensor of the ONNX graph
