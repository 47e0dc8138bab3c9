"""`doit profile`'s mapping from what the runtimes time back to ONNX nodes: pure functions, no
toolchain run. The names and text below were recorded from real runs on the default models
(IREE 3.13 `iree-benchmark-module --dispatch_statistics`, `iree-compile
--compile-to=executable-sources --mlir-print-debuginfo`, onnxruntime 1.32's optimised graph)."""
from __future__ import annotations

import json

import pytest

from pipeline.bench import profile as P
from pipeline.core.layout import Layout


def graph(*specs, shapes=None) -> P.Graph:
    """A Graph of (name, op, inputs, outputs[, category]) in graph order."""
    nodes = [P.Node(s[0], s[1], k, tuple(s[2]), tuple(s[3]), s[4] if len(s) > 4 else s[1])
             for k, s in enumerate(specs)]
    return P.Graph(nodes, shapes or {})


# ----------------------------------------------------------------------------- IREE names
@pytest.mark.parametrize("name, ordinal, kind, dims, dtype", [
    ("main$async_dispatch_58_conv_2x160x200x5x5_f32", 58, "conv", [2, 160, 200, 5, 5], "f32"),
    ("main$async_dispatch_57_matmul_like_200x2x160x32_f32", 57, "matmul_like", [200, 2, 160, 32],
     "f32"),
    ("main$async_dispatch_60_matvec_like_50x200_f32", 60, "matvec_like", [50, 200], "f32"),
    ("main$async_dispatch_91_elementwise_64x120x160_f32", 91, "elementwise", [64, 120, 160], "f32"),
    ("main$async_dispatch_59_reduction_200x320_f32", 59, "reduction", [200, 320], "f32"),
    ("main$async_dispatch_75_softmax_2xf32_dispatch_tensor_store", 75, "softmax", [2], "f32"),
    ("_encoding_37_encode_32x960xf32_to_32x960xf32", 37, "encode", [32, 960], "f32"),
    ("main$async_dispatch_0_slow_memcpy", 0, "slow_memcpy", [], None),
])
def test_dispatch_names_give_kind_dims_and_type(name, ordinal, kind, dims, dtype):
    assert P.parse_dispatch(name) == {"ordinal": ordinal, "kind": kind, "dims": dims, "dtype": dtype}


SHAPES = {"dw": (1, 200, 2, 160), "pw": (1, 200, 2, 160), "add": (1, 200, 2, 160),
          "gap": (1, 200, 1, 1), "other": (1, 64, 2, 160)}
CLS = graph(("Conv@43", "Conv", ["x"], ["dw"], "Conv depthwise"),
            ("Conv@44", "Conv", ["dw"], ["pw"], "Conv pointwise"),
            ("Add@1", "Add", ["pw", "dw"], ["add"]),
            ("GlobalAveragePool@7", "GlobalAveragePool", ["add"], ["gap"]),
            ("Conv@45", "Conv", ["add"], ["other"], "Conv pointwise"), shapes=SHAPES)


def test_kind_and_shape_fallback_takes_ops_of_the_kind_whose_size_is_in_the_name():
    # a conv dispatch over 200 channels of 2x160: both convs of that output size, not the Add,
    # not the conv with 64 channels
    assert P.by_kind_and_shape("main$async_dispatch_58_conv_2x160x200x5x5_f32", CLS) == [
        "Conv@43", "Conv@44"]
    # IREE collapses 2x160 into 320 in an elementwise dispatch
    assert P.by_kind_and_shape("main$async_dispatch_62_elementwise_200x320_f32", CLS) == ["Add@1"]
    assert P.by_kind_and_shape("main$async_dispatch_62_elementwise_64x320_f32", CLS) == []
    assert P.by_kind_and_shape("main$async_dispatch_59_reduction_200x320_f32", CLS) == [
        "GlobalAveragePool@7"]
    assert P.by_kind_and_shape("_encoding_37_encode_32x960xf32_to_32x960xf32", CLS) == []


