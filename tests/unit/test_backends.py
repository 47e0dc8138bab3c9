"""The table of backends (pipeline/compilers/backends.py): each backend one object, its stages rows
of the stage table, its ABI schema in the target schema, and every ABI of the registered targets
answered by one backend. No toolchain runs."""
from __future__ import annotations

import typing

from pipeline.compilers.backends import BACKENDS, BY_FORMAT, backend_for, backend_of
from pipeline.compilers.iree_backend import IREE
from pipeline.compilers.tvm_backend import TVM
from pipeline.graph import BY_NAME, STAGES
from pipeline.spec.target import Abi, known_targets, load_target


def test_names_formats_and_files_are_each_one_backends():
    for field in ("name", "format", "artifact", "compile_stage"):
        values = [getattr(b, field) for b in BACKENDS]
        assert len(set(values)) == len(values), (field, values)
    assert (IREE.format, IREE.artifact, TVM.format, TVM.artifact) == (
        "iree-vmfb", "model.vmfb", "tvm-so", "model.so")  # what manifests and releases carry


def test_every_backends_stages_are_rows_of_the_stage_table_in_order():
    order = [s.name for s in STAGES]
    for b in BACKENDS:
        assert b.compile_stage in BY_NAME and BY_NAME[b.compile_stage].after_coverage
        if b.tune_stage:
            assert order.index(b.tune_stage) < order.index(b.compile_stage)


def test_the_target_schema_takes_exactly_the_backends_abi_schemas():
    """spec/target.py's `Abi` union lists every backend's ABI documents, and nothing else."""
    def leaves(t) -> set:  # the classes inside Annotated[Union[...], Field(...)]
        return {t} if isinstance(t, type) else set().union(*map(leaves, typing.get_args(t)))
    declared = leaves(Abi)
    assert declared == {d for b in BACKENDS for d in b.abi_schema}
    for b in BACKENDS:  # each document's `compiler` is its backend's name
        for doc in b.abi_schema:
            assert typing.get_args(doc.model_fields["compiler"].annotation) == (b.name,)


def test_every_abi_of_the_registered_targets_has_one_backend():
    seen = set()
    for name in known_targets():
        for abi in load_target(name).abis:
            backend = backend_of(abi)
            assert backend.builds(abi) and [b for b in BACKENDS if b.builds(abi)] == [backend]
            seen.add(backend.name)
    assert seen == {b.name for b in BACKENDS}  # no backend is dead weight


def test_a_manifest_entry_is_answered_by_its_format():
    assert backend_for({"format": "tvm-so"}) is TVM and BY_FORMAT["iree-vmfb"] is IREE
    assert (IREE.runner_key("local-task"), TVM.runner_key("cpu")) == ("local-task", "tvm:cpu")


def test_the_manifest_fields_of_each_backend():
    iree_report = {"flags": ["--a"], "config": {"name": "o3"}, "requires": {"vulkan": {"x": 1}}}
    assert IREE.compile_fields(iree_report) == {"flags": ["--a"], "config": {"name": "o3"}}
    assert IREE.requires(iree_report, {}) == {"vulkan": {"x": 1}}
    assert IREE.requires({"flags": []}, {}) == {}
    tools = {"apache-tvm": "0.27.0", "apache-tvm-ffi": "0.1.9"}
    assert TVM.compile_fields({"target": {"kind": "llvm"}, "linker": "g++"}) == {
        "flags": [], "target": {"kind": "llvm"}, "linker": "g++"}
    assert TVM.requires({}, tools)["tvm_runtime"]["install"] == \
        "pip install apache-tvm==0.27.0 apache-tvm-ffi==0.1.9"


# ----------------------------------------------------------------------------- the NPU (RKNN)
def test_rknn_is_one_row_with_its_own_format_schema_and_stage():
    from pipeline.compilers.rknn_backend import RKNN
    from pipeline.spec.npu import NpuAbiDoc
    assert (RKNN.name, RKNN.format, RKNN.artifact, RKNN.compile_stage) == (
        "rknn", "rknn", "model.rknn", "rknn_compile")
    assert RKNN.abi_schema == (NpuAbiDoc,) and RKNN.variants and not RKNN.timeable
    assert backend_for({"format": "rknn"}) is RKNN


