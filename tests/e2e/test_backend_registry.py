"""The backend registry (issue 30, item 1) changed no artifact: a tiny model built for the host
gives the very bytes, and the very manifest entry (but the step keys, which hash the code), that
the tree before the registry gave. The figures were recorded from that tree in
tests/fixtures/backend_registry/host_tiny.json; an artifact is compared when this machine's
compile tools (versions, the linker's sha256) are the ones it was recorded with. Two fields were
set since, on purpose: `compile.config` of the IREE CPU ABI says where its config came from (a
pin, the build's search or the base flags: issue 39), and the choice names that config. And the
IREE CPU bytes, on purpose: a model without a pin is built with compilers/config_choice.py
UNPINNED (dw-chunks-loops-conv1d, LLVM's loop passes added to the base flags; issue 39), and the fixture
holds that artifact's sha256, size and flags, re-recorded from a build; TVM's are the recorded ones."""
from __future__ import annotations

import json

from conftest import FIXTURES, add_tiny_model

RECORDED = FIXTURES / "backend_registry" / "host_tiny.json"


# Errors against golden: golden is onnxruntime's output on this machine, whose kernels follow the
# CPU (AVX2 on the machine that recorded them, AVX-512 elsewhere: max_abs 4.8e-7 vs 9.5e-7 for the
# same .vmfb bytes), so they are compared as passed-or-not, not digit for digit.
MEASURED = ("cosine", "min_cosine", "max_abs", "mean_abs")


def _without_step_keys(value, key: str | None = None):
    """The entry without its step keys and without the error figures measured against this
    machine's golden (MEASURED; the bytes and every other field are compared)."""
    if isinstance(value, dict):
        measured = () if key in ("tolerance", "reference_tolerance") else MEASURED
        return {k: _without_step_keys(v, k) for k, v in value.items()
                if k not in ("step_key", "database_step_key") + measured}
    if isinstance(value, list):
        return [_without_step_keys(v, key) for v in value]
    return value


def test_the_registry_builds_the_bytes_and_manifest_of_the_tree_before_it(workspace):
    add_tiny_model(workspace.models, "tiny", seed=0)
    workspace.build("target=host")
    recorded = json.loads(RECORDED.read_text())
    manifest = json.loads((workspace.artifacts / "host" / "manifest.json").read_text())
    entry = _without_step_keys(manifest["models"]["tiny"])
    recorded["model"] = _without_step_keys(recorded["model"])
    want = recorded["model"]["artifacts"]
    assert sorted(entry["artifacts"]) == sorted(want) == ["cpu-x86_64", "cpu-x86_64-tvm"]
    comparable = [abi for abi, art in entry["artifacts"].items()
                  if art["compile"]["tools"] == want[abi]["compile"]["tools"]]
    assert comparable, (f"no artifact was built with the recorded tools "
                        f"({ {a: w['compile']['tools'] for a, w in want.items()} }): the figures "
                        f"speak for those versions only")
    for abi in comparable:
        art = entry["artifacts"][abi]
        assert (art["path"], art["format"], art["sha256"], art["size"]) == (
            want[abi]["path"], want[abi]["format"], want[abi]["sha256"], want[abi]["size"]), abi
        assert art == want[abi], abi  # compile fields, requires, validation, tuning: the same
    if len(comparable) == len(want):  # the whole entry, coverage and choice included
        assert entry == recorded["model"]
        assert manifest["coverage"]["tiny"] == recorded["coverage"]