# As iree-compile prints executable sources with debug info (trimmed): one executable, its body's
# arithmetic with the nodes fused into it, and the host code's call sites, one of them twice
# (two ONNX nodes of the same shape share one executable), one through a #loc alias.
SOURCES = """\
  hal.executable private @main$async_dispatch_58 {
    hal.executable.variant public @embedded_elf_x86_64 target(<"llvm-cpu", "embedded-elf-x86_64", {cpu = "x86-64-v3"}>) {
      hal.executable.export public @main$async_dispatch_58_conv_2x160x200x5x5_f32 ordinal(0) layout(#pipeline_layout) count(%arg0: !hal.device loc("Conv@43")) -> (index, index, index) {
        %x, %y, %z = iree_tensor_ext.dispatch.workgroup_count_from_slice() loc("Conv@43")
        hal.return %x, %y, %z : index, index, index loc("Conv@43")
      } loc("Conv@43")
      builtin.module {
        func.func @main$async_dispatch_58_conv_2x160x200x5x5_f32() {
          %cst = arith.constant 6.000000e+00 : f32 loc(unknown)
          %4 = arith.index_castui %0 : i32 to index loc("Conv@42")
          %16 = tensor.empty() : tensor<200x2x160xf32> loc("Conv@42")
          %19 = linalg.generic {indexing_maps = [], iterator_types = ["parallel"]} ins(%18, %15 : tensor<200x2x160xf32>, tensor<200xf32>) outs(%16 : tensor<200x2x160xf32>) {
          ^bb0(%in: f32 loc("Conv@43"), %in_2: f32 loc("Conv@43"), %out: f32 loc("Conv@42")):
            %20 = arith.addf %in, %in_2 : f32 loc("Conv@43")
            %21 = arith.addf %20, %cst_1 : f32 loc("Add@33")
            %22 = arith.cmpf ult, %21, %cst_0 : f32 loc("Clip@14")
            %26 = arith.mulf %20, %25 : f32 loc("Mul@21")
            %27 = arith.divf %26, %cst : f32 loc("Div@14")
            linalg.yield %27 : f32 loc(fused["Div@14", "Conv@43", "Clip@14", "Clip@0"])
          } -> tensor<200x2x160xf32> loc(fused["Div@14", "Conv@43", "Clip@14", "Clip@0"])
          return loc("Conv@43")
        } loc("Conv@43")
      } loc("Conv@43")
    } loc("Conv@43")
  } loc("Conv@43")
  util.func public @main(%arg0: !hal.buffer_view loc("x")) -> !hal.buffer_view {
      stream.cmd.dispatch @main$async_dispatch_58::@embedded_elf_x86_64::@main$async_dispatch_58_conv_2x160x200x5x5_f32(%c266688_i32, %c129600_i32 : i32, i32) {
        ro %arg7[%c0 for %c1309888] : !stream.resource<transient>{%c1309888},
        wo %arg7[%c0 for %c1309888] : !stream.resource<transient>{%c1309888}
      } loc("Conv@43")
      stream.cmd.concurrent {
        stream.cmd.dispatch @main$async_dispatch_62::@embedded_elf_x86_64::@main$async_dispatch_62_elementwise_200x320_f32(%c1053888_i32 : i32) {
          ro %arg7[%c0 for %c1309888] : !stream.resource<transient>{%c1309888},
          wo %arg7[%c0 for %c1309888] : !stream.resource<transient>{%c1309888}
        } loc(#loc7)
        stream.cmd.dispatch @_encoding_43::@embedded_elf_x86_64::@_encoding_43_encode_32x320xf32_to_32x320xf32(%c297792_i32 : i32) {
          ro %arg7[%c0 for %c1309888] : !stream.resource<transient>{%c1309888}
        } loc("Add@36")
      } loc(fused["Add@36", "Mul@22", "Div@14", "HardSigmoid@7"])
      stream.cmd.dispatch @main$async_dispatch_58::@embedded_elf_x86_64::@main$async_dispatch_58_conv_2x160x200x5x5_f32(%c338752_i32, %c149632_i32 : i32, i32) {
        wo %arg7[%c0 for %c1309888] : !stream.resource<transient>{%c1309888}
      } loc("Conv@48")
  } loc("graph:main")
#loc7 = loc(fused[#loc8, "Div@14"])
#loc8 = loc("Mul\\4022")
"""


