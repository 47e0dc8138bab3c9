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
