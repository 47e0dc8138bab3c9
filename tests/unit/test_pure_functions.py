"""Pure functions, no toolchain run: Vulkan requirements from IREE's target record and their
match against a device, Vulkan target names checked from the recorded table, IREE's argv."""
from __future__ import annotations

import pytest

from conftest import REPO
from pipeline.compilers import iree_targets
from pipeline.compilers.iree_compiler import compile_flags, unsupported_ops
from pipeline.core.errors import SpecError
from pipeline.graph import load_project
from pipeline.run import vulkan

VALHALL3 = ('iree_gpu.target<arch = "valhall3", features = "spirv:v1.6,cap:Shader", wgp = <compute = '
            'fp32|fp16|int32|int16|int8, storage = b64|b32|b16|b8, subgroup = shuffle|arithmetic, '
            'dot = dp4xi8toi32, subgroup_size_choices = [16], max_workgroup_sizes = [512, 512, 512], '
            'max_thread_count_per_workgroup = 512, max_workgroup_memory_bytes = 32768, '
            'max_workgroup_counts = [65535, 65535, 65535]>>}>')

BASELINE = ('iree_gpu.target<arch = "vp_android_baseline_2022", features = "spirv:v1.3,cap:Shader", '
            'wgp = <compute = fp32|int32, storage = b32, subgroup = none, subgroup_size_choices = [64], '
            'max_workgroup_sizes = [128, 128, 64], max_thread_count_per_workgroup = 128, '
            'max_workgroup_memory_bytes = 16384, max_workgroup_counts = [65535, 65535, 65535]>>}>')
LAVAPIPE = vulkan.VulkanDevice(
    name="llvmpipe (LLVM 15.0.6, 256 bits)", api="1.3.230", type="cpu", driver="llvmpipe",
    features={"shaderFloat16": True, "shaderInt8": True, "storageBuffer16BitAccess": True,
              "storageBuffer8BitAccess": True, "subgroupSizeControl": True},
    subgroup_size=8, min_subgroup_size=8, max_subgroup_size=8, subgroup_operations=0xbf)


def test_requirements_come_from_the_compiler_target_record():
    req = iree_targets.parse_target_info(VALHALL3)
    assert (req["arch"], req["spirv_version"], req["vulkan_api"]) == ("valhall3", "1.6", "1.3")
    assert req["subgroup_size"] == [16] and req["subgroup_operations"] == ["shuffle", "arithmetic"]
    assert req["device_features"] == ["shaderFloat16", "shaderInt8", "storageBuffer16BitAccess",
                                      "storageBuffer8BitAccess"]
    base = iree_targets.parse_target_info(BASELINE)
    assert (base["vulkan_api"], base["subgroup_size"], base["device_features"]) == ("1.1", [], [])


def test_requirement_matching():
    valhall = iree_targets.parse_target_info(VALHALL3)
    why = vulkan.meets(valhall, LAVAPIPE)
    assert why == ["compiled for subgroup size [16], device offers 8..8 (it would run and return "
                   "wrong numbers)"]
    assert vulkan.meets(iree_targets.parse_target_info(BASELINE), LAVAPIPE) == []
    old = vulkan.VulkanDevice(name="PanVK", api="1.1.0", type="integrated-gpu", driver="panvk",
                              features={}, subgroup_size=16, min_subgroup_size=16,
                              max_subgroup_size=16, subgroup_operations=0x1)
    why = vulkan.meets(valhall, old)
    assert "needs Vulkan 1.3 (SPIR-V 1.6), device has 1.1.0" in why and "needs shaderFloat16" in why
    assert "needs subgroup shuffle operations" in why
    assert vulkan.meets(iree_targets.parse_target_info(BASELINE), old) == []


def test_unknown_vulkan_target_is_a_spec_error(tmp_path):
    text = (REPO / "pipeline/targets/rk3588.yaml").read_text().replace("valhall3", "mali-g610")
    (tmp_path / "board.yaml").write_text(text)
    (tmp_path / "models").mkdir()
    # read from the table of IREE's Vulkan targets (pipeline/compilers/iree_targets.py): no
    # compiler runs while the project loads
    with pytest.raises(SpecError) as info:
        load_project(tmp_path / "models", tmp_path / "artifacts", "board", targets_dir=tmp_path)
    assert "abis.vulkan-mali-g610: vulkan_target 'mali-g610': IREE 3.13.0 rejects it" in str(info.value)
    assert "Mali-G610 is 'valhall3'" in str(info.value)