def test_call_sites_and_fused_body_ops_come_from_the_locations():
    locs = P.dispatch_locations(SOURCES)
    conv = locs["main$async_dispatch_58_conv_2x160x200x5x5_f32"]
    assert conv["sites"] == [["Conv@43"], ["Conv@48"]]  # one list per call
    # the body's arithmetic: the activation fused after the conv; constants and index casts
    # (the tensor.empty shared with Conv@42, the yield's fused Clip@0) are left out
    assert conv["body"] == ["Conv@43", "Add@33", "Clip@14", "Mul@21", "Div@14"]
    # a #loc alias, nested, with MLIR's \XX escape (\40 is "@")
    assert locs["main$async_dispatch_62_elementwise_200x320_f32"]["sites"] == [["Mul@22", "Div@14"]]
    assert locs["_encoding_43_encode_32x320xf32_to_32x320xf32"]["sites"] == [["Add@36"]]


def test_nodes_a_graph_rewrite_put_in_place_of_one_map_to_it():
    g = graph(("Conv.78", "Conv", ["x"], ["c"], "Conv depthwise"),
              ("blk__a", "Relu", ["c"], ["r"]), ("Add.1", "Add", ["r", "c"], ["y"]))
    # abi_rewrites names its nodes <replaced node>__<part>; the original name may hold "__"
    assert g.ordered(["Add.1", "Conv.78__tap0_1", "Conv.78__sum", "blk__a__pad", "other__x"]) == \
        ["Conv.78", "blk__a", "Add.1"]
    assert (g.known("Conv.78__mul2_2"), g.known("blk__a"), g.known("Conv.7__sum")) == \
        ("Conv.78", "blk__a", None)


def test_iree_entries_take_the_call_sites_and_count_a_dispatch_under_its_own_kind():
    g = graph(("Conv@43", "Conv", ["x"], ["c43"], "Conv depthwise"),
              ("Add@33", "Add", ["c43"], ["a"]), ("Clip@14", "Clip", ["a"], ["cl"]),
              ("Mul@21", "Mul", ["c43", "cl"], ["m"]), ("Div@14", "Div", ["m"], ["d"]),
              ("Conv@48", "Conv", ["d"], ["c48"], "Conv depthwise"),
              ("Mul@22", "Mul", ["c48"], ["m22"]), ("Add@36", "Add", ["m22"], ["a36"]),
              ("Conv@90", "Conv", ["a36"], ["c90"], "Conv pointwise"),
              shapes={"c90": (1, 16, 8, 8)})
    stats = {"main$async_dispatch_58_conv_2x160x200x5x5_f32": {"ms": 4.0, "calls": 2},
             "main$async_dispatch_62_elementwise_200x320_f32": {"ms": 0.5, "calls": 1},
             "_encoding_43_encode_32x320xf32_to_32x320xf32": {"ms": 0.1, "calls": 1},
             "main$async_dispatch_99_matmul_like_16x64x16_f32": {"ms": 0.2, "calls": 1}}
    entries = {e["name"]: e for e in P.iree_entries(stats, P.dispatch_locations(SOURCES), g)}
    conv = entries["main$async_dispatch_58_conv_2x160x200x5x5_f32"]
    assert conv["onnx_nodes"] == ["Conv@43", "Conv@48"]
    assert conv["fused"] == ["Add@33", "Clip@14", "Mul@21", "Div@14"]
    assert (conv["category"], conv["mapped_by"], conv["calls"]) == ("Conv depthwise", "locations", 2)
    ew = entries["main$async_dispatch_62_elementwise_200x320_f32"]
    assert ew["onnx_nodes"] == ["Div@14", "Mul@22"] and ew["category"] == "Div"
    assert entries["_encoding_43_encode_32x320xf32_to_32x320xf32"]["category"] == \
        "(IREE data-tiling relayout)"
    # not among the executable sources: mapped by its name's kind and dims, and said so
    mm = entries["main$async_dispatch_99_matmul_like_16x64x16_f32"]
    assert (mm["onnx_nodes"], mm["mapped_by"], mm["category"]) == (
        ["Conv@90"], "kind+shape", "Conv pointwise")