def test_rk3588_tries_its_npu_first_with_a_tolerance_per_precision():
    from pipeline.compilers.rknn_backend import RKNN
    target = load_target("rk3588")
    assert target.fallback[0] == "npu"
    npu = next(a for a in target.abis if RKNN.builds(a))
    assert (npu.target_platform, npu.precision, npu.run, npu.librknnrt) == (
        "rk3588", "fp16", {"via": "simulator"}, "2.5.0")
    fp16, where = RKNN.validation_tolerance(npu, None)
    assert fp16["max_abs"] > 1e-5 and where == "the npu ABI's tolerance.fp16 (target YAML)"
    assert RKNN.validation_tolerance(npu, "int8")[0] == npu.tolerance["int8"]
    # IREE and TVM keep the model's own tolerance
    assert IREE.validation_tolerance(None, None) is None and TVM.validation_tolerance(None, "int8") is None


def test_an_npu_abi_is_checked_strictly(tmp_path):
    import pytest
    from pipeline.core.errors import SpecError
    (tmp_path / "board.yaml").write_text(
        "abis:\n  npu:\n    compiler: rknn\n    target_platform: rk9999\n    precision: int4\n"
        "    tolerance: {fp16: {max_abs: 0.01, mean_abs: 0.001, cosine: 0.999}}\n"
        "    run: {via: board}\n    runtime: {librknnrt: latest}\n")
    with pytest.raises(SpecError) as err:
        load_target("board", tmp_path)
    text = str(err.value)
    for key in ("target_platform", "precision", "tolerance: missing required key 'int8'", "run.via",
                "runtime.librknnrt"):
        assert key in text, (key, text)


def test_rknn_builds_int8_variants_and_says_why_not_fp16_ones():
    from types import SimpleNamespace
    from pipeline.compilers.rknn_backend import RKNN
    npu = next(a for a in load_target("rk3588").abis if RKNN.builds(a))
    assert RKNN.variant_skip(npu, SimpleNamespace(precision="int8")) is None
    assert "already fp16" in RKNN.variant_skip(npu, SimpleNamespace(precision="fp16"))
    assert IREE.variant_skip(npu, SimpleNamespace(precision="fp16")) is None


def test_the_rknn_child_command_uses_fixed_relative_names():
    """Reproducible bytes need the same memory layout: every path the child sees is relative to a
    private root of fixed length, and its environment is the fixed recipe alone."""
    from pathlib import Path
    from pipeline.stages.quantize import Samples
    from pipeline.stages.rknn_compile import RECIPE, Config, driver_argv
    inputs = ({"name": "x", "shape": [1, 3, 8, 8], "dtype": "float32"},)
    fp16 = Config(compiler="rknn", backend="npu", target_platform="rk3588", precision="fp16",
                  entry="main", librknnrt="2.5.0", inputs=inputs, n_outputs=2)
    argv = driver_argv(fp16, Path("/tmp/rknn-abcdefgh"))
    import platform
    assert argv[:5] == ["setarch", platform.machine(), "-R", "/tmp/rknn-abcdefgh/venv/bin/python", "driver.py"]
    assert [a for a in argv[5:] if "/" in a] == []
    assert argv[-8:] == ["--input", "input_0.npy", "--sim-output", "simulated_0.npy",
                         "--sim-output", "simulated_1.npy", "--summary", "summary.json"]
    assert "--dataset" not in argv and RECIPE["PYTHONHASHSEED"] == "0" and "MALLOC_PERTURB_" in RECIPE
    int8 = Config(**{**fp16.as_key(), "precision": "int8", "preprocessing": {},
                     "calibration": Samples(kind="npy", files=("a.npy",)), "algorithm": "normal"})
    assert ["--dataset", "dataset.txt", "--algorithm", "normal"] == \
        driver_argv(int8, Path("/tmp/rknn-abcdefgh"))[13:17]
    import pytest
    with pytest.raises(ValueError, match="calibration samples are given for an int8 build"):
        Config(**{**fp16.as_key(), "precision": "int8", "algorithm": "normal"})


def test_the_release_asks_each_backend_what_loads_its_artifact():
    from pipeline.compilers.rknn_backend import RKNN
    npu = {"format": "rknn", "abi": {"run": {"via": "simulator"}},
           "requires": {"npu": {"librknnrt": "2.5.0"}}}
    assert backend_for(npu).release_runtime(npu) == {"npu": {"librknnrt": "2.5.0"}, "device": "NPU"}
    so = {"format": "tvm-so", "abi": {"run": {"device": "cpu"}}, "requires": {"tvm_runtime": {"v": 1}}}
    assert backend_for(so).release_runtime(so) == {"tvm_runtime": {"v": 1}, "device": "cpu"}
    vmfb = {"format": "iree-vmfb", "abi": {"run": {"device": "local-task"}}, "requires": {},
            "compile": {"tools": {"iree-base-compiler": "3.13.0"}}}
    assert backend_for(vmfb).release_runtime(vmfb)["iree_runtime"]["version"] == "3.13.0"
    assert RKNN.requires({"target_platform": "rk3588", "librknnrt": "2.5.0"}, {})["npu"]["librknnrt"] == "2.5.0"


