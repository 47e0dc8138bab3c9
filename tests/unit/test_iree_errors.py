"""compilers/iree_compiler.py: IREE's own diagnostics out of real iree-compile output, and the
flag sets a build with declared fallbacks tries.

The outputs below are verbatim iree-compile 3.13.0 runs (x86_64, llvm-cpu, x86-64-v3):
STRIDED_CONV: a Conv1d with stride 2 and a 1-long output on a 4-long input (tiny model of
tests/e2e/test_coverage.py's rule); PAD_ZERO: tests/conftest.py tiny_onnx compiled with
`--iree-preprocessing-pass-pipeline=builtin.module(util.func(iree-preprocessing-pad-linalg-ops{pad-size=0}))`
(the flag tests/e2e/test_fallback.py makes a build fall back from).
"""
from pipeline.compilers.iree_compiler import attempts, diagnostics, first_error

STRIDED_CONV = 'sconv.mlir:5:10: error: \'linalg.generic\' op inferred input/output operand #1 has shape\'s dimension #2 to be 4, but found 3\n    %1 = torch.operator "onnx.Conv"(%arg0, %0) {torch.onnx.pads = [0 : si64, 0 : si64], torch.onnx.strides = [2 : si64]} : (!torch.vtensor<[1,2,4],f32>, !torch.vtensor<[4,2,3],f32>) -> !torch.vtensor<[1,4,1],f32> \n         ^\nsconv.mlir:5:10: note: see current operation: \n%7 = "linalg.generic"(%4, %1, %6) <{indexing_maps = [affine_map<(d0, d1, d2) -> (d1, d2)>, affine_map<(d0, d1, d2) -> (d0, d1, d2)>, affine_map<(d0, d1, d2) -> (d0)>], iterator_types = [#linalg.iterator_type<parallel>, #linalg.iterator_type<reduction>, #linalg.iterator_type<reduction>], operandSegmentSizes = array<i32: 2, 1>}> ({\n^bb0(%arg3: f32, %arg4: f32, %arg5: f32):\n  %12 = "arith.mulf"(%arg3, %arg4) <{fastmath = #arith.fastmath<none>}> : (f32, f32) -> f32\n  %13 = "arith.addf"(%arg5, %12) <{fastmath = #arith.fastmath<none>}> : (f32, f32) -> f32\n  "linalg.yield"(%13) : (f32) -> ()\n}) : (tensor<2x4xf32>, tensor<4x2x3xf32>, tensor<4xf32>) -> tensor<4xf32>\n'

PAD_ZERO = 'tiny.mlir:12:10: error: specified type \'tensor<-2147483648x-2147483648xf32>\' does not match the inferred type \'tensor<2147483648x2147483648xf32>\'\n    %8 = torch.operator "onnx.Gemm"(%7, %2, %3) {torch.onnx.transB = 1 : si64} : (!torch.vtensor<[1,8],f32>, !torch.vtensor<[10,8],f32>, !torch.vtensor<[10],f32>) -> !torch.vtensor<[1,10],f32> \n         ^\ntiny.mlir:12:10: note: see current operation: \n%22 = "tensor.pad"(%17) <{operandSegmentSizes = array<i32: 1, 0, 0>, static_high = array<i64: 2147483647, 2147483640>, static_low = array<i64: 0, 0>}> ({\n^bb0(%arg13: index, %arg14: index):\n  "tensor.yield"(%0) : (f32) -> ()\n}) : (tensor<1x8xf32>) -> tensor<-2147483648x-2147483648xf32>\n'


def test_strided_conv_error_names_the_onnx_op_without_the_ir_dump():
    found = diagnostics(STRIDED_CONV)
    assert found[0] == ("sconv.mlir:5:10: error: 'linalg.generic' op inferred input/output operand "
                        "#1 has shape's dimension #2 to be 4, but found 3")
    assert found[1].startswith('    %1 = torch.operator "onnx.Conv"(%arg0, %0)')
    assert found[2].startswith('sconv.mlir:5:10: note: see current operation: %7 = "linalg.generic"')
    assert len(found) == 3  # the region of the dumped op (^bb0, arith.mulf...) is left out
    assert not any("arith.mulf" in l or l.startswith("^bb0") for l in found)
    assert all(len(l) <= 300 for l in found)
    assert first_error(STRIDED_CONV) == found[0]


def test_repeated_notes_are_shown_once_and_the_failing_op_is_the_gemm():
    found = diagnostics(PAD_ZERO)
    assert found[0].startswith("tiny.mlir:12:10: error: specified type "
                               "'tensor<-2147483648x-2147483648xf32>' does not match")
    assert 'torch.operator "onnx.Gemm"' in found[1]
    assert [l for l in found if "note:" in l] == [
        'tiny.mlir:12:10: note: see current operation: %22 = "tensor.pad"(%17) <{operandSegmentSizes = '
        'array<i32: 1, 0, 0>, static_high = array<i64: 2147483647, 2147483640>, static_low = '
        'array<i64: 0, 0>}> ({']
    assert not any("tensor.yield" in l for l in found)


def test_no_diagnostic_gives_the_last_line():
    out = "Traceback (most recent call last):\n  ...\nKilled\n"
    assert diagnostics(out) == []
    assert first_error(out) == "Killed"
    assert diagnostics("<unknown>:0: error: Unknown Vulkan target 'nope'\n") == [
        "<unknown>:0: error: Unknown Vulkan target 'nope'"]


def test_attempts_are_the_own_flags_then_each_fallback_on_its_own():
    cfg = {"flags": ["--iree-opt-data-tiling", "--x"],
           "fallbacks": [{"drop": ["--iree-opt-data-tiling"], "add": [], "why": "a"},
                         {"drop": ["--x"], "add": ["--y"], "why": "b"},
                         {"drop": ["--iree-opt-data-tiling"], "add": [], "why": "same flags as a"}]}
    got = attempts(cfg)
    assert [a["flags"] for a in got] == [["--iree-opt-data-tiling", "--x"], ["--x"],
                                         ["--iree-opt-data-tiling", "--y"]]
    assert [a["fallback"] and a["fallback"]["why"] for a in got] == [None, "a", "b"]
    assert attempts({"flags": []}) == [{"flags": [], "fallback": None}]