def test_an_elementwise_dispatch_holding_a_conv_bias_counts_as_elementwise():
    g = graph(("Conv.63", "Conv", ["x"], ["c"], "Conv pointwise"),
              ("Resize.2", "Resize", ["y"], ["r"]), ("Add.182", "Add", ["c", "r"], ["a"]))
    locs = {"main$async_dispatch_91_elementwise_64x120x160_f32":
            {"sites": [["Conv.63", "Add.182"]], "body": ["Resize.2"]},
            "main$async_dispatch_90_matmul_like_64x19200x32_f32": {"sites": [["Conv.63"]], "body": []}}
    stats = {k: {"ms": 1.0, "calls": 1} for k in locs}
    cats = {e["kind"]: e["category"] for e in P.iree_entries(stats, locs, g)}
    assert cats == {"elementwise": "Resize", "matmul_like": "Conv pointwise"}


def test_an_elementwise_dispatch_a_rewrite_made_of_a_conv_counts_as_that_conv():
    g = graph(("Conv.78", "Conv", ["x"], ["c"], "Conv depthwise"), ("Relu.1", "Relu", ["c"], ["r"]))
    locs = {"main$async_dispatch_9_elementwise_64x120x160_f32":  # depthwise_conv_as_slices
            {"sites": [["Conv.78__tap0_0", "Conv.78__mul0_0", "Conv.78__sum", "Relu.1"]], "body": []}}
    entry, = P.iree_entries({k: {"ms": 1.0, "calls": 1} for k in locs}, locs, g)
    assert (entry["onnx_nodes"], entry["category"], entry["mapped_by"]) == (
        ["Conv.78", "Relu.1"], "Conv depthwise", "locations")


def test_read_benchmark_takes_the_run_and_each_dispatch_per_iteration():
    doc = {"benchmarks": [
        {"name": "BM_main/process_time/real_time", "real_time": 18.71, "time_unit": "ms"},
        {"name": "BM_main/main$async_dispatch_58_conv_2x160x200x5x5_f32", "real_time": 4438.1,
         "time_unit": "us", "calls": 2.0, "percent": 42.9},
        {"name": "BM_main/_encoding_37_encode_32x960xf32_to_32x960xf32", "real_time": 8100.0,
         "time_unit": "ns", "calls": 1.0, "percent": 0.08}]}
    total, stats = P.read_benchmark(doc)
    assert total == 18.71
    assert stats == {"main$async_dispatch_58_conv_2x160x200x5x5_f32": {"ms": 4.4381, "calls": 2},
                     "_encoding_37_encode_32x960xf32_to_32x960xf32": {"ms": 0.0081, "calls": 1}}