def test_compile_flags_are_a_pure_function_of_the_abi():
    cfg = {"backend": "llvm-cpu", "triple": "aarch64-linux-gnu", "cpu": "cortex-a55",
           "cpu_features": ["+dotprod"], "flags": ["--iree-opt-data-tiling"]}
    assert compile_flags(cfg) == [
        "--iree-hal-target-device=local", "--iree-hal-local-target-device-backends=llvm-cpu",
        "--iree-llvmcpu-target-triple=aarch64-linux-gnu", "--iree-llvmcpu-target-cpu=cortex-a55",
        "--iree-llvmcpu-target-cpu-features=+dotprod", "--iree-vm-bytecode-module-strip-source-map",
        "--iree-llvmcpu-debug-symbols=false", "--iree-opt-data-tiling"]
    log = ('x.mlir:20:13: error: failed to legalize operation \'torch.operator\' that was explicitly '
           'marked illegal: %51:2 = "torch.operator"(%50) <{name = "onnx.GRU"}> {}\n'
           'y: error: failed to legalize operation \'torch.operator\' that was explicitly marked '
           'illegal: %3 = "torch.operator"(%2) <{name = "onnx.Loop"}>')
    assert unsupported_ops(log) == ["GRU", "Loop"]


def test_the_abi_rewrites_the_spec_accepts_are_those_the_compile_stage_has():
    from pipeline.spec.target import ABI_REWRITES
    from pipeline.rewrite.abi_rewrites import REWRITES
    assert set(ABI_REWRITES) == set(REWRITES)


def _depthwise_model(path, kernel: int):
    """x -> depthwise Conv (kernel x kernel, 4 channels, same padding) -> y, weights constant."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    weight = np.arange(4 * kernel * kernel, dtype=np.float32).reshape(4, 1, kernel, kernel) / 10
    pad = kernel // 2
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], name="dw", group=4, kernel_shape=[kernel, kernel],
                          pads=[pad] * 4)], "dw",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])],
        [numpy_helper.from_array(weight, "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    return path


def test_the_search_knows_two_rewrite_lists_that_leave_the_same_graph(tmp_path):
    """dw-chunks differs from dw-slices only on kernels above 3x3: on a 3x3 model the two give
    one graph (the search records the second as same-as, unbuilt), on a 5x5 model two; a rewrite
    with nothing to rewrite leaves the graph as it was."""
    from pipeline.bench.config_search import _GraphDigests
    slices, chunks = ["depthwise_conv_as_slices"], ["depthwise_conv_as_slice_chunks"]
    small = _GraphDigests(_depthwise_model(tmp_path / "k3.onnx", 3))
    assert small.of(slices) == small.of(chunks) != small.of([])
    assert small.of(["conv_transpose_as_depth_to_space"]) == small.of([])
    large = _GraphDigests(_depthwise_model(tmp_path / "k5.onnx", 5))
    assert len({large.of(slices), large.of(chunks), large.of([])}) == 3


def test_the_overhead_bench_edits_a_model_no_variant_derives_from():
    """bench/overhead.py's default edit: a model with a dynamic dim, one without variants first
    (an int8 variant may fail its gate at the new shape), a model with variants when none is."""
    from types import SimpleNamespace
    from bench.overhead import model_to_edit

    def model(name, *dims):
        return SimpleNamespace(name=name, signature={"inputs": [{"name": "x", "dims": list(dims)}]})
    fixed, cls = model("face", 1, 3, 192, 192), model("cls", "n", 3, 48, "w")
    det = model("det", 1, 3, "h", "w")
    variants = [model("cls.int8", "n", 3, 48, "w"), model("cls.48x320", "n", 3, 48, "w")]
    assert model_to_edit([fixed, cls, *variants, det]) == "det"
    assert model_to_edit([fixed, cls, *variants]) == "cls"
    assert model_to_edit([fixed]) is None