def test_the_simulated_outputs_are_handed_over_only_for_the_shipped_bytes_and_inputs(tmp_path):
    """pipeline/run/rknn_run.py: validation's runner refuses outputs that belong to another file
    or other inputs than the ones it is given."""
    import hashlib
    import json
    import numpy as np
    from pipeline.run.rknn_run import main
    sha = lambda p: hashlib.sha256(p.read_bytes()).hexdigest()
    art, x, sim = tmp_path / "model.rknn", tmp_path / "input_0.npy", tmp_path / "simulated_0.npy"
    art.write_bytes(b"rknn bytes")
    np.save(x, np.zeros(3, np.float32))
    np.save(sim, np.ones(3, np.float32))
    report = tmp_path / "compile.json"
    report.write_text(json.dumps({"sha256": sha(art), "simulated": {
        "inputs": [{"sha256": sha(x)}], "outputs": [{"file": sim.name, "sha256": sha(sim)}]}}))
    out = tmp_path / "out.npy"
    argv = ["--artifact", str(art), "--compile-json", str(report), "--input", str(x), "--output", str(out)]
    assert main(argv) == 0 and np.array_equal(np.load(out), np.ones(3, np.float32))
    art.write_bytes(b"other bytes")
    assert main(argv) == 2
    art.write_bytes(b"rknn bytes")
    np.save(x, np.ones(3, np.float32))
    assert main(argv) == 3


def test_the_toolkits_layer_table_becomes_coverage_facts():
    """Lines as RKNN-Toolkit2 2.5.0 prints them (verbose) for ppocr_det: Erf on the CPU fallback."""
    from pipeline.compilers.coverage_table import manifest_table
    from pipeline.stages.rknn_compile import _messages
    text = "\n".join([
        "\x1b[1;33mW\x1b[0m \x1b[1;33mload_onnx: The config.mean_values is None, zeros will be set for input 0!\x1b[0m",
        "E RKNN: [09:03:09.502] Unkown op target: 0",
        "E RKNN: [09:03:10.502] Unkown op target: 0",
        "D RKNN: [09:19:27.465] ID   OpType             DataType Target InputShape    OutputShape   Cycles  RW(KB)  FullName",
        "D RKNN: [09:19:27.465] 0    InputOperator      FLOAT16  CPU    \\    (1,3,480,640)   0/0/0   0   InputOperator:x ",
        "D RKNN: [09:19:27.465] 1    ConvRelu           FLOAT16  NPU    (1,3,480,640),(16,3,3,3),(16)  (1,16,240,320)  1/2/3  1802  Conv:Conv.0     ",
        "D RKNN: [09:19:27.465] 17   Erf                FLOAT16  CPU    (1,64,120,160)  (1,64,120,160)  0/0/0  2400  Erf:Erf.0       ",
        "D RKNN: [09:19:27.465] 24   Erf                FLOAT16  CPU    (1,64,120,160)  (1,64,120,160)  0/0/0  2400  Erf:Erf.2       ",
        "D RKNN: [09:19:27.465] 203  OutputOperator     FLOAT16  CPU    (1,1,480,640)   \\  0/0/0  19200  OutputOperator:fetch_name_0",
    ])
    said = _messages(text)
    assert said["warnings"] == ["W load_onnx: The config.mean_values is None, zeros will be set for input 0!"]
    assert said["errors"] == ["E RKNN: Unkown op target: 0"]   # once, without its timestamp
    assert said["layers"] == {"CPU": 2, "NPU": 1}              # the I/O hand-over is no layer
    assert said["cpu_fallbacks"] == [{"op": "Erf", "count": 2, "nodes": ["Erf:Erf.0", "Erf:Erf.2"]}]
    table = manifest_table({"det": {"artifacts": {"npu": {}}, "coverage": {}}},
                           {"det": {"npu": {"messages": said}}}, {})
    assert table["det"]["reported"] == {"npu": {"cpu_fallbacks": said["cpu_fallbacks"]}}