# ----------------------------------------------------------------------------- TVM
def test_tvm_calls_map_by_values_and_unmatched_ones_by_dataflow():
    # face_landmark's pattern: TVM runs a 1x1 conv (no bias yet: no ONNX tensor equals it), then
    # the other branch's MaxPool, then the conv's bias add; the conv belongs with what reads it,
    # not with the MaxPool that ran next
    g = graph(("Conv78", "Conv", ["p"], ["conv"], "Conv pointwise"),
              ("MaxPool76", "MaxPool", ["p"], ["pool"]),
              ("Add81", "Add", ["conv", "pool"], ["sum"]),
              ("Conv2", "Conv", ["x"], ["c2"], "Conv dense"), ("Add3", "Add", ["c2"], ["a3"]),
              ("Clip4", "Clip", ["a3"], ["cl"]), ("Div5", "Div", ["cl"], ["d5"]))
    calls = [{"out": [], "ins": ["p"], "reads": [10], "write": 11},              # conv2d
             {"out": ["pool"], "ins": ["p"], "reads": [10], "write": 12},        # max_pool2d
             {"out": ["conv"], "ins": [], "reads": [11], "write": 11},           # add (bias, in place)
             {"out": ["sum"], "ins": ["conv", "pool"], "reads": [11, 12], "write": 13},
             {"out": ["d5"], "ins": ["x"], "reads": [1], "write": 14}]           # one fused kernel
    placed = P.align(calls, g)
    assert placed[0] == {"nodes": ["Conv78"], "mapped_by": "dataflow"}
    assert placed[1] == {"nodes": ["MaxPool76"], "mapped_by": "values"}
    assert placed[2] == {"nodes": ["Conv78"], "mapped_by": "values"}
    assert placed[3] == {"nodes": ["Add81"], "mapped_by": "values"}
    assert placed[4] == {"nodes": ["Conv2", "Add3", "Clip4", "Div5"], "mapped_by": "values"}


def test_tvm_output_matching_several_tensors_takes_the_one_in_execution_order():
    # Relu of positive values equals its input: the match at or after the previous call wins
    g = graph(("Conv0", "Conv", ["x"], ["c"]), ("Relu0", "Relu", ["c"], ["r"]),
              ("Conv1", "Conv", ["r"], ["c1"]))
    calls = [{"out": ["c", "r"], "ins": ["x"]}, {"out": ["c", "r"], "ins": ["c"]},
             {"out": ["c1"], "ins": ["r"]}]
    assert [p["nodes"] for p in P.align(calls, g)] == [["Conv0"], ["Relu0"], ["Conv1"]]


def test_fingerprints_tell_the_same_tensor_from_another():
    import numpy as np
    a = np.linspace(-1, 1, 24, dtype=np.float32).reshape(2, 3, 4)
    assert P.same_values(P.fingerprint(a), P.fingerprint(a + 1e-7))
    assert P.same_values(P.fingerprint(a), P.fingerprint(a.reshape(6, 4)))  # a view of it
    assert not P.same_values(P.fingerprint(a), P.fingerprint(np.abs(a)))
    assert not P.same_values(P.fingerprint(a), P.fingerprint(a[:1]))


def test_tvm_entries_add_up_calls_of_one_kernel():
    g = graph(("Conv1", "Conv", ["x"], ["a"], "Conv pointwise"), ("Relu1", "Relu", ["a"], ["b"]),
              ("Conv2", "Conv", ["b"], ["c"], "Conv pointwise"), ("Relu2", "Relu", ["c"], ["d"]))
    calls = [{"symbol": "fused_conv2d3_add3_relu1", "ms": 1.0, "nodes": ["Conv1", "Relu1"],
              "mapped_by": "values"},
             {"symbol": "fused_conv2d3_add3_relu1", "ms": 3.0, "nodes": ["Conv2", "Relu2"],
              "mapped_by": "dataflow"}]
    (e,) = P.tvm_entries(calls, g)
    assert (e["calls"], e["ms"], e["kind"], e["category"]) == (2, 4.0, "conv2d3_add3_relu",
                                                              "Conv pointwise")
    assert (e["onnx_nodes"], e["fused"], e["mapped_by"]) == (
        ["Conv1", "Conv2"], ["Relu1", "Relu2"], "dataflow+values")


# ----------------------------------------------------------------------------- onnxruntime
def test_onnxruntime_nodes_map_through_its_optimised_graph():
    # ppocr_cls as onnxruntime 1.32 optimises it: NCHWc convs named after the tensor they write,
    # layout reorders, a Conv with its Relu fused in, nodes kept with their own names
    g = graph(("Conv@0", "Conv", ["x", "w0"], ["conv2d_53.tmp_0"], "Conv dense"),
              ("Add@0", "Add", ["conv2d_53.tmp_0", "k"], ["Add@0"]),
              ("Clip@0", "Clip", ["Add@0"], ["Clip@0"]),
              ("Mul@0", "Mul", ["conv2d_53.tmp_0", "Clip@0"], ["Mul@0"]),
              ("Div@0", "Div", ["Mul@0"], ["hardswish_0.tmp_0"]),
              ("Conv@1", "Conv", ["hardswish_0.tmp_0", "w1"], ["conv2d_54.tmp_0"], "Conv pointwise"),
              ("Relu@0", "Relu", ["conv2d_54.tmp_0"], ["relu_0.tmp_0"]),
              ("Conv@2", "Conv", ["relu_0.tmp_0", "w2"], ["relu_1.tmp_0"], "Conv depthwise"))
    opt = [("conv2d_53.tmp_0_nchwc", "Conv", ("x", "reorder", "_v_575"), ("reorder_token_0",)),
           ("ReorderOutput_token_168", "ReorderOutput", ("reorder_token_0",), ("conv2d_53.tmp_0",)),
           ("Add@0", "Add", ("conv2d_53.tmp_0", "k"), ("Add@0",)),
           ("Clip@0", "Clip", ("Add@0",), ("Clip@0",)),
           ("Mul@0", "Mul", ("conv2d_53.tmp_0", "Clip@0"), ("Mul@0",)),
           ("Div@0", "Div", ("Mul@0",), ("hardswish_0.tmp_0",)),
           ("ReorderInput", "ReorderInput", ("hardswish_0.tmp_0",), ("reorder_token_2",)),
           ("relu_0.tmp_0_nchwc", "Conv", ("reorder_token_2", "reorder_token_1", "_v_577"),
            ("reorder_token_3",)),
           ("relu_1.tmp_0_nchwc", "Conv", ("reorder_token_3", "reorder_token_4"),
            ("reorder_token_5",))]
    m = P.ort_node_map(opt, g)
    assert m["conv2d_53.tmp_0_nchwc"] == ["Conv@0"]
    assert m["relu_0.tmp_0_nchwc"] == ["Conv@1", "Relu@0"]  # the Relu fused into the NCHWc Conv
    assert m["relu_1.tmp_0_nchwc"] == ["Conv@2"]
    assert m["Div@0"] == ["Div@0"] and m["Clip@0"] == ["Clip@0"]
    assert m["ReorderOutput_token_168"] == [] and m["ReorderInput"] == []


def test_onnxruntime_times_leave_out_the_warmup_runs():
    def node(name, ts, dur, op="Conv"):
        return {"cat": "Node", "name": f"{name}_kernel_time", "ts": ts, "dur": dur,
                "args": {"op_name": op}}
    events = [{"cat": "Session", "name": "model_run", "ts": 0, "dur": 100},
              node("Conv@0", 10, 90),                                      # warm-up: left out
              {"cat": "Session", "name": "model_run", "ts": 200, "dur": 50},
              node("Conv@0", 210, 30), node("Relu@0", 240, 5, "Relu"),
              {"cat": "Node", "name": "Conv@0_fence_before", "ts": 209, "dur": 1},
              {"cat": "Session", "name": "model_run", "ts": 300, "dur": 70},
              node("Conv@0", 310, 40), node("Relu@0", 350, 7, "Relu")]
    totals, nodes = P.ort_times(events, warmup=1)
    assert totals == [0.05, 0.07]
    assert nodes == {"Conv@0": {"ms": 0.07, "calls": 2, "op": "Conv"},
                     "Relu@0": {"ms": 0.012, "calls": 2, "op": "Relu"}}


# ----------------------------------------------------------------------------- categories, sides
@pytest.mark.parametrize("group, weight, channels, category", [
    (16, (16, 1, 3, 3), 16, "Conv depthwise"), (16, (32, 1, 5, 5), 16, "Conv depthwise"),
    (4, (16, 4, 3, 3), 16, "Conv grouped"), (1, (32, 16, 1, 1), 16, "Conv pointwise"),
    (1, (32, 16, 3, 3), 16, "Conv dense"), (1, (32, 16, 1, 3), 16, "Conv dense")])
def test_conv_kinds(group, weight, channels, category):
    assert P.conv_category(group, weight, channels) == category


def test_a_side_shares_its_time_by_entry_and_by_category():
    entries = [{"name": "a", "ms": 3.0, "category": "Conv depthwise"},
               {"name": "b", "ms": 1.0, "category": "Add"},
               {"name": "c", "ms": 4.0, "category": "Conv depthwise",
                "split": {"Conv depthwise": 2.0, "Conv pointwise": 2.0}}]
    s = P.side(entries, total_ms=10.0, runtime="tvm", artifact=None, how="", mapping="", outside="")
    assert [e["name"] for e in s["entries"]] == ["c", "a", "b"]
    assert [e["share"] for e in s["entries"]] == [0.5, 0.375, 0.125]
    assert s["entries_ms"] == 8.0 and s["total_ms"] == 10.0
    assert [(c["category"], c["ms"]) for c in s["by_category"]] == [
        ("Conv depthwise", 5.0), ("Conv pointwise", 2.0), ("Add", 1.0)]
    other = P.side([{"name": "n", "ms": 2.0, "category": "Add"}], total_ms=2.0, runtime="onnxruntime",
                   artifact=None, how="", mapping="", outside="")
    rows = P.compare({"cpu": s, "onnxruntime": other})
    assert rows[0] == {"category": "Conv depthwise", "cpu": {"ms": 5.0, "share": 0.625}}
    assert rows[-1] == {"category": "Add", "cpu": {"ms": 1.0, "share": 0.125},
                        "onnxruntime": {"ms": 2.0, "share": 1.0}}


def test_names_as_printed():
    assert P.display_name("main$async_dispatch_58_conv_2x160x200x5x5_f32") == \
        "dispatch_58_conv_2x160x200x5x5_f32"
    assert P.display_name("x" * 80, 20) == "x" * 17 + "..."
    entry = {"onnx_nodes": ["Conv@43", "Conv@48", "Conv@50", "Conv@52"],
             "fused": ["Add@33", "Clip@14", "Add@34"]}
    assert P.nodes_text(entry) == "Conv@43, Conv@48, Conv@50 +1 (+ Add, Clip)"
    assert P.nodes_text({"onnx_nodes": [], "fused": []}) == "-"
    # the header says when entries were only placed by their dispatch's name
    mapped = [{"mapped_by": "locations"}, {"mapped_by": "kind+shape"}, {"mapped_by": "none"}]
    assert P._guessed(mapped) == ", 1 of them only by kind+shape (the dispatch name's op and dims)"
    assert P._guessed(mapped[:1]) == ""


def test_only_profiles_of_the_current_artifacts_reach_the_report(tmp_path):
    layout = Layout(tmp_path)
    manifest = {"models": {"m": {"artifacts": {"cpu": {"sha256": "a" * 64}}},
                           "n": {"artifacts": {"cpu": {"sha256": "b" * 64}}},
                           "o": {"artifacts": {}}}}
    for model, sha in (("m", "a" * 64), ("n", "c" * 64)):
        path = layout.profile_report("host", model) / "profile.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps({"schema": P.SCHEMA, "runtimes": {
            "cpu": {"artifact": {"sha256": sha}}, "onnxruntime": {}}}))
    assert list(P.current(layout, "host", manifest)) == ["m"]  # n's artifact was rebuilt since


def test_options_from_doit_vars():
    o = P.Options.from_vars({"iterations": "4", "rounds": "2", "abi": "cpu-x86_64", "threads": None})
    assert (o.iterations, o.rounds, o.abi, o.threads, o.warmup) == (4, 2, "cpu-x86_64", None, 2)
    from pipeline.core.errors import PipelineError
    with pytest.raises(PipelineError, match="profile option rounds='two' is not valid"):
        P.Options.from_vars({"rounds": "two"})
    with pytest.raises(PipelineError, match="iterations=0: must be >= 1"):
        P.Options.from_vars({"iterations": "0"})
